"""Pallas GPU (Triton) tensor-product kernels with trace-time Clebsch–Gordan specialization.

The records of core's COO table are unrolled into the program (``CooTable.contract``): no
coefficient or index is loaded at run time, only operand rows. A program owns a tile of ``bt`` batch
rows × ``cb`` channels (channels on the fast axis), loads each operand row once, and writes each
output row as soon as its group of records is done (records are sorted by output row).

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

from ._blocks import channel_block, num_warps, pad_rows, row_block

__all__ = ["tensor_product", "tensor_product_bwd"]


def _tiles(batch: int, channels: int) -> tuple[int, int, int, int]:
    cb = channel_block(channels)
    bt = row_block(cb, batch)
    return cb, bt, pl.cdiv(batch, bt) * bt, channels // cb


def _operand_spec(shape_tail: tuple[int, ...], channels: bool, bt: int, cb: int) -> pl.BlockSpec:
    if channels:
        return pl.BlockSpec((bt, *shape_tail, cb), lambda b, c: (b, 0, c))
    return pl.BlockSpec((bt, *shape_tail), lambda b, c: (b, 0))


def _loader(ref, channels: bool):
    """Row ``i`` of a ``[bt, D(, cb)]`` block as a ``[bt, cb]`` (or broadcastable ``[bt, 1]``) value."""
    if channels:
        return functools.cache(lambda i: ref[:, i, :])
    return functools.cache(lambda i: ref[:, i][:, None])


def _store(table: CooTable, rows: dict, store, zeros) -> None:
    for i0 in range(table.dims[0]):
        store(i0, rows[i0] if i0 in rows else zeros)


def tensor_product(
    coo: TensorProductCoo, x: jax.Array, y: jax.Array, *, y_channels: bool, interpret: bool = False
) -> jax.Array:
    """``z = x ⊗ y`` (see the module docstring for layouts)."""
    batch, _, channels = x.shape
    dtype = jnp.result_type(x, y)
    cb, bt, padded, nc = _tiles(batch, channels)
    table = coo.table

    def kernel(x_ref, y_ref, z_ref):
        def store(i0, v):
            z_ref[:, i0, :] = v.astype(z_ref.dtype)

        # each row stored as soon as its records are done: one output row live at a time
        rows = table.contract(_loader(x_ref, True), _loader(y_ref, y_channels), on_row=store)
        zeros = jnp.zeros((bt, cb), dtype)
        for i0 in range(table.dims[0]):
            if i0 not in rows:
                store(i0, zeros)

    z = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((padded, coo.dim_out, channels), dtype),
        grid=(padded // bt, nc),
        in_specs=[_operand_spec((coo.dim_x,), True, bt, cb), _operand_spec((coo.dim_y,), y_channels, bt, cb)],
        out_specs=pl.BlockSpec((bt, coo.dim_out, cb), lambda b, c: (b, 0, c)),
        compiler_params=plt.CompilerParams(num_warps=num_warps(bt * cb), num_stages=1),
        interpret=interpret,
        name="e3j_tensor_product",
    )(pad_rows(x.astype(dtype), padded), pad_rows(y.astype(dtype), padded))
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
    outs = tuple(o for o in ("x", "y") if o in outs)
    if not outs:
        return {}
    batch, _, channels = dz.shape
    dtype = jnp.result_type(*[a for a in (x, y, dz) if a is not None])
    cb, bt, padded, nc = _tiles(batch, channels)
    want_x, want_y = "x" in outs, "y" in outs
    inputs, in_specs = [], []
    if want_y:  # dy reads x
        inputs.append(x)
        in_specs.append(_operand_spec((coo.dim_x,), True, bt, cb))
    if want_x:  # dx reads y
        inputs.append(y)
        in_specs.append(_operand_spec((coo.dim_y,), y_channels, bt, cb))
    inputs.append(dz)
    in_specs.append(_operand_spec((coo.dim_out,), True, bt, cb))
    out_shapes, out_specs = [], []
    if want_x:
        out_shapes.append(jax.ShapeDtypeStruct((padded, coo.dim_x, channels), dtype))
        out_specs.append(pl.BlockSpec((bt, coo.dim_x, cb), lambda b, c: (b, 0, c)))
    if want_y:
        if y_channels:
            out_shapes.append(jax.ShapeDtypeStruct((padded, coo.dim_y, channels), dtype))
            out_specs.append(pl.BlockSpec((bt, coo.dim_y, cb), lambda b, c: (b, 0, c)))
        else:  # per channel block; summed over blocks below
            out_shapes.append(jax.ShapeDtypeStruct((nc, padded, coo.dim_y), dtype))
            out_specs.append(pl.BlockSpec((None, bt, coo.dim_y), lambda b, c: (c, b, 0)))

    def kernel(*refs):
        refs = list(refs)
        x_ref = refs.pop(0) if want_y else None
        y_ref = refs.pop(0) if want_x else None
        dz_ref = refs.pop(0)
        # one pass over the records by output row: each dz row is live for its row only, beside the
        # dx and dy accumulators (grouping by dx's and dy's rows would keep all of dz live)
        dx_rows, dy_rows = coo.table.contract_vjp(
            _loader(x_ref, True) if want_y else None,
            _loader(y_ref, y_channels) if want_x else None,
            _loader(dz_ref, True),
            grads=tuple(g for g, want in (("a", want_x), ("b", want_y)) if want),
        )
        zeros = jnp.zeros((bt, cb), dtype)
        if want_x:
            dx_ref = refs.pop(0)

            def store_x(i, v):
                dx_ref[:, i, :] = v.astype(dx_ref.dtype)

            _store(coo.vjp_x, dx_rows, store_x, zeros)
        if want_y:
            dy_ref = refs.pop(0)
            if y_channels:

                def store_y(i, v):
                    dy_ref[:, i, :] = v.astype(dy_ref.dtype)

            else:

                def store_y(i, v):
                    dy_ref[:, i] = jnp.sum(v, axis=1).astype(dy_ref.dtype)

            _store(coo.vjp_y, dy_rows, store_y, zeros)

    results = pl.pallas_call(
        kernel,
        out_shape=tuple(out_shapes),
        grid=(padded // bt, nc),
        in_specs=in_specs,
        out_specs=tuple(out_specs),
        compiler_params=plt.CompilerParams(num_warps=num_warps(bt * cb), num_stages=1),
        interpret=interpret,
        name="e3j_tensor_product_bwd",
    )(*(pad_rows(a.astype(dtype), padded) for a in inputs))
    results = list(results)
    res = {}
    if want_x:
        res["x"] = results.pop(0)[:batch]
    if want_y:
        dy = results.pop(0)
        res["y"] = dy[:batch] if y_channels else functools.reduce(jnp.add, list(dy))[:batch]
    return res
