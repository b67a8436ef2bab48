"""Per-edge weights given as the radial network's last matrix product: ``hidden @ kernel + bias``.

A convolution on e3nn's flat layout (:class:`e3j.MulIrConvolution`, :mod:`e3j.interop`) runs one
uniform-channel op per group of multiplicities, each reading its weights from ``w [E,
num_weights]``: e3nn orders the weight axis by output irrep first, so each group's columns are
several runs of it. An array is read in place (one primitive for all groups; what that costs
against operands already in the groups' layouts, and what this form costs, is measured in
``docs/porting.md``). The weights of NequIP and
MACE are the output of a radial MLP whose last layer is linear (``output_activation=False``):
``w = hidden @ kernel``. Given in that form, the convolution takes the two factors: the
reference backend computes each chunk of edges' weights inside its sweep from each group's columns
of ``kernel`` (``[H, num_weights]``, a few thousand numbers), the same multiply-adds as ``hidden @
kernel``, and no per-edge array of weights is written (nor kept for the backward: ``hidden`` is);
where the backend has no such kernels (e3j's GPU and TPU backends) the convolution multiplies
them out first and reads the array in place (:mod:`e3j._factored_route`).
:class:`e3j.flax.MultiLayerPerceptron` returns its output in this form.

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

from ._checks import check_array, not_an_array

__all__ = ["FactoredWeights", "check_weights", "take_columns"]


def _is_factor(value) -> bool:
    """An array or a Python number: what ``FactoredWeights`` may be multiplied or divided by."""
    return isinstance(value, (int, float)) or (hasattr(value, "shape") and not isinstance(value, FactoredWeights))


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

    >>> import jax.numpy as jnp, numpy as np, e3j
    >>> conv = e3j.MulIrConvolution("4x0e + 2x1o", "0e + 1o", "0e + 1o")
    >>> graph = e3j.Graph.from_edges(np.array([0, 1]), np.array([1, 0]), num_nodes=2)
    >>> w = e3j.FactoredWeights(jnp.ones((2, 8)), jnp.full((8, conv.num_weights), 0.1))
    >>> w.shape == (2, conv.num_weights)
    True
    >>> m = conv(jnp.ones((2, 10)), jnp.ones((2, 4)), w, graph, backend="reference")
    >>> bool(jnp.allclose(m, conv(jnp.ones((2, 10)), jnp.ones((2, 4)), w.materialize(), graph, backend="reference")))
    True
    """

    hidden: jax.Array
    kernel: jax.Array
    bias: jax.Array | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """``(E, W)``: the shape of the weights (``ValueError`` unless ``hidden`` and ``kernel`` are
        matrices)."""
        hidden, kernel = jnp.shape(self.hidden), jnp.shape(self.kernel)
        if len(hidden) != 2 or len(kernel) != 2:
            raise ValueError(f"FactoredWeights needs hidden [E, H] and kernel [H, W], got shapes {hidden} and {kernel}")
        return (hidden[0], kernel[1])

    @property
    def dtype(self):
        """The dtype ``hidden @ kernel + bias`` has (JAX's promotion of the three)."""
        return jnp.result_type(*(a for a in (self.hidden, self.kernel, self.bias) if a is not None))

    def named_parts(self, name: str) -> dict[str, jax.Array]:
        """The arrays, named as an argument ``name`` holds them for errors: ``{name + ".hidden": hidden,
        name + ".kernel": kernel}``, and ``name + ".bias"`` where there is one."""
        parts = {f"{name}.hidden": self.hidden, f"{name}.kernel": self.kernel, f"{name}.bias": self.bias}
        return {k: v for k, v in parts.items() if v is not None}

    def astype(self, dtype) -> FactoredWeights:
        """``hidden``, ``kernel`` and ``bias`` cast to ``dtype``."""
        bias = None if self.bias is None else self.bias.astype(dtype)
        return FactoredWeights(self.hidden.astype(dtype), self.kernel.astype(dtype), bias)

    def zero_rows(self, where: jax.Array) -> FactoredWeights:
        """The weights with the edges ``where [E]`` or ``[E, 1]`` (bool) set to zero, e.g. zero-length
        edges: ``jnp.where(where[:, None], 0, w)``, applied to ``hidden`` (needs ``bias`` None)."""
        if self.bias is not None:
            raise ValueError("zero_rows needs FactoredWeights without bias (a bias is not per edge)")
        num_edges = jnp.shape(self.hidden)[0]
        if jnp.shape(where) not in ((num_edges,), (num_edges, 1)):
            raise ValueError(f"where must be [E={num_edges}] or [E, 1], got shape {jnp.shape(where)}")
        where = jnp.reshape(where, (num_edges, 1))
        return FactoredWeights(jnp.where(where, jnp.zeros((), self.hidden.dtype), self.hidden), self.kernel)

    def masked(self, edge_mask: jax.Array) -> FactoredWeights:
        """The weights with padding edges' rows of ``hidden`` (``edge_mask [E]`` False) zeroed: such
        rows may hold anything (NaN), and the kernel's cotangent ``hidden^T @ dw`` reads every row,
        where no route reads padding edges' weights."""
        return FactoredWeights(jnp.where(edge_mask[:, None], self.hidden, 0), self.kernel, self.bias)

    def folded(self, edge_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(hidden, kernel)`` with the bias folded in: ``hidden @ kernel + bias == [hidden, 1] @
        [kernel; bias]``, the column of ones being ``edge_mask`` (padding edges' rows stay zero)."""
        if self.bias is None:
            return self.hidden, self.kernel
        ones = jnp.asarray(edge_mask)[:, None].astype(self.hidden.dtype)
        return (
            jnp.concatenate([self.hidden, ones], axis=1),
            jnp.concatenate([self.kernel, self.bias[None, :]], axis=0),
        )

    # numpy defers ``ndarray * FactoredWeights`` to __rmul__ instead of making an object array
    __array_ufunc__ = None

    def __mul__(self, factor) -> FactoredWeights:
        """``w * factor``, still factored, for the factors that keep it so (broadcast as numpy does):

        - a scalar: scales ``kernel`` and ``bias``;
        - per edge, ``[E, 1]`` (an envelope ``env[:, None]``): scales ``hidden`` (needs ``bias`` None);
        - per column, ``[W]`` or ``[1, W]``: scales ``kernel``'s columns and ``bias``.

        Anything else (a full ``[E, W]`` array) would need the per-edge array: ``materialize()`` it.

        >>> w = FactoredWeights(jnp.ones((5, 3)), jnp.ones((3, 4)))
        >>> (w * jnp.arange(5.0)[:, None]).materialize()[:, 0].tolist()
        [0.0, 3.0, 6.0, 9.0, 12.0]
        """
        if not _is_factor(factor):
            return NotImplemented
        (num_edges, num_weights), shape = self.shape, jnp.shape(factor)
        if shape in ((), (1,), (1, 1)):
            factor = jnp.reshape(factor, ())
            return FactoredWeights(self.hidden, self.kernel * factor, None if self.bias is None else self.bias * factor)
        if shape in ((num_weights,), (1, num_weights)):
            factor = jnp.reshape(factor, (num_weights,))
            bias = None if self.bias is None else self.bias * factor
            return FactoredWeights(self.hidden, self.kernel * factor, bias)
        if shape == (num_edges, 1):
            if self.bias is not None:
                raise ValueError("a per-edge factor needs FactoredWeights without bias (a bias is not per edge)")
            return FactoredWeights(self.hidden * factor, self.kernel)
        raise TypeError(
            f"FactoredWeights [E={num_edges}, W={num_weights}] can be multiplied by a scalar, a per-edge [E, 1] "
            f"or a per-column [W] factor, got shape {shape}; for others materialize() the weights first"
        )

    __rmul__ = __mul__

    def __neg__(self) -> FactoredWeights:
        return FactoredWeights(self.hidden, -self.kernel, None if self.bias is None else -self.bias)

    def __truediv__(self, factor) -> FactoredWeights:
        """``w / factor``: ``w * (1 / factor)`` for the factors :meth:`__mul__` takes."""
        if not _is_factor(factor):
            return NotImplemented
        return self * (1 / jnp.asarray(factor))

    def materialize(self) -> jax.Array:
        """The weights ``[E, W]`` (``ValueError`` when the factors' shapes do not chain)."""
        check_weights("weights", self, *self.shape, "the kernel's columns")
        return self.columns(lambda a: a)

    def columns(self, select: Callable[[jax.Array], jax.Array]) -> jax.Array:
        """``select(w)`` for a static selection of the last axis, computed as ``hidden @ select(kernel)``."""
        # the barrier keeps XLA's CPU compiler from fusing the column selection into the matrix
        # product's operand, which made the product ~2 ms slower at [27000, 64] @ [64, 432]
        out = self.hidden @ jax.lax.optimization_barrier(select(self.kernel))
        return out if self.bias is None else out + select(self.bias)


# jax.export serializes a function's argument and result trees by name (no static fields: aux is ())
jax.export.register_pytree_node_serialization(
    FactoredWeights,
    serialized_name="e3j.FactoredWeights",
    serialize_auxdata=lambda aux: b"",
    deserialize_auxdata=lambda data: (),
)


def check_weights(name: str, w, num_edges: int, num_weights: int, layout: str) -> None:
    """Check that ``w`` is ``[num_edges, num_weights]`` weights, an array or :class:`FactoredWeights`
    (``layout`` says their order in the message): ``TypeError`` for another kind of thing, ``ValueError``
    for a wrong shape, each naming ``name``."""
    if isinstance(w, FactoredWeights):
        for part in ("hidden", "kernel", "bias"):
            if part != "bias" or w.bias is not None:
                check_array(f"{name}: FactoredWeights.{part}", getattr(w, part))
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
    elif not_an_array(w):  # check_array's rule, with the expected layout in the message
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
