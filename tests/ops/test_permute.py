"""e3j._permute: a static permutation of the last axis, transposed as its inverse."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from e3j._permute import Permutation, permute

INDEX = np.array([3, 0, 4, 1, 2])


def test_values_derivatives_and_batching_equal_the_gather():
    p = Permutation(INDEX)
    a = jax.random.normal(jax.random.key(0), (2, 5))
    w = jax.random.normal(jax.random.key(1), (2, 5))
    np.testing.assert_array_equal(jax.jit(permute, static_argnums=1)(a, p), a[..., INDEX])
    got = jax.grad(lambda a: jnp.sum(permute(a, p) * w))(a)
    np.testing.assert_array_equal(got, jax.grad(lambda a: jnp.sum(a[..., INDEX] * w))(a))
    np.testing.assert_array_equal(jax.jvp(lambda a: permute(a, p), (a,), (w,))[1], w[..., INDEX])
    # mapped over the last axis: the permuted axis is then the one before it
    batched = jax.vmap(lambda r: permute(r, p), in_axes=-1, out_axes=-1)(a.T)
    np.testing.assert_array_equal(batched, a[..., INDEX].T)
    assert "scatter" not in str(jax.make_jaxpr(jax.grad(lambda a: jnp.sum(permute(a, p) * w)))(a))


def test_bad_input():
    with pytest.raises(ValueError, match=r"index must be a permutation of range\(3\)"):
        Permutation(np.array([0, 0, 2]))
    with pytest.raises(ValueError, match=r"a must be \[..., 5\], got \(2, 4\)"):
        permute(jnp.ones((2, 4)), Permutation(INDEX))
    assert Permutation(INDEX) == Permutation(INDEX.copy()) and hash(Permutation(INDEX)) == hash(Permutation(INDEX))
