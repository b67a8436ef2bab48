"""Padding and 32-bit tracing shared by the kernels of this package."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp


def x32(kernel: Callable) -> Callable:
    """Trace ``kernel`` with 64-bit types off: Mosaic has no 64-bit scalars or indices, and a caller's
    ``jax_enable_x64`` would otherwise turn index constants into ``i64``. Operands keep their dtypes
    (the TPU kernels take float32 and int32 only)."""

    @functools.wraps(kernel)
    def wrapped(*args, **kwargs):
        with jax.enable_x64(False):
            return kernel(*args, **kwargs)

    return wrapped


# Twin of e3j_pallas_gpu._blocks.pad_rows, on purpose: kernel packages depend on e3j-core (numpy only)
# and jax, never on e3j or on each other (docs/design.md), so a jax helper has no shared home.
def pad_rows(a: jnp.ndarray | None, rows: int) -> jnp.ndarray | None:
    """``a`` padded with zero rows along axis 0 to ``rows`` (no copy when already that long)."""
    if a is None or a.shape[0] == rows:
        return a
    return jnp.pad(a, [(0, rows - a.shape[0])] + [(0, 0)] * (a.ndim - 1))


# Twin of e3j_pallas_gpu._blocks.result_type (see pad_rows).
def result_type(shape: tuple[int, ...], dtype, *operands) -> jax.ShapeDtypeStruct:
    """A kernel result's type. Inside ``jax.shard_map`` (whose default ``check_vma=True`` makes
    ``pallas_call`` require it) it varies over every manual mesh axis that any of ``operands``
    (pytrees of arrays) varies over, as e3j's primitives type their results; outside, no axes."""
    varying = frozenset()
    for a in jax.tree.leaves(operands):
        varying |= getattr(getattr(jax.typeof(a), "mat", None), "varying", None) or frozenset()
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.sharding.ManualAxisType(varying=varying))
