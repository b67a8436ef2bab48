"""The one-primitive mixed-multiplicity convolution (array weights read in e3nn's layout, in place).

``e3j.MulIrConvolution`` with an ``[E, num_weights]`` array runs every group of its plan as one
primitive on e3nn's flat layouts. Oracle: the e3nn-jax pattern it stands for, float64, through every
order of differentiation the models use (forces, force training: grad of grad, forward mode), under
``vmap``, with padding edges and with an empty graph; the reference's one-sweep kernels against the
per-group path that a backend without grouped kernels takes. Weights given as
``e3j.FactoredWeights(hidden, kernel)`` run one primitive too (the reference computes them inside
its sweep): against the same pattern on ``hidden @ kernel``.
"""

from __future__ import annotations

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from installed import require_backend
from jaxpr_paths import routes

import e3j

N, E = 6, 19
RNG = np.random.default_rng(11)
SENDERS = RNG.integers(0, N, E)
RECEIVERS = RNG.integers(0, N, E)
GRAPH = e3j.Graph.from_edges(SENDERS, RECEIVERS, N)
IRREPS_X, IRREPS_Y, FILTER, KEEP = "4x0e + 2x1o + 1x2e + 2x1e", "0e + 1o + 2e", "0e + 1o + 2e", "0e + 1o"
CONV = e3j.MulIrConvolution(IRREPS_X, IRREPS_Y, FILTER, self_connection=KEEP)


def e3nn_pattern(x, y, w, senders=SENDERS, receivers=RECEIVERS):
    m = e3nn.IrrepsArray(IRREPS_X, x)[senders]
    tp = e3nn.tensor_product(m, e3nn.IrrepsArray(IRREPS_Y, y), filter_ir_out=FILTER)
    m = e3nn.concatenate([m.filter(KEEP), tp]).regroup()
    return e3nn.scatter_sum(m * w, dst=receivers, output_size=N).array


def operands(seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(k[0], (N, e3nn.Irreps(IRREPS_X).dim), jnp.float64)
    y = jax.random.normal(k[1], (E, e3nn.Irreps(IRREPS_Y).dim), jnp.float64)
    w = jax.random.normal(k[2], (E, CONV.num_weights), jnp.float64)
    return x, y, w


def primitives(f, *args):
    return [e.primitive.name for e in jax.make_jaxpr(f)(*args).eqns]


def test_array_weights_run_one_primitive_without_a_copy_into_the_groups():
    x, y, w = operands()
    assert len(CONV.groups) == 3 and CONV.plan.in_place
    names = primitives(lambda a, b, c: CONV(a, b, c, GRAPH), x, y, w)
    assert names.count("e3j_grouped_convolution") == 1 and "e3j_convolution" not in names
    # the weights reach the primitive as they are: no op outside it makes a group's [E, P_g, C_g]
    jaxpr = jax.make_jaxpr(lambda a, b, c: CONV(a, b, c, GRAPH))(x, y, w)
    shapes = {tuple(v.aval.shape) for e in jaxpr.eqns for v in e.outvars}
    assert not shapes & {(E, g.coo.num_paths, g.channels) for g in CONV.plan.groups}


# Pallas GPU's grouped kernels through the ops: the slow session (~60 s in the interpreter; the tests
# session checks those kernels against the reference's, tests/pallas_gpu, and the ops' derivatives here
# on the reference's grouped kernels)
@pytest.mark.parametrize("backend", ["reference", "test", pytest.param("pallas_gpu_interpret", marks=pytest.mark.slow)])
def test_value_gradients_and_second_order_equal_e3nn(backend):
    """``test`` (reference kernels without the grouped ones) runs the groups one by one through the
    ordinary kernels; the reference's grouped kernels run them in one sweep, the Pallas GPU ones one
    launch per group on the weights in place: every order of derivative equals e3nn-jax."""
    require_backend(backend)
    x, y, w = operands(1)
    cot = jax.random.normal(jax.random.key(5), (N, CONV.irreps_out.dim), jnp.float64)
    v = jax.random.normal(jax.random.key(6), x.shape, jnp.float64)

    def ours(a, b, c):
        return jnp.sum(jnp.tanh(CONV(a, b, c, GRAPH, backend=backend)) * cot)

    def ref(a, b, c):
        return jnp.sum(jnp.tanh(e3nn_pattern(a, b, c)) * cot)

    np.testing.assert_allclose(jax.jit(lambda *a: CONV(*a, GRAPH, backend=backend))(x, y, w),
                               e3nn_pattern(x, y, w), rtol=1e-12, atol=1e-12)  # fmt: skip
    for f in (
        lambda loss: jax.value_and_grad(loss, argnums=(0, 1, 2)),
        # forces, then a loss on them differentiated with respect to everything (force training)
        lambda loss: jax.grad(lambda a, b, c: jnp.sum(jax.grad(loss)(a, b, c) * v), argnums=(0, 1, 2)),
        # forward mode
        lambda loss: lambda a, b, c: jax.jvp(loss, (a, b, c), (v, jnp.sin(b), jnp.cos(c))),
    ):
        got, want = jax.jit(f(ours))(x, y, w), jax.jit(f(ref))(x, y, w)
        for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-12)


def test_the_per_group_path_is_what_a_backend_without_grouped_kernels_runs():
    from e3j_test_backend import calls

    x, y, w = operands(2)
    calls.clear()
    jax.jit(jax.grad(lambda c: jnp.sum(CONV(x, y, c, GRAPH, backend="test") ** 2)))(w)
    # three groups, each a forward and a backward of the ordinary convolution kernels
    assert calls.count("convolution") == 3 and calls.count("convolution_bwd") == 3


@pytest.mark.parametrize("backend", ["reference", "test"])
def test_vmap_padding_edges_and_empty_graph(backend):
    x, y, w = operands(3)
    xs = jnp.stack([x, 2 * x, -x])
    got = jax.vmap(lambda a: CONV(a, y, w, GRAPH, backend=backend))(xs)
    np.testing.assert_allclose(got, jnp.stack([e3nn_pattern(a, y, w) for a in xs]), rtol=1e-12, atol=1e-12)
    # padding edges (mask False, indices out of range) contribute nothing, and get zero cotangents
    pad = 5
    mask = np.arange(E + pad) < E
    padded = e3j.Graph.from_edges(np.r_[SENDERS, [N] * pad], np.r_[RECEIVERS, [N] * pad], N, edge_mask=mask)
    yp = jnp.concatenate([y, jnp.full((pad, y.shape[1]), jnp.nan)])
    wp = jnp.concatenate([w, jnp.full((pad, w.shape[1]), jnp.nan)])
    np.testing.assert_allclose(CONV(x, yp, wp, padded, backend=backend), e3nn_pattern(x, y, w), rtol=1e-12, atol=1e-12)
    dy, dw = jax.grad(lambda b, c: jnp.sum(CONV(x, b, c, padded, backend=backend)), argnums=(0, 1))(yp, wp)
    assert not np.any(dy[E:]) and not np.any(dw[E:]) and np.all(np.isfinite(dw[:E]))
    # no edges: zeros, and zero gradients
    empty = e3j.Graph.from_edges(np.zeros(0, int), np.zeros(0, int), N)
    y0, w0 = jnp.zeros((0, y.shape[1])), jnp.zeros((0, w.shape[1]))
    assert not np.any(CONV(x, y0, w0, empty, backend=backend))
    assert not np.any(jax.grad(lambda a: jnp.sum(CONV(a, y0, w0, empty, backend=backend)))(x))


def test_grouped_kernels_come_in_pairs():
    ref = e3j.backends.kernels_of(e3j.backends.get_backend("reference"))
    assert ref.provides("grouped_convolution")
    with pytest.raises(ValueError, match="given together"):
        e3j.Kernels(grouped_convolution=ref.grouped_convolution)


def factors(seed, hidden=4):
    """Weights as ``hidden [E, H] @ kernel [H, num_weights]`` (e3nn's columns)."""
    k = jax.random.split(jax.random.key(100 + seed), 2)
    h = jax.random.normal(k[0], (E, hidden), jnp.float64)
    return h, jax.random.normal(k[1], (hidden, CONV.num_weights), jnp.float64) / 2


def test_factored_weights_run_one_primitive(fused_on_cpu_only):
    x, y, _ = operands(0)
    h, k = factors(0)
    by_platform = routes(lambda a, b, c, d: CONV(a, b, e3j.FactoredWeights(c, d), GRAPH), x, y, h, k)
    cpu, gpu = by_platform["cpu"], by_platform["cuda"]
    assert cpu.count("e3j_grouped_convolution_factored") == 1 and "dot_general" not in cpu
    # no factored kernels on the GPU: multiplied out once before the array primitive
    assert gpu.count("e3j_grouped_convolution") == 1 and "dot_general" in gpu and by_platform["tpu"] == gpu


@pytest.mark.parametrize("backend", ["reference", "test", pytest.param("pallas_gpu_interpret", marks=pytest.mark.slow)])
def test_factored_weights_value_gradients_and_second_order_equal_e3nn(backend):
    """Weights as ``FactoredWeights(hidden, kernel)``: the reference computes them chunk by chunk
    inside its sweep (its factored grouped kernels), other backends multiply them out first; every
    order of derivative, with respect to ``hidden`` and ``kernel`` too, equals e3nn-jax's pattern on
    ``hidden @ kernel``."""
    require_backend(backend)
    x, y, _ = operands(4)
    h, k = factors(4)
    cot = jax.random.normal(jax.random.key(7), (N, CONV.irreps_out.dim), jnp.float64)
    v = jax.random.normal(jax.random.key(8), x.shape, jnp.float64)

    def ours(a, b, c, d):
        return jnp.sum(jnp.tanh(CONV(a, b, e3j.FactoredWeights(c, d), GRAPH, backend=backend)) * cot)

    def ref(a, b, c, d):
        return jnp.sum(jnp.tanh(e3nn_pattern(a, b, c @ d)) * cot)

    args = (x, y, h, k)
    for f in (
        lambda loss: jax.value_and_grad(loss, argnums=(0, 1, 2, 3)),
        # forces, then a loss on them differentiated with respect to everything (force training)
        lambda loss: jax.grad(lambda *a: jnp.sum(jax.grad(loss)(*a) * v), argnums=(0, 1, 2, 3)),
        # forward mode
        lambda loss: lambda *a: jax.jvp(loss, a, (v, jnp.sin(a[1]), jnp.cos(a[2]), a[3] ** 2)),
    ):
        got, want = jax.jit(f(ours))(*args), jax.jit(f(ref))(*args)
        for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert float(jnp.abs(r).max()) > 1e-6
            np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-12 * float(jnp.abs(r).max()))


@pytest.mark.parametrize("backend", ["reference", "test"])
def test_factored_weights_vmap_padding_edges_and_empty_graph(backend):
    x, y, _ = operands(5)
    h, k = factors(5)
    w = e3j.FactoredWeights(h, k)
    xs = jnp.stack([x, 2 * x, -x])
    got = jax.vmap(lambda a: CONV(a, y, w, GRAPH, backend=backend))(xs)
    np.testing.assert_allclose(got, jnp.stack([e3nn_pattern(a, y, h @ k) for a in xs]), rtol=1e-12, atol=1e-12)
    # padding edges with non-finite hidden rows contribute nothing and get zero cotangents; the
    # kernel's gradient stays finite
    pad = 5
    mask = np.arange(E + pad) < E
    padded = e3j.Graph.from_edges(np.r_[SENDERS, [N] * pad], np.r_[RECEIVERS, [N] * pad], N, edge_mask=mask)
    yp = jnp.concatenate([y, jnp.full((pad, y.shape[1]), jnp.nan)])
    hp = jnp.concatenate([h, jnp.full((pad, h.shape[1]), jnp.nan)])
    np.testing.assert_allclose(
        CONV(x, yp, e3j.FactoredWeights(hp, k), padded, backend=backend), e3nn_pattern(x, y, h @ k), rtol=1e-12
    )

    def loss(b, c, d):
        return jnp.sum(CONV(x, b, e3j.FactoredWeights(c, d), padded, backend=backend))

    dy, dh, dk = jax.grad(loss, argnums=(0, 1, 2))(yp, hp, k)
    assert not np.any(dy[E:]) and not np.any(dh[E:]) and np.all(np.isfinite(dh)) and np.all(np.isfinite(dk))
    ref = jax.grad(lambda c, d: jnp.sum(e3nn_pattern(x, y, c @ d)), argnums=(0, 1))(h, k)
    np.testing.assert_allclose(dh[:E], ref[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dk, ref[1], rtol=1e-10, atol=1e-12)
    # no edges: zeros, and zero gradients
    empty = e3j.Graph.from_edges(np.zeros(0, int), np.zeros(0, int), N)
    y0, h0 = jnp.zeros((0, y.shape[1])), jnp.zeros((0, h.shape[1]))
    assert not np.any(CONV(x, y0, e3j.FactoredWeights(h0, k), empty, backend=backend))
    grads = jax.grad(lambda a, d: jnp.sum(CONV(a, y0, e3j.FactoredWeights(h0, d), empty, backend=backend)), (0, 1))(
        x, k
    )
    assert not any(np.any(g) for g in grads)


def test_factored_kernels_come_in_pairs():
    ref = e3j.backends.kernels_of(e3j.backends.get_backend("reference"))
    assert ref.provides("grouped_convolution_factored")
    with pytest.raises(ValueError, match="grouped_convolution_factored and grouped_convolution_factored_bwd"):
        e3j.Kernels(grouped_convolution_factored=ref.grouped_convolution_factored)


@pytest.mark.parametrize("backend", ["reference", "test"])
def test_factored_weights_linear_transposes(backend):
    """``jax.linear_transpose`` with respect to one operand at a time (each output slot computed
    from the other operands alone), against the array of the same weights."""
    require_backend(backend)
    x, y, _ = operands(6)
    h, k = factors(6)
    g = jax.random.normal(jax.random.key(9), (N, CONV.irreps_out.dim), jnp.float64)
    fw = e3j.FactoredWeights

    def ours(a, b, c, d):
        return CONV(a, b, fw(c, d), GRAPH, backend=backend)

    cases = {
        "x": (lambda a: ours(a, y, h, k), lambda a: e3nn_pattern(a, y, h @ k), x),
        "y": (lambda b: ours(x, b, h, k), lambda b: e3nn_pattern(x, b, h @ k), y),
        "h": (lambda c: ours(x, y, c, k), lambda c: e3nn_pattern(x, y, c @ k), h),
        "k": (lambda d: ours(x, y, h, d), lambda d: e3nn_pattern(x, y, h @ d), k),
    }
    for name, (fn, ref, primal) in cases.items():
        (got,) = jax.linear_transpose(fn, primal)(g)
        (want,) = jax.linear_transpose(ref, primal)(g)
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12, err_msg=name)


def test_one_evaluation_may_ask_for_the_forward_and_a_cotangent():
    """An ``M`` evaluation of the grouped form with outputs ``m`` and ``x`` (an ``L`` call's, e.g.
    a tangent of ``y`` with both requested) runs the forward and the backward kernels, each checked
    against its own outputs only; each output equals the one asked for alone."""
    from e3j._primitives.grouped_convolution import GROUPED_CONVOLUTION, GroupedConvSpec

    x, y, w = operands(5)
    plan = CONV.plan
    y1 = jnp.concatenate([jnp.ones((E, 1)), y], axis=1) if plan.constant_row else y
    dm = jax.random.normal(jax.random.key(6), (N, plan.irreps_out.dim), jnp.float64)
    leaves, tree = jax.tree.flatten(GRAPH)
    spec = GroupedConvSpec(plan, graph_tree=tree)
    Q = {"x": x, "y": y1, "s": w, "m": dm}
    both = GROUPED_CONVOLUTION.bind_M(spec, Q, leaves, ("m", "x"), "reference")
    for j in ("m", "x"):
        alone = GROUPED_CONVOLUTION.bind_M(spec, Q, leaves, (j,), "reference")[j]
        assert float(jnp.abs(alone).max()) > 1e-3
        np.testing.assert_array_equal(both[j], alone)
