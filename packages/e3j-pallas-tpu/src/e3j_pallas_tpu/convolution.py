"""Pallas TPU fused message-passing convolution (paper Algorithms 4–7).

``m_b = Σ_{a→b} s_ab · (x_a ⊗ y_ab)``: ``x [N, Dx, C]``, ``y [E, Dy]`` or ``[E, Dy, C]``,
``s [E, P, C]`` → ``m [N, Dout, C]``.

Forward (Algorithm 4): the grid walks channel blocks × tiles of ``B`` receiver-ordered edges. The
tile's edge ids, senders and receivers are scalar-prefetched into SMEM; the sender rows ``x_a`` and
the edge rows ``y_ab``, ``s_ab`` are gathered from HBM into VMEM by DMA; MessageTile (Algorithm 5)
evaluates ``s[i3(i0)] · Σ c x[i1] y[i2]`` with the records unrolled at trace time and the edge scalar
factored out of each row's record sum; ReduceFlush (Algorithm 6, :mod:`._segments`) sums the tile
into receivers with its state carried across tiles, writing every node row once. Tiles past the
last valid edge do nothing, so padding edges cost nothing.

Backward (Algorithm 7): the same schedule over *sender*-ordered edge tiles, gathering ``x_a``,
``dm_b``, ``y_ab``, ``s_ab``; one sweep computes ``w = s[i3(i0)] · dm[i0]``, the ``dx`` tile (reduced
by ReduceFlush keyed on senders — no atomics, correct for any directed graph), and the edge-local
``dy`` (summed over the channel block when ``y`` is broadcast; blocks are added after the kernel) and
``ds``, written per edge by DMA. Padding edges get zero ``dy``/``ds`` rows.

Channel blocks are 128 lanes, or all channels when the count is not a multiple of 128 (see
:mod:`.vmem` for the cost). The edge tile is the largest whose buffers fit the VMEM budget.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from e3j_core import TensorProductCoo

from . import vmem
from ._rows import x32
from ._segments import ReduceFlush

__all__ = ["convolution", "convolution_bwd"]


def _pad(a: jax.Array, length: int, fill: int) -> jax.Array:
    return jnp.pad(a, (0, length - a.shape[0]), constant_values=fill)


def _y_buffer(coo, rows, cq, y_channels, dtype):
    return pltpu.VMEM((rows, coo.dim_y, cq) if y_channels else (rows, coo.dim_y), dtype)


def _row_loader(buf, channels: bool):
    if channels:
        return functools.cache(lambda i: buf[:, i, :])
    return functools.cache(lambda i: buf[:, i][:, None])


def _gather(copies, count: int) -> None:
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


def _edge_tile(requested: int | None, default: int) -> int:
    if requested is None:
        return default
    if requested <= 0 or requested % 8:
        raise ValueError(f"edge_tile must be a positive multiple of 8, got {requested}")
    return requested


def _interpret(interpret):
    return interpret if interpret is not None else False


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
    num_nodes, _, channels = x.shape
    num_edges = y.shape[0]
    dtype = jnp.result_type(x, y, s)
    if num_nodes == 0 or num_edges == 0:
        return jnp.zeros((num_nodes, coo.dim_out, channels), dtype)
    tile = vmem.convolution_tile(coo, channels=channels, itemsize=dtype.itemsize, y_channels=y_channels)
    B, cq = _edge_tile(edge_tile, tile.edges), tile.channels
    tiles = pl.cdiv(num_edges, B)
    padded = tiles * B
    slots = jnp.arange(padded, dtype=jnp.int32)
    order = _pad(graph.order, padded, 0)
    valid = slots < graph.num_valid
    senders = jnp.where(valid, graph.senders[order], 0)
    receivers = jnp.where(valid, graph.receivers[order], num_nodes)  # padding key: num_nodes
    i3 = coo.i3.tolist()
    table = coo.table

    def kernel(order_ref, a_ref, b_ref, nv_ref, x_hbm, y_hbm, s_hbm, m_hbm, *scratch):
        xbuf, ybuf, sbuf, mtile, acc, stage, zero, current, sem = scratch
        c, t = pl.program_id(0), pl.program_id(1)
        lanes = pl.ds(c * cq, cq)
        reduce = ReduceFlush(acc, stage, zero, current, m_hbm, lanes, num_nodes)
        first = t * B

        @pl.when(t == 0)
        def _():
            reduce.reset()

        @pl.when(first < nv_ref[0])
        def _():
            def copies(j):
                e, a = order_ref[first + j], a_ref[first + j]
                return (
                    pltpu.make_async_copy(x_hbm.at[a, :, lanes], xbuf.at[j], sem.at[0]),
                    pltpu.make_async_copy(y_hbm.at[e, :, lanes] if y_channels else y_hbm.at[e], ybuf.at[j], sem.at[1]),
                    pltpu.make_async_copy(s_hbm.at[e, :, lanes], sbuf.at[j], sem.at[2]),
                )

            _gather(copies, B)
            z = table.contract(_row_loader(xbuf, True), _row_loader(ybuf, y_channels))
            s_row = _row_loader(sbuf, True)
            for i0 in range(coo.dim_out):
                mtile[:, i0, :] = (s_row(i3[i0]) * z[i0]).astype(dtype) if i0 in z else jnp.zeros((B, cq), dtype)
            reduce.add_tile(mtile, b_ref, first, B)

        @pl.when(t == tiles - 1)
        def _():
            reduce.finish()

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=4,
        grid=(channels // cq, tiles),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 3,
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[
            pltpu.VMEM((B, coo.dim_x, cq), dtype),
            _y_buffer(coo, B, cq, y_channels, dtype),
            pltpu.VMEM((B, coo.num_paths, cq), dtype),
            pltpu.VMEM((B, coo.dim_out, cq), dtype),
            pltpu.VMEM((8, coo.dim_out, cq), dtype),
            pltpu.VMEM((coo.dim_out, cq), dtype),
            pltpu.VMEM((coo.dim_out, cq), dtype),
            pltpu.SMEM((1,), jnp.int32),
            pltpu.SemaphoreType.DMA((3,)),
        ],
    )
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_nodes, coo.dim_out, channels), dtype),
        grid_spec=grid_spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=_interpret(interpret),
        name="e3j_convolution",
    )(order, senders, receivers, graph.num_valid.reshape(1), x.astype(dtype), y.astype(dtype), s.astype(dtype))


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
    ``x`` or ``y`` is (unneeded operands may be ``None``).
    """
    outs = tuple(o for o in ("x", "y", "s") if o in outs)
    if not outs:
        return {}
    want_x, want_y, want_s = ("x" in outs), ("y" in outs), ("s" in outs)
    num_nodes, _, channels = dm.shape
    num_edges = graph.senders.shape[0]
    dtype = jnp.result_type(*[a for a in (x, y, s, dm) if a is not None])
    y_out_shape = (num_edges, coo.dim_y, channels) if y_channels else (num_edges, coo.dim_y)
    if num_nodes == 0 or num_edges == 0:
        shapes = {"x": (num_nodes, coo.dim_x, channels), "y": y_out_shape, "s": (num_edges, coo.num_paths, channels)}
        return {o: jnp.zeros(shapes[o], dtype) for o in outs}
    need_x, need_y, need_s = want_y or want_s, want_x or want_s, want_x or want_y
    tile = vmem.convolution_bwd_tile(coo, channels=channels, itemsize=dtype.itemsize, y_channels=y_channels)
    B, cq = _edge_tile(edge_tile, tile.edges), tile.channels
    nc = channels // cq
    tiles = pl.cdiv(num_edges, B)
    padded = tiles * B
    slots = jnp.arange(padded, dtype=jnp.int32)
    order = _pad(graph.sender_order, padded, 0)
    valid = slots < graph.num_valid
    senders = jnp.where(valid, graph.senders[order], num_nodes)  # ReduceFlush key; padding: num_nodes
    receivers = jnp.where(valid, graph.receivers[order], 0)
    i3 = coo.i3.tolist()
    paths: dict[int, list[int]] = {}
    for i0, p in enumerate(i3):
        paths.setdefault(p, []).append(i0)

    names = [n for n, need in (("x", need_x), ("y", need_y), ("s", need_s)) if need] + ["dm"]
    operands = {"x": x, "y": y, "s": s, "dm": dm}
    out_names = [f"d{o}" for o in outs]
    out_shapes = {
        "dx": (num_nodes, coo.dim_x, channels),
        "dy": (num_edges, coo.dim_y, channels) if y_channels else (nc, num_edges, coo.dim_y),
        "ds": (num_edges, coo.num_paths, channels),
    }
    scratch_names, scratch = [], []

    def add(name, shape):
        scratch_names.append(name)
        scratch.append(shape)

    if need_x:
        add("xbuf", pltpu.VMEM((B, coo.dim_x, cq), dtype))
    if need_y:
        add("ybuf", _y_buffer(coo, B, cq, y_channels, dtype))
    if need_s:
        add("sbuf", pltpu.VMEM((B, coo.num_paths, cq), dtype))
    add("dmbuf", pltpu.VMEM((B, coo.dim_out, cq), dtype))
    if want_x:
        add("dxtile", pltpu.VMEM((B, coo.dim_x, cq), dtype))
        add("acc", pltpu.VMEM((8, coo.dim_x, cq), dtype))
        add("stage", pltpu.VMEM((coo.dim_x, cq), dtype))
        add("zero", pltpu.VMEM((coo.dim_x, cq), dtype))
        add("current", pltpu.SMEM((1,), jnp.int32))
    if want_y:
        add("dybuf", _y_buffer(coo, B, cq, y_channels, dtype))
    if want_s:
        add("dsbuf", pltpu.VMEM((B, coo.num_paths, cq), dtype))
    add("sem", pltpu.SemaphoreType.DMA((6,)))

    def kernel(order_ref, a_ref, b_ref, nv_ref, *refs):
        refs = dict(zip([*names, *out_names, *scratch_names], refs, strict=True))
        sem = refs["sem"]
        c, t = pl.program_id(0), pl.program_id(1)
        lanes = pl.ds(c * cq, cq)
        first = t * B
        if want_x:
            reduce = ReduceFlush(
                refs["acc"], refs["stage"], refs["zero"], refs["current"], refs["dx"], lanes, num_nodes
            )

            @pl.when(t == 0)
            def _():
                reduce.reset()

        @pl.when(first < nv_ref[0])
        def _():
            def copies(j):
                e, b = order_ref[first + j], b_ref[first + j]
                a = jnp.minimum(a_ref[first + j], num_nodes - 1)  # padding slots: any valid row
                cps = [pltpu.make_async_copy(refs["dm"].at[b, :, lanes], refs["dmbuf"].at[j], sem.at[0])]
                if need_x:
                    cps.append(pltpu.make_async_copy(refs["x"].at[a, :, lanes], refs["xbuf"].at[j], sem.at[1]))
                if need_y:
                    src = refs["y"].at[e, :, lanes] if y_channels else refs["y"].at[e]
                    cps.append(pltpu.make_async_copy(src, refs["ybuf"].at[j], sem.at[2]))
                if need_s:
                    cps.append(pltpu.make_async_copy(refs["s"].at[e, :, lanes], refs["sbuf"].at[j], sem.at[3]))
                return cps

            _gather(copies, B)
            slot_valid = (first + jax.lax.broadcasted_iota(jnp.int32, (B, 1), 0)) < nv_ref[0]
            zeros = jnp.zeros((B, cq), dtype)
            dm_row = _row_loader(refs["dmbuf"], True)
            x_row = _row_loader(refs["xbuf"], True) if need_x else None
            y_row = _row_loader(refs["ybuf"], y_channels) if need_y else None
            if want_x or want_y:
                s_row = _row_loader(refs["sbuf"], True)
                w = functools.cache(lambda i0: s_row(i3[i0]) * dm_row(i0))
            if want_x:
                dx = coo.vjp_x.contract(y_row, w)
                for i in range(coo.dim_x):
                    refs["dxtile"][:, i, :] = dx[i].astype(dtype) if i in dx else zeros
                reduce.add_tile(refs["dxtile"], a_ref, first, B)
            if want_y:
                dy = coo.vjp_y.contract(x_row, w)
                for i in range(coo.dim_y):
                    v = jnp.where(slot_valid, dy[i], 0).astype(dtype) if i in dy else zeros
                    if y_channels:
                        refs["dybuf"][:, i, :] = v
                    else:
                        refs["dybuf"][:, i] = jnp.sum(v, axis=1)
            if want_s:
                z = coo.table.contract(x_row, y_row)
                for p in range(coo.num_paths):
                    terms = [z[i0] * dm_row(i0) for i0 in paths.get(p, ()) if i0 in z]
                    v = functools.reduce(jnp.add, terms, zeros)
                    refs["dsbuf"][:, p, :] = jnp.where(slot_valid, v, 0).astype(dtype)

        if want_y or want_s:

            @pl.when(first >= nv_ref[0])
            def _():
                for name in ("dybuf",) * want_y + ("dsbuf",) * want_s:
                    refs[name][...] = jnp.zeros(refs[name].shape, dtype)

            def writes(j):
                e = order_ref[first + j]
                cps = []
                if want_y:
                    dst = refs["dy"].at[e, :, lanes] if y_channels else refs["dy"].at[c, e]
                    cps.append(pltpu.make_async_copy(refs["dybuf"].at[j], dst, sem.at[4]))
                if want_s:
                    cps.append(pltpu.make_async_copy(refs["dsbuf"].at[j], refs["ds"].at[e, :, lanes], sem.at[5]))
                return cps

            # every edge slot of the tile that exists, padding edges included (their rows are zero)
            _gather(writes, jnp.minimum(B, num_edges - first))

        if want_x:

            @pl.when(t == tiles - 1)
            def _():
                reduce.finish()

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=4,
        grid=(nc, tiles),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * len(names),
        out_specs=tuple(pl.BlockSpec(memory_space=pl.ANY) for _ in out_names),
        scratch_shapes=scratch,
    )
    results = pl.pallas_call(
        kernel,
        out_shape=tuple(jax.ShapeDtypeStruct(out_shapes[n], dtype) for n in out_names),
        grid_spec=grid_spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=_interpret(interpret),
        name="e3j_convolution_bwd",
    )(order, senders, receivers, graph.num_valid.reshape(1), *(operands[n].astype(dtype) for n in names))
    res = dict(zip(outs, results, strict=True))
    if want_y and not y_channels:
        res["y"] = functools.reduce(jnp.add, list(res["y"]))
    return res
