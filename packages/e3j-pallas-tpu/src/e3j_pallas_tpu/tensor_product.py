"""Pallas TPU tensor-product kernels: records unrolled at trace time, channels on the lanes.

A program owns a ``[bt, D, Cq]`` block of each operand (batch rows on sublanes, a 128-lane channel
block — or all channels when fewer than 128 or not a multiple of 128); Pallas double-buffers the
blocks from HBM. Feature rows ``ref[:, i, :]`` are ``[bt, Cq]`` vectors; the contraction is core's
``CooTable.contract`` (grouped by ``(i0, i1)``, Algorithm 5), so no coefficient is read at run time.
The batch tile is the largest that fits the VMEM budget (:mod:`e3j_pallas_tpu.vmem`); a batch that is
not a multiple of it is padded with zero rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from e3j_core import CooTable, TensorProductCoo

from . import vmem
from ._rows import pad_rows, x32

__all__ = ["tensor_product", "tensor_product_bwd"]


def _spec(rows: int, dim: int, cq: int, channels: bool) -> pl.BlockSpec:
    if channels:
        return pl.BlockSpec((rows, dim, cq), lambda b, c: (b, 0, c))
    return pl.BlockSpec((rows, dim), lambda b, c: (b, 0))


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


def _params(interpret):
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")), (interpret or False)


@x32
def tensor_product(coo: TensorProductCoo, x: jax.Array, y: jax.Array, *, y_channels: bool, interpret=None) -> jax.Array:
    """``z = x ⊗ y``: ``x [B, Dx, C]``, ``y [B, Dy(, C)]`` → ``[B, Dout, C]``.

    ``interpret``: ``None`` to compile for the TPU, or a :class:`pltpu.InterpretParams` to run in
    Pallas's TPU interpreter.
    """
    batch, _, channels = x.shape
    dtype = jnp.result_type(x, y)
    tile = vmem.tensor_product_tile(coo, channels=channels, itemsize=dtype.itemsize, y_channels=y_channels)
    bt, cq = tile.edges, tile.channels
    padded = pl.cdiv(batch, bt) * bt
    table = coo.table

    def kernel(x_ref, y_ref, z_ref):
        rows = table.contract(_loader(x_ref, True), _loader(y_ref, y_channels))
        _store_rows(table, rows, z_ref, jnp.zeros((bt, cq), dtype))

    params, interp = _params(interpret)
    z = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((padded, coo.dim_out, channels), dtype),
        grid=(padded // bt, channels // cq),
        in_specs=[_spec(bt, coo.dim_x, cq, True), _spec(bt, coo.dim_y, cq, y_channels)],
        out_specs=_spec(bt, coo.dim_out, cq, True),
        compiler_params=params,
        interpret=interp,
        name="e3j_tensor_product",
    )(pad_rows(x.astype(dtype), padded), pad_rows(y.astype(dtype), padded))
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
    if not (want_x or want_y):
        return {}
    batch, _, channels = dz.shape
    dtype = jnp.result_type(*[a for a in (x, y, dz) if a is not None])
    tile = vmem.tensor_product_tile(
        coo, channels=channels, itemsize=dtype.itemsize, y_channels=y_channels, backward=True
    )
    bt, cq = tile.edges, tile.channels
    nc = channels // cq
    padded = pl.cdiv(batch, bt) * bt
    inputs, in_specs = [], []
    if want_y:
        inputs.append(x)
        in_specs.append(_spec(bt, coo.dim_x, cq, True))
    if want_x:
        inputs.append(y)
        in_specs.append(_spec(bt, coo.dim_y, cq, y_channels))
    inputs.append(dz)
    in_specs.append(_spec(bt, coo.dim_out, cq, True))
    out_shapes, out_specs = [], []
    if want_x:
        out_shapes.append(jax.ShapeDtypeStruct((padded, coo.dim_x, channels), dtype))
        out_specs.append(_spec(bt, coo.dim_x, cq, True))
    if want_y:
        if y_channels:
            out_shapes.append(jax.ShapeDtypeStruct((padded, coo.dim_y, channels), dtype))
            out_specs.append(_spec(bt, coo.dim_y, cq, True))
        else:  # a partial sum per channel block, added up below
            out_shapes.append(jax.ShapeDtypeStruct((nc, padded, coo.dim_y), dtype))
            out_specs.append(pl.BlockSpec((None, bt, coo.dim_y), lambda b, c: (c, b, 0)))

    def kernel(*refs):
        refs = list(refs)
        x_ref = refs.pop(0) if want_y else None
        y_ref = refs.pop(0) if want_x else None
        dz_row = _loader(refs.pop(0), True)
        zeros = jnp.zeros((bt, cq), dtype)
        if want_x:
            rows = coo.vjp_x.contract(_loader(y_ref, y_channels), dz_row)
            _store_rows(coo.vjp_x, rows, refs.pop(0), zeros)
        if want_y:
            rows = coo.vjp_y.contract(_loader(x_ref, True), dz_row)
            _store_rows(coo.vjp_y, rows, refs.pop(0), zeros, reduce_lanes=not y_channels)

    params, interp = _params(interpret)
    results = list(
        pl.pallas_call(
            kernel,
            out_shape=tuple(out_shapes),
            grid=(padded // bt, nc),
            in_specs=in_specs,
            out_specs=tuple(out_specs),
            compiler_params=params,
            interpret=interp,
            name="e3j_tensor_product_bwd",
        )(*(pad_rows(a.astype(dtype), padded) for a in inputs))
    )
    res = {}
    if want_x:
        res["x"] = results.pop(0)[:batch]
    if want_y:
        dy = results.pop(0)
        res["y"] = dy[:batch] if y_channels else functools.reduce(jnp.add, list(dy))[:batch]
    return res
