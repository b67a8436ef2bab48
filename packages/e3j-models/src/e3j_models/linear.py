"""Flax wrapper of :class:`e3j.Linear` whose computation goes through the model's ops.

>>> import jax, jax.numpy as jnp
>>> lin = EquivariantLinear("0e + 1o", "2x0e + 1o", channels_out=4)
>>> params = lin.init(jax.random.key(0), jnp.ones((3, 4, 8)))
>>> {k: v.shape for k, v in params["params"].items()}
{'0e': (1, 2, 8, 4), '1o': (1, 1, 8, 4)}
>>> lin.apply(params, jnp.ones((3, 4, 8))).shape
(3, 5, 4)
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

import e3j

from ._checks import check_rank
from .ops import get_ops

__all__ = ["EquivariantLinear"]


class EquivariantLinear(nn.Module):
    """``[B, D_in, C_in] -> [B, D_out, channels_out]``; parameters as :meth:`e3j.Linear.weight_shapes`, by irrep."""

    irreps_in: str
    irreps_out: str
    channels_out: int
    backend: str | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        check_rank("x", x, (3,), "[B, D_in, C_in]")
        shapes = e3j.Linear(
            self.irreps_in, self.irreps_out, channels_in=int(x.shape[-1]), channels_out=self.channels_out
        ).weight_shapes()
        weights = {
            name: self.param(name, nn.initializers.normal(1.0), shape, jnp.float32) for name, shape in shapes.items()
        }
        if not weights:  # no irrep in common: e3j.Linear's zeros
            return jnp.zeros((x.shape[0], e3j.Irreps(self.irreps_out).dim, self.channels_out), x.dtype)
        return get_ops(self.backend).linear(self.irreps_in, self.irreps_out, weights, x)
