"""``e3j.FactoredWeights``: weights given as ``hidden @ kernel (+ bias)`` to :class:`e3j.MulIrConvolution`.

Oracle: the same convolution given the materialized weights ``hidden @ kernel + bias`` as an array
(that path is tested against e3nn-jax in ``test_mul_ir.py``); value and gradients, float64.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from installed import require_backend

import e3j
from e3j import FactoredWeights

NODES, EDGES, HIDDEN = 7, 19, 5


def operands(conv, bias: bool):
    rng = np.random.default_rng(0)
    senders, receivers = rng.integers(0, NODES, EDGES), rng.integers(0, NODES, EDGES)
    graph = e3j.Graph.from_edges(senders, receivers, NODES)
    x = jnp.asarray(rng.normal(size=(NODES, conv.irreps_x.dim)))
    y = jnp.asarray(rng.normal(size=(EDGES, conv.irreps_y.dim)))
    w = FactoredWeights(
        jnp.asarray(rng.normal(size=(EDGES, HIDDEN))),
        jnp.asarray(rng.normal(size=(HIDDEN, conv.num_weights))),
        jnp.asarray(rng.normal(size=(conv.num_weights,))) if bias else None,
    )
    return x, y, w, graph


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "irreps_x, irreps_y, filter_, self_connection",
    [
        ("8x0e + 4x1o + 2x2e", "0e + 1o + 2e", "0e + 1o + 2e", None),
        ("4x0e + 4x1o", "1o + 2e", "0e + 1o", "0e + 1o"),  # one group, self connection
    ],
)
def test_factored_equals_materialized_value_and_gradients(irreps_x, irreps_y, filter_, self_connection, bias):
    conv = e3j.MulIrConvolution(irreps_x, irreps_y, filter_, self_connection=self_connection)
    x, y, w, graph = operands(conv, bias)

    def loss_factored(x, y, w):
        return jnp.sum(jnp.sin(conv(x, y, w, graph)))

    def loss_array(x, y, w):
        return jnp.sum(jnp.sin(conv(x, y, w.materialize(), graph)))

    vf, gf = jax.jit(jax.value_and_grad(loss_factored, argnums=(0, 1, 2)))(x, y, w)
    va, ga = jax.jit(jax.value_and_grad(loss_array, argnums=(0, 1, 2)))(x, y, w)
    assert abs(float(va)) > 1e-3
    np.testing.assert_allclose(vf, va, rtol=1e-12)
    for a, b in zip(jax.tree.leaves(gf), jax.tree.leaves(ga), strict=True):
        assert float(jnp.abs(b).max()) > 1e-6  # every factor gets a nonzero gradient
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12 * float(jnp.abs(b).max()))


@pytest.mark.parametrize("backend", ["reference", "test"])
def test_factored_weights_are_never_multiplied_out_where_the_kernels_fuse_them(backend):
    """The reference's factored grouped kernels compute each chunk's weights from ``hidden @
    kernel``: its compiled value and gradient hold no ``[E, num_weights]`` array. A backend without
    them (the test plugin: no grouped kernels) multiplies the weights out once, and gets the same
    values and gradients."""
    require_backend(backend)
    conv = e3j.MulIrConvolution("8x0e + 4x1o + 2x2e", "0e + 1o + 2e", "0e + 1o + 2e")
    x, y, w, graph = operands(conv, False)
    assert conv.num_weights == 48 and EDGES == 19

    def loss(x, y, w, be):
        return jnp.sum(jnp.sin(conv(x, y, w, graph, backend=be)))

    def compiled(be):
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)), static_argnums=3).lower(x, y, w, be).compile()

    per_edge = "[19,48]"
    assert (per_edge in compiled(backend).as_text()) == (backend != "reference")
    got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)), static_argnums=3)(x, y, w, backend)
    want = jax.jit(jax.value_and_grad(lambda *a: loss(*a[:2], a[2].materialize(), backend), argnums=(0, 1, 2)))(x, y, w)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12 * float(jnp.abs(b).max()))


def test_padding_edges_hidden_rows_never_reach_the_gradients():
    """A padding edge's row of ``hidden`` may hold NaN (as padding weights may): value and gradients
    with respect to ``x``, ``hidden`` and ``kernel`` equal those with the row zeroed, and are finite."""
    conv = e3j.MulIrConvolution("4x0e + 2x1o", "0e + 1o", "0e + 1o")
    graph = e3j.Graph.from_edges(np.array([0, 1, 9]), np.array([1, 0, 9]), 2, np.array([True, True, False]))
    rng = np.random.default_rng(5)
    x, y = jnp.asarray(rng.normal(size=(2, conv.irreps_x.dim))), jnp.asarray(rng.normal(size=(3, 4)))
    hidden, kernel = jnp.asarray(rng.normal(size=(3, 3))), jnp.asarray(rng.normal(size=(3, conv.num_weights)))

    def loss(x, h, k):
        return jnp.sum(conv(x, y, FactoredWeights(h, k), graph) ** 2)

    clean = jax.value_and_grad(loss, (0, 1, 2))(x, hidden.at[2].set(0.0), kernel)
    dirty = jax.value_and_grad(loss, (0, 1, 2))(x, hidden.at[2].set(jnp.nan), kernel)
    for a, b in zip(jax.tree.leaves(dirty), jax.tree.leaves(clean)):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)


def test_zero_rows():
    w = FactoredWeights(jnp.ones((4, 2)), jnp.ones((2, 3)))
    got = w.zero_rows(jnp.array([False, True, False, True])).materialize()
    np.testing.assert_array_equal(got, [[2, 2, 2], [0, 0, 0], [2, 2, 2], [0, 0, 0]])
    with pytest.raises(ValueError, match="without bias"):
        FactoredWeights(jnp.ones((4, 2)), jnp.ones((2, 3)), jnp.ones(3)).zero_rows(jnp.ones(4, bool))
    with pytest.raises(ValueError, match=r"where must be \[E=4\] or \[E, 1\]"):
        w.zero_rows(jnp.ones(3, bool))
    np.testing.assert_array_equal(w.zero_rows(jnp.array([[False], [True], [False], [True]])).materialize(), got)


def test_products_stay_factored_and_equal_the_materialized_products():
    """``w * env[:, None]`` (an envelope), ``w * c`` per column or scalar and ``w / c``, each against the
    same product of the materialized array; the factor that would need the per-edge array is refused."""
    rng = np.random.default_rng(3)
    hidden, kernel, bias = (jnp.asarray(rng.normal(size=s)) for s in ((6, 4), (4, 5), (5,)))
    env, col = jnp.asarray(rng.normal(size=(6, 1))), jnp.asarray(rng.normal(size=5))
    plain, biased = FactoredWeights(hidden, kernel), FactoredWeights(hidden, kernel, bias)
    a, b = plain.materialize(), biased.materialize()
    cases = {
        "w * env": (plain * env, a * env),
        "env * w": (env * plain, env * a),
        "numpy env * w": (np.asarray(env) * plain, a * env),
        "w * 2": (plain * 2.0, a * 2.0),
        "2 * biased": (2 * biased, 2 * b),
        "biased * col": (biased * col, b * col),
        "biased * col[None]": (biased * col[None], b * col),
        "w / env": (plain / env, a / env),
        "biased / 3": (biased / 3.0, b / 3.0),
        "-biased": (-biased, -b),
        "-w * env": (-plain * env, -a * env),
    }
    for name, (got, want) in cases.items():
        assert isinstance(got, FactoredWeights), name
        np.testing.assert_allclose(got.materialize(), want, rtol=1e-13, atol=1e-13, err_msg=name)
    with pytest.raises(TypeError, match=r"got shape \(6, 5\); for others materialize\(\)"):
        plain * jnp.ones((6, 5))
    with pytest.raises(TypeError, match=r"got shape \(6,\)"):  # [E] broadcasts on the columns, as in numpy
        plain * jnp.ones(6)
    with pytest.raises(ValueError, match="per-edge factor needs FactoredWeights without bias"):
        biased * env


def test_bad_factored_weights_are_named():
    conv = e3j.MulIrConvolution("8x0e + 4x1o", "0e + 1o", "0e + 1o")
    x, y, w, graph = operands(conv, True)
    bad = {
        r"w: FactoredWeights.hidden must be \[E=19, H\]": FactoredWeights(w.hidden[:-1], w.kernel),
        r"w: FactoredWeights.kernel must be \[H=5, num_weights=24\]": FactoredWeights(w.hidden, w.kernel[:, :-1]),
        r"w: FactoredWeights.bias must be \[24\]": FactoredWeights(w.hidden, w.kernel, w.bias[:-1]),
        r"w must be \[E=19, num_weights=24\] \(one per output copy\) or FactoredWeights": w.materialize()[:, :-1],
    }
    for message, weights in bad.items():
        with pytest.raises(ValueError, match=message):
            conv(x, y, weights, graph)
    with pytest.raises(TypeError, match="one floating dtype"):
        conv(x, y, FactoredWeights(w.hidden.astype(jnp.float32), w.kernel), graph)


def test_materialize_names_factors_that_do_not_chain():
    # hidden [E, 16] @ kernel [8, W] failed inside dot_general, naming neither
    with pytest.raises(ValueError, match=r"FactoredWeights.kernel must be \[H=16, num_weights=5\].*got shape \(8, 5\)"):
        e3j.FactoredWeights(jnp.ones((2, 16)), jnp.ones((8, 5))).materialize()
    with pytest.raises(ValueError, match=r"FactoredWeights.bias must be \[5\] or None, got \(4,\)"):
        e3j.FactoredWeights(jnp.ones((2, 8)), jnp.ones((8, 5)), jnp.ones(4)).materialize()
