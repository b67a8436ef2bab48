"""``e3j.Convolution`` with its edge scalars given as ``e3j.FactoredWeights(hidden, kernel, bias)``.

The radial network's last linear layer, ``s = (hidden @ kernel + bias).reshape(E, P, C)``, runs as
one primitive; the reference computes each chunk's scalars inside its sweep, other backends multiply
them out. Oracle: e3nn-jax's per-edge tensor products scaled by the multiplied-out scalars and
summed with ``jax.ops.segment_sum`` (float64), through every order of differentiation the models use
(forces, force training, forward mode), under ``vmap`` (of the features: folded into the channels;
of ``hidden``: a loop), with padding edges holding NaN, and with an empty graph.
"""

from __future__ import annotations

import functools

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from installed import require_backend
from jaxpr_paths import routes

import e3j
from e3j import FactoredWeights

IRREPS_X, IRREPS_Y, FILTER = "0e + 1o + 2e", "0e + 1o + 2e", "0e + 1o + 2e"
CONV = e3j.Convolution(IRREPS_X, IRREPS_Y, FILTER)
N, E, C, H = 6, 19, 3, 4
RNG = np.random.default_rng(21)
SENDERS, RECEIVERS = RNG.integers(0, N, E), RNG.integers(0, N, E)
GRAPH = e3j.Graph.from_edges(SENDERS, RECEIVERS, N)
BACKENDS = ["reference", "test", pytest.param("pallas_gpu_interpret", marks=pytest.mark.slow)]


def path_of_rows() -> np.ndarray:
    """Each output row's path, from e3nn's output irreps alone (one path per 2l+1 block)."""
    out = e3nn.tensor_product(e3nn.Irreps(IRREPS_X), e3nn.Irreps(IRREPS_Y), filter_ir_out=FILTER)
    dims = [ir.dim for mul, ir in out for _ in range(mul)]
    return np.repeat(np.arange(len(dims)), dims)


def e3nn_conv(x, y, s, senders=SENDERS, receivers=RECEIVERS, num_nodes=N):
    """``Σ_{a→b} s_ab[path] · (x_a ⊗ y_ab)`` with e3nn-jax, channel by channel."""

    def one(xc, yc):
        tp = e3nn.tensor_product(e3nn.IrrepsArray(IRREPS_X, xc), e3nn.IrrepsArray(IRREPS_Y, yc), filter_ir_out=FILTER)
        return tp.array

    z = jax.vmap(one, in_axes=(-1, -1 if y.ndim == 3 else None), out_axes=-1)(x[senders], y)
    return jax.ops.segment_sum(z * s[:, path_of_rows(), :], receivers, num_nodes)


def scalars(h, k, b=None):
    """The multiplied-out edge scalars ``[E, P, C]``."""
    s = h @ k if b is None else h @ k + b
    return s.reshape(h.shape[0], CONV.num_paths, -1)


def operands(seed, y_channels=False, channels=C):
    k = jax.random.split(jax.random.key(seed), 5)
    x = jax.random.normal(k[0], (N, CONV.coo.dim_x, channels), jnp.float64)
    y = jax.random.normal(k[1], (E, CONV.coo.dim_y) + ((channels,) if y_channels else ()), jnp.float64)
    h = jax.random.normal(k[2], (E, H), jnp.float64)
    kernel = jax.random.normal(k[3], (H, CONV.num_paths * channels), jnp.float64) / 2
    bias = jax.random.normal(k[4], (CONV.num_paths * channels,), jnp.float64)
    return x, y, h, kernel, bias


def primitives(f, *args):
    return [e.primitive.name for e in jax.make_jaxpr(f)(*args).eqns]


@pytest.mark.usefixtures("fused_on_cpu_only")
def test_factored_scalars_run_one_primitive_and_are_never_multiplied_out_on_the_reference(monkeypatch):
    import e3j.reference.convolution as ref_conv

    # chunks of 8 edges, so that no chunk is the whole [E, P, C]
    monkeypatch.setattr(ref_conv, "_CHUNK_BYTES", 8 * 8 * CONV.coo.dim_out * C)
    x, y, h, k, _ = operands(0)
    by_platform = routes(lambda a, b, c, d: CONV(a, b, FactoredWeights(c, d), GRAPH), x, y, h, k)
    assert by_platform["cpu"].count("e3j_convolution_factored") == 1 and "dot_general" not in by_platform["cpu"]

    def loss(a, b, c, d, backend):
        return jnp.sum(jnp.sin(CONV(a, b, FactoredWeights(c, d), GRAPH, backend=backend)))

    def compiled(backend):
        f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)), static_argnums=4)
        return f.lower(x, y, h, k, backend).compile().as_text()

    per_edge = f"[{E},{CONV.num_paths},{C}]"  # the [E, P, C] edge scalars
    assert per_edge not in compiled("reference")
    # no request: both forms bound by platform, the reference selected at lowering; nothing of the
    # other platforms' branch (scalars multiplied out, kept for the backward) is left in the program
    monkeypatch.setenv("E3J_BACKEND", "reference")
    assert "platform_index" in str(jax.make_jaxpr(loss, static_argnums=4)(x, y, h, k, None))
    assert per_edge not in compiled(None)
    if "test" in {b.name for b in e3j.available_backends()}:
        assert per_edge in compiled("test")  # no factored kernels: multiplied out (the check can fail)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("y_channels", [False, True])
def test_value_gradients_and_second_order_equal_e3nn(backend, y_channels):
    """Every order of derivative, with respect to ``hidden``, ``kernel`` and ``bias`` too, equals
    e3nn-jax's convolution on the multiplied-out scalars."""
    require_backend(backend)
    x, y, h, k, b = operands(4, y_channels)
    cot = jax.random.normal(jax.random.key(7), (N, CONV.coo.dim_out, C), jnp.float64)
    v = jax.random.normal(jax.random.key(8), x.shape, jnp.float64)

    def ours(x, y, h, k, b):
        return jnp.sum(jnp.tanh(CONV(x, y, FactoredWeights(h, k, b), GRAPH, backend=backend)) * cot)

    def ref(x, y, h, k, b):
        return jnp.sum(jnp.tanh(e3nn_conv(x, y, scalars(h, k, b))) * cot)

    args = (x, y, h, k, b)
    for f in (
        lambda loss: jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)),
        # forces, then a loss on them differentiated with respect to everything (force training)
        lambda loss: jax.grad(lambda *a: jnp.sum(jax.grad(loss)(*a) * v), argnums=(0, 1, 2, 3, 4)),
        # forward mode
        lambda loss: lambda *a: jax.jvp(loss, a, (v, jnp.sin(a[1]), jnp.cos(a[2]), a[3] ** 2, a[4])),
    ):
        got, want = jax.jit(f(ours))(*args), jax.jit(f(ref))(*args)
        for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert float(jnp.abs(r).max()) > 1e-6
            np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-12 * float(jnp.abs(r).max()))


@pytest.mark.parametrize("backend", ["reference", "test"])
def test_vmap(backend):
    """Mapped features with a shared ``hidden`` fold into the channels; a mapped ``hidden``, or its
    cotangent, runs as a loop: both equal the unmapped calls."""
    require_backend(backend)
    x, y, h, k, _ = operands(5)

    def conv(a, c, d):
        return CONV(a, y, FactoredWeights(c, d), GRAPH, backend=backend)

    xs, hs, ks = jnp.stack([x, 2 * x, -x]), jnp.stack([h, h**2, -h]), jnp.stack([k, 3 * k, k**2])
    for got, want in (
        (jax.vmap(conv, (0, None, None))(xs, h, k), [e3nn_conv(a, y, scalars(h, k)) for a in xs]),
        (jax.vmap(conv, (0, None, 0))(xs, h, ks), [e3nn_conv(a, y, scalars(h, d)) for a, d in zip(xs, ks)]),
        (jax.vmap(conv, (None, 0, None))(x, hs, k), [e3nn_conv(x, y, scalars(c, k)) for c in hs]),
    ):
        np.testing.assert_allclose(got, jnp.stack(want), rtol=1e-12, atol=1e-12)
    # per-entry gradients with respect to the shared hidden and kernel (the cotangent of h sums
    # over channels: folding the entries into them would mix the entries)
    got = jax.vmap(jax.grad(lambda a, c, d: jnp.sum(conv(a, c, d) ** 2), argnums=(1, 2)), (0, None, None))(xs, h, k)
    for i, a in enumerate(xs):
        want = jax.grad(lambda c, d, a=a: jnp.sum(e3nn_conv(a, y, scalars(c, d)) ** 2), argnums=(0, 1))(h, k)
        for g, r in zip(got, want, strict=True):
            np.testing.assert_allclose(g[i], r, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "test"])
def test_padding_edges_with_nan_hidden_rows_and_empty_graph(backend):
    require_backend(backend)
    x, y, h, k, b = operands(6)
    pad = 5
    mask = np.arange(E + pad) < E
    padded = e3j.Graph.from_edges(np.r_[SENDERS, [N] * pad], np.r_[RECEIVERS, [N] * pad], N, edge_mask=mask)
    yp = jnp.concatenate([y, jnp.full((pad, y.shape[1]), jnp.nan)])
    hp = jnp.concatenate([h, jnp.full((pad, H), jnp.nan)])

    def loss(a, c, d, bias):
        return jnp.sum(jnp.sin(CONV(a, yp, FactoredWeights(c, d, bias), padded, backend=backend)))

    def ref(a, c, d, bias):
        return jnp.sum(jnp.sin(e3nn_conv(a, y, scalars(c, d, bias))))

    got = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(x, hp, k, b)
    want = jax.value_and_grad(ref, argnums=(0, 1, 2, 3))(x, h, k, b)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    dx, dh, dk, db = got[1]
    assert not np.any(dh[E:]) and np.all(np.isfinite(dk)) and np.all(np.isfinite(db))
    for g, r in zip((dx, dh[:E], dk, db), want[1], strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)
    # no edges: zeros, and zero gradients
    empty = e3j.Graph.from_edges(np.zeros(0, int), np.zeros(0, int), N)
    y0, h0 = jnp.zeros((0, y.shape[1])), jnp.zeros((0, H))
    assert not np.any(CONV(x, y0, FactoredWeights(h0, k), empty, backend=backend))
    grads = jax.grad(lambda a, d: jnp.sum(CONV(a, y0, FactoredWeights(h0, d), empty, backend=backend)), (0, 1))(x, k)
    assert not any(np.any(g) for g in grads)


@pytest.mark.parametrize("backend", ["reference", "test"])
def test_linear_transposes(backend):
    """``jax.linear_transpose`` with respect to one operand at a time."""
    require_backend(backend)
    x, y, h, k, _ = operands(8)
    g = jax.random.normal(jax.random.key(9), (N, CONV.coo.dim_out, C), jnp.float64)

    def ours(a, b, c, d):
        return CONV(a, b, FactoredWeights(c, d), GRAPH, backend=backend)

    cases = {
        "x": (lambda a: ours(a, y, h, k), lambda a: e3nn_conv(a, y, scalars(h, k)), x),
        "y": (lambda b: ours(x, b, h, k), lambda b: e3nn_conv(x, b, scalars(h, k)), y),
        "h": (lambda c: ours(x, y, c, k), lambda c: e3nn_conv(x, y, scalars(c, k)), h),
        "k": (lambda d: ours(x, y, h, d), lambda d: e3nn_conv(x, y, scalars(h, d)), k),
    }
    for name, (fn, ref, primal) in cases.items():
        (got,) = jax.linear_transpose(fn, primal)(g)
        (want,) = jax.linear_transpose(ref, primal)(g)
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12, err_msg=name)


def test_many_chunks_equal_one(monkeypatch):
    """The reference's sweep cut into many chunks (the last one partial) gives the one-chunk values."""
    import e3j.reference.convolution as ref_conv

    x, y, h, k, _ = operands(10)

    def value_and_grads():
        f = jax.value_and_grad(lambda a, c, d: jnp.sum(jnp.sin(CONV(a, y, FactoredWeights(c, d), GRAPH))), (0, 1, 2))
        return jax.jit(f)(x, h, k)

    one = value_and_grads()
    monkeypatch.setattr(ref_conv, "_CHUNK_BYTES", 8 * 4 * 8)  # 8 edges per chunk: 3 trips, the last partial
    many = value_and_grads()
    assert ref_conv.chunk_size(E, CONV.coo.dim_out * C, 8) == 8
    for a, b in zip(jax.tree.leaves(many), jax.tree.leaves(one), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_kernel_cotangent_summed_over_many_chunks_keeps_low_precision_digits(monkeypatch, dtype):
    """The kernel's cotangent sums every edge's ``h^T ds``, one chunk per loop trip: carried in
    bfloat16 the running sum stopped growing (20,000 positive terms: 2,048 against 11,244).
    Kept in float32, it is as close as one dot over all the edges in that dtype."""
    import e3j.reference.convolution as ref_conv

    conv = e3j.Convolution("0e", "0e", filter="0e")
    e, n = 20_000, 50
    rng = np.random.default_rng(3)
    graph = e3j.Graph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)
    h, y = rng.uniform(0.5, 1.0, (e, 1)), rng.uniform(0.5, 1.0, (e, 1))
    truth = np.sum(h[:, 0] * y[:, 0])  # x = 1, k = 1: dk = sum_e h_e y_e (float64)
    monkeypatch.setattr(ref_conv, "_CHUNK_BYTES", 16)  # 8 edges per trip: 2,500 trips
    cast = functools.partial(jnp.asarray, dtype=dtype)
    x = cast(np.ones((n, 1, 1)))
    dk = jax.jit(jax.grad(lambda k: jnp.sum(conv(x, cast(y), FactoredWeights(cast(h), k), graph, backend="reference"))))
    got = dk(cast(np.ones((1, 1))))
    assert got.dtype == jnp.dtype(dtype)
    one_dot = float(jnp.dot(cast(h[:, 0]), cast(y[:, 0]), preferred_element_type=jnp.float32))
    assert abs(float(got[0, 0]) - truth) / truth < 1e-2
    assert abs(float(got[0, 0]) - one_dot) / truth < 1e-2


def test_the_fused_route_makes_no_copy_of_hidden():
    """Padding edges' rows of hidden are zeroed chunk by chunk inside the fused sweep; a masked copy
    of the whole [E, H] before it (1.2 GiB at 5e6 edges, H = 64) broke the bounded-memory promise.
    Compiled only, the graph an argument (a constant one lets XLA fold the mask away): XLA's
    temporary memory against hidden's size."""
    e, n, hidden = 200_000, 1_000, 64  # hidden: 51 MB of float32
    rng = np.random.default_rng(0)
    sds = jax.ShapeDtypeStruct
    graph = jax.tree.map(
        lambda a: sds(a.shape, a.dtype), e3j.Graph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)
    )
    conv = e3j.Convolution("0e + 1o", "0e + 1o", filter="0e + 1o")
    mul = e3j.MulIrConvolution("2x0e + 1x1o", "0e + 1o", "0e + 1o")
    h, y = sds((e, hidden), jnp.float32), sds((e, 4), jnp.float32)
    calls = {
        "Convolution": (conv, sds((n, 4, 1), jnp.float32), sds((hidden, conv.num_paths), jnp.float32)),
        "MulIrConvolution": (mul, sds((n, 5), jnp.float32), sds((hidden, mul.num_weights), jnp.float32)),
    }
    for name, (op, x, k) in calls.items():
        fn = jax.jit(lambda x, y, h, k, g, op=op: op(x, y, FactoredWeights(h, k), g, backend="reference"))
        temp = fn.lower(x, y, h, k, graph).compile().memory_analysis().temp_size_in_bytes
        assert temp < e * hidden * 4 / 2, (name, temp)


@pytest.mark.parametrize("irreps_y", ["0e + 1o", "2x0e + 1o"], ids=["in place", "split into groups"])
def test_mixed_multiplicities_ignore_padding_rows_of_hidden(irreps_y):
    """Padding edges' rows of hidden may hold anything: the gradients equal those with zeros there.
    A plan that splits its weights into the groups (a y multiplicity above 1) multiplies them out;
    it once read the NaN rows in dk = hidden^T ds."""
    mul = e3j.MulIrConvolution("2x0e + 1x1o", irreps_y, "0e + 1o")
    assert mul.plan.in_place == (irreps_y == "0e + 1o")
    rng = np.random.default_rng(8)
    n, e, hidden = 4, 7, 3
    mask = np.array([1, 1, 0, 1, 1, 0, 1], bool)
    graph = e3j.Graph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n, edge_mask=mask)
    x = jnp.asarray(rng.normal(size=(n, mul.irreps_x.dim)))
    y = jnp.asarray(rng.normal(size=(e, mul.irreps_y.dim)))
    k = jnp.asarray(rng.normal(size=(hidden, mul.num_weights)))
    h = rng.normal(size=(e, hidden))

    def grads(h):
        def loss(k, h):
            return jnp.sum(jnp.sin(mul(x, y, FactoredWeights(h, k), graph, backend="reference")))

        return jax.grad(loss, argnums=(0, 1))(k, jnp.asarray(h))

    dk, dh = grads(np.where(mask[:, None], h, np.nan))
    want_dk, want_dh = grads(np.where(mask[:, None], h, 0.0))
    assert float(jnp.max(jnp.abs(want_dk))) > 1e-3
    np.testing.assert_allclose(dk, want_dk, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dh, want_dh, rtol=1e-12, atol=1e-14)


def test_factored_kernels_come_in_pairs():
    ref = e3j.backends.kernels_of(e3j.backends.get_backend("reference"))
    assert ref.provides("convolution_factored")
    with pytest.raises(ValueError, match="convolution_factored and convolution_factored_bwd"):
        e3j.Kernels(convolution_factored=ref.convolution_factored)


@pytest.mark.parametrize(
    "hidden, kernel, bias, match",
    [
        ((E + 1, H), (H, CONV.num_paths * C), None, r"s: FactoredWeights.hidden must be \[E=19, H\]"),
        ((E, H), (H, CONV.num_paths * C + 1), None, r"kernel must be \[H=4, num_weights=33\] \(num_paths=11 × C=3\)"),
        ((E, H), (H + 1, CONV.num_paths * C), None, r"s: FactoredWeights.kernel must be \[H=4"),
        ((E, H), (H, CONV.num_paths * C), (3,), r"s: FactoredWeights.bias must be \[33\] or None"),
    ],
)
def test_bad_factored_scalars_are_named(hidden, kernel, bias, match):
    x, y, *_ = operands(0)
    w = FactoredWeights(jnp.ones(hidden), jnp.ones(kernel), None if bias is None else jnp.ones(bias))
    with pytest.raises(ValueError, match=match):
        CONV(x, y, w, GRAPH)
    with pytest.raises(TypeError, match=r"s.kernel"):
        CONV(x, y, FactoredWeights(jnp.ones((E, H)), jnp.ones((H, CONV.num_paths * C), jnp.float32)), GRAPH)


def test_tangents_of_both_factors_are_one_evaluation():
    """``ḣ k + h k̇ = [ḣ, h] @ [k; k̇]``: the outputs other than ``h`` and ``k`` are one ``M``
    evaluation with the factors stacked, whose value is the sum of the two per-factor ones."""
    from e3j._primitives.multilinear import factored_evaluations, one_per_tangent

    x, y, h, k, _ = operands(12)
    k3 = k.reshape(H, CONV.num_paths, C)
    dh, dk = jnp.cos(h), jnp.sin(k3)
    Q, T = {"x": x, "y": y, "h": h, "k": k3}, {"h": dh, "k": dk}
    fused = factored_evaluations(Q, T, ("m", "h", "k"))
    assert [js for _, js in fused] == [("m",), ("k",), ("h",)]
    assert len(one_per_tangent(Q, T, ("m",))) == 2
    (A, _), *_ = fused
    assert A["h"].shape == (E, 2 * H) and A["k"].shape == (2 * H, CONV.num_paths, C)

    def conv(a):
        return CONV(x, y, FactoredWeights(a["h"], a["k"].reshape(a["k"].shape[0], -1)), GRAPH)

    np.testing.assert_allclose(conv(A), conv({**Q, "h": dh}) + conv({**Q, "k": dk}), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("backend", ["reference", "test"])
def test_zero_channels_give_zeros_as_the_array_does(backend):
    require_backend(backend)
    x, y = jnp.zeros((N, CONV.coo.dim_x, 0)), jnp.ones((E, CONV.coo.dim_y))
    w = FactoredWeights(jnp.ones((E, H)), jnp.zeros((H, 0)))
    out = CONV(x, y, w, GRAPH, backend=backend)
    assert (
        out.shape
        == CONV(x, y, jnp.zeros((E, CONV.num_paths, 0)), GRAPH, backend=backend).shape
        == (
            N,
            CONV.coo.dim_out,
            0,
        )
    )
    dh, dk = jax.grad(lambda c, d: jnp.sum(CONV(x, y, FactoredWeights(c, d), GRAPH, backend=backend)), (0, 1))(
        w.hidden, w.kernel
    )
    assert dh.shape == (E, H) and not np.any(dh) and dk.shape == (H, 0)


def test_sharded_convolution_takes_factored_weights():
    # (refused before; tests/ops/test_distributed.py checks 4 devices, gradients and NaN padding)
    x, y, h, k, _ = operands(0)
    partitioned = e3j.partition_graph(SENDERS, RECEIVERS, N, 1)
    mesh = jax.make_mesh((1,), ("d",))
    out = e3j.convolution_sharded(CONV, x, y, FactoredWeights(h, k), partitioned, mesh, "d")
    np.testing.assert_allclose(out, CONV(x, y, FactoredWeights(h, k), GRAPH), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "backend, on_cpu, elsewhere",
    [
        ("shipped", "factored", "array"),
        ("auto", "array", None),
        ("reference", "factored", "factored"),
        ("test", "array", "array"),
    ],
)
def test_factored_scalars_reach_the_factored_primitive_only_where_a_backend_fuses_them(
    backend, on_cpu, elsewhere, request, monkeypatch
):
    """The factored primitive where the backend lowering will select has factored kernels, the
    scalars multiplied out before the array primitive elsewhere (then computed once and kept for the
    backward, not recomputed in every call). "shipped": the reference on the CPU, e3j's GPU and TPU
    backends (no factored kernels) elsewhere; "auto": this environment's selection, in which the
    ``test`` plugin (priority 100, no factored kernels) is the CPU's; a requested backend by its
    own kernels, on every platform."""
    if backend in ("test", "auto"):
        require_backend("test")
    if backend == "shipped":
        request.getfixturevalue("fused_on_cpu_only")
    monkeypatch.delenv("E3J_BACKEND", raising=False)
    backend = None if backend in ("shipped", "auto") else backend
    x, y, h, k, _ = operands(1)
    by_platform = routes(lambda a, b, c, d: CONV(a, b, FactoredWeights(c, d), GRAPH, backend=backend), x, y, h, k)

    def form(names):
        if names.count("e3j_convolution_factored") == 1 and "e3j_convolution" not in names:
            return "factored" if "dot_general" not in names else "factored, multiplied out"
        return "array" if names.count("e3j_convolution") == 1 and "dot_general" in names else names

    assert form(by_platform["cpu"]) == on_cpu
    for platform in ("cuda", "rocm", "tpu", "default") if elsewhere else ():
        assert form(by_platform[platform]) == elsewhere, platform


def test_both_forms_bound_by_platform_go_through_vmap_and_grad(fused_on_cpu_only):
    """Without a request the op binds both forms behind ``platform_dependent`` (the CPU's branch
    runs here): ``vmap`` of the features and ``grad`` with respect to every factor go through it,
    equal to the factored primitive bound alone."""
    x, y, h, k, bias = operands(7)
    xs = jnp.stack([x, 2 * x])

    def value_and_grads(backend):
        def loss(xs, h, k, bias):
            conv = jax.vmap(lambda a: CONV(a, y, FactoredWeights(h, k, bias), GRAPH, backend=backend))
            return jnp.sum(jnp.sin(conv(xs)))

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(xs, h, k, bias)

    assert "platform_index" in str(jax.make_jaxpr(lambda a: CONV(a, y, FactoredWeights(h, k), GRAPH))(x))
    got, want = value_and_grads(None), value_and_grads("reference")
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert float(jnp.abs(b).max()) > 1e-6
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12 * float(jnp.abs(b).max()))


def test_a_requested_backend_that_fails_to_load_is_named():
    """Asked ahead of lowering which form to bind, a requested backend whose ``load()`` raises gives
    the ``BackendError`` naming it, as with an array of scalars (not the load's own exception)."""
    require_backend("load_fails")
    x, y, h, k, _ = operands(2)
    with pytest.raises(e3j.backends.BackendError, match="'load_fails' failed to load"):
        CONV(x, y, FactoredWeights(h, k), GRAPH, backend="load_fails")
