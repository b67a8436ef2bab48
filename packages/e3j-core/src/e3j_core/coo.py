"""Sparse coefficient tables (COO) for tensor products and message-passing convolutions.

Every kernel of e3j consumes these tables; none rebuilds coefficients. Two types:

:class:`CooTable`
    A sparse multilinear coupling ``out[i0] = Σ_r c_r · a[i1_r] · b[i2_r] (· s[i3_r])`` over
    unfolded feature coordinates: an ``int32 [slots, N]`` index array, sorted lexicographically by
    ``(i0, i1, ...)``, and ``float64 [N]`` coefficients. It is immutable, hashable and cached, so it
    can be a static argument of a JAX primitive. ``transpose(k)`` gives the table of the VJP with
    respect to operand ``k`` (paper Eq. 15: ``(i0, i1, i2) -> (i1, i2, i0)`` for the first operand,
    ``(i2, i1, i0)`` for the second), ``packed()`` the structured records that the CUDA kernels
    read, ``row_offsets`` their CSR row pointer (record-walking kernels), and ``by_i0()`` /
    ``by_i0_i1()`` the groupings that Pallas kernels unroll at trace time.

:class:`TensorProductCoo`
    The descriptor of ``irreps_x ⊗ irreps_y`` (optionally filtered): output irreps, paths, the
    bilinear :class:`CooTable` (e3nn's ``"component"`` normalization folded in), the map
    ``i3(i0)`` from output coordinate to path (the edge scalar a message uses), and the trilinear
    table ``out[i0] = Σ c x[i1] y[i2] s[i3]`` of the convolution.

Output layout: exactly ``e3nn_jax.tensor_product(x, y, filter_ir_out=filter, regroup_output=...)``
— with ``regroup_output=True`` (the default) the inputs are regrouped, paths enumerated as e3nn
does, and the output chunks stably sorted by irrep and merged; with ``False`` the inputs keep their
blocks and the sorted output chunks are not merged. A *path* is one ``2l+1`` block: one copy
``u`` of an ``x`` irrep, one copy ``v`` of a ``y`` irrep and one output irrep. Paths are numbered in
output-row order, so ``i3`` is non-decreasing in ``i0``.

>>> coo = tensor_product_coo("0e + 1o", "1o", filter="0e + 1o + 1e")
>>> coo.irreps_out, coo.num_paths, coo.path_slices
(1x0e+1x1o+1x1e, 3, (slice(0, 1, None), slice(1, 4, None), slice(4, 7, None)))
>>> coo.table.dims, coo.table.num_records, coo.table.index_dtype
((7, 4, 3), 12, dtype('uint8'))
>>> coo.i3.tolist()
[0, 1, 1, 1, 2, 2, 2]
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any, NamedTuple

import numpy as np

from ._checks import check_bool, is_int
from .clebsch_gordan import clebsch_gordan
from .irreps import IntoIrreps, Irrep, Irreps, _is_irrep_like, _is_mul_irrep_like, as_irreps

__all__ = [
    "COO_FORMAT_VERSION",
    "TP_NORMALIZATIONS",
    "CooTable",
    "Path",
    "TensorProductCoo",
    "normalize_filter",
    "select_paths",
    "tensor_product_coo",
    "unpack_records",
]

#: Bumped whenever the meaning or layout of the tables or packed records changes; kernels built
#: against another version must refuse the tables.
COO_FORMAT_VERSION = 2

TP_NORMALIZATIONS = ("component", "norm", "none")

_UINT8_MAX_DIM = 255


def _lexsort(indices: np.ndarray) -> np.ndarray:
    return np.lexsort(indices[::-1])


@dataclass(frozen=True, eq=False)
class CooTable:
    """A sparse multilinear coupling ``out[i0] = Σ_r c_r Π_k operand_k[i_k,r]`` (see module doc).

    Attributes:
        dims: the size of each slot; ``dims[0]`` is the output dimension.
        indices: ``int32 [len(dims), N]``, sorted lexicographically by slot 0, then 1, ...
        coefficients: ``float64 [N]``.
        roles: ``roles[k]`` is the slot of the root table (the forward op) that slot ``k`` holds.
        key: hashable description of what the root table was built from.
    """

    dims: tuple[int, ...]
    indices: np.ndarray = field(repr=False)
    coefficients: np.ndarray = field(repr=False)
    roles: tuple[int, ...]
    key: tuple = field(repr=False)
    _root: CooTable | None = field(default=None, repr=False)

    # A table is identified by what it was built from (``key``, shared by all permutations of one
    # root) and its permutation, so equal tables hash equal even across processes.
    def __hash__(self) -> int:
        return hash((self.key, self.roles))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CooTable) and (other.key, other.roles) == (self.key, self.roles)

    @property
    def root(self) -> CooTable:
        return self if self._root is None else self._root

    @property
    def arity(self) -> int:
        """Number of operands (slots minus the output)."""
        return len(self.dims) - 1

    @property
    def num_records(self) -> int:
        return int(self.coefficients.shape[0])

    @property
    def i0(self) -> np.ndarray:
        return self.indices[0]

    @property
    def i1(self) -> np.ndarray:
        return self.indices[1]

    @property
    def i2(self) -> np.ndarray:
        return self.indices[2]

    @property
    def i3(self) -> np.ndarray:
        if len(self.dims) < 4:
            raise AttributeError("a bilinear table has no slot i3")
        return self.indices[3]

    # -- permutations -------------------------------------------------------------------------
    def permute(self, order: tuple[int, ...]) -> CooTable:
        """The table whose slot ``k`` is this table's slot ``order[k]``, re-sorted by the new i0.

        Permuting is a group action: ``t.permute(p).permute(q) == t.permute(tuple(p[k] for k in q))``
        and the result is cached on the root, so repeated transposition never builds new tables.
        """
        order = tuple(int(k) for k in order)
        if sorted(order) != list(range(len(self.dims))):
            raise ValueError(f"order must be a permutation of {tuple(range(len(self.dims)))}, got {order}")
        roles = tuple(self.roles[k] for k in order)
        return self.root._with_roles(roles)

    def transpose(self, operand: int) -> CooTable:
        """The VJP table for operand slot ``operand`` (1-based, as ``i1``, ``i2``, ...).

        For ``out = T(a, b)``, ``da = T.transpose(1)(b, dout)`` and ``db = T.transpose(2)(a, dout)``
        (paper Eq. 15); for a trilinear table ``ds = T.transpose(3)(a, b, dout)``.
        """
        if not 1 <= operand <= self.arity:
            raise ValueError(f"operand must be in 1..{self.arity}, got {operand}")
        others = [k for k in range(1, len(self.dims)) if k != operand]
        return self.permute((operand, *others, 0))

    def _with_roles(self, roles: tuple[int, ...]) -> CooTable:
        assert self._root is None
        if roles == self.roles:
            return self
        cache = self.__dict__.setdefault("_permuted", {})
        if roles not in cache:
            indices = self.indices[list(roles)]
            order = _lexsort(indices)
            indices = np.ascontiguousarray(indices[:, order])
            coefficients = self.coefficients[order]
            indices.setflags(write=False)
            coefficients.setflags(write=False)
            dims = tuple(self.dims[k] for k in roles)
            cache[roles] = CooTable(dims, indices, coefficients, roles, self.key, self)
        return cache[roles]

    # -- views --------------------------------------------------------------------------------
    def dense(self) -> np.ndarray:
        """The coefficients as a dense ``float64`` array of shape ``dims``."""
        out = np.zeros(self.dims)
        np.add.at(out, tuple(self.indices), self.coefficients)
        return out

    def __call__(self, *operands: np.ndarray) -> np.ndarray:
        """Numpy evaluation on ``[..., dims[k]]`` operands (a reference for tests)."""
        if len(operands) != self.arity:
            raise ValueError(f"expected {self.arity} operands, got {len(operands)}")
        terms = self.coefficients
        for k, op in enumerate(operands, start=1):
            op = np.asarray(op)
            if op.shape[-1] != self.dims[k]:
                raise ValueError(f"operand {k} must have last axis {self.dims[k]}, got {op.shape}")
            terms = terms * op[..., self.indices[k]]
        shape = np.broadcast_shapes(*(np.shape(op)[:-1] for op in operands))
        out = np.zeros(shape + (self.dims[0],), dtype=np.result_type(*operands, np.float64))
        np.add.at(out, (..., self.indices[0]), np.broadcast_to(terms, shape + terms.shape[-1:]))
        return out

    @property
    def index_dtype(self) -> np.dtype:
        """``uint8`` when every dimension is ≤ 255, else ``int32``."""
        return np.dtype(np.uint8 if max(self.dims) <= _UINT8_MAX_DIM else np.int32)

    def record_dtype(self, coefficient_dtype: np.typing.DTypeLike = np.float32) -> np.dtype:
        """Structured dtype ``(i0, i1, ..., c)`` of the packed records, with C struct alignment.

        The layout of ``struct { Idx i0, i1, ...; T c; }``: a bilinear ``uint8``/``float32`` record is
        8 bytes (one 64-bit load, paper E.2.1), ``int32``/``float32`` 16 bytes (one 128-bit load).
        """
        names = [f"i{k}" for k in range(len(self.dims))]
        return np.dtype([(n, self.index_dtype) for n in names] + [("c", np.dtype(coefficient_dtype))], align=True)

    def packed(self, coefficient_dtype: np.typing.DTypeLike = np.float32) -> np.ndarray:
        """Structured records (see :meth:`record_dtype`) in table order; read-only, cached."""
        key = np.dtype(coefficient_dtype)
        if key not in (np.float32, np.float64):
            raise ValueError(f"coefficient_dtype must be float32 or float64, got {key}")
        cache = self.__dict__.setdefault("_packed", {})
        if key not in cache:
            records = np.zeros(self.num_records, dtype=self.record_dtype(key))
            for k in range(len(self.dims)):
                records[f"i{k}"] = self.indices[k]
            records["c"] = self.coefficients
            records.setflags(write=False)
            cache[key] = records
        return cache[key]

    @cached_property
    def row_offsets(self) -> np.ndarray:
        """``int32 [dims[0] + 1]``: the records of output row ``i0`` are ``row_offsets[i0]:row_offsets[i0 + 1]``.

        The CSR row pointer over ``i0`` that record-walking kernels loop over (a row without records
        has an empty range); read-only, cached.

        >>> t = tensor_product_coo("0e + 1o", "1o", filter="0e + 1o + 1e").table
        >>> t.row_offsets.tolist()
        [0, 3, 4, 5, 6, 8, 10, 12]
        """
        offsets = np.searchsorted(self.i0, np.arange(self.dims[0] + 1), side="left").astype(np.int32)
        offsets.setflags(write=False)
        return offsets

    @cached_property
    def by_i0(self) -> tuple[tuple[int, tuple[tuple, ...]], ...]:
        """``((i0, ((i1, i2, ..., c), ...)), ...)`` as Python numbers, for trace-time unrolling."""
        out = []
        rows = self.indices.T.tolist()
        coefs = self.coefficients.tolist()
        start = 0
        for stop in _run_ends(self.indices[:1]):
            out.append((rows[start][0], tuple((*rows[r][1:], coefs[r]) for r in range(start, stop))))
            start = stop
        return tuple(out)

    @cached_property
    def by_i0_i1(self) -> tuple[tuple[int, int, tuple[tuple, ...]], ...]:
        """``((i0, i1, ((i2, ..., c), ...)), ...)``: records sharing ``(i0, i1)`` grouped (Algorithm 5)."""
        out = []
        rows = self.indices.T.tolist()
        coefs = self.coefficients.tolist()
        start = 0
        for stop in _run_ends(self.indices[:2]):
            out.append((rows[start][0], rows[start][1], tuple((*rows[r][2:], coefs[r]) for r in range(start, stop))))
            start = stop
        return tuple(out)

    def contract(
        self,
        a_row: Callable[[int], Any],
        b_row: Callable[[int], Any],
        *,
        on_row: Callable[[int, Any], None] | None = None,
    ) -> dict[int, Any]:
        """Trace-time unrolled bilinear contraction: ``{i0: Σ_r c_r · a_row(i1_r) · b_row(i2_r)}``.

        The one routine every unrolling kernel uses (reference, Pallas GPU, Pallas TPU): records are
        visited grouped by ``(i0, i1)`` so ``a_row(i1)`` multiplies the group's inner sum once
        (Algorithm 5). ``a_row``/``b_row`` return array-likes (numpy, ``jax.Array``, Pallas values)
        and should cache their loads; coefficients enter as Python floats (weakly typed), so the
        operands' dtype is kept. Only ``i0`` with records appear in the result.

        With ``on_row``, each row is also passed as ``on_row(i0, value)`` as soon as its records are
        done, in output order: a kernel that stores or accumulates it there holds one output row at a
        time, not all of them (in a traced program the row is dead after its use).

        >>> t = tensor_product_coo("1o", "1o", filter="0e").table
        >>> x, y = np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0])
        >>> rows = t.contract(lambda i: x[i], lambda i: y[i])
        >>> bool(np.isclose(rows[0], x @ y / np.sqrt(3)))
        True
        """
        if self.arity != 2:
            raise ValueError(f"contract needs a bilinear table, got arity {self.arity}")
        rows: dict[int, Any] = {}

        def done(i0: int, value: Any) -> None:
            rows[i0] = value
            if on_row is not None:
                on_row(i0, value)

        # the same walk by output row as the backward's, with no cotangent asked for
        self.contract_vjp(a_row, b_row, None, grads=(), on_row=done)
        return rows

    def contract_vjp(
        self,
        a_row: Callable[[int], Any],
        b_row: Callable[[int], Any],
        g_row: Callable[[int], Any] | None,
        *,
        grads: tuple[str, ...] = ("a", "b"),
        on_row: Callable[[int, Any], None] | None = None,
    ) -> tuple[dict[int, Any], dict[int, Any]]:
        """Trace-time unrolled cotangents of ``out = contract(a, b)`` in one pass over the records.

        Returns ``(da, db)`` with ``da[i1] = Σ_r c_r · b_row(i2_r) · g_row(i0_r)`` and
        ``db[i2] = Σ_r c_r · a_row(i1_r) · g_row(i0_r)`` (the contractions of :meth:`transpose`'s
        tables), for the operands named in ``grads``; only indices with records appear. Records are
        visited by output row ``i0``, so each ``g_row(i0)`` is read once and is dead after its row:
        a kernel holds the cotangent accumulators and one ``g`` row at a time, not all of ``g``
        (what grouping by the transposed tables' outputs would need). With ``on_row``, the forward
        value ``out[i0]`` is also formed from the same inner sums and passed as ``on_row(i0, out_i0)``
        after each row (the convolution's ``ds`` needs it).

        >>> t = tensor_product_coo("1o", "1o", filter="0e + 1e").table
        >>> a, b, g = np.arange(3.0), np.arange(3.0, 6.0), np.arange(4.0)
        >>> da, db = t.contract_vjp(lambda i: a[i], lambda i: b[i], lambda i: g[i])
        >>> dense = t.dense()
        >>> bool(np.allclose([da[i] for i in range(3)], np.einsum("kij,j,k->i", dense, b, g)))
        True
        >>> bool(np.allclose([db[i] for i in range(3)], np.einsum("kij,i,k->j", dense, a, g)))
        True
        """
        if self.arity != 2:
            raise ValueError(f"contract_vjp needs a bilinear table, got arity {self.arity}")
        unknown = set(grads) - {"a", "b"}
        if unknown:
            raise ValueError(f"grads must name operands 'a' and/or 'b', got {sorted(unknown)}")
        want_a, want_b = "a" in grads, "b" in grads
        da: dict[int, Any] = {}
        db: dict[int, Any] = {}
        row = 0
        groups = self.by_i0_i1
        while row < len(groups):
            i0 = groups[row][0]
            g = g_row(i0) if (want_a or want_b) else None
            out = None
            while row < len(groups) and groups[row][0] == i0:
                _, i1, records = groups[row]
                row += 1
                if want_a or on_row is not None:
                    inner = None
                    for i2, c in records:
                        term = c * b_row(i2)
                        inner = term if inner is None else inner + term
                    if want_a:
                        da[i1] = g * inner if i1 not in da else da[i1] + g * inner
                    if on_row is not None:
                        term = a_row(i1) * inner
                        out = term if out is None else out + term
                if want_b:
                    ag = a_row(i1) * g
                    for i2, c in records:
                        db[i2] = c * ag if i2 not in db else db[i2] + c * ag
            if on_row is not None:
                on_row(i0, out)
        return da, db


def _run_ends(keys: np.ndarray) -> list[int]:
    n = keys.shape[1]
    if n == 0:
        return []
    change = np.any(keys[:, 1:] != keys[:, :-1], axis=0)
    return (np.flatnonzero(change) + 1).tolist() + [n]


def unpack_records(records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :meth:`CooTable.packed`: ``(int32 indices [slots, N], float64 coefficients [N])``."""
    names = [n for n in records.dtype.names if n != "c"]
    indices = np.stack([records[n].astype(np.int32) for n in names]) if names else np.zeros((0, 0), np.int32)
    return indices, records["c"].astype(np.float64)


class Path(NamedTuple):
    """One ``2l+1`` output block: copy ``u`` of ``ir_x`` ⊗ copy ``v`` of ``ir_y`` → ``ir_out``.

    ``x_start``/``y_start``/``out_start`` are the first rows of the blocks in the (original, not
    regrouped) ``x`` and ``y`` layouts and in the output.
    """

    ir_x: Irrep
    ir_y: Irrep
    ir_out: Irrep
    x_start: int
    y_start: int
    out_start: int

    @property
    def x_slice(self) -> slice:
        return slice(self.x_start, self.x_start + self.ir_x.dim)

    @property
    def y_slice(self) -> slice:
        return slice(self.y_start, self.y_start + self.ir_y.dim)

    @property
    def out_slice(self) -> slice:
        return slice(self.out_start, self.out_start + self.ir_out.dim)


@dataclass(frozen=True, eq=False)
class TensorProductCoo:
    """Descriptor of the tensor product ``irreps_x ⊗ irreps_y`` → ``irreps_out`` (see module doc).

    Build it with :func:`tensor_product_coo` (cached: equal arguments give the same object).

    Attributes:
        irreps_x, irreps_y: the input irreps, in the caller's layout.
        filter: the allowed output irreps, or ``None`` for all.
        normalization: ``"component"`` (e3nn's default), ``"norm"`` or ``"none"``.
        regroup_output: ``True`` for e3nn's sorted and merged output layout.
        irreps_out: output irreps, equal to e3nn's (or, after :func:`select_paths`, the irreps of
            the selected paths in their order, consecutive equal irreps merged).
        paths: one :class:`Path` per ``2l+1`` output block, in output-row order.
        path_order: ``None`` for e3nn's path order, else the indices (into the e3nn-ordered paths)
            of the paths kept by :func:`select_paths`, in their new order.
        table: the bilinear table, dims ``(Dout, Dx, Dy)``.
        i3: ``int32 [Dout]``, the path of each output row.
    """

    irreps_x: Irreps
    irreps_y: Irreps
    filter: tuple[Irrep, ...] | None
    normalization: str
    regroup_output: bool
    irreps_out: Irreps
    paths: tuple[Path, ...] = field(repr=False)
    table: CooTable = field(repr=False)
    i3: np.ndarray = field(repr=False)
    path_order: tuple[int, ...] | None = None

    format_version = COO_FORMAT_VERSION

    @property
    def num_paths(self) -> int:
        return len(self.paths)

    @property
    def path_slices(self) -> tuple[slice, ...]:
        """The output rows of each path."""
        return tuple(p.out_slice for p in self.paths)

    @property
    def dim_x(self) -> int:
        return self.table.dims[1]

    @property
    def dim_y(self) -> int:
        return self.table.dims[2]

    @property
    def dim_out(self) -> int:
        return self.table.dims[0]

    @property
    def vjp_x(self) -> CooTable:
        """``dx = vjp_x(y, dz)``: records ``(i1, i2, i0)`` sorted by ``i1``."""
        return self.table.transpose(1)

    @property
    def vjp_y(self) -> CooTable:
        """``dy = vjp_y(x, dz)``: records ``(i2, i1, i0)`` sorted by ``i2``."""
        return self.table.transpose(2)

    @cached_property
    def trilinear(self) -> CooTable:
        """``out[i0] = Σ c x[i1] y[i2] s[i3]`` with ``i3 = i3(i0)``: dims ``(Dout, Dx, Dy, P)``."""
        t = self.table
        indices = np.concatenate([t.indices, self.i3[t.i0][None]], axis=0)
        indices.setflags(write=False)
        return CooTable(t.dims + (self.num_paths,), indices, t.coefficients, (0, 1, 2, 3), ("trilinear", *t.key))

    def _key(self) -> tuple:
        return (self.irreps_x, self.irreps_y, self.filter, self.normalization, self.regroup_output, self.path_order)

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorProductCoo) and other._key() == self._key()


def normalize_filter(filter: IntoIrreps | Iterable | None, name: str = "filter") -> tuple[Irrep, ...] | None:
    """The sorted distinct irreps a ``filter=`` argument names (multiplicities ignored), or ``None``.

    Takes what ``e3nn_jax.tensor_product``'s ``filter_ir_out`` takes: irreps (a string, e3j's or
    e3nn-jax's ``Irreps``, a list of ``(mul, irrep)`` pairs), one irrep, or an iterable of irreps.
    ``name`` is the argument's name in the error (e.g. ``"filter_ir_out"``, ``"self_connection"``).

    >>> normalize_filter("1o + 2x0e + 1o")
    (0e, 1o)
    >>> normalize_filter([(2, (0, 1)), (1, (1, -1))])
    (0e, 1o)
    """
    if filter is None:
        return None
    try:
        if isinstance(filter, (str, Irreps, Irrep)) or _is_irrep_like(filter) or _is_mul_irrep_like(filter):
            irreps = [ir for _, ir in Irreps(filter)]
        else:  # an iterable of irreps (e3nn-jax's Irreps is one of MulIrreps)
            items = list(filter)  # read twice below: a generator would be empty the second time
            try:
                irreps = [Irrep(ir) for ir in items]
            except (TypeError, ValueError):  # not irreps: (mul, irrep) pairs, as Irreps takes them
                if any(is_int(ir) for ir in items):  # Irreps reads a lone degree as even: 1 would be 1e
                    raise ValueError("a filter names irreps ('1o'), not degrees (e3nn-jax refuses them too)") from None
                irreps = [ir for _, ir in Irreps(items)]
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name}: cannot interpret {filter!r} as irreps ({err})") from None
    return tuple(sorted(set(irreps)))


def tensor_product_coo(
    irreps_x: IntoIrreps,
    irreps_y: IntoIrreps,
    filter: IntoIrreps | Iterable | None = None,
    *,
    normalization: str = "component",
    regroup_output: bool = True,
) -> TensorProductCoo:
    """The cached :class:`TensorProductCoo` of ``irreps_x ⊗ irreps_y``.

    ``filter`` (irreps, a string or a list of irreps; multiplicities ignored) keeps only the output
    irreps it names, as ``e3nn_jax.tensor_product(..., filter_ir_out=filter)``; names that no path
    can produce are ignored as in e3nn, but a filter (or inputs) leaving no path at all is an error.
    """
    irreps_x, irreps_y = as_irreps(irreps_x, "irreps_x"), as_irreps(irreps_y, "irreps_y")
    if normalization not in TP_NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {TP_NORMALIZATIONS}, got {normalization!r}")
    regroup_output = check_bool("regroup_output", regroup_output)
    return _build(irreps_x, irreps_y, normalize_filter(filter), normalization, regroup_output)


def select_paths(coo: TensorProductCoo, order: Iterable[int]) -> TensorProductCoo:
    """The tensor product restricted to the paths ``order`` (indices into ``coo.paths``), in that order.

    Path ``k`` of the result is ``coo.paths[order[k]]`` and occupies the ``k``-th output block; paths
    not listed are dropped. This lets a caller whose weights and outputs follow another convention
    (e.g. e3nn's ``concatenate([...]).regroup()`` pattern) fold that order into the tables once,
    instead of gathering weights and outputs at run time. The result is cached and, like every
    descriptor, keeps its paths in output-row order (``i3`` non-decreasing).

    >>> coo = tensor_product_coo("0e + 1o", "0e + 1o", filter="1o")
    >>> [(str(p.ir_x), str(p.ir_y)) for p in coo.paths]
    [('0e', '1o'), ('1o', '0e')]
    >>> swapped = select_paths(coo, [1, 0])
    >>> [(str(p.ir_x), str(p.ir_y)) for p in swapped.paths], swapped.irreps_out
    ([('1o', '0e'), ('0e', '1o')], 2x1o)
    """
    if not isinstance(coo, TensorProductCoo):
        raise TypeError(f"coo must be a TensorProductCoo, got {type(coo).__name__}")
    try:
        order = tuple(operator.index(i) for i in order)  # int() would truncate 1.5 to 1
    except (TypeError, ValueError) as err:
        raise ValueError(f"order must be a sequence of path indices, got {order!r}") from err
    if not order:
        raise ValueError("order must select at least one path")
    if len(set(order)) != len(order) or not all(0 <= i < coo.num_paths for i in order):
        raise ValueError(f"order must list distinct path indices in [0, {coo.num_paths}), got {list(order)}")
    base = coo if coo.path_order is None else _build(*coo._key()[:5])
    base_order = order if coo.path_order is None else tuple(coo.path_order[i] for i in order)
    if base_order == tuple(range(base.num_paths)):
        return base
    return _select(base, base_order)


@cache
def _select(coo: TensorProductCoo, order: tuple[int, ...]) -> TensorProductCoo:
    paths, row_map, out_row = [], np.full(coo.dim_out, -1, np.int64), 0
    for i in order:
        p = coo.paths[i]
        row_map[p.out_slice] = np.arange(out_row, out_row + p.ir_out.dim)
        paths.append(p._replace(out_start=out_row))
        out_row += p.ir_out.dim
    t = coo.table
    keep = row_map[t.i0] >= 0
    indices = np.stack([row_map[t.i0[keep]], t.i1[keep], t.i2[keep]]).astype(np.int32)
    coefficients = t.coefficients[keep]
    by_row = _lexsort(indices)
    indices = np.ascontiguousarray(indices[:, by_row])
    coefficients = coefficients[by_row]
    indices.setflags(write=False)
    coefficients.setflags(write=False)
    table = CooTable((out_row, t.dims[1], t.dims[2]), indices, coefficients, (0, 1, 2), (*t.key, order))
    i3 = np.repeat(np.arange(len(paths), dtype=np.int32), [p.ir_out.dim for p in paths])
    i3.setflags(write=False)
    irreps_out = Irreps([(1, p.ir_out) for p in paths]).simplify()
    return TensorProductCoo(
        coo.irreps_x,
        coo.irreps_y,
        coo.filter,
        coo.normalization,
        coo.regroup_output,
        irreps_out,
        tuple(paths),
        table,
        i3,
        order,
    )


def _copies(irreps: Irreps, regroup: bool) -> list[tuple[Irrep, list[int]]]:
    """Blocks as e3nn enumerates them: ``(irrep, [first row of each copy in the caller's layout])``."""
    starts = [s.start for s in irreps.slices()]
    order = irreps.sort().inv if regroup else range(len(irreps))
    blocks: list[tuple[Irrep, list[int]]] = []
    for b in order:
        mul, ir = irreps[b]
        rows = [starts[b] + u * ir.dim for u in range(mul)]
        if regroup:
            if mul == 0:
                continue
            if blocks and blocks[-1][0] == ir:
                blocks[-1][1].extend(rows)
                continue
        blocks.append((ir, rows))
    return blocks


@cache
def _build(
    irreps_x: Irreps,
    irreps_y: Irreps,
    filter: tuple[Irrep, ...] | None,
    normalization: str,
    regroup_output: bool,
) -> TensorProductCoo:
    chunks = []  # (ir_out, [(ir_x, ir_y, x_row, y_row) per (u, v)])
    for ir_x, rows_x in _copies(irreps_x, regroup_output):
        for ir_y, rows_y in _copies(irreps_y, regroup_output):
            for ir_out in ir_x * ir_y:
                if filter is not None and ir_out not in filter:
                    continue
                chunks.append((ir_out, [(ir_x, ir_y, rx, ry) for rx in rows_x for ry in rows_y]))
    # e3nn always sorts the output chunks (stably); regroup_output also merges them
    chunks = [chunks[i] for i in sorted(range(len(chunks)), key=lambda i: (chunks[i][0]._key(), i))]
    irreps_out = Irreps([(len(copies), ir) for ir, copies in chunks])
    if regroup_output:
        irreps_out = irreps_out.simplify()

    paths = []
    out_row = 0
    for ir_out, copies in chunks:
        for ir_x, ir_y, rx, ry in copies:
            paths.append(Path(ir_x, ir_y, ir_out, rx, ry, out_row))
            out_row += ir_out.dim
    if not paths:
        what = f"filter {'+'.join(map(str, filter)) or '(empty)'} leaves" if filter is not None else "the inputs leave"
        # blocks of multiplicity 0 reach nothing: they are left out of what is possible
        possible = sorted({ir for mx, a in irreps_x if mx for my, b in irreps_y if my for ir in a * b})
        raise ValueError(
            f"{what} no path in {irreps_x or '(empty)'} ⊗ {irreps_y or '(empty)'} "
            f"(outputs this product can have: {'+'.join(map(str, possible)) or 'none'})"
        )

    i0, i1, i2, cs = [], [], [], []
    for p in paths:
        cg = clebsch_gordan(p.ir_x.l, p.ir_y.l, p.ir_out.l)
        if normalization == "component":
            cg = cg * math.sqrt(p.ir_out.dim)
        elif normalization == "norm":
            cg = cg * math.sqrt(p.ir_x.dim * p.ir_y.dim)
        a, b, k = np.nonzero(cg)
        i0.append(p.out_start + k)
        i1.append(p.x_start + a)
        i2.append(p.y_start + b)
        cs.append(cg[a, b, k])
    indices = np.stack([np.concatenate(i0), np.concatenate(i1), np.concatenate(i2)]).astype(np.int32)
    coefficients = np.concatenate(cs)
    order = _lexsort(indices)
    indices = np.ascontiguousarray(indices[:, order])
    coefficients = coefficients[order]
    indices.setflags(write=False)
    coefficients.setflags(write=False)
    key = ("tensor_product", irreps_x, irreps_y, filter, normalization, regroup_output)
    table = CooTable((out_row, irreps_x.dim, irreps_y.dim), indices, coefficients, (0, 1, 2), key)

    i3 = np.repeat(np.arange(len(paths), dtype=np.int32), [p.ir_out.dim for p in paths])
    i3.setflags(write=False)
    return TensorProductCoo(
        irreps_x, irreps_y, filter, normalization, regroup_output, irreps_out, tuple(paths), table, i3
    )


# doctest does not look into a cached_property: its example runs from here
__test__ = {"CooTable.row_offsets": CooTable.row_offsets.__doc__}
