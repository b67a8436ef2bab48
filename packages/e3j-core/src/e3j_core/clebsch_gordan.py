"""Clebsch–Gordan coefficients of the real irreps of SO(3) (paper Appendix G.2).

``clebsch_gordan(l1, l2, l3)`` is a ``float64 [2l1+1, 2l2+1, 2l3+1]`` array ``C`` of unit Frobenius
norm such that ``z_k = Σ_ij C_ijk x_i y_j`` is equivariant: ``C(D1 x, D2 y) = D3 C(x, y)`` with the
real-basis Wigner D matrices of :mod:`e3j_core.wigner`. It equals ``e3nn_jax.clebsch_gordan``.

Construction: in the complex ``|l m⟩`` basis the top state ``|L L⟩`` of ``l1 ⊗ l2`` solves the
eigenvalue equation ``J²|L L⟩ = L(L+1)|L L⟩`` restricted to ``m1 + m2 = L``: a triangular
(three-term) recurrence in ``m1`` (paper Eq. 25). Its sign is the Condon–Shortley one
(``⟨l1 l1, l2 L−l1 | L L⟩ > 0``). The other states come from the lowering operator
``J₋ ⊗ 1 + 1 ⊗ J₋``. The result is moved to the real basis with e3nn's change of basis.

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
from decimal import Decimal, localcontext
from functools import cache

import numpy as np

from ._checks import check_degree

__all__ = ["change_basis_real_to_complex", "clebsch_gordan", "su2_clebsch_gordan"]


def _check(where: str, l1: object, l2: object, l3: object) -> tuple[int, int, int]:
    try:
        return check_degree(l1, "l1"), check_degree(l2, "l2"), check_degree(l3, "l3")
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


_PRECISION = 60  # decimal digits for the su(2) solve; the result is then rounded to float64


def _raise(l: int, m: int) -> Decimal:
    """``⟨l, m+1| J₊ |l, m⟩``."""
    return Decimal(l * (l + 1) - m * (m + 1)).sqrt()


def _lower(l: int, m: int) -> Decimal:
    """``⟨l, m−1| J₋ |l, m⟩``."""
    return Decimal(l * (l + 1) - m * (m - 1)).sqrt()


def _normalized(values: dict) -> dict:
    norm = sum(v * v for v in values.values()).sqrt()
    return {k: v / norm for k, v in values.items()}


@cache
def _su2(l1: int, l2: int, L: int) -> np.ndarray:
    # Both the three-term recurrence and the 2L lowering steps lose digits in float64 (about 1e-12
    # by l = 8); 60-digit decimals keep every float64 coefficient correctly rounded.
    with localcontext(prec=_PRECISION):
        zero = Decimal(0)
        # top state: V[m1] for m1 + m2 = L, m1 in [m1_min, l1]  (paper Eq. 25)
        m1_min = max(-l1, L - l2)
        V = {m1_min - 1: zero, m1_min: Decimal(1)}
        target = L * (L + 1)
        for m1 in range(m1_min, l1):
            m2 = L - m1
            diagonal = l1 * (l1 + 1) + l2 * (l2 + 1) + 2 * m1 * m2
            from_below = _raise(l1, m1 - 1) * _lower(l2, m2 + 1) if m1 - 1 >= m1_min else zero
            from_above = _lower(l1, m1 + 1) * _raise(l2, m2 - 1)
            V[m1 + 1] = ((target - diagonal) * V[m1] - from_below * V[m1 - 1]) / from_above
        state = _normalized({(m1, L - m1): V[m1] for m1 in range(m1_min, l1 + 1)})
        if state[(l1, L - l1)] < 0:  # Condon–Shortley: <l1 l1, l2 L-l1 | L L> > 0
            state = {k: -v for k, v in state.items()}
        lower1 = {m: _lower(l1, m) for m in range(-l1, l1 + 1)}
        lower2 = {m: _lower(l2, m) for m in range(-l2, l2 + 1)}

        C = np.zeros((2 * l1 + 1, 2 * l2 + 1, 2 * L + 1))
        for M in range(L, -L - 1, -1):
            for (m1, m2), v in state.items():
                C[l1 + m1, l2 + m2, L + M] = float(v)
            if M == -L:
                break
            nxt: dict = {}
            for (m1, m2), v in state.items():
                if m1 > -l1:
                    nxt[(m1 - 1, m2)] = nxt.get((m1 - 1, m2), zero) + lower1[m1] * v
                if m2 > -l2:
                    nxt[(m1, m2 - 1)] = nxt.get((m1, m2 - 1), zero) + lower2[m2] * v
            state = _normalized(nxt)
    return C


def su2_clebsch_gordan(l1: int, l2: int, l3: int) -> np.ndarray:
    """Complex-basis coefficients ``⟨l1 m1, l2 m2 | l3 m3⟩`` as ``[2l1+1, 2l2+1, 2l3+1]``
    (index ``l + m``; Condon–Shortley phase; each ``|l3 m3⟩`` column has unit norm)."""
    l1, l2, l3 = _check("su2_clebsch_gordan", l1, l2, l3)
    if not abs(l1 - l2) <= l3 <= l1 + l2:
        return np.zeros((2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1))
    return _su2(l1, l2, l3).copy()


@cache
def _change_basis(l: int) -> np.ndarray:
    q = np.zeros((2 * l + 1, 2 * l + 1), dtype=np.complex128)
    s = 1 / math.sqrt(2)
    for m in range(-l, 0):
        q[l + m, l + abs(m)] = s
        q[l + m, l - abs(m)] = -1j * s
    q[l, l] = 1
    for m in range(1, l + 1):
        q[l + m, l + abs(m)] = (-1) ** m * s
        q[l + m, l - abs(m)] = 1j * (-1) ** m * s
    # The global phase (-i)^l makes the real-basis Clebsch–Gordan coefficients real.
    q = (-1j) ** l * q
    q.setflags(write=False)
    return q


def change_basis_real_to_complex(l: int) -> np.ndarray:
    """e3nn's unitary change of basis ``Q`` for degree ``l`` (real components from ``|l m⟩``)."""
    l = check_degree(l)
    return _change_basis(l).copy()


@cache
def _real(l1: int, l2: int, l3: int) -> np.ndarray:
    Q1, Q2, Q3 = _change_basis(l1), _change_basis(l2), _change_basis(l3)
    C = np.einsum("ij,kl,mn,ikn->jlm", Q1, Q2, np.conj(Q3.T), _su2(l1, l2, l3), optimize=True)
    if np.abs(C.imag).max(initial=0.0) > 1e-10:
        raise AssertionError(f"clebsch_gordan({l1}, {l2}, {l3}) is not real")
    C = np.ascontiguousarray(C.real)
    C[np.abs(C) < 1e-14] = 0.0  # exact zeros, not rounding noise, so sparsity is structural
    C /= np.linalg.norm(C)
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
