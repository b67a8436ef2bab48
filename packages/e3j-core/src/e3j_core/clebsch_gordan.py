"""Clebsch–Gordan coefficients of the real irreps of SO(3) (paper Appendix G.2).

``clebsch_gordan(l1, l2, l3)`` is a ``float64 [2l1+1, 2l2+1, 2l3+1]`` array ``C`` of unit Frobenius
norm such that ``z_k = Σ_ij C_ijk x_i y_j`` is equivariant: ``C(D1 x, D2 y) = D3 C(x, y)`` with the
real-basis Wigner D matrices of :mod:`e3j_core.wigner`. It equals ``e3nn_jax.clebsch_gordan`` (to
1e-14 for l3 <= 8, tested), whose float64 computation loses digits as l1 + l2 + l3 grows (1.2e-9 at
(8, 8, 16)); these are the exact values, rounded.

Construction, exact: in the complex ``|l m⟩`` basis (Condon–Shortley phase) each coefficient is
``Z √(n/d)`` with integers ``Z, n, d`` (Racah's formula, its sum of binomials an integer ``Z``). The
real basis, e3nn's change of basis, takes each real coefficient from the complex ones of the same
``|m|``: a Gaussian-integer combination of ``Z``'s over one radicand, so a real coefficient is zero
exactly when its combination is, whatever the degree. Each nonzero is computed to 40 digits, then
rounded to float64: the correctly rounded value unless the exact one lies within ~1e-39 (relative)
of a rounding boundary. (The paper's top-state recurrence and lowering operators, Eq. 25, give the
same values, but in finite precision leave residues where coefficients vanish; a threshold on them
drops true coefficients as small, and at l ≈ 25 true coefficients are ~3e-16.)

>>> import numpy as np
>>> C = clebsch_gordan(1, 1, 0)
>>> np.allclose(C[:, :, 0], np.eye(3) / np.sqrt(3))
True
>>> clebsch_gordan(1, 1, 3)
Traceback (most recent call last):
...
ValueError: clebsch_gordan(1, 1, 3): the triangle condition |l1 - l2| <= l3 <= l1 + l2 fails
"""

from __future__ import annotations

import math
from decimal import Decimal
from functools import cache

import numpy as np

from ._checks import check_degree
from ._exact import root, rounded, times

__all__ = ["change_basis_real_to_complex", "clebsch_gordan", "su2_clebsch_gordan"]


def _check(where: str, l1: object, l2: object, l3: object) -> tuple[int, int, int]:
    try:
        return check_degree(l1, "l1"), check_degree(l2, "l2"), check_degree(l3, "l3")
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


@cache
def _factorial(n: int) -> int:
    return math.factorial(n)


def _racah(l1: int, l2: int, L: int, m1: int, m2: int) -> tuple[int, int, int]:
    """``(Z, n, d)`` with ``⟨l1 m1, l2 m2 | L m1+m2⟩ = Z √(n/d)``, all integers (Racah's formula, its
    sum over ``k`` written with binomials: ``Σ_k (−1)^k C(a, k) C(b, l1−m1−k) C(c, l2+m2−k)``)."""
    M = m1 + m2
    a, b, c = l1 + l2 - L, l1 - l2 + L, l2 - l1 + L
    Z = 0
    for k in range(max(0, l1 - m1 - b, l2 + m2 - c), min(a, l1 - m1, l2 + m2) + 1):
        term = math.comb(a, k) * math.comb(b, l1 - m1 - k) * math.comb(c, l2 + m2 - k)
        Z += -term if k & 1 else term
    f = _factorial
    n = (2 * L + 1) * f(L + M) * f(L - M) * f(l1 - m1) * f(l1 + m1) * f(l2 - m2) * f(l2 + m2)
    d = f(l1 + l2 + L + 1) * f(a) * f(b) * f(c)
    return Z, n, d


def _pairs(l1: int, l2: int, L: int):
    """Every ``(m1, m2)`` with ``|m1 + m2| <= L``: the coefficients the selection rule allows."""
    for m1 in range(-l1, l1 + 1):
        yield from ((m1, m2) for m2 in range(max(-l2, -L - m1), min(l2, L - m1) + 1))


@cache
def _su2(l1: int, l2: int, L: int) -> np.ndarray:
    C = np.zeros((2 * l1 + 1, 2 * l2 + 1, 2 * L + 1))
    for m1, m2 in _pairs(l1, l2, L):
        C[l1 + m1, l2 + m2, L + m1 + m2] = rounded(*_racah(l1, l2, L, m1, m2))
    C.setflags(write=False)
    return C


def su2_clebsch_gordan(l1: int, l2: int, l3: int) -> np.ndarray:
    """Complex-basis coefficients ``⟨l1 m1, l2 m2 | l3 m3⟩`` as ``[2l1+1, 2l2+1, 2l3+1]``
    (index ``l + m``; Condon–Shortley phase; each ``|l3 m3⟩`` column has unit norm)."""
    l1, l2, l3 = _check("su2_clebsch_gordan", l1, l2, l3)
    if not abs(l1 - l2) <= l3 <= l1 + l2:
        return np.zeros((2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1))
    return _su2(l1, l2, l3).copy()


# (-i)^l, the global phase that makes the real-basis coefficients real, as a Gaussian integer
_PHASES = ((1, 0), (0, -1), (-1, 0), (0, 1))


def _times(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] * b[0] - a[1] * b[1], a[0] * b[1] + a[1] * b[0]


@cache
def _exact_change_basis(l: int) -> tuple[tuple[tuple[int, tuple[int, int], int], ...], ...]:
    """e3nn's change of basis exactly: for each complex index ``l + m``, its nonzero entries
    ``(real index, Gaussian integer g, h)``, the entry being ``g · 2^(−h/2)``."""
    phase = _PHASES[l % 4]
    rows = []
    for m in range(-l, l + 1):
        if m < 0:  # (1, -i)/√2 on real indices l + |m|, l - |m|
            entries = ((l - m, (1, 0)), (l + m, (0, -1)))
        elif m == 0:
            entries = ((l, (1, 0)),)
        else:  # (-1)^m (1, i)/√2 on real indices l + m, l - m
            sign = (-1) ** m
            entries = ((l + m, (sign, 0)), (l - m, (0, sign)))
        rows.append(tuple((j, _times(phase, g), int(m != 0)) for j, g in entries))
    return tuple(rows)


@cache
def _change_basis(l: int) -> np.ndarray:
    q = np.zeros((2 * l + 1, 2 * l + 1), dtype=np.complex128)
    for i, row in enumerate(_exact_change_basis(l)):
        for j, (re, im), h in row:
            q[i, j] = complex(re, im) / math.sqrt(2) ** h
    q.setflags(write=False)
    return q


def change_basis_real_to_complex(l: int) -> np.ndarray:
    """e3nn's unitary change of basis ``Q`` for degree ``l`` (real components from ``|l m⟩``)."""
    l = check_degree(l)
    return _change_basis(l).copy()


@cache
def _real(l1: int, l2: int, L: int) -> np.ndarray:
    # C_real[j, k, n] = Σ Q1[i, j] Q2[i', k] conj(Q3[n', n]) ⟨i, i' | n'⟩ / √(2L + 1) (the complex
    # tensor's Frobenius norm: its 2L + 1 columns have unit norm). Each term is a Gaussian integer
    # times √(radicand), the Q's 2^(-1/2) factors and the norm in the radicand. A real coefficient
    # reads the complex coefficients of one set of |m|'s, which share their radicand (Racah's n is
    # symmetric in m -> -m), so its terms are summed exactly and a cancellation is an exact zero.
    Q1, Q2, Q3 = _exact_change_basis(l1), _exact_change_basis(l2), _exact_change_basis(L)
    norm = 2 * L + 1
    sums: dict[tuple[int, int, int], list] = {}  # [re, im, radicand]
    for m1, m2 in _pairs(l1, l2, L):
        Z, n, d = _racah(l1, l2, L, m1, m2)
        if Z == 0:
            continue
        rows = Q1[l1 + m1], Q2[l2 + m2], Q3[L + m1 + m2]
        radicand = (n, d * norm << sum(row[0][2] for row in rows))  # each row's entries share h
        for j, g1, _ in rows[0]:
            for k, g2, _ in rows[1]:
                g12 = _times(g1, g2)
                for i, (re3, im3), _ in rows[2]:
                    re, im = _times(g12, (re3, -im3))
                    entry = sums.setdefault((j, k, i), [0, 0, radicand])
                    if entry[2] != radicand:
                        raise AssertionError(f"clebsch_gordan({l1}, {l2}, {L}): two radicands at {(j, k, i)}")
                    entry[0] += Z * re
                    entry[1] += Z * im
    C = np.zeros((2 * l1 + 1, 2 * l2 + 1, 2 * L + 1))
    roots: dict[tuple[int, int], Decimal] = {}
    for index, (re, im, (n, d)) in sums.items():
        if im != 0:
            raise AssertionError(f"clebsch_gordan({l1}, {l2}, {L}) is not real at {index}")
        if re != 0:
            if (n, d) not in roots:
                roots[n, d] = root(n, d)
            C[index] = times(re, roots[n, d])
    C.setflags(write=False)
    return C


def clebsch_gordan(l1: int, l2: int, l3: int) -> np.ndarray:
    """Real-basis Clebsch–Gordan coefficients ``[2l1+1, 2l2+1, 2l3+1]``, unit Frobenius norm.

    Raises ``ValueError`` unless ``|l1 - l2| <= l3 <= l1 + l2`` (e3nn-jax returns zeros there; a
    path that does not exist is a caller's mistake here).
    """
    l1, l2, l3 = _check("clebsch_gordan", l1, l2, l3)
    if not abs(l1 - l2) <= l3 <= l1 + l2:
        raise ValueError(f"clebsch_gordan({l1}, {l2}, {l3}): the triangle condition |l1 - l2| <= l3 <= l1 + l2 fails")
    return _real(l1, l2, l3).copy()
