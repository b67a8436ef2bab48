"""Spherical harmonics in JAX, evaluated from e3j-core's exact polynomials."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from e3j_core import NORMALIZATIONS, Irreps, spherical_harmonic_polynomials

from ._checks import float_dtype

__all__ = ["spherical_harmonics"]


def spherical_harmonics(
    irreps_out: int | Sequence[int] | Irreps | str,
    input: jax.Array,
    normalize: bool,
    normalization: str | None = "component",
) -> jax.Array:
    """Real spherical harmonics ``[..., 3] -> [..., D]``, equal to ``e3nn_jax.spherical_harmonics(...).array``.

    ``irreps_out`` is an int ``l`` (the single degree ``l``, as in e3nn-jax), a list of ints, or
    irreps: a string like ``"0e + 1o + 2e"``, an :class:`e3j.Irreps` or an e3nn-jax ``Irreps`` /
    ``Irrep``. ``normalization`` is ``"component"`` (also for ``None``, e3nn-jax's default),
    ``"norm"`` or ``"integral"``. For an ``e3nn.IrrepsArray`` input and output use
    ``e3j.interop.spherical_harmonics``. Conventions are e3nn's (``y`` polar, ``l=1`` components
    ``(x, y, z)``). Monomials of the coordinates are formed
    once and mixed by a small constant matrix. With ``normalize=True`` the input is divided by its
    norm; the zero vector maps to ``Y_0`` and zeros, with finite (zero) gradients.

    >>> spherical_harmonics("0e + 1o", jnp.array([0.0, 2.0, 0.0], jnp.float32), normalize=True)
    Array([1.       , 0.       , 1.7320508, 0.       ], dtype=float32)
    """
    normalization = "component" if normalization is None else normalization
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    try:
        polys = spherical_harmonic_polynomials(irreps_out, normalization)
    except ValueError as err:
        raise ValueError(f"irreps_out: {err}") from None
    dtype = float_dtype("input", input)
    x = jnp.asarray(input, dtype)
    if x.ndim == 0 or x.shape[-1] != 3:
        raise ValueError(f"input must have shape [..., 3], got {x.shape}")
    if normalize:
        # divide by the largest |component| first so that the squared norm neither underflows nor
        # overflows (|x| ~ 1e-20 or 1e20 in float32); the direction does not depend on this scale,
        # so it carries no gradient
        scale = jax.lax.stop_gradient(jnp.max(jnp.abs(x), axis=-1, keepdims=True))
        nonzero = scale > 0
        x = x / jnp.where(nonzero, scale, 1)
        r2 = jnp.sum(x * x, axis=-1, keepdims=True)
        # double where: the gradient of sqrt is never evaluated at 0
        x = jnp.where(nonzero, x / jnp.sqrt(jnp.where(nonzero, r2, 1)), 0)
    degree = int(polys.exponents.max(initial=0))
    # the monomials from static slices: indexing with the exponent arrays instead is a gather, whose
    # gradient is a scatter-add: ~1.5x slower in value and in gradient on a CPU
    powers = [[None] * (degree + 1) for _ in range(3)]  # powers[axis][k] = x[..., axis] ** k
    for axis in range(3):
        powers[axis][0] = jnp.ones_like(x[..., 0])
        for k in range(1, degree + 1):
            powers[axis][k] = x[..., axis] if k == 1 else powers[axis][k - 1] * x[..., axis]
    mono = jnp.stack([powers[0][a] * powers[1][b] * powers[2][c] for a, b, c in polys.exponents.tolist()], axis=-1)
    # full float32 on GPUs and TPUs too (their default precision would round the monomials to TF32/bf16)
    return jnp.matmul(mono, jnp.asarray(polys.coefficients.T, dtype), precision=jax.lax.Precision.HIGHEST)
