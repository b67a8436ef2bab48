"""Tiles, dtypes and interpreter settings shared by the Mosaic GPU kernels of this package.

A Mosaic GPU program is one warpgroup (128 threads); its register arrays hold :data:`LANES`
elements, one per thread (Mosaic's strided warpgroup layout): a ``[LANES]`` channel row, or for the
tensor product with fewer channels a ``[rows, C]`` tile of several batch rows. Other channel counts
are zero-padded to a multiple of :data:`LANES` (a copy of the operands; none otherwise): padded lanes
hold zeros, contribute nothing to the sums over channels, and are sliced off the results.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

#: Channels one program covers: one per thread of a warpgroup.
LANES = 128
#: Mosaic GPU's TMA has no float64 transfers (``unsupported TMA dtype f64`` at lowering).
DTYPES = ("float32",)


def check_dtype(dtype, what: str) -> jnp.dtype:
    """``dtype`` if the Mosaic kernels support it, else a ``TypeError`` naming ``what``."""
    dtype = jnp.dtype(dtype)
    if dtype.name not in DTYPES:
        raise TypeError(
            f"{what}: the Mosaic GPU kernels support {', '.join(DTYPES)}, got {dtype.name} "
            "(Mosaic GPU's TMA has no float64 transfers); use the pallas_gpu (Triton) or cuda backend"
        )
    return dtype


def padded_channels(channels: int) -> int:
    """``channels`` rounded up to a multiple of :data:`LANES`."""
    return -(-channels // LANES) * LANES


def pad_channels(a: jax.Array | None, channels: int) -> jax.Array | None:
    """``a`` zero-padded along its last axis to ``channels`` (no copy when already that wide)."""
    if a is None or a.shape[-1] == channels:
        return a
    return jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, channels - a.shape[-1])])


def zeros(dtype, shape: tuple[int, ...] = (LANES,)) -> jax.Array:
    """A zero tile in the strided warpgroup layout (a loop carry's layout must not change)."""
    return plgpu.layout_cast(jnp.zeros(shape, dtype), plgpu.Layout.WG_STRIDED(shape, vec_size=1))


def stage(copies) -> None:
    """TMA copies ``(gmem_slice, smem, barrier)`` into shared memory: all issued, then all waited for."""
    for src, dst, barrier in copies:
        plgpu.copy_gmem_to_smem(src, dst, barrier)
    for _, _, barrier in copies:
        plgpu.barrier_wait(barrier)


def flush(copies) -> None:
    """TMA stores ``(smem, gmem_slice)`` of shared-memory blocks this warpgroup wrote, waited for."""
    plgpu.commit_smem()  # the warpgroup's writes are visible to the TMA
    for src, dst in copies:
        plgpu.copy_smem_to_gmem(src, dst)
    plgpu.wait_smem_to_gmem(0)


def interpret_params(interpret) -> plgpu.InterpretGPUParams | None:
    """``False`` → compiled; ``True`` → Mosaic's GPU interpreter; an ``InterpretGPUParams`` as given."""
    if interpret is False or interpret is None:
        return None
    if interpret is True:
        return plgpu.InterpretGPUParams()
    if isinstance(interpret, plgpu.InterpretGPUParams):
        return interpret
    raise TypeError(f"interpret must be a bool or plgpu.InterpretGPUParams, got {type(interpret).__name__}")
