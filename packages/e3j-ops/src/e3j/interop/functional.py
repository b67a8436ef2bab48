"""e3nn-jax's ``FunctionalTensorProduct`` with ``uvu`` weights, in message passing, as fused convolutions.

The e3nn-jax code this replaces (the original NequIP convolution), for node features
``x [N, tp.irreps_in1]``, edge attributes ``y [E, tp.irreps_in2]`` (spherical harmonics) and per-edge
weights ``w [E, num_weights]`` (a radial MLP's output)::

    tp = e3nn.legacy.FunctionalTensorProduct(irreps_in1, irreps_in2, irreps_out, instructions)
    m = jax.vmap(tp.left_right)(w, x[senders], y)          # instructions (i1, i2, i_out, "uvu", True)
    out = e3nn.scatter_sum(m, dst=receivers, output_size=N)

An instruction ``(i1, i2, i_out, "uvu", True)`` with ``irreps_in2[i2].mul == 1`` is
``out[i_out][u] += w[u] · path_weight · CG · (x[i1][u] ⊗ y[i2])`` for every copy ``u`` of
``x[i1]``: one e3j path with ``C = irreps_in1[i1].mul`` channels and one weight per channel. The
weights are e3nn's flat layout: instruction order, ``path_shape = (mul_in1, 1)`` each.

How it runs: the instructions are grouped by ``mul_in1`` (the channel count), each group one
:class:`e3j.Convolution` over core's un-normalized tables (``normalization="none"``: the bare
Clebsch–Gordan coefficients e3nn's ``left_right`` uses) restricted to the group's paths in
instruction order (:func:`e3j_core.select_paths`), given only the blocks of ``x`` its paths read.
The groups run as one :class:`e3j.MulIrConvolution` over a plan of their own: each path reads its
``mul_in1`` weight columns of e3nn's flat array in place and writes its copies where
``tp.irreps_out`` has its slot, so with one instruction per slot (NequIP's) nothing is rearranged;
instructions into an occupied slot write after e3nn's columns and are added by static slices, and
slots no instruction reaches are zeros. Each instruction's normalized ``path_weight`` — read from
``tp.instructions``, where e3nn's ``_normalize_instruction_path_weights`` put
``irrep_normalization``, ``path_normalization``, ``gradient_normalization``, the variances and the
instruction's own weight — multiplies its output columns (core's tables have no per-path scale; a
path is linear in its weights, so this is the weights' scale).

Instructions that read a block its input marks zero (``zero_flags``) are skipped: the convolutions
of the others run, built once per set of marks. The e3nn-jax pattern computes those products (its
``vmap`` drops the marks) and gets zeros: the values and gradients are the same. A mark is e3nn-jax's
promise that the block is zero, which its own operations take on trust as this one does: an array
marked zero whose block holds other numbers (built by hand) gives what the marks say, where
e3nn-jax's ``vmap`` pattern would read the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
from e3nn_jax.legacy import FunctionalTensorProduct

from e3j_core import Irreps, select_paths, tensor_product_coo

from .._mul_ir_plan import Gather, Group, Plan, _to_mul_ir_index
from ..convolution import Convolution
from ..factored import FactoredWeights
from ..graph import Graph
from ..mul_ir import MulIrConvolution
from ._operands import block_marks, message_passing_operands

__all__ = ["FunctionalMessagePassing"]


@dataclass(frozen=True, eq=False)
class _Op:
    """One uniform-channel convolution: ``C`` channels, its x columns, weight columns and path scales."""

    channels: int
    conv: Convolution
    irreps_x: Irreps  # e3j irreps of the op's x (one copy per block of x it reads)
    x: Gather
    weights: Gather
    scale: np.ndarray  # [P, 1] e3nn's normalized path_weight of each path's instruction
    chunks: tuple[tuple[int, int], ...]  # (output slot, flat width) of each path, in path order


class FunctionalMessagePassing:
    """``scatter_sum(vmap(tp.left_right)(w, x[senders], y), dst=receivers)`` for ``uvu`` instructions, fused.

    ``fmp = FunctionalMessagePassing(tp)`` with ``tp`` an ``e3nn_jax.legacy.FunctionalTensorProduct``
    whose instructions are all ``(i1, i2, i_out, "uvu", True[, path_weight])`` with
    ``irreps_in2[i2].mul == 1``; ``fmp(node_feats, edge_attrs, weights, senders, receivers)`` or
    ``fmp(..., graph=g)`` (an :class:`e3j.Graph` built once) with ``node_feats: IrrepsArray
    [N, tp.irreps_in1]``, ``edge_attrs: IrrepsArray or array [E, tp.irreps_in2]`` and
    ``weights: [E, fmp.num_weights]`` in e3nn's flat weight layout returns ``IrrepsArray
    [N, tp.irreps_out]``. ``fmp.ops`` are the convolutions run per call (one per ``mul_in1``);
    a call whose ``node_feats`` or ``edge_attrs`` mark blocks zero (``zero_flags``) runs them without
    the instructions that read those blocks.

    >>> import numpy as np, jax.numpy as jnp
    >>> tp = FunctionalTensorProduct("4x0e + 2x1o", "0e + 1o", "4x0e + 2x0e + 2x1o",
    ...                              [(0, 0, 0, "uvu", True), (1, 1, 1, "uvu", True), (1, 0, 2, "uvu", True)])
    >>> fmp = FunctionalMessagePassing(tp)
    >>> fmp.num_weights, [(op.channels, op.conv.num_paths) for op in fmp.ops]
    (8, [(4, 1), (2, 2)])
    >>> x = e3nn.IrrepsArray("4x0e + 2x1o", jnp.ones((3, 10)))
    >>> out = fmp(x, jnp.ones((4, 4)), jnp.ones((4, 8)), np.array([0, 1, 2, 0]), np.array([1, 0, 1, 2]))
    >>> out.irreps, out.shape
    (4x0e+2x0e+2x1o, (3, 12))
    """

    def __init__(self, tp: FunctionalTensorProduct) -> None:
        if not isinstance(tp, FunctionalTensorProduct):
            raise TypeError(f"tp must be an e3nn_jax.legacy.FunctionalTensorProduct, got {type(tp).__name__}")
        self.tp = tp
        irreps_x, irreps_y, irreps_out = Irreps(tp.irreps_in1), Irreps(tp.irreps_in2), Irreps(tp.irreps_out)
        self._irreps_out = irreps_out
        x_starts = [s.start for s in irreps_x.slices()]
        y_starts = [s.start for s in irreps_y.slices()]

        # (instruction, first weight column) of each instruction that writes something, by mul_in1
        by_mul: dict[int, list[tuple]] = {}
        w_start = 0
        for k, ins in enumerate(tp.instructions):
            what = f"instruction {k} ({ins.i_in1}, {ins.i_in2}, {ins.i_out}, {ins.connection_mode!r}, {ins.has_weight})"
            if ins.connection_mode != "uvu" or not ins.has_weight:
                raise ValueError(f"{what}: only 'uvu' instructions with weights are supported")
            mul1, mul2, mul_out = irreps_x[ins.i_in1].mul, irreps_y[ins.i_in2].mul, irreps_out[ins.i_out].mul
            if mul2 != 1:
                raise ValueError(f"{what}: irreps_in2[{ins.i_in2}] must have multiplicity 1, got {mul2}")
            if mul_out != mul1:
                raise ValueError(f"{what}: 'uvu' needs irreps_out[{ins.i_out}].mul == irreps_in1[{ins.i_in1}].mul, "
                                 f"got {mul_out} and {mul1}")  # fmt: skip
            if mul1 > 0:
                by_mul.setdefault(mul1, []).append((ins, w_start))
            w_start += prod(ins.path_shape)
        self.num_weights: int = w_start  # e3nn's: Σ prod(path_shape) over the instructions

        self._by_mul = by_mul
        self._irreps = (irreps_x, irreps_y, x_starts, y_starts)
        self._reduced: dict[tuple, tuple] = {}  # (zero_x, zero_y) -> (ops, run) without their products
        self.ops, self._run = self._ops(lambda ins: True)

    def _ops(self, runs) -> tuple[tuple[_Op, ...], _Run | None]:
        """The convolutions of the instructions ``runs(instruction)`` keeps, and how one call runs them."""
        irreps_x, irreps_y, x_starts, y_starts = self._irreps
        ops = []
        for C, members in self._by_mul.items():
            # an instruction repeating an earlier one's (x block, y block, output irrep), into the same slot
            # or another, is a path the first convolution already has: it goes to a further one
            rounds: list[list[tuple]] = []
            for member in members:
                ins = member[0]
                if not runs(ins):
                    continue
                label = (ins.i_in1, ins.i_in2, self._irreps_out[ins.i_out].ir)
                for r in rounds:
                    if all((i.i_in1, i.i_in2, self._irreps_out[i.i_out].ir) != label for i, _ in r):
                        r.append(member)
                        break
                else:
                    rounds.append([member])
            for r in rounds:
                ops.append(_op(r, C, irreps_x, irreps_y, self._irreps_out, x_starts, y_starts, self.num_weights))

        return tuple(ops), _run(ops, irreps_x, self._irreps_out, self.num_weights)

    def _run_for(self, zero_x: tuple[bool, ...], zero_y: tuple[bool, ...]) -> _Run | None:
        """As e3nn-jax's ``left_right``, the instructions reading a block marked zero are skipped."""
        if not any(zero_x) and not any(zero_y):
            return self._run
        key = (zero_x, zero_y)
        if key not in self._reduced:
            self._reduced[key] = self._ops(lambda ins: not zero_x[ins.i_in1] and not zero_y[ins.i_in2])
        return self._reduced[key][1]

    @property
    def irreps_out(self) -> e3nn.Irreps:
        """``tp.irreps_out``: the irreps of the result."""
        return self.tp.irreps_out

    def __call__(
        self,
        node_feats: e3nn.IrrepsArray,
        edge_attrs: e3nn.IrrepsArray | jax.Array,
        weights: jax.Array | FactoredWeights,
        senders: jax.Array | None = None,
        receivers: jax.Array | None = None,
        *,
        graph: Graph | None = None,
        backend: str | None = None,
    ) -> e3nn.IrrepsArray:
        tp = self.tp
        x, y, w, graph = message_passing_operands(
            node_feats, tp.irreps_in1, edge_attrs, tp.irreps_in2, weights, self.num_weights,
            "e3nn's flat layout: instruction order, mul_in1 each", senders, receivers, graph, simplify=True,
            one_step=True,
        )  # fmt: skip
        num_nodes, dtype = x.shape[0], x.dtype
        zero_x = block_marks(node_feats, tp.irreps_in1)
        zero_y = block_marks(edge_attrs, tp.irreps_in2) if isinstance(edge_attrs, e3nn.IrrepsArray) else ()
        run = self._run_for(zero_x, zero_y or (False,) * len(tp.irreps_in2))
        if run is None:  # every instruction skipped
            return e3nn.IrrepsArray(tp.irreps_out, jnp.zeros((num_nodes, tp.irreps_out.dim), dtype))
        out = run.slots(run.conv(x, y, w, graph, backend=backend), num_nodes)
        return e3nn.IrrepsArray(tp.irreps_out, out)

    def __repr__(self) -> str:
        ops = ", ".join(f"{op.channels} ch x {op.conv.num_paths} paths" for op in self.ops)
        return f"FunctionalMessagePassing({self.tp!r}; {ops})"


def _op(members, C, irreps_x, irreps_y, irreps_out, x_starts, y_starts, num_weights) -> _Op:
    """The convolution of instructions ``members`` (``(instruction, first weight column)``, all
    ``mul_in1 == C``, distinct paths), its paths in the members' order."""
    blocks = sorted({ins.i_in1 for ins, _ in members})
    irreps_op = Irreps([(1, irreps_x[b].ir) for b in blocks])
    op_row = {b: s.start for b, s in zip(blocks, irreps_op.slices())}
    full = tensor_product_coo(irreps_op, irreps_y, normalization="none", regroup_output=False)
    path_of = {(p.x_start, p.y_start, p.ir_out): j for j, p in enumerate(full.paths)}
    order = [path_of[(op_row[ins.i_in1], y_starts[ins.i_in2], irreps_out[ins.i_out].ir)] for ins, _ in members]
    coo = select_paths(full, order)
    x_cols = np.concatenate([np.arange(x_starts[b], x_starts[b] + C * irreps_x[b].ir.dim) for b in blocks])
    w_cols = np.concatenate([np.arange(start, start + C) for _, start in members])
    scale = np.array([[ins.path_weight] for ins, _ in members], np.float64)
    chunks = tuple((ins.i_out, C * irreps_out[ins.i_out].ir.dim) for ins, _ in members)
    return _Op(C, Convolution.from_coo(coo), irreps_op, Gather.of(x_cols, irreps_x.dim),
               Gather.of(w_cols, num_weights), scale, chunks)  # fmt: skip


@dataclass(frozen=True, eq=False)
class _Run:
    """All the ops of one call as one :class:`e3j.MulIrConvolution` (each op one group of its plan),
    whose output puts each slot's first path where e3nn's output has the slot, and further paths into
    a slot after those; ``chunks``: each output slot's column ranges in that output."""

    conv: MulIrConvolution
    chunks: tuple[tuple[tuple[int, int], ...], ...]
    irreps_out: Irreps
    identity: bool  # every slot has one path, in place: the output is e3nn's as it comes

    def slots(self, flat: jax.Array, num_nodes: int) -> jax.Array:
        """e3nn's ``[N, irreps_out.dim]``: slots no instruction reaches are zeros, those several reach sums."""
        if self.identity:
            return flat
        slots = []
        for (mul, ir), chunks in zip(self.irreps_out, self.chunks):
            if not chunks:
                slots.append(jnp.zeros((num_nodes, mul * ir.dim), flat.dtype))
                continue
            total = flat[:, chunks[0][0] : chunks[0][1]]
            for a, b in chunks[1:]:
                total = total + flat[:, a:b]
            slots.append(total)
        return jnp.concatenate(slots, axis=-1) if slots else jnp.zeros((num_nodes, 0), flat.dtype)


def _run(ops, irreps_x: Irreps, irreps_out: Irreps, num_weights: int) -> _Run | None:
    """The plan of ``ops``: groups reading the weights in place (e3nn's flat layout), each path's
    ``path_weight`` a factor on its output rows (exact: the path is linear in its weights)."""
    if not ops:
        return None
    # (op, path) of each path, the first path into each slot before the others
    paths = [(k, p) for k, op in enumerate(ops) for p in range(op.conv.num_paths)]
    first = {}
    for k, p in paths:
        first.setdefault(ops[k].chunks[p][0], (k, p))
    firsts = set(first.values())
    order = [first[slot] for slot in sorted(first)] + [kp for kp in paths if kp not in firsts]
    column, offset = {}, 0
    for k, p in order:
        column[(k, p)] = offset
        offset += ops[k].chunks[p][1]
    slot_chunks: dict[int, list[tuple[int, int]]] = {}
    for k, p in paths:
        slot, width = ops[k].chunks[p]
        slot_chunks.setdefault(slot, []).append((column[(k, p)], column[(k, p)] + width))
    chunks = tuple(tuple(sorted(slot_chunks.get(i, ()))) for i in range(len(irreps_out)))
    starts = [s.start for s in irreps_out.slices()]
    identity = all(len(c) == 1 and c[0][0] == starts[i] for i, c in enumerate(chunks)) and offset == irreps_out.dim

    groups, blocks, out_index = [], [], np.empty(offset, np.int64)
    scale = np.ones(offset)
    flat_start = 0  # the op's first column in the ops' to_mul_ir outputs concatenated (Plan.out's input)
    for k, op in enumerate(ops):
        coo = op.conv.coo
        rows = np.ones(coo.dim_out)
        pos = np.empty(coo.dim_out * op.channels, np.int64)
        pos[_to_mul_ir_index(coo.irreps_out, op.channels)] = np.arange(coo.dim_out * op.channels)
        for p, path in enumerate(coo.paths):
            dim, col = path.ir_out.dim, column[(k, p)]
            rows[path.out_start : path.out_start + dim] = op.scale[p, 0]
            scale[col : col + op.channels * dim] = op.scale[p, 0]
            blocks.append((col, k, path.out_start, dim))
            # copy-major: column (c, m) of the block is row out_start + m, channel c
            c, m = np.meshgrid(np.arange(op.channels), np.arange(dim), indexing="ij")
            out_index[col : col + op.channels * dim] = (
                flat_start + pos[((path.out_start + m) * op.channels + c).ravel()]
            )
        flat_start += coo.dim_out * op.channels
        unit = (rows == 1).all()
        groups.append(Group(coo, op.channels, op.irreps_x, op.x, op.weights, None if unit else rows))
    unit = (scale == 1).all()
    irreps_flat = Irreps([(ops[k].channels, ops[k].conv.coo.paths[p].ir_out) for k, p in order])
    plan = Plan(tuple(groups), irreps_x, irreps_flat, Gather.of(out_index, flat_start), False, tuple(sorted(blocks)),
                None if unit else scale, num_weights)  # fmt: skip
    return _Run(MulIrConvolution._of_plan(plan), chunks, irreps_out, identity)
