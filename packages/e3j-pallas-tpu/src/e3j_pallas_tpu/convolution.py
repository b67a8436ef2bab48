"""Pallas TPU fused message-passing convolution (paper Algorithms 4–7).

``m_b = Σ_{a→b} s_ab · (x_a ⊗ y_ab)``: ``x [N, Dx, C]``, ``y [E, Dy]`` or ``[E, Dy, C]``,
``s [E, P, C]`` → ``m [N, Dout, C]``.

Forward (Algorithm 4): the grid walks channel blocks × tiles of ``B`` receiver-ordered edges. The
tile's edge ids, senders and receivers are read from SMEM (the graph's scalar-prefetched whole, or
past :data:`PREFETCH_SMEM_BYTES` each tile's copied there first); the sender rows ``x_a`` and
the edge rows ``y_ab``, ``s_ab`` are gathered from HBM into VMEM by DMA; MessageTile (Algorithm 5)
evaluates ``s[i3(i0)] · Σ c x[i1] y[i2]`` with the edge scalar factored out of each row's record
sum; ReduceFlush (Algorithm 6, :mod:`._segments`) sums the tile into receivers with its state carried
across tiles, writing every node row once. Tiles past the last valid edge do nothing, so padding
edges cost nothing.

Backward (Algorithm 7): the same schedule over *sender*-ordered edge tiles, gathering ``x_a``,
``dm_b``, ``y_ab``, ``s_ab``; one sweep computes the ``dx`` tile (reduced by ReduceFlush keyed on
senders — no atomics, correct for any directed graph), and the edge-local ``dy`` (summed over the
channel block when ``y`` is broadcast; blocks are added after the kernel) and ``ds``, written per
edge by DMA. Padding edges get zero ``dy``/``ds`` rows.

Tables up to :data:`~e3j_pallas_tpu.backend.UNROLL_RECORDS` records are unrolled at trace time
(:func:`convolution_kernel`, :func:`convolution_bwd_kernel`); larger ones are walked from SMEM
(:func:`convolution_walk_kernel`, :func:`convolution_bwd_walk_kernel`, :mod:`._records`): the
bilinear table with ``s[i3(i0)]`` per row forward, the trilinear table's transposes backward.

Channel blocks are 128 lanes, or all channels when the count is not a multiple of 128 (see
:mod:`.vmem` for the cost). The edge tile is the largest whose buffers fit the VMEM budget.

Mixed multiplicities (:func:`grouped_convolution`, :func:`grouped_convolution_bwd`): one launch per
group of an ``e3j`` plan, the weights read where e3nn puts them: ``s [E, num_weights]``, path ``p``'s
``C`` weights at columns ``cols[p] ..``, one DMA per path window into the same ``[B, P, Cq]`` tile;
each group's ``ds`` windows are written back into one ``[E, num_weights]`` buffer aliased from
launch to launch. Only the node-sized features and outputs are split and joined around the launches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from e3j_core import CooTable, TensorProductCoo

from . import vmem
from ._records import from_rows, records, smem_bytes, to_rows, unrolls, walk_rows
from ._rows import result_type, x32
from ._segments import ReduceFlush

__all__ = [
    "convolution",
    "convolution_bwd",
    "convolution_bwd_kernel",
    "convolution_bwd_walk_kernel",
    "convolution_kernel",
    "convolution_walk_kernel",
    "grouped_convolution",
    "grouped_convolution_bwd",
]


# -- kernels ------------------------------------------------------------------------------------


def _row_loader(buf, channels: bool):
    if channels:
        return functools.cache(lambda i: buf[:, i, :])
    return functools.cache(lambda i: buf[:, i][:, None])


def _weight_copies(src_hbm, dst_tile, e, j, lanes, cols, sem, *, to_hbm: bool = False) -> tuple:
    """Edge ``e``'s weights (``[P, Cq]``, slot ``j`` of the tile) to or from HBM: one DMA of
    ``[E, P, C]``'s row when ``cols`` is ``None``, else one per path window of a 2-D ``[E, W]`` (path
    ``p`` at columns ``cols[p] ..``)."""
    if cols is None:
        pairs = [(src_hbm.at[e, :, lanes], dst_tile.at[j])]
    else:
        pairs = [(src_hbm.at[e, pl.ds(col + lanes.start, lanes.size)], dst_tile.at[j, p]) for p, col in enumerate(cols)]
    return tuple(pltpu.make_async_copy(t, h, sem) if to_hbm else pltpu.make_async_copy(h, t, sem) for h, t in pairs)


def _gather(copies, count) -> None:
    """Start ``copies(j)`` for ``j < count``, then wait for all of them (they overlap)."""

    def start(j, carry):
        for cp in copies(j):
            cp.start()
        return carry

    def wait(j, carry):
        for cp in copies(j):
            cp.wait()
        return carry

    # int32 indices throughout: Mosaic has no 64-bit scalars (jax_enable_x64 must not leak in)
    count = jnp.asarray(count, jnp.int32)
    jax.lax.fori_loop(jnp.int32(0), count, start, jnp.int32(0))
    jax.lax.fori_loop(jnp.int32(0), count, wait, jnp.int32(0))


def _message_tiles(
    order_ref, senders_ref, receivers_ref, num_valid_ref, x_hbm, y_hbm, s_hbm, m_hbm,
    x_tile, y_tile, s_tile, m_tile, acc, stage, zero_row, current, sem, *, messages: Callable[[], None],
    cols: tuple | None,
) -> None:  # fmt: skip
    """Algorithm 4's schedule: gather the tile's rows, ``messages()`` fills ``m_tile``, ReduceFlush
    (``cols``: :func:`_weight_copies`)."""
    c, t, tiles = pl.program_id(0), pl.program_id(1), pl.num_programs(1)
    edges, _, cq = x_tile.shape
    lanes = pl.ds(c * cq, cq)
    reduce = ReduceFlush(acc, stage, zero_row, current, m_hbm, lanes, m_hbm.shape[0])
    first = t * edges

    @pl.when(t == 0)
    def _():
        reduce.reset()

    @pl.when(first < num_valid_ref[0])
    def _():
        def copies(j):
            e, a = order_ref[first + j], senders_ref[first + j]
            y_src = y_hbm.at[e, :, lanes] if len(y_tile.shape) == 3 else y_hbm.at[e]
            return (
                pltpu.make_async_copy(x_hbm.at[a, :, lanes], x_tile.at[j], sem.at[0]),
                pltpu.make_async_copy(y_src, y_tile.at[j], sem.at[1]),
                *_weight_copies(s_hbm, s_tile, e, j, lanes, cols, sem.at[2]),
            )

        _gather(copies, edges)
        messages()
        reduce.add_tile(m_tile, receivers_ref, first, edges)

    @pl.when(t == tiles - 1)
    def _():
        reduce.finish()


def convolution_kernel(
    order_ref, senders_ref, receivers_ref, num_valid_ref, x_hbm, y_hbm, s_hbm, m_hbm,
    x_tile, y_tile, s_tile, m_tile, acc, stage, zero_row, current, sem,
    *, table: CooTable, i3: tuple, y_channels: bool, cols: tuple | None = None,
) -> None:  # fmt: skip
    """One edge tile of the forward, records unrolled.

    SMEM: ``order_ref``, ``senders_ref``, ``receivers_ref`` per edge slot of the receiver-sorted
    order (padding slots: receiver ``N``; scalar-prefetched, or the tile's copy: :func:`_slots_by_tile`)
    and ``num_valid_ref [1]``. HBM: ``x_hbm``,
    ``y_hbm``, ``s_hbm``, ``m_hbm``. VMEM scratch: the gathered ``x_tile [B, Dx, Cq]``, ``y_tile``,
    ``s_tile``, the messages ``m_tile [B, Dout, Cq]`` and ReduceFlush's state (:mod:`._segments`).
    ``s_hbm`` is ``[E, P, C]``, or with ``cols`` ``[E, W]`` with path ``p`` at columns ``cols[p] ..``.
    """

    def messages():
        z = table.contract(_row_loader(x_tile, True), _row_loader(y_tile, y_channels))
        s_row = _row_loader(s_tile, True)
        edges, _, cq = m_tile.shape
        for i0 in range(m_tile.shape[1]):
            m_tile[:, i0, :] = s_row(i3[i0]) * z[i0] if i0 in z else jnp.zeros((edges, cq), m_tile.dtype)

    _message_tiles(
        order_ref, senders_ref, receivers_ref, num_valid_ref, x_hbm, y_hbm, s_hbm, m_hbm,
        x_tile, y_tile, s_tile, m_tile, acc, stage, zero_row, current, sem, messages=messages, cols=cols,
    )  # fmt: skip


def convolution_walk_kernel(
    order_ref, senders_ref, receivers_ref, num_valid_ref, table_refs, i3_ref, x_hbm, y_hbm, s_hbm, m_hbm,
    x_tile, y_tile, s_tile, m_tile, acc, stage, zero_row, current, sem, x_rows, y_rows, s_rows, m_rows,
    *, y_channels: bool, cols: tuple | None = None,
) -> None:  # fmt: skip
    """:func:`convolution_kernel` walking ``coo.table``'s records (``table_refs``, and ``i3_ref [Dout]``)
    from SMEM; ``x_rows``, ``y_rows``, ``s_rows``, ``m_rows`` are ``[D, B, Cq]`` VMEM scratch."""

    def messages():
        to_rows(x_tile, x_rows)
        to_rows(y_tile, y_rows, channels=y_channels)
        to_rows(s_tile, s_rows)
        walk_rows(table_refs, (x_rows, y_rows), m_rows, row_scale=lambda i0: s_rows[i3_ref[i0]])
        from_rows(m_rows, m_tile)

    _message_tiles(
        order_ref, senders_ref, receivers_ref, num_valid_ref, x_hbm, y_hbm, s_hbm, m_hbm,
        x_tile, y_tile, s_tile, m_tile, acc, stage, zero_row, current, sem, messages=messages, cols=cols,
    )  # fmt: skip


def _cotangent_tiles(
    order_ref, senders_ref, receivers_ref, num_valid_ref, x_hbm, y_hbm, s_hbm, dm_hbm, dx_hbm, dy_hbm, ds_hbm,
    x_tile, y_tile, s_tile, dm_tile, dx_tile, acc, stage, zero_row, current, dy_tile, ds_tile, sem,
    *, cotangents: Callable, cols: tuple | None,
) -> None:  # fmt: skip
    """Algorithm 7's schedule: gather the tile's rows, ``cotangents(valid)`` fills ``dx_tile``,
    ``dy_tile`` and ``ds_tile`` (rows of slots where ``valid [B, 1]`` is false zeroed), ReduceFlush
    of ``dx``, and one DMA per edge slot of its ``dy`` rows, and of its ``ds`` rows or (``cols``)
    path windows (:func:`_weight_copies`)."""
    c, t, tiles = pl.program_id(0), pl.program_id(1), pl.num_programs(1)
    edges, _, cq = dm_tile.shape
    num_nodes = dm_hbm.shape[0]
    lanes = pl.ds(c * cq, cq)
    first = t * edges
    if dx_hbm is not None:
        reduce = ReduceFlush(acc, stage, zero_row, current, dx_hbm, lanes, num_nodes)

        @pl.when(t == 0)
        def _():
            reduce.reset()

    @pl.when(first < num_valid_ref[0])
    def _():
        def copies(j):
            e, b = order_ref[first + j], receivers_ref[first + j]
            a = jnp.minimum(senders_ref[first + j], num_nodes - 1)  # padding slots: any valid row
            cps = [pltpu.make_async_copy(dm_hbm.at[b, :, lanes], dm_tile.at[j], sem.at[0])]
            if x_hbm is not None:
                cps.append(pltpu.make_async_copy(x_hbm.at[a, :, lanes], x_tile.at[j], sem.at[1]))
            if y_hbm is not None:
                src = y_hbm.at[e, :, lanes] if len(y_tile.shape) == 3 else y_hbm.at[e]
                cps.append(pltpu.make_async_copy(src, y_tile.at[j], sem.at[2]))
            if s_hbm is not None:
                cps.extend(_weight_copies(s_hbm, s_tile, e, j, lanes, cols, sem.at[3]))
            return cps

        _gather(copies, edges)
        cotangents((first + jax.lax.broadcasted_iota(jnp.int32, (edges, 1), 0)) < num_valid_ref[0])
        if dx_hbm is not None:
            reduce.add_tile(dx_tile, senders_ref, first, edges)

    if dy_hbm is not None or ds_hbm is not None:

        @pl.when(first >= num_valid_ref[0])
        def _():
            for tile in (dy_tile, ds_tile):
                if tile is not None:
                    tile[...] = jnp.zeros(tile.shape, tile.dtype)

        num_edges = (ds_hbm if ds_hbm is not None else s_hbm).shape[0]  # dy reads s

        def writes(j):
            e = order_ref[first + j]
            cps = []
            if dy_hbm is not None:
                dst = dy_hbm.at[e, :, lanes] if len(dy_tile.shape) == 3 else dy_hbm.at[c, e]
                cps.append(pltpu.make_async_copy(dy_tile.at[j], dst, sem.at[4]))
            if ds_hbm is not None:
                cps.extend(_weight_copies(ds_hbm, ds_tile, e, j, lanes, cols, sem.at[5], to_hbm=True))
            return cps

        # every edge slot of the tile that exists, padding edges included (their rows are zero)
        _gather(writes, jnp.minimum(edges, num_edges - first))

    if dx_hbm is not None:

        @pl.when(t == tiles - 1)
        def _():
            reduce.finish()


def convolution_bwd_kernel(
    order_ref, senders_ref, receivers_ref, num_valid_ref, x_hbm, y_hbm, s_hbm, dm_hbm, dx_hbm, dy_hbm, ds_hbm,
    x_tile, y_tile, s_tile, dm_tile, dx_tile, acc, stage, zero_row, current, dy_tile, ds_tile, sem,
    *, coo: TensorProductCoo, y_channels: bool, cols: tuple | None = None,
) -> None:  # fmt: skip
    """One edge tile of the backward, records unrolled.

    As :func:`convolution_kernel` over the sender-sorted order (padding slots: sender ``N``), with
    ``dm_hbm`` gathered by receiver and the outputs ``dx_hbm [N, Dx, C]`` (ReduceFlush's state in
    ``acc``, ``stage``, ``zero_row``, ``current``), ``dy_hbm`` (``[E, Dy, C]``, or ``[C / Cq, E, Dy]``
    partial sums for a broadcast ``y``) and ``ds_hbm [E, P, C]`` (with ``cols``, ``s_hbm`` and
    ``ds_hbm`` are ``[E, W]``: :func:`_weight_copies`), written per edge from ``dy_tile`` and
    ``ds_tile``. Refs of operands no requested cotangent reads, and of outputs not requested, are ``None``.
    """
    i3 = coo.i3.tolist()
    paths: dict[int, list[int]] = {}
    for i0, p in enumerate(i3):
        paths.setdefault(p, []).append(i0)

    def cotangents(valid):
        edges, _, cq = dm_tile.shape
        zeros = jnp.zeros((edges, cq), dm_tile.dtype)
        dm_row = _row_loader(dm_tile, True)
        x_row = _row_loader(x_tile, True) if x_tile is not None else None
        y_row = _row_loader(y_tile, y_channels) if y_tile is not None else None
        if s_tile is not None:
            s_row = _row_loader(s_tile, True)
            w = functools.cache(lambda i0: s_row(i3[i0]) * dm_row(i0))
        if dx_tile is not None:
            dx = coo.vjp_x.contract(y_row, w)
            for i in range(coo.dim_x):
                dx_tile[:, i, :] = dx.get(i, zeros)
        if dy_tile is not None:
            dy = coo.vjp_y.contract(x_row, w)
            for i in range(coo.dim_y):
                v = jnp.where(valid, dy[i], 0) if i in dy else zeros
                if y_channels:
                    dy_tile[:, i, :] = v
                else:
                    dy_tile[:, i] = jnp.sum(v, axis=1)
        if ds_tile is not None:
            z = coo.table.contract(x_row, y_row)
            for p in range(coo.num_paths):
                terms = [z[i0] * dm_row(i0) for i0 in paths.get(p, ()) if i0 in z]
                ds_tile[:, p, :] = jnp.where(valid, functools.reduce(jnp.add, terms, zeros), 0)

    _cotangent_tiles(
        order_ref, senders_ref, receivers_ref, num_valid_ref, x_hbm, y_hbm, s_hbm, dm_hbm, dx_hbm, dy_hbm, ds_hbm,
        x_tile, y_tile, s_tile, dm_tile, dx_tile, acc, stage, zero_row, current, dy_tile, ds_tile, sem,
        cotangents=cotangents, cols=cols,
    )  # fmt: skip


def convolution_bwd_walk_kernel(
    order_ref, senders_ref, receivers_ref, num_valid_ref, dx_table_refs, dy_table_refs, ds_table_refs,
    x_hbm, y_hbm, s_hbm, dm_hbm, dx_hbm, dy_hbm, ds_hbm,
    x_tile, y_tile, s_tile, dm_tile, dx_tile, acc, stage, zero_row, current, dy_tile, ds_tile, sem,
    x_rows, y_rows, s_rows, dm_rows, dx_rows, dy_rows, ds_rows,
    *, y_channels: bool, cols: tuple | None = None,
) -> None:  # fmt: skip
    """:func:`convolution_bwd_kernel` walking the trilinear table's transposes from SMEM:
    ``dx[i1] = Σ c · y[i2] · s[i3] · dm[i0]`` (``coo.trilinear.transpose(1)``), ``dy[i2] = Σ c · x[i1] ·
    s[i3] · dm[i0]`` (``transpose(2)``), ``ds[p] = Σ c · x[i1] · y[i2] · dm[i0]`` (``transpose(3)``),
    per edge slot; ``*_rows`` are ``[D, B, Cq]`` VMEM scratch, ``None`` where not needed."""

    def cotangents(valid):
        to_rows(dm_tile, dm_rows)
        for tile, rows, channels in ((x_tile, x_rows, True), (y_tile, y_rows, y_channels), (s_tile, s_rows, True)):
            if tile is not None:
                to_rows(tile, rows, channels=channels)
        if dx_tile is not None:
            walk_rows(dx_table_refs, (y_rows, s_rows, dm_rows), dx_rows)
            from_rows(dx_rows, dx_tile)
        if dy_tile is not None:
            walk_rows(dy_table_refs, (x_rows, s_rows, dm_rows), dy_rows)
            from_rows(dy_rows, dy_tile, reduce_lanes=not y_channels, mask=valid)
        if ds_tile is not None:
            walk_rows(ds_table_refs, (x_rows, y_rows, dm_rows), ds_rows)
            from_rows(ds_rows, ds_tile, mask=valid)

    _cotangent_tiles(
        order_ref, senders_ref, receivers_ref, num_valid_ref, x_hbm, y_hbm, s_hbm, dm_hbm, dx_hbm, dy_hbm, ds_hbm,
        x_tile, y_tile, s_tile, dm_tile, dx_tile, acc, stage, zero_row, current, dy_tile, ds_tile, sem,
        cotangents=cotangents, cols=cols,
    )  # fmt: skip


# -- calls --------------------------------------------------------------------------------------


def _pad(a: jax.Array, length: int, fill: int) -> jax.Array:
    return jnp.pad(a, (0, length - a.shape[0]), constant_values=fill)


def _y_buffer(coo, rows, cq, y_channels, dtype):
    return pltpu.VMEM((rows, coo.dim_y, cq) if y_channels else (rows, coo.dim_y), dtype)


def _edge_tile(requested: int | None, default: int) -> int:
    if requested is None:
        return default
    if requested <= 0 or requested % 8:
        raise ValueError(f"edge_tile must be a positive multiple of 8, got {requested}")
    return requested


def _schedule(order, num_valid, keys_valid, keys_padding, others, edges: int):
    """Edge slots of ``order`` padded to whole tiles: ``(order, key per slot, other end per slot)``."""
    padded = pl.cdiv(order.shape[0], edges) * edges
    order = _pad(order, padded, 0)
    valid = jnp.arange(padded, dtype=jnp.int32) < num_valid
    return order, jnp.where(valid, keys_valid[order], keys_padding), jnp.where(valid, others[order], 0)


#: SMEM the three edge-slot arrays (12 bytes per slot) and a walked table's records may take when
#: scalar-prefetched whole (a v5e core's SMEM is 1 MiB in JAX's TPU tables; Mosaic needs some too).
#: Beyond it each grid step copies its tile's slots into SMEM instead (:func:`_slots_by_tile`).
PREFETCH_SMEM_BYTES = 512 * 1024


class _TileSlots:
    """Slot ``k`` of an edge-slot array (``order``, senders, receivers) read from the SMEM copy of the
    current tile: ``buf[k + shift]`` (``shift``: this array's offset in ``buf`` less the tile's first
    slot). Indexed as the scalar-prefetched whole array is, so the kernels read both alike."""

    def __init__(self, buf, shift):
        self.buf, self.shift = buf, shift

    def __getitem__(self, k):
        return self.buf[k + self.shift]


def _slots_by_tile(kernel, num_prefetch: int, edges: int):
    """``kernel`` (written for ``order``, senders and receivers scalar-prefetched whole) taking them as
    HBM operands instead, after the other ``num_prefetch`` prefetched refs, with a ``[3·edges]`` SMEM
    scratch last: each grid step (axis 1: the edge tiles) first copies its tile's slots there. SMEM
    then holds a tile's indices, not the graph's, which outgrow it at ~10^5 edges."""

    def run(*refs):
        prefetched, (order_hbm, senders_hbm, receivers_hbm), refs = (
            refs[: 1 + num_prefetch],
            refs[1 + num_prefetch : 4 + num_prefetch],
            refs[4 + num_prefetch :],
        )
        *refs, slots = refs
        first = pl.program_id(1) * edges
        views = []
        for k, hbm in enumerate((order_hbm, senders_hbm, receivers_hbm)):
            pltpu.sync_copy(hbm.at[pl.ds(first, edges)], slots.at[pl.ds(k * edges, edges)])
            views.append(_TileSlots(slots, k * edges - first))
        return kernel(*views, *prefetched, *refs)

    return run


def _place_slots(kernel, prefetch: list, operands: list, scratch: list, edges: int, records_bytes: int):
    """``(kernel, prefetch, operands, scratch)`` with the edge slots (``prefetch[:3]``) scalar-
    prefetched whole while they fit :data:`PREFETCH_SMEM_BYTES` beside the tables' records, else
    moved to HBM operands read tile by tile (:func:`_slots_by_tile`)."""
    if 4 * 3 * prefetch[0].shape[0] + records_bytes <= PREFETCH_SMEM_BYTES:
        return kernel, prefetch, operands, scratch
    kernel = _slots_by_tile(kernel, len(prefetch) - 4, edges)
    return kernel, prefetch[3:], prefetch[:3] + operands, scratch + [pltpu.SMEM((3 * edges,), jnp.int32)]


def _call(kernel, prefetch, operands, out_shape, scratch, grid, interpret, name, tile, aliases=None):
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(prefetch),
        grid=grid,
        in_specs=[None if a is None else pl.BlockSpec(memory_space=pl.ANY) for a in operands],
        out_specs=jax.tree.map(lambda _: pl.BlockSpec(memory_space=pl.ANY), out_shape),
        scratch_shapes=scratch,
    )
    return pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid_spec=grid_spec,
        compiler_params=vmem.compiler_params(tile, ("parallel", "arbitrary")),
        input_output_aliases=aliases or {},
        interpret=interpret if interpret is not None else False,
        name=name,
    )(*prefetch, *operands)


@x32
def convolution(
    coo: TensorProductCoo,
    x: jax.Array,
    y: jax.Array,
    s: jax.Array,
    graph,
    *,
    y_channels: bool,
    interpret=None,
    edge_tile: int | None = None,
) -> jax.Array:
    """Fused forward convolution (module docstring).

    ``interpret``: ``None`` to compile for the TPU, or a ``pltpu.InterpretParams``; ``edge_tile``
    overrides the VMEM-budget choice of edges per tile (a multiple of 8).
    """
    return _forward(coo, x, y, s, graph, None, y_channels, interpret, edge_tile)


def _forward(coo: TensorProductCoo, x, y, s, graph, cols, y_channels: bool, interpret, edge_tile) -> jax.Array:
    """:func:`convolution`; with ``cols``, ``s`` is ``[E, W]`` (:func:`_weight_copies`)."""
    num_nodes, _, channels = x.shape
    dtype = x.dtype
    walk = not unrolls(coo.table)
    tile = vmem.convolution_tile(coo, channels=channels, itemsize=dtype.itemsize, y_channels=y_channels, walk=walk)
    B, cq = _edge_tile(edge_tile, tile.edges), tile.channels
    # padding slots: receiver num_nodes (ReduceFlush's end key), sender 0
    order, receivers, senders = _schedule(graph.order, graph.num_valid, graph.receivers, num_nodes, graph.senders, B)
    scratch = [
        pltpu.VMEM((B, coo.dim_x, cq), dtype),
        _y_buffer(coo, B, cq, y_channels, dtype),
        pltpu.VMEM((B, coo.num_paths, cq), dtype),
        pltpu.VMEM((B, coo.dim_out, cq), dtype),
        pltpu.VMEM((8, coo.dim_out, cq), dtype),
        pltpu.VMEM((coo.dim_out, cq), dtype),
        pltpu.VMEM((coo.dim_out, cq), dtype),
        pltpu.SMEM((1,), jnp.int32),
        pltpu.SemaphoreType.DMA((3,)),
    ]
    prefetch = [order, senders, receivers, graph.num_valid.reshape(1)]
    if not walk:
        kernel = functools.partial(
            convolution_kernel, table=coo.table, i3=tuple(coo.i3.tolist()), y_channels=y_channels, cols=cols
        )
    else:
        kernel = functools.partial(convolution_walk_kernel, y_channels=y_channels, cols=cols)
        prefetch += [records(coo.table), jnp.asarray(coo.i3)]
        scratch += [pltpu.VMEM((d, B, cq), dtype) for d in (coo.dim_x, coo.dim_y, coo.num_paths, coo.dim_out)]
    records_bytes = smem_bytes(coo.table) + 4 * coo.dim_out if walk else 0
    kernel, prefetch, operands, scratch = _place_slots(kernel, prefetch, [x, y, s], scratch, B, records_bytes)
    out_shape = result_type((num_nodes, coo.dim_out, channels), dtype, *prefetch, *operands)
    grid = (channels // cq, order.shape[0] // B)
    return _call(kernel, prefetch, operands, out_shape, scratch, grid, interpret, "e3j_convolution", tile)


@x32
def convolution_bwd(
    coo: TensorProductCoo,
    x: jax.Array | None,
    y: jax.Array | None,
    s: jax.Array | None,
    dm: jax.Array,
    graph,
    *,
    outs: tuple[str, ...],
    y_channels: bool,
    interpret=None,
    edge_tile: int | None = None,
) -> dict[str, jax.Array]:
    """Cotangents for ``outs ⊆ {x, y, s}`` in one sender-ordered sweep (Algorithm 7).

    ``x`` is read only when ``y`` or ``s`` is requested, ``y`` when ``x`` or ``s`` is, ``s`` when
    ``x`` or ``y`` is (unneeded operands are ``None``).
    """
    return _backward(coo, x, y, s, dm, graph, outs, None, None, None, y_channels, interpret, edge_tile)


def _backward(
    coo: TensorProductCoo, x, y, s, dm, graph, outs, cols, width, ds_into, y_channels: bool, interpret, edge_tile
) -> dict[str, jax.Array]:
    """:func:`convolution_bwd`; with ``cols``, ``s`` and ``ds`` are ``[E, width]`` (path ``p`` at
    columns ``cols[p] ..``) and only the paths' columns of ``ds`` are written: into ``ds_into``
    (aliased, its other columns kept) when given, else into a fresh buffer whose other columns are
    undefined."""
    want_x, want_y, want_s = ("x" in outs), ("y" in outs), ("s" in outs)
    num_nodes, _, channels = dm.shape
    num_edges = graph.senders.shape[0]
    dtype = dm.dtype
    walk = not unrolls(coo.table)
    tile = vmem.convolution_bwd_tile(coo, channels=channels, itemsize=dtype.itemsize, y_channels=y_channels, walk=walk)
    B, cq = _edge_tile(edge_tile, tile.edges), tile.channels
    nc = channels // cq
    # padding slots: sender num_nodes (ReduceFlush's end key), receiver 0
    order, senders, receivers = _schedule(
        graph.sender_order, graph.num_valid, graph.senders, num_nodes, graph.receivers, B
    )

    def vmem_if(wanted, shape):
        return pltpu.VMEM(shape, dtype) if wanted else None

    scratch = [
        vmem_if(x is not None, (B, coo.dim_x, cq)),
        _y_buffer(coo, B, cq, y_channels, dtype) if y is not None else None,
        vmem_if(s is not None, (B, coo.num_paths, cq)),
        pltpu.VMEM((B, coo.dim_out, cq), dtype),
        vmem_if(want_x, (B, coo.dim_x, cq)),
        vmem_if(want_x, (8, coo.dim_x, cq)),
        vmem_if(want_x, (coo.dim_x, cq)),
        vmem_if(want_x, (coo.dim_x, cq)),
        pltpu.SMEM((1,), jnp.int32) if want_x else None,
        _y_buffer(coo, B, cq, y_channels, dtype) if want_y else None,
        vmem_if(want_s, (B, coo.num_paths, cq)),
        pltpu.SemaphoreType.DMA((6,)),
    ]
    prefetch = [order, senders, receivers, graph.num_valid.reshape(1)]
    if not walk:
        kernel = functools.partial(convolution_bwd_kernel, coo=coo, y_channels=y_channels, cols=cols)
    else:
        kernel = functools.partial(convolution_bwd_walk_kernel, y_channels=y_channels, cols=cols)
        tri = coo.trilinear
        prefetch += [records(tri.transpose(k)) if want else None for k, want in ((1, want_x), (2, want_y), (3, want_s))]
        scratch += [
            vmem_if(x is not None, (coo.dim_x, B, cq)),
            vmem_if(y is not None, (coo.dim_y, B, cq)),
            vmem_if(s is not None, (coo.num_paths, B, cq)),
            pltpu.VMEM((coo.dim_out, B, cq), dtype),
            vmem_if(want_x, (coo.dim_x, B, cq)),
            vmem_if(want_y, (coo.dim_y, B, cq)),
            vmem_if(want_s, (coo.num_paths, B, cq)),
        ]
    varies = (*prefetch, x, y, s, dm, ds_into)  # what the results vary over inside shard_map
    out_shape = (
        result_type((num_nodes, coo.dim_x, channels), dtype, *varies) if want_x else None,
        result_type((num_edges, coo.dim_y, channels) if y_channels else (nc, num_edges, coo.dim_y), dtype, *varies)
        if want_y
        else None,
        result_type((num_edges, coo.num_paths, channels) if cols is None else (num_edges, width), dtype, *varies)
        if want_s
        else None,
    )
    grid = (nc, order.shape[0] // B)
    operands, aliases = [x, y, s, dm], None
    if ds_into is not None:
        # the kernel never reads it: its buffer becomes ds's, the other groups' columns kept
        aliases = {len(jax.tree.leaves([prefetch, operands])): want_x + want_y}
        kernel = _skipping_arg(kernel, len(prefetch) + len(operands))
        operands.append(ds_into)
    tables = [tri.transpose(k) for k, want in ((1, want_x), (2, want_y), (3, want_s)) if want] if walk else []
    kernel, prefetch, operands, scratch = _place_slots(kernel, prefetch, operands, scratch, B, smem_bytes(*tables))
    dx, dy, ds = _call(
        kernel, prefetch, operands, out_shape, scratch, grid, interpret, "e3j_convolution_bwd", tile, aliases
    )
    res = {"x": dx, "y": dy, "s": ds}
    if want_y and not y_channels:
        res["y"] = functools.reduce(jnp.add, list(dy))
    return {o: res[o] for o in outs}


# Twin of e3j_pallas_gpu.convolution._skipping_arg, on purpose: kernel packages never import each other.
def _skipping_arg(kernel, position: int):
    """``kernel`` taking one more ref, at ``position``, that it does not read (an aliased input)."""

    def run(*refs):
        return kernel(*refs[:position], *refs[position + 1 :])

    return run


# -- mixed multiplicities: the groups of an e3nn plan, weights read in place ---------------------
# (the loop over the groups is the plan's: forward_by_group / backward_by_group)


@x32
def grouped_convolution(
    plan, x: jax.Array, y: jax.Array, s: jax.Array, graph, *, interpret=None, edge_tile: int | None = None
) -> jax.Array:
    """Every group of ``plan`` (an ``e3j`` mixed-multiplicity plan whose weights are in place):
    ``x [N, Dx_flat]``, ``y [E, Dy]``, ``s [E, num_weights]`` (e3nn's order) → ``m [N, Dout_flat]``.

    One launch per group, each reading its paths' windows of ``s`` where they are; the node features
    are split into the groups' ``[N, Dx_g, C_g]`` and the outputs joined into e3nn's layout around them.
    ``interpret``, ``edge_tile``: as :func:`convolution`'s.
    """

    def launch(g, xg):
        return _forward(g.coo, xg, y, s, graph, tuple(g.weight_columns.tolist()), False, interpret, edge_tile)

    return plan.forward_by_group(x, launch)


@x32
def grouped_convolution_bwd(
    plan, x, y, s, dm, graph, *, outs: tuple[str, ...], interpret=None, edge_tile: int | None = None
) -> dict[str, jax.Array]:
    """Cotangents of :func:`grouped_convolution` for ``outs ⊆ {x, y, s}``, in its layouts.

    ``ds [E, num_weights]`` is one buffer that each group's launch writes its windows of, in place
    (every column belongs to exactly one group's path, so together they write all of it).
    """

    def launch(g, xg, dmg, ds):
        cols = tuple(g.weight_columns.tolist())
        return _backward(g.coo, xg, y, s, dmg, graph, outs, cols, plan.num_weights, ds, False, interpret, edge_tile)

    return plan.backward_by_group(x, dm, outs, launch)
