"""``fit``'s batches: the structures cut into batches, each padded to one of a few node/edge
sizes chosen to pad the least, built on the host and handed over by a background thread (see
:mod:`e3j_models.train`'s docstring for the rules)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping, Sequence

import jax
import numpy as np

from ._training_data import _has_stress, _label_weights, _results
from .batch import Labels
from .neighbours import _assemble, _checked_graph, bucket_size
from .potential import _reference_energy


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
            e0 = _reference_energy(config.atomic_numbers, reference_energies, atoms.numbers)
            energies[j] = float(res["energy"]) - e0
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


def _voigt_to_full(s):
    xx, yy, zz, yz, xz, xy = s
    return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
