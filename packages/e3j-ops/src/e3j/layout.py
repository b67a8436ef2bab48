"""Conversions between e3j's ``[batch, D, C]`` layout and e3nn's flat ``mul_ir`` layout.

For irreps ``I = m1 x ir1 + m2 x ir2 + ...`` and ``C`` channels, the e3nn irreps are
``(m1·C) x ir1 + (m2·C) x ir2 + ...`` with multiplicity index ``u·C + c`` (copy-major): e.g.
``"0e + 1o"`` with ``C`` channels is e3nn's ``"Cx0e + Cx1o"``.

>>> import jax.numpy as jnp
>>> x = jnp.arange(2 * 4 * 3.0).reshape(2, 4, 3)
>>> mul_ir_irreps("0e + 1o", 3)
3x0e+3x1o
>>> flat = to_mul_ir(x, "0e + 1o")
>>> flat.shape, bool((from_mul_ir(flat, "0e + 1o", 3) == x).all())
((2, 12), True)
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp

from e3j_core import Irreps, as_irreps

from ._checks import check_array, check_positive_int

__all__ = ["from_mul_ir", "irrep_blocks", "mul_ir_irreps", "to_mul_ir"]


def mul_ir_irreps(irreps, channels: int) -> Irreps:
    """The e3nn irreps of the flat layout of ``irreps`` with ``channels`` channels."""
    channels = check_positive_int("channels", channels)
    return Irreps([(mul * channels, ir) for mul, ir in as_irreps(irreps, "irreps")])


def to_mul_ir(x: jax.Array, irreps) -> jax.Array:
    """``[..., D, C] -> [..., C·D]`` in e3nn's ``mul_ir`` layout."""
    irreps = as_irreps(irreps, "irreps")
    check_array("x", x)
    x = jnp.asarray(x)
    if x.ndim < 2 or x.shape[-2] != irreps.dim:
        raise ValueError(f"x must be [..., D={irreps.dim}, C] for {irreps}, got {x.shape}")
    channels = x.shape[-1]
    parts = []
    for (mul, ir), block in zip(irreps, irrep_blocks(x, irreps)):
        block = jnp.swapaxes(block, -1, -2)  # [..., mul, C, dim]
        parts.append(block.reshape(*x.shape[:-2], mul * channels * ir.dim))
    return jnp.concatenate(parts, axis=-1) if parts else jnp.zeros((*x.shape[:-2], 0), x.dtype)


def from_mul_ir(x: jax.Array, irreps, channels: int) -> jax.Array:
    """``[..., C·D] -> [..., D, C]``, the inverse of :func:`to_mul_ir`."""
    irreps = as_irreps(irreps, "irreps")
    channels = check_positive_int("channels", channels)
    check_array("x", x)
    x = jnp.asarray(x)
    if x.ndim < 1 or x.shape[-1] != irreps.dim * channels:
        raise ValueError(f"x must be [..., {irreps.dim * channels}] for {irreps} x {channels} channels, got {x.shape}")
    # one split, as in irrep_blocks: its backward is one concatenation, not a pad per block
    bounds = list(itertools.accumulate(mul * channels * ir.dim for mul, ir in irreps))[:-1]
    parts = []
    for (mul, ir), block in zip(irreps, jnp.split(x, bounds, axis=-1) if len(irreps) else []):
        block = block.reshape(*x.shape[:-1], mul, channels, ir.dim)
        block = jnp.swapaxes(block, -1, -2)  # [..., mul, dim, C]
        parts.append(block.reshape(*x.shape[:-1], mul * ir.dim, channels))
    return jnp.concatenate(parts, axis=-2) if parts else jnp.zeros((*x.shape[:-1], 0, channels), x.dtype)


def irrep_blocks(x: jax.Array, irreps) -> list[jax.Array]:
    """``[..., D, C] -> [[..., mul, dim, C], ...]``: one array per block ``mul x ir`` of ``irreps``.

    One split of the row axis, not one slice per block: a split's backward is one concatenation,
    where each slice's is a pad and an add of the whole array (on XLA's CPU, a pass per block).

    >>> import jax.numpy as jnp
    >>> [b.shape for b in irrep_blocks(jnp.ones((4, 5, 3)), "2x0e + 1o + 0x2e")]
    [(4, 2, 1, 3), (4, 1, 3, 3), (4, 0, 5, 3)]
    """
    irreps = as_irreps(irreps, "irreps")
    check_array("x", x)
    x = jnp.asarray(x)
    if x.ndim < 2 or x.shape[-2] != irreps.dim:
        raise ValueError(f"x must be [..., D={irreps.dim}, C] for {irreps}, got {x.shape}")
    bounds = list(itertools.accumulate(mul * ir.dim for mul, ir in irreps))[:-1]
    parts = jnp.split(x, bounds, axis=-2) if len(irreps) else []
    return [p.reshape(*x.shape[:-2], mul, ir.dim, x.shape[-1]) for (mul, ir), p in zip(irreps, parts)]
