"""Tiles, dtypes and interpreter settings shared by the Mosaic GPU kernels of this package.

A Mosaic GPU program is one warpgroup (128 threads); its register arrays hold :data:`LANES`
elements, one per thread (Mosaic's strided warpgroup layout): a ``[rows, width]`` tile with
``rows · width = LANES`` — one row of 128 channels, or for fewer channels several rows (batch rows,
nodes or edges) of ``width`` channels each (:class:`Lanes`). Channel counts that fit no such tile are
zero-padded (a copy of the operands; none otherwise): padded lanes hold zeros, contribute nothing to
the sums over channels, and are sliced off the results.
"""

from __future__ import annotations

from typing import NamedTuple

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


#: The TMA moves rows of at least 16 bytes: 4 float32 channels.
MIN_WIDTH = 4
#: A TMA transfer of one row block (and its shared-memory address) spans a multiple of 128 bytes.
TMA_BYTES = 128


class Lanes(NamedTuple):
    """How a program's ``[rows, width]`` register tile covers the channels.

    ``C >= 128``: ``width = 128``, one row, ``C`` padded to a multiple of 128 (blocks of 128 lanes);
    ``C < 128``: ``width`` = the next power of two ``>= max(C, 4)`` (``C`` padded to it) and
    ``rows = 128 / width`` (e.g. ``C = 16``: 8 rows of 16 channels; ``C = 1``: 32 rows of 4 lanes).

    >>> Lanes.of(16), Lanes.of(1).rows, Lanes.of(300).channels
    (Lanes(width=16, rows=8, channels=16), 32, 384)
    """

    width: int  # channels per tile row
    rows: int  # tile rows per program
    channels: int  # the padded channel count of the operands

    @classmethod
    def of(cls, channels: int) -> Lanes:
        if channels <= 0:
            raise ValueError(f"channels must be positive, got {channels}")
        if channels >= LANES:
            return cls(LANES, 1, padded_channels(channels))
        width = max(MIN_WIDTH, 1 << (channels - 1).bit_length())
        return cls(width, LANES // width, width)

    @property
    def blocks(self) -> int:
        """Channel blocks of ``width`` lanes."""
        return self.channels // self.width

    def block_rows(self, d: int) -> int:
        """``d`` feature rows rounded up so that a ``[d, width]`` float32 block spans a multiple of 128 bytes."""
        unit = max(1, TMA_BYTES // (4 * self.width))
        return -(-d // unit) * unit


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
    return strided(jnp.zeros(shape, dtype))


def strided(v: jax.Array) -> jax.Array:
    """``v`` pinned to the strided warpgroup layout.

    Pinning every row load lets Mosaic's layout inference settle all layouts by propagation alone;
    unpinned loads leave it a search that assigns one variable at a time and re-reduces the whole
    constraint system after each (quadratic in the kernel's op count: most of the lowering time).
    """
    return plgpu.layout_cast(v, plgpu.Layout.WG_STRIDED(v.shape, vec_size=1))


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


#: CUDA's limit on a launch grid's y and z extents (x's is 2**31 - 1).
MAX_GRID_YZ = 65535


def launch_grid(rows: int, lanes: int, names: tuple[str, str]) -> dict:
    """``plgpu.kernel``'s ``grid`` and ``grid_names`` for ``rows`` row groups (nodes, batch rows)
    by ``lanes`` channel blocks, named ``names`` (the kernels read their place by name).

    Pallas's Mosaic GPU lowering reverses the grid: its last axis is CUDA's x. The row groups go first
    (CUDA's y: one group's channel blocks are neighbouring blocks, reading its indices and ``y`` rows
    while they are in L2, the order the H200 timings ran) while they fit y's 65,535 blocks; beyond,
    last (x). JAX does not check the limit: a 65,536-node grid lowered, and would fail at launch.

    >>> launch_grid(1000, 2, ("node", "lanes"))
    {'grid': (1000, 2), 'grid_names': ('node', 'lanes')}
    >>> launch_grid(100_000, 2, ("node", "lanes"))
    {'grid': (2, 100000), 'grid_names': ('lanes', 'node')}
    """
    if rows <= MAX_GRID_YZ:
        return {"grid": (rows, lanes), "grid_names": names}
    return {"grid": (lanes, rows), "grid_names": names[::-1]}


def interpret_params(interpret) -> plgpu.InterpretGPUParams | None:
    """``False`` → compiled; ``True`` → Mosaic's GPU interpreter; an ``InterpretGPUParams`` as given."""
    if interpret is False or interpret is None:
        return None
    if interpret is True:
        return plgpu.InterpretGPUParams()
    if isinstance(interpret, plgpu.InterpretGPUParams):
        return interpret
    raise TypeError(f"interpret must be a bool or plgpu.InterpretGPUParams, got {type(interpret).__name__}")
