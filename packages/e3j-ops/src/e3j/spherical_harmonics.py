"""Spherical harmonics in JAX, evaluated from e3j-core's exact polynomials."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from e3j_core import Irreps, as_irreps, spherical_harmonic_recurrence
from e3j_core.spherical_harmonics import _as_ls, _check_normalization, is_degrees, legendre_pole, legendre_step

from ._checks import check_array, check_truth, is_irreps_array, promoted_real_dtype

__all__ = ["spherical_harmonics"]

# the names e3nn-jax's ``algorithm=`` takes (e3nn_jax.spherical_harmonics' docstring)
E3NN_ALGORITHMS = ("legendre", "recursive", "dense", "sparse", "custom_jvp")


def spherical_harmonics(
    irreps_out: int | Sequence[int] | Irreps | str,
    input: jax.Array,
    normalize: bool,
    normalization: str | None = "component",
    *,
    algorithm: tuple[str, ...] | None = None,
) -> jax.Array:
    """Real spherical harmonics ``[..., 3] -> [..., D]``, equal to ``e3nn_jax.spherical_harmonics(...).array``.

    ``irreps_out`` is an int ``l`` (the single degree ``l``, as in e3nn-jax), a list of ints, or
    irreps: a string like ``"0e + 1o + 2e"``, an :class:`e3j.Irreps` or an e3nn-jax ``Irreps`` /
    ``Irrep``; empty irreps give ``[..., 0]``. ``input`` is a ``[..., 3]`` array or an
    ``e3nn.IrrepsArray`` of one vector (``1x1o`` or ``1x1e``), read as its array; as e3nn-jax
    checks, odd degrees given as irreps must then have the vector's parity. The result is a plain
    array either way (``e3j.interop.spherical_harmonics`` returns an ``IrrepsArray``, labelled
    with the parities). ``normalize`` is a bool, or what e3nn-jax reads unambiguously as one (``0``
    / ``1``, a concrete 0-d bool or integer array); a string or ``None`` is refused.
    ``normalization`` is ``"component"`` (also for ``None``: e3nn-jax's default; its
    ``e3nn.config`` setting is read only by the interop function), ``"norm"`` or ``"integral"``.
    Conventions are e3nn's (``y`` polar, ``l=1`` components ``(x, y, z)``). An
    integer or boolean ``input`` is promoted to JAX's default float dtype, as e3nn-jax's arithmetic
    promotes it. ``algorithm`` (e3nn-jax's choice of how to evaluate the same polynomials:
    ``("recursive", "sparse", "custom_jvp")`` and so on) is checked and otherwise ignored: e3j has
    one evaluation, exact to rounding for every choice.
    Evaluated by associated-Legendre recurrences (:class:`e3j_core.SphericalHarmonicRecurrence`:
    the same polynomials as e3j-core's exact ones, a few operations per component). With
    ``normalize=True`` the input is divided by its norm; the zero vector maps to ``Y_0`` and
    zeros, with e3nn-jax's finite derivatives there (those of the polynomials at the origin).

    >>> spherical_harmonics("0e + 1o", jnp.array([0.0, 2.0, 0.0], jnp.float32), normalize=True)
    Array([1.       , 0.       , 1.7320508, 0.       ], dtype=float32)
    """
    normalize = check_truth("normalize", normalize)
    normalization = _check_normalization("component" if normalization is None else normalization)
    check_algorithm(algorithm)
    # the form of irreps_out first: the parity check below reads it
    rec = spherical_harmonic_recurrence(_as_ls(irreps_out, "irreps_out"), normalization)
    if is_irreps_array(input):
        _check_vector_parity(irreps_out, _vector_parity(input.irreps))
        input = input.array
    check_array("input", input)
    dtype = promoted_real_dtype({"input": input})  # integers and booleans as e3nn-jax's arithmetic
    x = jnp.asarray(input, dtype)
    if x.ndim == 0 or x.shape[-1] != 3:
        raise ValueError(f"input must have shape [..., 3], got {x.shape}")
    if not rec.ls:
        return jnp.zeros((*x.shape[:-1], 0), dtype)
    # a concrete array (an eager call): one compiled program, where the hundreds of small operations
    # of degrees up to 11 would each be compiled on their own (the monomial form took 23 s that way,
    # against 2 s as one program, on a 2-core CPU). Under a transformation (jit, grad, vmap) the
    # operations join the caller's trace as they are: eager jacobians of a jitted evaluator compiled
    # each transformed program anew (~2.5x slower)
    evaluate = _evaluate if isinstance(x, jax.core.Tracer) else _evaluate_jit
    return evaluate(x, rec.ls, rec.normalization, normalize)


def _inverse_power_of_two(scale: jax.Array) -> jax.Array:
    """``2**-k`` for ``2**k <= scale < 2**(k+1)``, clamped to normal numbers; 1 where ``scale`` is 0.

    Built from the exponent's bits: a division by ``scale`` runs on XLA's CPU as a product with its
    reciprocal, which is subnormal above ``2**126`` (float32) and flushed to zero; ``jnp.ldexp``'s
    ``pow`` doubled the harmonics' backward on a CPU. Above ``2**127`` the clamp leaves the scaled
    components below 4. NaN where ``scale`` is infinite or NaN.
    """
    info = jnp.finfo(scale.dtype)
    as_int = {32: jnp.int32, 64: jnp.int64}[info.bits]  # narrower floats are evaluated in float32
    bias = info.maxexp - 1
    field = (jax.lax.bitcast_convert_type(scale, as_int) >> info.nmant) & (2 * bias + 1)
    inverse = jax.lax.bitcast_convert_type(jnp.maximum(2 * bias - field, 1) << info.nmant, scale.dtype)
    # an infinite component makes the whole vector NaN, as a NaN one does (e3nn-jax's x / |x| keeps
    # the finite components' zeros); the zero vector passes unscaled: its derivatives are those of
    # the polynomials at the origin
    inverse = jnp.where(field > 2 * bias, jnp.full_like(scale, jnp.nan), inverse)
    return jnp.where(scale == 0, jnp.ones_like(scale), inverse)


def _evaluate(x: jax.Array, ls: tuple[int, ...], normalization: str, normalize: bool) -> jax.Array:
    """The harmonics of checked operands."""
    if x.dtype.itemsize < 4:
        # float16 (max 65,504) overflowed in the recurrences' intermediates (from l = 6 at length
        # 2, l = 8 for unit vectors: infinities and NaN where the harmonics are a few hundred at
        # most), bfloat16 and float8 lose digits there: evaluated in float32, rounded once
        return _evaluate(x.astype(jnp.float32), ls, normalization, normalize).astype(x.dtype)
    rec = spherical_harmonic_recurrence(ls, normalization)  # cached: the caller's object
    if normalize:
        # scale by a power of two near the largest |component| first, so that the squared norm
        # neither underflows nor overflows (|x| ~ 1e-20 or 1e20 in float32); the direction does not
        # depend on this scale, so it carries no gradient
        # (the maximum written out: as a reduction over the last axis XLA's CPU ran it in a pass of
        # its own, the harmonics at lmax 1 2.2x e3nn-jax's time against 1.5x. The squared norm stays
        # e3nn-jax's reduction, whose order of additions the backend chooses: written out, the
        # normalized vectors differed from e3nn-jax's in the last bit)
        c0, c1, c2 = x[..., 0:1], x[..., 1:2], x[..., 2:3]
        scale = jax.lax.stop_gradient(jnp.maximum(jnp.maximum(jnp.abs(c0), jnp.abs(c1)), jnp.abs(c2)))
        x = x * _inverse_power_of_two(scale)
        r2 = jnp.sum(x * x, axis=-1, keepdims=True)  # in [1, 48), 0 or NaN
        # != rather than >: a NaN component makes r2 NaN, and the vector must then come out NaN (as
        # in e3nn-jax), not pass unnormalized as the zero vector does (a vector of subnormals
        # too, which the CPU reads as zeros)
        nonzero = r2 != 0
        # double where: the gradient of sqrt is never evaluated at 0. The zero vector stays itself,
        # as in e3nn-jax: the polynomials of x there give Y_0 and zeros, and e3nn-jax's derivatives
        # of every order
        x = jnp.where(nonzero, x / jnp.sqrt(jnp.where(nonzero, r2, 1)), x)
    if max(ls) <= 1:
        return _degrees_up_to_one(x, rec)
    # e3nn's (x, y, z) as standard axes (X, Y, Z) = (z, x, y), Z polar: each row is
    # factor · Q_l^m(Z, r²) · (A_m or B_m)(X, Y), a few operations per row. The monomial form
    # (``polys.coefficients @ monomials``) ran 1.4-8x slower at lmax 3-6 and ~150x at lmax 11 on a CPU:
    # XLA splits a product with a stacked operand into one multiply-add per monomial, zeros included
    big_x, big_y, big_z = x[..., 2], x[..., 0], x[..., 1]
    lmax = int(rec.degrees.max())
    r2 = big_x * big_x + big_y * big_y + big_z * big_z if lmax >= 2 else None
    a, b = [None, big_x], [None, big_y]  # A_m + i B_m = (X + iY)^m; m = 0 is the constant 1
    for _ in range(2, lmax + 1):
        a_prev, b_prev = a[-1], b[-1]
        a.append(big_x * a_prev - big_y * b_prev)
        b.append(big_x * b_prev + big_y * a_prev)

    # Q_l^m scaled by 2^-e(l, m), 2^e(l, m) <= Q_l^m's largest value on the unit sphere (at the pole,
    # e3j_core's legendre_pole) < 2^(e + 1): the integer Q_l^m grow factorially and pass float32's
    # range at l = 33, where the harmonics are below 10. Powers of two scale exactly: where no
    # intermediate overflows or underflows the rows equal the unscaled recurrence's bit for bit (for
    # unit vectors, every l < 33; an unnormalized vector of length 1e-3 underflows a few degrees sooner)
    def exponent(l: int, m: int) -> int:
        return legendre_pole(l, m).bit_length() - 1

    q: dict[tuple[int, int], jax.Array | None] = {}  # (l, m) -> scaled Q_l^m; None is the constant 1

    def legendre(l: int, m: int) -> jax.Array | None:
        if (l, m) not in q:
            if l == m:
                q[l, m] = None  # Q_m^m = 1, e = 0
            elif l == m + 1:
                q[l, m] = math.ldexp(legendre_step(l, m)[0], -exponent(l, m)) * big_z
            else:
                a_lm, b_lm = legendre_step(l, m)
                a_lm = math.ldexp(a_lm, exponent(l - 1, m) - exponent(l, m))
                b_lm = math.ldexp(b_lm, exponent(l - 2, m) - exponent(l, m))
                below = legendre(l - 2, m)
                tail = b_lm * (r2 if below is None else r2 * below)
                q[l, m] = a_lm * big_z * legendre(l - 1, m) - tail
        return q[l, m]

    rows = []
    for l, m, cosine, factor in zip(rec.degrees.tolist(), rec.m.tolist(), rec.cosine.tolist(), rec.factors.tolist()):
        value = legendre(l, m)
        if m:
            trig = (a if cosine else b)[m]
            value = trig if value is None else value * trig
        rows.append((jnp.ones_like(big_x) if value is None else value) * math.ldexp(factor, exponent(l, m)))
    # the barrier keeps the rows one materialized array: fused into an elementwise consumer (the
    # gradient of sum(sin(Y))) XLA's CPU recomputed the recurrences per consumer, ~2x slower at lmax 3
    return jax.lax.optimization_barrier(jnp.stack(rows, axis=-1))


def _degrees_up_to_one(x: jax.Array, rec) -> jax.Array:
    """Degrees 0 and 1: ``Y_0`` a constant, ``Y_1`` the vector times one factor, in e3nn's order
    ``(x, y, z)``: the recurrence's rows exactly (their products by powers of two are exact), as
    whole blocks, which XLA's CPU writes in one pass (one-column rows concatenated took ~1.7x
    e3nn-jax's time at lmax 1)."""
    blocks, row = [], 0
    for l in rec.ls:
        # the three rows of degree 1 share one factor (Q_1^m is 1 or Z, scaled by 2^0)
        factor, *others = rec.factors[row : row + 2 * l + 1].tolist()
        if any(f != factor for f in others):
            raise AssertionError(f"degree-1 rows with different factors: {rec.factors}")
        blocks.append(jnp.full((*x.shape[:-1], 1), factor, x.dtype) if l == 0 else x * factor)
        row += 2 * l + 1
    return blocks[0] if len(blocks) == 1 else jnp.concatenate(blocks, axis=-1)


_evaluate_jit = jax.jit(_evaluate, static_argnums=(1, 2, 3))


def check_algorithm(algorithm) -> None:
    """e3nn-jax's ``algorithm=``: ``None`` or a tuple (or list) of :data:`E3NN_ALGORITHMS`."""
    if algorithm is None:
        return
    if not isinstance(algorithm, (tuple, list)):
        raise TypeError(f"algorithm must be None or a tuple of {E3NN_ALGORITHMS}, got {algorithm!r}")
    if not set(algorithm) <= set(E3NN_ALGORITHMS):
        raise ValueError(f"algorithm must be None or a tuple of {E3NN_ALGORITHMS}, got {algorithm!r}")


def _vector_parity(irreps) -> int:
    """The parity (``-1`` or ``1``) of irreps that must be one vector, ``1x1o`` or ``1x1e``."""
    try:
        irreps = as_irreps(irreps, "input.irreps")
    except (TypeError, ValueError) as err:
        raise ValueError(f"input must be a single vector (1x1o or 1x1e): {err}") from None
    if len(irreps) != 1 or irreps[0].mul != 1 or irreps[0].ir.l != 1:
        raise ValueError(f"input must be a single vector (1x1o or 1x1e), got {irreps}")
    return irreps[0].ir.p


def _check_vector_parity(irreps_out, p: int) -> None:
    """Raise unless every odd degree of ``irreps_out`` (when given as irreps) has parity ``p``.

    Degrees given as ints carry no parity and pass; e3nn-jax gives them the vector's, ``p**l``.
    """
    if is_degrees(irreps_out):
        return
    irreps = as_irreps(irreps_out, "irreps_out")
    if any(ir.p != p for _, ir in irreps if ir.l % 2):
        raise ValueError(f"input (1{'e' if p == 1 else 'o'}) and irreps_out ({irreps}) have incompatible parities")
