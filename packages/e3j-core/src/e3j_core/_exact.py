"""Square roots of exact rationals, rounded to float64 once.

Clebsch–Gordan and spherical-harmonic coefficients are an integer times the square root of a
rational (the spherical harmonics' ``"integral"`` normalization also divides by ``√(4π)``). Each is
computed to :data:`DIGITS` significant digits and rounded to float64 once: the correctly rounded
value unless the exact one lies within ~1e-39 (relative) of a rounding boundary. The square root of
the rational first rounded to float64 rounds twice: one ulp off for 468 of the 19,954 spherical
harmonics' coefficients of degrees up to 20 (all three normalizations' radicands).

>>> rounded(1, 1, 3) == 3 ** -0.5, rounded(-2, 3, 4)
(True, -1.7320508075688772)
"""

from __future__ import annotations

from decimal import Decimal, localcontext

DIGITS = 40
# π to 50 digits, so that 1/√(4π) is rounded with the rest
_PI = Decimal("3.14159265358979323846264338327950288419716939937510")


def root(n: int, d: int, *, over_4pi: bool = False) -> Decimal:
    """``√(n / d)`` (``/ √(4π)`` with ``over_4pi``) for integers ``n >= 0``, ``d > 0``, to :data:`DIGITS`
    digits (to share among coefficients of one radicand: :func:`times`)."""
    with localcontext(prec=DIGITS):
        radicand = Decimal(n) / Decimal(d)
        if over_4pi:
            radicand /= 4 * _PI
        return radicand.sqrt()


def times(z: int, root: Decimal) -> float:
    """``z · root`` rounded to float64 once."""
    with localcontext(prec=DIGITS):
        return float(z * root)


def rounded(z: int, n: int, d: int, *, over_4pi: bool = False) -> float:
    """``z · √(n / d)`` (``/ √(4π)`` with ``over_4pi``) for integers ``z``, ``n >= 0``, ``d > 0``,
    rounded to float64 once."""
    return 0.0 if z == 0 or n == 0 else times(z, root(n, d, over_4pi=over_4pi))
