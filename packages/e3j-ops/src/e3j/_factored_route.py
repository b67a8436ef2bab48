"""Where :class:`e3j.FactoredWeights` reach a convolution as their factors, and where multiplied out.

A factored primitive pays off only where a backend computes the weights inside its sweep (the
reference, e3j's CPU path): the per-edge array is then never written. A backend without factored
kernels (e3j's GPU and TPU kernels) would multiply the weights out inside every primitive call —
the forward, the backward, each call of a second-order derivative — where weights multiplied out
in the program before an array primitive are computed once and kept for the backward, as a dense
layer's output is. The values are the same either way; this decides the cost only.

The backend is selected when a primitive is lowered, for the platform it is lowered for; the op
binds before that, when traced. So it asks now what lowering will select on each platform (the
same policy, :func:`e3j.backends.select_backend`, without its warnings, which lowering gives) and
binds both forms behind :func:`jax.lax.platform_dependent` where the platforms differ: lowering for
one platform keeps one branch (a compiled program holds no trace of the other, nor of its
residuals).
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from ._primitives.grouped_convolution import factored_backend
from ._primitives.multilinear import PLATFORMS, coo_lmax
from .backends import Backend, BackendError, OpRequest, provides, select_backend
from .factored import FactoredWeights


def selected(req: OpRequest, requested: str | None) -> Backend:
    """The backend lowering will select for ``req``, if its kernels load (without the selection's
    warnings, and without importing the kernels of backends that declare them: on a CPU-only host
    the GPU and TPU backends' modules would add Pallas's JAX options mid-program, and every function
    jitted before would compile again; lowering imports them, for its platform only)."""
    return select_backend(req, requested, warn=False, load=False)


def _fusing(fuses: Callable[[str], bool]) -> tuple[str, ...]:
    platforms = []
    for platform in PLATFORMS:
        try:
            if fuses(platform):
                platforms.append(platform)
        except BackendError:  # nothing can run there: lowering for it says so, naming the backend
            pass
    return tuple(platforms)


def convolution_fusing(coo, dtype, channels: int, requested: str | None) -> tuple[str, ...]:
    """The platforms whose selected backend has ``convolution_factored`` kernels for this call."""
    name = jax.numpy.dtype(dtype).name

    def fuses(platform: str) -> bool:
        req = OpRequest("convolution", platform, name, channels, coo_lmax(coo))
        return provides(selected(req, requested), "convolution_factored")

    return _fusing(fuses)


def grouped_fusing(plan, dtype, requested: str | None) -> tuple[str, ...]:
    """The platforms on which one selected backend runs every group of ``plan`` with factored
    grouped kernels (as the grouped primitive's lowering decides)."""
    name = jax.numpy.dtype(dtype).name
    return _fusing(lambda platform: factored_backend(plan, platform, requested, name, selected) is not None)


def by_platform(fusing: tuple[str, ...], factored: Callable, array: Callable, *operands):
    """``factored(*operands)`` on the platforms ``fusing``, ``array(*operands)`` on the others."""
    if set(PLATFORMS) <= set(fusing):
        return factored(*operands)
    if not fusing:
        return array(*operands)
    return jax.lax.platform_dependent(*operands, **dict.fromkeys(fusing, factored), default=array)


def factored_or_array(
    fusing: tuple[str, ...],
    bind_factored: Callable,
    bind_array: Callable,
    x: jax.Array,
    y: jax.Array,
    w: FactoredWeights,
    graph_tree,
    leaves: tuple,
):
    """Binds a convolution whose weights ``w`` are factors, as factors on the platforms ``fusing``
    (``bind_factored(x, y, hidden, kernel, leaves)``, the bias folded into them) and multiplied out
    elsewhere (``bind_array(x, y, s [E, W], leaves)``, computed once and kept for the backward by AD).

    Padding edges' rows of ``hidden`` may hold anything (NaN): the fused kernels zero them chunk by
    chunk, so only the array route masks ``hidden`` (a copy of ``[E, H]``).
    """

    def edge_mask(leaves):
        return jax.tree.unflatten(graph_tree, leaves).edge_mask

    def factored(x, y, w, leaves):
        return bind_factored(x, y, *w.folded(edge_mask(leaves)), leaves)

    def array(x, y, w, leaves):
        return bind_array(x, y, w.masked(edge_mask(leaves)).materialize(), leaves)

    return by_platform(fusing, factored, array, x, y, w, tuple(leaves))
