"""Static plans mapping e3nn's flat ``mul_ir`` layout and copy order onto e3j's ``[.., D, C]`` ops (private).

e3nn stores features flat (``mul_ir``: each block ``mul`` copies of ``2l+1`` numbers) and numbers
the output copies of a tensor product as its own loops do; e3j's ops take ``[.., D, C]`` with one
channel count ``C`` per call and one row block per path. A plan is computed once per set of irreps
(numpy, cached) and splits the product into **groups**, each one uniform-channel e3j op:

- ``grouping="multiplicity"`` (the default): the blocks of ``x`` with the same multiplicity ``m``
  form one group run with ``C = m`` channels (``64x0e + 32x1o + 16x2e`` → three ops: ``0e`` with
  64 channels, ``1o`` with 32, ``2e`` with 16), holding only the paths whose ``x`` irrep is in the
  group. Each path keeps its own channel count; every backend and kernel serves each group
  unchanged. Uniform multiplicities are one group.
- ``grouping="gcd"``: one group, ``C`` = the gcd of the multiplicities, each block ``m x ir``
  becoming ``(m / C) x ir`` (copy ``u = k·C + c`` is copy ``k``, channel ``c``, as in
  :func:`e3j.from_mul_ir`): ``64x0e + 32x1o + 16x2e`` → ``4x0e + 2x1o + 2e`` with 16 channels and
  27 paths (spherical harmonics up to l = 3, outputs filtered to ``0e + 1o + 2e``). Kept to measure against.

Merging a group whose multiplicity is a multiple of another's (e.g. 64 into 16 as 4 copies) is the
gcd plan restricted to those groups. The full merge (``"gcd"``) is timed beside the groups by
``benchmarks/interop_message_passing.py``: on the CPU reference backend its value and gradient
were slower than separate groups (its paths have fewer channels), so partial merges are not done.

Within a group, e3j's paths are put in the order e3nn numbers its output copies
(:func:`e3j_core.select_paths`), so that a group's weights are a few contiguous runs of e3nn's
weight axis reshaped to ``[.., P, C]``, and its output, written flat by :func:`e3j.to_mul_ir`, is a
few contiguous runs of e3nn's output. The runs are pieces of one ``split`` of the axis (whose
backward is one concatenation; a slice's is a pad of the whole cotangent), and the concatenations
are all that the layout costs. Only where runs do not exist (an ``y`` with a multiplicity above 1, whose copies
e3nn interleaves with the channels) are static gather indices used instead.

e3nn's copy order is read from core's own enumeration of paths: the descriptor of the same product
with every copy a path and one channel (``C = 1``) numbers its paths exactly as e3nn numbers its
output copies, so no rule of e3nn's is written twice.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property

import jax
import jax.numpy as jnp
import numpy as np

from e3j_core import Irrep, Irreps, TensorProductCoo, select_paths, tensor_product_coo

from ._permute import Permutation, permute
from ._primitives.multilinear import out_aval
from .factored import take_columns
from .layout import from_mul_ir, to_mul_ir

GROUPINGS = ("multiplicity", "gcd")
# above this many contiguous runs a static gather is cheaper to trace and compile than slices
_MAX_RUNS = 64


@dataclass(frozen=True, eq=False)
class Gather:
    """A static rearrangement of the last axis: ``runs`` (``(start, stop)`` slices to concatenate) or,
    when there are too many, ``index`` (a gather); ``None`` for both when it is the identity."""

    size_in: int
    runs: tuple[tuple[int, int], ...] | None
    index: np.ndarray | None = field(repr=False)

    @classmethod
    def of(cls, index: np.ndarray, size_in: int, max_runs: int | None = _MAX_RUNS) -> Gather:
        """``index`` as runs of slices, or as a gather above ``max_runs`` runs (``None``: never, so that
        the transpose is pads, not a scatter)."""
        index = np.asarray(index, np.int64)
        if np.array_equal(index, np.arange(size_in)):
            return cls(size_in, None, None)
        if index.size == 0:
            return cls(size_in, (), None)
        breaks = np.flatnonzero(np.diff(index) != 1) + 1
        starts = np.concatenate([[0], breaks]).astype(np.int64)
        stops = np.concatenate([breaks, [len(index)]]).astype(np.int64)
        if max_runs is None or len(starts) <= max_runs:
            return cls(size_in, tuple((int(index[a]), int(index[b - 1]) + 1) for a, b in zip(starts, stops)), None)
        index.setflags(write=False)
        return cls(size_in, None, index)

    def indices(self) -> np.ndarray:
        """The index of the last axis each output element reads."""
        if self.index is not None:
            return self.index
        if self.runs is None:
            return np.arange(self.size_in)
        return np.concatenate([np.arange(a, b) for a, b in self.runs])

    def __call__(self, a: jax.Array) -> jax.Array:
        if self.index is not None:
            return a[..., self.index]
        if self.runs is None:
            return a
        if not self.runs:
            return a[..., :0]
        parts = take_runs(a, self.runs, axis=-1)
        return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1)


def take_runs(a: jax.Array, runs: Sequence[tuple[int, int]], axis: int) -> list[jax.Array]:
    """``a``'s static ``(start, stop)`` runs along ``axis``, one array each: pieces of one ``split``
    where the runs are disjoint (its backward is one concatenation; a slice's is a pad of the whole
    cotangent, one per run, all added, which XLA's CPU evaluates pad by pad), else slices."""
    runs = tuple((int(s), int(t)) for s, t in runs)
    split = _split_plan(runs, a.shape[axis])
    if split is None:
        return [jax.lax.slice_in_dim(a, s, t, axis=axis) for s, t in runs]
    cuts, pieces = split
    parts = jnp.split(a, cuts, axis=axis)
    return [parts[k] for k in pieces]


@cache
def _split_plan(runs: tuple[tuple[int, int], ...], size: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``(cuts, pieces)``: the runs are pieces ``pieces`` of an axis of ``size`` split at ``cuts``;
    ``None`` for fewer than two runs, or runs that overlap or repeat."""
    if len(runs) < 2:
        return None
    cuts = tuple(sorted({e for run in runs for e in run} - {0, size}))
    bounds = (0, *cuts, size)
    pieces = tuple(bisect.bisect_right(cuts, s) for s, _ in runs)
    exact = all(bounds[k] == s and bounds[k + 1] == t for k, (s, t) in zip(pieces, runs))
    return (cuts, pieces) if exact and len(set(pieces)) == len(pieces) else None


def _aval_like(shape: tuple[int, ...], arrays) -> jax.core.ShapedArray:
    """The type of a ``shape`` array of ``arrays``' dtype that varies over the manual mesh axes they
    vary over (inside ``shard_map``), for :func:`jax.linear_transpose`: its cotangent must have
    exactly that type."""
    return out_aval(shape, arrays[0].dtype, [jax.typeof(a) for a in arrays])


@dataclass(frozen=True, eq=False)
class Group:
    """One uniform-channel e3j op of a plan: ``coo`` (paths in e3nn's copy order), ``channels``
    (``C``), ``irreps_x`` (e3j's irreps of its operand ``x``), ``x``: the group's columns of the flat
    ``x``, ``weights``: its weights (``[.., P·C]``) from e3nn's weight axis; ``out_scale``: ``None``, or
    a factor per output row (``[Dout]``) that the op's output is multiplied by (see :attr:`Plan.self_scale`)."""

    coo: TensorProductCoo
    channels: int
    irreps_x: Irreps
    x: Gather
    weights: Gather
    out_scale: np.ndarray | None = field(default=None, repr=False)

    @property
    def multiplicity(self) -> int:
        return self.channels

    def split_x(self, x: jax.Array) -> jax.Array:
        """``[.., Dx_flat] -> [.., Dx, C]``."""
        return from_mul_ir(self.x(x), self.irreps_x, self.channels)

    @cached_property
    def x_columns(self) -> np.ndarray:
        """``int [Dx, C]``: the column of the flat ``x`` that :meth:`split_x` puts at row ``i``,
        channel ``c`` (for kernels that read e3nn's ``x``, or write its cotangent, in place)."""
        columns = np.empty(self.irreps_x.dim * self.channels, np.int64)
        columns[_to_mul_ir_index(self.irreps_x, self.channels)] = self.x.indices()  # from_mul_ir's rearrangement
        columns = columns.reshape(self.irreps_x.dim, self.channels)
        columns.setflags(write=False)  # cached on a shared (cached) plan
        return columns

    def split_weights(self, w) -> jax.Array:
        """``[.., num_weights] -> [.., P, C]`` (an array or :class:`e3j.FactoredWeights`)."""
        cols = take_columns(w, self.weights)
        return cols.reshape(*cols.shape[:-1], self.coo.num_paths, self.channels)

    @cached_property
    def weight_columns(self) -> np.ndarray | None:
        """The first column of each path's weights on e3nn's weight axis (its ``C`` weights are that
        column and the next ``C - 1``), or ``None`` where a path's copies are not consecutive."""
        per_path = self.weights.indices().reshape(self.coo.num_paths, self.channels)
        if not np.array_equal(per_path, per_path[:, :1] + np.arange(self.channels)):
            return None
        columns = per_path[:, 0].copy()
        columns.setflags(write=False)  # cached on a shared (cached) plan
        return columns


@dataclass(frozen=True, eq=False)
class Plan:
    """``groups``: the uniform-channel ops; ``irreps_x``/``irreps_out``: e3nn's flat irreps of the
    operand ``x`` and of the output; ``out``: e3nn's output from the groups' flat outputs
    (:func:`e3j.to_mul_ir` of each, concatenated); ``constant_row``: the operand ``y`` is ``[1, y]``."""

    groups: tuple[Group, ...]
    irreps_x: Irreps
    irreps_out: Irreps
    out: Gather
    constant_row: bool = False  # y' = [1, y]: the self connection's constant 0e edge attribute
    #: e3nn's output as consecutive copy-major blocks ``(first column, group, first row, dim)``, one
    #: per path (``None`` where a path's copies are not consecutive: ``y`` with a multiplicity > 1)
    out_blocks: tuple[tuple[int, int, int, int], ...] | None = None
    #: ``None``, or a factor per row of e3nn's output (``[Dout_flat]``): ``sqrt(2l+1)`` on the self
    #: connection's copies under the ``"none"`` normalization, whose ``l ⊗ 0 -> l`` block is
    #: ``1/sqrt(2l+1)`` times the identity where e3nn's filtered copy of ``x`` is not scaled; 1 elsewhere
    #: (``None`` where every factor would be 1)
    self_scale: np.ndarray | None = field(default=None, repr=False)
    #: ``None``, or the width of the weights' axis where the groups read only some of its columns (a
    #: product restricted to the blocks not marked zero, reading the full product's weights in place)
    weight_width: int | None = None

    def __reduce_ex__(self, protocol):
        # a plan built by _plan (cached; ops compare plans by identity) pickles and copies as its
        # arguments, so that an unpickled or deep-copied op is the cached plan again, equal to the
        # original; a plan derived from another (no such key) pickles field by field
        key = self.__dict__.get("_plan_key")
        return (_plan, key) if key is not None else super().__reduce_ex__(protocol)

    @property
    def num_weights(self) -> int:
        if self.weight_width is not None:
            return self.weight_width
        return sum(g.coo.num_paths * g.channels for g in self.groups)

    @cached_property
    def unread_weights(self) -> np.ndarray | None:
        """``bool [num_weights]``: the weight columns no group reads (their cotangent is zero), or
        ``None`` where every column is read (always, unless :attr:`weight_width` is set)."""
        if self.weight_width is None:
            return None
        unread = np.ones(self.weight_width, bool)
        for g in self.groups:
            unread[g.weights.indices()] = False
        unread.setflags(write=False)  # cached on a shared (cached) plan
        return unread if unread.any() else None

    @property
    def gathers(self) -> bool:
        """Whether a call gathers (rather than slices) weights or outputs: only for an ``y`` with a
        multiplicity above 1."""
        return self.out.index is not None or any(g.weights.index is not None for g in self.groups)

    @property
    def in_place(self) -> bool:
        """Whether every path's weights and output copies are consecutive runs of e3nn's axes (always,
        unless ``y`` has a multiplicity above 1): what the one-primitive convolution reads and writes."""
        return self.out_blocks is not None and all(g.weight_columns is not None for g in self.groups)

    def split_x(self, x: jax.Array) -> list[jax.Array]:
        """Flat ``[.., Dx_flat]`` → one ``[.., Dx_g, C_g]`` per group."""
        return [g.split_x(x) for g in self.groups]

    def join_x(self, dxs: list[jax.Array]) -> jax.Array:
        """The transpose of :meth:`split_x`: the groups' ``[.., Dx_g, C_g]`` → flat ``[.., Dx_flat]``
        (columns no group reads, of zero-multiplicity or filtered-out blocks, are zero)."""
        lead = jnp.shape(dxs[0])[:-2]
        aval = _aval_like((*lead, self.irreps_x.dim), dxs)
        (dx,) = jax.linear_transpose(self.split_x, aval)(list(dxs))
        return dx

    def forward_by_group(self, x: jax.Array, launch: Callable) -> jax.Array:
        """A grouped convolution kernel's frame: ``launch(group, x_g)`` returns one group's ``m [N,
        Dout_g, C_g]`` from its ``x_g [N, Dx_g, C_g]`` (split from the flat ``x [N, Dx_flat]``); the
        outputs are joined into e3nn's ``[N, Dout_flat]``."""
        return self.join_out([launch(g, xg) for g, xg in zip(self.groups, self.split_x(x))])

    def backward_by_group(
        self, x: jax.Array | None, dm: jax.Array, outs: Sequence[str], launch: Callable, *, flat: bool = False
    ) -> dict[str, jax.Array]:
        """A grouped backward kernel's frame: the groups in order, ``launch(group, x_g, dm_g, ds)``
        returning one group's cotangents ``{"x"|"y"|"s": ...}`` (for ``outs``) from its ``x_g`` (``None``
        where ``x`` is) and ``dm_g [N, Dout_g, C_g]``. Its ``"s"`` is the whole ``[E, num_weights]``
        cotangent of the weights with its own columns written: ``ds`` is the previous group's (``None``
        for the first group), so the launches write one buffer in turn. Returns
        :meth:`join_cotangents` of them.

        With ``flat``, the kernels read e3nn's flat ``x [N, Dx_flat]`` and ``dm [N, Dout_flat]`` in
        place (:attr:`Group.x_columns`, :attr:`out_blocks`) and write ``dx`` there too:
        ``launch(group, x, dm, ds, dx)``, whose ``"x"`` is the whole ``[N, Dx_flat]`` cotangent with
        the group's columns written, threaded from launch to launch as ``ds`` is (so the groups'
        ``x_columns`` must cover every column of ``x``: :meth:`covers_x`).
        """
        n = len(self.groups)
        if flat:
            xs, dms = [x] * n, [dm] * n
        else:
            xs = self.split_x(x) if x is not None else [None] * n
            dms = self.split_out(dm)
        ds, dx, results = None, None, []
        for g, xg, dmg in zip(self.groups, xs, dms):
            r = dict(launch(g, xg, dmg, ds, dx) if flat else launch(g, xg, dmg, ds))
            ds = r.pop("s", None)
            if flat:
                dx = r.pop("x", None)
            results.append(r)
        if ds is not None and self.unread_weights is not None:
            # the launches write their own columns only: the others, which no path reads, are zero
            ds = jnp.where(self.unread_weights, jnp.zeros((), ds.dtype), ds)
        return self.join_cotangents(results, ds, outs, dx=dx)

    def covers_x(self) -> bool:
        """Whether the groups' :attr:`Group.x_columns` hold every column of the flat ``x`` once."""
        columns = np.concatenate([g.x_columns.ravel() for g in self.groups])
        return np.array_equal(np.sort(columns), np.arange(self.irreps_x.dim))

    def join_cotangents(
        self, results: Sequence[dict], ds: jax.Array | None, outs: Sequence[str], *, dx: jax.Array | None = None
    ) -> dict:
        """The groups' cotangents (one ``{"x": [N, Dx_g, C_g], "y": [E, Dy]}`` per group, the keys in
        ``outs``) and the weights' ``ds [E, num_weights]`` in e3nn's layouts: ``{o: ...}`` for ``o`` in
        ``outs``, ``dx`` joined by :meth:`join_x` (or given, already flat), ``dy`` the groups' sum (in
        group order)."""
        res = {"s": ds}
        if "x" in outs:
            res["x"] = dx if dx is not None else self.join_x([r["x"] for r in results])
        if "y" in outs:
            res["y"] = results[0]["y"]
            for r in results[1:]:
                res["y"] = res["y"] + r["y"]
        return {o: res[o] for o in outs}

    def split_out(self, dm: jax.Array) -> list[jax.Array]:
        """The transpose of :meth:`join_out`: flat ``[.., Dout_flat]`` → the groups' ``[.., Dout_g, C_g]``."""
        lead = jnp.shape(dm)[:-1]
        avals = [_aval_like((*lead, g.coo.dim_out, g.channels), [dm]) for g in self.groups]
        return list(jax.linear_transpose(lambda *o: self.join_out(list(o)), *avals)(dm))

    @cached_property
    def out_order(self) -> np.ndarray | None:
        """e3nn's output as indices into the groups' outputs flattened and concatenated
        (``[.., Σ_g Dout_g·C_g]``): ``join_out(outs) == concat(outs)[.., out_order]`` (int32
        ``[Dout_flat]``), or ``None`` without :attr:`out_blocks`. For kernels, which need no
        derivative of it: one gather, where :meth:`join_out`'s transposed slices are what AD
        differentiates cheaply."""
        if self.out_blocks is None:
            return None
        starts = np.cumsum([0] + [g.coo.dim_out * g.channels for g in self.groups])
        parts = []
        for _, g, row, dim in self.out_blocks:  # in column order, as join_out concatenates them
            channels = self.groups[g].channels
            # copy-major block: column (c, m) of e3nn's block reads row ``row + m``, channel ``c``
            c, m = np.meshgrid(np.arange(channels), np.arange(dim), indexing="ij")
            parts.append((starts[g] + (row + m) * channels + c).reshape(-1))
        order = np.concatenate(parts).astype(np.int32)
        order.setflags(write=False)
        return order

    @cached_property
    def _out_rows(self) -> Gather:
        """:attr:`out_order` as a :class:`Gather` of the concatenated output rows (groups of one
        channel: :meth:`join_out`)."""
        return Gather.of(self.out_order, sum(g.coo.dim_out * g.channels for g in self.groups), max_runs=None)

    def join_weights(self, dss: list[jax.Array]) -> jax.Array:
        """The groups' ``[.., P_g, C_g]`` (per-path weights or their cotangents) → e3nn's ``[.., num_weights]``,
        one concatenation of the paths in column order (columns no path reads are zero). Needs
        :attr:`in_place`."""
        pieces = sorted((int(col), g, p) for g, gr in enumerate(self.groups) for p, col in enumerate(gr.weight_columns))
        parts, at = [], 0
        for col, g, p in pieces:
            if col > at:  # columns no path reads (see :attr:`unread_weights`)
                parts.append(jnp.zeros((*dss[g].shape[:-2], col - at), dss[g].dtype))
            parts.append(dss[g][..., p, :])
            at = col + self.groups[g].channels
        if self.num_weights > at:
            parts.append(jnp.zeros((*dss[0].shape[:-2], self.num_weights - at), dss[0].dtype))
        return jnp.concatenate(parts, axis=-1)

    def join_out(self, outs: list[jax.Array]) -> jax.Array:
        """The groups' outputs ``[.., Dout_g, C_g]`` → e3nn's flat ``[.., Dout_flat]``.

        One concatenation of each path's rows, transposed to copy-major: XLA fuses it into one pass,
        and its transpose (the backward) is as cheap; through :func:`e3j.to_mul_ir` and a gather of
        the copies, the backward was a scatter ~20x slower (``benchmarks/interop_message_passing.py``).
        Groups of one channel each need no transposes: their outputs' rows are e3nn's columns, put in
        order by :attr:`out_order`'s runs of consecutive rows (none for the identity). Sliced path by
        path instead, the backward of a large product of one channel (e3nn's ``mul_to_axis`` layout
        with the channels on e3j's) ran 8x slower on the CPU: XLA fused the pads of the output
        cotangent's slices into the product's backward path by path.
        """
        if self.out_blocks is not None and all(g.channels == 1 for g in self.groups):
            rows = [o[..., 0] for o in outs]
            return self._out_rows(rows[0] if len(rows) == 1 else jnp.concatenate(rows, axis=-1))
        if self.out_blocks is not None:
            # each group's rows cut by one split (take_runs), whose backward is one concatenation
            blocks = {}
            for g, o in enumerate(outs):
                mine = [(row, dim) for _, gg, row, dim in self.out_blocks if gg == g]
                blocks.update(zip(((g, row) for row, _ in mine), take_runs(o, [(r, r + d) for r, d in mine], axis=-2)))
            parts = []
            for _, g, row, dim in self.out_blocks:
                block = blocks[g, row]
                # sizes spelled out, not -1: a batch of 0 rows is valid and -1 cannot be inferred from 0 elements
                parts.append(jnp.swapaxes(block, -1, -2).reshape(*block.shape[:-2], dim * block.shape[-1]))
            return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1)
        flats = [to_mul_ir(o, g.coo.irreps_out) for o, g in zip(outs, self.groups)]
        flat = flats[0] if len(flats) == 1 else jnp.concatenate(flats, axis=-1)
        return self.out(flat) if self._out_permutation is None else permute(flat, self._out_permutation)

    @cached_property
    def _out_permutation(self) -> Permutation | None:
        """:attr:`out` as a :class:`Permutation` where it is one of several runs (``y`` with a
        multiplicity above 1): its slices' backward was a pad and an add of the whole output
        cotangent per run (value and gradient of ``4x0e + 4x1o`` ⊗ ``2x0e + 2x1o`` 0.17x e3nn-jax's
        speed on the CPU, 3.5x as a permutation, whose backward is the inverse's gather)."""
        index = self.out.indices()
        if self.out.index is None and (self.out.runs is None or len(self.out.runs) <= 1):
            return None
        if index.size != self.out.size_in or not np.array_equal(np.sort(index), np.arange(index.size)):
            return None
        return Permutation(index)


def channels_of(irreps: Irreps) -> int:
    """The gcd of the nonzero multiplicities (1 when there are none)."""
    return math.gcd(*(mul for mul, _ in irreps if mul > 0)) or 1


def split_channels(irreps: Irreps, channels: int) -> Irreps:
    """``m x ir -> (m / C) x ir``."""
    return Irreps([(mul // channels, ir) for mul, ir in irreps])


def plan(
    irreps_x: Irreps,
    irreps_y: Irreps,
    filter_out: tuple[Irrep, ...] | None,
    keep: tuple[Irrep, ...] | None,
    normalization: str,
    regroup_output: bool,
    grouping: str = "multiplicity",
) -> Plan:
    """The plan of e3nn's ``tensor_product(x, y, filter_ir_out=filter_out)`` (``keep`` None), or of
    ``concatenate([x.filter(keep), tensor_product(x, y, filter_ir_out=filter_out)]).regroup()``, in
    which case the e3j operand ``y`` is ``"0e" + irreps_y`` with a constant first row of ones (the
    copy of ``x`` is ``x ⊗ 1`` through the ``0e`` path, exactly; under ``normalization="none"`` the
    ops' outputs are multiplied by :attr:`Plan.self_scale`, per group :attr:`Group.out_scale`).

    ``irreps_x``/``irreps_y`` are e3nn's flat irreps (full multiplicities). Raises ``ValueError``
    when no output copy is left.
    """
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")
    # before the cache: an empty self connection gives the same (identical) plan as none
    keep, regroup_output = _no_empty_self_connection(keep, regroup_output)
    return _plan(irreps_x, irreps_y, filter_out, keep, normalization, regroup_output, grouping)


@cache
def _plan(irreps_x, irreps_y, filter_out, keep, normalization: str, regroup_output: bool, grouping: str) -> Plan:
    with_self = keep is not None
    rescale_self = with_self and normalization == "none"
    irreps_y_op = Irreps("0e") + irreps_y if with_self else irreps_y
    wanted_filter = _wanted_filter(filter_out, keep)
    full, e3nn_paths = e3nn_copies(irreps_x, irreps_y, filter_out, keep, normalization, regroup_output)
    copy_of = {_label(p): n for n, p in enumerate(e3nn_paths)}
    num_copies = len(e3nn_paths)
    if num_copies == 0:
        raise ValueError(f"no output irrep of {irreps_x} x {irreps_y} is kept by the filter")
    # without the filtered copy this is e3nn's output irreps as it prints them (unmerged chunks when
    # regroup_output=False); with it, concatenate(...).regroup() is sorted and merged
    irreps_out = Irreps([(1, p.ir_out) for p in e3nn_paths]).simplify() if with_self else full.irreps_out
    out_starts = np.cumsum([0] + [p.ir_out.dim for p in e3nn_paths])

    x_starts = np.cumsum([0] + [mul * ir.dim for mul, ir in irreps_x])
    used_rows = {p.x_start for p in e3nn_paths}
    groups, out_parts, offset, blocks_out = [], [], 0, []
    for blocks, C in _groups(irreps_x, grouping):
        irreps_g = Irreps([irreps_x[b] for b in blocks])
        if not any(x_starts[b] <= r < x_starts[b + 1] for b in blocks for r in used_rows):
            continue  # the filter leaves this group no path
        irreps_g_op = split_channels(irreps_g, C)
        ops = tensor_product_coo(
            irreps_g_op, irreps_y_op, wanted_filter, normalization=normalization, regroup_output=regroup_output
        )
        full_row = _full_rows(irreps_x, blocks, irreps_g_op, C)
        index = np.full((ops.num_paths, C), -1, np.int64)
        for p, path in enumerate(ops.paths):
            for c in range(C):
                index[p, c] = copy_of.get((int(full_row[path.x_start][c]), path.y_start, path.ir_out), -1)
        used = [p for p in range(ops.num_paths) if index[p, 0] >= 0]
        if any((index[p] >= 0).any() != (index[p] >= 0).all() for p in range(ops.num_paths)):
            raise AssertionError("a path's channels are not all e3nn copies")  # cannot happen: same filter per path
        used.sort(key=lambda p: index[p, 0])
        coo = select_paths(ops, used)
        index = index[used]
        x_cols = np.concatenate([np.arange(x_starts[b], x_starts[b + 1]) for b in blocks])
        out_scale = _self_scale(coo.paths, [p.out_start for p in coo.paths], coo.dim_out) if rescale_self else None
        groups.append(
            Group(coo, C, irreps_g_op, Gather.of(x_cols, irreps_x.dim), Gather.of(index.ravel(), num_copies), out_scale)
        )
        # where each output copy of this group lies in the group's to_mul_ir output, shifted by `offset`
        pos = np.empty(coo.dim_out * C, np.int64)
        pos[_to_mul_ir_index(coo.irreps_out, C)] = np.arange(coo.dim_out * C)
        for p, path in enumerate(coo.paths):
            rows = path.out_start + np.arange(path.ir_out.dim)
            for c in range(C):
                out_parts.append((int(index[p, c]), offset + pos[rows * C + c]))
            # the path's copies as one copy-major [C, dim] block of e3nn's output, when they are
            # consecutive copies (always, unless y has a multiplicity above 1)
            if np.array_equal(index[p], index[p, 0] + np.arange(C)):
                blocks_out.append((int(out_starts[index[p, 0]]), len(groups) - 1, path.out_start, path.ir_out.dim))
        offset += coo.dim_out * C
    if sorted(n for n, _ in out_parts) != list(range(num_copies)):
        raise AssertionError("e3j's paths do not cover e3nn's copies once each")
    out_index = np.empty(out_starts[-1], np.int64)
    for n, rows in out_parts:
        out_index[out_starts[n] : out_starts[n + 1]] = rows
    blocks_out.sort()
    covered = sum(groups[g].channels * d for _, g, _, d in blocks_out)
    blocks = tuple(blocks_out) if covered == out_starts[-1] else None
    self_scale = _self_scale(e3nn_paths, out_starts[:-1], int(out_starts[-1])) if rescale_self else None
    result = Plan(tuple(groups), irreps_x, irreps_out, Gather.of(out_index, offset), with_self, blocks, self_scale)
    object.__setattr__(
        result, "_plan_key", (irreps_x, irreps_y, filter_out, keep, normalization, regroup_output, grouping)
    )
    return result


def _no_empty_self_connection(keep, regroup_output: bool) -> tuple[tuple[Irrep, ...] | None, bool]:
    """An empty self connection keeps no copy of ``x``: e3nn's ``concatenate([x.filter([]), tp])
    .regroup()`` is ``tp`` regrouped, with no constant row of ones in ``y`` for it to read."""
    return (None, True) if keep is not None and len(keep) == 0 else (keep, regroup_output)


def _wanted_filter(filter_out, keep) -> tuple[Irrep, ...] | None:
    """The output irreps the ``C = 1`` product keeps: the filter's, and the self connection's."""
    if filter_out is None:
        return None
    return tuple(sorted(set(filter_out) | set(keep or ())))


@cache
def e3nn_copies(
    irreps_x: Irreps,
    irreps_y: Irreps,
    filter_out: tuple[Irrep, ...] | None,
    keep: tuple[Irrep, ...] | None,
    normalization: str,
    regroup_output: bool,
) -> tuple[TensorProductCoo, tuple]:
    """``(full, copies)``: the product of :func:`plan`'s arguments with every copy a path and one
    channel (``full``, ``C = 1``), and its paths in the order e3nn numbers the output copies (and
    their weights): copy ``n`` reads the ``x`` copy whose first row of the flat ``x`` is
    ``copies[n].x_start`` and row ``copies[n].y_start`` of ``y' = [1, y]`` (with ``keep``: the
    self connection's constant row first) or of ``y``."""
    keep, regroup_output = _no_empty_self_connection(keep, regroup_output)
    with_self = keep is not None
    if with_self:
        _check_something_kept(irreps_x, irreps_y, filter_out, keep)
    irreps_y_op = Irreps("0e") + irreps_y if with_self else irreps_y
    full = tensor_product_coo(
        irreps_x, irreps_y_op, _wanted_filter(filter_out, keep), normalization=normalization,
        regroup_output=regroup_output,
    )  # fmt: skip
    allowed = None if filter_out is None else set(filter_out)
    order = _e3nn_copy_order(full, with_self, allowed, keep)
    return full, tuple(full.paths[j] for j in order)


def _check_something_kept(irreps_x: Irreps, irreps_y: Irreps, filter_out, keep) -> None:
    """With a self connection, the error for an empty result in the caller's terms (the table's own
    would name ``[0e, y]`` and the merged filter, which the caller never gave)."""
    if any(mul and ir in keep for mul, ir in irreps_x):
        return
    possible = sorted({ir for mx, a in irreps_x if mx for my, b in irreps_y if my for ir in a * b})
    if set(possible) & set(possible if filter_out is None else filter_out):
        return
    names = lambda irs: "none" if irs is None else "+".join(map(str, irs)) or "(empty)"  # noqa: E731
    raise ValueError(
        f"filter {names(filter_out)} and self_connection {names(keep)} leave no path in "
        f"{irreps_x or '(empty)'} ⊗ {irreps_y or '(empty)'}: the product's outputs are {names(possible)}, and "
        f"irreps_x holds none of the self connection's irreps"
    )


def _self_scale(paths, starts, dim_out: int) -> np.ndarray | None:
    """``sqrt(2l+1)`` on the rows of the self connection's paths (those reading the constant row 0 of
    ``y' = [1, y]``; path ``k``'s rows start at ``starts[k]``), 1 on the others: undoes the ``"none"``
    normalization's ``1/sqrt(2l+1)`` there. ``None`` where every factor is 1 (only scalar copies)."""
    scale = np.ones(dim_out)
    for p, start in zip(paths, starts):
        if p.y_start == 0:
            scale[start : start + p.ir_out.dim] = math.sqrt(p.ir_out.dim)
    if (scale == 1).all():
        return None
    scale.setflags(write=False)  # cached on a shared (cached) plan
    return scale


def _groups(irreps_x: Irreps, grouping: str) -> list[tuple[list[int], int]]:
    """``(block indices of x, C)`` of each group, in order of first appearance; zero blocks dropped."""
    nonzero = [b for b, (mul, _) in enumerate(irreps_x) if mul > 0]
    if grouping == "gcd":
        return [(nonzero, channels_of(irreps_x))] if nonzero else []
    by_mul: dict[int, list[int]] = {}
    for b in nonzero:
        by_mul.setdefault(irreps_x[b].mul, []).append(b)
    return [(blocks, mul) for mul, blocks in by_mul.items()]


def _label(path) -> tuple:
    return (path.x_start, path.y_start, path.ir_out)


def _e3nn_copy_order(full: TensorProductCoo, with_self: bool, allowed, keep) -> list[int]:
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


def _full_rows(irreps_full: Irreps, blocks: list[int], irreps_op: Irreps, C: int) -> dict[int, list[int]]:
    """For the first row of each copy ``k`` of a group's e3j ``x`` (blocks ``blocks`` of the full
    irreps), the first rows of e3nn's copies ``k·C + c`` in the full flat ``x``."""
    full_slices = irreps_full.slices()
    out = {}
    for b, s_op in zip(blocks, irreps_op.slices()):
        mul, ir = irreps_full[b]
        for k in range(mul // C):
            out[s_op.start + k * ir.dim] = [full_slices[b].start + (k * C + c) * ir.dim for c in range(C)]
    return out


def _to_mul_ir_index(irreps: Irreps, C: int) -> np.ndarray:
    """The flat ``[.., D · C]`` index of each element of :func:`e3j.to_mul_ir`'s output."""
    out = []
    for s, (mul, ir) in zip(irreps.slices(), irreps):
        rows = s.start + np.arange(mul)[:, None, None] * ir.dim + np.arange(ir.dim)[None, None, :]  # [mul, 1, dim]
        out.append((rows * C + np.arange(C)[None, :, None]).ravel())  # [mul, C, dim]
    return np.concatenate(out) if out else np.zeros(0, np.int64)
