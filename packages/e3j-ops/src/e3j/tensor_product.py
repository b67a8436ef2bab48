"""The Clebsch–Gordan tensor product as a differentiable JAX operation."""

from __future__ import annotations

import jax

from ._checks import check_rank, check_same_dtype
from ._coo_op import CooOp
from ._primitives.tensor_product import TENSOR_PRODUCT, TPSpec
from .backends import current_backend_request

__all__ = ["TensorProduct"]


class TensorProduct(CooOp):
    """Channel-wise tensor product ``x ⊗ y`` of irreps features, equal to e3nn-jax's.

    ``tp = TensorProduct(irreps_x, irreps_y, filter)``; ``tp(x, y)`` with ``x: [B, Dx, C]`` and
    ``y: [B, Dy, C]`` or ``[B, Dy]`` (broadcast over channels) returns ``[B, Dout, C]``. For every
    channel ``c`` the result equals
    ``e3nn_jax.tensor_product(IrrepsArray(irreps_x, x[..., c]), IrrepsArray(irreps_y, y[..., c]),
    filter_ir_out=filter).array``: same output irreps (``tp.irreps_out``), same rows. Path ``p`` (one
    ``2l+1`` block, never merged with another) occupies rows ``tp.path_slices[p]``.

    Differentiable to any order in forward and reverse mode, batchable with ``vmap``; the kernel is
    chosen per platform when the call is lowered (``backend=`` or :func:`e3j.use_backend` to force
    one).

    >>> import jax.numpy as jnp
    >>> tp = TensorProduct("0e + 1o", "1o", filter="0e + 1o + 1e")
    >>> tp.irreps_out, tp.num_paths
    (1x0e+1x1o+1x1e, 3)
    >>> tp(jnp.ones((2, 4, 8)), jnp.ones((2, 3))).shape
    (2, 7, 8)
    """

    def __call__(self, x: jax.Array, y: jax.Array, *, backend: str | None = None) -> jax.Array:
        coo = self.coo
        check_rank("x", x, (3,), f"[B, Dx={coo.dim_x}, C]")
        check_rank("y", y, (2, 3), f"[B, Dy={coo.dim_y}] or [B, Dy, C]")
        check_same_dtype(x=x, y=y)
        if x.shape[1] != coo.dim_x:
            raise ValueError(f"x has {x.shape[1]} rows but irreps_x {coo.irreps_x} has dimension {coo.dim_x}")
        if y.shape[1] != coo.dim_y:
            raise ValueError(f"y has {y.shape[1]} rows but irreps_y {coo.irreps_y} has dimension {coo.dim_y}")
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"x and y must share the batch size, got {x.shape[0]} and {y.shape[0]}")
        if y.ndim == 3 and y.shape[2] != x.shape[2]:
            raise ValueError(f"x has {x.shape[2]} channels but y has {y.shape[2]}")
        spec = TPSpec(coo, y_channels=y.ndim == 3)
        out = TENSOR_PRODUCT.bind_M(spec, {"x": x, "y": y}, (), ("z",), current_backend_request(backend))
        return out["z"]
