"""Real spherical harmonics as explicit polynomials (paper Appendix G.1), in e3nn's convention.

Convention (identical to ``e3nn_jax.spherical_harmonics``): real basis ordered ``m = -l .. l``; for
``l = 1`` the components are ``(x, y, z)``; ``y`` is the polar axis. Equivalently, our ``Y_l`` at
``(x, y, z)`` is the standard real spherical harmonic (no Condon–Shortley phase) at
``(X, Y, Z) = (z, x, y)``. Normalizations:

- ``"component"`` (default): ``‖Y_l(u)‖² = 2l + 1`` for unit ``u`` (each component has mean square 1),
- ``"norm"``: ``‖Y_l(u)‖ = 1``,
- ``"integral"``: ``∫_{S²} Y_{lm}² dΩ = 1``.

Construction: the top state ``(X + iY)^l`` is lowered by the ladder operator
``L₋ = L_x − i L_y`` acting on polynomials; the real and imaginary parts give the real harmonics.
Every step is in exact (Gaussian) integer arithmetic; normalizations are exact rationals under a
square root (over ``√(4π)`` for ``"integral"``), each float64 coefficient rounded once from 40 digits
(correctly rounded but within ~1e-39 of a rounding boundary: :mod:`e3j_core._exact`).

>>> import numpy as np
>>> sh = spherical_harmonic_polynomials([1])
>>> sh.exponents.tolist(), np.round(sh.coefficients, 6).tolist()
([[1, 0, 0], [0, 1, 0], [0, 0, 1]], [[1.732051, 0.0, 0.0], [0.0, 1.732051, 0.0], [0.0, 0.0, 1.732051]])
>>> (np.round(spherical_harmonics(2, np.array([0.0, 1.0, 0.0]), normalize=True), 6) + 0.0).tolist()
[0.0, 0.0, 2.236068, 0.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from math import comb

import numpy as np

from . import _polynomials as poly
from ._checks import check_bool, check_degree
from ._exact import rounded
from .irreps import Irrep, Irreps, _is_irrep_like, _is_irreps_like, _is_mul_irrep_like

__all__ = [
    "NORMALIZATIONS",
    "SphericalHarmonicPolynomials",
    "SphericalHarmonicRecurrence",
    "is_degrees",
    "spherical_harmonic_polynomials",
    "spherical_harmonic_recurrence",
    "spherical_harmonics",
]

NORMALIZATIONS = ("component", "norm", "integral")

_GAUSSIAN_POWERS_OF_I = ((1, 0), (0, 1), (-1, 0), (0, -1))


def _check_normalization(normalization: str) -> str:
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    return normalization


def _lower(p: poly.Poly) -> poly.Poly:
    """``L₋ p`` with ``L₋ = −i(Y∂_Z − Z∂_Y) − (Z∂_X − X∂_Z)`` in standard axes (Z polar)."""
    return poly.add(
        poly.times_coordinate_derivative(p, 1, 2, (0, -1)),
        poly.times_coordinate_derivative(p, 2, 1, (0, 1)),
        poly.times_coordinate_derivative(p, 2, 0, (-1, 0)),
        poly.times_coordinate_derivative(p, 0, 2, (1, 0)),
    )


@cache
def integer_harmonics(l: int) -> tuple[tuple[dict[tuple[int, int, int], int], Fraction], ...]:
    """Unnormalized real harmonics of degree ``l`` with integer coefficients, in e3nn axes.

    Returns, for ``m = -l .. l``, the polynomial ``P_m`` (exponents over e3nn's ``(x, y, z)``) and
    ``q_m = ⟨P_m, P_m⟩`` (mean over the sphere), so that ``P_m / sqrt(q_m)`` is the harmonic in
    ``"component"`` normalization. Signs follow the standard real table: the coefficient of
    ``X^m Z^(l-m)`` (m > 0), ``X^(|m|-1) Y Z^(l-|m|)`` (m < 0) or ``Z^l`` (m = 0) is positive.
    """
    l = check_degree(l)
    top: poly.Poly = {}
    for b in range(l + 1):
        re, im = _GAUSSIAN_POWERS_OF_I[b % 4]
        top[(l - b, b, 0)] = (comb(l, b) * re, comb(l, b) * im)
    complex_states = {l: top}  # m -> polynomial ∝ Y_l^m (up to a real factor)
    for m in range(l, 0, -1):
        complex_states[m - 1] = _lower(complex_states[m])

    out = []
    for m in range(-l, l + 1):
        state = complex_states[abs(m)]
        p_std = poly.imag_part(state) if m < 0 else poly.real_part(state)
        if m == 0:
            assert not poly.imag_part(state), "Y_l^0 must be real"
        lead = {1: (m, 0, l - m), -1: (abs(m) - 1, 1, l - abs(m)), 0: (0, 0, l)}[int(np.sign(m))]
        sign = 1 if p_std[lead] > 0 else -1
        # standard (X, Y, Z) = e3nn (z, x, y): X^a Y^b Z^c = x^b y^c z^a
        p = {(b, c, a): sign * coef for (a, b, c), coef in p_std.items()}
        out.append((p, poly.sphere_inner(p, p)))
    return tuple(out)


def _coefficient(c: int | Fraction, q: Fraction, normalization: str, l: int) -> float:
    """``c / sqrt(q)`` normalized (``"norm"``: over ``sqrt(2l + 1)``; ``"integral"``: over
    ``sqrt(4π)``), rounded to float64 once from the exact rational."""
    radicand = Fraction(c * c) / (q * (2 * l + 1 if normalization == "norm" else 1))
    sign = (c > 0) - (c < 0)
    return rounded(sign, radicand.numerator, radicand.denominator, over_4pi=normalization == "integral")


@dataclass(frozen=True, eq=False)
class SphericalHarmonicPolynomials:
    """Spherical harmonics of degrees ``ls`` as monomials and a coefficient matrix.

    ``Y(v) = coefficients @ monomials(v)`` with ``monomials(v)[k] = x^e0 y^e1 z^e2`` for
    ``(e0, e1, e2) = exponents[k]``.

    Attributes:
        ls: the degrees, in output order (one ``2l+1`` block each).
        normalization: ``"component"``, ``"norm"`` or ``"integral"``.
        exponents: ``int64 [M, 3]``, the distinct monomials needed (sorted by total degree).
        coefficients: ``float64 [D, M]``, ``D = Σ (2l+1)``; rows ``m = -l .. l`` per degree.
    """

    ls: tuple[int, ...]
    normalization: str
    exponents: np.ndarray
    coefficients: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.coefficients.shape[0])

    def __call__(self, vectors: np.ndarray) -> np.ndarray:
        """Evaluate on ``vectors [..., 3]`` (not normalized); float64 arithmetic throughout."""
        v = np.asarray(vectors)
        if np.iscomplexobj(v):  # float64 would drop the imaginary part with only a warning
            raise TypeError(f"vectors must be real, got dtype {v.dtype}")
        v = v.astype(np.float64)
        if v.ndim == 0 or v.shape[-1] != 3:
            raise ValueError(f"vectors must have shape [..., 3], got {v.shape}")
        degree = int(self.exponents.max(initial=0))
        powers = v[..., None, :] ** np.arange(degree + 1)[:, None]  # [..., degree+1, 3]
        mono = (
            powers[..., self.exponents[:, 0], 0]
            * powers[..., self.exponents[:, 1], 1]
            * powers[..., self.exponents[:, 2], 2]
        )
        out = mono @ self.coefficients.T
        if not np.all(np.isfinite(mono)):
            # 0 * NaN is NaN: the dense product spread one NaN component into every row. Each row
            # sums its own monomials, as the polynomial (and e3nn-jax) does
            used = [np.flatnonzero(c) for c in self.coefficients]
            out = np.stack([mono[..., k] @ c[k] for c, k in zip(self.coefficients, used)], axis=-1)
        return out


@cache
def _polynomials(ls: tuple[int, ...], normalization: str) -> SphericalHarmonicPolynomials:
    rows: list[dict[tuple[int, int, int], float]] = []
    for l in ls:
        for p, q in integer_harmonics(l):
            rows.append({e: _coefficient(c, q, normalization, l) for e, c in p.items()})
    monomials = sorted({e for row in rows for e in row}, key=lambda e: (sum(e), tuple(-k for k in e)))
    index = {e: k for k, e in enumerate(monomials)}
    coefficients = np.zeros((len(rows), len(monomials)))
    for i, row in enumerate(rows):
        for e, c in row.items():
            coefficients[i, index[e]] = c
    exponents = np.array(monomials, dtype=np.int64).reshape(-1, 3)
    exponents.setflags(write=False)
    coefficients.setflags(write=False)
    return SphericalHarmonicPolynomials(ls, normalization, exponents, coefficients)


@dataclass(frozen=True, eq=False)
class SphericalHarmonicRecurrence:
    """Spherical harmonics of degrees ``ls`` as associated-Legendre recurrences.

    In standard axes ``(X, Y, Z) = (z, x, y)`` of e3nn's ``(x, y, z)`` (``Z`` polar), with
    ``r² = x² + y² + z²``, ``A_m + i B_m = (X + iY)^m`` and the integer recurrence

        ``Q_m^m = 1``, ``Q_{m+1}^m = (2m + 1) Z``,
        ``Q_l^m = (2l - 1) Z Q_{l-1}^m - (l + m - 1)(l - m - 1) r² Q_{l-2}^m``

    (``(l - m)!`` times the associated Legendre polynomial over ``sin^m θ``, made homogeneous), each
    output row is ``factors[k] · Q_{degrees[k]}^{m[k]} · (A_m if cosine[k] else B_m)``: the same
    polynomial as :class:`SphericalHarmonicPolynomials`' row, checked coefficient by coefficient in
    exact arithmetic when built. Evaluating it takes a few operations per row (the monomial form
    mixes ``(l+1)(l+2)/2`` monomials per degree), about as accurately (the three-term recurrence in
    ``l`` is the stable direction; in float32, 2e-6 of the largest value at ``l = 11`` against the
    monomial form's 1.4e-6).

    Attributes:
        ls: the degrees, in output order (one ``2l+1`` block each).
        normalization: ``"component"``, ``"norm"`` or ``"integral"``.
        degrees: ``int64 [D]``, each row's ``l``.
        m: ``int64 [D]``, each row's ``|m|`` (rows ``m = -l .. l`` per degree).
        cosine: ``bool [D]``, ``A_m`` (``m >= 0``) rather than ``B_m`` (``m < 0``).
        factors: ``float64 [D]``, rounded once from the exact value.

    >>> rec = spherical_harmonic_recurrence([1])
    >>> rec.m.tolist(), rec.cosine.tolist(), np.round(rec.factors, 6).tolist()
    ([1, 0, 1], [False, True, True], [1.732051, 1.732051, 1.732051])
    """

    ls: tuple[int, ...]
    normalization: str
    degrees: np.ndarray
    m: np.ndarray
    cosine: np.ndarray
    factors: np.ndarray


def legendre_step(l: int, m: int) -> tuple[int, int]:
    """``(a, b)`` with ``Q_l^m = a Z Q_{l-1}^m - b r² Q_{l-2}^m`` for ``l > m >= 0``
    (:class:`SphericalHarmonicRecurrence`'s recurrence; ``b = 0`` at ``l = m + 1``).

    >>> legendre_step(1, 0), legendre_step(2, 0), legendre_step(3, 1)
    ((1, 0), (3, 1), (5, 3))
    """
    if not 0 <= m < l:
        raise ValueError(f"legendre_step needs l > m >= 0, got l={l}, m={m}")
    return 2 * l - 1, (l + m - 1) * (l - m - 1)


@cache
def legendre_pole(l: int, m: int) -> int:
    """``Q_l^m`` at the pole (``Z = r = 1``), exactly: its largest magnitude on the unit sphere.

    ``Q_l^m(Z, 1)`` is a positive multiple of the Gegenbauer polynomial ``C_{l-m}^{(m+1/2)}(Z)``,
    which on ``[-1, 1]`` is largest in magnitude at ``Z = 1``. It grows factorially (past float32's
    range at ``l = 33``): evaluators scale ``Q_l^m`` by about its inverse, a power of two.

    >>> [legendre_pole(l, 0) for l in range(5)], legendre_pole(3, 1), legendre_pole(2, 2)
    ([1, 1, 2, 6, 24], 12, 1)
    """
    if not 0 <= m <= l:
        raise ValueError(f"legendre_pole needs l >= m >= 0, got l={l}, m={m}")
    below, q = 0, 1  # Q_{k-1}^m, Q_k^m at the pole for k = m; iterative: any l, no recursion limit
    for k in range(m + 1, l + 1):
        a, b = legendre_step(k, m)
        below, q = q, a * q - b * below
    return q


@cache
def _legendre_rows(l: int) -> tuple[Fraction, ...]:
    """For ``m = -l .. l``: the exact ``ρ`` with ``integer_harmonics(l)[m] = ρ · Q_l^|m| · (A or B)``."""
    x_iy = {(1, 0, 0): (1, 0), (0, 1, 0): (0, 1)}  # X + iY over standard exponents (X, Y, Z)
    z = {(0, 0, 1): (1, 0)}
    r2 = {(2, 0, 0): (1, 0), (0, 2, 0): (1, 0), (0, 0, 2): (1, 0)}
    states = {}  # |m| -> Q_l^m · (X + iY)^m, shared by +m (real part) and -m (imaginary part)
    for m in range(l + 1):
        q_prev, q = None, {(0, 0, 0): (1, 0)}  # Q_{k-1}^m, Q_k^m for k = m
        for k in range(m + 1, l + 1):
            a, b = legendre_step(k, m)
            term = poly.multiply({(0, 0, 0): (a, 0)}, z, q)
            if q_prev is not None:
                term = poly.add(term, poly.multiply({(0, 0, 0): (-b, 0)}, r2, q_prev))
            q_prev, q = q, term
        states[m] = poly.multiply(q, *[x_iy] * m)
    out = []
    for m_signed, (p, _) in zip(range(-l, l + 1), integer_harmonics(l)):
        state = states[abs(m_signed)]
        part = poly.real_part(state) if m_signed >= 0 else poly.imag_part(state)
        candidate = {(b, c, a): coef for (a, b, c), coef in part.items()}  # to e3nn's (x, y, z)
        e = next(iter(p))
        ratio = Fraction(p[e], candidate[e]) if e in candidate else None
        if ratio is None or candidate.keys() != p.keys() or any(p[k] != ratio * c for k, c in candidate.items()):
            raise AssertionError(f"the Legendre recurrence does not reproduce Y_{l},{m_signed}")  # pragma: no cover
        out.append(ratio)
    return tuple(out)


@cache
def _recurrence(ls: tuple[int, ...], normalization: str) -> SphericalHarmonicRecurrence:
    degrees, ms, cosine, factors = [], [], [], []
    for l in ls:
        for m_signed, ratio, (_, q) in zip(range(-l, l + 1), _legendre_rows(l), integer_harmonics(l)):
            factor = _coefficient(ratio, q, normalization, l)
            degrees.append(l)
            ms.append(abs(m_signed))
            cosine.append(m_signed >= 0)
            factors.append(factor)
    arrays = (
        np.array(degrees, np.int64),
        np.array(ms, np.int64),
        np.array(cosine, bool),
        np.array(factors, np.float64),
    )
    for a in arrays:
        a.setflags(write=False)
    return SphericalHarmonicRecurrence(ls, normalization, *arrays)


def spherical_harmonic_recurrence(
    ls: int | Sequence[int] | Irreps | str, normalization: str = "component"
) -> SphericalHarmonicRecurrence:
    """The cached recurrence form of the spherical harmonics of degrees ``ls`` (as
    :func:`spherical_harmonic_polynomials` reads them)."""
    return _recurrence(_as_ls(ls), _check_normalization(normalization))


def _names_irreps(ls: object) -> bool:
    """Whether ``ls`` is, on its face, irreps: a string, an ``Irreps`` or an irrep (e3j's or e3nn-jax's)."""
    return isinstance(ls, (str, Irreps, Irrep)) or _is_irrep_like(ls) or _is_mul_irrep_like(ls) or _is_irreps_like(ls)


def is_degrees(ls: object) -> bool:
    """Whether ``ls`` gives degrees (an int or a sequence of numbers, no parities) rather than irreps.

    The one rule every spherical-harmonics function reads its ``ls``/``irreps_out`` by: degrees take
    their parity from the vector (``p**l``), irreps carry their own. A string, an ``Irreps``, an
    irrep (e3j's or e3nn-jax's) or a sequence holding anything but numbers is irreps.

    >>> is_degrees(2), is_degrees([0, 1, 2]), is_degrees(range(3)), is_degrees("1o"), is_degrees(["1o"])
    (True, True, True, False, False)
    """
    if isinstance(ls, (int, np.integer)) and not isinstance(ls, bool):
        return True
    if _names_irreps(ls):
        return False
    # e3nn-jax's Irreps is a tuple of MulIrreps: a sequence, but not of numbers
    return isinstance(ls, Sequence) and all(isinstance(l, (int, float, np.number)) for l in ls)


def _as_ls(ls: int | Sequence[int] | Irreps | str, name: str = "ls") -> tuple[int, ...]:
    """The degrees ``ls`` names, one per copy; ``ValueError`` naming the argument ``name``."""
    if isinstance(ls, (int, np.integer)) and not isinstance(ls, bool):
        return (check_degree(ls, f"{name}: l"),)
    if is_degrees(ls):
        return tuple(check_degree(l, f"{name}: each l") for l in ls)
    if not (_names_irreps(ls) or isinstance(ls, Sequence)):
        raise ValueError(f"{name}: expected an int, a list of ints or Irreps, got {ls!r}")  # None, a set, ...
    try:
        irreps = Irreps(ls)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name}: expected an int, a list of ints or Irreps, got {ls!r} ({err})") from None
    odd = {ir.p for _, ir in irreps if ir.l % 2}
    odd_even = [str(ir) for _, ir in irreps if ir.l % 2 == 0 and ir.p != 1]
    if len(odd) > 1 or odd_even:
        what = f"an even degree with odd parity ({', '.join(odd_even)})" if odd_even else "odd degrees of both parities"
        raise ValueError(
            f"{name}: irreps {irreps} have {what}: spherical harmonics of a vector (1o) or a "
            "pseudovector (1e) have parity p**l for one p, so even degrees are always 'e'"
        )
    return tuple(ir.l for mul, ir in irreps for _ in range(mul))


def spherical_harmonic_polynomials(
    ls: int | Sequence[int] | Irreps | str, normalization: str = "component"
) -> SphericalHarmonicPolynomials:
    """The cached polynomial form of the spherical harmonics of degrees ``ls``.

    ``ls`` is an int, a sequence of ints, or irreps like ``"0e + 1o + 2e"`` (multiplicities repeat
    a degree).
    """
    return _polynomials(_as_ls(ls), _check_normalization(normalization))


def spherical_harmonics(
    ls: int | Sequence[int] | Irreps | str,
    vectors: np.ndarray,
    normalize: bool,
    normalization: str = "component",
) -> np.ndarray:
    """Numpy evaluation of the spherical harmonics, ``[..., 3] -> [..., D]``.

    Evaluated in float64 and returned in the input's floating dtype (float64 for integer input).
    With ``normalize=True`` the vectors are first divided by their norm; a zero vector then gives
    ``Y_0 = const`` and zeros for ``l > 0``, as in e3nn-jax.
    """
    normalize = check_bool("normalize", normalize)
    sh = spherical_harmonic_polynomials(ls, normalization)
    v = np.asarray(vectors)
    if v.ndim == 0 or v.shape[-1] != 3:
        raise ValueError(f"vectors must have shape [..., 3], got {v.shape}")
    if not (np.issubdtype(v.dtype, np.floating) or np.issubdtype(v.dtype, np.integer)):
        raise TypeError(f"vectors must be a real (float or integer) array, got dtype {v.dtype}")
    dtype = v.dtype if np.issubdtype(v.dtype, np.floating) else np.dtype(np.float64)
    v = v.astype(np.float64)
    if normalize:
        # scaled by the largest component first: the squares of |v| > 1e154 overflow and of
        # |v| < 1e-154 underflow in float64 (such vectors read as the zero vector otherwise).
        # where != 0, not > 0: a NaN component gives NaN, as in e3nn-jax, not the zero vector's zeros
        m = np.max(np.abs(v), axis=-1, keepdims=True)
        v = np.divide(v, m, out=np.zeros_like(v), where=m != 0)
        r = np.linalg.norm(v, axis=-1, keepdims=True)
        v = np.divide(v, r, out=np.zeros_like(v), where=r != 0)
    return sh(v).astype(dtype)
