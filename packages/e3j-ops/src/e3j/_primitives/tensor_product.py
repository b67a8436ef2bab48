"""The tensor-product primitives: ``Φ(x, y, z) = Σ_r c_r x[i1] y[i2] z[i0]`` per batch row and channel.

Slots: ``x [B, Dx, C]``, ``y [B, Dy]`` (broadcast over channels) or ``[B, Dy, C]``, ``z [B, Dout, C]``.
``contract_z`` is the forward tensor product, ``contract_x``/``contract_y`` the cotangents.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from .multilinear import CooSpec, Multilinear, Primitives, out_aval, slot_of

SLOTS = ("x", "y", "z")


@dataclass(frozen=True)
class TPSpec(CooSpec):
    """Static description of one tensor-product call."""

    def dim(self, slot: str) -> int:
        return {"x": self.coo.dim_x, "y": self.coo.dim_y, "z": self.coo.dim_out}[slot]


def _out_aval(spec: TPSpec, slot: str, avals: dict, aux) -> jax.core.ShapedArray:
    batch = next(iter(avals.values())).shape[0]
    channels = next(a.shape[-1] for k, a in avals.items() if spec.has_channels(slot_of(k)))
    dtype = next(iter(avals.values())).dtype
    shape = (batch, spec.dim(slot)) + ((channels,) if spec.has_channels(slot) else ())
    return out_aval(shape, dtype, list(avals.values()))


def _batch(call, spec: TPSpec, values: dict, aux, dims: dict, auxd, outs):
    """vmap folds the mapped axis into the batch axis ``B`` (every slot shares ``B``)."""
    size = next(v.shape[d] for k, v in values.items() if (d := dims[k]) is not None)
    folded = {}
    for k, v in values.items():
        d = dims[k]
        v = jnp.moveaxis(v, d, 0) if d is not None else jnp.broadcast_to(v[None], (size, *v.shape))
        batch = v.shape[1]
        folded[k] = v.reshape((size * batch, *v.shape[2:]))
    res = call(spec, folded, aux, outs)
    # sizes given, not -1: a vmap over 0 entries (jacfwd of an empty batch) has nothing to divide by
    return [res[j].reshape((size, batch, *res[j].shape[1:])) for j in outs], [0] * len(outs)


TENSOR_PRODUCT = Primitives(Multilinear("tensor_product", SLOTS, _out_aval, _batch))
