"""The model input: many structures in one static-shape graph (a pytree).

Nodes of all structures are concatenated (``node_graph`` says whose), padding nodes are flagged by
``node_mask`` and padding edges by the :class:`e3j.Graph`'s ``edge_mask``. The edge ``e`` points from
``senders[e]`` to ``receivers[e]`` with vector
``positions[senders] - positions[receivers] + shifts[e] @ cell[node_graph[receivers[e]]]`` (``shifts``
integer cell images, as floats; cell rows are the lattice vectors, zeros for a structure without a
cell; an open structure's box is kept, its shifts zero).
:func:`e3j_models.neighbours.batch_structures` builds one from atoms; :func:`make_batch` from arrays.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from e3j import Graph

from ._checks import check_positive_int, zero_length_edges

__all__ = ["GraphBatch", "edge_vectors", "make_batch"]


class GraphBatch(NamedTuple):
    """``positions [N, 3]``, ``species int32 [N]`` (model species index), ``graph`` (``E`` edges),
    ``shifts [E, 3]``, ``cell [G, 3, 3]``, ``node_graph int32 [N]`` (in ``[0, G)``), ``node_mask bool [N]``."""

    positions: jax.Array
    species: jax.Array
    graph: Graph
    shifts: jax.Array
    cell: jax.Array
    node_graph: jax.Array
    node_mask: jax.Array

    @property
    def num_graphs(self) -> int:
        """Structures in the batch, padding graphs included (the leading axis of ``cell``)."""
        return int(self.cell.shape[0])


class Labels(NamedTuple):
    """Reference values padded like the batch: ``energy [G]``, ``num_atoms [G]``, ``forces [N, 3]``,
    ``stress [G, 3, 3]`` (ASE sign, eV/Å³), ``has_stress`` (bool ``[G]``: which structures' stress is a
    label; a scalar applies to all), ``weights`` (``[G, 3]``: each structure's weight of its energy,
    forces and stress terms in the loss, 0 for a label it lacks; ``None``: all 1)."""

    energy: jax.Array
    num_atoms: jax.Array
    forces: jax.Array
    stress: jax.Array
    has_stress: jax.Array
    weights: jax.Array | None = None


# jax.export serializes a function's argument and result trees by name: a deployed potential takes a
# GraphBatch, an exported training step its Labels too (registered here, on `import e3j_models`)
jax.export.register_namedtuple_serialization(GraphBatch, serialized_name="e3j_models.GraphBatch")
jax.export.register_namedtuple_serialization(Labels, serialized_name="e3j_models.Labels")


def make_batch(
    positions: ArrayLike,
    species: ArrayLike,
    senders: ArrayLike,
    receivers: ArrayLike,
    *,
    shifts: ArrayLike | None = None,
    cell: ArrayLike | None = None,
    node_graph: ArrayLike | None = None,
    node_mask: ArrayLike | None = None,
    edge_mask: ArrayLike | None = None,
    num_graphs: int | None = None,
) -> GraphBatch:
    """A :class:`GraphBatch` from host arrays (one open structure by default), checked.

    >>> import numpy as np
    >>> b = make_batch(np.array([[0.0, 0, 0], [1.5, 0, 0]]), [0, 0], [0, 1], [1, 0])
    >>> b.num_graphs, b.graph.num_edges, b.cell.shape
    (1, 2, (1, 3, 3))
    """
    positions = np.asarray(positions)
    if not np.issubdtype(positions.dtype, np.floating):
        raise TypeError(f"positions must be a float [N, 3] array, got dtype {positions.dtype}")
    if positions.ndim != 2 or positions.shape[1] != 3:
        raise ValueError(f"positions must be a float [N, 3] array, got shape {positions.shape}")
    n = positions.shape[0]
    species = _host_indices("species", species)
    if species.shape != (n,):
        raise ValueError(f"species must be an int [N={n}] array, got {species.dtype} {species.shape}")
    if (species < 0).any():
        raise ValueError(f"species must be model species indices >= 0, got {species.min()}")
    senders, receivers = _host_indices("senders", senders), _host_indices("receivers", receivers)
    e = senders.shape[0]
    node_graph = np.zeros(n, np.int32) if node_graph is None else _host_indices("node_graph", node_graph)
    if node_graph.shape != (n,):
        raise ValueError(f"node_graph must be int [N={n}], got {node_graph.shape}")
    if num_graphs is not None:
        num_graphs = check_positive_int("num_graphs", num_graphs)
    if num_graphs is None:
        num_graphs = (
            int(node_graph.max(initial=0)) + 1 if cell is None else int(np.shape(cell)[0]) if np.ndim(cell) == 3 else 1
        )
    if n and (node_graph.min() < 0 or node_graph.max() >= num_graphs):
        raise ValueError(f"node_graph must be in [0, num_graphs={num_graphs}), got values in "
                         f"[{node_graph.min()}, {node_graph.max()}]")  # fmt: skip
    cell = np.zeros((num_graphs, 3, 3), positions.dtype) if cell is None else np.asarray(cell, positions.dtype)
    if cell.ndim == 2:
        cell = cell[None]
    if cell.shape != (num_graphs, 3, 3):
        raise ValueError(f"cell must be [G={num_graphs}, 3, 3] (or [3, 3] for one structure), got {cell.shape}")
    shifts = np.zeros((e, 3), positions.dtype) if shifts is None else np.asarray(shifts, positions.dtype)
    if shifts.shape != (e, 3):
        raise ValueError(f"shifts must be [E={e}, 3], got {shifts.shape}")
    # Cartesian offsets (other codes' `shifts`, unit shifts @ cell) would move every image edge
    # beyond the cutoff without a word: the model would drop those neighbours
    fractional = np.flatnonzero((np.isfinite(shifts) & (shifts != np.round(shifts))).any(axis=1))
    if fractional.size:
        k = int(fractional[0])
        raise ValueError(
            f"shifts must be integer cell images (the edge's offset is shifts @ cell), got {shifts[k].tolist()} "
            f"for edge {k}: for Cartesian offsets, give their coordinates in the cell (offsets @ inv(cell))"
        )
    node_mask = np.ones(n, bool) if node_mask is None else np.asarray(node_mask)
    if node_mask.size == 0:  # [] is float64 to numpy
        node_mask = node_mask.astype(bool)
    if node_mask.dtype != bool:  # a cast would take 0.5 and "False" for True
        raise TypeError(f"node_mask must be bool [N={n}], got dtype {node_mask.dtype}")
    if node_mask.shape != (n,):
        raise ValueError(f"node_mask must be bool [N={n}], got {node_mask.shape}")
    graph = Graph.from_edges(senders, receivers, n, edge_mask=None if edge_mask is None else np.asarray(edge_mask))
    _check_consistent(positions, cell, shifts, senders, receivers, edge_mask, node_mask, node_graph)
    return GraphBatch(
        jnp.asarray(positions),
        jnp.asarray(species, jnp.int32),
        graph,
        jnp.asarray(shifts),
        jnp.asarray(cell),
        jnp.asarray(node_graph, jnp.int32),
        jnp.asarray(node_mask),
    )


def edge_vectors(positions: jax.Array, cell: jax.Array, batch: GraphBatch) -> jax.Array:
    """``[E, 3]`` edge vectors (sender minus receiver plus the cell image); padding edges are unit x."""
    g = batch.graph
    offset = jnp.einsum("ei,eij->ej", batch.shifts.astype(positions.dtype), cell[batch.node_graph[g.receivers]])
    vectors = positions[g.senders] - positions[g.receivers] + offset
    unit = jnp.zeros_like(vectors).at[:, 0].set(1)
    return jnp.where(g.edge_mask[:, None], vectors, unit)


def _host_indices(name: str, a) -> np.ndarray:
    """``a`` as a host int64 array; floats are refused (a cast would truncate them silently)."""
    a = np.asarray(a)
    if a.size == 0 and not np.issubdtype(a.dtype, np.integer):
        return a.astype(np.int64)  # np.asarray([]) is float64: an empty list of indices is fine
    if not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name} must be an int array, got {a.dtype} {a.shape}")
    return a.astype(np.int64)


def _check_consistent(positions, cell, shifts, senders, receivers, edge_mask, node_mask, node_graph) -> None:
    """What a model cannot mask out: a non-finite coordinate (NaN energies and gradients, even on a
    padding node, whose energy is dropped by a ``where``), and a real edge that reads a padding node
    (it changes the structure's energy while that node's force is reported 0), joins two
    structures of the batch or has length 0. ``Graph.from_edges`` has checked the indices' range."""
    for name, a in (("positions", positions), ("cell", cell), ("shifts", shifts)):
        if not np.isfinite(a).all():
            raise ValueError(f"{name} must be finite, got {np.size(a) - np.isfinite(a).sum()} non-finite values")
    real = np.ones(senders.shape, bool) if edge_mask is None else np.asarray(edge_mask, bool)
    s, r = senders[real], receivers[real]
    bad = ~node_mask[s] | ~node_mask[r]
    if bad.any():
        k = int(np.flatnonzero(real)[np.argmax(bad)])
        raise ValueError(
            f"edge {k} ({senders[k]} -> {receivers[k]}) is real (edge_mask) but joins a padding node (node_mask "
            "False): mask the edge out too"
        )
    across = node_graph[s] != node_graph[r]
    if across.any():
        k = int(np.flatnonzero(real)[np.argmax(across)])
        raise ValueError(
            f"edge {k} ({senders[k]} -> {receivers[k]}) joins structures {node_graph[senders[k]]} and "
            f"{node_graph[receivers[k]]} of the batch (node_graph): an edge stays inside one structure"
        )
    # as edge_vectors computes them, in the given dtype and in the one the batch stores (float32
    # without jax_enable_x64)
    dtypes = (positions.dtype, jnp.asarray(positions[:0]).dtype)
    zero = zero_length_edges(positions, s, r, shifts[real], cell[node_graph[r]], dtypes)
    if zero.size:
        k = int(np.flatnonzero(real)[zero[0]])
        raise ValueError(
            f"edge {k} ({senders[k]} -> {receivers[k]}) is real (edge_mask) but has length 0 (positions, shifts, "
            "cell): coincident atoms; positions must be distinct, or mask the edge out"
        )
