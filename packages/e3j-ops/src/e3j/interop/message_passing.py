"""e3nn-jax's message-passing pattern (NequIP, MACE) as one fused :class:`e3j.Convolution`.

The e3nn-jax code this replaces, for node features ``x [N, irreps_node]``, edge attributes
``y [E, irreps_edge]`` (e.g. spherical harmonics) and per-edge weights ``w [E, num_weights]`` (e.g.
a radial MLP's output)::

    m = x[senders]
    m = e3nn.concatenate([m.filter(self_connection),           # only if self_connection is given
                          e3nn.tensor_product(m, y, filter_ir_out=filter_ir_out)]).regroup()
    m = m * w                                                   # one weight per irrep copy of m
    out = e3nn.scatter_sum(m, dst=receivers, output_size=N)

(without ``self_connection``: ``m = e3nn.tensor_product(m, y, filter_ir_out=filter_ir_out)``).
Here it is one convolution ``out_b = Σ_{a→b} s_ab · (x_a ⊗ y'_ab)``; messages are never formed.

How e3nn's order is folded in, statically: this is :class:`e3j.MulIrConvolution` (e3nn-free), whose
weights are one per output copy in e3nn's order and whose output is e3nn's flat layout. The node
features' blocks are grouped by multiplicity, each group one uniform-channel :class:`e3j.Convolution`
(``64x0e + 32x1o + 16x2e``: 64, 32 and 16 channels; uniform multiplicities: one convolution), its
paths in the order e3nn numbers the copies of ``m`` (:func:`e3j_core.select_paths`), so each path's
weights are one run of e3nn's weight columns, read in place (an array of weights runs all groups as
one primitive), and the outputs are put in place by static runs (one split, then a concatenation). The filtered
copy of ``x`` is the tensor product with a constant ``0e`` edge attribute, so ``y' = [1, y]``: one column prepended
per edge (``x ⊗ 1 = x`` exactly under e3nn's ``component`` and ``norm`` normalizations; under
``none`` it is ``x / sqrt(2l+1)``, and a static factor per output row restores ``x``). Only an edge
attribute with a multiplicity above 1 (never spherical harmonics) makes e3nn's order depend on the
channel, and then the weights and output are gathered with static indices instead.
"""

from __future__ import annotations

import math
from functools import lru_cache

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np

from e3j_core import as_irreps
from e3j_core.coo import normalize_filter

from .._mul_ir_pruning import pruned
from ..factored import FactoredWeights
from ..graph import Graph
from ..mul_ir import MulIrConvolution
from ._operands import block_marks, check_irrep_normalization, message_passing_operands, per_copy
from .layout import to_e3nn_irreps

__all__ = ["MessagePassing", "message_passing"]


class MessagePassing:
    """The static part of :func:`message_passing`: irreps in, ``irreps_out`` and ``num_weights`` out.

    ``mp = MessagePassing(irreps_node, irreps_edge, filter_ir_out, self_connection=...)``;
    ``mp(node_feats, edge_attrs, weights, senders, receivers)`` or ``mp(..., graph=g)`` with an
    :class:`e3j.Graph` built once (``Graph.from_edges(senders, receivers, N)``; building it inside
    the call sorts the edges every time). ``weights: [E, mp.num_weights]``, e3nn's order (one per
    irrep copy of the messages, ``messages.irreps.num_irreps``), or :class:`e3j.FactoredWeights`, or
    what e3nn's ``m * w`` broadcasts: ``[num_weights]`` (the same for every edge), ``[E, 1]`` or a
    scalar (the same for every copy), taken as factored weights, with no per-edge copy.
    Returns ``IrrepsArray [N, mp.irreps_out]``.
    ``self_connection`` takes what e3nn's ``IrrepsArray.filter`` keeps: irreps, a list of irreps, or
    a callable ``MulIrrep -> bool`` asked about each block of ``irreps_node`` (it must keep or drop
    all blocks of an irrep together).
    Mixed multiplicities run natively (one convolution per multiplicity, ``mp.groups``);
    ``grouping="gcd"`` runs them as gcd copies instead (see :class:`e3j.MulIrConvolution`).
    As e3nn's ``m * w``, the call reads ``e3nn.config("irrep_normalization")``: under ``"none"``
    each output copy of irrep ``l`` is scaled by ``1/sqrt(2l+1)`` (where ``m * w`` is e3nn's
    elementwise product: weights with one per copy, an ``IrrepsArray`` or factored; not a scalar,
    nor ``[E, 1]`` or ``[1]`` where there are several copies, which e3nn multiplies plainly); with
    ``irrep_normalization=None`` the product's normalization is read there too, at each call, as
    e3nn-jax reads it. As e3nn-jax, the call skips the products that read a block its inputs mark
    zero (``zero_flags``): it runs the product over the other blocks, taking their weights from
    e3nn's columns.

    >>> import numpy as np, jax.numpy as jnp
    >>> mp = MessagePassing("8x0e + 8x1o", "1o + 2e", "0e + 1o", self_connection="0e + 1o")
    >>> mp.irreps_out, mp.num_weights
    (16x0e+24x1o, 40)
    >>> x = e3nn.IrrepsArray("8x0e + 8x1o", jnp.ones((3, 32)))
    >>> y = e3nn.IrrepsArray("1o + 2e", jnp.ones((4, 8)))
    >>> mp(x, y, jnp.ones((4, 40)), np.array([0, 1, 2, 0]), np.array([1, 0, 1, 2])).shape
    (3, 88)
    """

    def __init__(
        self,
        irreps_node,
        irreps_edge,
        filter_ir_out=None,
        *,
        self_connection=None,
        irrep_normalization: str | None = None,
        grouping: str = "multiplicity",
    ) -> None:
        self._irrep_normalization = irrep_normalization  # None: e3nn.config's, read at each call as e3nn-jax does
        irrep_normalization = check_irrep_normalization(irrep_normalization)
        self.irreps_node = as_irreps(irreps_node, "irreps_node")
        self.irreps_edge = as_irreps(irreps_edge, "irreps_edge")
        self._keep_blocks = self_connection if _is_block_test(self_connection) else None
        # the product's static arguments, as MulIrConvolution takes them (errors name e3nn's arguments)
        self._args = (
            normalize_filter(filter_ir_out, "filter_ir_out"),
            _self_connection(self_connection, self.irreps_node),
            irrep_normalization,
            grouping,
        )
        self.convolution = _convolution(self.irreps_node, self.irreps_edge, *self._args)
        self.plan = self.convolution.plan

    @property
    def irreps_out(self) -> e3nn.Irreps:
        """e3nn's irreps of the messages and of the result."""
        return to_e3nn_irreps(self.plan.irreps_out)

    @property
    def num_weights(self) -> int:
        """``irreps_out.num_irreps``: one weight per copy."""
        return self.plan.num_weights

    @property
    def groups(self) -> tuple:
        """``(C, e3j.Convolution)`` per group of node-feature blocks: the ops run per call."""
        return self.convolution.groups

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
        # e3nn's ``m * w`` splits the messages' blocks where an IrrepsArray of weights has its own
        w_blocks = weights.irreps if isinstance(weights, e3nn.IrrepsArray) and len(weights.irreps) > 1 else None
        elementwise = per_copy(weights, self.num_weights)
        x, y, w, graph = message_passing_operands(
            node_feats, self.irreps_node, edge_attrs, self.irreps_edge, weights, self.num_weights,
            f"one per irrep copy of {self.irreps_out}, e3nn's order", senders, receivers, graph, simplify=True,
            broadcast=True,
        )  # fmt: skip
        if self._keep_blocks is not None and _self_connection(self._keep_blocks, node_feats.irreps) != self._args[1]:
            raise ValueError(
                f"self_connection (a callable) keeps other irreps of node_feats' blocks {node_feats.irreps} than of "
                f"irreps_node's {to_e3nn_irreps(self.irreps_node)}: build MessagePassing with node_feats.irreps"
            )
        args, convolution = self._args, self.convolution
        normalization = check_irrep_normalization(self._irrep_normalization)
        if normalization != args[2]:  # e3nn.config changed since construction
            args = (args[0], args[1], normalization, args[3])
            convolution = _convolution(self.irreps_node, self.irreps_edge, *args)
        # the flat layouts are the same whatever the chunking (e3nn's product merges neighbouring
        # equal blocks first): the marks are read on the op's blocks
        zero_x = block_marks(node_feats, self.irreps_node)
        marked_y = isinstance(edge_attrs, e3nn.IrrepsArray)
        zero_y = block_marks(edge_attrs, self.irreps_edge) if marked_y else (False,) * len(self.irreps_edge)
        if any(zero_x) or any(zero_y):
            # e3nn-jax skips every product that reads a marked block: so does the call
            reduced = _pruned(self.irreps_node, self.irreps_edge, *args, zero_x, zero_y)
            if reduced is None:
                out = jnp.zeros((x.shape[0], self.plan.irreps_out.dim), x.dtype)
            else:
                maps, conv = reduced  # conv reads its weights' columns of w where they are
                out = maps.place(conv(maps.x(x), maps.y(y), w, graph, backend=backend))
        else:
            out = convolution(x, y, w, graph, backend=backend)
        if elementwise and e3nn.config("irrep_normalization") == "none":
            # that elementwise product 0e ⊗ l follows the global setting, whose "none"
            # Clebsch–Gordan coefficient is 1/sqrt(2l+1) (1 for "component" and "norm"): one
            # static scale per output row, applied to the node-sized result
            out = out * jnp.asarray(_none_normalization_rows(self.plan.irreps_out), out.dtype)
        irreps = self.irreps_out if w_blocks is None else e3nn.elementwise_tensor_product(self.irreps_out, w_blocks)
        return e3nn.IrrepsArray(irreps, out)


def _is_block_test(self_connection) -> bool:
    """A callable as e3nn's ``IrrepsArray.filter`` takes one (``MulIrrep -> bool``), not irreps."""
    return callable(self_connection) and not isinstance(self_connection, type)


def _self_connection(self_connection, irreps_node) -> tuple | None:
    """The irreps ``m.filter(self_connection)`` keeps, as :class:`e3j.MulIrConvolution` takes them.

    A callable is asked about each block of ``irreps_node`` (an ``e3nn.MulIrrep``, as e3nn's
    ``filter`` asks it); the convolution keeps or drops all blocks of an irrep together, so a
    callable that keeps some blocks of an irrep and drops others is refused."""
    if not _is_block_test(self_connection):
        return normalize_filter(self_connection, "self_connection")
    answers: dict = {}
    for mul_ir in to_e3nn_irreps(as_irreps(irreps_node, "irreps_node")):
        answers.setdefault(mul_ir.ir, set()).add(bool(self_connection(mul_ir)))
    split = [str(ir) for ir, kept in answers.items() if len(kept) > 1]
    if split:
        raise ValueError(
            f"self_connection (a callable) keeps some blocks of {', '.join(split)} in irreps_node "
            f"{to_e3nn_irreps(as_irreps(irreps_node, 'irreps_node'))} and drops others: the fused self "
            "connection keeps an irrep's blocks together; keep them all, or none"
        )
    return normalize_filter([ir for ir, kept in answers.items() if True in kept], "self_connection")


@lru_cache(maxsize=256)
def _convolution(irreps_node, irreps_edge, filter_out, keep, normalization, grouping) -> MulIrConvolution:
    return MulIrConvolution(irreps_node, irreps_edge, filter_out, self_connection=keep,
                            normalization=normalization, grouping=grouping)  # fmt: skip


@lru_cache(maxsize=256)
def _pruned(irreps_node, irreps_edge, filter_out, keep, normalization, grouping, zero_x, zero_y):
    """``(maps, convolution)`` over the unmarked blocks (:func:`e3j._mul_ir_pruning.pruned`), the
    convolution taking the full weights, or ``None`` where no product is left."""
    maps = pruned(irreps_node, irreps_edge, filter_out, keep, normalization, True, zero_x, zero_y)
    if maps is None:
        return None
    reduced = _convolution(maps.irreps_x, maps.irreps_y, filter_out, keep, normalization, grouping)
    return maps, MulIrConvolution._of_plan(maps.reading_full_weights(reduced.plan))


def _none_normalization_rows(irreps) -> np.ndarray:
    """``1/sqrt(2l+1)`` for each row of ``irreps`` (e3nn's flat layout)."""
    return np.concatenate([np.full(mul * ir.dim, 1 / math.sqrt(ir.dim)) for mul, ir in irreps] or [np.zeros(0)])


def message_passing(
    node_feats: e3nn.IrrepsArray,
    edge_attrs: e3nn.IrrepsArray,
    weights: jax.Array | FactoredWeights,
    senders: jax.Array | None = None,
    receivers: jax.Array | None = None,
    *,
    filter_ir_out=None,
    self_connection=None,
    irrep_normalization: str | None = None,
    grouping: str = "multiplicity",
    graph: Graph | None = None,
    backend: str | None = None,
) -> e3nn.IrrepsArray:
    """The e3nn-jax pattern of this module's docstring, fused: ``scatter_sum(pattern(x[senders], y) * w)``.

    ``node_feats: IrrepsArray [N, irreps_node]``, ``edge_attrs: IrrepsArray [E, irreps_edge]``,
    ``weights: [E, num_weights]`` in e3nn's order (``num_weights`` = the number of irrep copies of
    the messages; or what ``m * w`` broadcasts, see :class:`MessagePassing`), ``senders``/``receivers: int [E]`` or
    ``graph=``:class:`e3j.Graph`. Returns ``IrrepsArray [N, irreps_out]`` (the ``output_size`` is
    ``N``).
    """
    if not isinstance(node_feats, e3nn.IrrepsArray):
        raise TypeError(f"node_feats must be an e3nn.IrrepsArray, got {type(node_feats).__name__}")
    edge_irreps = edge_attrs.irreps if isinstance(edge_attrs, e3nn.IrrepsArray) else None
    if edge_irreps is None:
        raise TypeError(
            f"edge_attrs must be an e3nn.IrrepsArray (its irreps pick the tables), got {type(edge_attrs).__name__}"
        )
    mp = MessagePassing(
        node_feats.irreps,
        edge_irreps,
        filter_ir_out,
        self_connection=self_connection,
        irrep_normalization=irrep_normalization,
        grouping=grouping,
    )
    return mp(node_feats, edge_attrs, weights, senders, receivers, graph=graph, backend=backend)
