"""Training a :class:`~e3j_models.Potential` on energies, forces (and stress) with optax.

The loss of a batch is ``w_E · mean_g ((E_g - E_g^ref) / n_g)² + w_F · mean_{atoms, xyz} (F - F^ref)²
+ w_S · mean_g' mean_ij (σ_g' - σ_g'^ref)²`` (energy per atom, eV² / (eV/Å)² / (eV/Å³)²; the stress
term when ``w_S > 0``, over the batch's structures ``g'`` that carry a stress label and are
periodic in all three directions, 0 for a batch with none; ``fit`` refuses ``w_S > 0`` when no
training structure has one). Forces in the loss mean a
second derivative through every convolution: ``jax.grad`` of a loss built on ``jax.grad``.

Batches: the training structures are split once (seeded) into batches of ``batch_size`` and every
batch is padded to one common :func:`~e3j_models.bucket_size` of nodes and edges, so training
compiles one step per batch shape (two when the last batch is smaller); each epoch visits the batches
in a new seeded order. The optimizer is ``clip_by_global_norm(10) → adam`` with a cosine decay of the
learning rate to 1 % over the run. Before training, per-element reference energies are fitted to
the training energies by least squares and stored in the config's ``atomic_energies`` (a config
that gives them keeps its own), and ``avg_num_neighbors`` is set to the training set's mean
neighbour count.

>>> from e3j_models import nequip
>>> from e3j_models.data import emt_structures
>>> cfg = prepare_config(nequip((28, 29), cutoff=3.0), emt_structures(4))
>>> len(cfg.atomic_energies), round(cfg.avg_num_neighbors)
(2, 12)

``fit(cfg, train, valid, steps=500)`` trains (``python -m e3j_models train`` is its command line).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._checks import (
    check_int,
    check_model_dtype,
    check_output_path,
    check_positive_real,
    check_real,
    check_structure_list,
)
from ._optional import require
from .batch import GraphBatch, Labels
from .config import MACEConfig, NequIPConfig, check_config
from .io import save
from .neighbours import batch_structures, bucket_size, check_structure, neighbour_list
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


def _results(atoms, k: int | str):
    """The structure's labels (``atoms.calc.results``); ``k`` names it (an index: ``structure k``)."""
    res = atoms.calc.results if atoms.calc is not None else {}
    if "energy" not in res or "forces" not in res:
        name = k if isinstance(k, str) else f"structure {k}"
        raise ValueError(f"{name} has no reference energy and forces (atoms.calc.results)")
    return res


def isolated_atom_energies(structures: Sequence) -> tuple[dict[int, float], list]:
    """``({atomic number: energy}, others)``: the energies of ``structures``' isolated atoms (one
    atom, no periodic direction, or ``info["config_type"] == "IsolatedAtom"`` as mace-torch marks
    them) and the other structures, in order. The energies are a config's ``atomic_energies`` taken
    from the reference method itself; an element with two isolated atoms of different energies is
    refused (``ValueError``).

    >>> from ase import Atoms
    >>> from ase.calculators.singlepoint import SinglePointCalculator
    >>> h = Atoms("H")
    >>> h.calc = SinglePointCalculator(h, energy=-13.6, forces=[[0.0, 0.0, 0.0]])
    >>> isolated_atom_energies([h])
    ({1: -13.6}, [])
    """
    check_structure_list("structures", structures)
    energies: dict[int, float] = {}
    others = []
    for k, atoms in enumerate(structures):
        isolated = atoms.info.get("config_type") == "IsolatedAtom" or (len(atoms) == 1 and not atoms.pbc.any())
        if not isolated:
            others.append(atoms)
            continue
        if len(atoms) != 1:
            raise ValueError(f"structure {k} is marked IsolatedAtom but holds {len(atoms)} atoms")
        z, energy = int(atoms.numbers[0]), float(_results(atoms, k)["energy"])
        if z in energies and energies[z] != energy:
            raise ValueError(f"structure {k}: element {z} has isolated-atom energies {energies[z]} and {energy}")
        energies[z] = energy
    return energies, others


def prepare_config(config: MACEConfig | NequIPConfig, structures: Sequence) -> MACEConfig | NequIPConfig:
    """``config`` with ``atomic_energies`` (least squares on the energies) and ``avg_num_neighbors``
    (mean over atoms) taken from ``structures``. Every element of the config must occur in them
    (``ValueError`` naming those that do not: their energies could not be fitted, nor their
    embeddings trained); where the compositions do not tell the elements' energies apart (all
    structures in one ratio) the least-squares solution of smallest norm is taken. A config that
    has ``atomic_energies`` already (isolated atoms' energies from the reference method, or an
    earlier fit's) keeps them."""
    z = list(config.atomic_numbers)
    counts = np.zeros((len(structures), len(z)))
    energies = np.zeros(len(structures))
    neighbours = 0
    atoms_total = 0
    for k, atoms in enumerate(structures):
        unknown = sorted(set(atoms.numbers.tolist()) - set(z))
        if unknown:
            raise ValueError(f"structure {k} holds atomic numbers {unknown} unknown to the config ({z})")
        for i, zi in enumerate(z):
            counts[k, i] = np.sum(atoms.numbers == zi)
        energies[k] = _results(atoms, k)["energy"]
        neighbours += _num_edges(atoms, config.cutoff)
        atoms_total += len(atoms)
    _check_elements_present(z, structures)
    given = config.atomic_energies
    e0 = np.linalg.lstsq(counts, energies, rcond=None)[0] if given is None else given
    return dataclasses.replace(
        config,
        atomic_energies=tuple(float(x) for x in e0),
        avg_num_neighbors=max(float(neighbours / atoms_total), 1.0),
    )


def _check_elements_present(atomic_numbers: Sequence[int], structures: Sequence) -> None:
    present = {int(n) for atoms in structures for n in atoms.numbers}
    absent = [z for z in atomic_numbers if z not in present]
    if absent:
        raise ValueError(
            f"atomic numbers {absent} of the config ({list(atomic_numbers)}) occur in none of the "
            f"{len(structures)} training structures: their reference energies cannot be fitted; drop them "
            "from atomic_numbers or add structures holding them"
        )


def check_training_data(
    config: MACEConfig | NequIPConfig,
    train: Sequence,
    weights: tuple,
    valid: Sequence = (),
    *,
    dtype=np.float32,
    every_element: bool = True,
) -> None:
    """What :func:`fit` refuses in its data (``ValueError``), checked before anything is trained:
    in any structure of ``train`` or ``valid`` (named ``train[k]``, ``valid[k]``), missing or
    non-finite labels (energy; forces ``[N, 3]``; stress where the loss reads it) and what the
    model cannot read (an element not in the config, no atoms, non-finite positions, atoms that
    coincide in ``dtype``); a config element in no training structure (unless ``every_element`` is
    False: fine-tuning trained parameters on a subset of the elements); a stress weight with no
    stress label to use."""
    check_config(config)
    check_structure_list("train", train)
    check_structure_list("valid", valid)
    for part, structures in (("train", train), ("valid", valid)):
        for k, atoms in enumerate(structures):
            _check_structure_data(config, atoms, f"{part}[{k}]", weights, dtype)
    if every_element:
        _check_elements_present(config.atomic_numbers, train)
    if weights[2] > 0 and not any(_has_stress(a, _results(a, k)) for k, a in enumerate(train)):
        raise ValueError(
            f"weights[2] (stress) is {weights[2]} but no training structure has a stress label on a fully "
            "periodic cell (atoms.calc.results['stress']; virials are not read): the term would be 0"
        )


def _check_structure_data(config, atoms, name: str, weights: tuple, dtype) -> None:
    """``ValueError`` naming structure ``name`` for labels the loss would read and cannot use, or
    atoms the model cannot read (a NaN force passed to a validation MAE of NaN and no checkpoint;
    coincident atoms were named by their place in a shuffled batch)."""
    res = _results(atoms, name)
    n = len(atoms)
    energy = np.asarray(res["energy"], np.float64)
    if energy.size != 1 or not np.isfinite(energy).all():
        raise ValueError(f"{name} has a reference energy that is not one finite number: {res['energy']}")
    forces = np.asarray(res["forces"], np.float64)
    if forces.shape != (n, 3):
        raise ValueError(f"{name} has reference forces of shape {forces.shape}, expected [{n}, 3]")
    if not np.isfinite(forces).all():
        raise ValueError(
            f"{name} has non-finite reference forces (atom {int(np.argwhere(~np.isfinite(forces))[0, 0])})"
        )
    if weights[2] > 0 and _has_stress(atoms, res):  # a label the loss reads
        stress = np.asarray(res["stress"], np.float64)
        if stress.shape not in ((6,), (3, 3)) or not np.isfinite(stress).all():
            raise ValueError(f"{name} has a reference stress that is not 6 or 3×3 finite numbers: {stress!r}")
    check_structure(atoms, config.atomic_numbers, config.cutoff, dtype=dtype, where=f" ({name})")


def _num_edges(atoms, cutoff: float) -> int:
    return len(neighbour_list(atoms.positions, cutoff, np.asarray(atoms.cell), atoms.pbc)[0])


def _batches(structures, config, batch_size, rng, dtype, reference_energies=None):
    """Seeded split into batches, all padded to one node/edge bucket: ``[(GraphBatch, Labels)]``.

    ``reference_energies`` (one per element of ``config.atomic_numbers``, or None): subtracted from
    each structure's energy label in float64 before the cast to ``dtype``, so that a float32 label
    keeps the digits of an energy far from zero (all-electron totals: ~1e4 eV per atom)."""
    e0 = None if reference_energies is None else dict(zip(config.atomic_numbers, reference_energies, strict=True))
    order = rng.permutation(len(structures)) if rng is not None else np.arange(len(structures))
    groups = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    sizes = []
    for grp in groups:
        n = sum(len(structures[k]) for k in grp)
        e = sum(_num_edges(structures[k], config.cutoff) for k in grp)
        sizes.append((n, e))
    n_pad = bucket_size(max(n for n, _ in sizes) + 1)
    e_pad = bucket_size(max(e for _, e in sizes))
    out = []
    for grp in groups:
        sts = [structures[k] for k in grp]
        batch = batch_structures(
            sts, config.atomic_numbers, config.cutoff, num_nodes=n_pad, num_edges=e_pad, dtype=dtype
        )
        forces = np.zeros((n_pad, 3), dtype)
        stress = np.zeros((len(sts), 3, 3), dtype)
        has_stress = np.zeros(len(sts), bool)
        offset = 0
        for j, (k, atoms) in enumerate(zip(grp, sts, strict=True)):
            res = _results(atoms, int(k))
            forces[offset : offset + len(atoms)] = res["forces"]
            offset += len(atoms)
            if _has_stress(atoms, res):
                s = np.asarray(res["stress"])
                stress[j] = s if s.shape == (3, 3) else _voigt_to_full(s)
                has_stress[j] = True
        energies = [float(_results(a, 0)["energy"]) for a in sts]
        if e0 is not None:
            energies = [e - sum(e0[int(z)] for z in a.numbers) for e, a in zip(energies, sts, strict=True)]
        labels = Labels(
            jnp.asarray(energies, dtype),
            jnp.asarray([len(a) for a in sts], dtype),
            jnp.asarray(forces),
            jnp.asarray(stress),
            jnp.asarray(has_stress),
        )
        out.append((batch, labels))
    return out


def _has_stress(atoms, results) -> bool:
    """Whether a structure's stress is a label: given, and the cell periodic in all directions."""
    return "stress" in results and bool(np.all(atoms.pbc))


def _voigt_to_full(s):
    xx, yy, zz, yz, xz, xy = s
    return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])


def loss_fn(
    potential: Potential,
    params,
    batch: GraphBatch,
    labels: Labels,
    weights: tuple[float, float, float] = (1.0, 1.0, 0.0),
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``(loss, parts)`` of one batch (see the module docstring); ``weights = (w_E, w_F, w_S)``."""
    w_e, w_f, w_s = weights
    out = potential(params, batch, forces=True, stress=w_s > 0)
    e = jnp.mean(((out["energy"] - labels.energy) / labels.num_atoms) ** 2)
    mask = batch.node_mask[:, None]
    f = jnp.sum(jnp.where(mask, (out["forces"] - labels.forces) ** 2, 0)) / (3 * jnp.sum(batch.node_mask))
    parts = {"energy": e, "forces": f}
    loss = w_e * e + w_f * f
    if w_s > 0:
        # structures without a stress label add 0, and so does their gradient: an open structure's
        # predicted stress is NaN, which must not reach the square (where()'s gradient still would)
        has = jnp.broadcast_to(labels.has_stress, labels.energy.shape)[:, None, None]
        predicted = jnp.where(has, out["stress"], labels.stress)
        per_structure = jnp.mean((predicted - labels.stress) ** 2, axis=(1, 2))
        s = jnp.sum(per_structure) / jnp.maximum(jnp.sum(has), 1)
        parts["stress"] = s
        loss = loss + w_s * s
    return loss, parts


@functools.partial(jax.jit, static_argnums=0)
def _energy_and_forces(potential: Potential, params, batch):
    # one jitted function for every call: keyed by the potential (its identity) and the batch's
    # shapes, so fit's validation compiles once, not at every eval_every step
    return potential(params, batch, forces=True)


def evaluate(potential: Potential, params, batches) -> dict[str, float]:
    """Mean absolute errors over ``batches``: ``energy_mae_per_atom`` (eV/atom), ``force_mae`` (eV/Å).

    Compiles once per potential and batch shape (repeated calls, as ``fit``'s validation makes,
    reuse it)."""
    e_err, f_err, n_graphs, n_comp = 0.0, 0.0, 0, 0
    for batch, labels in batches:
        out = _energy_and_forces(potential, params, batch)
        e_err += float(jnp.sum(jnp.abs(out["energy"] - labels.energy) / labels.num_atoms))
        mask = np.asarray(batch.node_mask)
        f_err += float(np.sum(np.abs(np.asarray(out["forces"] - labels.forces))[mask]))
        n_graphs += int(labels.energy.shape[0])
        n_comp += 3 * int(mask.sum())
    return {"energy_mae_per_atom": e_err / n_graphs, "force_mae": f_err / n_comp}


def evaluate_structures(
    potential: Potential, params: Mapping[str, Any], structures: Sequence, *, batch_size: int = 4, dtype=None
) -> dict[str, float]:
    """Errors of ``potential`` with ``params`` on labelled ``structures`` (a test set, as
    :func:`~e3j_models.data.read_dataset` reads it): ``energy_mae_per_atom`` and
    ``energy_rmse_per_atom`` (eV/atom), ``force_mae`` and ``force_rmse`` (eV/Å, over components),
    ``stress_mae`` and ``stress_rmse`` (eV/Å³, over the components of the structures with a stress
    label on a fully periodic cell; absent without one), and ``structures`` / ``atoms`` counted.

    The structures are checked as :func:`fit` checks its data; energies are compared with the
    reference energies taken out on the host in float64, as :func:`fit` trains. ``dtype``: the
    computation's (default: that of ``params``).
    """
    from e3j.backends import current_backend_request

    from .calculator import _energy_forces_stress  # keyed by the backend request too; needs ASE, as the data does

    check_structure_list("structures", structures)
    if not structures:
        raise ValueError("structures is empty: give at least one structure")
    batch_size = check_int("batch_size", batch_size, 1)
    if not isinstance(potential, Potential):
        raise TypeError(f"potential must be an e3j_models.Potential, got {type(potential).__name__}")
    potential.check_params(params)
    floats = [a.dtype for a in jax.tree.leaves(params) if jnp.issubdtype(a.dtype, jnp.floating)]
    dtype = check_model_dtype(dtype if dtype is not None else (floats[0] if floats else None))
    config = potential.config
    check_training_data(config, structures, (1.0, 1.0, 0.0), dtype=dtype, every_element=False)
    bare = Potential(
        dataclasses.replace(config, atomic_energies=None), potential.backend, factored_radial=potential.factored_radial
    )
    params = _floats_as(params, dtype)
    e_abs = e_sq = f_abs = f_sq = s_abs = s_sq = 0.0
    n_structures = n_atoms = n_stress = 0
    for batch, labels in _batches(structures, config, batch_size, None, dtype, config.atomic_energies):
        out = _energy_forces_stress(bare, current_backend_request(), params, batch)
        de = np.asarray(out["energy"] - labels.energy, np.float64) / np.asarray(labels.num_atoms, np.float64)
        mask = np.asarray(batch.node_mask)
        df = np.asarray(out["forces"] - labels.forces, np.float64)[mask]
        ds = np.asarray(out["stress"] - labels.stress, np.float64)[np.asarray(labels.has_stress)]
        e_abs, e_sq = e_abs + np.abs(de).sum(), e_sq + np.square(de).sum()
        f_abs, f_sq = f_abs + np.abs(df).sum(), f_sq + np.square(df).sum()
        s_abs, s_sq = s_abs + np.abs(ds).sum(), s_sq + np.square(ds).sum()
        n_structures, n_atoms, n_stress = n_structures + de.size, n_atoms + int(mask.sum()), n_stress + ds.size
    metrics = {
        "structures": n_structures,
        "atoms": n_atoms,
        "energy_mae_per_atom": e_abs / n_structures,
        "energy_rmse_per_atom": float(np.sqrt(e_sq / n_structures)),
        "force_mae": f_abs / (3 * n_atoms),
        "force_rmse": float(np.sqrt(f_sq / (3 * n_atoms))),
    }
    if n_stress:
        metrics |= {"stress_mae": s_abs / n_stress, "stress_rmse": float(np.sqrt(s_sq / n_stress))}
    return {k: v if isinstance(v, int) else float(v) for k, v in metrics.items()}


def _floats_as(params, dtype):
    """``params`` with its floating leaves in ``dtype`` (a loaded model's numpy arrays included)."""
    return jax.tree.map(lambda a: jnp.asarray(a, dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, params)


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
) -> FitResult:
    """Train for ``steps`` optimizer steps on ``train``; validate on ``valid``.

    From scratch by default: the config's ``atomic_energies`` (when None) and ``avg_num_neighbors``
    are fitted to ``train`` first (:func:`prepare_config`). ``params`` (e.g. ``load(path)``'s, with
    its config) continues training from them instead (fine-tuning): the config is taken as it is,
    since its constants are part of what the parameters compute. The per-element reference energies
    are subtracted from the energy labels on the host, in float64, and left out of the trained
    model's graph, so float32 training keeps the digits of large absolute energies.

    ``backend`` ``"e3nn"`` trains the e3nn-jax twin (same parameter tree). ``eval_every > 0`` records
    validation MAEs every so many steps and, with ``checkpoint``, saves the best model there
    (atomically: a temp file renamed). ``factored_radial``: as :class:`Potential`'s (both routes'
    training gradients measured in docs/models.md). ``dtype``: of the parameters and batches,
    float32 or float64 (which needs ``jax_enable_x64``). Returns a :class:`FitResult`.
    """
    optax = require("optax", "fit")
    if progress:
        require("tqdm", "fit's progress bar (progress=False trains without)")

    steps = check_int("steps", steps, 1)
    batch_size = check_int("batch_size", batch_size, 1)
    eval_every = check_int("eval_every", eval_every, 0)
    learning_rate = check_positive_real("learning_rate", learning_rate)  # a negative rate climbs the loss
    seed = check_int("seed", seed, 0)
    if checkpoint is not None:  # now: it is written at the end (or at the first validation)
        checkpoint = check_output_path("checkpoint", checkpoint)
    if not train:
        raise ValueError("train is empty: give at least one structure")
    if not valid:
        raise ValueError("valid is empty: give at least one validation structure")
    weights = _check_weights(weights)
    dtype = check_model_dtype(dtype)
    check_training_data(config, train, weights, valid, dtype=dtype, every_element=params is None)
    if params is None:
        config = prepare_config(config, train)
    elif config.atomic_energies is None:
        raise ValueError("config has no atomic_energies: fine-tuning params needs the config they were trained with")
    # the model trained and validated here leaves the reference energies out; the labels leave them
    # out too (on the host, in float64): the same residuals, without float32's rounding of ~1e4 eV
    potential = Potential(dataclasses.replace(config, atomic_energies=None), backend, factored_radial=factored_radial)
    rng = np.random.default_rng(seed)
    train_batches = _batches(train, config, batch_size, rng, dtype, config.atomic_energies)
    valid_batches = _batches(valid, config, batch_size, None, dtype, config.atomic_energies)
    if params is None:
        params = potential.init(jax.random.key(seed), train_batches[0][0], dtype=dtype)
    else:
        potential.check_params(params)
        params = _floats_as(params, dtype)
    schedule = optax.cosine_decay_schedule(learning_rate, steps, alpha=0.01)
    optimizer = optax.chain(optax.clip_by_global_norm(10.0), optax.adam(schedule))
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, batch, labels):
        def objective(p):
            return loss_fn(potential, p, batch, labels, weights)

        (loss, parts), grads = jax.value_and_grad(objective, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, parts

    history: dict[str, Any] = {"step": [], "train_loss": [], "time": [], "eval_step": [], "valid": []}
    history["steps_per_epoch"] = len(train_batches)
    best = np.inf
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=steps, desc=f"train {config.kind}", unit="step")
    t0 = time.perf_counter()
    throughput = _Throughput()
    order: list[int] = []
    for i in range(steps):
        if not order:
            order = rng.permutation(len(train_batches)).tolist()
        batch, labels = train_batches[order.pop()]
        t_step = time.perf_counter()
        params, opt_state, loss, _ = step(params, opt_state, batch, labels)
        loss = float(loss)
        if not np.isfinite(loss):
            if i == 0:  # computed before the first update: not the learning rate's doing
                raise FloatingPointError(
                    f"training loss is {loss} at step 0, before any update: not finite on the initial parameters"
                )
            raise FloatingPointError(f"training loss is {loss} at step {i}: lower learning_rate")
        elapsed = time.perf_counter() - t0
        throughput.add((batch, labels), batch.num_graphs, elapsed - (t_step - t0))
        history["step"].append(i)
        history["train_loss"].append(loss)
        history["time"].append(elapsed)
        if eval_every and ((i + 1) % eval_every == 0 or i + 1 == steps):
            val = evaluate(potential, params, valid_batches)
            if not all(np.isfinite(v) for v in val.values()):  # never "best": no checkpoint would be written
                raise FloatingPointError(f"validation MAEs are {val} at step {i + 1}: the model is not finite there")
            history["eval_step"].append(i + 1)
            history["valid"].append(val)
            if checkpoint is not None and val["force_mae"] < best:
                best = val["force_mae"]
                _save_atomic(checkpoint, config, params)
        if bar is not None:
            rate = throughput.rate()
            bar.set_postfix(loss=f"{loss:.4g}", structs_per_s="-" if rate is None else f"{rate:.1f}")
            bar.update()
    if bar is not None:
        bar.close()
    validation = evaluate(potential, params, valid_batches)
    if checkpoint is not None and not eval_every:
        _save_atomic(checkpoint, config, params)
    return FitResult(config, params, history, validation)


class _Throughput:
    """Structures per second of the training steps alone: a step whose batch shapes are new (so
    that ``jit`` compiled it: the first, and e.g. the first smaller last batch) is left out, as is
    the time spent outside the steps (evaluation, checkpoints).

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


def epoch_losses(history: dict[str, Any], steps_per_epoch: int | None = None) -> np.ndarray:
    """The smoothed loss curve: the mean training loss of each complete epoch, ``[num_epochs]``.

    An epoch visits every training batch once, so its mean is free of the spread between easy and
    hard batches that makes the per-step loss (and any moving average shorter than an epoch) jump.
    ``steps_per_epoch`` defaults to the one :func:`fit` records in ``history``.

    >>> epoch_losses({"train_loss": [4.0, 2.0, 3.0, 1.0, 9.0], "steps_per_epoch": 2}).tolist()
    [3.0, 2.0]
    """
    k = history.get("steps_per_epoch") if steps_per_epoch is None else steps_per_epoch
    k = check_int("steps_per_epoch", k, 1, " (history has none recorded?)")
    loss = np.asarray(history["train_loss"], np.float64)
    return loss[: len(loss) // k * k].reshape(-1, k).mean(axis=1)


def _save_atomic(path, config, params) -> None:
    path = os.fspath(path)
    tmp = path + ".partial"
    save(tmp, config, jax.tree.map(np.asarray, params))
    os.replace(tmp, path)


def plot_history(history: dict[str, list], path: str | os.PathLike) -> None:
    """Loss curve (raw and 20-step moving average, log scale) and validation MAEs to a PNG."""
    require("matplotlib", "plot_history")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    loss = np.asarray(history["train_loss"])
    axes[0].semilogy(history["step"], loss, alpha=0.3, label="train loss")
    w = min(20, len(loss))
    axes[0].semilogy(history["step"][w - 1 :], np.convolve(loss, np.ones(w) / w, "valid"), label=f"{w}-step mean")
    if history.get("steps_per_epoch"):
        k = history["steps_per_epoch"]
        epochs = epoch_losses(history)
        axes[0].semilogy(k * np.arange(1, len(epochs) + 1) - 1, epochs, "o-", ms=3, label="epoch mean")
    axes[0].set_xlabel("step")
    axes[0].legend()
    if history["valid"]:
        steps = history["eval_step"]
        axes[1].semilogy(steps, [v["force_mae"] for v in history["valid"]], "o-", label="force MAE (eV/Å)")
        axes[1].semilogy(
            steps, [v["energy_mae_per_atom"] for v in history["valid"]], "s-", label="energy MAE (eV/atom)"
        )
        axes[1].set_xlabel("step")
        axes[1].legend()
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=100)
    plt.close(fig)


def write_history(history: dict[str, list], path: str | os.PathLike) -> None:
    """``history`` (as :func:`fit` returns it) to a JSON file."""
    with open(os.fspath(path), "w") as f:
        json.dump(history, f)
