"""``e3j.MulIrConvolution`` / ``e3j.MulIrTensorProduct`` (flat features, mixed multiplicities) against e3nn-jax.

Oracle: the e3nn-jax code the classes stand for (gather -> concatenate(filter, tensor_product)
.regroup() -> * weights -> scatter_sum, and ``e3nn.tensor_product``), float64, values and
gradients, on the reference backend and on interpreted kernels (CUDA host build, Pallas GPU).
"""

from __future__ import annotations

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from installed import require_backend

import e3j

N, E = 7, 23
RNG = np.random.default_rng(3)
SENDERS = RNG.integers(0, N, E)
RECEIVERS = RNG.integers(0, N, E)
GRAPH = e3j.Graph.from_edges(SENDERS, RECEIVERS, N)


def e3nn_pattern(x, y, w, filter_, self_connection):
    m = x[SENDERS]
    tp = e3nn.tensor_product(m, y, filter_ir_out=filter_)
    m = tp if self_connection is None else e3nn.concatenate([m.filter(self_connection), tp]).regroup()
    return e3nn.scatter_sum(m * w, dst=RECEIVERS, output_size=N).array


def random(shape, seed):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float64)


# (irreps_x, irreps_y, filter, self_connection): mixed multiplicities, unsorted blocks, a repeated
# multiplicity across irreps, a zero block
CONV_CASES = [
    ("8x0e + 4x1o + 2x2e", "0e + 1o + 2e", "0e + 1o + 2e", "0e + 1o + 2e"),
    ("8x0e + 4x1o + 2x2e", "0e + 1o + 2e", None, None),
    ("2x1o + 6x0e + 4x2e + 2x1e + 0x3o", "1o + 2e", "0e + 1o", "1o"),
]
# every case on the reference backend; the NequIP-like case on the CUDA kernels' host build
CONV_RUNS = [(c, "reference") for c in CONV_CASES] + [(CONV_CASES[0], "cuda_host")]


@pytest.mark.parametrize("case, backend", CONV_RUNS)
def test_convolution_equals_e3nn_value_and_gradient(case, backend):
    irreps_x, irreps_y, filter_, self_connection = case
    require_backend(backend)
    conv = e3j.MulIrConvolution(irreps_x, irreps_y, filter_, self_connection=self_connection)
    ix, iy = e3nn.Irreps(irreps_x), e3nn.Irreps(irreps_y)
    x, y, w = random((N, ix.dim), 0), random((E, iy.dim), 1), random((E, conv.num_weights), 2)
    cot = random((N, conv.irreps_out.dim), 3)

    def ours(a, b, c):
        return jnp.sum(conv(a, b, c, GRAPH, backend=backend) * cot)

    def ref(a, b, c):
        out = e3nn_pattern(e3nn.IrrepsArray(ix, a), e3nn.IrrepsArray(iy, b), c, filter_, self_connection)
        return jnp.sum(out * cot)

    ref_out = e3nn_pattern(e3nn.IrrepsArray(ix, x), e3nn.IrrepsArray(iy, y), w, filter_, self_connection)
    assert str(conv.irreps_out) == str(_irreps_of(ix, iy, filter_, self_connection))
    np.testing.assert_allclose(jax.jit(conv)(x, y, w, GRAPH), ref_out, rtol=1e-12, atol=1e-12)
    got = jax.jit(jax.value_and_grad(ours, argnums=(0, 1, 2)))(x, y, w)
    want = jax.jit(jax.value_and_grad(ref, argnums=(0, 1, 2)))(x, y, w)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    for g, r in zip(got[1], want[1]):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)
    # each multiplicity is its own convolution: no gcd copies, no run-time gather
    assert sorted(c for c, _ in conv.groups) == sorted({m for m, _ in ix if m > 0})
    assert not conv.plan.gathers


@pytest.mark.parametrize("normalization", ["component", "norm", "none"])
def test_self_connection_is_the_unscaled_copy_under_every_normalization(normalization):
    """e3nn's filtered copy of ``x`` is not a product: under ``"none"``, whose ``l ⊗ 0 -> l`` block
    is ``1/sqrt(2l+1)``, the plan's factor per output row restores it. Array, factored and per-group
    weights; values and gradients."""
    ix, iy, filter_ = e3nn.Irreps("8x0e + 4x1o + 2x2e + 2x3o"), e3nn.Irreps("1o + 2e"), "0e + 1o + 2e + 3o"
    conv = e3j.MulIrConvolution(ix, iy, filter_, self_connection=filter_, normalization=normalization)
    x, y = random((N, ix.dim), 20), random((E, iy.dim), 21)
    hidden, kernel = random((E, 5), 22), random((5, conv.num_weights), 23)
    cot = random((N, conv.irreps_out.dim), 24)

    def ref(a, b, h, k):
        m = e3nn.IrrepsArray(ix, a)[SENDERS]
        tp = e3nn.tensor_product(m, e3nn.IrrepsArray(iy, b), filter_ir_out=filter_, irrep_normalization=normalization)
        m = e3nn.concatenate([m.filter(filter_), tp]).regroup()
        return jnp.sum(e3nn.scatter_sum(m * (h @ k), dst=RECEIVERS, output_size=N).array * cot)

    routes = {
        "array": lambda a, b, h, k: conv(a, b, h @ k, GRAPH),
        "factored": lambda a, b, h, k: conv(a, b, e3j.FactoredWeights(h, k), GRAPH),
        "grouped": lambda a, b, h, k: conv.join_out(conv.grouped(conv.split_x(a), b, conv.split_weights(h @ k), GRAPH)),
    }
    want = jax.jit(jax.value_and_grad(ref, argnums=(0, 1, 2, 3)))(x, y, hidden, kernel)
    for name, route in routes.items():
        got = jax.jit(jax.value_and_grad(lambda *a, route=route: jnp.sum(route(*a) * cot), argnums=(0, 1, 2, 3)))(
            x, y, hidden, kernel
        )
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12, err_msg=name)
        for g, r in zip(got[1], want[1]):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12, err_msg=name)
    # the factor is there only where the product is not the copy: "none", copies with l > 0
    assert (conv.plan.self_scale is None) == (normalization != "none")
    if normalization == "none":
        assert sorted(set(np.round(conv.plan.self_scale**2).astype(int))) == [1, 3, 5, 7]
    scalars = e3j.MulIrConvolution(ix, iy, filter_, self_connection="0e", normalization=normalization)
    assert scalars.plan.self_scale is None and all(g.out_scale is None for g in scalars.plan.groups)


def _irreps_of(ix, iy, filter_, self_connection):
    tp = e3nn.tensor_product(ix, iy, filter_ir_out=filter_)
    if self_connection is None:
        return tp
    return e3nn.Irreps(ix.filter(self_connection) + tp).regroup()


def test_nequip_sizes_run_one_convolution_per_multiplicity():
    sh = e3nn.Irreps.spherical_harmonics(3)
    conv = e3j.MulIrConvolution("64x0e + 32x1o + 16x2e", sh, "0e + 1o + 2e")
    assert [(c, op.num_paths) for c, op in conv.groups] == [(64, 3), (32, 5), (16, 5)]
    gcd = e3j.MulIrConvolution("64x0e + 32x1o + 16x2e", sh, "0e + 1o + 2e", grouping="gcd")
    assert [(c, op.num_paths) for c, op in gcd.groups] == [(16, 27)]
    num_copies = e3nn.tensor_product(e3nn.Irreps("64x0e + 32x1o + 16x2e"), sh, filter_ir_out="0e + 1o + 2e").num_irreps
    assert conv.irreps_out == gcd.irreps_out and conv.num_weights == gcd.num_weights == num_copies
    x, y, w = random((N, 240), 4), random((E, sh.dim), 5), random((E, num_copies), 6)
    np.testing.assert_allclose(conv(x, y, w, GRAPH), gcd(x, y, w, GRAPH), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("grouping, regroup_output", [("multiplicity", True), ("gcd", False)])
def test_tensor_product_equals_e3nn_value_and_gradient(grouping, regroup_output):
    ix, iy = e3nn.Irreps("4x1o + 8x0e + 2x2e + 4x0o"), e3nn.Irreps("0e + 1o + 2e")
    tp = e3j.MulIrTensorProduct(ix, iy, "0e + 1o + 2e + 0o", regroup_output=regroup_output, grouping=grouping)
    x, y = random((5, ix.dim), 7), random((5, iy.dim), 8)

    def ref(a, b):
        out = e3nn.tensor_product(
            e3nn.IrrepsArray(ix, a),
            e3nn.IrrepsArray(iy, b),
            filter_ir_out="0e + 1o + 2e + 0o",
            regroup_output=regroup_output,
        )
        return out.array, out.irreps

    want, irreps = ref(x, y)
    assert str(tp.irreps_out) == str(irreps)
    np.testing.assert_allclose(jax.jit(tp)(x, y), want, rtol=1e-12, atol=1e-12)
    cot = random(want.shape, 9)
    got_g = jax.jit(jax.grad(lambda a, b: jnp.sum(tp(a, b) * cot), argnums=(0, 1)))(x, y)
    want_g = jax.jit(jax.grad(lambda a, b: jnp.sum(ref(a, b)[0] * cot), argnums=(0, 1)))(x, y)
    for g, r in zip(got_g, want_g):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rows", [e3j.mul_ir.ROWS_AS_CHANNELS - 1, 2 * e3j.mul_ir.ROWS_AS_CHANNELS + 11])
@pytest.mark.parametrize("regroup_output", [True, False])
def test_tensor_product_of_one_channel_runs_rows_as_channels(rows, regroup_output):
    """Blocks of multiplicity 1 (e3nn's ``mul_to_axis`` layout, Allegro's edge features): from
    ``ROWS_AS_CHANNELS`` rows on, the rows run as the channels of one product (zero rows padding
    the batch to a multiple), equal to e3nn-jax in value and gradient; below, one channel."""
    ix, iy = e3nn.Irreps("0e + 1o + 2e + 3o"), e3nn.Irreps("0o + 1o + 1e + 2e + 2o")
    filter_ = "0e + 0o + 1o + 1e + 2e + 2o"
    tp = e3j.MulIrTensorProduct(ix, iy, filter_, regroup_output=regroup_output)
    x, y = random((rows, ix.dim), 11), random((rows, iy.dim), 12)

    def ref(a, b):
        a, b = e3nn.IrrepsArray(ix, a), e3nn.IrrepsArray(iy, b)
        return e3nn.tensor_product(a, b, filter_ir_out=filter_, regroup_output=regroup_output).array

    want = ref(x, y)
    np.testing.assert_allclose(jax.jit(tp)(x, y), want, rtol=1e-12, atol=1e-12)
    cot = random(want.shape, 13)
    got_g = jax.jit(jax.grad(lambda a, b: jnp.sum(tp(a, b) * cot), argnums=(0, 1)))(x, y)
    want_g = jax.grad(lambda a, b: jnp.sum(ref(a, b) * cot), argnums=(0, 1))(x, y)
    for g, r in zip(got_g, want_g):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)
    eqns = jax.make_jaxpr(tp)(x, y).jaxpr.eqns
    bound = [e.invars[0].aval.shape for e in eqns if e.primitive.name == "e3j_tensor_product"]
    k = e3j.mul_ir.ROWS_AS_CHANNELS
    assert bound == ([(-(-rows // k), ix.dim, k)] if rows >= k else [(rows, ix.dim, 1)])


def test_bad_input():
    conv = e3j.MulIrConvolution("4x0e + 2x1o", "0e + 1o", "0e + 1o")
    x, y, w = jnp.ones((N, 10)), jnp.ones((E, 4)), jnp.ones((E, conv.num_weights))
    with pytest.raises(ValueError, match=r"x must be \[N=7, 10\]"):
        conv(x[:, :9], y, w, GRAPH)
    with pytest.raises(ValueError, match=r"y must be \[E=23, 4\]"):
        conv(x, y[:, :3], w, GRAPH)
    with pytest.raises(ValueError, match=r"w must be \[E=23, num_weights=12\]"):
        conv(x, y, w[:, :5], GRAPH)
    with pytest.raises(ValueError, match=r"x must have shape \[N, 10\]"):
        conv(x[None], y, w, GRAPH)
    with pytest.raises(TypeError, match=r"graph must be an e3j\.Graph"):
        conv(x, y, w, (SENDERS, RECEIVERS))
    with pytest.raises(ValueError, match="grouping must be one of"):
        e3j.MulIrConvolution("4x0e", "0e", grouping="channels")
    with pytest.raises(ValueError, match="irreps_x"):
        e3j.MulIrConvolution("4x0q", "1o")
    with pytest.raises(ValueError, match="filter 3o leaves no path"):
        e3j.MulIrConvolution("4x0e + 2x1o", "1o", filter="3o")
    tp = e3j.MulIrTensorProduct("4x0e + 2x1o", "1o")
    with pytest.raises(ValueError, match=r"y must be \[B=3, 3\]"):
        tp(jnp.ones((3, 10)), jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"x must be \[B, 10\]"):
        tp(jnp.ones((3, 9)), jnp.ones((3, 3)))


def test_grouped_operands_are_the_blocks_of_each_multiplicity():
    conv = e3j.MulIrConvolution("4x0e + 2x1o + 4x2e", "0e + 1o", "0e + 1o + 2e")
    x, y, w = random((N, 30), 10), random((E, 4), 11), random((E, conv.num_weights), 12)
    assert [c for c, _ in conv.groups] == [4, 2]
    # group C=4: blocks 4x0e and 4x2e, each one copy of 4 channels; group C=2: 2x1o
    xs = [
        jnp.concatenate([e3j.from_mul_ir(x[:, :4], "0e", 4), e3j.from_mul_ir(x[:, 10:], "2e", 4)], axis=1),
        e3j.from_mul_ir(x[:, 4:10], "1o", 2),
    ]
    for a, b in zip(xs, conv.split_x(x)):
        np.testing.assert_array_equal(a, b)
    outs = conv.grouped(xs, y, conv.split_weights(w), GRAPH)
    np.testing.assert_array_equal(conv.join_out(outs), conv(x, y, w, GRAPH))
    with pytest.raises(ValueError, match=r"one array per group \(2\)"):
        conv.grouped(xs[:1], y, conv.split_weights(w), GRAPH)
    with pytest.raises(ValueError, match=r"xs\[1\] must be \[N, 3, 2\]"):
        conv.grouped([xs[0], xs[0]], y, conv.split_weights(w), GRAPH)
    with pytest.raises(ValueError, match=r"ss\[0\] must be"):
        conv.grouped(xs, y, conv.split_weights(w)[::-1], GRAPH)


@pytest.mark.parametrize(
    "irreps_x, irreps_y, filter_, self_connection",
    [
        ("64x0e + 32x1o + 16x2e", "0e + 1o + 2e + 3o", "0e + 1o + 2e", None),
        ("4x0e + 2x1o + 4x2e", "0e + 1o", None, "0e + 1o"),
        ("1o + 0e + 2e", "1o + 0e", None, "0e + 1o"),  # one group of one channel: no transposes
    ],
)
def test_join_derivatives_are_slices_and_transposes(irreps_x, irreps_y, filter_, self_connection):
    plan = e3j.MulIrConvolution(irreps_x, irreps_y, filter_, self_connection=self_connection).plan
    outs = [random((5, g.coo.dim_out, g.channels), 20 + i) for i, g in enumerate(plan.groups)]
    # e3nn's copies from e3j's rows, entry by entry (the plan's gather index, not its blocks)
    flats = jnp.concatenate([o.reshape(5, -1) for o in outs], axis=1)
    expected = flats[:, _raw_index(plan)]
    np.testing.assert_array_equal(plan.join_out(outs), expected)
    ct = random(expected.shape, 30)
    grads = jax.grad(lambda o: jnp.vdot(plan.join_out(o), ct))(outs)
    (expected_grad,) = jax.vjp(lambda f: f[:, _raw_index(plan)], flats)[1](ct)
    np.testing.assert_array_equal(jnp.concatenate([g.reshape(5, -1) for g in grads], axis=1), expected_grad)
    # the backward is the blocks' transposes, never a gather's transpose (a scatter, ~20x slower)
    assert "scatter" not in jax.jit(jax.grad(lambda o: jnp.vdot(plan.join_out(o), ct))).lower(outs).as_text()
    tangents = [random(o.shape, 40 + i) for i, o in enumerate(outs)]
    _, tangent = jax.jvp(plan.join_out, (outs,), (tangents,))
    np.testing.assert_array_equal(tangent, plan.join_out(tangents))


@pytest.mark.parametrize(
    "irreps_x, irreps_y, filter_, self_connection",
    [
        ("64x0e + 32x1o + 16x2e", "0e + 1o + 2e + 3o", "0e + 1o + 2e", None),
        ("4x0e + 2x1o + 4x2e", "0e + 1o", None, "0e + 1o"),
        ("3x0e + 3x1e", "0e + 1o", "1o", None),
    ],
)
def test_out_order_is_join_out_as_one_gather(irreps_x, irreps_y, filter_, self_connection):
    # what the reference's grouped kernel gathers its output with: join_out of each entry's position
    plan = e3j.MulIrConvolution(irreps_x, irreps_y, filter_, self_connection=self_connection).plan
    sizes = [g.coo.dim_out * g.channels for g in plan.groups]
    starts = np.cumsum([0] + sizes)
    positions = [
        jnp.arange(a, a + size, dtype=jnp.int32).reshape(1, g.coo.dim_out, g.channels)
        for a, size, g in zip(starts, sizes, plan.groups)
    ]
    assert plan.out_order.dtype == np.int32
    np.testing.assert_array_equal(plan.out_order, np.asarray(plan.join_out(positions))[0])


def _raw_index(plan) -> np.ndarray:
    """For each of e3nn's output columns, its entry in the groups' outputs flattened and concatenated."""
    offsets = np.cumsum([0] + [g.coo.dim_out * g.channels for g in plan.groups])
    index = np.empty(plan.irreps_out.dim, np.int64)
    for col, g, row, dim in plan.out_blocks:
        C = plan.groups[g].channels
        for c in range(C):
            for k in range(dim):
                index[col + c * dim + k] = offsets[g] + (row + k) * C + c
    return index


@pytest.mark.parametrize(
    "make",
    [
        lambda: e3j.MulIrTensorProduct("2x0e + 1o", "1o"),
        lambda: e3j.MulIrConvolution("4x0e + 2x1o", "0e + 1o", "0e + 1o", self_connection="0e"),
        lambda: e3j.MulIrConvolution("4x0e + 2x1o", "0e + 1o", grouping="gcd", normalization="none"),
    ],
)
def test_equal_after_pickle_and_deepcopy(make):
    """Ops compare their (cached) plans by identity: a pickled or deep-copied op was a new plan,
    unequal to the original, and a static ``jit`` argument compiled again."""
    import copy
    import pickle
    from functools import partial

    op = make()
    for other in (copy.deepcopy(op), pickle.loads(pickle.dumps(op)), make()):
        assert other == op and hash(other) == hash(op) and other.plan is op.plan
    assert op != e3j.MulIrTensorProduct("2x0e + 1o", "0e")
    traces = []

    @partial(jax.jit, static_argnums=0)
    def norm(op):
        traces.append(op)
        return jnp.float32(len(op.plan.groups))

    norm(op), norm(copy.deepcopy(op)), norm(pickle.loads(pickle.dumps(op)))
    assert len(traces) == 1


@pytest.mark.parametrize(
    "args, match",
    [
        (
            ("2x1o", "0e", "0e", "1e"),
            r"^filter 0e and self_connection 1e leave no path in 2x1o ⊗ 1x0e: the product's outputs are 1o, "
            r"and irreps_x holds none of the self connection's irreps$",
        ),
        (
            ("5x0o + 2x1o + 4x3e", "0x2e + 0e", "1e + 2o", "0e + 2o"),
            r"^filter 1e\+2o and self_connection 0e\+2o leave no path in 5x0o\+2x1o\+4x3e ⊗ 0x2e\+1x0e: "
            r"the product's outputs are 0o\+1o\+3e,",
        ),
    ],
)
def test_nothing_kept_with_a_self_connection_names_the_callers_irreps(args, match):
    """The table's own error named ``[0e, y]`` and the merged filter, which the caller never gave."""
    irreps_x, irreps_y, filter_, keep = args
    with pytest.raises(ValueError, match=match):
        e3j.MulIrConvolution(irreps_x, irreps_y, filter_, self_connection=keep)
    # either part alone keeps something: x's first irrep by the self connection, the product unfiltered
    first = e3j.Irreps(irreps_x)[0]
    kept = e3j.MulIrConvolution(irreps_x, irreps_y, filter_, self_connection=str(first[1]))
    assert str(kept.irreps_out) == str(e3j.Irreps([first]))
    assert e3j.MulIrConvolution(irreps_x, irreps_y, None, self_connection=keep).irreps_out.dim > 0
