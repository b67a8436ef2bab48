"""Measuring helpers shared by the benchmark scripts and ``python -m e3j bench`` (private).

Throughput follows the paper (§3, Appendix D.1): bytes of every input and output array divided by
the time of one call; a backward pass counts its primals, the output cotangents and the input
cotangents. Time is the mean of the fastest 20 % of ``runs`` calls with the garbage collector off.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

__all__ = ["copy_bandwidth", "nbytes", "throughput", "time_call"]


def nbytes(*trees) -> int:
    """Total bytes of all array leaves (shape × itemsize; works on ShapeDtypeStructs too)."""
    total = 0
    for tree in trees:
        for leaf in jax.tree.leaves(tree):
            total += math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def time_call(fn: Callable, *args, runs: int = 100, fastest: float = 0.2, warmup: int = 2) -> float:
    """Mean seconds of the fastest ``fastest`` fraction of ``runs`` calls of ``fn(*args)``.

    Each call is waited for (``block_until_ready``); the first ``warmup`` calls (compilation) are
    not timed; the garbage collector is disabled while timing.
    """
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    if not 0 < fastest <= 1:
        raise ValueError(f"fastest must be in (0, 1], got {fastest}")
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(runs):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - t0)
    finally:
        if enabled:
            gc.enable()
    keep = max(1, round(runs * fastest))
    return sum(sorted(times)[:keep]) / keep


def throughput(num_bytes: int, seconds: float) -> float:
    """Bytes per second."""
    return num_bytes / seconds


def copy_bandwidth(num_bytes: int, *, runs: int = 100, dtype=jnp.float32, device=None) -> tuple[float, float]:
    """``(seconds, bytes/s)`` of a jitted copy of a ``num_bytes`` array (read + write counted).

    The ceiling any memory-bound kernel can reach on this device, measured in the same run.
    """
    n = max(1, num_bytes // jnp.dtype(dtype).itemsize)
    src = jax.device_put(jnp.arange(n, dtype=dtype), device)
    # a + 1: XLA cannot elide it, so every element is read once and written once
    copy = jax.jit(lambda a: a + jnp.asarray(1, dtype))
    seconds = time_call(copy, src, runs=runs)
    return seconds, throughput(2 * n * jnp.dtype(dtype).itemsize, seconds)
