"""Radial basis: Bessel functions times a smooth polynomial cutoff envelope.

``bessel_basis(r, n, cutoff)[..., k] = sqrt(2/rc) · sin((k+1)·π·r/rc) / r`` (``k = 0 … n-1``) and
``polynomial_envelope(r, cutoff, p)`` ``= 1 - (p+1)(p+2)/2·x^p + p(p+2)·x^(p+1) - p(p+1)/2·x^(p+2)``
with ``x = r/rc``, zero for ``r >= rc``: it goes to zero with ``p - 1`` continuous derivatives at the
cutoff (the DimeNet envelope MACE and NequIP use). :func:`radial_embedding` is their product
``[E, n]``, zero on masked (padding) edges with zero gradient there.

>>> import jax.numpy as jnp
>>> emb = radial_embedding(jnp.array([1.0, 5.0, 6.0], jnp.float32), num_basis=2, cutoff=5.0)
>>> [round(float(v), 4) for v in emb[0]], bool((emb[1:] == 0).all())
([0.3713, 0.6008], True)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = ["bessel_basis", "polynomial_envelope", "radial_embedding"]


def bessel_basis(r: jax.Array, num_basis: int, cutoff: float) -> jax.Array:
    """``[...] -> [..., num_basis]``; ``r`` must be > 0 where it is used (mask the rest)."""
    n = jnp.arange(1, num_basis + 1, dtype=r.dtype)
    return math.sqrt(2.0 / cutoff) * jnp.sin(n * (math.pi / cutoff) * r[..., None]) / r[..., None]


def polynomial_envelope(r: jax.Array, cutoff: float, p: int = 6) -> jax.Array:
    """``[...] -> [...]``: 1 at ``r = 0``, smoothly 0 at and beyond ``cutoff``."""
    x = r / cutoff
    env = 1.0 - (p + 1) * (p + 2) / 2 * x**p + p * (p + 2) * x ** (p + 1) - p * (p + 1) / 2 * x ** (p + 2)
    return jnp.where(x < 1.0, env, 0.0)


def radial_embedding(
    r: jax.Array, num_basis: int, cutoff: float, p: int = 6, mask: jax.Array | None = None
) -> jax.Array:
    """``bessel_basis · polynomial_envelope``: ``r [E] -> [E, num_basis]``; rows where ``mask`` is False are 0."""
    valid = r > 0 if mask is None else mask & (r > 0)
    safe = jnp.where(valid, r, cutoff)  # so that neither value nor gradient is NaN on masked rows
    out = bessel_basis(safe, num_basis, cutoff) * polynomial_envelope(safe, cutoff, p)[..., None]
    return jnp.where(valid[..., None], out, 0.0)
