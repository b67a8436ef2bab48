"""Training a :class:`~e3j_models.Potential` on energies, forces (and stress) with optax.

The loss of a batch is ``w_E · mean_g ((E_g - E_g^ref) / n_g)² + w_F · mean_{atoms, xyz} (F - F^ref)²
+ w_S · mean_g' mean_ij (σ_g' - σ_g'^ref)²`` (energy per atom, eV² / (eV/Å)² / (eV/Å³)²; the stress
term when ``w_S > 0``). Each term is over the structures (atoms) that have its label: the stress
over those periodic in all three directions, 0 for a batch with none. Each structure's squared
errors are multiplied by its own weights (mace-torch's ``config_weight`` times
``config_{energy,forces,stress}_weight`` from ``atoms.info``, 1 by default), and the means count
the structures (atoms) whose weight is > 0. ``fit`` refuses a term of weight > 0 that no training
structure has a label of. Forces in the loss mean a second derivative through every convolution:
``jax.grad`` of a loss built on ``jax.grad``.

Batches: every epoch the training structures are drawn in a new seeded order (``seed``, epoch)
and cut into batches of ``batch_size``, as mace-torch's shuffled loader does. Each batch is padded
to one of at most ``batch_shapes`` node/edge sizes, chosen before step 0 over every batch the run
will take to pad the least (a dataset of small and large cells does not pad every batch to the
largest), and to ``batch_size`` graphs (a smaller last batch holds empty graphs of weight 0):
training compiles the step once per size. Each batch is built on the host as its step comes and
copied to the device while the step before it runs. The optimizer is
``clip_by_global_norm(10) → adam`` with a cosine decay of the learning rate to 1 % over the run.
Before training, per-element reference energies are fitted to the training energies by least
squares and stored in the config's ``atomic_energies`` (a config that gives them keeps its own),
and ``avg_num_neighbors`` is set to the training set's mean neighbour count.

>>> from e3j_models import nequip
>>> from e3j_models.data import emt_structures
>>> cfg = prepare_config(nequip((28, 29), cutoff=3.0), emt_structures(4))
>>> len(cfg.atomic_energies), round(cfg.avg_num_neighbors)
(2, 12)

``fit(cfg, train, valid, steps=500)`` trains (``python -m e3j_models train`` is its command line).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._batching import _batch, _batches, _epoch_order, _prefetched, _training_shapes
from ._checks import check_int, check_model_dtype, check_output_path, check_positive_real, check_real
from ._history import epoch_losses, plot_history, write_history
from ._loss import _floats_as, _loss_of, _loss_sums, _selection_metric, evaluate, evaluate_structures, loss_fn
from ._optional import require
from ._train_state import _PER_STEP, _restored_leaves, _resumed_state, _run_fingerprint, save_state
from ._training_data import (
    _check_training_data,
    _check_type_weights,
    _fitted_config,
    check_training_data,
    isolated_atom_energies,
    prepare_config,
)
from .batch import Labels
from .config import MACEConfig, NequIPConfig
from .io import _flatten, save
from .neighbours import bucket_size
from .potential import Potential

__all__ = [
    "FitResult",
    "Labels",
    "check_training_data",
    "epoch_losses",
    "evaluate",
    "evaluate_structures",
    "fit",
    "isolated_atom_energies",
    "loss_fn",
    "plot_history",
    "prepare_config",
    "write_history",
]


class FitResult(NamedTuple):
    """``config`` (with fitted ``atomic_energies`` / ``avg_num_neighbors``), ``params``, ``history``
    (lists per step and per evaluation) and ``validation`` (final MAEs: eV/atom, eV/Å)."""

    config: MACEConfig | NequIPConfig
    params: Any
    history: dict[str, list]
    validation: dict[str, float]


def _check_weights(weights, names: Sequence[str] = ("weights[0]", "weights[1]", "weights[2]")) -> tuple:
    """The loss weights ``(w_E, w_F, w_S)``: three finite numbers >= 0, not all zero; ``names`` name
    them in errors (the command line's flags)."""
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__") or len(weights) != 3:
        raise ValueError(f"weights must be 3 numbers >= 0 (energy, forces, stress), got {weights!r}")
    weights = tuple(check_real(n, w, 0) for n, w in zip(names, weights))
    if not any(weights):
        raise ValueError(f"{', '.join(names)} are all 0: the loss would fit nothing")
    return weights


def fit(
    config: MACEConfig | NequIPConfig,
    train: Sequence,
    valid: Sequence,
    *,
    steps: int,
    batch_size: int = 4,
    learning_rate: float = 5e-3,
    weights: tuple[float, float, float] = (1.0, 1.0, 0.0),
    seed: int = 0,
    backend: str | None = None,
    dtype=np.float32,
    eval_every: int = 0,
    checkpoint: str | os.PathLike | None = None,
    progress: bool = True,
    factored_radial: bool = True,
    params: Mapping[str, Any] | None = None,
    batch_shapes: int = 4,
    state: str | os.PathLike | None = None,
    state_every: int = 100,
    resume: bool = False,
    ema_decay: float | None = None,
    config_type_weights: Mapping[str, float] | None = None,
    _checked: tuple | None = None,
    _flags: Mapping[str, str] | None = None,
) -> FitResult:
    """Train for ``steps`` optimizer steps on ``train``; validate on ``valid``.

    From scratch by default: the config's ``atomic_energies`` (when None) and ``avg_num_neighbors``
    are fitted to ``train`` first (:func:`prepare_config`). ``params`` (e.g. ``load(path)``'s, with
    its config) continues training from them instead (fine-tuning): the config is taken as it is,
    since its constants are part of what the parameters compute. The per-element reference energies
    are subtracted from the energy labels on the host, in float64, and left out of the trained
    model's graph, so float32 training keeps the digits of large absolute energies.

    ``weights``: the loss's weights of the energy, forces and stress terms; each structure's own
    (mace-torch's ``config_weight`` and ``config_{energy,forces,stress}_weight`` in ``atoms.info``)
    multiply them, and a structure without forces or without an energy label adds nothing to that
    term (energy-only data trains with ``weights[1] = 0``). ``config_type_weights`` (mace-torch's,
    e.g. ``{"Default": 1.0, "surface": 2.0}``) multiplies each training structure's weights by its
    ``config_type``'s (``atoms.info["config_type"]``, ``"Default"`` when absent; 1 for a type not
    given); a type no structure of train or valid has is refused (a misspelt one would weigh nothing).

    ``backend`` ``"e3nn"`` trains the e3nn-jax twin (same parameter tree). ``eval_every > 0`` records
    validation MAEs every so many steps and, with ``checkpoint``, saves the best model there by the
    force MAE (the energy MAE when no validation structure has forces; atomically: a temp file
    renamed). ``factored_radial``: as :class:`Potential`'s (both routes'
    training gradients measured in docs/models.md). ``dtype``: of the parameters and batches,
    float32 or float64 (which needs ``jax_enable_x64``). ``batch_shapes``: the most padded batch
    sizes training uses (each compiles the step once; see the module docstring), 1 for one size
    for all. ``seed`` draws the parameters and every epoch's order of the structures. Returns a
    :class:`FitResult`; its ``history`` holds the per-step ``train_loss`` and ``time``, the
    validations (``eval_step``, ``valid``), ``steps_per_epoch``, ``batch_shapes`` (the padded
    ``(nodes, edges)``), ``padding`` (padded over real nodes and edges of the batches trained on)
    and ``structures_per_second`` (of the steps that did not compile; None if all did).

    ``state``: a file where the training state (parameters, optimizer state, steps done, history,
    best validation) is written every ``state_every`` steps and at the end, atomically. With
    ``resume=True`` training goes on from it: the run must be the one that wrote it (the same
    config, training and validation data, ``steps``, ``batch_size``, ``batch_shapes``,
    ``learning_rate``, ``weights``, ``seed``, ``dtype``, ``eval_every``, ``factored_radial`` and
    ``params``; checked, the differences named), and it takes the batches the whole run would have
    taken at those steps, so that a run stopped and resumed ends with the parameters of the run
    that was not stopped (bit for bit on one machine and backend; tested on the CPU). A resumed
    run's ``structures_per_second`` is of its own steps. The state keeps the best validated
    parameters with or without ``checkpoint``, so a resumed run writes its checkpoint (lost, or
    given only now) from them.

    ``ema_decay`` (mace-torch's ``--ema_decay``, e.g. 0.99): validation, the checkpoint and the
    returned ``params`` are an exponential moving average of the trained parameters, updated after
    each step ``n`` (from 1) as ``ema -= (1 - d) · (ema - params)`` with ``d = min(ema_decay, (1 +
    n) / (10 + n))`` (torch_ema's warm-up, which mace-torch uses); training itself is unchanged.
    """
    optax = require("optax", "fit")
    if progress:
        require("tqdm", "fit's progress bar (progress=False trains without)")

    steps = check_int("steps", steps, 1)
    batch_size = check_int("batch_size", batch_size, 1)
    eval_every = check_int("eval_every", eval_every, 0)
    learning_rate = check_positive_real("learning_rate", learning_rate)  # a negative rate climbs the loss
    seed = check_int("seed", seed, 0)
    batch_shapes = check_int("batch_shapes", batch_shapes, 1)
    state_every = check_int("state_every", state_every, 1)
    if ema_decay is not None:
        ema_decay = check_real("ema_decay", ema_decay)
        if not 0 < ema_decay < 1:
            raise ValueError(f"ema_decay must be in (0, 1) or None (no average), got {ema_decay}")
    if state is not None:
        state = check_output_path("state", state)
    elif resume:
        raise ValueError("resume=True needs state: the file of the run to go on from")
    if checkpoint is not None:  # now: it is written at the end (or at the first validation)
        checkpoint = check_output_path("checkpoint", checkpoint)
    if not train:
        raise ValueError("train is empty: give at least one structure")
    if not valid:
        raise ValueError("valid is empty: give at least one validation structure")
    weights = _check_weights(weights)
    dtype = check_model_dtype(dtype)
    # the weights here; the types against the data in _check_training_data (or the caller's)
    type_weights = _check_type_weights(config_type_weights, None)
    if _checked is None:  # else the caller's _check_training_data of these arguments (the command line's)
        _checked = _check_training_data(
            config, train, weights, valid, dtype=dtype, every_element=params is None, type_weights=type_weights
        )
    train_graphs, valid_graphs = _checked
    run = None  # what a resumed run must share with the one that wrote the state
    if state is not None:
        run = _run_fingerprint(
            config,
            train,
            valid,
            params,
            dict(
                steps=steps,
                batch_size=batch_size,
                batch_shapes=batch_shapes,
                learning_rate=learning_rate,
                weights=weights,
                seed=seed,
                dtype=np.dtype(dtype).name,
                eval_every=eval_every,
                factored_radial=bool(factored_radial),
                ema_decay=ema_decay,
                # a type of weight 1 weighs as one not given: {"Default": 1} is no weights at all
                config_type_weights={k: v for k, v in sorted((type_weights or {}).items()) if v != 1.0} or None,
            ),
        )
    # _flags: the command line's flag of each argument and config field, named beside them when a
    # state is refused
    saved = _resumed_state(state, run, _flags) if resume else None
    if params is None:
        config = _fitted_config(config, train, [len(g[4]) for g in train_graphs])
    elif config.atomic_energies is None:
        raise ValueError("config has no atomic_energies: fine-tuning params needs the config they were trained with")
    # the model trained and validated here leaves the reference energies out; the labels leave them
    # out too (on the host, in float64): the same residuals, without float32's rounding of ~1e4 eV
    potential = Potential(config, backend, factored_radial=factored_radial)._bare()
    e0 = config.atomic_energies
    num_atoms = np.array([len(a) for a in train])
    num_edges = np.array([len(g[4]) for g in train_graphs])
    shape_of = _training_shapes(num_atoms, num_edges, batch_size, steps, seed, batch_shapes)
    counted = np.zeros((2, 2), np.int64)  # [padded, real] × [nodes, edges] of the batches trained on
    per_epoch = -(-len(train) // batch_size)
    first = 0 if saved is None else saved["step"]  # the steps done

    def training_batches():  # every epoch the structures in a new seeded order, cut into batches
        for epoch in itertools.count(first // per_epoch):
            order = _epoch_order(len(train), seed, epoch)
            skip = (first % per_epoch) * batch_size if epoch == first // per_epoch else 0  # done before a resume
            for start in range(skip, len(order), batch_size):
                group = order[start : start + batch_size]
                shape = shape_of[bucket_size(int(num_edges[group].sum()))]
                real = (len(group), int(num_atoms[group].sum()), int(num_edges[group].sum()))
                # a smaller last batch padded to batch_size graphs: no compile of its own
                built = _batch(
                    train,
                    group,
                    shape,
                    config,
                    dtype,
                    e0,
                    train_graphs,
                    num_graphs=batch_size,
                    type_weights=type_weights,
                )
                yield built, shape, real

    valid_batches = _batches(
        valid, config, batch_size, None, dtype, e0, graphs=valid_graphs, max_shapes=batch_shapes, config_weights=False
    )
    # the batches of the steps left (none when resuming a finished run), built by a background thread
    batches = _prefetched(itertools.islice(training_batches(), steps - first), depth=2)
    try:  # the thread stops on an error before the loop too (a refused state)
        if first < steps:
            host_batch, shape, real = next(batches)
            batch, labels = jax.device_put(host_batch)
        if saved is not None:
            params = jax.tree.map(jnp.asarray, saved["params"])
            potential.check_params(params)
        elif params is None:
            params = potential.init(jax.random.key(seed), batch, dtype=dtype)
        else:
            potential.check_params(params)
            params = _floats_as(params, dtype)
        schedule = optax.cosine_decay_schedule(learning_rate, steps, alpha=0.01)
        optimizer = optax.chain(optax.clip_by_global_norm(10.0), optax.adam(schedule))
        opt_state = optimizer.init(params)
        ema = None  # the moving average of the parameters, which validation and the checkpoint read
        if ema_decay is not None:
            ema = params
        # the best validated parameters: the checkpoint's, kept in the state too (a resumed run given
        # a checkpoint its first run had not writes it from them)
        best_params = None
        if saved is not None:
            opt_state = _restored_leaves(opt_state, saved["opt_leaves"], state)
            if ema_decay is not None:
                ema = jax.tree.map(jnp.asarray, saved["ema"])
                potential.check_params(ema)
            best_params = saved["best_params"]
            if checkpoint is not None and best_params is not None:  # lost or replaced since: as it was
                _save_atomic(checkpoint, config, best_params)
    except BaseException:
        batches.close()
        raise

    @jax.jit
    def averaged(ema, params, n):  # after step n (from 1): torch_ema's warm-up, then ema_decay
        d = jnp.minimum(ema_decay, (1.0 + n) / (10.0 + n))
        return jax.tree.map(lambda e, p: (e - (1 - d) * (e - p)).astype(e.dtype), ema, params)

    @jax.jit
    def step(params, opt_state, batch, labels):
        def objective(p):
            sums = _loss_sums(potential, p, batch, labels, weights)
            return _loss_of(sums, weights)[0], sums

        (loss, sums), grads = jax.value_and_grad(objective, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, sums

    history: dict[str, Any] = {"step": [], "train_loss": [], "time": [], "eval_step": [], "valid": []}
    history["steps_per_epoch"] = per_epoch
    history["epoch_loss"] = []  # each complete epoch's loss, its batches taken as one (epoch_losses)
    epoch_sums: dict[str, np.ndarray] = {}
    # the padded (nodes, edges) of the training batches: one compile of the step each
    history["batch_shapes"] = [list(s) for s in sorted(set(shape_of.values()))]  # lists, as JSON reads them
    best = np.inf
    t0 = time.perf_counter()
    if saved is not None:
        history, best, epoch_sums = saved["history"], saved["best"], saved["epoch_sums"]
        counted[:] = saved["counted"]
        t0 -= saved["elapsed"]

    def write_state(done: int) -> None:
        # the per-step records as arrays (8 bytes a number; JSON took ~20), the rest in the header
        rest = {k: v for k, v in history.items() if k not in _PER_STEP}
        header = {"run": run, "step": done, "history": rest, "best": None if np.isinf(best) else best}
        header["elapsed"] = time.perf_counter() - t0
        header["epoch_terms"] = sorted(epoch_sums)
        extra = {"counted": counted, **{f"epoch_sums/{t}": np.asarray(v, np.float64) for t, v in epoch_sums.items()}}
        extra.update({f"history/{k}": np.asarray(history[k], dtype) for k, dtype in _PER_STEP.items()})
        if ema is not None:
            _flatten({"ema": jax.device_get(ema)}, "", extra)
        if best_params is not None:
            _flatten({"best": best_params}, "", extra)
        save_state(state, header, jax.tree.map(np.asarray, params), jax.tree.leaves(jax.device_get(opt_state)), extra)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=steps, initial=first, desc=f"train {config.kind}", unit="step")
    throughput = _Throughput()
    try:
        for i in range(first, steps):
            t_step = time.perf_counter()
            params, opt_state, loss, sums = step(params, opt_state, batch, labels)
            if ema is not None:
                ema = averaged(ema, params, i + 1)
            current, current_count = (batch, labels), real[0]
            counted[:] += (shape, real[1:])
            if i + 1 < steps:  # the next batch's copy overlaps this step (dispatched, not done)
                host_batch, shape, real = next(batches)
                batch, labels = jax.device_put(host_batch)
            loss = float(loss)
            if not np.isfinite(loss):
                if i == 0:  # computed before the first update: not the learning rate's doing
                    raise FloatingPointError(
                        f"training loss is {loss} at step 0, before any update: not finite on the initial parameters"
                    )
                raise FloatingPointError(f"training loss is {loss} at step {i}: lower learning_rate")
            for term, value in jax.device_get(sums).items():
                epoch_sums[term] = epoch_sums.get(term, 0) + np.asarray(value, np.float64)
            if (i + 1) % history["steps_per_epoch"] == 0:
                history["epoch_loss"].append(float(_loss_of(epoch_sums, weights, np)[0]))
                epoch_sums = {}
            elapsed = time.perf_counter() - t0
            throughput.add(current, current_count, elapsed - (t_step - t0))
            history["step"].append(i)
            history["train_loss"].append(loss)
            history["time"].append(elapsed)
            if eval_every and ((i + 1) % eval_every == 0 or i + 1 == steps):
                val = evaluate(potential, params if ema is None else ema, valid_batches)
                if not all(np.isfinite(v) for v in val.values()):  # never "best": no checkpoint would be written
                    raise FloatingPointError(
                        f"validation MAEs are {val} at step {i + 1}: the model is not finite there"
                    )
                history["eval_step"].append(i + 1)
                history["valid"].append(val)
                if (checkpoint is not None or state is not None) and val[_selection_metric(val)] < best:
                    best = val[_selection_metric(val)]
                    best_params = jax.tree.map(np.asarray, params if ema is None else ema)
                    if checkpoint is not None:
                        _save_atomic(checkpoint, config, best_params)
            # after the checkpoint: the state records the best it holds
            if state is not None and ((i + 1) % state_every == 0 or i + 1 == steps):
                write_state(i + 1)
            if bar is not None:
                rate = throughput.rate()
                bar.set_postfix(loss=f"{loss:.4g}", structs_per_s="-" if rate is None else f"{rate:.1f}")
                bar.update()
    finally:
        batches.close()  # the builder thread stops
    if bar is not None:
        bar.close()
    history["structures_per_second"] = throughput.rate()  # None: every step compiled
    # padded over real nodes (atoms) and edges of the batches trained on
    history["padding"] = {key: float(counted[0, k] / max(counted[1, k], 1)) for k, key in enumerate(("nodes", "edges"))}
    params = params if ema is None else ema  # what was validated and saved
    validation = evaluate(potential, params, valid_batches)
    if checkpoint is not None and not eval_every:
        _save_atomic(checkpoint, config, params)
    return FitResult(config, params, history, validation)


class _Throughput:
    """Structures per second of the training steps alone: a step whose batch shapes are new (so
    that ``jit`` compiled it: the first of each padded size) is left out, as is the time spent
    outside the steps (evaluation, checkpoints).

    >>> t = _Throughput()
    >>> t.add(np.zeros(4), 4, 9.0)  # compiles
    >>> t.rate() is None
    True
    >>> t.add(np.zeros(4), 4, 0.5); t.add(np.zeros(3), 3, 7.0); t.add(np.zeros(4), 4, 0.5)
    >>> t.rate()
    8.0
    """

    def __init__(self) -> None:
        self._seen: set = set()
        self._structures = 0
        self._seconds = 0.0

    def add(self, operands, structures: int, seconds: float) -> None:
        leaves, tree = jax.tree.flatten(operands)
        key = (tree, tuple((np.shape(a), np.dtype(a.dtype if hasattr(a, "dtype") else type(a)).str) for a in leaves))
        if key in self._seen:
            self._structures += structures
            self._seconds += seconds
        else:
            self._seen.add(key)

    def rate(self) -> float | None:
        """Structures per second so far, ``None`` before any step that did not compile."""
        return self._structures / self._seconds if self._seconds > 0 else None


def _save_atomic(path, config, params) -> None:
    path = os.fspath(path)
    tmp = path + ".partial"
    save(tmp, config, jax.tree.map(np.asarray, params))
    os.replace(tmp, path)
