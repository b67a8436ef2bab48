"""A product of e3nn's flat layouts restricted to the input blocks not known to be zero (private).

e3nn-jax marks blocks it knows are zero (an ``IrrepsArray``'s ``zero_flags``: from ``e3nn.zeros``,
``from_chunks`` with ``None``, a ``Linear`` with ``force_irreps_out=True`` whose output irrep no
input reaches) and skips every product that reads one; the output copies no other product reaches
are zero. A model whose first layer embeds scalars into ``64x0e + 64x1o + 64x2e`` this way runs its
first message passing on the ``0e`` block alone. :func:`pruned` gives the same product over the
unmarked blocks only (its own plan, so kernels do only that work), with static maps from the full
operands to its operands and from its output to the full output (zero where no product is left).

e3nn's output copies (and, one per copy, its message-passing weights) are matched by what they are
(the ``x`` row, the ``y`` row, the output irrep: :func:`e3j._mul_ir_plan.e3nn_copies`), so no rule of
e3nn's order is written here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cache

import jax
import jax.numpy as jnp
import numpy as np

from e3j_core import Irrep, Irreps

from ._mul_ir_plan import Gather, Plan, _no_empty_self_connection, _wanted_filter, e3nn_copies


@dataclass(frozen=True, eq=False)
class Pruned:
    """The product over the unmarked blocks: ``irreps_x``/``irreps_y`` (those blocks, in order),
    ``x``/``y``: their columns of the full flat operands, ``copies``: the full product's number of
    each output copy of the reduced one (e3nn's order; in message passing also its weight's column,
    of ``num_copies``), ``out_rows``: for each row of the reduced output, its row in the full output
    (the other rows are zero)."""

    irreps_x: Irreps
    irreps_y: Irreps
    x: Gather
    y: Gather
    copies: np.ndarray = field(repr=False)
    num_copies: int
    dim_out: int
    out_rows: np.ndarray = field(repr=False)

    def reading_full_weights(self, plan: Plan) -> Plan:
        """The reduced product's ``plan`` with its weights read from the full product's ``[..,
        num_copies]`` (one per copy, e3nn's order) where they are: no column is copied, the unread
        ones get a zero cotangent (:attr:`Plan.unread_weights`)."""
        groups = tuple(
            dataclasses.replace(g, weights=Gather.of(self.copies[g.weights.indices()], self.num_copies))
            for g in plan.groups
        )
        return dataclasses.replace(plan, groups=groups, weight_width=self.num_copies)

    def place(self, out: jax.Array) -> jax.Array:
        """The reduced output ``[.., D_reduced]`` → the full output ``[.., dim_out]``, zero elsewhere:
        runs of consecutive reduced rows and zero runs, concatenated (static slices)."""
        src = np.full(self.dim_out, -1, np.int64)
        src[self.out_rows] = np.arange(len(self.out_rows))
        parts, j = [], 0
        while j < self.dim_out:
            k = j + 1
            if src[j] < 0:  # a run of rows no product reaches
                while k < self.dim_out and src[k] < 0:
                    k += 1
                parts.append(jnp.zeros((*out.shape[:-1], k - j), out.dtype))
            else:  # a run of consecutive rows of the reduced output
                while k < self.dim_out and src[k] == src[k - 1] + 1:
                    k += 1
                parts.append(out[..., int(src[j]) : int(src[k - 1]) + 1])
            j = k
        return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1)


def _reaches(irreps_x: Irreps, irreps_y: Irreps, wanted: tuple[Irrep, ...] | None) -> bool:
    """Whether some block of ``irreps_x`` times some block of ``irreps_y`` has an output irrep in
    ``wanted`` (any, for ``None``): whether their product has a path."""
    return any(wanted is None or ir in wanted for mx, a in irreps_x if mx for my, b in irreps_y if my for ir in a * b)


def _kept(irreps: Irreps, marks: tuple[bool, ...]) -> tuple[Irreps, np.ndarray, dict[int, int]]:
    """The unmarked blocks' irreps, their columns of the flat array, and the map from a row of the
    reduced flat array to the row of the full one."""
    starts = np.cumsum([0] + [mul * ir.dim for mul, ir in irreps])
    blocks = [b for b, z in enumerate(marks) if not z]
    cols = np.concatenate([np.arange(starts[b], starts[b + 1]) for b in blocks] or [np.zeros(0, np.int64)])
    return Irreps([irreps[b] for b in blocks]), cols, {r: int(c) for r, c in enumerate(cols)}


@cache
def pruned(
    irreps_x: Irreps,
    irreps_y: Irreps,
    filter_out: tuple[Irrep, ...] | None,
    keep: tuple[Irrep, ...] | None,
    normalization: str,
    regroup_output: bool,
    zero_x: tuple[bool, ...],
    zero_y: tuple[bool, ...],
) -> Pruned | None:
    """The product of :func:`e3j._mul_ir_plan.plan`'s arguments with the blocks of ``x`` and ``y``
    that ``zero_x`` / ``zero_y`` mark (one flag per block of ``irreps_x`` / ``irreps_y``) left out;
    ``None`` where no output copy is left (the output is zero). The self connection's constant
    edge attribute is never marked: a marked block of ``x`` has a zero copy, as in e3nn-jax."""
    if len(zero_x) != len(irreps_x) or len(zero_y) != len(irreps_y):
        raise ValueError(f"one mark per block: {len(zero_x)} for {irreps_x}, {len(zero_y)} for {irreps_y}")
    keep, regroup_output = _no_empty_self_connection(keep, regroup_output)
    kept_x, x_cols, x_row = _kept(irreps_x, zero_x)
    kept_y, y_cols, y_row = _kept(irreps_y, zero_y)
    _, copies = e3nn_copies(irreps_x, irreps_y, filter_out, keep, normalization, regroup_output)
    if kept_x.dim == 0 or (kept_y.dim == 0 and keep is None):  # (the self connection needs no y)
        return None
    if not _reaches(kept_x, Irreps("0e") + kept_y if keep is not None else kept_y, _wanted_filter(filter_out, keep)):
        return None  # the unmarked blocks reach no wanted output (e3nn_copies would refuse a pathless product)
    _, reduced = e3nn_copies(kept_x, kept_y, filter_out, keep, normalization, regroup_output)
    if not reduced:
        return None
    shift = 1 if keep is not None else 0  # y' = [1, y]: row 0 is the constant

    def full_y(r: int) -> int:
        return r if r < shift else y_row[r - shift] + shift

    copy_of = {(p.x_start, p.y_start, p.ir_out): n for n, p in enumerate(copies)}
    out_starts = np.cumsum([0] + [p.ir_out.dim for p in copies])
    sel = [copy_of[(x_row[p.x_start], full_y(p.y_start), p.ir_out)] for p in reduced]
    out_rows = np.concatenate([np.arange(out_starts[n], out_starts[n] + copies[n].ir_out.dim) for n in sel])
    sel = np.asarray(sel, np.int64)
    for a in (sel, out_rows):
        a.setflags(write=False)  # cached
    return Pruned(
        kept_x,
        kept_y,
        Gather.of(x_cols, irreps_x.dim),
        Gather.of(y_cols, irreps_y.dim),
        sel,
        len(copies),
        int(out_starts[-1]),
        out_rows,
    )
