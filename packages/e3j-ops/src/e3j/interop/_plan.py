"""Static plans mapping e3nn-jax's flat layout and copy order onto e3j's ``[.., D, C]`` ops (private).

e3nn-jax stores features flat (``mul_ir``: each block ``mul`` copies of ``2l+1`` numbers) and numbers
the output copies of a tensor product as its own loops do; e3j stores ``[.., D, C]`` with the
channels trailing and one row block per path. A plan is computed once per set of irreps (numpy,
cached) and says:

- how many channels ``C`` the node features split into: the gcd of their multiplicities, each block
  ``m x ir`` becoming ``(m / C) x ir`` with ``C`` channels (copy ``u = k·C + c`` of the block is
  copy ``k``, channel ``c``, as in :func:`e3j.from_mul_ir`);
- the e3j descriptor, its paths put in the order e3nn numbers its output copies (via
  :func:`e3j_core.select_paths`), so that e3nn's per-copy weights ``[.., num_copies]`` are e3j's
  ``[.., P, C]`` by a reshape and e3j's output is e3nn's by :func:`e3j.to_mul_ir`;
- only where that cannot hold (an edge operand with a multiplicity above 1, whose copies e3nn
  interleaves with the channels), static gather indices for the weights and the output.

e3nn's copy order is read from core's own enumeration of paths: the descriptor of the same product
with every copy a path and one channel (``C = 1``) numbers its paths exactly as e3nn numbers its
output copies, so no rule of e3nn's is written twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from e3j_core import Irrep, Irreps, TensorProductCoo, select_paths, tensor_product_coo


@dataclass(frozen=True, eq=False)
class Plan:
    """``coo``: e3j's descriptor (paths in e3nn's copy order); ``channels``: ``C``;
    ``irreps_x``: e3j's irreps of the node features; ``irreps_out``: e3nn's output irreps;
    ``weight_index``: ``None`` when e3nn's weights reshape to ``[.., P, C]``, else ``int [P, C]``
    indices into e3nn's weight axis; ``out_index``: ``None`` when ``to_mul_ir`` gives e3nn's output,
    else ``int [Dout_e3nn]`` indices into the output flattened as ``[.., Dout · C]``;
    ``constant_row``: the operand ``y`` is ``[1, y]``."""

    coo: TensorProductCoo
    channels: int
    irreps_x: Irreps
    irreps_out: Irreps
    weight_index: np.ndarray | None = field(repr=False)
    out_index: np.ndarray | None = field(repr=False)
    constant_row: bool = False  # y' = [1, y]: the self connection's constant 0e edge attribute

    @property
    def num_weights(self) -> int:
        return self.coo.num_paths * self.channels


def channels_of(irreps: Irreps) -> int:
    """The gcd of the nonzero multiplicities (1 when there are none)."""
    return math.gcd(*(mul for mul, _ in irreps if mul > 0)) or 1


def split_channels(irreps: Irreps, channels: int) -> Irreps:
    """``m x ir -> (m / C) x ir``."""
    return Irreps([(mul // channels, ir) for mul, ir in irreps])


@cache
def plan(
    irreps_x: Irreps,
    irreps_y: Irreps,
    filter_out: tuple[Irrep, ...] | None,
    keep: tuple[Irrep, ...] | None,
    normalization: str,
    regroup_output: bool,
) -> Plan:
    """The plan of e3nn's ``tensor_product(x, y, filter_ir_out=filter_out)`` (``keep`` None), or of
    ``concatenate([x.filter(keep), tensor_product(x, y, filter_ir_out=filter_out)]).regroup()``, in
    which case the e3j operand ``y`` is ``"0e" + irreps_y`` with a constant first row of ones (the
    copy of ``x`` is ``x ⊗ 1`` through the ``0e`` path, exactly).

    ``irreps_x``/``irreps_y`` are e3nn's flat irreps (full multiplicities).
    """
    with_self = keep is not None
    irreps_y_op = Irreps("0e") + irreps_y if with_self else irreps_y
    allowed = None if filter_out is None else set(filter_out)
    wanted = allowed if not with_self or allowed is None else allowed | set(keep)
    wanted_filter = None if wanted is None else tuple(sorted(wanted))

    # e3nn's copies, one path each (C = 1), in e3nn's order
    full = tensor_product_coo(
        irreps_x, irreps_y_op, wanted_filter, normalization=normalization, regroup_output=regroup_output
    )
    e3nn_order = _e3nn_copy_order(full, irreps_x, with_self, allowed, keep)
    copy_of = {_label(full.paths[j]): n for n, j in enumerate(e3nn_order)}

    C = channels_of(irreps_x)
    irreps_x_op = split_channels(irreps_x, C)
    ops = tensor_product_coo(
        irreps_x_op, irreps_y_op, wanted_filter, normalization=normalization, regroup_output=regroup_output
    )
    full_row = _full_rows(irreps_x, irreps_x_op, C)  # [Dx_op rows that start a copy] -> [C] full rows

    index = np.full((ops.num_paths, C), -1, np.int64)
    for p, path in enumerate(ops.paths):
        for c in range(C):
            label = (int(full_row[path.x_start][c]), path.y_start, path.ir_out)
            index[p, c] = copy_of.get(label, -1)
    used = [p for p in range(ops.num_paths) if index[p, 0] >= 0]
    if any((index[p] >= 0).any() != (index[p] >= 0).all() for p in range(ops.num_paths)):
        raise AssertionError("a path's channels are not all e3nn copies")  # cannot happen: same filter per path
    used.sort(key=lambda p: index[p, 0])
    coo = select_paths(ops, used)
    index = index[used]
    num_copies = len(e3nn_order)
    if sorted(index.ravel().tolist()) != list(range(num_copies)):
        raise AssertionError("e3j's paths do not cover e3nn's copies once each")
    weight_index = None if np.array_equal(index.ravel(), np.arange(num_copies)) else index

    # e3nn's flat output: copy n occupies its path's rows in `full`'s sorted order
    e3nn_paths = [full.paths[j] for j in e3nn_order]
    # without the filtered copy this is e3nn's output irreps as it prints them (unmerged chunks when
    # regroup_output=False); with it, concatenate(...).regroup() is sorted and merged
    irreps_out = Irreps([(1, p.ir_out) for p in e3nn_paths]).simplify() if with_self else full.irreps_out
    starts = np.cumsum([0] + [p.ir_out.dim for p in e3nn_paths])
    out_index = np.empty(starts[-1], np.int64)
    for p, path in enumerate(coo.paths):
        rows = path.out_start + np.arange(path.ir_out.dim)
        for c in range(C):
            n = index[p, c]
            out_index[starts[n] : starts[n + 1]] = rows * C + c
    to_mul_ir_index = _to_mul_ir_index(coo.irreps_out, C)
    if np.array_equal(out_index, to_mul_ir_index):
        out_index = None
    for a in (weight_index, out_index):
        if a is not None:
            a.setflags(write=False)
    return Plan(coo, C, irreps_x_op, irreps_out, weight_index, out_index, with_self)


def _label(path) -> tuple:
    return (path.x_start, path.y_start, path.ir_out)


def _e3nn_copy_order(full: TensorProductCoo, irreps_x: Irreps, with_self: bool, allowed, keep) -> list[int]:
    """Indices of ``full``'s paths in e3nn's output copy order (see :func:`plan`)."""
    if not with_self:
        return list(range(full.num_paths))
    # row 0 of the operand y is the constant: its paths are x ⊗ 1 -> x, the filtered copy of x
    tp = [j for j, p in enumerate(full.paths) if p.y_start > 0 and (allowed is None or p.ir_out in allowed)]
    # x.filter(keep) keeps x's blocks in the caller's order: the x ⊗ 1 paths listed by x row
    own = sorted(
        (j for j, p in enumerate(full.paths) if p.y_start == 0 and p.ir_x in keep),
        key=lambda j: full.paths[j].x_start,
    )
    # concatenate(...).regroup(): a stable sort of the blocks by irrep, the filtered copy first
    ordered = []
    for ir in sorted({full.paths[j].ir_out for j in own + tp}):
        ordered += [j for j in own if full.paths[j].ir_out == ir]
        ordered += [j for j in tp if full.paths[j].ir_out == ir]
    return ordered


def _full_rows(irreps_full: Irreps, irreps_op: Irreps, C: int) -> dict[int, list[int]]:
    """For the first row of each copy ``k`` of e3j's ``x``, the first rows of e3nn's copies ``k·C + c``."""
    out = {}
    for (mul, ir), s_full, s_op in zip(irreps_full, irreps_full.slices(), irreps_op.slices()):
        for k in range(mul // C):
            out[s_op.start + k * ir.dim] = [s_full.start + (k * C + c) * ir.dim for c in range(C)]
    return out


def _to_mul_ir_index(irreps: Irreps, C: int) -> np.ndarray:
    """The flat ``[.., D · C]`` index of each element of :func:`e3j.to_mul_ir`'s output."""
    out = []
    for s, (mul, ir) in zip(irreps.slices(), irreps):
        rows = s.start + np.arange(mul)[:, None, None] * ir.dim + np.arange(ir.dim)[None, None, :]  # [mul, 1, dim]
        out.append((rows * C + np.arange(C)[None, :, None]).ravel())  # [mul, C, dim]
    return np.concatenate(out) if out else np.zeros(0, np.int64)
