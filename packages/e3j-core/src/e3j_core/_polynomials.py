"""Exact homogeneous polynomials in three variables (private).

A polynomial is a ``dict`` from an exponent triple ``(a, b, c)`` to a Gaussian integer
``(re, im)`` (Python ints, so arbitrarily large and exact). The angular-momentum ladder
operators map such polynomials to such polynomials, which lets the spherical harmonics be built
with no rounding at all; the only irrational numbers (the normalizations) enter at the very end.
"""

from __future__ import annotations

from fractions import Fraction
from functools import cache

import numpy as np

Exponent = tuple[int, int, int]
Poly = dict[Exponent, tuple[int, int]]


def _add(out: Poly, e: Exponent, re: int, im: int) -> None:
    r0, i0 = out.get(e, (0, 0))
    r, i = r0 + re, i0 + im
    if r == 0 and i == 0:
        out.pop(e, None)
    else:
        out[e] = (r, i)


def times_coordinate_derivative(p: Poly, times: int, wrt: int, scale: tuple[int, int]) -> Poly:
    """``scale * x_times * ∂p/∂x_wrt`` with ``scale`` a Gaussian integer."""
    sr, si = scale
    out: Poly = {}
    for e, (re, im) in p.items():
        k = e[wrt]
        if k == 0:
            continue
        new = list(e)
        new[wrt] -= 1
        new[times] += 1
        # (sr + i si) * k * (re + i im)
        _add(out, tuple(new), k * (sr * re - si * im), k * (sr * im + si * re))  # type: ignore[arg-type]
    return out


def add(*polys: Poly) -> Poly:
    out: Poly = {}
    for p in polys:
        for e, (re, im) in p.items():
            _add(out, e, re, im)
    return out


def multiply(*polys: Poly) -> Poly:
    """The product of Gaussian-integer polynomials (``{(0, 0, 0): (1, 0)}`` for none)."""
    out: Poly = {(0, 0, 0): (1, 0)}
    for q in polys:
        product: Poly = {}
        for ep, (pr, pi) in out.items():
            for eq, (qr, qi) in q.items():
                e = (ep[0] + eq[0], ep[1] + eq[1], ep[2] + eq[2])
                _add(product, e, pr * qr - pi * qi, pr * qi + pi * qr)
        out = product
    return out


def real_part(p: Poly) -> dict[Exponent, int]:
    return {e: re for e, (re, _) in p.items() if re != 0}


def imag_part(p: Poly) -> dict[Exponent, int]:
    return {e: im for e, (_, im) in p.items() if im != 0}


def _double_factorial(n: int) -> int:
    out = 1
    while n > 1:
        out *= n
        n -= 2
    return out


@cache
def sphere_mean(e: Exponent) -> Fraction:
    """Mean of ``x^a y^b z^c`` over the unit sphere: ``∫ ... dΩ / 4π``, exactly."""
    a, b, c = e
    if a % 2 or b % 2 or c % 2:
        return Fraction(0)
    num = _double_factorial(a - 1) * _double_factorial(b - 1) * _double_factorial(c - 1)
    return Fraction(num, _double_factorial(a + b + c + 1))


def sphere_inner(p: dict[Exponent, int], q: dict[Exponent, int]) -> Fraction:
    """``∫ p q dΩ / 4π`` for real integer polynomials, exactly."""
    total = Fraction(0)
    for ep, cp in p.items():
        for eq, cq in q.items():
            total += cp * cq * sphere_mean((ep[0] + eq[0], ep[1] + eq[1], ep[2] + eq[2]))
    return total


def sphere_inner_matrix(rows: list[dict[Exponent, int]], cols: list[dict[Exponent, int]]) -> list[list[Fraction]]:
    """``[[⟨p, q⟩ for q in cols] for p in rows]`` for homogeneous integer polynomials of one degree.

    On degree-``2l`` monomials every sphere mean has the denominator ``(2l+1)!!``, so the Gram
    products run on Python integers (object arrays) and only the final entries become fractions.
    """
    monomials = sorted({e for p in rows + cols for e in p})
    if not monomials:
        return [[Fraction(0)] * len(cols) for _ in rows]
    degrees = {sum(e) for e in monomials}
    if len(degrees) != 1:
        raise ValueError("sphere_inner_matrix needs homogeneous polynomials of one degree")
    degree = degrees.pop()
    index = {e: k for k, e in enumerate(monomials)}

    def matrix(polys: list[dict[Exponent, int]]) -> np.ndarray:
        out = np.zeros((len(polys), len(monomials)), dtype=object)
        out[:] = 0
        for i, p in enumerate(polys):
            for e, c in p.items():
                out[i, index[e]] = c
        return out

    den = _double_factorial(2 * degree + 1)
    gram = np.zeros((len(monomials), len(monomials)), dtype=object)
    for i, a in enumerate(monomials):
        for j, b in enumerate(monomials):
            mean = sphere_mean((a[0] + b[0], a[1] + b[1], a[2] + b[2]))
            gram[i, j] = mean.numerator * (den // mean.denominator)
    products = matrix(rows).dot(gram).dot(matrix(cols).T)
    return [[Fraction(int(v), den) for v in row] for row in products]


def directional_derivative(p: dict[Exponent, int], field: list[list[int]]) -> dict[Exponent, int]:
    """``(v · ∇) p`` for the linear vector field ``v(x) = field @ x`` (integer matrix)."""
    out: Poly = {}
    for i in range(3):
        for j in range(3):
            if field[i][j]:
                term = times_coordinate_derivative({e: (c, 0) for e, c in p.items()}, j, i, (field[i][j], 0))
                out = add(out, term)
    return real_part(out)
