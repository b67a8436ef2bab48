"""Pallas GPU (Triton) tensor-product kernels: Clebsch–Gordan records unrolled or walked.

A program owns a tile of ``bt`` batch rows × ``cb`` channels (channels on the fast axis) and writes
each output row once. Tables up to :data:`~e3j_pallas_gpu._records.UNROLL_RECORDS` records are
unrolled at trace time (``CooTable.contract``, no coefficient or index read at run time, each
operand row loaded once); larger ones are walked: a loop over output rows, and over each row's
records, with operand rows gathered by index (:mod:`._records`).

Layouts are e3j's trailing-channel layouts: ``x [B, Dx, C]``, ``y [B, Dy]`` (broadcast over
channels) or ``[B, Dy, C]``, ``z [B, Dout, C]``. A batch that is not a multiple of the tile is padded
with zero rows (one copy of the operands; none when ``B`` is a multiple of ``bt``).

The backward kernel streams ``(x, y, dz)`` once and writes both cotangents (paper Eq. 15); the
cotangent of a broadcast ``y`` is summed over channels per channel block, then over blocks.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from e3j_core import CooTable, TensorProductCoo

from ._blocks import channel_block, num_warps, pad_rows, result_type, row_block
from ._records import records, unrolls, walk_row

__all__ = [
    "tensor_product",
    "tensor_product_bwd",
    "tensor_product_bwd_kernel",
    "tensor_product_bwd_walk_kernel",
    "tensor_product_kernel",
    "tensor_product_walk_kernel",
]


# -- kernels ------------------------------------------------------------------------------------


def _row(ref, channels: bool):
    """Row ``i`` of a ``[bt, D(, cb)]`` block as a ``[bt, cb]`` (or broadcastable ``[bt, 1]``) value."""
    if channels:
        return lambda i: ref[:, i, :]
    return lambda i: ref[:, i][:, None]


def _loader(ref, channels: bool):
    """:func:`_row` loading each (static) row once."""
    return functools.cache(_row(ref, channels))


def _store(ref, channels: bool):
    """``store(i, v)``: a ``[bt, cb]`` value into row ``i`` of a block (summed over lanes for a broadcast ``y``)."""
    if channels:

        def store(i, v):
            ref[:, i, :] = v.astype(ref.dtype)

    else:

        def store(i, v):
            ref[:, i] = jnp.sum(v, axis=1).astype(ref.dtype)

    return store


def _zero(ref_channels) -> jax.Array:
    bt, _, cb = ref_channels.shape
    return jnp.zeros((bt, cb), ref_channels.dtype)


def tensor_product_kernel(x_ref, y_ref, z_ref, *, table: CooTable, y_channels: bool) -> None:
    """``z = table(x, y)`` on one ``[bt, D, cb]`` tile, records unrolled.

    ``x_ref [bt, Dx, cb]``, ``y_ref [bt, Dy, cb]`` or ``[bt, Dy]``, ``z_ref [bt, Dout, cb]``.
    """
    store = _store(z_ref, True)
    # each row stored as soon as its records are done: one output row live at a time
    rows = table.contract(_loader(x_ref, True), _loader(y_ref, y_channels), on_row=store)
    for i0 in range(table.dims[0]):
        if i0 not in rows:
            store(i0, _zero(z_ref))


def tensor_product_walk_kernel(table_refs, x_ref, y_ref, z_ref, *, y_channels: bool) -> None:
    """:func:`tensor_product_kernel` walking the records ``table_refs`` (see ``_records.records``)."""
    x_row, y_row, store = _row(x_ref, True), _row(y_ref, y_channels), _store(z_ref, True)

    def row(i0, carry):
        store(i0, walk_row(i0, table_refs, (x_row, y_row), _zero(z_ref)))
        return carry

    jax.lax.fori_loop(0, z_ref.shape[1], row, 0)


def tensor_product_bwd_kernel(x_ref, y_ref, dz_ref, dx_ref, dy_ref, *, table: CooTable, y_channels: bool) -> None:
    """``dx = vjp_x(y, dz)`` (when ``dx_ref``) and ``dy = vjp_y(x, dz)`` (when ``dy_ref``), unrolled.

    ``x_ref`` may be ``None`` when ``dy`` is not asked for, ``y_ref`` when ``dx`` is not; ``dy_ref`` is
    ``[bt, Dy, cb]``, or ``[bt, Dy]`` (summed over the block's lanes) for a broadcast ``y``.
    """
    # one pass over the records by output row: each dz row is live for its row only, beside the dx
    # and dy accumulators (grouping by dx's and dy's rows would keep all of dz live)
    dx_rows, dy_rows = table.contract_vjp(
        _loader(x_ref, True) if x_ref is not None else None,
        _loader(y_ref, y_channels) if y_ref is not None else None,
        _loader(dz_ref, True),
        grads=tuple(g for g, ref in (("a", dx_ref), ("b", dy_ref)) if ref is not None),
    )
    zero = _zero(dz_ref)
    for rows, ref, channels, dim in ((dx_rows, dx_ref, True, 1), (dy_rows, dy_ref, y_channels, 2)):
        if ref is not None:
            store = _store(ref, channels)
            for i in range(table.dims[dim]):
                store(i, rows.get(i, zero))


def tensor_product_bwd_walk_kernel(
    vjp_x_refs, vjp_y_refs, x_ref, y_ref, dz_ref, dx_ref, dy_ref, *, y_channels: bool
) -> None:
    """:func:`tensor_product_bwd_kernel` walking the records of ``coo.vjp_x`` / ``coo.vjp_y``.

    ``dx[i1] = Σ c · y[i2] · dz[i0]`` row by row of ``vjp_x`` (records ``(i1, i2, i0)``), ``dy[i2] =
    Σ c · x[i1] · dz[i0]`` of ``vjp_y`` (``(i2, i1, i0)``); a table's refs are ``None`` when its
    cotangent is not asked for.
    """
    dz_row, zero = _row(dz_ref, True), _zero(dz_ref)
    walks = []
    if dx_ref is not None:
        walks.append((vjp_x_refs, (_row(y_ref, y_channels), dz_row), _store(dx_ref, True), dx_ref.shape[1]))
    if dy_ref is not None:
        dim_y = dy_ref.shape[1]
        walks.append((vjp_y_refs, (_row(x_ref, True), dz_row), _store(dy_ref, y_channels), dim_y))
    for table_refs, operands, store, rows in walks:

        def row(i, carry, table_refs=table_refs, operands=operands, store=store):
            store(i, walk_row(i, table_refs, operands, zero))
            return carry

        jax.lax.fori_loop(0, rows, row, 0)


# -- calls --------------------------------------------------------------------------------------


def _tiles(batch: int, channels: int) -> tuple[int, int, int, int]:
    cb = channel_block(channels)
    bt = row_block(cb, batch)
    return cb, bt, pl.cdiv(batch, bt) * bt, channels // cb


def _spec(rows: int, dim: int, cb: int, channels: bool) -> pl.BlockSpec:
    if channels:
        return pl.BlockSpec((rows, dim, cb), lambda b, c: (b, 0, c))
    return pl.BlockSpec((rows, dim), lambda b, c: (b, 0))


def _records_and_specs(table: CooTable, dtype):
    refs = records(table, dtype)
    return refs, tuple(pl.BlockSpec(a.shape, lambda *_, n=a.ndim: (0,) * n) for a in refs)


def _compiler_params(bt: int, cb: int):
    return plt.CompilerParams(num_warps=num_warps(bt * cb), num_stages=1)


def tensor_product(
    coo: TensorProductCoo, x: jax.Array, y: jax.Array, *, y_channels: bool, interpret: bool = False
) -> jax.Array:
    """``z = x ⊗ y`` (see the module docstring for layouts)."""
    batch, _, channels = x.shape
    cb, bt, padded, nc = _tiles(batch, channels)
    in_specs = [_spec(bt, coo.dim_x, cb, True), _spec(bt, coo.dim_y, cb, y_channels)]
    args = [pad_rows(x, padded), pad_rows(y, padded)]
    if unrolls(coo.table):
        kernel = functools.partial(tensor_product_kernel, table=coo.table, y_channels=y_channels)
    else:
        kernel = functools.partial(tensor_product_walk_kernel, y_channels=y_channels)
        recs, specs = _records_and_specs(coo.table, x.dtype)
        args, in_specs = [recs, *args], [specs, *in_specs]
    z = pl.pallas_call(
        kernel,
        out_shape=result_type((padded, coo.dim_out, channels), x.dtype, x, y),
        grid=(padded // bt, nc),
        in_specs=in_specs,
        out_specs=_spec(bt, coo.dim_out, cb, True),
        compiler_params=_compiler_params(bt, cb),
        interpret=interpret,
        name="e3j_tensor_product",
    )(*args)
    return z[:batch] if padded != batch else z


def tensor_product_bwd(
    coo: TensorProductCoo,
    x: jax.Array | None,
    y: jax.Array | None,
    dz: jax.Array,
    *,
    outs: tuple[str, ...],
    y_channels: bool,
    interpret: bool = False,
) -> dict[str, jax.Array]:
    """Cotangents ``dx = vjp_x(y, dz)`` and/or ``dy = vjp_y(x, dz)`` in one pass over ``dz``."""
    batch, _, channels = dz.shape
    dtype = dz.dtype
    cb, bt, padded, nc = _tiles(batch, channels)
    want_x, want_y = "x" in outs, "y" in outs
    x_spec = _spec(bt, coo.dim_x, cb, True) if x is not None else None
    y_spec = _spec(bt, coo.dim_y, cb, y_channels) if y is not None else None
    in_specs = [x_spec, y_spec, _spec(bt, coo.dim_out, cb, True)]
    args = [pad_rows(x, padded), pad_rows(y, padded), pad_rows(dz, padded)]
    dx_shape = result_type((padded, coo.dim_x, channels), dtype, x, y, dz) if want_x else None
    dx_spec = _spec(bt, coo.dim_x, cb, True) if want_x else None
    dy_shape = dy_spec = None
    if want_y and y_channels:
        dy_shape, dy_spec = result_type((padded, coo.dim_y, channels), dtype, x, y, dz), _spec(bt, coo.dim_y, cb, True)
    elif want_y:  # per channel block; summed over blocks below
        dy_shape = result_type((nc, padded, coo.dim_y), dtype, x, y, dz)
        dy_spec = pl.BlockSpec((None, bt, coo.dim_y), lambda b, c: (c, b, 0))
    if unrolls(coo.table):
        kernel = functools.partial(tensor_product_bwd_kernel, table=coo.table, y_channels=y_channels)
    else:
        kernel = functools.partial(tensor_product_bwd_walk_kernel, y_channels=y_channels)
        (rx, sx), (ry, sy) = _records_and_specs(coo.vjp_x, dtype), _records_and_specs(coo.vjp_y, dtype)
        args = [rx if want_x else None, ry if want_y else None, *args]
        in_specs = [sx if want_x else None, sy if want_y else None, *in_specs]
    dx, dy = pl.pallas_call(
        kernel,
        out_shape=(dx_shape, dy_shape),
        grid=(padded // bt, nc),
        in_specs=in_specs,
        out_specs=(dx_spec, dy_spec),
        compiler_params=_compiler_params(bt, cb),
        interpret=interpret,
        name="e3j_tensor_product_bwd",
    )(*args)
    res = {}
    if want_x:
        res["x"] = dx[:batch]
    if want_y:
        res["y"] = dy[:batch] if y_channels else functools.reduce(jnp.add, list(dy))[:batch]
    return res
