"""VMEM budget of the TPU kernels (paper Table 4): buffer bytes per tile configuration, tile choice.

VMEM arrays are laid out in ``(8, 128)`` tiles over their last two axes (sublanes × lanes, 32-bit
elements), so a buffer costs its shape rounded up to whole tiles: a channel block narrower than 128
lanes still occupies 128 lanes (this is the cost of channel counts below 128 — memory traffic is
unchanged, vector work is ``128 / C`` times the useful work).

The counts cover the kernels' own arrays only; the unrolled contraction also spills vector registers
into VMEM (the paper measures about 9 MiB more at lmax 3, 128 channels), hence the margin between
:data:`BUFFER_BUDGET` and the 16 MiB a TensorCore has.

>>> from e3j_core import tensor_product_coo
>>> coo = tensor_product_coo("0e + 1o + 2e + 3o", "0e + 1o + 2e + 3o", filter="0e + 1o + 2e + 3o")
>>> conv = convolution_tile(coo, channels=128, itemsize=4, y_channels=False)
>>> conv.edges, conv.total <= BUFFER_BUDGET
(64, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from e3j_core import TensorProductCoo

__all__ = [
    "BUFFER_BUDGET",
    "SPILL_MARGIN",
    "VMEM_PER_CORE",
    "Tile",
    "buffer_bytes",
    "channel_block",
    "compiler_params",
    "convolution_bwd_tile",
    "convolution_tile",
    "tensor_product_tile",
    "vmem_limit",
]

#: VMEM of one TensorCore (v4, v5e, v6e: 16 MiB by default scoped limit).
VMEM_PER_CORE = 16 * 2**20
#: What the kernels' own buffers may take; the rest is left to the compiler's register spills.
BUFFER_BUDGET = 6 * 2**20

_SUBLANES, _LANES = 8, 128


def buffer_bytes(shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes of a VMEM array: the last two axes rounded up to whole ``(8, 128)`` 32-bit tiles."""
    shape = tuple(int(d) for d in shape)
    if len(shape) == 1:
        shape = (1, *shape)
    packing = max(1, 4 // itemsize)  # 16-bit types pack two rows per sublane
    rows = math.ceil(shape[-2] / (_SUBLANES * packing)) * _SUBLANES * packing
    lanes = math.ceil(shape[-1] / _LANES) * _LANES
    return math.prod(shape[:-2]) * rows * lanes * itemsize


def channel_block(channels: int) -> int:
    """Channels per program: 128 lanes when ``channels`` is a multiple of 128, else all of them."""
    if channels <= 0:
        raise ValueError(f"channels must be positive, got {channels}")
    return 128 if channels % 128 == 0 else channels


@dataclass(frozen=True)
class Tile:
    """A tile configuration and its VMEM buffers (bytes per named buffer)."""

    edges: int  # edges (convolution) or batch rows (tensor product) per tile
    channels: int  # channel block
    buffers: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(b for _, b in self.buffers)


def _y_shape(coo, rows, cq, y_channels):
    return (rows, coo.dim_y, cq) if y_channels else (rows, coo.dim_y)


def _conv_buffers(
    coo: TensorProductCoo, edges: int, cq: int, itemsize: int, y_channels: bool, backward: bool, walk: bool = False
):
    b = edges
    bufs = [
        ("x gathered [B, Dx, Cq]", (b, coo.dim_x, cq)),
        ("y [B, Dy(, Cq)]", _y_shape(coo, b, cq, y_channels)),
        ("s [B, P, Cq]", (b, coo.num_paths, cq)),
    ]
    if not backward:
        bufs += [
            ("messages [B, Dout, Cq]", (b, coo.dim_out, cq)),
            ("accumulator [8, Dout, Cq]", (_SUBLANES, coo.dim_out, cq)),
            ("flush stage [Dout, Cq]", (coo.dim_out, cq)),
            ("zero row [Dout, Cq]", (coo.dim_out, cq)),
        ]
    else:
        bufs += [
            ("dm gathered [B, Dout, Cq]", (b, coo.dim_out, cq)),
            ("dx tile [B, Dx, Cq]", (b, coo.dim_x, cq)),
            ("dy tile [B, Dy(, Cq)]", _y_shape(coo, b, cq, y_channels)),
            ("ds tile [B, P, Cq]", (b, coo.num_paths, cq)),
            ("accumulator [8, Dx, Cq]", (_SUBLANES, coo.dim_x, cq)),
            ("flush stage [Dx, Cq]", (coo.dim_x, cq)),
            ("zero row [Dx, Cq]", (coo.dim_x, cq)),
        ]
    if walk:  # the record walk's [D, B, Cq] copies of the operand and result tiles
        rows = [("x", coo.dim_x), ("y", coo.dim_y), ("s", coo.num_paths)]
        rows += [("dm", coo.dim_out), ("dx", coo.dim_x), ("dy", coo.dim_y), ("ds", coo.num_paths)] if backward else []
        rows += [] if backward else [("m", coo.dim_out)]
        bufs += [(f"{n} rows [{d}, B, Cq]", (d, b, cq)) for n, d in rows]
    return tuple((name, buffer_bytes(shape, itemsize)) for name, shape in bufs)


#: VMEM left to the compiler's register spills beside the kernels' own buffers (the paper measures
#: about 9 MiB at lmax 3, 128 channels).
SPILL_MARGIN = 10 * 2**20


def vmem_limit(tile: Tile) -> int | None:
    """The scoped VMEM limit to ask Mosaic for: ``None`` (its default, 16 MiB on v4/v5e) while the
    tile's buffers fit :data:`BUFFER_BUDGET`, else the buffers plus :data:`SPILL_MARGIN`, in whole MiB.

    Only the smallest tile of a walked table exceeds the budget (at 128 channels from lmax 5: 6.0-6.9
    MiB of buffers, 23-30 MiB at lmax 8); TensorCores with 128 MiB of VMEM (v5e, v6e) serve that.

    >>> vmem_limit(Tile(8, 128, (("a", BUFFER_BUDGET),))) is None
    True
    >>> vmem_limit(Tile(8, 128, (("a", 20 * 2**20),))) == 30 * 2**20
    True
    """
    if tile.total <= BUFFER_BUDGET:
        return None
    mib = 2**20
    return -(-(tile.total + SPILL_MARGIN) // mib) * mib


def compiler_params(tile: Tile, dimension_semantics: tuple[str, ...]):
    """``pltpu.CompilerParams`` for a kernel whose VMEM buffers are ``tile``'s (see :func:`vmem_limit`)."""
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.CompilerParams(dimension_semantics=dimension_semantics, vmem_limit_bytes=vmem_limit(tile))


def _pick(candidates, make) -> Tile:
    tiles = [make(b) for b in candidates]
    fitting = [t for t in tiles if t.total <= BUFFER_BUDGET]
    return fitting[0] if fitting else tiles[-1]


_EDGE_TILES = (128, 64, 32, 16, 8)


def convolution_tile(
    coo: TensorProductCoo, *, channels: int, itemsize: int, y_channels: bool, walk: bool = False
) -> Tile:
    """The largest edge tile (128 … 8) whose forward buffers fit :data:`BUFFER_BUDGET` (``walk``: with
    the record walk's row copies)."""
    cq = channel_block(channels)
    return _pick(
        _EDGE_TILES, lambda b: Tile(b, cq, _conv_buffers(coo, b, cq, itemsize, y_channels, backward=False, walk=walk))
    )


def convolution_bwd_tile(
    coo: TensorProductCoo, *, channels: int, itemsize: int, y_channels: bool, walk: bool = False
) -> Tile:
    """The largest edge tile (128 … 8) whose backward buffers fit :data:`BUFFER_BUDGET` (``walk``: with
    the record walk's row copies)."""
    cq = channel_block(channels)
    return _pick(
        _EDGE_TILES, lambda b: Tile(b, cq, _conv_buffers(coo, b, cq, itemsize, y_channels, backward=True, walk=walk))
    )


def tensor_product_tile(
    coo: TensorProductCoo,
    *,
    channels: int,
    itemsize: int,
    y_channels: bool,
    backward: bool = False,
    walk: bool = False,
) -> Tile:
    """The largest batch tile (256 … 8) whose double-buffered blocks fit :data:`BUFFER_BUDGET`.

    ``walk``: the kernel walks the records, with a ``[D, bt, Cq]`` copy of every operand and result.
    """
    cq = channel_block(channels)

    def make(b):
        ins = [("x [bt, Dx, Cq]", (b, coo.dim_x, cq)), ("y [bt, Dy(, Cq)]", _y_shape(coo, b, cq, y_channels))]
        if not backward:
            outs = [("z [bt, Dout, Cq]", (b, coo.dim_out, cq))]
        else:
            ins.append(("dz [bt, Dout, Cq]", (b, coo.dim_out, cq)))
            outs = [("dx [bt, Dx, Cq]", (b, coo.dim_x, cq)), ("dy [bt, Dy(, Cq)]", _y_shape(coo, b, cq, y_channels))]
        # the pipeline double-buffers every block
        bufs = [(f"{n} x2", 2 * buffer_bytes(s, itemsize)) for n, s in ins + outs]
        if walk:
            dims = [("x", coo.dim_x), ("y", coo.dim_y), ("z" if not backward else "dz", coo.dim_out)]
            dims += [("dx", coo.dim_x), ("dy", coo.dim_y)] if backward else []
            bufs += [(f"{n} rows [{n_dim}, bt, Cq]", buffer_bytes((n_dim, b, cq), itemsize)) for n, n_dim in dims]
        return Tile(b, cq, tuple(bufs))

    return _pick((256, 128, 64, 32, 16, 8), make)
