"""Block shapes and padding shared by the kernels of this package.

Triton tensors must have power-of-two extents, so a program works on a ``[rows, cb]`` tile whose
channel block ``cb`` is the largest power of two dividing the channel count (capped at
:data:`MAX_CHANNEL_BLOCK`). Feature rows (the ``D`` axis) are never a tensor axis: the contraction
is unrolled over them at trace time, one ``[rows, cb]`` value per feature row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

#: Channel lanes one program covers (one per thread at 4 warps).
MAX_CHANNEL_BLOCK = 128
#: Elements of one ``[rows, cb]`` tile: one per thread of a 4-warp program.
TILE_ELEMENTS = 128


def channel_block(channels: int) -> int:
    """The largest power of two dividing ``channels``, at most :data:`MAX_CHANNEL_BLOCK`.

    Channel counts with a small power-of-two factor (e.g. 24 → 8) give narrow tiles: correct, but
    the batch axis of the tile must then fill the program (see :func:`row_block`).
    """
    if channels <= 0:
        raise ValueError(f"channels must be positive, got {channels}")
    return min(MAX_CHANNEL_BLOCK, channels & -channels)


def row_block(cb: int, rows: int) -> int:
    """Batch rows per tile so that a ``[rows, cb]`` tile has about :data:`TILE_ELEMENTS` elements."""
    target = max(1, TILE_ELEMENTS // cb)
    return max(1, min(target, 1 << max(0, (rows - 1).bit_length())))


def num_warps(elements: int) -> int:
    """Warps for a program whose tiles have ``elements`` elements (one per thread, 1 to 4 warps)."""
    return max(1, min(4, elements // 32))


#: Edge slots per program that clears padding edges' cotangent rows (see :func:`clearing_programs`).
EDGES_PER_CLEARING_PROGRAM = 512
#: At most this many clearing programs: enough to spread the rows over every SM of an H200 (132).
MAX_CLEARING_PROGRAMS = 1024


def clearing_programs(num_edges: int) -> int:
    """Programs that zero the ``dy``/``ds`` rows of the padding edges after a backward's senders.

    The number of padding edges is only known on the device (``num_valid``), so the launch sizes the
    clearing by the edge slots: one program per :data:`EDGES_PER_CLEARING_PROGRAM` slots, capped. A
    single program would write every padding row in turn: e3j-models' buckets keep 11-16 % padding
    edges, 10^5 rows at 10^6 edges (the CUDA backend has the same rule, ``clearing_blocks``).

    >>> clearing_programs(100), clearing_programs(100_000), clearing_programs(10**8)
    (1, 196, 1024)
    """
    return max(1, min(MAX_CLEARING_PROGRAMS, -(-num_edges // EDGES_PER_CLEARING_PROGRAM)))


def clearing_range(num_valid, num_edges: int, program, programs: int) -> tuple:
    """Slots ``[lo, hi)`` of the sorted order (padding last) that clearing program ``program`` of
    ``programs`` zeroes: the padding slots ``[num_valid, num_edges)`` cut into equal runs (an empty
    range where there are fewer slots than programs). Traced scalars in, traced scalars out.

    >>> [tuple(int(v) for v in clearing_range(7, 12, q, 3)) for q in range(3)]
    [(7, 9), (9, 11), (11, 12)]
    """
    per = (num_edges - num_valid + programs - 1) // programs
    lo = num_valid + program * per
    return lo, jnp.minimum(lo + per, num_edges)


# Twin of e3j_pallas_tpu._rows.pad_rows, on purpose: kernel packages depend on e3j-core (numpy only)
# and jax, never on e3j or on each other (docs/design.md), so a jax helper has no shared home.
def pad_rows(a: jnp.ndarray | None, rows: int) -> jnp.ndarray | None:
    """``a`` padded with zero rows along axis 0 to ``rows`` (no copy when already that long)."""
    if a is None or a.shape[0] == rows:
        return a
    return jnp.pad(a, [(0, rows - a.shape[0])] + [(0, 0)] * (a.ndim - 1))


# Twin of e3j_pallas_tpu._rows.result_type, on purpose: kernel packages depend on e3j-core (numpy only)
# and jax, never on e3j or on each other (docs/design.md), so a jax helper has no shared home.
def varying_axes(*trees) -> frozenset:
    """The manual mesh axes (inside ``jax.shard_map``) that any leaf of ``trees`` varies over;
    empty outside a map."""
    varying = frozenset()
    for a in jax.tree.leaves(trees):
        varying |= getattr(getattr(jax.typeof(a), "mat", None), "varying", None) or frozenset()
    return varying


def result_type(shape: tuple[int, ...], dtype, *operands) -> jax.ShapeDtypeStruct:
    """A kernel result's type. Inside ``jax.shard_map`` (whose default ``check_vma=True`` makes
    ``pallas_call`` require it) it varies over every manual mesh axis that any of ``operands``
    (pytrees of arrays) varies over, as e3j's primitives type their results; outside, no axes."""
    varying = varying_axes(*operands)
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.sharding.ManualAxisType(varying=varying))
