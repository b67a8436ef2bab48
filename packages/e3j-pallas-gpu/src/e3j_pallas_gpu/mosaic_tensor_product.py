"""Mosaic GPU tensor-product kernels (Hopper and newer) with trace-time Clebsch–Gordan specialization.

The records of core's COO table are unrolled into the program (``CooTable.contract``): no
coefficient or index is loaded at run time. A program — one warpgroup — owns a tile of ``rows``
batch rows × ``width`` channels with ``rows · width = 128`` (one element per thread, :class:`Lanes`):
one row of 128 channels, or for ``C < 128`` ``128 / width`` whole rows of ``width`` channels
(``C`` rounded up to a power of two ≥ 4). The TMA stages the
tile's operand blocks ``x[rows, :, lanes]`` (and a per-channel ``y``) in shared memory, each output
row is accumulated in registers and written to shared memory as soon as its records are done, and
the TMA stores the output block.

A broadcast ``y`` is read as scalars on one-row tiles; on several-row tiles it is broadcast over
the channels in XLA first (Mosaic's strided layout has no per-row broadcast), and its cotangent is
formed per channel and summed in XLA. On one-row tiles that cotangent is reduced over the lanes in
registers, then over channel blocks.

Layouts are e3j's: ``x [B, Dx, C]``, ``y [B, Dy]`` or ``[B, Dy, C]``, ``z [B, Dout, C]``; float32
(Mosaic GPU's TMA has no float64). Channel counts above 128 are zero-padded to a multiple of 128,
those below to ``width``, and a batch that is not a multiple of ``rows`` is padded with zero rows
(copies; none otherwise).

>>> import numpy as np
>>> from e3j_core import tensor_product_coo
>>> coo = tensor_product_coo("0e + 1o", "0e + 1o", filter="0e + 1o")
>>> x, y = np.ones((2, 4, 128), np.float32), np.ones((2, 4), np.float32)
>>> tensor_product(coo, x, y, y_channels=False, interpret=True).shape == (2, coo.dim_out, 128)
True
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from e3j_core import CooTable, TensorProductCoo

from ._blocks import pad_rows
from ._mosaic import Lanes, check_dtype, flush, interpret_params, launch_grid, pad_channels, stage, strided, zeros

__all__ = ["tensor_product", "tensor_product_bwd"]


class _Tile(NamedTuple):
    rows: int  # batch rows per program
    lanes: int  # channels per program
    channels: int  # the (padded) channel count of the operands
    batch: int  # the (padded) batch

    @classmethod
    def of(cls, batch: int, channels: int) -> _Tile:
        lanes = Lanes.of(channels)
        return cls(lanes.rows, lanes.width, lanes.channels, -(-batch // lanes.rows) * lanes.rows)

    @property
    def grid(self) -> tuple[int, int]:
        return self.batch // self.rows, self.channels // self.lanes

    def pad(self, a: jax.Array | None, channels: bool = True) -> jax.Array | None:
        """``a`` zero-padded to the tile's batch (and channels)."""
        if a is None:
            return None
        if channels:
            a = pad_channels(a, self.channels)
        return pad_rows(a, self.batch)

    def unpad(self, a: jax.Array, batch: int, channels: int) -> jax.Array:
        return a[:batch, ..., :channels] if a.shape[0] != batch or a.shape[-1] != channels else a


def _rows(ref):
    """Feature row ``i`` of a ``[rows, D, lanes]`` shared-memory block, as a ``[rows, lanes]`` value."""
    return functools.cache(lambda i: strided(ref[:, i, :]))


def _store_rows(table: CooTable, rows: dict, ref) -> None:
    """Rows of ``ref`` that no record writes are zero."""
    for i in range(table.dims[0]):
        if i not in rows:
            ref[:, i, :] = zeros(ref.dtype, (ref.shape[0], ref.shape[2]))


def _blocks(tile: _Tile):
    b, c = jax.lax.axis_index("batch"), jax.lax.axis_index("lanes")
    return b, c, pl.ds(b * tile.rows, tile.rows), pl.ds(c * tile.lanes, tile.lanes)


def tensor_product_kernel(x_gmem, y_gmem, z_gmem, *, x_smem, y_smem, z_smem, barriers, table, tile, y_scalars):
    """One tile of ``z = x ⊗ y``; ``y_scalars``: a broadcast ``y`` read as scalars (``y_smem`` is ``None``)."""
    b, _, rows, lanes = _blocks(tile)
    staged = [(x_gmem.at[rows, :, lanes], x_smem, barriers.at[0])]
    if not y_scalars:
        staged.append((y_gmem.at[rows, :, lanes], y_smem, barriers.at[1]))
    stage(staged)
    y_row = functools.cache(lambda i: y_gmem[b, i]) if y_scalars else _rows(y_smem)

    def store(i0, v):  # each row leaves the registers as soon as its records are done
        z_smem[:, i0, :] = v.astype(z_smem.dtype)

    _store_rows(table, table.contract(_rows(x_smem), y_row, on_row=store), z_smem)
    flush([(z_smem, z_gmem.at[rows, :, lanes])])


def _y_operand(y: jax.Array, tile: _Tile, y_channels: bool, channels: int) -> tuple[jax.Array, bool]:
    """``y`` as the kernel reads it, and whether it is read as scalars (a broadcast y on one-row tiles)."""
    if y_channels:
        return tile.pad(y), False
    if tile.rows == 1:
        return tile.pad(y, channels=False), True
    return tile.pad(jnp.broadcast_to(y[..., None], (*y.shape, channels))), False


def tensor_product(
    coo: TensorProductCoo, x: jax.Array, y: jax.Array, *, y_channels: bool, interpret=False
) -> jax.Array:
    """``z = x ⊗ y`` (see the module docstring for layouts); ``interpret`` runs Mosaic's GPU interpreter."""
    batch, _, channels = x.shape
    dtype = check_dtype(jnp.result_type(x, y), "tensor_product")
    tile = _Tile.of(batch, channels)
    y_op, y_scalars = _y_operand(y, tile, y_channels, channels)

    def smem(rows):
        return plgpu.SMEM((tile.rows, rows, tile.lanes), dtype)

    scratch = {"x_smem": smem(coo.dim_x), "z_smem": smem(coo.dim_out), "barriers": plgpu.Barrier(num_barriers=2)}
    if not y_scalars:
        scratch["y_smem"] = smem(coo.dim_y)
    body = functools.partial(
        tensor_product_kernel,
        table=coo.table,
        tile=tile,
        y_scalars=y_scalars,
        **({"y_smem": None} if y_scalars else {}),
    )
    z = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((tile.batch, coo.dim_out, tile.channels), dtype),
        **launch_grid(*tile.grid, ("batch", "lanes")),
        scratch_types=scratch,
        interpret=interpret_params(interpret),
        kernel_name="e3j_mosaic_tensor_product",
    )(tile.pad(x), y_op)
    return tile.unpad(z, batch, channels)


def tensor_product_bwd_kernel(
    *refs, x_smem, y_smem, dz_smem, dx_smem, dy_smem, barriers, table, vjp_x, vjp_y, tile, y_scalars, outs
):
    """One tile of ``dx = vjp_x(y, dz)`` and/or ``dy = vjp_y(x, dz)``.

    ``refs`` are ``x`` (if ``dy`` is asked for), ``y`` (if ``dx`` is), ``dz``, then ``dx`` and/or
    ``dy`` (``[nc, B, Dy]``, per channel block, when ``y_scalars``); unused scratch refs are ``None``.
    """
    want_x, want_y = "x" in outs, "y" in outs
    refs = list(refs)
    x_gmem = refs.pop(0) if want_y else None
    y_gmem = refs.pop(0) if want_x else None
    dz_gmem = refs.pop(0)
    dx_gmem = refs.pop(0) if want_x else None
    dy_gmem = refs.pop(0) if want_y else None
    b, c, rows, lanes = _blocks(tile)
    staged = [(dz_gmem.at[rows, :, lanes], dz_smem, barriers.at[0])]
    if want_y:
        staged.append((x_gmem.at[rows, :, lanes], x_smem, barriers.at[1]))
    if want_x and not y_scalars:
        staged.append((y_gmem.at[rows, :, lanes], y_smem, barriers.at[2]))
    stage(staged)
    y_row = None
    if want_x:
        y_row = functools.cache(lambda i: y_gmem[b, i]) if y_scalars else _rows(y_smem)
    # one pass by output row: each dz row is live for its row only, beside the dx and dy accumulators
    dx, dy = table.contract_vjp(
        _rows(x_smem) if want_y else None,
        y_row,
        _rows(dz_smem),
        grads=tuple(g for g, want in (("a", want_x), ("b", want_y)) if want),
    )
    dtype = dz_smem.dtype
    stores = []
    for rows_out, table_out, ref, gref, want in (
        (dx, vjp_x, dx_smem, dx_gmem, want_x),
        (dy, vjp_y, dy_smem, dy_gmem, want_y),
    ):
        if want and ref is not None:
            for i, v in rows_out.items():
                ref[:, i, :] = v.astype(dtype)
            _store_rows(table_out, rows_out, ref)
            stores.append((ref, gref.at[rows, :, lanes]))
    if want_y and y_scalars:  # one-row tile: summed over the lanes in registers, one scalar per row
        for i in range(vjp_y.dims[0]):
            dy_gmem[c, b, i] = jnp.sum(dy[i]).astype(dtype) if i in dy else jnp.zeros((), dtype)
    if stores:
        flush(stores)


def tensor_product_bwd(
    coo: TensorProductCoo,
    x: jax.Array | None,
    y: jax.Array | None,
    dz: jax.Array,
    *,
    outs: tuple[str, ...],
    y_channels: bool,
    interpret=False,
) -> dict[str, jax.Array]:
    """Cotangents ``dx = vjp_x(y, dz)`` and/or ``dy = vjp_y(x, dz)`` in one pass over ``dz``."""
    outs = tuple(o for o in ("x", "y") if o in outs)
    want_x, want_y = "x" in outs, "y" in outs
    batch, _, channels = dz.shape
    dtype = check_dtype(jnp.result_type(*[a for a in (x, y, dz) if a is not None]), "tensor_product_bwd")
    tile = _Tile.of(batch, channels)
    y_scalars = not y_channels and tile.rows == 1
    inputs = [tile.pad(x)] if want_y else []
    if want_x:
        inputs.append(_y_operand(y, tile, y_channels, channels)[0])
    inputs.append(tile.pad(dz))
    nc = tile.grid[1]
    out_type = []
    if want_x:
        out_type.append(jax.ShapeDtypeStruct((tile.batch, coo.dim_x, tile.channels), dtype))
    if want_y:
        shape = (nc, tile.batch, coo.dim_y) if y_scalars else (tile.batch, coo.dim_y, tile.channels)
        out_type.append(jax.ShapeDtypeStruct(shape, dtype))
    smem = {
        "x_smem": (want_y, coo.dim_x),
        "y_smem": (want_x and not y_scalars, coo.dim_y),
        "dz_smem": (True, coo.dim_out),
        "dx_smem": (want_x, coo.dim_x),
        "dy_smem": (want_y and not y_scalars, coo.dim_y),
    }
    scratch = {k: plgpu.SMEM((tile.rows, d, tile.lanes), dtype) for k, (need, d) in smem.items() if need}
    scratch["barriers"] = plgpu.Barrier(num_barriers=3)
    body = functools.partial(
        tensor_product_bwd_kernel,
        table=coo.table,
        vjp_x=coo.vjp_x,
        vjp_y=coo.vjp_y,
        tile=tile,
        y_scalars=y_scalars,
        outs=outs,
        **{k: None for k, (need, _) in smem.items() if not need},
    )
    results = list(
        plgpu.kernel(
            body,
            out_type=tuple(out_type),
            **launch_grid(*tile.grid, ("batch", "lanes")),
            scratch_types=scratch,
            interpret=interpret_params(interpret),
            kernel_name="e3j_mosaic_tensor_product_bwd",
        )(*inputs)
    )
    res = {}
    if want_x:
        res["x"] = tile.unpad(results.pop(0), batch, channels)
    if want_y:
        dy = results.pop(0)
        if y_scalars:
            res["y"] = functools.reduce(jnp.add, list(dy))[:batch]
        elif y_channels:
            res["y"] = tile.unpad(dy, batch, channels)
        else:  # several-row tiles: formed per channel, summed over channels here
            res["y"] = jnp.sum(dy[:batch], axis=-1)
    return res
