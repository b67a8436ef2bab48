"""Pallas TPU tensor-product kernels: records unrolled or walked, channels on the lanes.

A program owns a ``[bt, D, Cq]`` block of each operand (batch rows on sublanes, a 128-lane channel
block — or all channels when fewer than 128 or not a multiple of 128); Pallas double-buffers the
blocks from HBM. Feature rows ``ref[:, i, :]`` are ``[bt, Cq]`` vectors. Tables up to
:data:`~e3j_pallas_tpu.backend.UNROLL_RECORDS` records are unrolled (core's ``CooTable.contract``,
grouped by ``(i0, i1)``, Algorithm 5: no coefficient is read at run time); larger ones are walked
from SMEM (:mod:`._records`). The batch tile is the largest that fits the VMEM budget
(:mod:`e3j_pallas_tpu.vmem`); a batch that is not a multiple of it is padded with zero rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from e3j_core import CooTable, TensorProductCoo

from . import vmem
from ._records import from_rows, records, to_rows, unrolls, walk_rows
from ._rows import pad_rows, result_type, x32

__all__ = [
    "tensor_product",
    "tensor_product_bwd",
    "tensor_product_bwd_kernel",
    "tensor_product_bwd_walk_kernel",
    "tensor_product_kernel",
    "tensor_product_walk_kernel",
]


# -- kernels ------------------------------------------------------------------------------------


def _loader(ref, channels: bool):
    if channels:
        return functools.cache(lambda i: ref[:, i, :])
    return functools.cache(lambda i: ref[:, i][:, None])


def _store_rows(table: CooTable, rows: dict, ref, zeros, *, reduce_lanes: bool = False) -> None:
    for i in range(table.dims[0]):
        v = rows[i] if i in rows else zeros
        if reduce_lanes:
            ref[:, i] = jnp.sum(v, axis=1).astype(ref.dtype)
        else:
            ref[:, i, :] = v.astype(ref.dtype)


def tensor_product_kernel(x_ref, y_ref, z_ref, *, table: CooTable, y_channels: bool) -> None:
    """``z = table(x, y)`` on one tile, records unrolled: ``x_ref [bt, Dx, Cq]``, ``y_ref [bt, Dy, Cq]``
    or ``[bt, Dy]``, ``z_ref [bt, Dout, Cq]``."""
    rows = table.contract(_loader(x_ref, True), _loader(y_ref, y_channels))
    bt, _, cq = z_ref.shape
    _store_rows(table, rows, z_ref, jnp.zeros((bt, cq), z_ref.dtype))


def tensor_product_walk_kernel(table_refs, x_ref, y_ref, z_ref, x_rows, y_rows, z_rows, *, y_channels: bool) -> None:
    """:func:`tensor_product_kernel` walking the SMEM records ``table_refs`` (``_records.records``);
    ``x_rows``, ``y_rows``, ``z_rows`` are ``[D, bt, Cq]`` VMEM scratch."""
    to_rows(x_ref, x_rows)
    to_rows(y_ref, y_rows, channels=y_channels)
    walk_rows(table_refs, (x_rows, y_rows), z_rows)
    from_rows(z_rows, z_ref)


def tensor_product_bwd_kernel(
    x_ref, y_ref, dz_ref, dx_ref, dy_ref, *, vjp_x: CooTable, vjp_y: CooTable, y_channels: bool
) -> None:
    """``dx = vjp_x(y, dz)`` (when ``dx_ref``) and ``dy = vjp_y(x, dz)`` (when ``dy_ref``), unrolled.

    ``x_ref`` may be ``None`` when ``dy`` is not asked for, ``y_ref`` when ``dx`` is not; ``dy_ref`` is
    ``[bt, Dy, Cq]``, or ``[bt, Dy]`` (summed over the block's lanes) for a broadcast ``y``.
    """
    dz_row = _loader(dz_ref, True)
    bt, _, cq = dz_ref.shape
    zeros = jnp.zeros((bt, cq), dz_ref.dtype)
    if dx_ref is not None:
        _store_rows(vjp_x, vjp_x.contract(_loader(y_ref, y_channels), dz_row), dx_ref, zeros)
    if dy_ref is not None:
        rows = vjp_y.contract(_loader(x_ref, True), dz_row)
        _store_rows(vjp_y, rows, dy_ref, zeros, reduce_lanes=not y_channels)


def tensor_product_bwd_walk_kernel(
    vjp_x_refs,
    vjp_y_refs,
    x_ref,
    y_ref,
    dz_ref,
    dx_ref,
    dy_ref,
    x_rows,
    y_rows,
    dz_rows,
    dx_rows,
    dy_rows,
    *,
    y_channels: bool,
) -> None:
    """:func:`tensor_product_bwd_kernel` walking ``coo.vjp_x`` (records ``(i1, i2, i0)``) and
    ``coo.vjp_y`` (``(i2, i1, i0)``) from SMEM; refs of what is not asked for are ``None``."""
    to_rows(dz_ref, dz_rows)
    if dx_ref is not None:
        to_rows(y_ref, y_rows, channels=y_channels)
        walk_rows(vjp_x_refs, (y_rows, dz_rows), dx_rows)
        from_rows(dx_rows, dx_ref)
    if dy_ref is not None:
        to_rows(x_ref, x_rows)
        walk_rows(vjp_y_refs, (x_rows, dz_rows), dy_rows)
        from_rows(dy_rows, dy_ref, reduce_lanes=not y_channels)


# -- calls --------------------------------------------------------------------------------------


def _spec(rows: int, dim: int, cq: int, channels: bool) -> pl.BlockSpec:
    if channels:
        return pl.BlockSpec((rows, dim, cq), lambda b, c, *_: (b, 0, c))
    return pl.BlockSpec((rows, dim), lambda b, c, *_: (b, 0))


def _rows(dim: int, bt: int, cq: int, dtype, wanted: bool = True):
    return pltpu.VMEM((dim, bt, cq), dtype) if wanted else None


@x32
def tensor_product(coo: TensorProductCoo, x: jax.Array, y: jax.Array, *, y_channels: bool, interpret=None) -> jax.Array:
    """``z = x ⊗ y``: ``x [B, Dx, C]``, ``y [B, Dy(, C)]`` → ``[B, Dout, C]``.

    ``interpret``: ``None`` to compile for the TPU, or a :class:`pltpu.InterpretParams` to run in
    Pallas's TPU interpreter.
    """
    batch, _, channels = x.shape
    dtype = x.dtype
    walk = not unrolls(coo.table)
    tile = vmem.tensor_product_tile(coo, channels=channels, itemsize=dtype.itemsize, y_channels=y_channels, walk=walk)
    bt, cq = tile.edges, tile.channels
    padded = pl.cdiv(batch, bt) * bt
    in_specs = [_spec(bt, coo.dim_x, cq, True), _spec(bt, coo.dim_y, cq, y_channels)]
    args = [pad_rows(x, padded), pad_rows(y, padded)]
    out_shape = result_type((padded, coo.dim_out, channels), dtype, x, y)
    out_specs = _spec(bt, coo.dim_out, cq, True)
    grid = (padded // bt, channels // cq)
    params = vmem.compiler_params(tile, ("parallel", "parallel"))
    if not walk:
        kernel = functools.partial(tensor_product_kernel, table=coo.table, y_channels=y_channels)
        call = pl.pallas_call(
            kernel,
            out_shape=out_shape,
            grid=grid,
            in_specs=in_specs,
            out_specs=out_specs,
            compiler_params=params,
            interpret=interpret or False,
            name="e3j_tensor_product",
        )
    else:
        kernel = functools.partial(tensor_product_walk_kernel, y_channels=y_channels)
        scratch = [_rows(d, bt, cq, dtype) for d in (coo.dim_x, coo.dim_y, coo.dim_out)]
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=grid, in_specs=in_specs, out_specs=out_specs, scratch_shapes=scratch
        )
        call = pl.pallas_call(
            kernel,
            out_shape=out_shape,
            grid_spec=grid_spec,
            compiler_params=params,
            interpret=interpret or False,
            name="e3j_tensor_product",
        )
        args = [records(coo.table), *args]
    z = call(*args)
    return z[:batch] if padded != batch else z


@x32
def tensor_product_bwd(
    coo: TensorProductCoo,
    x: jax.Array | None,
    y: jax.Array | None,
    dz: jax.Array,
    *,
    outs: tuple[str, ...],
    y_channels: bool,
    interpret=None,
) -> dict[str, jax.Array]:
    """``dx = vjp_x(y, dz)`` and/or ``dy = vjp_y(x, dz)``, streaming ``(x, y, dz)`` once."""
    want_x, want_y = "x" in outs, "y" in outs
    batch, _, channels = dz.shape
    dtype = dz.dtype
    walk = not unrolls(coo.table)
    tile = vmem.tensor_product_tile(
        coo, channels=channels, itemsize=dtype.itemsize, y_channels=y_channels, backward=True, walk=walk
    )
    bt, cq = tile.edges, tile.channels
    nc = channels // cq
    padded = pl.cdiv(batch, bt) * bt
    in_specs = [
        _spec(bt, coo.dim_x, cq, True) if x is not None else None,
        _spec(bt, coo.dim_y, cq, y_channels) if y is not None else None,
        _spec(bt, coo.dim_out, cq, True),
    ]
    args = [pad_rows(x, padded), pad_rows(y, padded), pad_rows(dz, padded)]
    dx_shape = result_type((padded, coo.dim_x, channels), dtype, x, y, dz) if want_x else None
    dx_spec = _spec(bt, coo.dim_x, cq, True) if want_x else None
    dy_shape = dy_spec = None
    if want_y and y_channels:
        dy_shape, dy_spec = result_type((padded, coo.dim_y, channels), dtype, x, y, dz), _spec(bt, coo.dim_y, cq, True)
    elif want_y:  # a partial sum per channel block, added up below
        dy_shape = result_type((nc, padded, coo.dim_y), dtype, x, y, dz)
        dy_spec = pl.BlockSpec((None, bt, coo.dim_y), lambda b, c, *_: (c, b, 0))
    grid = (padded // bt, nc)
    params = vmem.compiler_params(tile, ("parallel", "parallel"))
    common = dict(out_shape=(dx_shape, dy_shape), compiler_params=params, interpret=interpret or False)
    if not walk:
        kernel = functools.partial(tensor_product_bwd_kernel, vjp_x=coo.vjp_x, vjp_y=coo.vjp_y, y_channels=y_channels)
        call = pl.pallas_call(
            kernel, grid=grid, in_specs=in_specs, out_specs=(dx_spec, dy_spec), name="e3j_tensor_product_bwd", **common
        )
    else:
        kernel = functools.partial(tensor_product_bwd_walk_kernel, y_channels=y_channels)
        scratch = [
            _rows(coo.dim_x, bt, cq, dtype, want_y),
            _rows(coo.dim_y, bt, cq, dtype, want_x),
            _rows(coo.dim_out, bt, cq, dtype),
            _rows(coo.dim_x, bt, cq, dtype, want_x),
            _rows(coo.dim_y, bt, cq, dtype, want_y),
        ]
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=grid, in_specs=in_specs, out_specs=(dx_spec, dy_spec), scratch_shapes=scratch
        )
        call = pl.pallas_call(kernel, grid_spec=grid_spec, name="e3j_tensor_product_bwd", **common)
        args = [records(coo.vjp_x) if want_x else None, records(coo.vjp_y) if want_y else None, *args]
    dx, dy = call(*args)
    res = {}
    if want_x:
        res["x"] = dx[:batch]
    if want_y:
        res["y"] = dy[:batch] if y_channels else functools.reduce(jnp.add, list(dy))[:batch]
    return res
