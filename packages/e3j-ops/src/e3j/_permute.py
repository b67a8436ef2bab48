"""A static permutation of the last axis whose transpose is the inverse permutation (private).

``a[..., index]`` with a static ``index`` is a gather, and JAX transposes a gather into a
scatter-add, which XLA's CPU runs element by element; as slices and a concatenation it is a pad
and an add of the whole array per slice. A permutation's transpose is the inverse permutation, a
gather again: this primitive says so, so that a backward costs what the forward does. It is linear
(its derivative is itself), batches along any axis but the permuted one, and lowers to the gather.

>>> import numpy as np, jax, jax.numpy as jnp
>>> p = Permutation(np.array([2, 0, 1]))
>>> permute(jnp.arange(3.0), p).tolist()
[2.0, 0.0, 1.0]
>>> jax.grad(lambda a: jnp.sum(permute(a, p) * jnp.arange(3.0)))(jnp.zeros(3)).tolist()  # the inverse
[1.0, 2.0, 0.0]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

__all__ = ["Permutation", "permute"]


class Permutation:
    """A static permutation of ``range(n)`` (hashable: a primitive's parameter)."""

    def __init__(self, index: np.ndarray) -> None:
        index = np.asarray(index, np.int64)
        if index.ndim != 1 or not np.array_equal(np.sort(index), np.arange(index.size)):
            raise ValueError(f"index must be a permutation of range({index.size})")
        index.setflags(write=False)
        self.index = index
        self._key = index.tobytes()

    @property
    def inverse(self) -> Permutation:
        return Permutation(np.argsort(self.index))

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Permutation) and self._key == other._key

    def __repr__(self) -> str:
        return f"Permutation(n={self.index.size})"


def permute(a: jax.Array, perm: Permutation) -> jax.Array:
    """``a[..., perm.index]``, differentiated as a permutation (see the module doc)."""
    if jnp.shape(a)[-1:] != (perm.index.size,):
        raise ValueError(f"a must be [..., {perm.index.size}], got {jnp.shape(a)}")
    return _permute_p.bind(a, perm=perm)


def _gather(a, *, perm: Permutation):
    return a[..., perm.index]


def _batch(args, dims, *, perm: Permutation):
    (a,), (d,) = args, dims
    if d == a.ndim - 1:  # the batch axis is the permuted one's place: move it in front
        a, d = jnp.moveaxis(a, d, 0), 0
    return permute(a, perm), d


_permute_p = Primitive("e3j_permute")
_permute_p.def_impl(_gather)
_permute_p.def_abstract_eval(lambda a, *, perm: a)  # same shape, dtype and manual axes
ad.deflinear2(_permute_p, lambda ct, a, *, perm: [permute(ct, perm.inverse)])
batching.primitive_batchers[_permute_p] = _batch
mlir.register_lowering(_permute_p, mlir.lower_fun(_gather, multiple_results=False))
