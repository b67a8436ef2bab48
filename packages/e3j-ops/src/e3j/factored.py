"""Per-edge weights given as the radial network's last matrix product: ``hidden @ kernel + bias``.

A convolution on e3nn's flat layout (:class:`e3j.MulIrConvolution`, :mod:`e3j.interop`) runs one
uniform-channel op per group of multiplicities, each reading its weights from ``w [E,
num_weights]``: e3nn orders the weight axis by output irrep first, so each group's columns are
several runs of it. An array is read in place (one primitive for all groups; what that costs
against operands already in the groups' layouts, and what this form costs, is measured in
``docs/porting.md``). The weights of NequIP and
MACE are the output of a radial MLP whose last layer is linear (``output_activation=False``):
``w = hidden @ kernel``. Given in that form, the rearrangement is applied to the columns of
``kernel`` (``[H, num_weights]``, a few thousand numbers) and each group gets its weights from its
own matrix product ``hidden @ kernel[:, columns_g]``: the same multiply-adds as ``hidden @ kernel``,
and the per-edge array never exists. :class:`e3j.flax.MultiLayerPerceptron` returns its output in
this form.

>>> import jax.numpy as jnp
>>> w = FactoredWeights(jnp.ones((5, 3)), jnp.ones((3, 4)))
>>> w.shape, w.materialize()[0].tolist()
((5, 4), [3.0, 3.0, 3.0, 3.0])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

__all__ = ["FactoredWeights", "check_weights", "take_columns"]


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class FactoredWeights:
    """Weights ``w = hidden @ kernel (+ bias)`` kept as their factors.

    ``hidden: [E, H]`` (one row per edge: the radial network's last hidden layer, already scaled),
    ``kernel: [H, W]`` (its last linear layer, columns in the weights' order, e.g. e3nn's),
    ``bias: [W]`` or ``None``. Accepted wherever an e3nn-ordered ``weights [E, W]`` array is
    (:class:`e3j.MulIrConvolution`, :class:`e3j.interop.MessagePassing`,
    :class:`e3j.interop.FunctionalMessagePassing`), which check the shapes; :meth:`materialize`
    gives the array. A pytree: passes through ``jit``, ``grad`` and ``vmap`` as its arrays.
    """

    hidden: jax.Array
    kernel: jax.Array
    bias: jax.Array | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """``(E, W)``: the shape of the weights."""
        return (jnp.shape(self.hidden)[0], jnp.shape(self.kernel)[1])

    @property
    def dtype(self):
        return jnp.result_type(*(a for a in (self.hidden, self.kernel, self.bias) if a is not None))

    def astype(self, dtype) -> FactoredWeights:
        bias = None if self.bias is None else self.bias.astype(dtype)
        return FactoredWeights(self.hidden.astype(dtype), self.kernel.astype(dtype), bias)

    def zero_rows(self, where: jax.Array) -> FactoredWeights:
        """The weights with the edges ``where [E]`` (bool) set to zero, e.g. zero-length edges:
        ``jnp.where(where[:, None], 0, w)``, applied to ``hidden`` (needs ``bias`` None)."""
        if self.bias is not None:
            raise ValueError("zero_rows needs FactoredWeights without bias (a bias is not per edge)")
        if jnp.shape(where) != (jnp.shape(self.hidden)[0],):
            raise ValueError(f"where must be [E={jnp.shape(self.hidden)[0]}], got shape {jnp.shape(where)}")
        return FactoredWeights(jnp.where(where[:, None], jnp.zeros((), self.hidden.dtype), self.hidden), self.kernel)

    def materialize(self) -> jax.Array:
        """The weights ``[E, W]``."""
        return self.columns(lambda a: a)

    def columns(self, select: Callable[[jax.Array], jax.Array]) -> jax.Array:
        """``select(w)`` for a static selection of the last axis, computed as ``hidden @ select(kernel)``."""
        # the barrier keeps XLA's CPU compiler from fusing the column selection into the matrix
        # product's operand, which made the product ~2 ms slower at [27000, 64] @ [64, 432]
        out = self.hidden @ jax.lax.optimization_barrier(select(self.kernel))
        return out if self.bias is None else out + select(self.bias)


def check_weights(name: str, w, num_edges: int, num_weights: int, layout: str) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``w`` is ``[num_edges, num_weights]`` weights: an array
    or :class:`FactoredWeights` (``layout`` says their order in the message)."""
    if isinstance(w, FactoredWeights):
        h, k = jnp.shape(w.hidden), jnp.shape(w.kernel)
        if len(h) != 2 or h[0] != num_edges:
            raise ValueError(f"{name}: FactoredWeights.hidden must be [E={num_edges}, H], got shape {h}")
        if k != (h[1], num_weights):
            raise ValueError(
                f"{name}: FactoredWeights.kernel must be [H={h[1]}, num_weights={num_weights}] ({layout}), "
                f"got shape {k}"
            )
        if w.bias is not None and jnp.shape(w.bias) != (num_weights,):
            raise ValueError(f"{name}: FactoredWeights.bias must be [{num_weights}] or None, got {jnp.shape(w.bias)}")
    elif w is None or isinstance(w, (list, tuple)):
        raise TypeError(f"{name} must be an array [E={num_edges}, num_weights={num_weights}] or FactoredWeights, "
                        f"got {type(w).__name__}")  # fmt: skip
    elif jnp.ndim(w) != 2 or jnp.shape(w) != (num_edges, num_weights):
        raise ValueError(
            f"{name} must be [E={num_edges}, num_weights={num_weights}] ({layout}) or FactoredWeights, "
            f"got shape {jnp.shape(w)}"
        )


def take_columns(w: jax.Array | FactoredWeights, select: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """``select(w)`` (a static selection of the last axis) for an array or :class:`FactoredWeights`."""
    return w.columns(select) if isinstance(w, FactoredWeights) else select(w)
