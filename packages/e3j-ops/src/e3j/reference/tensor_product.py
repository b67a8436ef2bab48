"""Reference (pure JAX) tensor-product kernels: trace-time unrolled sparse contractions.

Every record of the COO table becomes one multiply-add in the traced program; rows that share
``(i0, i1)`` factor ``a[i1]`` out of their sum (paper Algorithm 5's grouping). XLA fuses the whole
thing into one pass over memory: each input row is read once, each output row written once.

Layouts: operands ``[B, D]`` (broadcast over channels) or ``[B, D, C]``; the output has channels
when requested, and is summed over channels otherwise (the cotangent of a broadcast operand).
"""

from __future__ import annotations

import jax.numpy as jnp

from e3j_core import CooTable, TensorProductCoo

__all__ = ["apply_table", "tensor_product", "tensor_product_bwd"]


def _row(a: jnp.ndarray, i: int, channels: bool, want_channels: bool) -> jnp.ndarray:
    r = a[:, i]
    return r[:, None] if (want_channels and not channels) else r


def apply_table(
    table: CooTable,
    a: jnp.ndarray,
    b: jnp.ndarray,
    *,
    a_channels: bool,
    b_channels: bool,
    out_channels: bool,
) -> jnp.ndarray:
    """``out[:, i0] = Σ_r c_r a[:, i1_r] b[:, i2_r]`` for a bilinear :class:`CooTable`."""
    if table.arity != 2:
        raise ValueError(f"apply_table needs a bilinear table, got arity {table.arity}")
    any_channels = a_channels or b_channels
    dtype = jnp.result_type(a, b)
    batch = a.shape[0]
    channel_shape = (a.shape[-1],) if a_channels else ((b.shape[-1],) if b_channels else ())
    rows: dict[int, jnp.ndarray] = {}
    for i0, i1, records in table.by_i0_i1:
        inner = None
        for i2, c in records:
            term = jnp.asarray(c, dtype) * _row(b, i2, b_channels, any_channels)
            inner = term if inner is None else inner + term
        contribution = _row(a, i1, a_channels, any_channels) * inner
        rows[i0] = contribution if i0 not in rows else rows[i0] + contribution
    zero = jnp.zeros((batch, *channel_shape), dtype)
    out = jnp.stack([rows.get(i0, zero) for i0 in range(table.dims[0])], axis=1)
    if any_channels and not out_channels:
        out = out.sum(-1)
    elif out_channels and not any_channels:
        raise ValueError("an output with channels needs an operand with channels")
    return out


def tensor_product(coo: TensorProductCoo, x: jnp.ndarray, y: jnp.ndarray, *, y_channels: bool) -> jnp.ndarray:
    """``z = x ⊗ y``: ``x [B, Dx, C]``, ``y [B, Dy(, C)]`` → ``[B, Dout, C]``."""
    return apply_table(coo.table, x, y, a_channels=True, b_channels=y_channels, out_channels=True)


def tensor_product_bwd(
    coo: TensorProductCoo,
    x: jnp.ndarray | None,
    y: jnp.ndarray | None,
    dz: jnp.ndarray,
    *,
    outs: tuple[str, ...],
    y_channels: bool,
) -> dict[str, jnp.ndarray]:
    """Cotangents ``dx = vjp_x(y, dz)`` and/or ``dy = vjp_y(x, dz)`` (paper Eq. 15)."""
    res = {}
    if "x" in outs:
        res["x"] = apply_table(coo.vjp_x, y, dz, a_channels=y_channels, b_channels=True, out_channels=True)
    if "y" in outs:
        res["y"] = apply_table(coo.vjp_y, x, dz, a_channels=True, b_channels=True, out_channels=y_channels)
    return res
