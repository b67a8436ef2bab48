"""Mosaic GPU tensor-product kernels (Hopper and newer) with trace-time Clebsch–Gordan specialization.

The records of core's COO table are unrolled into the program (``CooTable.contract``): no
coefficient or index is loaded at run time. A program — one warpgroup — owns one batch row and a
block of :data:`~e3j_pallas_gpu._mosaic.LANES` channels: the TMA stages the row's operand block
``x[b, :, lanes]`` (and a per-channel ``y[b, :, lanes]``) in shared memory, each output row is
accumulated in registers (one channel per thread) and written to shared memory as soon as its
records are done, and the TMA stores the output block. A broadcast ``y`` is read as scalars.

Layouts are e3j's: ``x [B, Dx, C]``, ``y [B, Dy]`` or ``[B, Dy, C]``, ``z [B, Dout, C]``; float32
(Mosaic GPU's TMA has no float64). Channel counts that are not a multiple of 128 are zero-padded.

The backward kernel streams ``(x, y, dz)`` once and writes both cotangents (paper Eq. 15); the
cotangent of a broadcast ``y`` is reduced over the program's lanes in registers, then over channel
blocks.

>>> import numpy as np
>>> from e3j_core import tensor_product_coo
>>> coo = tensor_product_coo("0e + 1o", "0e + 1o", filter="0e + 1o")
>>> x, y = np.ones((2, 4, 128), np.float32), np.ones((2, 4), np.float32)
>>> tensor_product(coo, x, y, y_channels=False, interpret=True).shape
(2, 4, 128)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from e3j_core import CooTable, TensorProductCoo

from ._mosaic import LANES, check_dtype, interpret_params, pad_channels, padded_channels, zeros

__all__ = ["tensor_product", "tensor_product_bwd"]


def _stage(pairs) -> None:
    """TMA copies ``(gmem_slice, smem, barrier)``, all issued before any is waited for."""
    for src, dst, barrier in pairs:
        plgpu.copy_gmem_to_smem(src, dst, barrier)
    for _, _, barrier in pairs:
        plgpu.barrier_wait(barrier)


def _flush(pairs) -> None:
    """TMA stores ``(smem, gmem_slice)`` of the rows this warpgroup wrote to shared memory."""
    plgpu.commit_smem()
    for src, dst in pairs:
        plgpu.copy_smem_to_gmem(src, dst)
    plgpu.wait_smem_to_gmem(0)


def _store_rows(table: CooTable, rows: dict, ref, dtype) -> None:
    for i in range(table.dims[0]):
        if i not in rows:
            ref[i, :] = zeros(dtype)


def tensor_product_kernel(x_gmem, y_gmem, z_gmem, *, x_smem, y_smem, z_smem, barriers, table, y_channels):
    """One batch row × ``LANES`` channels of ``z = x ⊗ y`` (``y_smem`` is ``None`` for a broadcast y)."""
    b, c = jax.lax.axis_index("batch"), jax.lax.axis_index("lanes")
    lanes = pl.ds(c * LANES, LANES)
    staged = [(x_gmem.at[b, :, lanes], x_smem, barriers.at[0])]
    if y_channels:
        staged.append((y_gmem.at[b, :, lanes], y_smem, barriers.at[1]))
    _stage(staged)
    x_row = functools.cache(lambda i: x_smem[i, :])
    y_row = functools.cache((lambda i: y_smem[i, :]) if y_channels else (lambda i: y_gmem[b, i]))

    def store(i0, v):  # each row leaves the registers as soon as its records are done
        z_smem[i0, :] = v.astype(z_smem.dtype)

    _store_rows(table, table.contract(x_row, y_row, on_row=store), z_smem, z_smem.dtype)
    _flush([(z_smem, z_gmem.at[b, :, lanes])])


def tensor_product(
    coo: TensorProductCoo, x: jax.Array, y: jax.Array, *, y_channels: bool, interpret=False
) -> jax.Array:
    """``z = x ⊗ y`` (see the module docstring for layouts); ``interpret`` runs Mosaic's GPU interpreter."""
    batch, _, channels = x.shape
    dtype = check_dtype(jnp.result_type(x, y), "tensor_product")
    cp = padded_channels(channels)
    scratch = {
        "x_smem": plgpu.SMEM((coo.dim_x, LANES), dtype),
        "z_smem": plgpu.SMEM((coo.dim_out, LANES), dtype),
        "barriers": plgpu.Barrier(num_barriers=2),
    }
    if y_channels:
        scratch["y_smem"] = plgpu.SMEM((coo.dim_y, LANES), dtype)
    body = functools.partial(_with_defaults(tensor_product_kernel, y_smem=None), table=coo.table, y_channels=y_channels)
    z = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((batch, coo.dim_out, cp), dtype),
        grid=(batch, cp // LANES),
        grid_names=("batch", "lanes"),
        scratch_types=scratch,
        interpret=interpret_params(interpret),
        kernel_name="e3j_mosaic_tensor_product",
    )(pad_channels(x, cp), pad_channels(y, cp) if y_channels else y)
    return z[..., :channels] if cp != channels else z


def tensor_product_bwd_kernel(
    *refs, x_smem, y_smem, dz_smem, dx_smem, dy_smem, barriers, table, vjp_x, vjp_y, y_channels, want_x, want_y
):
    """One batch row × ``LANES`` channels of ``dx = vjp_x(y, dz)`` and/or ``dy = vjp_y(x, dz)``.

    ``refs`` are ``x`` (if ``want_y``), ``y`` (if ``want_x``), ``dz``, then ``dx`` and/or ``dy``
    (``[nc, B, Dy]`` per channel block for a broadcast ``y``).
    """
    refs = list(refs)
    x_gmem = refs.pop(0) if want_y else None
    y_gmem = refs.pop(0) if want_x else None
    dz_gmem = refs.pop(0)
    dx_gmem = refs.pop(0) if want_x else None
    dy_gmem = refs.pop(0) if want_y else None
    b, c = jax.lax.axis_index("batch"), jax.lax.axis_index("lanes")
    lanes = pl.ds(c * LANES, LANES)
    staged = [(dz_gmem.at[b, :, lanes], dz_smem, barriers.at[0])]
    if want_y:
        staged.append((x_gmem.at[b, :, lanes], x_smem, barriers.at[1]))
    if want_x and y_channels:
        staged.append((y_gmem.at[b, :, lanes], y_smem, barriers.at[2]))
    _stage(staged)
    x_row = functools.cache(lambda i: x_smem[i, :]) if want_y else None
    if want_x:
        y_row = functools.cache((lambda i: y_smem[i, :]) if y_channels else (lambda i: y_gmem[b, i]))
    else:
        y_row = None
    # one pass by output row: each dz row is live for its row only, beside the dx and dy accumulators
    dx, dy = table.contract_vjp(
        x_row,
        y_row,
        functools.cache(lambda i: dz_smem[i, :]),
        grads=tuple(g for g, want in (("a", want_x), ("b", want_y)) if want),
    )
    dtype = dz_smem.dtype
    flush = []
    if want_x:
        for i, v in dx.items():
            dx_smem[i, :] = v.astype(dtype)
        _store_rows(vjp_x, dx, dx_smem, dtype)
        flush.append((dx_smem, dx_gmem.at[b, :, lanes]))
    if want_y and y_channels:
        for i, v in dy.items():
            dy_smem[i, :] = v.astype(dtype)
        _store_rows(vjp_y, dy, dy_smem, dtype)
        flush.append((dy_smem, dy_gmem.at[b, :, lanes]))
    elif want_y:  # summed over the block's lanes in registers, one scalar per row
        for i in range(vjp_y.dims[0]):
            dy_gmem[c, b, i] = jnp.sum(dy[i]).astype(dtype) if i in dy else jnp.zeros((), dtype)
    if flush:
        _flush(flush)


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
    want_x, want_y = "x" in outs, "y" in outs
    batch, _, channels = dz.shape
    dtype = check_dtype(jnp.result_type(*[a for a in (x, y, dz) if a is not None]), "tensor_product_bwd")
    cp = padded_channels(channels)
    nc = cp // LANES
    inputs = ([pad_channels(x, cp)] if want_y else []) + ([pad_channels(y, cp) if y_channels else y] if want_x else [])
    inputs.append(pad_channels(dz, cp))
    out_type = []
    if want_x:
        out_type.append(jax.ShapeDtypeStruct((batch, coo.dim_x, cp), dtype))
    if want_y:
        shape = (batch, coo.dim_y, cp) if y_channels else (nc, batch, coo.dim_y)
        out_type.append(jax.ShapeDtypeStruct(shape, dtype))
    smem = {
        "x_smem": (want_y, coo.dim_x),
        "y_smem": (want_x and y_channels, coo.dim_y),
        "dz_smem": (True, coo.dim_out),
        "dx_smem": (want_x, coo.dim_x),
        "dy_smem": (want_y and y_channels, coo.dim_y),
    }
    scratch = {k: plgpu.SMEM((rows, LANES), dtype) for k, (need, rows) in smem.items() if need}
    scratch["barriers"] = plgpu.Barrier(num_barriers=3)
    body = functools.partial(
        _with_defaults(tensor_product_bwd_kernel, **{k: None for k, (need, _) in smem.items() if not need}),
        table=coo.table,
        vjp_x=coo.vjp_x,
        vjp_y=coo.vjp_y,
        y_channels=y_channels,
        want_x=want_x,
        want_y=want_y,
    )
    results = plgpu.kernel(
        body,
        out_type=tuple(out_type),
        grid=(batch, nc),
        grid_names=("batch", "lanes"),
        scratch_types=scratch,
        interpret=interpret_params(interpret),
        kernel_name="e3j_mosaic_tensor_product_bwd",
    )(*inputs)
    results = list(results)
    res = {}
    if want_x:
        res["x"] = results.pop(0)[..., :channels]
    if want_y:
        dy = results.pop(0)
        res["y"] = dy[..., :channels] if y_channels else functools.reduce(jnp.add, list(dy))
    return res


def _with_defaults(fn, **defaults):
    """``fn`` with keyword-only scratch refs that a configuration does not allocate bound to ``None``."""
    return functools.partial(fn, **defaults) if defaults else fn
