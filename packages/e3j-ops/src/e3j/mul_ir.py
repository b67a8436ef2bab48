"""Tensor product and convolution on features in e3nn's flat ``mul_ir`` layout, any multiplicities.

:class:`TensorProduct` and :class:`Convolution` take ``[.., D, C]``: one channel count ``C`` for
every irrep. Features such as ``64x0e + 32x1o + 16x2e`` have a multiplicity of their own per irrep.
:class:`MulIrConvolution` and :class:`MulIrTensorProduct` take them as they are, flat
(``[.., Σ m_i (2 l_i + 1)]``, copy-major: copy ``u`` of block ``m x ir`` is columns
``start + u·dim .. start + (u+1)·dim``, e3nn-jax's layout) and return the output flat in the same
layout, its copies in e3nn-jax's order (e3nn-jax is not needed).

How: the blocks of ``x`` are grouped by multiplicity; each distinct multiplicity ``m`` is one
uniform-channel :class:`Convolution` (``C = m``) holding only the paths whose ``x`` irrep has that
multiplicity, so every path runs with its own channel count and every backend and kernel serves
it unchanged. With an array of weights ``[E, num_weights]`` the convolution's groups run as one
primitive on e3nn's layouts: each path reads its ``C`` weights where e3nn puts them (a path's copies
are consecutive columns) and its cotangent is written there, so the array is never copied into the
groups' layout; the reference runs all groups in one sweep over the edges, other backends group by
group. Weights given as :class:`e3j.FactoredWeights` ``hidden @ kernel`` run as one primitive too:
the reference computes each chunk's weights in its sweep from each group's columns of the kernel
(no ``[E, num_weights]`` array); where the backend has no such kernels (e3j's GPU and TPU
backends) they are multiplied out before the array's primitive (see ``docs/usage.md``). Node features and outputs
move by static runs: one split of each axis, then concatenations.
``grouping="gcd"`` instead runs one op with ``C`` = the gcd of the multiplicities (each block
``m x ir`` as ``m/C`` copies; many more paths of fewer channels), kept to compare against.

The output irreps (``irreps_out``, full multiplicities) are those of ``e3nn_jax.tensor_product(x,
y, filter_ir_out=filter)`` — sorted by irrep, and within an irrep the copies ordered by ``x``
block, then ``y`` irrep, then copy of ``x``. A convolution's weights ``w: [E, num_weights]`` are
one per output copy, in that order: ``w[:, n]`` scales output copy ``n``.

>>> import numpy as np, jax.numpy as jnp, e3j
>>> conv = MulIrConvolution("8x0e + 4x1o", "0e + 1o", filter="0e + 1o")
>>> conv.irreps_out, conv.num_weights, [(c, op.num_paths) for c, op in conv.groups]
(12x0e+12x1o, 24, [(8, 2), (4, 2)])
>>> g = e3j.Graph.from_edges(np.array([0, 1]), np.array([1, 0]), num_nodes=2)
>>> conv(jnp.ones((2, 20)), jnp.ones((2, 4)), jnp.ones((2, 24)), g).shape
(2, 48)
"""

from __future__ import annotations

from collections.abc import Iterable

import jax
import jax.numpy as jnp

from e3j_core import Irreps, as_irreps
from e3j_core.coo import normalize_filter

from ._checks import check_rank, check_same_dtype
from ._factored_route import factored_or_array, grouped_fusing
from ._mul_ir_plan import Plan, plan
from ._primitives.grouped_convolution import GROUPED_CONVOLUTION, GROUPED_CONVOLUTION_FACTORED, GroupedConvSpec
from .backends import current_backend_request
from .convolution import Convolution
from .factored import FactoredWeights, check_weights
from .graph import Graph, check_graph
from .tensor_product import TensorProduct

__all__ = ["MulIrConvolution", "MulIrTensorProduct"]


class MulIrConvolution:
    """Message passing ``out_b = Σ_{a→b} w_ab ⊙ (x_a ⊗ y_ab)`` on flat features of any multiplicities.

    ``conv = MulIrConvolution(irreps_x, irreps_y, filter=None, *, self_connection=None)``; ``conv(x, y, w, graph)``
    with node features ``x: [N, irreps_x.dim]`` (flat ``mul_ir``), edge attributes ``y: [E, irreps_y.dim]`` (e.g.
    spherical harmonics), weights ``w: [E, conv.num_weights]`` (one per output copy, in output order, read in place;
    or :class:`e3j.FactoredWeights` ``hidden @ kernel``, which the reference computes chunk by chunk) and an
    :class:`e3j.Graph` returns ``[N, conv.irreps_out.dim]`` flat. ``self_connection`` (irreps, multiplicities
    ignored) also passes the copies of ``x`` with those irreps through as messages (``x ⊗ 1``), merged into the
    output: e3nn-jax's ``concatenate([x.filter(self_connection), x ⊗ y]).regroup()``, the copies unscaled under
    every ``normalization`` (under ``"none"``, where ``x ⊗ 1 = x / sqrt(2l+1)``, a static factor per output row
    undoes it). See the module docstring for the layout and ``grouping``;
    ``conv.groups`` are ``(C, Convolution)``, the uniform-channel ops run per call. :meth:`grouped` runs them on
    operands kept per group, without the flat layout's conversions (and applies that factor, which a caller
    running ``conv.groups``' ops itself takes from ``conv.plan.groups[g].out_scale``).

    >>> import numpy as np, jax.numpy as jnp, e3j
    >>> conv = MulIrConvolution("4x0e + 2x1o", "1o", self_connection="0e")
    >>> conv.irreps_out, conv.num_weights
    (6x0e+4x1o+2x1e+2x2e, 14)
    """

    def __init__(
        self,
        irreps_x: Irreps | str | Iterable,
        irreps_y: Irreps | str | Iterable,
        filter: Irreps | str | Iterable | None = None,
        *,
        self_connection: Irreps | str | Iterable | None = None,
        normalization: str = "component",
        grouping: str = "multiplicity",
    ) -> None:
        self.plan: Plan = plan(
            as_irreps(irreps_x, "irreps_x"),
            as_irreps(irreps_y, "irreps_y"),
            normalize_filter(filter),
            normalize_filter(self_connection, "self_connection"),
            normalization,
            True,
            grouping,
        )
        # (C, op) per group: the uniform-channel ops run per call
        self.groups = tuple((g.channels, Convolution.from_coo(g.coo)) for g in self.plan.groups)

    # equal (the same cached plan: equal arguments) ops compute the same thing, so that a static
    # `jit` argument built again does not compile again
    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.plan is self.plan

    def __hash__(self) -> int:
        return hash((type(self).__name__, id(self.plan)))

    @classmethod
    def _of_plan(cls, plan: Plan) -> MulIrConvolution:
        """The convolution of a plan built elsewhere (e.g. one reading a larger product's weights)."""
        self = cls.__new__(cls)
        self.plan = plan
        self.groups = tuple((g.channels, Convolution.from_coo(g.coo)) for g in plan.groups)
        return self

    @property
    def irreps_x(self) -> Irreps:
        return self.plan.irreps_x

    @property
    def irreps_y(self) -> Irreps:
        coo = self.plan.groups[0].coo
        return Irreps(coo.irreps_y[1:]) if self.plan.constant_row else coo.irreps_y

    @property
    def irreps_out(self) -> Irreps:
        """The output irreps, full multiplicities, e3nn-jax's order."""
        return self.plan.irreps_out

    @property
    def num_weights(self) -> int:
        """One weight per output copy: ``irreps_out.num_irreps``."""
        return self.plan.num_weights

    def __call__(
        self,
        x: jax.Array,
        y: jax.Array,
        w: jax.Array | FactoredWeights,
        graph: Graph,
        *,
        backend: str | None = None,
    ) -> jax.Array:
        p = self.plan
        check_graph(graph)
        n, e = graph.num_nodes, graph.num_edges
        self._check_operands(x, y, w, n, e)
        if not p.in_place:
            if isinstance(w, FactoredWeights):  # split_weights multiplies them out: every row is read
                w = w.masked(graph.edge_mask)
            return self.join_out(self.grouped(self.split_x(x), y, self.split_weights(w), graph, backend=backend))
        # one primitive for all groups, reading the weights where e3nn puts them (an array), or
        # computing them from the factors (FactoredWeights: the per-edge array need never exist)
        if p.constant_row:  # the constant 0e column of the self connection
            y = jnp.concatenate([jnp.ones((e, 1), y.dtype), y], axis=1)
        leaves, tree = jax.tree.flatten(graph)
        spec = GroupedConvSpec(p, graph_tree=tree)
        request = current_backend_request(backend)
        if isinstance(w, FactoredWeights):

            def factored(x, y, hidden, kernel, leaves):
                operands = {"x": x, "y": y, "h": hidden, "k": kernel}
                return GROUPED_CONVOLUTION_FACTORED.bind_M(spec, operands, leaves, ("m",), request)["m"]

            def array(x, y, s, leaves):
                return GROUPED_CONVOLUTION.bind_M(spec, {"x": x, "y": y, "s": s}, leaves, ("m",), request)["m"]

            fusing = grouped_fusing(p, x.dtype, request)
            out = factored_or_array(fusing, factored, array, x, y, w, tree, leaves)
        else:
            out = GROUPED_CONVOLUTION.bind_M(spec, {"x": x, "y": y, "s": w}, leaves, ("m",), request)["m"]
        return out if p.self_scale is None else out * jnp.asarray(p.self_scale, out.dtype)

    def _check_operands(self, x, y, w, n: int, e: int, w_name: str = "w") -> None:
        """Ranks, dtypes and shapes of the operands for a graph of ``n`` nodes and ``e`` edges (the
        weights named ``w_name``)."""
        p = self.plan
        check_rank("x", x, (2,), f"[N, {p.irreps_x.dim}] for {p.irreps_x}")
        check_rank("y", y, (2,), f"[E, {self.irreps_y.dim}] for {self.irreps_y}")
        check_weights(w_name, w, e, p.num_weights, "one per output copy")
        if isinstance(w, FactoredWeights):
            check_same_dtype(x=x, y=y, **w.named_parts(w_name))
        else:
            check_same_dtype(x=x, y=y, **{w_name: w})
        if x.shape != (n, p.irreps_x.dim):
            raise ValueError(f"x must be [N={n}, {p.irreps_x.dim}] for {p.irreps_x} and this graph, got {x.shape}")
        if y.shape != (e, self.irreps_y.dim):
            raise ValueError(
                f"y must be [E={e}, {self.irreps_y.dim}] for {self.irreps_y} and this graph, got {y.shape}"
            )

    def split_x(self, x: jax.Array) -> list[jax.Array]:
        """Flat node features ``[.., irreps_x.dim]`` → one ``[.., D_g, C_g]`` per group."""
        return self.plan.split_x(x)

    def split_weights(self, w: jax.Array | FactoredWeights) -> list[jax.Array]:
        """Weights ``[E, num_weights]`` (output order) → one ``[E, P_g, C_g]`` per group.

        An array is copied into the groups; :class:`e3j.FactoredWeights` ``hidden @ kernel`` give
        each group ``hidden @ kernel[:, columns_g]`` (the rearrangement costs ``H · num_weights``,
        not ``E · num_weights``)."""
        return [g.split_weights(w) for g in self.plan.groups]

    def join_out(self, outs: list[jax.Array]) -> jax.Array:
        """The groups' outputs ``[.., Dout_g, C_g]`` → flat ``[.., irreps_out.dim]`` in output order."""
        return self.plan.join_out(outs)

    def grouped(
        self, xs: list[jax.Array], y: jax.Array, ss: list[jax.Array], graph: Graph, *, backend: str | None = None
    ) -> list[jax.Array]:
        """The convolutions alone, on operands already split into the groups: ``xs[g]: [N, D_g, C_g]``
        and ``ss[g]: [E, P_g, C_g]`` (as :meth:`split_x` / :meth:`split_weights` give them),
        ``y: [E, irreps_y.dim]``; returns ``[N, Dout_g, C_g]`` per group (:meth:`join_out` makes
        them flat). A model that keeps its features and radial weights per group (e.g. one
        ``Dense`` per group) pays no layout conversion at all.
        """
        p = self.plan
        check_graph(graph)
        if len(xs) != len(p.groups) or len(ss) != len(p.groups):
            raise ValueError(f"xs and ss must hold one array per group ({len(p.groups)}), got {len(xs)} and {len(ss)}")
        check_rank("y", y, (2,), f"[E, {self.irreps_y.dim}] for {self.irreps_y}")
        e = graph.num_edges
        if y.shape != (e, self.irreps_y.dim):
            raise ValueError(
                f"y must be [E={e}, {self.irreps_y.dim}] for {self.irreps_y} and this graph, got {y.shape}"
            )
        for i, (g, a, b) in enumerate(zip(p.groups, xs, ss)):
            if jnp.shape(a)[1:] != (g.coo.dim_x, g.channels):
                raise ValueError(f"xs[{i}] must be [N, {g.coo.dim_x}, {g.channels}] for group {i}, got {jnp.shape(a)}")
            if jnp.shape(b)[1:] != (g.coo.num_paths, g.channels):
                raise ValueError(
                    f"ss[{i}] must be [E, {g.coo.num_paths}, {g.channels}] for group {i}, got {jnp.shape(b)}"
                )
        if p.constant_row:  # the constant 0e column of the self connection
            y = jnp.concatenate([jnp.ones((e, 1), y.dtype), y], axis=1)
        outs = [conv(a, y, b, graph, backend=backend) for (_, conv), a, b in zip(self.groups, xs, ss)]
        return [
            o if g.out_scale is None else o * jnp.asarray(g.out_scale[:, None], o.dtype) for g, o in zip(p.groups, outs)
        ]

    def __repr__(self) -> str:
        groups = ", ".join(f"{g.channels} ch x {g.coo.num_paths} paths" for g in self.plan.groups)
        return f"MulIrConvolution({self.irreps_x} x {self.irreps_y} -> {self.irreps_out}; {groups})"


#: A group of one channel (multiplicity-1 blocks of ``x``) runs its batch rows this many at a time as
#: the channels of its product (``y`` channel-wise): one row per channel has no vector lanes (e3nn's
#: ``mul_to_axis`` layout, Allegro's edge features: 4-6x slower than e3nn-jax on the CPU).
ROWS_AS_CHANNELS = 32


def _rows_as_channels(tp: TensorProduct, x: jax.Array, y: jax.Array, backend: str | None) -> jax.Array:
    """``tp(x[..., None], y)`` for ``x [B, Dx]``, ``y [B, Dy]``, computed with ``ROWS_AS_CHANNELS``
    rows as channels (the batch padded with zero rows to a multiple): ``[B, Dout, 1]``."""
    rows, k = x.shape[0], ROWS_AS_CHANNELS
    pad = -rows % k

    def fold(a: jax.Array) -> jax.Array:  # [B, D] -> [B / k, D, k]
        a = jnp.pad(a, ((0, pad), (0, 0))) if pad else a
        return jnp.swapaxes(a.reshape(a.shape[0] // k, k, a.shape[1]), 1, 2)

    out = tp(fold(x), fold(y), backend=backend)  # [B / k, Dout, k]
    return jnp.swapaxes(out, 1, 2).reshape(rows + pad, out.shape[1])[:rows, :, None]


class MulIrTensorProduct:
    """``x ⊗ y`` on flat features of any multiplicities: ``e3nn_jax.tensor_product``'s output.

    ``tp = MulIrTensorProduct(irreps_x, irreps_y, filter=None)``; ``tp(x, y)`` with
    ``x: [B, irreps_x.dim]`` (flat ``mul_ir``) and ``y: [B, irreps_y.dim]`` returns
    ``[B, tp.irreps_out.dim]`` flat, e3nn-jax's copy order. ``regroup_output=False`` leaves the
    output unsorted and unmerged as e3nn-jax's does. The blocks of ``x`` of multiplicity 1 (e3nn's
    ``mul_to_axis`` layout, flattened) run their rows :data:`ROWS_AS_CHANNELS` at a time as the
    channels of one product, from that many rows on. See the module docstring.

    >>> import jax.numpy as jnp
    >>> tp = MulIrTensorProduct("8x0e + 4x1o", "0e + 1o", filter="1o")
    >>> tp.irreps_out, tp(jnp.ones((3, 20)), jnp.ones((3, 4))).shape
    (12x1o, (3, 36))
    """

    def __init__(
        self,
        irreps_x: Irreps | str | Iterable,
        irreps_y: Irreps | str | Iterable,
        filter: Irreps | str | Iterable | None = None,
        *,
        normalization: str = "component",
        regroup_output: bool = True,
        grouping: str = "multiplicity",
    ) -> None:
        self.plan: Plan = plan(
            as_irreps(irreps_x, "irreps_x"),
            as_irreps(irreps_y, "irreps_y"),
            normalize_filter(filter),
            None,
            normalization,
            regroup_output,
            grouping,
        )
        self.groups = tuple((g.channels, TensorProduct.from_coo(g.coo)) for g in self.plan.groups)

    def __eq__(self, other: object) -> bool:  # as MulIrConvolution's
        return type(other) is type(self) and other.plan is self.plan

    def __hash__(self) -> int:
        return hash((type(self).__name__, id(self.plan)))

    @property
    def irreps_x(self) -> Irreps:
        return self.plan.irreps_x

    @property
    def irreps_y(self) -> Irreps:
        return self.plan.groups[0].coo.irreps_y

    @property
    def irreps_out(self) -> Irreps:
        """The output irreps, full multiplicities, e3nn-jax's order."""
        return self.plan.irreps_out

    def __call__(self, x: jax.Array, y: jax.Array, *, backend: str | None = None) -> jax.Array:
        p = self.plan
        check_rank("x", x, (2,), f"[B, {p.irreps_x.dim}] for {p.irreps_x}")
        check_rank("y", y, (2,), f"[B, {self.irreps_y.dim}] for {self.irreps_y}")
        check_same_dtype(x=x, y=y)
        if x.shape[1] != p.irreps_x.dim:
            raise ValueError(f"x must be [B, {p.irreps_x.dim}] for {p.irreps_x}, got {x.shape}")
        if y.shape != (x.shape[0], self.irreps_y.dim):
            raise ValueError(f"y must be [B={x.shape[0]}, {self.irreps_y.dim}] for {self.irreps_y}, got {y.shape}")
        outs = []
        for g, (_, tp) in zip(p.groups, self.groups):
            xg = g.split_x(x)
            # a symbolic batch (jax.export) cannot be padded to a multiple: one channel then
            fold = g.channels == 1 and isinstance(x.shape[0], int) and x.shape[0] >= ROWS_AS_CHANNELS
            outs.append(_rows_as_channels(tp, xg[..., 0], y, backend) if fold else tp(xg, y, backend=backend))
        return p.join_out(outs)

    def __repr__(self) -> str:
        groups = ", ".join(f"{g.channels} ch x {g.coo.num_paths} paths" for g in self.plan.groups)
        return f"MulIrTensorProduct({self.irreps_x} x {self.irreps_y} -> {self.irreps_out}; {groups})"
