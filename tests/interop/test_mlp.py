"""``e3j.flax.MultiLayerPerceptron`` against ``e3nn_jax.flax.MultiLayerPerceptron``: same parameter tree
(names, shapes, values from one key), same output; ``factored=True`` returns the same numbers as
``hidden @ kernel``. Oracle: e3nn-jax's module."""

from __future__ import annotations

import e3nn_jax as e3nn
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import e3j
import e3j.flax
import e3j.interop

CONFIGS = {
    "silu, linear out": dict(list_neurons=(16, 16, 12), act=jax.nn.silu, output_activation=False),
    "element": dict(list_neurons=(8, 5), act=jax.nn.silu, output_activation=False, gradient_normalization="element"),
    "0.3, bias": dict(
        list_neurons=(8, 5), act=jnp.tanh, output_activation=False, gradient_normalization=0.3, with_bias=True
    ),
    "numpy 0.5": dict(
        list_neurons=(8, 5), act=jnp.tanh, output_activation=False, gradient_normalization=np.float32(0.5)
    ),
    "act out": dict(list_neurons=(8, 5), act=jax.nn.gelu),
    "callable out": dict(list_neurons=(6,), act=jax.nn.silu, output_activation=jnp.tanh),
}


@pytest.mark.parametrize("config", CONFIGS)
def test_same_parameters_and_output_as_e3nn(config):
    kw = CONFIGS[config]
    x = jax.random.normal(jax.random.key(1), (11, 4), jnp.float64)
    want, p_want = e3nn.flax.MultiLayerPerceptron(**kw).init_with_output(jax.random.key(0), x)
    ours = e3j.flax.MultiLayerPerceptron(**kw)
    p = ours.init(jax.random.key(0), x)
    assert jax.tree.structure(p) == jax.tree.structure(p_want)
    jax.tree.map(np.testing.assert_array_equal, p, p_want)
    if kw.get("with_bias"):  # e3nn initializes biases to zero: perturb them so that they count
        p = p_want = jax.tree.map(lambda a: a + 0.1, p_want)
        want = e3nn.flax.MultiLayerPerceptron(**kw).apply(p_want, x)
    got = ours.apply(p, x)
    assert float(jnp.abs(want).max()) > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    if kw.get("output_activation", True) is False:
        factored = e3j.flax.MultiLayerPerceptron(**kw, factored=True).apply(p, x)
        assert isinstance(factored, e3j.FactoredWeights)
        np.testing.assert_allclose(factored.materialize(), want, rtol=1e-12, atol=1e-14)


def test_irreps_array_in_and_out():
    x = e3nn.IrrepsArray("4x0e", jax.random.normal(jax.random.key(1), (3, 4), jnp.float64))
    kw = dict(list_neurons=(8, 3), act=jax.nn.silu)
    want, params = e3nn.flax.MultiLayerPerceptron(**kw).init_with_output(jax.random.key(0), x)
    got = e3j.flax.MultiLayerPerceptron(**kw).apply(params, x)
    assert isinstance(got, e3nn.IrrepsArray) and got.irreps == want.irreps
    np.testing.assert_allclose(got.array, want.array, rtol=1e-12)
    with pytest.raises(ValueError, match="scalars"):
        e3j.flax.MultiLayerPerceptron(**kw).init(jax.random.key(0), e3nn.IrrepsArray("1o", jnp.ones((3, 3))))


def test_bad_configuration_is_named():
    x = jnp.ones((3, 4))
    cases = {
        "output_activation=False": dict(list_neurons=(4,), act=jax.nn.silu, factored=True),
        "gradient_normalization must be": dict(list_neurons=(4,), gradient_normalization="none"),
        "list_neurons must name at least one layer": dict(list_neurons=()),
        "output_activation must be a bool or a callable": dict(list_neurons=(4,), output_activation="relu"),
    }
    for message, kw in cases.items():
        with pytest.raises((ValueError, TypeError), match=message):
            e3j.flax.MultiLayerPerceptron(**kw).init(jax.random.key(0), x)


@pytest.mark.parametrize("factored", [False, True])
def test_features_of_another_width_than_the_parameters_are_named(factored):
    # flax's own error spoke of an initializer and Dense_0's kernel, not of the input
    mlp = e3j.flax.MultiLayerPerceptron((8, 6), jax.nn.silu, output_activation=False, factored=factored)
    params = mlp.init(jax.random.key(0), jnp.ones((5, 3)))
    with pytest.raises(ValueError, match=r"x has 4 features \(last axis\) but the parameters were made for 3 "):
        mlp.apply(params, jnp.ones((5, 4)))
    boxed = jax.tree.map(lambda a: nn.Partitioned(a, (None,) * a.ndim), params)  # metadata boxes read too
    with pytest.raises(ValueError, match=r"made for 3 \(Dense_0's kernel is \(3, 8\)\)"):
        mlp.apply(boxed, jnp.ones((5, 4)))
    assert mlp.apply(params, jnp.ones((5, 3))).shape == (5, 6)


def test_factored_output_needs_one_row_per_edge():
    # FactoredWeights' hidden is [E, H]: a [F] or [B, E, F] input would give factors whose .shape
    # and per-edge products are wrong (a [F] input's "E" was its hidden width)
    mlp = e3j.flax.MultiLayerPerceptron((8, 6), jax.nn.silu, output_activation=False, factored=True)
    params = mlp.init(jax.random.key(0), jnp.ones((5, 3)))
    for x in (jnp.ones(3), jnp.ones((2, 5, 3))):
        with pytest.raises(ValueError, match=r"x must have shape \[E, features\] with factored=True"):
            mlp.apply(params, x)
    dense = e3j.flax.MultiLayerPerceptron((8, 6), jax.nn.silu, output_activation=False)
    assert dense.apply(params, jnp.ones((2, 5, 3))).shape == (2, 5, 6)  # the array form takes [..., F]
    with pytest.raises(ValueError, match=r"hidden \[E, H\] and kernel \[H, W\], got shapes \(8,\) and \(8, 6\)"):
        e3j.FactoredWeights(jnp.ones(8), jnp.ones((8, 6))) * jnp.ones((8, 1))


def test_message_passing_with_factored_weights_equals_e3nn_pattern():
    """The drop-in given the factored MLP output == e3nn-jax's pattern given e3nn's MLP output, value
    and gradient with respect to the MLP's parameters (mixed multiplicities: three groups)."""
    rng = np.random.default_rng(0)
    n, e = 6, 17
    senders, receivers = rng.integers(0, n, e), rng.integers(0, n, e)
    x = e3nn.IrrepsArray("8x0e + 4x1o + 2x2e", jnp.asarray(rng.normal(size=(n, 30))))
    sh = e3nn.spherical_harmonics("0e + 1o + 2e", jnp.asarray(rng.normal(size=(e, 3))), normalize=True)
    radial = jnp.asarray(rng.normal(size=(e, 4)))
    mp = e3j.interop.MessagePassing(x.irreps, sh.irreps, "0e + 1o + 2e", self_connection="0e + 1o")
    kw = dict(list_neurons=(8, mp.num_weights), act=jax.nn.silu, output_activation=False)
    params = e3nn.flax.MultiLayerPerceptron(**kw).init(jax.random.key(0), radial)

    def e3nn_loss(p):
        w = e3nn.flax.MultiLayerPerceptron(**kw).apply(p, radial)
        m = x[senders]
        m = e3nn.concatenate([m.filter("0e + 1o"), e3nn.tensor_product(m, sh, filter_ir_out="0e + 1o + 2e")])
        m = m.regroup() * w
        return jnp.sum(jnp.sin(e3nn.scatter_sum(m, dst=receivers, output_size=n).array))

    def e3j_loss(p):
        w = e3j.flax.MultiLayerPerceptron(**kw, factored=True).apply(p, radial)
        return jnp.sum(jnp.sin(mp(x, sh, w, senders, receivers).array))

    want, g_want = jax.value_and_grad(e3nn_loss)(params)
    got, g_got = jax.jit(jax.value_and_grad(e3j_loss))(params)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want), strict=True):
        assert float(jnp.abs(b).max()) > 1e-6
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12 * float(jnp.abs(b).max()))
