"""The checks and conversions every fused e3nn-jax drop-in runs on its call's operands (private)."""

from __future__ import annotations

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np

from e3j_core import Irreps
from e3j_core.coo import TP_NORMALIZATIONS

from .._checks import promoted_real_dtype
from ..factored import FactoredWeights, check_weights
from ..graph import Graph

# what a complex operand is told: e3nn-jax computes with it, e3j's products are real
REAL = "real (e3j's products are real)"


def marked_rows(a: e3nn.IrrepsArray) -> np.ndarray:
    """``[a.irreps.dim]`` bool: the components of the blocks ``a.zero_flags`` marks zero."""
    rows = [np.full(mul * ir.dim, z, bool) for (mul, ir), z in zip(a.irreps, a.zero_flags)]
    return np.concatenate(rows) if rows else np.zeros(0, bool)


def block_marks(a: e3nn.IrrepsArray, irreps) -> tuple[bool, ...]:
    """``a.zero_flags`` on the blocks of ``irreps`` (equal to ``a.irreps`` up to merged neighbours, as
    e3nn's ``rechunk`` takes them): a block is marked where every one of its rows is."""
    rows = marked_rows(a)
    return tuple(bool(rows[s].all()) for s in Irreps(irreps).slices())


def marks_zeroed(a: e3nn.IrrepsArray) -> jax.Array:
    """``a.array`` with the blocks ``a.zero_flags`` marks set to zero: e3nn-jax never reads a marked
    block's data (its chunk is ``None``), so neither does a drop-in, whatever the data holds."""
    if not any(a.zero_flags):
        return a.array
    mask = marked_rows(a)
    return jnp.where(mask, jnp.zeros((), a.dtype), a.array)


def check_irrep_normalization(value: str | None) -> str:
    """e3nn-jax's ``irrep_normalization=`` argument: ``None`` is its configured default."""
    if value is None:
        value = e3nn.config("irrep_normalization")
    if value not in TP_NORMALIZATIONS:
        raise ValueError(f"irrep_normalization must be one of {TP_NORMALIZATIONS}, got {value!r}")
    return value


def message_passing_operands(
    node_feats,
    irreps_node: Irreps,
    edge_attrs,
    irreps_edge: Irreps,
    weights,
    num_weights: int,
    weights_layout: str,
    senders,
    receivers,
    graph: Graph | None,
    *,
    simplify: bool = False,
    broadcast: bool = False,
    one_step: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array | FactoredWeights, Graph]:
    """``(x [N, irreps_node.dim], y [E, irreps_edge.dim], w [E, num_weights], graph)`` in one dtype.

    ``node_feats`` must be an ``IrrepsArray [N, irreps_node]``, ``edge_attrs`` one of ``irreps_edge``
    or a plain ``[E, irreps_edge.dim]`` array, ``weights`` ``[E, num_weights]`` (an array, or an
    ``IrrepsArray`` of scalars as ``e3nn.flax.MultiLayerPerceptron`` returns) or
    :class:`e3j.FactoredWeights` (``weights_layout`` names their order in the error); the graph is
    ``graph`` or built from ``senders``/``receivers``.
    ``simplify``: compare irreps after merging equal neighbouring blocks (as ``rechunk`` allows).
    ``broadcast``: take the plain arrays e3nn's ``m * w`` broadcasts (:func:`broadcast_weights`).
    ``one_step``: promote the three dtypes at once, as e3nn's legacy ``FunctionalTensorProduct``
    (its ``left_right``), not the tensor product's inputs first and then the weights.
    """

    def same(a, b) -> bool:
        a, b = Irreps(a), Irreps(b)
        return a.simplify() == b.simplify() if simplify else a == b

    if not isinstance(node_feats, e3nn.IrrepsArray):
        raise TypeError(f"node_feats must be an e3nn.IrrepsArray, got {type(node_feats).__name__}")
    if not same(node_feats.irreps, irreps_node) or node_feats.ndim != 2:
        raise ValueError(f"node_feats must be an IrrepsArray [N, {irreps_node}], got {node_feats.irreps} "
                         f"of shape {node_feats.shape}")  # fmt: skip
    if edge_attrs is None or isinstance(edge_attrs, (list, tuple)):
        raise TypeError(f"edge_attrs must be an e3nn.IrrepsArray or an array, got {type(edge_attrs).__name__}")
    if isinstance(edge_attrs, e3nn.IrrepsArray):
        if not same(edge_attrs.irreps, irreps_edge):
            raise ValueError(f"edge_attrs must have irreps {irreps_edge}, got {edge_attrs.irreps}")
        edge_attrs = marks_zeroed(edge_attrs)
    if jnp.ndim(edge_attrs) != 2 or edge_attrs.shape[1] != irreps_edge.dim:
        raise ValueError(f"edge_attrs must be [E, {irreps_edge.dim}] for {irreps_edge}, "
                         f"got shape {jnp.shape(edge_attrs)}")  # fmt: skip
    num_edges, num_nodes = edge_attrs.shape[0], node_feats.shape[0]
    if isinstance(weights, e3nn.IrrepsArray):
        # what e3nn.flax.MultiLayerPerceptron returns for an IrrepsArray input; e3nn's ``m * w``
        # scales each copy by its scalar, which is what plain weights mean here (broadcast as theirs)
        if any(ir != e3nn.Irrep("0e") for _, ir in weights.irreps) or weights.irreps.num_irreps != num_weights:
            raise ValueError(
                f"weights given as an IrrepsArray must be scalars ({num_weights}x0e), got {weights.irreps}"
            )
        weights = marks_zeroed(weights)
    # the weights as given, for the dtype: broadcast forms are built in its dtype, which would lose
    # the weak type of a Python number (float64 under x64, where e3nn's m * 2.0 stays float32)
    given = weights if isinstance(weights, (jax.Array, np.ndarray, int, float, np.number)) else _dtype(weights)
    if one_step or per_copy(given, num_weights):
        given = _dtype(given)  # e3nn's per-copy product drops a weak type (a plain multiply keeps it)
    if broadcast:
        weights = broadcast_weights(weights, num_edges, num_weights)
    # arrays only (a list is check_weights' TypeError); the edge count is edge_attrs'
    shape = tuple(getattr(weights.hidden if isinstance(weights, FactoredWeights) else weights, "shape", ()))
    if len(shape) == 2 and shape[0] != num_edges:  # other ranks: check_weights' message on the layout
        part = "weights (FactoredWeights.hidden)" if isinstance(weights, FactoredWeights) else "weights"
        raise ValueError(f"{part} has {shape[0]} rows and edge_attrs {num_edges}: both take one row per edge")
    check_weights("weights", weights, num_edges, num_weights, weights_layout)
    # each operand's dtype checked under its own name, then promoted as e3nn-jax's arithmetic does:
    # the tensor product first (its inputs' weak types dropped: integers give the default float),
    # then the product with the weights; or, as its legacy FunctionalTensorProduct, all at once
    inputs = {"node_feats": node_feats.array.dtype, "edge_attrs": _dtype(edge_attrs)}
    if one_step:
        dtype = promoted_real_dtype({**inputs, "weights": given}, REAL)
        if jnp.result_type(*inputs.values(), given).kind == "i":  # its left_right: float32, even under x64
            dtype = jnp.dtype(jnp.float32)
    else:
        messages = promoted_real_dtype(inputs, REAL)
        dtype = promoted_real_dtype({"node_feats ⊗ edge_attrs": messages, "weights": given}, REAL)
    if graph is not None and not isinstance(graph, Graph):
        raise TypeError(
            "graph must be an e3j.Graph (e3j.Graph.from_edges(senders, receivers, num_nodes)), "
            f"got {type(graph).__name__}"
        )
    if graph is None:
        if senders is None or receivers is None:
            raise ValueError("give senders and receivers, or graph=e3j.Graph")
        graph = Graph.from_edges(senders, receivers, num_nodes)
    elif senders is not None or receivers is not None:
        raise ValueError("give senders and receivers, or graph, not both")
    if graph.num_nodes != num_nodes or graph.num_edges != num_edges:
        raise ValueError(f"graph has {graph.num_nodes} nodes and {graph.num_edges} edges, node_feats and "
                         f"edge_attrs have {num_nodes} and {num_edges}")  # fmt: skip
    return marks_zeroed(node_feats).astype(dtype), edge_attrs.astype(dtype), weights.astype(dtype), graph


def per_copy(weights, num_weights: int) -> bool:
    """Whether e3nn's ``messages * weights`` multiplies per irrep copy (an elementwise tensor product:
    an ``IrrepsArray`` or :class:`e3j.FactoredWeights`, or an array whose last axis has one weight
    per copy, so with one copy ``[E, 1]`` and ``[1]`` too) rather than broadcasting a plain multiply."""
    if isinstance(weights, (e3nn.IrrepsArray, FactoredWeights)):
        return True
    # numpy's: JAX's warns for a list (an error to come), which the weights check then names
    return np.ndim(weights) > 0 and np.shape(weights)[-1] == num_weights


def _dtype(a):
    """An array's dtype (strong: no weak type), anything else as it is (for the check to name it)."""
    return a.dtype if isinstance(a, (jax.Array, np.ndarray, e3nn.IrrepsArray, FactoredWeights)) else a


def broadcast_weights(w, num_edges: int, num_weights: int):
    """A plain array that e3nn's ``messages * w`` broadcasts, as :class:`e3j.FactoredWeights` of the
    same ``[E, num_weights]`` weights (no copy per edge): ``[num_weights]`` or ``[1, num_weights]``
    (one weight per copy, shared by every edge: ``ones [E, 1] @ w``), ``[E, 1]``, ``[1, 1]``,
    ``[1]`` or a scalar (one weight per edge or one for all, every copy: ``w @ ones [1, W]``).
    Anything else (``[E, num_weights]`` included) is returned as it is, for the shape check to
    judge; e3nn's rule: a last axis of ``num_weights`` is per copy, else it must be 1."""
    if isinstance(w, (e3nn.IrrepsArray, FactoredWeights)):
        return w
    if isinstance(w, (bool, np.bool_)) or jnp.result_type(getattr(w, "dtype", np.float64)) == jnp.bool_:
        raise TypeError(f"weights must be a float array or number, got {w!r}")
    if isinstance(w, (int, float, np.number)):
        w = jnp.asarray(w)
    if not isinstance(w, (jax.Array, np.ndarray)):
        return w
    shape = w.shape
    if len(shape) > 2 or shape == (num_edges, num_weights):
        return w
    if len(shape) == 2 and shape[0] not in (1, num_edges):
        return w
    dtype = w.dtype
    if per_copy(w, num_weights) and (len(shape) == 1 or shape[0] == 1):
        return FactoredWeights(jnp.ones((num_edges, 1), dtype), jnp.reshape(w, (1, num_weights)))
    if len(shape) == 0 or shape[-1] == 1:
        per_edge = jnp.broadcast_to(jnp.reshape(w, (-1, 1)), (num_edges, 1))
        return FactoredWeights(per_edge, jnp.ones((1, num_weights), dtype))
    return w
