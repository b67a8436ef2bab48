"""Graphs for message passing: receiver-sorted CSR with padding edges flagged.

A :class:`Graph` keeps the edges in the caller's order (edge arrays ``y``, ``s`` are indexed by the
original edge id) and adds the orders kernels traverse: ``order`` lists edge ids sorted by receiver
(the forward's receiver-stationary CSR), ``sender_order`` by sender (backward passes); padding edges
come last in both and are counted out by ``num_valid``, so kernels skip them entirely.

>>> import numpy as np
>>> g = Graph.from_edges(np.array([0, 1, 2, 0]), np.array([1, 0, 1, 2]), num_nodes=3,
...                      edge_mask=np.array([True, True, True, False]))
>>> g.order.tolist(), g.receiver_offsets.tolist(), int(g.num_valid)
([1, 0, 2, 3], [0, 1, 3, 3], 3)
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify
from jax.typing import ArrayLike

from ._checks import STATIC, check_edges_in_range, check_index_count, check_int, edge_arrays, static_size

__all__ = ["Graph"]


class Graph(NamedTuple):
    """Edges ``senders[e] → receivers[e]`` on ``num_nodes`` nodes, with CSR orders (a pytree).

    Attributes (all ``int32`` except ``edge_mask``):
        senders, receivers: ``[E]``, in the caller's edge order; padding edges are set to node 0.
        edge_mask: ``bool [E]``, False for padding edges.
        order: ``[E]`` edge ids sorted by receiver (stable), padding last.
        receiver_offsets: ``[N + 1]``: edges into node ``b`` are ``order[offsets[b]:offsets[b+1]]``.
        sender_order: ``[E]`` edge ids sorted by sender (stable), padding last.
        sender_offsets: ``[N + 1]``, the CSR offsets of ``sender_order``.
        num_valid: ``[]``, the number of non-padding edges.
    """

    senders: jax.Array
    receivers: jax.Array
    edge_mask: jax.Array
    order: jax.Array
    receiver_offsets: jax.Array
    sender_order: jax.Array
    sender_offsets: jax.Array
    num_valid: jax.Array

    @property
    def num_nodes(self) -> int:
        """``N``, static (``ValueError`` for a symbolic size)."""
        return static_size(self.receiver_offsets.shape[0], "graph: receiver_offsets [N + 1]") - 1

    @property
    def num_edges(self) -> int:
        """``E``, static (``ValueError`` for a symbolic size)."""
        return static_size(self.senders.shape[0], "graph: senders [E]")

    @classmethod
    def from_edges(
        cls,
        senders: ArrayLike,
        receivers: ArrayLike,
        num_nodes: int,
        edge_mask: ArrayLike | None = None,
        *,
        check_indices: bool = False,
    ) -> Graph:
        """Build the CSR orders on the host (numpy input) or inside ``jit`` (traced input).

        Args:
            senders, receivers: integer ``[E]`` node indices.
            num_nodes: static node count ``N``.
            edge_mask: optional ``bool [E]``; False marks padding edges (their indices may be
                anything, e.g. a padding node ``N``).
            check_indices: under ``jit``, emit ``checkify`` checks that every non-padding index is in
                ``[0, N)`` (wrap the function with ``jax.experimental.checkify.checkify``). On host
                input the check always runs and raises ``ValueError``. Without it, out-of-range
                edges under ``jit`` are treated as padding, so they can never touch memory.
        """
        num_nodes = check_int("num_nodes", num_nodes, 0, STATIC)
        check_index_count("num_nodes", num_nodes, "nodes")
        traced = any(isinstance(a, jax.core.Tracer) for a in (senders, receivers, edge_mask))
        xp = jnp if traced else np
        senders, receivers, mask = edge_arrays(xp, senders, receivers, edge_mask)
        # before the CSR sort, which would fail on a symbolic size with JAX's message, naming nothing
        static_size(senders.shape[0], "graph: senders [E]")
        in_range = (senders >= 0) & (senders < num_nodes) & (receivers >= 0) & (receivers < num_nodes)
        if not traced:
            check_edges_in_range(senders, receivers, mask, num_nodes)
        elif check_indices:
            checkify.check(jnp.all(in_range | ~mask), "senders/receivers out of range [0, num_nodes)")
        mask = mask & in_range
        senders = xp.where(mask, senders, 0).astype(xp.int32)
        receivers = xp.where(mask, receivers, 0).astype(xp.int32)
        order, receiver_offsets = _csr(xp, receivers, mask, num_nodes)
        sender_order, sender_offsets = _csr(xp, senders, mask, num_nodes)
        arrays = (
            senders,
            receivers,
            mask,
            order,
            receiver_offsets,
            sender_order,
            sender_offsets,
            xp.sum(mask).astype(xp.int32),
        )
        return cls(*(jnp.asarray(a) for a in arrays))


# jax.export serializes a function's argument and result trees: a Graph argument must be known by name
jax.export.register_namedtuple_serialization(Graph, serialized_name="e3j.Graph")


def check_graph(graph) -> Graph:
    """``graph``, a :class:`Graph` (``TypeError`` naming the argument otherwise)."""
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be an e3j.Graph (see Graph.from_edges), got {type(graph).__name__}")
    return graph


def _csr(xp, index, mask, num_nodes):
    key = xp.where(mask, index, num_nodes)
    order = xp.argsort(key, stable=True).astype(xp.int32)
    offsets = xp.searchsorted(key[order], xp.arange(num_nodes + 1), side="left").astype(xp.int32)
    return order, offsets
