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

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import os
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
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
from ._train_state import load_state, save_state
from .batch import GraphBatch, Labels
from .config import MACEConfig, NequIPConfig, check_config, config_to_dict
from .data import WEIGHT_KEYS
from .io import _flatten, _nest, save
from .neighbours import _assemble, _checked_graph, bucket_size, neighbour_list
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


def _results(atoms) -> Mapping[str, Any]:
    """The structure's labels (``atoms.calc.results``; empty without a calculator)."""
    return atoms.calc.results if atoms.calc is not None else {}


def _label_weights(
    atoms, results, config_weights: bool = True, type_weights: Mapping[str, float] | None = None
) -> tuple[float, float, float]:
    """The structure's weights of its energy, forces and stress terms: 0 for a label it lacks (the
    stress: unless periodic in all directions), else mace-torch's ``config_weight`` times
    ``config_{energy,forces,stress}_weight`` from ``atoms.info`` (each 1 when absent; all 1 without
    ``config_weights``), times ``type_weights[atoms.info["config_type"]]`` (mace-torch's
    ``config_type_weights``; the type ``"Default"`` when absent, 1 for a type not given).
    ``ValueError`` for a weight that is not a finite number >= 0."""
    present = ("energy" in results, "forces" in results, _has_stress(atoms, results))
    if not config_weights:
        return tuple(float(p) for p in present)
    values = {}
    for key in WEIGHT_KEYS:
        value = atoms.info.get(key, 1.0)
        try:
            values[key] = float(value)
        except (TypeError, ValueError):
            values[key] = math.nan
        if not (math.isfinite(values[key]) and values[key] >= 0):
            raise ValueError(f"has {key} {value!r}: a per-structure weight must be a finite number >= 0")
    base = values["config_weight"] * (type_weights or {}).get(_config_type(atoms), 1.0)
    terms = (base * values[f"config_{p}_weight"] for p in ("energy", "forces", "stress"))
    return tuple(w if p else 0.0 for w, p in zip(terms, present, strict=True))


def _config_type(atoms) -> str:
    """The structure's ``config_type`` (``atoms.info``), mace-torch's ``"Default"`` when absent."""
    return str(atoms.info.get("config_type", "Default"))


def _check_type_weights(
    type_weights, structures: Sequence | None, name: str = "config_type_weights"
) -> dict[str, float] | None:
    """``type_weights`` as ``{config_type: weight}``, refused naming ``name`` unless each key is a
    string, each weight a finite number >= 0 (not a bool), and each type (but ``"Default"``) some
    structure's of ``structures`` (a misspelt type would weigh nothing, silently; None: not
    checked)."""
    if type_weights is None:
        return None
    if not isinstance(type_weights, Mapping):
        raise TypeError(f"{name} must map config types to weights, got {type(type_weights).__name__}")
    out = {}
    for key, value in type_weights.items():
        if not isinstance(key, str):  # 1 and "1" would become one key
            raise TypeError(f"{name}'s keys must be config types as strings, got {key!r}")
        try:
            out[key] = math.nan if isinstance(value, bool) else float(value)
        except (TypeError, ValueError):
            out[key] = math.nan
        if not (math.isfinite(out[key]) and out[key] >= 0):
            raise ValueError(f"{name}[{key!r}] is {value!r}: a weight must be a finite number >= 0")
    if structures is None:
        return out
    present = {_config_type(a) for a in structures}
    unknown = sorted(set(out) - present - {"Default"})
    if unknown:
        raise ValueError(
            f"{name} names config types {unknown} that no structure has (atoms.info['config_type']; "
            f"the structures' are {sorted(present)})"
        )
    return out


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
        if "energy" not in _results(atoms):
            raise ValueError(f"structure {k} is an isolated atom without an energy label")
        z, energy = int(atoms.numbers[0]), float(_results(atoms)["energy"])
        if z in energies and energies[z] != energy:
            raise ValueError(f"structure {k}: element {z} has isolated-atom energies {energies[z]} and {energy}")
        energies[z] = energy
    return energies, others


def prepare_config(config: MACEConfig | NequIPConfig, structures: Sequence) -> MACEConfig | NequIPConfig:
    """``config`` with ``atomic_energies`` (least squares on the energies) and ``avg_num_neighbors``
    (mean over atoms) taken from ``structures``. Every element of the config must occur in them
    (``ValueError`` naming those that do not: their energies could not be fitted, nor their
    embeddings trained); where the compositions do not tell the elements' energies apart (all
    structures in one ratio) the least-squares solution of smallest norm is taken. Structures
    without an energy label do not enter the fit (none with one: the energies are 0). A config that
    has ``atomic_energies`` already (isolated atoms' energies from the reference method, or an
    earlier fit's) keeps them."""
    return _fitted_config(config, structures, [len(_neighbours(atoms, config.cutoff)[0]) for atoms in structures])


def _fitted_config(config, structures: Sequence, num_edges: Sequence[int]):
    """:func:`prepare_config` given each structure's neighbour count (``fit`` has them from its checks)."""
    z = list(config.atomic_numbers)
    counts = np.zeros((len(structures), len(z)))
    energies = np.zeros(len(structures))
    labelled = np.zeros(len(structures), bool)
    neighbours = 0
    atoms_total = 0
    for k, atoms in enumerate(structures):
        unknown = sorted(set(atoms.numbers.tolist()) - set(z))
        if unknown:
            raise ValueError(f"structure {k} holds atomic numbers {unknown} unknown to the config ({z})")
        for i, zi in enumerate(z):
            counts[k, i] = np.sum(atoms.numbers == zi)
        labelled[k] = "energy" in _results(atoms)
        energies[k] = _results(atoms)["energy"] if labelled[k] else 0.0
        neighbours += num_edges[k]
        atoms_total += len(atoms)
    _check_elements_present(z, structures)
    given = config.atomic_energies
    if given is not None:
        e0 = given
    elif labelled.any():
        e0 = np.linalg.lstsq(counts[labelled], energies[labelled], rcond=None)[0]
    else:  # forces alone fix no energy offset
        e0 = np.zeros(len(z))
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
    config_type_weights: Mapping[str, float] | None = None,
) -> None:
    """What :func:`fit` refuses in its data (``ValueError``), checked before anything is trained:
    in any structure of ``train`` or ``valid`` (named ``train[k]``, ``valid[k]``), neither energy
    nor forces, non-finite labels (energy; forces ``[N, 3]``; stress where the loss reads it),
    per-structure weights that are not finite numbers >= 0 (``config_weight`` ...,
    :data:`~e3j_models.data.WEIGHT_KEYS`) and what the model cannot read (an element not in the
    config, no atoms, non-finite positions, atoms that coincide in ``dtype``); a config element in
    no training structure (unless ``every_element`` is False: fine-tuning trained parameters on a
    subset of the elements); a loss weight > 0 of a term no training structure has a label of
    (energy-only data needs ``weights[1] = 0``); ``config_type_weights`` (as :func:`fit`'s) with a
    weight that is not a finite number >= 0 or a type no structure of train or valid has."""
    _check_training_data(
        config, train, weights, valid, dtype=dtype, every_element=every_element, type_weights=config_type_weights
    )


def _check_training_data(
    config,
    train,
    weights,
    valid=(),
    *,
    dtype=np.float32,
    every_element=True,
    type_weights=None,
    names=("weights[0]", "weights[1]", "weights[2]"),
    type_weights_name="config_type_weights",
):
    """:func:`check_training_data`, returning each structure's checked graph it built (for
    :func:`_batch`; :func:`~e3j_models.neighbours._checked_graph`): ``(train's, valid's)``. ``names``
    and ``type_weights_name`` name the loss weights and the type weights in errors (the command
    line's flags)."""
    check_config(config)
    check_structure_list("train", train)
    check_structure_list("valid", valid)
    type_weights = _check_type_weights(type_weights, [*train, *valid], type_weights_name)
    found = {"train": [], "valid": []}
    label_weights = []  # the training structures' (energy, forces, stress) weights
    for part, structures in (("train", train), ("valid", valid)):
        for k, atoms in enumerate(structures):
            graph, its_weights = _check_structure_data(config, atoms, f"{part}[{k}]", weights, dtype, type_weights)
            found[part].append(graph)
            if part == "train":
                label_weights.append(its_weights)
    if every_element:
        _check_elements_present(config.atomic_numbers, train)
    labels = (
        "an energy label",
        "forces",
        "a stress label on a fully periodic cell (atoms.calc.results['stress']; read_dataset reads virials too)",
    )
    used = np.array(label_weights).reshape(-1, 3).max(axis=0, initial=0) > 0
    for i, (term, label) in enumerate(zip(("energy", "forces", "stress"), labels, strict=True)):
        if weights[i] > 0 and not used[i]:
            raise ValueError(
                f"{names[i]} ({term}) is {weights[i]} but no training structure has {label} with a weight > 0 "
                f"(its own weights in atoms.info times its config type's): the term would be 0 ({names[i]} 0 trains "
                "on the other labels alone)"
            )
    return found["train"], found["valid"]


def _check_structure_data(config, atoms, name: str, weights: tuple, dtype, type_weights=None):
    """``ValueError`` naming structure ``name`` for labels the loss would read and cannot use, or
    atoms the model cannot read (a NaN force passed to a validation MAE of NaN and no checkpoint;
    coincident atoms were named by their place in a shuffled batch). Returns the structure's
    checked graph, built by the check, and its :func:`_label_weights`."""
    res = _results(atoms)
    n = len(atoms)
    if "energy" not in res and "forces" not in res:
        raise ValueError(f"{name} has no reference energy or forces (atoms.calc.results)")
    if "energy" in res:
        energy = np.asarray(res["energy"], np.float64)
        if energy.size != 1 or not np.isfinite(energy).all():
            raise ValueError(f"{name} has a reference energy that is not one finite number: {res['energy']}")
    if "forces" in res:
        forces = np.asarray(res["forces"], np.float64)
        if forces.shape != (n, 3):
            raise ValueError(f"{name} has reference forces of shape {forces.shape}, expected [{n}, 3]")
        if not np.isfinite(forces).all():
            raise ValueError(
                f"{name} has non-finite reference forces (atom {int(np.argwhere(~np.isfinite(forces))[0, 0])})"
            )
    try:
        label_weights = _label_weights(atoms, res, type_weights=type_weights)
    except ValueError as err:
        raise ValueError(f"{name} {err}") from None
    if weights[2] > 0 and _has_stress(atoms, res):  # a label the loss reads
        stress = np.asarray(res["stress"], np.float64)
        if stress.shape not in ((6,), (3, 3)) or not np.isfinite(stress).all():
            raise ValueError(f"{name} has a reference stress that is not 6 or 3×3 finite numbers: {stress!r}")
    graph = _checked_graph(atoms, config.atomic_numbers, config.cutoff, dtype, where=f" ({name})")
    return graph, label_weights


def _neighbours(atoms, cutoff: float):
    """A structure's unchecked neighbour list ``(senders, receivers, shifts)`` (for structures that
    were not checked here)."""
    return neighbour_list(atoms.positions, cutoff, np.asarray(atoms.cell), atoms.pbc)


def _bucket_counts(nodes: np.ndarray, edges: np.ndarray, into: dict[int, tuple[int, int]]) -> None:
    """Adds batches of ``nodes`` (one padding node included) and ``edges`` to ``into``: ``{edge
    bucket (:func:`~e3j_models.bucket_size`): (batches, their largest nodes)}``, the counts that
    :func:`_shape_table` chooses shapes from (accumulated epoch by epoch, not kept per batch)."""
    nodes, edges = np.asarray(nodes, np.int64), np.asarray(edges, np.int64)
    distinct, inverse = np.unique(edges, return_inverse=True)
    grid = np.array([bucket_size(int(e)) for e in distinct], np.int64)[inverse.reshape(-1)]
    for g in np.unique(grid):
        these = grid == g
        count, most = into.get(int(g), (0, 0))
        into[int(g)] = (count + int(these.sum()), max(most, int(nodes[these].max())))


def _shape_table(buckets: Mapping[int, tuple[int, int]], max_shapes: int) -> dict[int, tuple[int, int]]:
    """``{edge bucket: padded (nodes, edges)}`` for batches counted by :func:`_bucket_counts`: at
    most ``max_shapes`` distinct shapes (each compiles the training step once), chosen to pad the
    least.

    Each shape covers a run of the edge buckets in order, padded to the run's largest nodes and
    edges (on the bucket grid), and the runs minimize the padded nodes plus edges over all batches
    (dynamic programming over the grid's values, a few dozen even for a dataset of a million
    structures). Fewer shapes are taken where more would pad less by under 10 %: a compile costs
    more than a few percent of an epoch."""
    values = sorted(buckets)
    count = [buckets[v][0] for v in values]
    most_nodes = [buckets[v][1] for v in values]
    m = len(values)
    # run[i][j]: the one shape of the batches of grid values i..j; cost[i][j]: their padded nodes
    # plus edges (counts and largest nodes carried along j: O(m²))
    run = [[(0, 0)] * m for _ in range(m)]
    cost = [[0] * m for _ in range(m)]
    for i in range(m):
        batches, nodes = 0, 0
        for j in range(i, m):
            batches, nodes = batches + count[j], max(nodes, most_nodes[j])
            run[i][j] = (bucket_size(nodes), values[j])
            cost[i][j] = batches * sum(run[i][j])
    # best[k][j]: the least padding of grid values 0..j in k + 1 runs; cut[k][j]: where the last begins
    best = [[float(cost[0][j]) for j in range(m)]]
    cut = [[0] * m]
    for _ in range(1, min(max_shapes, m)):
        prev, row, starts = best[-1], [], []
        for j in range(m):
            options = [(prev[i - 1] + cost[i][j], i) for i in range(1, j + 1)] or [(np.inf, 0)]
            value, start = min(options)
            row.append(value if value < prev[j] else prev[j])
            starts.append(start if value < prev[j] else -1)
        best.append(row)
        cut.append(starts)
    k = next(k for k in range(len(best)) if best[k][m - 1] <= 1.1 * best[-1][m - 1])
    shape_of = {}
    j = m - 1
    while j >= 0:
        while k > 0 and cut[k][j] < 0:  # k + 1 runs pad no less than k here
            k -= 1
        i = cut[k][j] if k > 0 else 0
        for v in values[i : j + 1]:
            shape_of[v] = run[i][j]
        j, k = i - 1, k - 1
    return shape_of


def _padding_shapes(sizes: Sequence[tuple[int, int]], max_shapes: int) -> list[tuple[int, int]]:
    """Each batch's padded ``(nodes, edges)`` (:func:`_shape_table`'s) for batches of ``sizes``:
    ``(nodes, edges)``, one padding node included.

    >>> _padding_shapes([(9, 100), (9, 110), (300, 3000)], 4)
    [(16, 128), (16, 128), (336, 3568)]
    >>> _padding_shapes([(9, 100), (9, 110), (300, 3000)], 1)
    [(336, 3568), (336, 3568), (336, 3568)]
    """
    nodes, edges = np.asarray(sizes, np.int64).reshape(-1, 2).T
    buckets: dict[int, tuple[int, int]] = {}
    _bucket_counts(nodes, edges, buckets)
    table = _shape_table(buckets, max_shapes)
    return [table[bucket_size(int(e))] for e in edges]


def _epoch_order(num_structures: int, seed: int, epoch: int) -> np.ndarray:
    """The training structures' order in ``epoch``: a permutation seeded by ``(seed, epoch)``, so
    that any epoch's batches are drawn again without keeping them. Each epoch's batches are this
    order cut into ``batch_size`` (the last smaller when ``batch_size`` does not divide the count)."""
    return np.random.default_rng((seed, epoch)).permutation(num_structures)


def _batch_sizes(order: np.ndarray, batch_size: int, num_atoms: np.ndarray, num_edges: np.ndarray):
    """``(nodes, edges)`` of the batches of ``order`` cut into ``batch_size``: each batch's atoms plus
    one (padding edges point at a padding node) and its edges."""
    starts = np.arange(0, len(order), batch_size)
    return np.add.reduceat(num_atoms[order], starts) + 1, np.add.reduceat(num_edges[order], starts)


def _training_shapes(num_atoms, num_edges, batch_size: int, steps: int, seed: int, max_shapes: int):
    """:func:`_shape_table` of the batches of the ``steps`` training steps (every epoch's, drawn by
    :func:`_epoch_order`): a shape for each batch the run will take."""
    num_atoms, num_edges = np.asarray(num_atoms, np.int64), np.asarray(num_edges, np.int64)
    per_epoch = -(-len(num_atoms) // batch_size)
    buckets: dict[int, tuple[int, int]] = {}
    for epoch in range(-(-steps // per_epoch)):
        nodes, edges = _batch_sizes(_epoch_order(len(num_atoms), seed, epoch), batch_size, num_atoms, num_edges)
        used = min(per_epoch, steps - epoch * per_epoch)
        _bucket_counts(nodes[:used], edges[:used], buckets)
    return _shape_table(buckets, max_shapes)


def _batches(
    structures,
    config,
    batch_size,
    rng,
    dtype,
    reference_energies=None,
    *,
    graphs=None,
    max_shapes: int = 1,
    config_weights: bool = True,
):
    """``structures`` (in a seeded order with ``rng``) cut into batches, on the host: ``[(GraphBatch,
    Labels)]`` of numpy arrays, each padded to one of at most ``max_shapes`` node/edge sizes
    (:func:`_padding_shapes`). The validation batches; arguments as :func:`_batch`'s (default
    ``graphs``: checked and built here)."""
    if graphs is None:
        graphs = [_checked_graph(a, config.atomic_numbers, config.cutoff, dtype) for a in structures]
    order = rng.permutation(len(structures)) if rng is not None else np.arange(len(structures))
    groups = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    num_atoms = np.array([len(a) for a in structures])
    num_edges = np.array([len(g[4]) for g in graphs])
    shapes = _padding_shapes(np.stack(_batch_sizes(order, batch_size, num_atoms, num_edges), axis=1), max_shapes)
    return [
        _batch(structures, grp, shape, config, dtype, reference_energies, graphs, config_weights)
        for grp, shape in zip(groups, shapes, strict=True)
    ]


def _batch(
    structures,
    group,
    shape,
    config,
    dtype,
    reference_energies,
    graphs,
    config_weights=True,
    num_graphs=None,
    type_weights=None,
):
    """Structures ``group`` (indices into ``structures``) as one batch padded to ``shape`` (nodes,
    edges) and ``num_graphs`` graphs (default: ``len(group)``), on the host: ``(GraphBatch, Labels)``
    of numpy arrays. A padding graph's labels weigh 0 (its ``num_atoms`` is 1, so that its energy
    per atom is 0, not 0 / 0).

    The batches stay in host memory (a dataset's batches can exceed a GPU's); ``fit`` moves each to
    the device as its step comes. ``graphs``: each structure's checked graph
    (:func:`~e3j_models.neighbours._checked_graph`, built once for every epoch's batches).
    ``reference_energies`` (one per element of ``config.atomic_numbers``, or None): subtracted from
    each structure's energy label in float64 before the cast to ``dtype``, so that a float32 label
    keeps the digits of an energy far from zero (all-electron totals: ~1e4 eV per atom).
    ``config_weights``: the labels' weights include the structures' own (:func:`_label_weights`,
    with ``type_weights``); False: 1 for each label present (for metrics)."""
    e0 = None if reference_energies is None else dict(zip(config.atomic_numbers, reference_energies, strict=True))
    n_pad, e_pad = shape
    sts = [structures[k] for k in group]
    num_graphs = len(sts) if num_graphs is None else num_graphs
    index = {z: k for k, z in enumerate(config.atomic_numbers)}
    with jax.default_device(_host_device()):  # built where it stays: not on an accelerator and back
        batch = _assemble([graphs[k] for k in group], index, n_pad, e_pad, 0.0, dtype, num_graphs)
    batch = jax.tree.map(np.asarray, batch)
    energies = np.zeros(num_graphs)  # float64 until the reference energies are out
    num_atoms = np.ones(num_graphs, dtype)
    forces = np.zeros((n_pad, 3), dtype)
    stress = np.zeros((num_graphs, 3, 3), dtype)
    has_stress = np.zeros(num_graphs, bool)
    label_weights = np.zeros((num_graphs, 3), dtype)
    offset = 0
    for j, atoms in enumerate(sts):
        res = _results(atoms)
        num_atoms[j] = len(atoms)
        label_weights[j] = _label_weights(atoms, res, config_weights, type_weights)
        if "energy" in res:
            energies[j] = float(res["energy"]) - (0.0 if e0 is None else sum(e0[int(z)] for z in atoms.numbers))
        if "forces" in res:
            forces[offset : offset + len(atoms)] = res["forces"]
        offset += len(atoms)
        if _has_stress(atoms, res):
            s = np.asarray(res["stress"])
            stress[j] = s if s.shape == (3, 3) else _voigt_to_full(s)
            has_stress[j] = True
    labels = Labels(energies.astype(dtype), num_atoms, forces, stress, has_stress, label_weights)
    return batch, labels


def _prefetched(items: Iterator, depth: int) -> Iterator:
    """``items`` drawn by a background thread, up to ``depth`` ahead: the host builds the next
    batches while the main thread waits for the device's step (a wait that releases the GIL). An
    exception in ``items`` is raised where its item would have come; the thread stops when the
    returned generator is closed or collected."""
    out: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(entry) -> bool:  # False once the consumer has stopped
        while not stop.is_set():
            try:
                out.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((done, None))
        except BaseException as err:  # handed to the consumer, raised there
            put((done, err))

    thread = threading.Thread(target=produce, name="e3j_models-batches", daemon=True)
    thread.start()
    try:
        while True:
            item, err = out.get()
            if err is not None:
                raise err
            if item is done:
                return
            yield item
    finally:
        stop.set()


def _host_device():
    """The CPU device, where the batches are built and kept; None (the default device, the batches
    then copied out) where ``JAX_PLATFORMS`` leaves the CPU backend out."""
    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        return None


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
    return _loss_of(_loss_sums(potential, params, batch, labels, weights), weights)


def _loss_of(sums: Mapping[str, tuple], weights, xp=jnp) -> tuple[Any, dict[str, Any]]:
    """``(loss, parts)`` from :func:`_loss_sums`' terms (``xp=np``: of ``fit``'s float64 sums over an epoch)."""
    parts = {term: total / xp.maximum(count, 1) for term, (total, count) in sums.items()}
    loss = sum(
        w * parts[term] for w, term in zip(weights, ("energy", "forces", "stress"), strict=True) if term in parts
    )
    return loss, parts


def _loss_sums(potential: Potential, params, batch: GraphBatch, labels: Labels, weights) -> dict[str, tuple]:
    """Each term of :func:`loss_fn` as ``(sum of the weighted squared errors, count)``: structures
    for the energy and stress, force components (3 per atom) for the forces; the term is their
    quotient. Summed over batches, they give the loss of all of them as one batch, whatever the
    batches' membership (``fit``'s epoch losses)."""
    stress = weights[2] > 0
    out = potential(params, batch, forces=True, stress=stress)
    per = _per_structure_weights(labels)
    e_err = ((out["energy"] - labels.energy) / labels.num_atoms) ** 2
    sums = {"energy": (jnp.sum(jnp.where(per[:, 0] > 0, per[:, 0] * e_err, 0)), jnp.sum(per[:, 0] > 0))}
    per_atom = jnp.where(batch.node_mask, per[batch.node_graph, 1], 0)[:, None]
    f_err = jnp.where(per_atom > 0, per_atom * (out["forces"] - labels.forces) ** 2, 0)
    sums["forces"] = (jnp.sum(f_err), 3 * jnp.sum(per_atom > 0))
    if stress:
        # structures without a stress label add 0, and so does their gradient: an open structure's
        # predicted stress is NaN, which must not reach the square (where()'s gradient still would)
        has = jnp.broadcast_to(labels.has_stress, labels.energy.shape) & (per[:, 2] > 0)
        predicted = jnp.where(has[:, None, None], out["stress"], labels.stress)
        per_structure = jnp.mean((predicted - labels.stress) ** 2, axis=(1, 2))
        sums["stress"] = (jnp.sum(jnp.where(has, per[:, 2] * per_structure, 0)), jnp.sum(has))
    return sums


def _per_structure_weights(labels: Labels) -> jax.Array:
    """``[G, 3]``: the labels' weights, 1 where they give none."""
    if labels.weights is None:
        return jnp.ones((labels.energy.shape[0], 3), labels.energy.dtype)
    return jnp.asarray(labels.weights)


@functools.partial(jax.jit, static_argnums=0)
def _energy_and_forces(potential: Potential, params, batch):
    # one jitted function for every call: keyed by the potential (its identity) and the batch's
    # shapes, so fit's validation compiles once, not at every eval_every step
    return potential(params, batch, forces=True)


def evaluate(potential: Potential, params, batches) -> dict[str, float]:
    """Mean absolute errors over ``batches``: ``energy_mae_per_atom`` (eV/atom), ``force_mae`` (eV/Å),
    over the structures (atoms) whose labels' weight is > 0; a metric with none is left out.

    Compiles once per potential and batch shape (repeated calls, as ``fit``'s validation makes,
    reuse it)."""
    e_err, f_err, n_graphs, n_comp = 0.0, 0.0, 0, 0
    for batch, labels in batches:
        out = _energy_and_forces(potential, params, batch)
        counted = np.asarray(_per_structure_weights(labels)) > 0
        de = np.abs(np.asarray(out["energy"] - labels.energy) / np.asarray(labels.num_atoms))
        e_err += float(np.sum(de[counted[:, 0]]))
        mask = np.asarray(batch.node_mask) & counted[np.asarray(batch.node_graph), 1]
        f_err += float(np.sum(np.abs(np.asarray(out["forces"] - labels.forces))[mask]))
        n_graphs += int(counted[:, 0].sum())
        n_comp += 3 * int(mask.sum())
    metrics = {}  # a metric without labels is left out (an energy-only validation set has no force MAE)
    if n_graphs:
        metrics["energy_mae_per_atom"] = e_err / n_graphs
    if n_comp:
        metrics["force_mae"] = f_err / n_comp
    return metrics


def _selection_metric(metrics: Mapping[str, float]) -> str:
    """The validation metric that picks the best model: the force MAE, else the energy MAE."""
    return "force_mae" if "force_mae" in metrics else "energy_mae_per_atom"


def evaluate_structures(
    potential: Potential, params: Mapping[str, Any], structures: Sequence, *, batch_size: int = 4, dtype=None
) -> dict[str, float]:
    """Errors of ``potential`` with ``params`` on labelled ``structures`` (a test set, as
    :func:`~e3j_models.data.read_dataset` reads it): ``energy_mae_per_atom`` and
    ``energy_rmse_per_atom`` (eV/atom), ``force_mae`` and ``force_rmse`` (eV/Å, over components),
    ``stress_mae`` and ``stress_rmse`` (eV/Å³, over the components of the structures with a stress
    label on a fully periodic cell; absent without one), and ``structures`` / ``atoms`` counted.
    Energy and force metrics are over the structures that have those labels (absent where none
    has); per-structure weights do not enter.

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
    graphs, _ = _check_training_data(config, structures, (0.0, 0.0, 0.0), dtype=dtype, every_element=False)
    bare = Potential(
        dataclasses.replace(config, atomic_energies=None), potential.backend, factored_radial=potential.factored_radial
    )
    params = _floats_as(params, dtype)
    e_abs = e_sq = f_abs = f_sq = s_abs = s_sq = 0.0
    n_structures = n_atoms = n_energy = n_forces = n_stress = 0
    batches = _batches(
        structures,
        config,
        batch_size,
        None,
        dtype,
        config.atomic_energies,
        graphs=graphs,
        max_shapes=4,
        config_weights=False,
    )
    for batch, labels in batches:
        out = _energy_forces_stress(bare, current_backend_request(), params, batch)
        has = np.asarray(labels.weights) > 0  # which labels each structure has
        de = np.asarray(out["energy"] - labels.energy, np.float64) / np.asarray(labels.num_atoms, np.float64)
        de = de[has[:, 0]]
        real = np.asarray(batch.node_mask)
        labelled = real & has[np.asarray(batch.node_graph), 1]
        df = np.asarray(out["forces"] - labels.forces, np.float64)[labelled]
        ds = np.asarray(out["stress"] - labels.stress, np.float64)[np.asarray(labels.has_stress)]
        e_abs, e_sq = e_abs + np.abs(de).sum(), e_sq + np.square(de).sum()
        f_abs, f_sq = f_abs + np.abs(df).sum(), f_sq + np.square(df).sum()
        s_abs, s_sq = s_abs + np.abs(ds).sum(), s_sq + np.square(ds).sum()
        n_structures, n_atoms = n_structures + has.shape[0], n_atoms + int(real.sum())
        n_energy, n_forces, n_stress = n_energy + de.size, n_forces + df.size, n_stress + ds.size
    metrics = {"structures": n_structures, "atoms": n_atoms}
    if n_energy:
        metrics |= {"energy_mae_per_atom": e_abs / n_energy, "energy_rmse_per_atom": float(np.sqrt(e_sq / n_energy))}
    if n_forces:
        metrics |= {"force_mae": f_abs / n_forces, "force_rmse": float(np.sqrt(f_sq / n_forces))}
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
    potential = Potential(dataclasses.replace(config, atomic_energies=None), backend, factored_radial=factored_radial)
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


#: the history's records of every step, kept in a state file as arrays of these types
_PER_STEP = {"step": np.int64, "train_loss": np.float64, "time": np.float64}


def _run_fingerprint(config, train, valid, params, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """What a resumed run must share with the run whose state it goes on from (as JSON reads it
    back): the config as given, ``arguments`` (``fit``'s that change what is trained), the number of
    training and validation structures, and SHA-256 digests of their atoms, cells, labels, weights
    and config types, and of ``params`` (a fine-tuning run's start; None from scratch)."""
    data = hashlib.sha256()
    for part in (train, valid):
        data.update(f"{len(part)};".encode())
        for atoms in part:
            res = _results(atoms)
            labels = [np.asarray(res[k], np.float64) for k in ("energy", "forces", "stress") if k in res]
            for a in (atoms.positions, atoms.numbers, np.asarray(atoms.cell), atoms.pbc, *labels):
                a = np.ascontiguousarray(a)
                data.update(f"{a.dtype.str}{a.shape};".encode())
                data.update(a.tobytes())
            data.update(repr([k for k in ("energy", "forces", "stress") if k in res]).encode())
            data.update(repr([atoms.info.get(k) for k in WEIGHT_KEYS] + [_config_type(atoms)]).encode())
    start = None
    if params is not None:
        flat: dict[str, np.ndarray] = {}
        _flatten(jax.device_get(params), "", flat)
        digest = hashlib.sha256()
        for name in sorted(flat):
            digest.update(f"{name}:{flat[name].dtype.str}{flat[name].shape};".encode())
            digest.update(np.ascontiguousarray(flat[name]).tobytes())
        start = digest.hexdigest()
    run = {
        "config": config_to_dict(config),
        **arguments,
        "train_structures": len(train),
        "valid_structures": len(valid),
        "data_sha256": data.hexdigest(),
        "params_sha256": start,
    }
    return json.loads(json.dumps(run))  # tuples as lists, as a state file holds them


def _resumed_state(path: str, run: Mapping[str, Any], flags: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The training state at ``path`` (:mod:`~e3j_models._train_state`), refused naming what
    differs when it is another run's (``run``: :func:`_run_fingerprint` of this call; ``flags``:
    see :func:`_differences`)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"state {path!r} does not exist: nothing to resume (resume=False starts the run)")
    header, params, opt_leaves, extra = load_state(path)
    theirs = header.get("run")
    if not isinstance(theirs, dict):
        raise ValueError(f"state {path!r} is malformed: its header has no 'run' object")
    differ = _differences(theirs, run, flags)
    if differ:
        raise ValueError(
            f"state {path!r} is of another run: {'; '.join(differ)} (resume with the arguments and data of the run "
            "that wrote it, or start anew)"
        )

    def tree(prefix: str):
        return _nest({n[len(prefix) :]: a for n, a in extra.items() if n.startswith(prefix)})

    try:
        return {
            "step": int(header["step"]),
            "history": {**header["history"], **{k: extra[f"history/{k}"].tolist() for k in _PER_STEP}},
            "best": np.inf if header["best"] is None else float(header["best"]),
            "elapsed": float(header["elapsed"]),
            "params": params,
            "opt_leaves": opt_leaves,
            "epoch_sums": {t: extra[f"epoch_sums/{t}"] for t in header["epoch_terms"]},
            "counted": extra["counted"],
            "ema": tree("ema/"),
            "best_params": tree("best/") or None,
        }
    except (KeyError, TypeError, ValueError) as err:  # a header or entry fit did not write
        raise ValueError(f"state {path!r} is malformed: {type(err).__name__} {err}") from None


def _differences(
    theirs: Mapping[str, Any], ours: Mapping[str, Any], flags: Mapping[str, str] | None = None
) -> list[str]:
    """What differs between two :func:`_run_fingerprint`, each with the state's value and this
    call's (the config field by field; the data and the fine-tuning start by digest). ``flags``
    (the command line's) maps a key (``"steps"``, ``"config.num_channels"``) to the flags that set
    it, named after it: ``steps (--steps): 5 there, 6 here``."""
    hashed = {"data_sha256": "the training or validation data", "params_sha256": "params (fine-tuning's start)"}
    flags = flags or {}

    def named(key: str) -> str:
        return f"{key} ({flags[key]})" if key in flags else key

    out = []
    for key in sorted(set(theirs) | set(ours)):
        a, b = theirs.get(key), ours.get(key)
        if a == b:
            continue
        if key in hashed:
            out.append(f"{hashed[key]}{f' ({flags[key]})' if key in flags else ''} differ")
        elif key == "config" and isinstance(a, dict) and isinstance(b, dict):
            out += [
                f"{named(f'config.{f}')}: {a.get(f)!r} there, {b.get(f)!r} here"
                for f in sorted(set(a) | set(b))
                if a.get(f) != b.get(f)
            ]
        else:
            out.append(f"{named(key)}: {a!r} there, {b!r} here")
    return out


def _restored_leaves(template, leaves: Sequence[np.ndarray], path: str):
    """``template`` (a pytree: the optimizer's fresh state) with ``leaves`` in its place, which must
    match it leaf for leaf in shape and dtype."""
    want, tree = jax.tree.flatten(template)
    if len(leaves) != len(want) or any(
        np.shape(a) != np.shape(b) or np.asarray(a).dtype != np.asarray(b).dtype for a, b in zip(leaves, want)
    ):
        raise ValueError(f"state {path!r} holds an optimizer state that does not match this run's optimizer")
    return jax.tree.unflatten(tree, [jnp.asarray(a) for a in leaves])


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


def epoch_losses(history: dict[str, Any], steps_per_epoch: int | None = None) -> np.ndarray:
    """The smoothed loss curve: the training loss of each complete epoch, ``[num_epochs]``.

    An epoch visits every training structure once, so its loss is free of the spread between easy
    and hard batches that makes the per-step loss (and any moving average shorter than an epoch)
    jump. :func:`fit` records it (``history["epoch_loss"]``) as the loss of the epoch's batches
    taken as one batch (each term's squared errors summed over the epoch, divided by its count of
    structures or force components), which the batches' membership, drawn anew every epoch, does
    not change; a mean of the per-step losses weighs each structure by its batch's size. Without
    that record (histories of earlier versions), or with ``steps_per_epoch`` given, it is the mean
    of the per-step losses of each epoch (``steps_per_epoch`` defaulting to the one :func:`fit`
    records).

    >>> epoch_losses({"train_loss": [4.0, 2.0, 3.0, 1.0, 9.0], "steps_per_epoch": 2}).tolist()
    [3.0, 2.0]
    """
    if steps_per_epoch is None and history.get("epoch_loss") is not None:
        return np.asarray(history["epoch_loss"], np.float64)
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
        axes[0].semilogy(k * np.arange(1, len(epochs) + 1) - 1, epochs, "o-", ms=3, label="epoch loss")
    axes[0].set_xlabel("step")
    axes[0].legend()
    if history["valid"]:
        steps = history["eval_step"]
        forces = [v.get("force_mae", np.nan) for v in history["valid"]]  # absent without force labels
        axes[1].semilogy(steps, forces, "o-", label="force MAE (eV/Å)")
        axes[1].semilogy(
            steps, [v.get("energy_mae_per_atom", np.nan) for v in history["valid"]], "s-", label="energy MAE (eV/atom)"
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
