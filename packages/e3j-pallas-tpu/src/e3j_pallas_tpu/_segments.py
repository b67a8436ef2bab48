"""ReduceFlush (paper Algorithm 6): segmented sums of edge tiles into sorted node rows.

Edges arrive sorted by the key node (receiver in the forward, sender for ``dx`` in the backward), so
each node's edges are one contiguous run, possibly straddling tiles. The state — an ``[8, D, Cq]``
accumulator and the ``current`` node in SMEM — persists across the grid's sequential edge-tile axis.
A tile of ``B`` rows is walked 8 edges (one sublane group) at a time: a chunk whose 8 keys all equal
``current`` is added whole (the common case); a chunk that crosses a boundary is walked edge by edge,
flushing the finished node. A flush sums the 8 partial rows and DMAs the node's ``[D, Cq]`` row to
HBM; nodes with no edges between two flushed ones get a zero row, so every node row is written
exactly once and the output needs no initialization. Keys equal to ``num_nodes`` mark padding:
reaching them flushes everything, and what follows is never written.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

CHUNK = 8  # sublanes


class ReduceFlush:
    """Segmented-sum state and its operations inside one kernel invocation.

    ``acc_ref [8, D, Cq]``, ``stage_ref``/``zero_ref [D, Cq]`` (VMEM), ``current_ref`` int32 ``[1]``
    (SMEM); ``out_hbm`` is the ``[N, D, C]`` output in HBM and ``lanes`` its channel slice.
    """

    def __init__(self, acc_ref, stage_ref, zero_ref, current_ref, out_hbm, lanes, num_nodes: int):
        self.acc, self.stage, self.zero, self.current = acc_ref, stage_ref, zero_ref, current_ref
        self.out, self.lanes, self.num_nodes = out_hbm, lanes, num_nodes

    def reset(self) -> None:
        self.acc[...] = jnp.zeros(self.acc.shape, self.acc.dtype)
        self.zero[...] = jnp.zeros(self.zero.shape, self.zero.dtype)
        self.current[0] = -1

    def _flush(self, node) -> None:
        self.stage[...] = jnp.sum(self.acc[...], axis=0)
        pltpu.sync_copy(self.stage, self.out.at[node, :, self.lanes])
        self.acc[...] = jnp.zeros(self.acc.shape, self.acc.dtype)

    def advance(self, new) -> None:
        """Finish ``current`` (flush it) and zero-fill the nodes strictly between it and ``new``."""
        cur = self.current[0]

        @pl.when((cur >= 0) & (cur < self.num_nodes))
        def _():
            self._flush(cur)

        def fill(node, carry):
            pltpu.sync_copy(self.zero, self.out.at[node, :, self.lanes])
            return carry

        jax.lax.fori_loop(cur + 1, jnp.minimum(new, self.num_nodes).astype(jnp.int32), fill, jnp.int32(0))
        self.current[0] = new

    def finish(self) -> None:
        """After the last tile: flush the last node and zero-fill the rest."""
        self.advance(jnp.int32(self.num_nodes))

    def add_tile(self, tile_ref, keys_ref, first: int | jax.Array, rows: int) -> None:
        """Reduce ``tile_ref [rows, D, Cq]`` whose edge ``j`` has key ``keys_ref[first + j]``."""
        iota = jax.lax.broadcasted_iota(jnp.int32, (CHUNK, 1, 1), 0)

        def chunk(ci, carry):
            base = first + ci * CHUNK
            block = tile_ref[pl.ds(ci * CHUNK, CHUNK)]
            k0, k7 = keys_ref[base], keys_ref[base + CHUNK - 1]
            uniform = (k0 == self.current[0]) & (k7 == k0)

            @pl.when(uniform)
            def _():
                self.acc[...] += block

            @pl.when(jnp.logical_not(uniform))
            def _():
                for j in range(CHUNK):
                    key = keys_ref[base + j]

                    @pl.when(key != self.current[0])
                    def _(key=key):
                        self.advance(key)

                    self.acc[...] += jnp.where(iota == j, block, jnp.zeros_like(block))

            return carry

        jax.lax.fori_loop(jnp.int32(0), jnp.int32(rows // CHUNK), chunk, jnp.int32(0))
