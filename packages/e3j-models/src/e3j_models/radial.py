"""Radial basis: Bessel functions times a smooth polynomial cutoff envelope.

``bessel_basis(r, n, cutoff)[..., k] = sqrt(2/rc) · sin((k+1)·π·r/rc) / r`` (``k = 0 … n-1``) and
``polynomial_envelope(r, cutoff, p)`` ``= 1 - (p+1)(p+2)/2·x^p + p(p+2)·x^(p+1) - p(p+1)/2·x^(p+2)``
with ``x = r/rc``, zero for ``r >= rc``: its value and first two derivatives vanish at the cutoff
for every ``p`` (twice continuously differentiable there; the third derivative jumps), and ``p``
sets how early it falls (the DimeNet envelope MACE and NequIP use). :func:`radial_embedding` is their product
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

from ._checks import check_array, check_positive_int, check_positive_real, float_dtype

__all__ = ["bessel_basis", "polynomial_envelope", "radial_embedding"]


def _check(r, cutoff, num_basis=None, p=None) -> None:
    # static arguments and abstract shapes/dtypes only: free under jit
    float_dtype("r", r)
    check_positive_real("cutoff", cutoff)
    if num_basis is not None:
        check_positive_int("num_basis", num_basis)
    if p is not None:
        check_positive_int("p", p, " (p = 0 makes the envelope identically 0)")


def _sin_multiples(theta: jax.Array, n: int) -> jax.Array:
    """``[...] -> [..., n]``: ``sin(k·theta)`` for ``k = 1 … n`` by the angle-addition recurrence.

    One sine and one cosine per element instead of ``n`` sines (and ``n`` cosines in the backward):
    on XLA's CPU the transcendental calls were most of the radial embedding's time; for the few
    terms a radial basis has, the recurrence stays within float rounding of the direct sines.
    """
    s1, c1 = jnp.sin(theta), jnp.cos(theta)
    sines, s, c = [s1], s1, c1
    for _ in range(n - 1):
        s, c = s * c1 + c * s1, c * c1 - s * s1
        sines.append(s)
    return jnp.stack(sines, axis=-1)


def bessel_basis(r: jax.Array, num_basis: int, cutoff: float) -> jax.Array:
    """``[...] -> [..., num_basis]``; ``r`` must be > 0 where it is used (mask the rest)."""
    _check(r, cutoff, num_basis=num_basis)
    return _sin_multiples((math.pi / cutoff) * r, num_basis) * (math.sqrt(2.0 / cutoff) / r)[..., None]


def polynomial_envelope(r: jax.Array, cutoff: float, p: int = 6) -> jax.Array:
    """``[...] -> [...]``: 1 at ``r = 0``, smoothly 0 at and beyond ``cutoff``."""
    _check(r, cutoff, p=p)
    x = r / cutoff
    env = 1.0 - (p + 1) * (p + 2) / 2 * x**p + p * (p + 2) * x ** (p + 1) - p * (p + 1) / 2 * x ** (p + 2)
    return jnp.where(x < 1.0, env, 0.0)


def radial_embedding(
    r: jax.Array, num_basis: int, cutoff: float, p: int = 6, mask: jax.Array | None = None
) -> jax.Array:
    """``bessel_basis · polynomial_envelope``: ``r [E] -> [E, num_basis]``; rows where ``mask`` is False are 0."""
    _check(r, cutoff, num_basis=num_basis, p=p)
    if mask is not None:
        check_array("mask", mask)
        if jnp.result_type(mask) != jnp.bool_ or jnp.shape(mask) != jnp.shape(r):
            raise ValueError(
                f"mask must be a bool array shaped like r {jnp.shape(r)}, got {jnp.result_type(mask)} {jnp.shape(mask)}"
            )
    valid = r > 0 if mask is None else mask & (r > 0)
    safe = jnp.where(valid, r, cutoff)  # so that neither value nor gradient is NaN on masked rows
    # the per-edge factors multiply once, before broadcasting over the basis: one [E, n] product
    # (and one reduction over n in the backward) instead of two
    scale = jnp.where(valid, math.sqrt(2.0 / cutoff) * polynomial_envelope(safe, cutoff, p) / safe, 0.0)
    return _sin_multiples((math.pi / cutoff) * safe, num_basis) * scale[..., None]
