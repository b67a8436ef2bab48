"""One primitive for all groups of a mixed-multiplicity convolution, on e3nn's flat layouts.

``Φ(x, y, s, m) = Σ_g Φ_g(x_g, y, s_g, m_g)``: the sum of the uniform-channel convolutions of a
:class:`e3j._mul_ir_plan.Plan`, each reading its slice of the shared operands. Slots, all without a
channel axis: ``x [N, Dx_flat]`` (e3nn's ``mul_ir`` node features), ``y [E, Dy]`` (edge attributes,
with the self connection's constant column when the plan has one), ``s [E, num_weights]`` (e3nn's
weight order: path ``p`` of group ``g`` reads columns ``weight_columns[p] .. + C_g``) and
``m [N, Dout_flat]`` (e3nn's output layout). Since the weights are read where e3nn puts them and
their cotangent written there, an ``[E, num_weights]`` array is never copied into the groups' layout.

A backend whose kernels include ``grouped_convolution`` / ``grouped_convolution_bwd`` (the reference:
all groups in one sweep over the edges; the CUDA, Pallas GPU (Triton and Mosaic) and TPU kernels: one
launch per group) runs them when it serves every group (see :func:`_plan_backends`); otherwise each group runs
through that backend's ordinary convolution kernels on operands split here (the weights copied into
``[E, P_g, C_g]``), and the results are joined: the same values, at the cost of those copies.

:data:`GROUPED_CONVOLUTION_FACTORED` is the same form with the weights given as the radial network's
last layer, ``s = h @ k`` (``h [E, H]``, ``k [H, num_weights]`` in e3nn's columns): slots ``x, y, h,
k, m``. ``Φ`` is linear in ``s``, so multilinear in ``h`` and ``k``, and the rules carry over as
they are. A backend with ``grouped_convolution_factored`` kernels (the reference: each chunk's
weights computed in the sweep, never written whole) runs them; otherwise the weights are multiplied
out once (a temporary of the call) and run as above, and the cotangents of ``h`` and ``k`` are
products with the weights' cotangent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from .. import contract
from .._mul_ir_plan import Plan
from ..backends import Backend, OpRequest, kernels_of, provides, select_backend
from .convolution import ConvSpec
from .multilinear import Multilinear, Primitives, coo_lmax, factored_evaluations, multiplied_out, out_aval, slot_of

SLOTS = ("x", "y", "s", "m")


@dataclass(frozen=True)
class GroupedConvSpec:
    """Static description of one call: the plan (groups, layouts) and the graph's pytree structure."""

    plan: Plan
    graph_tree: Any = None

    def dim(self, slot: str) -> int:
        p = self.plan
        return {"x": p.irreps_x.dim, "y": p.groups[0].coo.dim_y, "s": p.num_weights, "m": p.irreps_out.dim}[slot]


def _out_aval(spec: GroupedConvSpec, slot: str, avals: dict, aux) -> jax.core.ShapedArray:
    by_slot = {slot_of(k): a for k, a in avals.items()}
    nodes = next(by_slot[k].shape[0] for k in ("x", "m") if k in by_slot)
    edges = next(by_slot[k].shape[0] for k in ("y", "s") if k in by_slot)
    dtype = next(iter(avals.values())).dtype
    rows = nodes if slot in ("x", "m") else edges
    return out_aval((rows, spec.dim(slot)), dtype, list(avals.values()))


def _plan_backends(
    plan: Plan, platform: str, dtype: str, requested: str | None, select=select_backend
) -> list[Backend]:
    """Each group's backend. Each group is selected as a convolution of its own ``C``; when that
    splits the plan across backends (a backend's limits, or its ``yields`` below some ``C``), every
    group goes to the kernel backend among those chosen that runs every group with grouped kernels
    (one launch sequence on e3nn's operands in place, no per-group copies), the one chosen for the
    most weight columns (``P_g · C_g``: where most of the work is) first; if none can, each group
    keeps its own. ``select``: how one request is selected (:func:`e3j.backends.select_backend`)."""
    reqs = [OpRequest("convolution", platform, dtype, g.channels, coo_lmax(g.coo)) for g in plan.groups]
    chosen = [select(r, requested) for r in reqs]
    if len({b.name for b in chosen}) == 1:
        return chosen
    columns: dict[str, int] = {}
    for b, g in zip(chosen, plan.groups, strict=True):
        columns[b.name] = columns.get(b.name, 0) + g.coo.num_paths * g.channels
    by_name = {b.name: b for b in chosen}
    for name in sorted(columns, key=lambda n: -columns[n]):
        b = by_name[name]
        if name != "reference" and all(b.unsupported(r) is None for r in reqs):
            if provides(b, "grouped_convolution"):
                return [b] * len(reqs)
    return chosen


def _dispatch(form, platform: str, requested: str | None, spec: GroupedConvSpec, A: dict, aux, outs) -> dict:
    """The ``M`` outputs ``outs`` on the groups' backends (:func:`_plan_backends`)."""
    plan = spec.plan
    dtype = jnp.dtype(next(iter(A.values())).dtype)
    backends = _plan_backends(plan, platform, dtype.name, requested)
    graph = jax.tree.unflatten(spec.graph_tree, aux)
    avals = {k: jax.typeof(v) for k, v in A.items()}
    aux_avals = tuple(jax.typeof(a) for a in aux)
    types = {o: _out_aval(spec, o, avals, aux_avals) for o in outs}
    kernels = [kernels_of(b, platform) for b in backends]
    if len({b.name for b in backends}) == 1 and kernels[0].provides("grouped_convolution"):
        return contract.run(
            "grouped_convolution", kernels[0], backends[0].name, plan, A, graph, outs, result_type=types.__getitem__
        )
    return _per_group(kernels, backends, plan, A, graph, outs, dtype)


def _per_group(kernels, backends, plan: Plan, A: dict, graph, outs, dtype) -> dict:
    """Each group through its backend's ordinary convolution kernels (under the kernel contract), on
    operands split here, the results joined into e3nn's layouts."""
    args = contract.arguments("grouped_convolution", A, outs, dtype)
    n = len(plan.groups)
    xs = plan.split_x(args["x"]) if args["x"] is not None else [None] * n
    ss = [g.split_weights(args["s"]) for g in plan.groups] if args["s"] is not None else [None] * n
    gs = plan.split_out(args["g"]) if "g" in args else [None] * n
    res = []
    for g, k, b, xg, sg, gg in zip(plan.groups, kernels, backends, xs, ss, gs):
        operands = {"x": xg, "y": args["y"], "s": sg, "m": gg}
        spec = ConvSpec(g.coo, y_channels=False)

        def result_type(slot, spec=spec, channels=g.channels):
            rows = graph.num_nodes if slot in ("x", "m") else graph.num_edges
            shape = (rows, spec.dim(slot)) + ((channels,) if spec.has_channels(slot) else ())
            return jax.ShapeDtypeStruct(shape, dtype)

        res.append(
            contract.run("convolution", k, b.name, g.coo, operands, graph, outs, y_channels=False,
                         result_type=result_type)
        )  # fmt: skip
    results = {"m": plan.join_out([r["m"] for r in res])} if "m" in outs else {}
    backward = tuple(o for o in outs if o != "m")
    if backward:
        ds = plan.join_weights([r["s"] for r in res]) if "s" in outs else None
        results.update(plan.join_cotangents(res, ds, backward))
    return results


GROUPED_CONVOLUTION = Primitives(Multilinear("grouped_convolution", SLOTS, _out_aval, dispatch=_dispatch))
"""All groups of a :class:`e3j.MulIrConvolution` as one convolution on e3nn's layouts."""

FACTORED_SLOTS = ("x", "y", "h", "k", "m")


def _factored_out_aval(spec: GroupedConvSpec, slot: str, avals: dict, aux) -> jax.core.ShapedArray:
    by_slot = {slot_of(k): a for k, a in avals.items()}
    dtype, operands = next(iter(avals.values())).dtype, list(avals.values())
    hidden = by_slot["h"].shape[1] if "h" in by_slot else by_slot["k"].shape[0]
    if slot == "k":
        return out_aval((hidden, spec.plan.num_weights), dtype, operands)
    if slot in ("x", "m"):
        nodes = next(by_slot[k].shape[0] for k in ("x", "m") if k in by_slot)
        return out_aval((nodes, spec.dim(slot)), dtype, operands)
    edges = next(by_slot[k].shape[0] for k in ("y", "h") if k in by_slot)
    return out_aval((edges, hidden if slot == "h" else spec.dim(slot)), dtype, operands)


def factored_backend(plan: Plan, platform: str, requested: str | None, dtype: str, select=select_backend):
    """The groups' backend when one backend runs every group with factored grouped kernels
    (:func:`_plan_backends`), else ``None``. ``select``: how one request is selected (a trace's
    route passes one that imports no declared kernels)."""
    backends = _plan_backends(plan, platform, dtype, requested, select)
    if len({b.name for b in backends}) == 1 and provides(backends[0], "grouped_convolution_factored"):
        return backends[0]
    return None


def _factored_kernels(plan: Plan, platform: str, requested: str | None, dtype) -> tuple:
    """:func:`factored_backend` and its kernels, or ``None``."""
    backend = factored_backend(plan, platform, requested, dtype.name)
    return None if backend is None else (backend, kernels_of(backend, platform))


def _dispatch_factored(form, platform: str, requested: str | None, spec: GroupedConvSpec, A: dict, aux, outs) -> dict:
    """The ``M`` outputs ``outs`` of the convolution with weights ``h @ k``: the backend's factored
    grouped kernels where it has them, else the weights multiplied out (``[E, num_weights]``, a
    temporary) and the array's route (:func:`_dispatch`), the cotangents of ``h`` and ``k`` then
    products with the weights' cotangent (:func:`multiplied_out`)."""
    plan = spec.plan
    dtype = jnp.dtype(next(iter(A.values())).dtype)
    native = _factored_kernels(plan, platform, requested, dtype)
    if native is not None:
        backend, kernels = native
        graph = jax.tree.unflatten(spec.graph_tree, aux)
        avals = {k: jax.typeof(v) for k, v in A.items()}
        aux_avals = tuple(jax.typeof(a) for a in aux)
        return contract.run(
            "grouped_convolution_factored", kernels, backend.name, plan, A, graph, outs,
            result_type=lambda o: _factored_out_aval(spec, o, avals, aux_avals),
        )  # fmt: skip
    run = _array_run(form, platform, requested, spec, aux)
    mask = jax.tree.unflatten(spec.graph_tree, aux).edge_mask
    return multiplied_out(A, None, outs, dtype, (plan.num_weights,), run, mask)


def _dispatch_factored_L(form, platform: str, requested: str | None, spec: GroupedConvSpec, Q, T, aux, outs):
    """An ``L`` call without factored grouped kernels, as a whole (:func:`multiplied_out`: the
    weights multiplied out once per call); ``None`` (one evaluation at a time) with them."""
    dtype = jnp.dtype(next(iter({**Q, **T}.values())).dtype)
    if _factored_kernels(spec.plan, platform, requested, dtype) is not None:
        return None
    run = _array_run(form, platform, requested, spec, aux)
    mask = jax.tree.unflatten(spec.graph_tree, aux).edge_mask
    return multiplied_out(Q, T, outs, dtype, (spec.plan.num_weights,), run, mask)


def _array_run(form, platform: str, requested: str | None, spec: GroupedConvSpec, aux):
    def run(array: dict, array_outs: tuple[str, ...]) -> dict:
        return _dispatch(form, platform, requested, spec, array, aux, array_outs)

    return run


GROUPED_CONVOLUTION_FACTORED = Primitives(
    Multilinear(
        "grouped_convolution_factored",
        FACTORED_SLOTS,
        _factored_out_aval,
        dispatch=_dispatch_factored,
        evaluations=factored_evaluations,
        dispatch_L=_dispatch_factored_L,
    )
)
""":data:`GROUPED_CONVOLUTION` with the weights given as ``h [E, H] @ k [H, num_weights]``: the
form is multilinear in ``h`` and ``k`` as it is in the weights, so every rule carries over."""
