"""The kernel contract: what a backend's kernels receive and return, stated and enforced once.

A backend is four plain jittable functions, plus optional pairs of them (factored, grouped, grouped
factored; :class:`Kernels`). e3j calls every one of them through :func:`run`, which establishes
every rule below first, so that a kernel implements its contraction and nothing else — no kernel
re-derives which operands a backward reads, what an empty graph gives, or which dtype to compute in.

Signatures (``coo`` is an :class:`e3j_core.TensorProductCoo`; keyword options are static):

- ``tensor_product(coo, x, y, *, y_channels) -> z``
- ``tensor_product_bwd(coo, x, y, dz, *, outs, y_channels) -> {"x": dx, "y": dy}`` (keys: ``outs``)
- ``convolution(coo, x, y, s, graph, *, y_channels) -> m``
- ``convolution_bwd(coo, x, y, s, dm, graph, *, outs, y_channels) -> {"x"|"y"|"s": ...}``
- optional, both or neither: ``convolution_factored(coo, x, y, h, k, graph, *, y_channels) -> m``
  and ``convolution_factored_bwd(coo, x, y, h, k, dm, graph, *, outs, y_channels) -> {"x"|"y"|"h"|
  "k": ...}``: the convolution with its edge scalars given as the radial network's last layer, ``s
  = h @ k`` (``h [E, H]``, ``k [H, P, C]``), which the kernel may compute piece by piece and never
  write whole; the cotangents are ``dh [E, H]`` and ``dk [H, P, C]``. Without them e3j multiplies
  ``s`` out and runs ``convolution`` / ``convolution_bwd``.
- optional, both or neither: ``grouped_convolution(plan, x, y, s, graph) -> m`` and
  ``grouped_convolution_bwd(plan, x, y, s, dm, graph, *, outs) -> {"x"|"y"|"s": ...}``: every group
  of a mixed-multiplicity plan (:class:`e3j.MulIrConvolution`) in one call, on e3nn's flat layouts
  (``x [N, Dx_flat]``, ``y [E, Dy]``, ``s [E, num_weights]`` in e3nn's weight order, ``m [N,
  Dout_flat]``; see :mod:`e3j._primitives.grouped_convolution`). Without them each group runs
  through ``convolution`` / ``convolution_bwd``, and e3j converts the layouts around the calls.
  What a kernel package may use of ``plan`` (duck-typed: it never imports ``e3j``): ``groups``
  (each with ``coo``, ``channels`` and ``weight_columns``: path ``p``'s ``C`` weights are columns
  ``weight_columns[p] ..`` of ``s``), ``num_weights``, ``split_x`` / ``join_x`` and ``split_out``
  / ``join_out`` (the flat layouts to and from the groups' ``[.., D_g, C_g]``), and the loops over
  the groups built on them: ``forward_by_group`` / ``backward_by_group`` (one launch per group, the
  layouts converted around them, the weights' cotangent one buffer the launches write in turn) and
  ``join_cotangents`` (for a backward that runs its own loop).
- optional, both or neither: ``grouped_convolution_factored(plan, x, y, h, k, graph) -> m`` and
  ``grouped_convolution_factored_bwd(plan, x, y, h, k, dm, graph, *, outs) -> {"x"|"y"|"h"|"k":
  ...}``: the same with the weights given as the product ``h [E, H] @ k [H, num_weights]`` (``k``'s
  columns in e3nn's weight order), which the kernel may compute piece by piece and never write
  whole; the cotangents are ``dh [E, H]`` and ``dk [H, num_weights]``. Without them e3j multiplies
  the weights out and runs ``grouped_convolution`` (or the groups).

Layouts (trailing channels): ``x [B|N, Dx, C]``; ``y [B|E, Dy, C]`` (``y_channels=True``) or
``[B|E, Dy]`` broadcast over channels; ``s [E, P, C]`` (one edge scalar per path and channel);
``z [B, Dout, C]``; ``m [N, Dout, C]``. A cotangent has its primal's shape, so the cotangent of a
broadcast ``y`` is ``[B|E, Dy]``, summed over channels. ``graph`` is an :class:`e3j.Graph` with its
named fields (``senders``, ``receivers``, ``edge_mask``, ``order``, ``receiver_offsets``,
``sender_order``, ``sender_offsets``, ``num_valid``).

Guarantees to a kernel:

1. every array operand has one floating dtype, the op's;
2. ``outs`` is a non-empty tuple in slot order (``("x", "y")`` for the tensor product, a subset of
   ``("x", "y", "s")`` for the convolution, of ``("x", "y", "h", "k")`` for the factored ones);
3. an operand is ``None`` exactly when the requested outputs do not read it (:func:`needed`);
   ``dz`` / ``dm`` is always given;
4. batch, node, edge and channel counts are positive (every operand has elements): an empty call
   is answered with zeros here and never reaches a kernel;
5. shapes agree with ``coo`` and with each other (checked by the public ops).

Obligations of a kernel: return arrays of exactly the shapes and dtype above (checked here, with
an error naming the backend), be a pure function of its inputs, and skip padding edges (edges at
positions ``>= num_valid`` of ``order`` / ``sender_order``) — their cotangent rows are zero.

>>> needed("convolution", ("x",))
('y', 's')
>>> needed("tensor_product", ("x", "y"))
('x', 'y')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from e3j_core import TensorProductCoo

__all__ = [
    "OPS",
    "ConvolutionBwdKernel",
    "ConvolutionKernel",
    "Kernels",
    "TensorProductBwdKernel",
    "TensorProductKernel",
    "arguments",
    "checked",
    "is_empty",
    "needed",
    "run",
]

OPS = ("tensor_product", "convolution")

#: For each op: its forward output slot, and for every output slot the operands it reads (besides
#: the output cotangent, which a backward always reads).
_FORWARD = {
    "tensor_product": "z",
    "convolution": "m",
    "convolution_factored": "m",
    "grouped_convolution": "m",
    "grouped_convolution_factored": "m",
}
_READS = {
    "tensor_product": {"z": ("x", "y"), "x": ("y",), "y": ("x",)},
    "convolution": {"m": ("x", "y", "s"), "x": ("y", "s"), "y": ("x", "s"), "s": ("x", "y")},
    "convolution_factored": {
        "m": ("x", "y", "h", "k"),
        "x": ("y", "h", "k"),
        "y": ("x", "h", "k"),
        "h": ("x", "y", "k"),
        "k": ("x", "y", "h"),
    },
}
# the grouped forms read their operands as the uniform ones do
_READS["grouped_convolution"] = _READS["convolution"]
_READS["grouped_convolution_factored"] = _READS["convolution_factored"]
#: each op's operands, in its kernels' signature order
_OPERANDS = {
    "tensor_product": ("x", "y"),
    "convolution": ("x", "y", "s"),
    "convolution_factored": ("x", "y", "h", "k"),
    "grouped_convolution": ("x", "y", "s"),
    "grouped_convolution_factored": ("x", "y", "h", "k"),
}
#: the ops whose kernels take a mixed-multiplicity plan instead of a table, and no ``y_channels``
#: (``y`` is broadcast over every group's channels)
_GROUPED = ("grouped_convolution", "grouped_convolution_factored")


def needed(op: str, outs: tuple[str, ...]) -> tuple[str, ...]:
    """The operands (in slot order) that the outputs ``outs`` of ``op`` read."""
    reads = _READS[op]
    unknown = [o for o in outs if o not in reads]
    if unknown:
        raise ValueError(f"{op} has no output slot(s) {unknown}; slots: {tuple(reads)}")
    wanted = {k for o in outs for k in reads[o]}
    return tuple(k for k in _OPERANDS[op] if k in wanted)


class TensorProductKernel(Protocol):
    """``tensor_product(coo, x, y, *, y_channels) -> z [B, Dout, C]`` (the module docstring's layouts)."""

    def __call__(self, coo: TensorProductCoo, x: jax.Array, y: jax.Array, *, y_channels: bool) -> jax.Array: ...


class TensorProductBwdKernel(Protocol):
    """``tensor_product_bwd(coo, x, y, dz, *, outs, y_channels) -> {slot: cotangent}`` for the slots ``outs``."""

    def __call__(
        self,
        coo: TensorProductCoo,
        x: jax.Array | None,
        y: jax.Array | None,
        dz: jax.Array,
        *,
        outs: tuple[str, ...],
        y_channels: bool,
    ) -> Mapping[str, jax.Array]: ...


class ConvolutionKernel(Protocol):
    """``convolution(coo, x, y, s, graph, *, y_channels) -> m [N, Dout, C]``, padding edges skipped."""

    def __call__(
        self, coo: TensorProductCoo, x: jax.Array, y: jax.Array, s: jax.Array, graph: Any, *, y_channels: bool
    ) -> jax.Array: ...


class ConvolutionBwdKernel(Protocol):
    """``convolution_bwd(coo, x, y, s, dm, graph, *, outs, y_channels) -> {slot: cotangent}``; padding
    edges' rows of ``dy`` and ``ds`` are zero."""

    def __call__(
        self,
        coo: TensorProductCoo,
        x: jax.Array | None,
        y: jax.Array | None,
        s: jax.Array | None,
        dm: jax.Array,
        graph: Any,
        *,
        outs: tuple[str, ...],
        y_channels: bool,
    ) -> Mapping[str, jax.Array]: ...


@dataclass(frozen=True)
class Kernels:
    """The kernel functions of a backend (each ``None`` when not provided); see the module doc."""

    tensor_product: TensorProductKernel | None = None
    tensor_product_bwd: TensorProductBwdKernel | None = None
    convolution: ConvolutionKernel | None = None
    convolution_bwd: ConvolutionBwdKernel | None = None
    #: optional: the convolution with its edge scalars as a product ``h @ k`` (see the module doc)
    convolution_factored: Callable[..., jax.Array] | None = None
    convolution_factored_bwd: Callable[..., Mapping[str, jax.Array]] | None = None
    #: optional: all groups of a mixed-multiplicity convolution in one call (see the module doc)
    grouped_convolution: Callable[..., jax.Array] | None = None
    grouped_convolution_bwd: Callable[..., Mapping[str, jax.Array]] | None = None
    #: optional: the same with the weights as a product ``h @ k`` (see the module doc)
    grouped_convolution_factored: Callable[..., jax.Array] | None = None
    grouped_convolution_factored_bwd: Callable[..., Mapping[str, jax.Array]] | None = None

    def __post_init__(self) -> None:
        for op in ("convolution_factored", "grouped_convolution", "grouped_convolution_factored"):
            if (getattr(self, op) is None) != (getattr(self, op + "_bwd") is None):
                raise ValueError(f"{op} and {op}_bwd are given together or not at all")

    def provides(self, op: str) -> bool:
        """Whether both ``op`` and ``op + "_bwd"`` are given."""
        return getattr(self, op) is not None and getattr(self, op + "_bwd") is not None


def run(
    op: str,
    kernels: Kernels,
    backend_name: str,
    table: Any,
    operands: Mapping[str, jax.Array],
    graph: Any,
    outs: tuple[str, ...],
    *,
    result_type: Callable[[str], jax.ShapeDtypeStruct],
    y_channels: bool | None = None,
) -> dict[str, jax.Array]:
    """Compute the outputs ``outs`` of ``op`` with ``kernels``, under the contract's guarantees.

    ``table`` is the op's :class:`e3j_core.TensorProductCoo` (its mixed-multiplicity plan for the
    grouped ops); ``operands`` maps slot names (``x``, ``y``, ``s`` or ``h`` and ``k``, and the
    output cotangent ``z`` / ``m`` for a backward) to arrays; ``result_type(slot)`` gives each
    output's shape and dtype; ``y_channels`` is given for every op but the grouped ones, whose
    kernels do not take it. The forward and backward outputs requested together are computed by
    one forward and one fused backward call.
    """
    if (op in _GROUPED) != (y_channels is None):
        raise ValueError(f"y_channels is given for {op} exactly when it is not one of {_GROUPED}")
    options = {} if y_channels is None else {"y_channels": y_channels}
    forward = _FORWARD[op]
    results: dict[str, jax.Array] = {}
    if forward in outs:
        results.update(_call(op, kernels, backend_name, table, operands, graph, (forward,), options, result_type))
    backward = tuple(o for o in _OPERANDS[op] if o in outs)
    if backward:
        results.update(_call(op, kernels, backend_name, table, operands, graph, backward, options, result_type))
    return results


def arguments(op: str, operands: Mapping[str, jax.Array], outs: tuple[str, ...], dtype) -> dict:
    """The array arguments of ``op``'s kernels for the outputs ``outs``: each operand the outputs
    read (:func:`needed`) in ``dtype``, the others ``None``, and the output cotangent as ``"g"``
    when a backward output is asked."""
    reads = needed(op, outs)
    args = {k: (jnp.asarray(operands[k]).astype(dtype) if k in reads else None) for k in _OPERANDS[op]}
    if any(o != _FORWARD[op] for o in outs):
        args["g"] = jnp.asarray(operands[_FORWARD[op]]).astype(dtype)
    return args


def _call(op, kernels, backend_name, table, operands, graph, outs, options, result_type) -> dict[str, jax.Array]:
    types = {o: result_type(o) for o in outs}
    args = arguments(op, operands, outs, next(iter(types.values())).dtype)
    forward = outs == (_FORWARD[op],)
    if is_empty(args, graph):
        return {o: jnp.zeros(t.shape, t.dtype) for o, t in types.items()}
    if op == "tensor_product":
        if forward:
            res = {"z": kernels.tensor_product(table, args["x"], args["y"], **options)}
        else:
            res = kernels.tensor_product_bwd(table, args["x"], args["y"], args["g"], outs=outs, **options)
    else:
        kernel = getattr(kernels, op if forward else op + "_bwd")
        operands = [args[k] for k in _OPERANDS[op]]
        if forward:
            res = {"m": kernel(table, *operands, graph, **options)}
        else:
            res = kernel(table, *operands, args["g"], graph, outs=outs, **options)
    return checked(op, backend_name, forward, res, types)


def is_empty(args: Mapping, graph) -> bool:
    """Whether a call has nothing to compute: no rows (an operand's, the graph's nodes or its
    edges) or an operand with no elements (no channels; a factored call's hidden width 0). Every
    output is a sum of products each reading every operand, so such a call is all zeros: answered
    here, never passed to a kernel."""
    operands = [a for a in args.values() if a is not None]
    rows = [a.shape[0] for a in operands]
    if graph is not None:
        rows += [graph.num_nodes, graph.num_edges]
    return min(rows) == 0 or any(a.size == 0 for a in operands)


def checked(op: str, backend_name: str, forward: bool, res, types: Mapping) -> dict[str, jax.Array]:
    """``res`` (a kernel's result) if it holds exactly the outputs ``types`` with their shapes and
    dtypes; else ``TypeError`` naming the backend and the kernel."""
    kernel = op if forward else op + "_bwd"
    if not isinstance(res, Mapping) or set(res) != set(types):
        got = sorted(res) if isinstance(res, Mapping) else type(res).__name__
        raise TypeError(f"backend {backend_name!r}: {kernel} returned {got}, expected outputs {sorted(types)}")
    for o, t in types.items():
        r = res[o]
        if tuple(r.shape) != tuple(t.shape) or r.dtype != t.dtype:
            raise TypeError(
                f"backend {backend_name!r}: {kernel} returned {o} as {r.dtype}{list(r.shape)}, "
                f"expected {t.dtype}{list(t.shape)}"
            )
    return dict(res)
