"""Where :class:`e3j.FactoredWeights` reach a convolution as their factors, and where multiplied out.

A factored primitive pays off only where a backend computes the weights inside its sweep (the
reference, e3j's CPU path): the per-edge array is then never written. A backend without factored
kernels (e3j's GPU and TPU kernels) would multiply the weights out inside every primitive call —
the forward, the backward, each call of a second-order derivative — where weights multiplied out
in the program before an array primitive are computed once and kept for the backward, as a dense
layer's output is. The values are the same either way; this decides the cost only.

The backend is selected when a primitive is lowered, for the platform it is lowered for; the op
decides before that, when traced, so it binds both forms behind :func:`jax.lax.platform_dependent`
where the platforms differ: lowering keeps one (a compiled program holds no trace of the other,
nor of its residuals).
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from ._primitives.multilinear import PLATFORMS
from .backends import BackendError, get_backend, kernels_of

#: the platforms whose default backend runs factored weights inside its sweeps: the reference
#: (every CPU program). The GPU and TPU backends e3j ships have no factored kernels.
FUSING_PLATFORMS = ("cpu",)


def fusing_platforms(op: str, requested: str | None) -> tuple[str, ...]:
    """The platforms on which a convolution given factored weights binds its factored primitive
    ``op`` (``"convolution_factored"`` or ``"grouped_convolution_factored"``): without a request,
    :data:`FUSING_PLATFORMS`; with one (``backend=``, :func:`e3j.use_backend`), every platform if
    that backend has the kernels ``op``, else none."""
    if requested is None:
        return FUSING_PLATFORMS
    try:
        return PLATFORMS if kernels_of(get_backend(requested)).provides(op) else ()
    except BackendError:  # lowering reports it, naming the backend
        return ()


def by_platform(fusing: tuple[str, ...], factored: Callable, array: Callable, *operands):
    """``factored(*operands)`` on the platforms ``fusing``, ``array(*operands)`` on the others."""
    if set(PLATFORMS) <= set(fusing):
        return factored(*operands)
    if not fusing:
        return array(*operands)
    return jax.lax.platform_dependent(*operands, **dict.fromkeys(fusing, factored), default=array)
