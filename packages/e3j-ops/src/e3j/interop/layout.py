"""e3nn-jax's flat ``IrrepsArray`` ↔ e3j's ``[.., D, C]`` arrays.

An e3nn irreps ``m1 x ir1 + m2 x ir2 + ...`` with ``C`` dividing every ``m_i`` is e3j's
``(m1/C) x ir1 + ...`` with ``C`` channels (copy ``u = k·C + c`` is copy ``k``, channel ``c``; see
:func:`e3j.from_mul_ir`). By default ``C`` is the gcd of the multiplicities: ``"32x0e + 32x1o"``
becomes ``"0e + 1o"`` with 32 channels, ``"64x0e + 32x1o + 16x2e"`` becomes
``"4x0e + 2x1o + 2e"`` with 16 channels.

>>> import e3nn_jax as e3nn, jax.numpy as jnp
>>> x, irreps = from_irreps_array(e3nn.IrrepsArray("4x0e + 2x1o", jnp.ones((5, 10))))
>>> x.shape, irreps
((5, 5, 2), 2x0e+1x1o)
>>> to_irreps_array(x, irreps).irreps
4x0e+2x1o
"""

from __future__ import annotations

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp

from e3j_core import Irreps, as_irreps

from .._checks import check_positive_int
from .._mul_ir_plan import channels_of, split_channels
from ..layout import from_mul_ir, mul_ir_irreps, to_mul_ir

__all__ = ["from_irreps_array", "to_e3nn_irreps", "to_irreps_array"]


def from_irreps_array(x: e3nn.IrrepsArray, channels: int | None = None) -> tuple[jax.Array, Irreps]:
    """``IrrepsArray [..., Σ m_i (2l_i+1)] -> ([..., D, C], e3j irreps)``, ``C = channels`` or the gcd."""
    if not isinstance(x, e3nn.IrrepsArray):
        raise TypeError(f"x must be an e3nn.IrrepsArray, got {type(x).__name__}")
    irreps = Irreps(x.irreps)
    if channels is None:
        channels = channels_of(irreps)
    channels = check_positive_int("channels", channels)
    if any(mul % channels for mul, _ in irreps):
        raise ValueError(f"channels={channels} must divide every multiplicity of {irreps}")
    ours = split_channels(irreps, channels)
    return from_mul_ir(x.array, ours, channels), ours


def to_irreps_array(x: jax.Array, irreps) -> e3nn.IrrepsArray:
    """``[..., D, C]`` with e3j irreps ``irreps`` -> e3nn's ``IrrepsArray`` of ``mul_ir_irreps(irreps, C)``."""
    irreps = as_irreps(irreps, "irreps")
    flat = to_mul_ir(x, irreps)  # checks x
    return e3nn.IrrepsArray(to_e3nn_irreps(mul_ir_irreps(irreps, jnp.shape(x)[-1])), flat)


def to_e3nn_irreps(irreps) -> e3nn.Irreps:
    """The same irreps as an ``e3nn.Irreps``, from any irreps form e3j reads (an e3nn-jax
    ``Irreps``, a string, e3j's ``Irreps`` such as ``e3j.flax.Linear(...).output_irreps()``; the
    last ``e3nn.Irreps(...)`` also reads, an ``e3j.Irrep`` being the pair ``(l, p)``).

    >>> import e3j, e3nn_jax as e3nn
    >>> out = to_e3nn_irreps(e3j.Irreps("2x0e + 1o"))
    >>> out, isinstance(out, e3nn.Irreps)
    (2x0e+1x1o, True)
    """
    return e3nn.Irreps([(mul, (ir.l, ir.p)) for mul, ir in Irreps(irreps)])
