"""Drop-ins for e3nn-jax code: ``e3nn.IrrepsArray`` in and out, e3nn's layout and ordering.

Install with the extra ``e3j[e3nn]``; e3nn-jax is imported here only (``import e3j`` never imports
it). Every function equals its e3nn-jax counterpart (tested against it) and runs on e3j's kernels:

- :func:`tensor_product` — ``e3nn.tensor_product``.
- :class:`MessagePassing` / :func:`message_passing` — the gather → tensor product → per-copy
  weights → scatter-sum pattern of NequIP and MACE, fused into one :class:`e3j.Convolution`, with
  e3nn's weight and output order folded into the tables (no run-time gather).
- :class:`FunctionalMessagePassing` — the original NequIP pattern ``scatter_sum(vmap(tp.left_right)(
  w, x[senders], y))`` of a legacy ``FunctionalTensorProduct`` with ``uvu`` instructions, fused.
- :func:`spherical_harmonics` — ``e3nn.spherical_harmonics`` (``IrrepsArray`` input or not).
- :func:`from_irreps_array` / :func:`to_irreps_array` — e3nn's flat layout ↔ e3j's ``[.., D, C]``.
- :func:`to_e3nn_irreps` — any irreps form (e3j's ``Irreps`` included) as ``e3nn.Irreps``, for
  e3nn-jax code (``e3nn.Irreps(...)`` reads e3j's ``Irreps`` too).

See ``docs/porting.md`` for a NequIP layer before and after.

>>> import e3nn_jax as e3nn, jax.numpy as jnp
>>> from e3j import interop
>>> x = e3nn.IrrepsArray("2x0e + 2x1o", jnp.ones((3, 8)))
>>> y = interop.spherical_harmonics("1o + 2e", jnp.ones((3, 3)), normalize=True)
>>> interop.tensor_product(x, y, filter_ir_out="0e + 1o").irreps
2x0e+4x1o
"""

try:
    import e3nn_jax  # noqa: F401
except ImportError as err:  # pragma: no cover - exercised only without the extra
    from e3j_core.dependencies import install_hint

    raise ImportError(f"e3j.interop needs e3nn-jax: {install_hint('e3j', 'e3nn', 'e3nn-jax')}") from err

from .functional import FunctionalMessagePassing
from .layout import from_irreps_array, to_e3nn_irreps, to_irreps_array
from .message_passing import MessagePassing, message_passing
from .spherical_harmonics import spherical_harmonics
from .tensor_product import tensor_product

__all__ = [
    "FunctionalMessagePassing",
    "MessagePassing",
    "from_irreps_array",
    "message_passing",
    "spherical_harmonics",
    "tensor_product",
    "to_e3nn_irreps",
    "to_irreps_array",
]
