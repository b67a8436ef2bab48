"""The convolution primitives: ``Φ(x, y, s, m) = Σ_{a→b} Σ_r c_r x_a[i1] y_ab[i2] s_ab[i3] m_b[i0]``.

Slots: ``x [N, Dx, C]`` (senders), ``y [E, Dy]`` or ``[E, Dy, C]`` (edges), ``s [E, P, C]`` (edge
scalars, one per path), ``m [N, Dout, C]`` (receivers). ``contract_m`` is the convolution (paper
Eq. 12–13); ``contract_x``, ``contract_y``, ``contract_s`` are its cotangents (Eq. 16). The graph's
arrays ride along as non-differentiable operands.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp

from .multilinear import CooSpec, Multilinear, Primitives, out_aval, slot_of

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
    """vmap over one graph folds the mapped axis into the channel axis (a wider convolution).

    A broadcast ``y`` stays broadcast unless it is itself mapped or its cotangent is requested (its
    cotangent sums over channels, which must not mix vmap entries). Mapped graphs fall back to a
    sequential loop.
    """
    if any(d is not None for d in auxd):
        return None
    size = next(v.shape[d] for k, v in values.items() if (d := dims[k]) is not None)
    y_mapped = any(slot_of(k) == "y" and dims[k] is not None for k in values)
    promote = not spec.y_channels and (y_mapped or "y" in outs)
    channels = None
    moved = {}
    for k, v in values.items():
        d = dims[k]
        if slot_of(k) == "y" and not spec.y_channels and not promote:
            moved[k] = v  # unmapped broadcast y: untouched
            continue
        v = jnp.moveaxis(v, d, 0) if d is not None else jnp.broadcast_to(v[None], (size, *v.shape))
        moved[k] = v
        if spec.has_channels(slot_of(k)):
            channels = v.shape[-1]
    folded = {}
    for k, v in moved.items():
        if slot_of(k) == "y" and not spec.y_channels:
            if promote:  # [V, E, Dy] -> [E, Dy, V*C]
                v = jnp.broadcast_to(jnp.moveaxis(v, 0, -1)[..., None], (*v.shape[1:], size, channels))
                v = v.reshape((*v.shape[:2], size * channels))
            folded[k] = v
        else:  # [V, R, D, C] -> [R, D, V*C]
            folded[k] = jnp.moveaxis(v, 0, 2).reshape((v.shape[1], v.shape[2], size * v.shape[3]))
    res = call(replace(spec, y_channels=spec.y_channels or promote), folded, aux, outs)
    out = []
    for j in outs:
        r = res[j].reshape((*res[j].shape[:2], size, -1))
        if j == "y" and not spec.y_channels:
            r = r.sum(-1)  # [E, Dy, V]
        out.append(jnp.moveaxis(r, 2, 0))
    return out, [0] * len(outs)


CONVOLUTION = Primitives(Multilinear("convolution", SLOTS, _out_aval, _batch))
