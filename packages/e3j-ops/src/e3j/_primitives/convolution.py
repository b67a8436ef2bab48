"""The convolution primitives: ``Φ(x, y, s, m) = Σ_{a→b} Σ_r c_r x_a[i1] y_ab[i2] s_ab[i3] m_b[i0]``.

Slots: ``x [N, Dx, C]`` (senders), ``y [E, Dy]`` or ``[E, Dy, C]`` (edges), ``s [E, P, C]`` (edge
scalars, one per path), ``m [N, Dout, C]`` (receivers). ``contract_m`` is the convolution (paper
Eq. 12–13); ``contract_x``, ``contract_y``, ``contract_s`` are its cotangents (Eq. 16). The graph's
arrays ride along as non-differentiable operands.

:data:`CONVOLUTION_FACTORED` is the same form with the edge scalars given as the radial network's
last layer, ``s[e, p, c] = Σ_j h[e, j] k[j, p, c]``: slots ``x, y, h [E, H], k [H, P, C], m``.
``Φ`` is linear in ``s``, so multilinear in ``h`` and ``k``, and every rule carries over. A
backend with ``convolution_factored`` kernels (the reference: each chunk's scalars computed inside
its sweep, never written whole) runs them; otherwise ``s`` is multiplied out once (a temporary of
the call) and the convolution kernels run on it, the cotangents of ``h`` and ``k`` then products
with the cotangent of ``s``.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from .. import contract
from ..backends import OpRequest, kernels_of, select_backend
from .multilinear import CooSpec, Multilinear, Primitives, factored_evaluations, multiplied_out, out_aval, slot_of

SLOTS = ("x", "y", "s", "m")


@dataclass(frozen=True)
class ConvSpec(CooSpec):
    """Static description of one convolution call (``graph_tree``: the :class:`e3j.Graph`'s)."""

    def dim(self, slot: str) -> int:
        coo = self.coo
        return {"x": coo.dim_x, "y": coo.dim_y, "s": coo.num_paths, "m": coo.dim_out}[slot]


def _out_aval(spec: ConvSpec, slot: str, avals: dict, aux) -> jax.core.ShapedArray:
    by_slot = {slot_of(k): a for k, a in avals.items()}
    nodes = next(by_slot[k].shape[0] for k in ("x", "m") if k in by_slot)
    edges = next(by_slot[k].shape[0] for k in ("y", "s") if k in by_slot)
    channels = next(a.shape[-1] for k, a in by_slot.items() if spec.has_channels(k))
    dtype = next(iter(avals.values())).dtype
    rows = nodes if slot in ("x", "m") else edges
    shape = (rows, spec.dim(slot)) + ((channels,) if spec.has_channels(slot) else ())
    return out_aval(shape, dtype, list(avals.values()))


def _batch(call, spec: ConvSpec, values: dict, aux, dims: dict, auxd, outs):
    """vmap over one graph folds the mapped axis into the channel axis (a wider convolution) when
    every edge-sized operand is mapped; otherwise, and for mapped graphs, it runs as a loop.

    Folding copies each unmapped operand once per vmap entry: for node-sized ``x`` or the factored
    ``k`` that is cheap, for an edge-sized one (``s``, a per-channel ``y``) it costs what the wider
    call saves (1.3–2.9x a loop of plain calls, 9–40x its temporaries, on a CPU). A broadcast ``y``
    that is mapped, or whose cotangent is asked for (a sum over the channels, which would mix the
    entries), would have to become per-channel: a loop too.
    """
    if any(d is not None for d in auxd):
        return None
    edge_sized = [k for k in values if slot_of(k) == "s" or (slot_of(k) == "y" and spec.y_channels)]
    y_mapped = any(slot_of(k) == "y" and dims[k] is not None for k in values)
    if any(dims[k] is None for k in edge_sized) or (not spec.y_channels and (y_mapped or "y" in outs)):
        return None
    size = next(v.shape[d] for k, v in values.items() if (d := dims[k]) is not None)
    folded = {}
    for k, v in values.items():
        d = dims[k]
        if not spec.has_channels(slot_of(k)):
            folded[k] = v  # an unmapped broadcast y, or the factored form's h: shared by every entry
            continue
        v = jnp.moveaxis(v, d, 0) if d is not None else jnp.broadcast_to(v[None], (size, *v.shape))
        channels = v.shape[-1]  # [V, R, D, C] -> [R, D, V*C]
        folded[k] = jnp.moveaxis(v, 0, 2).reshape((v.shape[1], v.shape[2], size * channels))
    res = call(spec, folded, aux, outs)
    # channels given, not -1: a vmap over 0 entries (jacrev of an empty graph) has nothing to divide by
    return [jnp.moveaxis(res[j].reshape((*res[j].shape[:2], size, channels)), 2, 0) for j in outs], [0] * len(outs)


CONVOLUTION = Primitives(Multilinear("convolution", SLOTS, _out_aval, _batch))

FACTORED_SLOTS = ("x", "y", "h", "k", "m")


@dataclass(frozen=True)
class FactoredConvSpec(ConvSpec):
    """:class:`ConvSpec` of the factored form: ``h [E, H]`` has no channel axis, ``k`` is ``[H, P, C]``."""

    def has_channels(self, slot: str) -> bool:
        return slot != "h" and super().has_channels(slot)

    def dim(self, slot: str) -> int:
        return self.coo.num_paths if slot == "k" else super().dim(slot)


def _factored_out_aval(spec: FactoredConvSpec, slot: str, avals: dict, aux) -> jax.core.ShapedArray:
    by_slot = {slot_of(k): a for k, a in avals.items()}
    dtype, operands = next(iter(avals.values())).dtype, list(avals.values())
    channels = next(a.shape[-1] for k, a in by_slot.items() if spec.has_channels(k))
    hidden = by_slot["h"].shape[1] if "h" in by_slot else by_slot["k"].shape[0]
    if slot == "k":
        return out_aval((hidden, spec.dim("k"), channels), dtype, operands)
    if slot in ("x", "m"):
        nodes = next(by_slot[k].shape[0] for k in ("x", "m") if k in by_slot)
        return out_aval((nodes, spec.dim(slot), channels), dtype, operands)
    edges = next(by_slot[k].shape[0] for k in ("y", "h") if k in by_slot)
    if slot == "h":
        return out_aval((edges, hidden), dtype, operands)
    return out_aval((edges, spec.dim("y")) + ((channels,) if spec.y_channels else ()), dtype, operands)


def _batch_factored(call, spec: FactoredConvSpec, values: dict, aux, dims: dict, auxd, outs):
    """As :func:`_batch` (vmap folded into the channels) while ``h`` is shared by the vmap entries;
    a mapped ``h``, or its cotangent (a sum over channels, which would mix the entries), falls back
    to a loop."""
    if "h" in outs or any(slot_of(k) == "h" and dims[k] is not None for k in values):
        return None
    return _batch(call, spec, values, aux, dims, auxd, outs)


def _factored_backend(platform: str, requested: str | None, spec: FactoredConvSpec, operands: dict):
    """The backend that runs this call, and its kernels."""
    channels = next(a.shape[-1] for k, a in operands.items() if spec.has_channels(slot_of(k)))
    dtype = jnp.dtype(next(iter(operands.values())).dtype)
    backend = select_backend(OpRequest("convolution", platform, dtype.name, channels, spec.lmax), requested)
    return backend, kernels_of(backend, platform)


def _array_run(spec: FactoredConvSpec, backend, kernels, aux):
    """``run(operands, outs)``: one ``M`` of the array form (slot ``s``) on the backend's
    ``convolution`` kernels, for :func:`multiplied_out`."""
    array_spec = ConvSpec(spec.coo, spec.y_channels, spec.graph_tree)
    graph = jax.tree.unflatten(spec.graph_tree, aux)
    aux_avals = tuple(jax.typeof(a) for a in aux)

    def run(array: dict, array_outs: tuple[str, ...]) -> dict:
        avals = {k: jax.typeof(v) for k, v in array.items()}
        return contract.run(
            "convolution", kernels, backend.name, spec.coo, array, graph, array_outs, y_channels=spec.y_channels,
            result_type=lambda slot: _out_aval(array_spec, slot, avals, aux_avals),
        )  # fmt: skip

    return run


def _tail(spec: FactoredConvSpec, operands: dict) -> tuple[int, int]:
    channels = next(a.shape[-1] for k, a in operands.items() if spec.has_channels(slot_of(k)))
    return spec.coo.num_paths, int(channels)


def _dispatch_factored(form, platform: str, requested: str | None, spec: FactoredConvSpec, A: dict, aux, outs):
    """The ``M`` outputs ``outs`` of the convolution with edge scalars ``h @ k``: the backend's
    ``convolution_factored`` kernels where it has them, else ``s`` multiplied out and its
    ``convolution`` kernels, the cotangents of ``h`` and ``k`` then products with that of ``s``."""
    backend, kernels = _factored_backend(platform, requested, spec, A)
    dtype = jnp.dtype(next(iter(A.values())).dtype)
    if kernels.provides("convolution_factored"):
        graph = jax.tree.unflatten(spec.graph_tree, aux)
        avals = {k: jax.typeof(v) for k, v in A.items()}
        aux_avals = tuple(jax.typeof(a) for a in aux)
        return contract.run(
            "convolution_factored", kernels, backend.name, spec.coo, A, graph, outs, y_channels=spec.y_channels,
            result_type=lambda slot: form.out_aval(spec, slot, avals, aux_avals),
        )  # fmt: skip
    mask = jax.tree.unflatten(spec.graph_tree, aux).edge_mask
    return multiplied_out(A, None, outs, dtype, _tail(spec, A), _array_run(spec, backend, kernels, aux), mask)


def _dispatch_factored_L(form, platform: str, requested: str | None, spec: FactoredConvSpec, Q, T, aux, outs):
    """An ``L`` call on a backend without ``convolution_factored`` kernels, as a whole
    (:func:`multiplied_out`: the scalars multiplied out once, the cotangents of ``h`` and ``k`` from
    the evaluations' summed cotangent of ``s``); ``None`` (one evaluation at a time, each through the
    factored kernels) where it has them."""
    operands = {**Q, **T}
    backend, kernels = _factored_backend(platform, requested, spec, operands)
    if kernels.provides("convolution_factored"):
        return None
    dtype = jnp.dtype(next(iter(operands.values())).dtype)
    mask = jax.tree.unflatten(spec.graph_tree, aux).edge_mask
    return multiplied_out(Q, T, outs, dtype, _tail(spec, operands), _array_run(spec, backend, kernels, aux), mask)


CONVOLUTION_FACTORED = Primitives(
    Multilinear(
        "convolution_factored",
        FACTORED_SLOTS,
        _factored_out_aval,
        _batch_factored,
        _dispatch_factored,
        factored_evaluations,
        _dispatch_factored_L,
    )
)
""":data:`CONVOLUTION` with the edge scalars given as ``h [E, H] @ k [H, P, C]``: the form is
multilinear in ``h`` and ``k`` as it is in ``s``, so every rule carries over."""
