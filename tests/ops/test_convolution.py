"""e3j.Convolution against per-edge e3nn-jax tensor products summed with ``jax.ops.segment_sum``.

Covers values and cotangents for x, y and s, graphs with isolated nodes, a high-valency node,
unsorted edges and padding edges, higher derivatives, vmap (including mapped graphs), jit,
determinism and the chunked edge loop of the reference kernels. Compilation of the unrolled
kernels dominates the runtime on CPU, hence few, small shapes, reused across tests.
"""

from __future__ import annotations

import warnings
from functools import cache, partial

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import e3j
import e3j.reference.convolution as ref_conv

# (irreps_x, irreps_y = spherical harmonics, filter): lmax 1, 2, 3
CASES = {
    "l1": ("0e + 1o", "0e + 1o", None),
    "l2": ("0e + 1o + 2e", "0e + 1o + 2e", "0e + 1o + 2e"),
    "l3": ("0e + 1o + 2e + 3o", "0e + 1o + 2e + 3o", "0e + 1o + 2e + 3o"),
}

N = 8  # nodes 6 and 7 are isolated, node 0 is a hub
C = 2


def rel_err(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    assert a.shape == ref.shape, (a.shape, ref.shape)
    scale = np.max(np.abs(ref))
    assert scale > 0, "degenerate reference (all zeros): the comparison would be vacuous"
    return float(np.max(np.abs(a - ref)) / scale)


@cache
def get_conv(case) -> e3j.Convolution:
    return e3j.Convolution(*CASES[case])


def e3nn_path_index(case) -> np.ndarray:
    """Path of each output row, from e3nn's output irreps alone (one path per 2l+1 block)."""
    irreps_x, irreps_y, filter = CASES[case]
    out = e3nn.tensor_product(e3nn.Irreps(irreps_x), e3nn.Irreps(irreps_y), filter_ir_out=filter)
    dims = [ir.dim for mul, ir in out for _ in range(mul)]
    return np.repeat(np.arange(len(dims)), dims)


def e3nn_tp(case, x, y):
    irreps_x, irreps_y, filter = CASES[case]

    def one(xc, yc):
        return e3nn.tensor_product(
            e3nn.IrrepsArray(irreps_x, xc), e3nn.IrrepsArray(irreps_y, yc), filter_ir_out=filter
        ).array

    return jax.vmap(one, in_axes=(-1, -1 if y.ndim == 3 else None), out_axes=-1)(x, y)


def conv_ref(case, senders, receivers, num_nodes, x, y, s):
    """``segment_sum_b(tp(x[senders], y) * s[:, path(row), :])`` over valid edges only."""
    z = e3nn_tp(case, x[senders], y)
    msg = z * s[:, e3nn_path_index(case), :]
    return jax.ops.segment_sum(msg, receivers, num_nodes)


def make_edges(seed, num_random=14, num_nodes=N):
    """Unsorted edges on nodes 0..num_nodes-3 (the last two are isolated), with node 0 as a hub
    receiving from every active node (a self-loop included)."""
    rng = np.random.default_rng(seed)
    active = num_nodes - 2
    senders = [*range(active), *rng.integers(0, active, num_random)]
    receivers = [*([0] * active), *rng.integers(0, active, num_random)]
    perm = rng.permutation(len(senders))
    return np.asarray(senders, np.int32)[perm], np.asarray(receivers, np.int32)[perm]


def make_features(case, num_edges, y_channels, seed, num_nodes=N, channels=C, dtype="float64"):
    irreps_x, irreps_y, _ = CASES[case]
    conv = get_conv(case)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_nodes, e3j.Irreps(irreps_x).dim, channels))
    vec = rng.normal(size=(num_edges, channels, 3) if y_channels else (num_edges, 3))
    y = np.asarray(e3j.spherical_harmonics(irreps_y, jnp.asarray(vec), normalize=True))
    if y_channels:
        y = np.moveaxis(y, 1, 2)  # [E, Dy, C]
    s = rng.normal(size=(num_edges, conv.num_paths, channels))
    return tuple(a.astype(dtype) for a in (x, y, s))


def with_padding(seed, senders, receivers, y, s, num_pad):
    """Interleave ``num_pad`` padding edges with garbage indices and garbage (finite) features."""
    rng = np.random.default_rng(seed)
    e = len(senders) + num_pad
    pad_pos = np.sort(rng.choice(e, num_pad, replace=False))
    mask = np.ones(e, bool)
    mask[pad_pos] = False
    garbage_idx = np.asarray([N, -1, 3, 10**6, 0])
    snd = np.empty(e, np.int32)
    rcv = np.empty(e, np.int32)
    snd[mask], rcv[mask] = senders, receivers
    snd[~mask] = garbage_idx[np.arange(num_pad) % 5]
    rcv[~mask] = garbage_idx[(np.arange(num_pad) + 2) % 5]
    y_pad = np.empty((e, *y.shape[1:]), y.dtype)
    s_pad = np.empty((e, *s.shape[1:]), s.dtype)
    y_pad[mask], s_pad[mask] = y, s
    y_pad[~mask] = 1e3 * rng.normal(size=(num_pad, *y.shape[1:]))
    s_pad[~mask] = 1e3 * rng.normal(size=(num_pad, *s.shape[1:]))
    return snd, rcv, mask, y_pad, s_pad


def value_and_vjp(f, x, y, s, ct):
    m, pull = jax.vjp(f, x, y, s)
    return (m, *pull(ct))


@partial(jax.jit, static_argnums=0)
def e3j_value_and_vjp(case, x, y, s, graph, ct):
    return value_and_vjp(lambda x, y, s: get_conv(case)(x, y, s, graph), x, y, s, ct)


@partial(jax.jit, static_argnums=(0, 4))
def ref_value_and_vjp(case, senders, receivers, x, num_nodes, y, s, ct):
    return value_and_vjp(partial(conv_ref, case, senders, receivers, num_nodes), x, y, s, ct)


# -- values and cotangents vs e3nn-jax -----------------------------------------------------------

PARAMS = [
    ("l1", "float64", False, True),
    ("l1", "float64", True, True),
    ("l1", "float32", True, True),
    ("l2", "float64", True, True),
    ("l2", "float32", True, True),
    ("l3", "float64", False, True),
    ("l3", "float32", False, False),  # values only: the lmax-3 backward compiles slowly
]


@pytest.mark.parametrize("case,dtype,y_channels,grads", PARAMS)
def test_values_and_vjp_match_e3nn(case, dtype, y_channels, grads):
    conv = get_conv(case)
    senders, receivers = make_edges(seed=0)
    graph = e3j.Graph.from_edges(senders, receivers, N)
    E = len(senders)
    x, y, s = make_features(case, E, y_channels, seed=1, dtype=dtype)
    ct = np.random.default_rng(2).normal(size=(N, conv.irreps_out.dim, C)).astype(dtype)
    if case == "l3":
        assert conv.num_paths == 23 and conv.irreps_out.dim == 99
    x64, y64, s64, ct64 = (a.astype(np.float64) for a in (x, y, s, ct))
    # float32 params share shapes with a float64 one: the float64 oracle compiles once per case
    ref = ref_value_and_vjp(case, senders, receivers, x64, N, y64, s64, ct64)
    res = e3j_value_and_vjp(case, x, y, s, graph, ct) if grads else (jax.jit(conv.__call__)(x, y, s, graph),)
    assert res[0].shape == (N, conv.irreps_out.dim, C)
    tol = 1e-12 if dtype == "float64" else 1e-6
    for name, a, r in zip(("m", "dx", "dy", "ds"), res, ref):
        assert a.dtype == jnp.dtype(dtype), name
        assert rel_err(a, r) <= tol, (name, rel_err(a, r))
    m = np.asarray(res[0])
    assert np.all(m[6:] == 0)  # isolated nodes receive nothing...
    assert np.all(np.abs(m[:6]).max(axis=(1, 2)) > 0)  # ...and every node with an in-edge does
    if grads:
        dx = np.asarray(res[1])
        assert np.all(dx[6:] == 0)  # isolated nodes send nothing


def test_path_weights_select_path_rows():
    """``s[:, p]`` scales exactly rows ``path_slices[p]``: a one-hot s gives one path's block."""
    case = "l2"
    conv = get_conv(case)
    senders, receivers = make_edges(seed=3)
    graph = e3j.Graph.from_edges(senders, receivers, N)
    x, y, s = make_features(case, len(senders), True, seed=4)
    full = np.asarray(conv(x, y, np.ones_like(s), graph))
    for p in (0, conv.num_paths // 2, conv.num_paths - 1):
        one_hot = np.zeros_like(s)
        one_hot[:, p, :] = 1.0
        m = np.asarray(conv(x, y, one_hot, graph))
        sl = conv.path_slices[p]
        np.testing.assert_allclose(m[:, sl], full[:, sl], rtol=1e-14, atol=1e-14)
        rest = np.ones(conv.irreps_out.dim, bool)
        rest[sl] = False
        assert np.all(m[:, rest] == 0)
        assert np.max(np.abs(m[:, sl])) > 0


# -- padding -------------------------------------------------------------------------------------


def assert_padding_changes_nothing(case, x, unpadded, padded, mask, ct):
    """Value and cotangents with padding edges equal those without; padding rows' cotangents are 0."""
    m, dx, dy, ds = e3j_value_and_vjp(case, x, *unpadded, ct)
    m_p, dx_p, dy_p, ds_p = e3j_value_and_vjp(case, x, *padded, ct)
    np.testing.assert_allclose(m_p, m, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(dx_p, dx, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(np.asarray(dy_p)[mask], dy, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(np.asarray(ds_p)[mask], ds, rtol=1e-14, atol=1e-14)
    # cotangents of padding rows are exactly zero
    assert np.all(np.asarray(dy_p)[~mask] == 0)
    assert np.all(np.asarray(ds_p)[~mask] == 0)
    return m, dx, dy, ds


@pytest.mark.parametrize("y_channels", [False, True])
def test_padding_edges_change_nothing(y_channels):
    case = "l1"
    conv = get_conv(case)
    senders, receivers = make_edges(seed=5)
    E = len(senders)
    x, y, s = make_features(case, E, y_channels, seed=6)
    ct = np.random.default_rng(7).normal(size=(N, conv.irreps_out.dim, C))
    snd, rcv, mask, y_pad, s_pad = with_padding(8, senders, receivers, y, s, num_pad=7)
    g = e3j.Graph.from_edges(senders, receivers, N)
    g_pad = e3j.Graph.from_edges(snd, rcv, N, edge_mask=mask)
    assert g_pad.num_edges == E + 7 and int(g_pad.num_valid) == E
    m, dx, dy, ds = assert_padding_changes_nothing(case, x, (y, s, g), (y_pad, s_pad, g_pad), mask, ct)
    # and the unpadded result is right
    ref = ref_value_and_vjp(case, senders, receivers, x, N, y, s, ct)
    for a, r in zip((m, dx, dy, ds), ref):
        assert rel_err(a, r) <= 1e-12


def test_padding_edges_with_nonfinite_features_change_nothing():
    """Padding rows are never read: NaN/inf there (e.g. a radial function at r=0) must not leak."""
    case = "l1"
    conv = get_conv(case)
    senders, receivers = make_edges(seed=5)
    E = len(senders)
    x, y, s = make_features(case, E, False, seed=6)
    ct = np.random.default_rng(7).normal(size=(N, conv.irreps_out.dim, C))
    snd, rcv, mask, y_pad, s_pad = with_padding(8, senders, receivers, y, s, num_pad=7)
    y_pad[~mask] = np.nan
    s_pad[~mask] = np.inf
    g = e3j.Graph.from_edges(senders, receivers, N)
    g_pad = e3j.Graph.from_edges(snd, rcv, N, edge_mask=mask)
    assert_padding_changes_nothing(case, x, (y, s, g), (y_pad, s_pad, g_pad), mask, ct)
    # forward mode, with non-finite tangents on the padding rows as well
    rng = np.random.default_rng(9)
    tx, ty, ts = rng.normal(size=x.shape), rng.normal(size=y.shape), rng.normal(size=s.shape)
    ty_pad, ts_pad = np.full_like(y_pad, np.nan), np.full_like(s_pad, np.nan)
    ty_pad[mask], ts_pad[mask] = ty, ts
    jvp = jax.jit(lambda g, primals, tangents: jax.jvp(lambda x, y, s: conv(x, y, s, g), primals, tangents))
    _, dm = jvp(g, (x, y, s), (tx, ty, ts))
    _, dm_p = jvp(g_pad, (x, y_pad, s_pad), (tx, ty_pad, ts_pad))
    np.testing.assert_allclose(dm_p, dm, rtol=1e-14, atol=1e-14)


def test_all_edges_padding_gives_zeros():
    case = "l1"
    conv = get_conv(case)
    E = 5
    g = e3j.Graph.from_edges(np.full(E, N), np.full(E, -1), N, edge_mask=np.zeros(E, bool))
    assert int(g.num_valid) == 0
    x, y, s = make_features(case, E, False, seed=9)
    ct = np.ones((N, conv.irreps_out.dim, C))
    m, dx, dy, ds = jax.jit(partial(value_and_vjp, lambda x, y, s: conv(x, y, s, g)))(x, y, s, ct)
    for a in (m, dx, dy, ds):
        assert np.all(np.asarray(a) == 0)


# -- higher derivatives --------------------------------------------------------------------------


def tiny_problem(y_channels, seed=10):
    senders = np.array([0, 1, 2, 1, 0], np.int32)
    receivers = np.array([1, 0, 1, 1, 0], np.int32)  # node 2 only sends, node 3 is isolated
    graph = e3j.Graph.from_edges(senders, receivers, 4)
    x, y, s = make_features("l1", 5, y_channels, seed=seed, num_nodes=4, channels=2)
    return senders, receivers, graph, x, y, s


def test_check_grads_order2():
    _, _, graph, x, y, s = tiny_problem(y_channels=True)
    conv = get_conv("l1")
    # eager: each primitive compiles once and is reused across check_grads' many traces
    check_grads(lambda x, y, s: conv(x, y, s, graph), (x, y, s), order=2, modes=("fwd", "rev"), atol=1e-7, rtol=1e-7)


def test_third_derivatives_match_e3nn():
    """d³/dx³ and d³/dx² ds of a non-multilinear energy: JVPs of ``L`` with symbolic zero tangents."""
    senders, receivers, graph, x, y, s = tiny_problem(False)
    conv = get_conv("l1")

    def third(f, x, y, s):
        def energy(x, s):
            return jnp.sum(f(x, y, s) ** 4)

        return jax.jacfwd(jax.jacfwd(jax.grad(energy)))(x, s), jax.jacfwd(jax.jacfwd(jax.grad(energy), 1))(x, s)

    got = jax.jit(partial(third, lambda x, y, s: conv(x, y, s, graph)))(x, y, s)
    want = jax.jit(partial(third, partial(conv_ref, "l1", senders, receivers, 4)))(x, y, s)
    for g, r in zip(got, want):
        assert np.max(np.abs(np.asarray(r))) > 1e-3 and rel_err(g, r) <= 1e-11


def test_hessian_matches_e3nn():
    senders, receivers, graph, x, y, s = tiny_problem(False)
    conv = get_conv("l1")
    w = np.random.default_rng(11).normal(size=(4, conv.irreps_out.dim, 2))

    def hessian(f, x, y, s):
        def energy(x, y, s):  # not multilinear: non-trivial blocks everywhere
            m = f(x, y, s)
            return jnp.sum(w * m * m) + jnp.sum(jnp.sin(m))

        return jax.hessian(energy, (0, 1, 2))(x, y, s)

    h = jax.jit(partial(hessian, lambda x, y, s: conv(x, y, s, graph)))(x, y, s)
    h_ref = jax.jit(partial(hessian, partial(conv_ref, "l1", senders, receivers, 4)))(x, y, s)
    for i in range(3):
        for j in range(3):
            assert rel_err(h[i][j], h_ref[i][j]) <= 1e-12, (i, j)


# -- transformations -----------------------------------------------------------------------------


def stacked_inputs(case, V, y_channels, seed, num_edges):
    feats = [make_features(case, num_edges, y_channels, seed=seed + v) for v in range(V)]
    return tuple(np.stack(a) for a in zip(*feats))


@pytest.mark.parametrize("y_channels", [False, True])
def test_vmap_over_features_with_fixed_graph(y_channels):
    case, V = "l1", 3
    conv = get_conv(case)
    senders, receivers = make_edges(seed=12)
    graph = e3j.Graph.from_edges(senders, receivers, N)
    xs, ys, ss = stacked_inputs(case, V, y_channels, 13, len(senders))

    def f(x, y, s):
        return conv(x, y, s, graph)

    # x and s mapped, y shared
    out = jax.vmap(f, in_axes=(0, None, 0))(xs, ys[0], ss)
    loop = np.stack([f(xs[v], ys[0], ss[v]) for v in range(V)])
    np.testing.assert_allclose(out, loop, rtol=1e-14, atol=1e-14)
    # everything mapped
    out = jax.vmap(f)(xs, ys, ss)
    loop = np.stack([f(xs[v], ys[v], ss[v]) for v in range(V)])
    np.testing.assert_allclose(out, loop, rtol=1e-14, atol=1e-14)
    ref = np.stack([conv_ref(case, senders, receivers, N, xs[v], ys[v], ss[v]) for v in range(V)])
    assert rel_err(out, ref) <= 1e-12


@pytest.mark.parametrize("y_channels", [False, True])
def test_vmap_of_grad_with_shared_y(y_channels):
    """Per-example gradients w.r.t. an unmapped y must not mix vmap entries."""
    case, V = "l1", 3
    conv = get_conv(case)
    senders, receivers = make_edges(seed=14)
    graph = e3j.Graph.from_edges(senders, receivers, N)
    xs, ys, ss = stacked_inputs(case, V, y_channels, 15, len(senders))
    w = np.random.default_rng(16).normal(size=(N, conv.irreps_out.dim, C))
    grad = jax.jit(jax.grad(lambda x, y, s: jnp.sum(w * conv(x, y, s, graph) ** 2), (0, 1, 2)))
    gx, gy, gs = jax.vmap(grad, in_axes=(0, None, 0))(xs, ys[0], ss)
    for v in range(V):
        for a, b in zip((gx[v], gy[v], gs[v]), grad(xs[v], ys[0], ss[v])):
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize(
    ("in_axes", "y_channels", "folds"),
    [
        ((0, None, 0), False, True),  # x and s mapped, broadcast y shared: one wider convolution
        ((0, 0, 0), True, True),
        ((0, None, 0), True, False),  # a shared per-channel y would be copied per entry
        ((0, None, None), False, False),  # a shared s would be copied per entry
        ((None, 0, None), False, False),  # a mapped broadcast y would become per-channel
        ((0, 0, 0), False, False),
    ],
)
def test_vmap_folds_into_channels_only_without_edge_sized_copies(in_axes, y_channels, folds):
    """Folding the vmap into the channels copies every unmapped operand per entry: for ``s`` or a
    per-channel ``y`` (edge-sized) that cost ~2x a loop of plain calls, so those run as a loop."""
    conv, V = get_conv("l1"), 3
    senders, receivers = make_edges(seed=12)
    graph = e3j.Graph.from_edges(senders, receivers, N)
    xs, ys, ss = stacked_inputs("l1", V, y_channels, 13, len(senders))
    args = [a if ax == 0 else a[0] for a, ax in zip((xs, ys, ss), in_axes)]

    def f(x, y, s):
        return conv(x, y, s, graph)

    names = [e.primitive.name for e in jax.make_jaxpr(jax.vmap(f, in_axes=in_axes))(*args).eqns]
    assert ("scan" not in names) == folds, names
    got = jax.vmap(f, in_axes=in_axes)(*args)
    loop = np.stack([f(*(a[v] if ax == 0 else a for a, ax in zip(args, in_axes))) for v in range(V)])
    np.testing.assert_allclose(got, loop, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("y_channels", [False, True])
def test_vmap_over_no_entries_and_jacobians_of_an_empty_graph(y_channels):
    """A vmap over 0 entries is empty, as JAX's own operations give; jacrev of a 0-node convolution
    vmaps over 0 basis cotangents (the batching rule divided by the entry count to reshape)."""
    conv = get_conv("l1")
    senders, receivers = make_edges(seed=12)
    graph = e3j.Graph.from_edges(senders, receivers, N)
    x, y, s = make_features("l1", len(senders), y_channels, seed=13)
    out = jax.vmap(lambda x: conv(x, y, s, graph))(np.zeros((0, *x.shape)))
    assert out.shape == (0, N, conv.irreps_out.dim, C)
    grads = jax.vmap(jax.grad(lambda x, y: jnp.sum(conv(x, y, s, graph) ** 2), (0, 1)), in_axes=(0, None))(
        np.zeros((0, *x.shape)), y
    )
    assert grads[0].shape == (0, *x.shape) and grads[1].shape == (0, *y.shape)
    empty = e3j.Graph.from_edges(np.zeros(0, int), np.zeros(0, int), 0)
    x0 = np.zeros((0, conv.irreps_x.dim, C))
    y0 = np.zeros((0, conv.irreps_y.dim, C) if y_channels else (0, conv.irreps_y.dim))
    s0 = np.zeros((0, conv.num_paths, C))
    jac = jax.jacrev(lambda x: conv(x, y0, s0, empty))(x0)
    assert jac.shape == (0, conv.irreps_out.dim, C, 0, conv.irreps_x.dim, C)


def test_vmap_over_graphs():
    case = "l1"
    conv = get_conv(case)
    s1, r1 = make_edges(seed=17)
    s2, r2 = make_edges(seed=18)
    # same E and N; the second has padding edges
    s2p, r2p, mask2, _, _ = with_padding(
        19, s2[:-3], r2[:-3], np.zeros((len(s2) - 3, 1)), np.zeros((len(s2) - 3, 1)), 3
    )
    g1 = e3j.Graph.from_edges(s1, r1, N)
    g2 = e3j.Graph.from_edges(s2p, r2p, N, edge_mask=mask2)
    graphs = jax.tree.map(lambda a, b: jnp.stack([a, b]), g1, g2)
    xs, ys, ss = stacked_inputs(case, 2, False, 20, len(s1))

    out = jax.vmap(conv)(xs, ys, ss, graphs)
    loop = np.stack([conv(xs[0], ys[0], ss[0], g1), conv(xs[1], ys[1], ss[1], g2)])
    np.testing.assert_allclose(out, loop, rtol=1e-14, atol=1e-14)
    # features shared, graphs mapped
    out = jax.vmap(conv, in_axes=(None, None, None, 0))(xs[0], ys[0], ss[0], graphs)
    loop = np.stack([conv(xs[0], ys[0], ss[0], g) for g in (g1, g2)])
    np.testing.assert_allclose(out, loop, rtol=1e-14, atol=1e-14)
    ref1 = conv_ref(case, s1, r1, N, xs[0], ys[0], ss[0])
    assert rel_err(out[0], ref1) <= 1e-12
    assert rel_err(out[1], out[0]) > 1e-3  # the two graphs really differ
    # per-graph gradients
    w = np.random.default_rng(21).normal(size=(N, conv.irreps_out.dim, C))

    def grad(x, y, s, g):
        return jax.grad(lambda x, y, s: jnp.sum(w * conv(x, y, s, g) ** 2), (0, 1, 2))(x, y, s)

    batched = jax.jit(jax.vmap(grad))(xs, ys, ss, graphs)
    for v, g in enumerate((g1, g2)):
        for a, b in zip(batched, grad(xs[v], ys[v], ss[v], g)):
            np.testing.assert_allclose(a[v], b, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("y_channels", [False, True])
def test_jit_equals_eager(y_channels):
    case = "l1"
    conv = get_conv(case)
    senders, receivers = make_edges(seed=21)
    graph = e3j.Graph.from_edges(senders, receivers, N)
    x, y, s = make_features(case, len(senders), y_channels, seed=22)
    eager = conv(x, y, s, graph)
    jitted = jax.jit(conv.__call__)(x, y, s, graph)
    np.testing.assert_allclose(jitted, eager, rtol=1e-14, atol=1e-14)
    assert rel_err(eager, conv_ref(case, senders, receivers, N, x, y, s)) <= 1e-12


def test_graph_built_inside_jit():
    case = "l1"
    conv = get_conv(case)
    senders, receivers = make_edges(seed=23)
    snd, rcv, mask, _, _ = with_padding(
        24, senders, receivers, np.zeros((len(senders), 1)), np.zeros((len(senders), 1)), 4
    )
    x, y, s = make_features(case, len(snd), False, seed=25)

    @jax.jit
    def f(x, y, s, snd, rcv, mask):
        return conv(x, y, s, e3j.Graph.from_edges(snd, rcv, N, edge_mask=mask))

    host = conv(x, y, s, e3j.Graph.from_edges(snd, rcv, N, edge_mask=mask))
    np.testing.assert_allclose(f(x, y, s, snd, rcv, mask), host, rtol=1e-14, atol=1e-14)
    assert rel_err(host, conv_ref(case, senders, receivers, N, x, y[mask], s[mask])) <= 1e-12


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_bitwise_deterministic(dtype):
    case = "l1"
    conv = get_conv(case)
    senders, receivers = make_edges(seed=0)  # shapes of test_values_and_vjp_match_e3nn[l1-*-True]
    graph = e3j.Graph.from_edges(senders, receivers, N)
    x, y, s = make_features(case, len(senders), True, seed=26, dtype=dtype)
    ct = np.random.default_rng(27).normal(size=(N, conv.irreps_out.dim, C)).astype(dtype)
    first = [np.asarray(a) for a in e3j_value_and_vjp(case, x, y, s, graph, ct)]
    for _ in range(3):
        again = e3j_value_and_vjp(case, jnp.asarray(x), jnp.asarray(y), jnp.asarray(s), graph, jnp.asarray(ct))
        for a, b in zip(first, again):
            assert np.array_equal(a, np.asarray(b))
    assert np.array_equal(np.asarray(conv(x, y, s, graph)), np.asarray(conv(x, y, s, graph)))


# -- chunked edge loop ---------------------------------------------------------------------------


@pytest.mark.parametrize("y_channels", [False, True])
def test_many_chunks_match_reference(monkeypatch, y_channels):
    """Edges spanning many chunks of the reference kernels' loop (chunk boundaries unaligned)."""
    case = "l1"
    conv = get_conv(case)
    num_nodes = 13 + y_channels  # shapes unique to this test: nothing compiled earlier is reused
    senders, receivers = make_edges(seed=28, num_random=113, num_nodes=num_nodes)
    E = len(senders)
    x, y, s = make_features(case, E, y_channels, seed=29, num_nodes=num_nodes)
    snd, rcv, mask, y_pad, s_pad = with_padding(30, senders, receivers, y, s, num_pad=9)
    ct = np.random.default_rng(31).normal(size=(num_nodes, conv.irreps_out.dim, C))

    monkeypatch.setattr(ref_conv, "_CHUNK_BYTES", 4096)
    chunk = ref_conv.chunk_size(len(snd), conv.irreps_out.dim * C, 8)
    assert chunk < E // 4 and E % chunk != 0, (chunk, E)  # several chunks, a partial last one

    graph = e3j.Graph.from_edges(snd, rcv, num_nodes, edge_mask=mask)
    f = jax.jit(partial(value_and_vjp, lambda x, y, s: conv(x, y, s, graph)))
    # the kernels really loop over chunks of `chunk` messages [chunk, Dout, C]
    assert f"tensor<{chunk}x{conv.irreps_out.dim}x{C}xf64>" in f.lower(x, y_pad, s_pad, ct).as_text()
    m, dx, dy, ds = f(x, y_pad, s_pad, ct)
    ref = ref_value_and_vjp(case, senders, receivers, x, num_nodes, y, s, ct)
    for name, a, r in zip(
        ("m", "dx", "dy", "ds"), (m, np.asarray(dx), np.asarray(dy)[mask], np.asarray(ds)[mask]), ref
    ):
        assert rel_err(a, r) <= 1e-12, name
    assert np.all(np.asarray(dy)[~mask] == 0) and np.all(np.asarray(ds)[~mask] == 0)


MIXED = e3j.MulIrConvolution("4x0e + 2x1o", "0e + 1o", filter="0e + 1o")


@pytest.mark.parametrize("route", ["array", "factored", "mixed", "mixed_factored"])
def test_chunks_are_sized_for_the_platform_lowered_for(monkeypatch, route):
    """The reference as an accelerator's fallback loops over chunks 128x a CPU's (256 MiB of
    messages against 2 MiB): every sweep, forward and backward, of every route sizes its chunks for
    the platform it is lowered for, in a program lowered for several platforms too."""
    conv = get_conv("l1")
    num_nodes = 11
    senders, receivers = make_edges(seed=41, num_random=300, num_nodes=num_nodes)
    E = len(senders)
    graph = e3j.Graph.from_edges(senders, receivers, num_nodes)
    rng = np.random.default_rng(42)
    y = jnp.asarray(rng.normal(size=(E, 4)))
    if route.startswith("mixed"):
        op, x, width = MIXED, rng.normal(size=(num_nodes, MIXED.irreps_x.dim)), MIXED.num_weights
    else:
        op, x, width = conv, rng.normal(size=(num_nodes, 4, C)), conv.num_paths * C
    if route.endswith("factored"):
        w = e3j.FactoredWeights(jnp.asarray(rng.normal(size=(E, 3))), jnp.asarray(rng.normal(size=(3, width))))
    else:
        w = jnp.asarray(rng.normal(size=(E, width) if route == "mixed" else (E, conv.num_paths, C)))

    def loss(x, y, w):
        return jnp.sum(jnp.sin(op(x, y, w, graph, backend="reference")))

    real, seen = ref_conv.chunk_size, []

    def recorded(num_edges, row_elements, itemsize, platform="cpu"):
        seen.append(platform)
        return real(num_edges, row_elements, itemsize, platform)

    monkeypatch.setattr(ref_conv, "chunk_size", recorded)
    monkeypatch.setattr(ref_conv, "_CHUNK_BYTES", 64 * conv.coo.dim_out * C)  # 8 edges on a CPU
    assert real(E, conv.coo.dim_out * C, 8) == 8 and real(E, conv.coo.dim_out * C, 8, "cuda") == E
    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    texts = {}
    for platforms in (("cpu",), ("cuda",), ("tpu",), ("cpu", "cuda")):
        seen.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the reference named on an accelerator
            texts[platforms] = grad.trace(jnp.asarray(x), y, w).lower(lowering_platforms=platforms).as_text()
        # a forward and a backward sweep per platform, each sized for its own
        assert sorted(set(seen)) == sorted(platforms) and all(seen.count(p) >= 2 for p in platforms), seen
    if route == "array":  # the chunk's [K, Dout, C] messages: 8 edges on the CPU, all E elsewhere
        chunk = {n: f"tensor<{n}x{conv.coo.dim_out}x{C}xf64>" for n in (8, E)}
        assert chunk[8] in texts[("cpu",)] and chunk[E] not in texts[("cpu",)]
        assert chunk[E] in texts[("cuda",)] and chunk[8] not in texts[("cuda",)]


def test_ops_run_under_disable_jit():
    """An eager op call compiles the primitive alone; under ``jax.disable_jit()`` that ``jit`` called
    the primitive's bind, whose eager rule is that call: a RecursionError. Values and gradients
    equal the compiled ones."""
    conv = e3j.Convolution("0e + 1o", "0e + 1o", filter="0e + 1o")
    tp = e3j.TensorProduct("0e + 1o", "0e + 1o", filter="0e + 1o")
    rng = np.random.default_rng(0)
    graph = e3j.Graph.from_edges(np.array([0, 1, 2, 2]), np.array([1, 2, 0, 1]), 3)
    x, y = jnp.asarray(rng.normal(size=(3, 4, 2))), jnp.asarray(rng.normal(size=(4, 4)))
    s = jnp.asarray(rng.normal(size=(4, conv.num_paths, 2)))

    def loss(x, y, s):
        return jnp.sum(jnp.sin(conv(x, y, s, graph))) + jnp.sum(jnp.sin(tp(x, y[:3])))

    want = jax.value_and_grad(loss, argnums=(0, 1, 2))(x, y, s)
    with jax.disable_jit():
        got = jax.value_and_grad(loss, argnums=(0, 1, 2))(x, y, s)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_linear_transpose_of_a_jvp_in_an_operand():
    """A JVP's tangent is linear in each primal it does not differentiate: ``jax.linear_transpose``
    of it transposes the linearized primitive in an operand (it refused: "transposed in its tangent
    operands only"). Against ``jax.vjp`` of the same function, which goes through the JVP rules."""
    conv = e3j.Convolution("0e + 1o", "0e + 1o", filter="0e + 1o")
    tp = e3j.TensorProduct("0e + 1o", "0e + 1o", filter="0e + 1o")
    rng = np.random.default_rng(1)
    graph = e3j.Graph.from_edges(np.array([0, 1, 2, 2, 0]), np.array([1, 2, 0, 1, 2]), 3)

    def r(*shape):
        return jnp.asarray(rng.normal(size=shape))

    x, tx, y, ty = r(3, 4, 2), r(3, 4, 2), r(5, 4), r(5, 4)
    s, ts, h, k = r(5, conv.num_paths, 2), r(5, conv.num_paths, 2), r(5, 3), r(3, conv.num_paths * 2)
    functions = [
        (lambda y: jax.jvp(lambda a: conv(a, y, s, graph), (x,), (tx,))[1], y),
        (lambda s: jax.jvp(lambda a, b: conv(a, b, s, graph), (x, y), (tx, ty))[1], s),
        (lambda x: jax.jvp(lambda c: conv(x, y, c, graph), (s,), (ts,))[1], x),
        (lambda h: jax.jvp(lambda a: conv(a, y, e3j.FactoredWeights(h, k), graph), (x,), (tx,))[1], h),
        (lambda y: jax.jvp(lambda a: tp(a, y), (x,), (tx,))[1], y[:3]),
    ]
    for n, (f, arg) in enumerate(functions):
        ct = r(*jax.eval_shape(f, arg).shape)
        want = jax.vjp(f, arg)[1](ct)[0]
        got = jax.linear_transpose(f, arg)(ct)[0]
        assert float(jnp.abs(want).max()) > 1e-3, n
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=str(n))
