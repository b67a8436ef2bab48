"""e3j.TensorProduct against e3nn-jax: values, derivatives of every order, vmap, jit, determinism.

The oracle is ``e3nn_jax.tensor_product`` applied channel by channel (``vmap`` over the last axis), in
float64. Compilation of the unrolled reference kernels dominates the runtime on CPU, so the cases
are chosen to cover lmax 1-4, multiplicities, unsorted irreps and filters with few COO records.
"""

from __future__ import annotations

from functools import cache, partial

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import e3j

# (irreps_x, irreps_y, filter, y_is_sh): lmax 1, 2, 3, 4, mixed multiplicities/parities, unsorted
CASES = {
    "l1": ("0e + 1o", "0e + 1o", None, True),
    "l2": ("0e + 1o + 2e", "0e + 1o + 2e", "0e + 1o + 2e", True),
    "l3": ("0e + 1o + 2e + 3o", "0e + 1o + 2e", "0e + 1o", True),
    "l4": ("0e + 1o + 2e + 3o + 4e", "0e + 1o", "1o + 3o + 4e", True),
    "mixed": ("2x0e + 2x0o + 1o + 1e + 2e + 2o", "0e + 1o + 2e", "0e + 1o + 2e", True),
    "unsorted": ("1o + 2x0e + 1o", "1o + 0e", None, False),
}

B, C = 3, 2


def rel_err(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    assert a.shape == ref.shape, (a.shape, ref.shape)
    scale = np.max(np.abs(ref))
    assert scale > 0, "degenerate reference (all zeros): the comparison would be vacuous"
    return float(np.max(np.abs(a - ref)) / scale)


def e3nn_tp(irreps_x, irreps_y, filter, x, y, normalization="component", regroup_output=True):
    """e3nn-jax's tensor product per channel: ``x [B, Dx, C]``, ``y [B, Dy]`` or ``[B, Dy, C]``."""

    def one(xc, yc):
        return e3nn.tensor_product(
            e3nn.IrrepsArray(irreps_x, xc),
            e3nn.IrrepsArray(irreps_y, yc),
            filter_ir_out=filter,
            irrep_normalization=normalization,
            regroup_output=regroup_output,
        ).array

    return jax.vmap(one, in_axes=(-1, -1 if y.ndim == 3 else None), out_axes=-1)(x, y)


def make_inputs(case, y_channels, seed=0, batch=B, channels=C):
    irreps_x, irreps_y, _, sh = CASES[case]
    rng = np.random.default_rng(seed)
    dx, dy = e3j.Irreps(irreps_x).dim, e3j.Irreps(irreps_y).dim
    x = rng.normal(size=(batch, dx, channels))
    if sh:
        shape = (batch, channels, 3) if y_channels else (batch, 3)
        y = np.asarray(e3j.spherical_harmonics(irreps_y, jnp.asarray(rng.normal(size=shape)), normalize=True))
        if y_channels:
            y = np.moveaxis(y, 1, 2)  # [B, Dy, C]
    else:
        y = rng.normal(size=(batch, dy, channels) if y_channels else (batch, dy))
    return x, y


def value_and_vjp(f, x, y, ct):
    z, pull = jax.vjp(f, x, y)
    return (z, *pull(ct))


@cache
def get_tp(case, **kwargs) -> e3j.TensorProduct:
    """One instance per case, so that jitted functions keyed on it compile once per module."""
    irreps_x, irreps_y, filter, _ = CASES[case]
    return e3j.TensorProduct(irreps_x, irreps_y, filter, **kwargs)


@cache
def get_ref(case, **kwargs):
    irreps_x, irreps_y, filter, _ = CASES[case]
    return partial(e3nn_tp, irreps_x, irreps_y, filter, **kwargs)


# compiled once per (op, shapes, dtypes) for the whole module
jit_value_and_vjp = jax.jit(value_and_vjp, static_argnums=0)


# -- structure ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_irreps_out_and_path_slices(case):
    irreps_x, irreps_y, filter, _ = CASES[case]
    tp = get_tp(case)
    ref = e3nn.tensor_product(e3nn.Irreps(irreps_x), e3nn.Irreps(irreps_y), filter_ir_out=filter)
    assert str(tp.irreps_out) == str(ref)
    assert tp.irreps_out.dim == ref.dim
    # paths: contiguous, non-overlapping 2l+1 blocks covering every output row, in order
    dims = [ir.dim for mul, ir in tp.irreps_out for _ in range(mul)]
    assert tp.num_paths == len(dims) == len(tp.path_slices)
    start = 0
    for p, (sl, d) in enumerate(zip(tp.path_slices, dims)):
        assert (sl.start, sl.stop) == (start, start + d)
        assert np.all(np.asarray(tp.coo.i3)[sl] == p)
        start += d
    assert start == tp.irreps_out.dim


@pytest.mark.parametrize("case", ["unsorted", "mixed"])
def test_path_metadata_matches_e3nn_blocks(case):
    """Only the paths fed by input blocks (x_start, y_start) light up in e3nn's output."""
    tp = get_tp(case)
    ref = get_ref(case)
    rng = np.random.default_rng(2)
    blocks = sorted({(p.x_start, p.ir_x.dim, p.y_start, p.ir_y.dim) for p in tp.paths})
    # one batch row per (x block, y block) pair, everything else zero
    x = np.zeros((len(blocks), tp.coo.dim_x, 1))
    y = np.zeros((len(blocks), tp.coo.dim_y))
    expected = np.zeros((len(blocks), tp.irreps_out.dim), bool)
    for b, (xs, xd, ys, yd) in enumerate(blocks):
        x[b, xs : xs + xd, 0] = rng.normal(size=xd)
        y[b, ys : ys + yd] = rng.normal(size=yd)
        for p, sl in zip(tp.paths, tp.path_slices):
            if (p.x_start, p.y_start) == (xs, ys):
                expected[b, sl] = True
    nonzero = np.abs(np.asarray(jax.jit(ref)(x, y))[:, :, 0]) > 1e-12
    np.testing.assert_array_equal(nonzero, expected)
    assert np.all(expected.sum(0) == 1)  # every output row belongs to exactly one block pair


# -- values and first derivatives vs e3nn-jax ----------------------------------------------------

# float64 for every case, y broadcast and channel-wise (alternating on the costly ones); float32 on
# a subset. Compile time of the unrolled kernels, not running time, is what limits this list.
VALUE_PARAMS = [
    ("l1", "float64", False),
    ("l1", "float64", True),
    ("l2", "float64", False),
    ("l2", "float64", True),
    ("l3", "float64", True),
    ("l4", "float64", True),
    ("mixed", "float64", False),
    ("unsorted", "float64", False),
    ("unsorted", "float64", True),
    ("l1", "float32", False),
    ("l2", "float32", True),
    ("l3", "float32", False),
    ("l4", "float32", False),
    ("mixed", "float32", True),
]


@pytest.mark.parametrize("case,dtype,y_channels", VALUE_PARAMS)
def test_values_and_vjp_match_e3nn(case, dtype, y_channels):
    tp = get_tp(case)
    x, y = make_inputs(case, y_channels)
    ct = np.random.default_rng(1).normal(size=(B, tp.irreps_out.dim, C))  # a random linear functional
    # the float32 run sees the float32-rounded inputs; the float64 oracle sees the same numbers
    x, y, ct = (a.astype(dtype) for a in (x, y, ct))
    z, dx, dy = jit_value_and_vjp(tp, x, y, ct)
    assert z.dtype == dx.dtype == dy.dtype == jnp.dtype(dtype)
    assert z.shape == (B, tp.irreps_out.dim, C) and dx.shape == x.shape and dy.shape == y.shape

    x64, y64, ct64 = (a.astype(np.float64) for a in (x, y, ct))
    # one oracle compilation per case: a broadcast y is a channel-wise y repeated over channels, and
    # its cotangent is the channel-wise cotangent summed over channels
    y_rep = y64 if y_channels else np.repeat(y64[:, :, None], C, axis=2)
    z_ref, dx_ref, dy_ref = jit_value_and_vjp(get_ref(case), x64, y_rep, ct64)
    if not y_channels:
        dy_ref = dy_ref.sum(-1)
    tol = 1e-12 if dtype == "float64" else 1e-6
    for name, a, r in (("z", z, z_ref), ("dx", dx, dx_ref), ("dy", dy, dy_ref)):
        assert rel_err(a, r) <= tol, (name, rel_err(a, r))


def test_grad_of_linear_functional_matches_e3nn():
    """``jax.grad`` of a random linear functional (float64, y channel-wise)."""
    x, y = make_inputs("l1", True, seed=3)
    w = np.random.default_rng(4).normal(size=(B, get_tp("l1").irreps_out.dim, C))

    @partial(jax.jit, static_argnums=0)
    def grad(f, x, y):
        return jax.grad(lambda x, y: jnp.sum(w * f(x, y)), (0, 1))(x, y)

    g, g_ref = grad(get_tp("l1"), x, y), grad(get_ref("l1"), x, y)
    for a, r in zip(g, g_ref):
        assert rel_err(a, r) <= 1e-12


@pytest.mark.parametrize("case,y_channels", [("l2", False), ("unsorted", True)])
def test_jvp_matches_e3nn(case, y_channels):
    x, y = make_inputs(case, y_channels, seed=5)
    rng = np.random.default_rng(6)
    tx, ty = rng.normal(size=x.shape), rng.normal(size=y.shape)
    jvp = jax.jit(jax.jvp, static_argnums=0)
    z, dz = jvp(get_tp(case), (x, y), (tx, ty))
    z_ref, dz_ref = jvp(get_ref(case), (x, y), (tx, ty))
    assert rel_err(z, z_ref) <= 1e-12
    assert rel_err(dz, dz_ref) <= 1e-12


# -- higher derivatives --------------------------------------------------------------------------


@pytest.mark.parametrize("case,y_channels", [("l1", False), ("unsorted", True)])
def test_check_grads_order2(case, y_channels):
    x, y = make_inputs(case, y_channels, seed=8, batch=2, channels=2)
    # eager: every primitive compiles once and is reused across check_grads' many traces
    check_grads(get_tp(case), (x, y), order=2, modes=("fwd", "rev"), atol=1e-7, rtol=1e-7)


def test_check_grads_detects_a_wrong_derivative():
    """The checker itself can fail: a function with a 1% wrong custom JVP is caught."""

    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    f.defjvp(lambda primals, tangents: (jnp.sin(primals[0]), 1.01 * jnp.cos(primals[0]) * tangents[0]))
    with pytest.raises(AssertionError):
        check_grads(f, (np.linspace(0.1, 1.0, 5),), order=1, modes=("fwd",), atol=1e-7, rtol=1e-7)


def test_hessian_matches_e3nn():
    tp = get_tp("l1")
    x, y = make_inputs("l1", False, seed=9, batch=2, channels=2)  # broadcast y: its rows sum channels
    w = np.random.default_rng(10).normal(size=(2, tp.irreps_out.dim, 2))

    def hessian(f, x, y):
        def energy(x, y):  # not multilinear: a non-trivial Hessian in x, y and across them
            z = f(x, y)
            return jnp.sum(w * z * z) + jnp.sum(jnp.sin(z))

        return jax.hessian(energy, (0, 1))(x, y)

    # e3j eager (its primitives are cached from check_grads), the oracle jitted (eager e3nn is slow)
    h, h_ref = hessian(tp, x, y), jax.jit(partial(hessian, get_ref("l1")))(x, y)
    for i in range(2):
        for j in range(2):
            assert rel_err(h[i][j], h_ref[i][j]) <= 1e-12, (i, j)
    assert np.max(np.abs(np.asarray(h[0][0]))) > 1e-3  # the xx block is not trivially zero
    np.testing.assert_allclose(
        np.asarray(h[0][1]).reshape(x.size, y.size), np.asarray(h[1][0]).reshape(y.size, x.size).T, rtol=0, atol=1e-12
    )


def test_third_derivatives_match_e3nn():
    """Forward over forward over reverse in one operand: the JVP of the linear rule ``L`` with a
    symbolic zero tangent (it crashed on JAX 0.11.2 before), and the mixed x, y case."""
    tp = get_tp("l1")
    x, y = make_inputs("l1", False, seed=12, batch=1, channels=1)

    def third(f, x, y):
        def energy(x, y):
            return jnp.sum(f(x, y) ** 4)

        return jax.jacfwd(jax.jacfwd(jax.grad(energy)))(x, y), jax.jacfwd(jax.jacfwd(jax.grad(energy), 1))(x, y)

    got, want = third(tp, x, y), jax.jit(partial(third, get_ref("l1")))(x, y)
    for g, r in zip(got, want):
        assert np.max(np.abs(np.asarray(r))) > 1e-3 and rel_err(g, r) <= 1e-12


# -- transformations -----------------------------------------------------------------------------


@pytest.mark.parametrize("y_channels", [False, True])
@pytest.mark.parametrize("mapped", ["both", "x", "y"])
def test_vmap_equals_loop(mapped, y_channels):
    tp = get_tp("l1")
    V = 3
    xs, ys = (np.stack(a) for a in zip(*(make_inputs("l1", y_channels, seed=20 + v) for v in range(V))))
    x_arg = xs if mapped in ("both", "x") else xs[0]
    y_arg = ys if mapped in ("both", "y") else ys[0]
    in_axes = (0 if x_arg is xs else None, 0 if y_arg is ys else None)
    out = jax.vmap(tp, in_axes=in_axes)(x_arg, y_arg)

    def pick(a, axis, v):
        return a[v] if axis == 0 else a

    pairs = [(pick(x_arg, in_axes[0], v), pick(y_arg, in_axes[1], v)) for v in range(V)]
    loop = np.stack([tp(a, b) for a, b in pairs])
    assert out.shape == loop.shape == (V, B, tp.irreps_out.dim, C)
    np.testing.assert_allclose(out, loop, rtol=1e-14, atol=1e-14)
    ref = np.stack([get_ref("l1")(a, b) for a, b in pairs])  # and the loop itself is right
    assert rel_err(out, ref) <= 1e-12


def test_vmap_over_no_entries_and_jacobians_of_an_empty_batch():
    """A vmap over 0 entries is empty (as JAX's own operations give); jacfwd and jacrev of an empty
    batch vmap over 0 basis tangents (the batching rule divided by the entry count to reshape)."""
    tp = e3j.TensorProduct("0e + 1o", "0e + 1o")
    y = jnp.ones((3, 4))
    assert jax.vmap(lambda x: tp(x, y))(jnp.ones((0, 3, 4, 8))).shape == (0, 3, 16, 8)
    x0, y0 = jnp.ones((0, 4, 2)), jnp.ones((0, 4))
    for jac in (jax.jacfwd, jax.jacrev):
        assert jac(lambda x: tp(x, y0))(x0).shape == (0, 16, 2, 0, 4, 2)


@pytest.mark.parametrize("y_channels", [False, True])
def test_vmap_of_grad_equals_loop(y_channels):
    """Per-example gradients: vmap of the linearized and transposed primitives."""
    tp = get_tp("l1")
    V = 3
    xs, ys = (np.stack(a) for a in zip(*(make_inputs("l1", y_channels, seed=30 + v) for v in range(V))))
    w = np.random.default_rng(31).normal(size=(B, tp.irreps_out.dim, C))
    grad = jax.jit(jax.grad(lambda x, y: jnp.sum(w * tp(x, y) ** 2), (0, 1)))
    for in_axes in ((0, 0), (0, None), (None, 0)):
        x_arg = xs if in_axes[0] == 0 else xs[0]
        y_arg = ys if in_axes[1] == 0 else ys[0]
        gx, gy = jax.vmap(grad, in_axes=in_axes)(x_arg, y_arg)
        for v in range(V):
            lx, ly = grad(x_arg[v] if in_axes[0] == 0 else x_arg, y_arg[v] if in_axes[1] == 0 else y_arg)
            # a shared (unmapped) y still gets one gradient per vmap entry, never their mix
            np.testing.assert_allclose(gx[v], lx, rtol=1e-13, atol=1e-13)
            np.testing.assert_allclose(gy[v], ly, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("y_channels", [False, True])
def test_jit_equals_eager(y_channels):
    tp = get_tp("l1")
    x, y = make_inputs("l1", y_channels, seed=11)
    eager = tp(x, y)
    jitted = jax.jit(tp.__call__)(x, y)
    np.testing.assert_allclose(jitted, eager, rtol=1e-14, atol=1e-14)
    assert rel_err(eager, jax.jit(get_ref("l1"))(x, y)) <= 1e-12


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_bitwise_deterministic(dtype):
    tp = get_tp("l2")
    # same shapes and dtypes as test_values_and_vjp_match_e3nn[l2-*-True]: reuses its compilation
    x, y = (a.astype(dtype) for a in make_inputs("l2", True, seed=12))
    ct = np.random.default_rng(13).normal(size=(B, tp.irreps_out.dim, C)).astype(dtype)
    first = [np.asarray(a) for a in jit_value_and_vjp(tp, x, y, ct)]
    for _ in range(3):
        again = jit_value_and_vjp(tp, jnp.asarray(x), jnp.asarray(y), jnp.asarray(ct))
        for a, b in zip(first, again):
            assert np.array_equal(a, np.asarray(b))
    x2, y2 = make_inputs("l2", False, seed=12)
    assert np.array_equal(np.asarray(tp(x2, y2)), np.asarray(tp(x2, y2)))


@pytest.mark.parametrize("normalization", ["norm", "none"])
def test_normalization_matches_e3nn(normalization):
    tp = get_tp("unsorted", normalization=normalization)
    x, y = make_inputs("unsorted", False, seed=14)
    z = tp(x, y)
    z_ref = get_ref("unsorted", normalization=normalization)(x, y)
    assert rel_err(z, z_ref) <= 1e-12
    # the normalizations really differ, so ignoring the option could not pass
    assert rel_err(get_ref("unsorted")(x, y), z_ref) > 1e-3


def test_regroup_output_false_matches_e3nn():
    irreps_x, irreps_y, _, _ = CASES["unsorted"]
    tp = get_tp("unsorted", regroup_output=False)
    ref_irreps = e3nn.tensor_product(e3nn.Irreps(irreps_x), e3nn.Irreps(irreps_y), regroup_output=False)
    assert str(tp.irreps_out) == str(ref_irreps)
    assert str(tp.irreps_out) != str(get_tp("unsorted").irreps_out)
    x, y = make_inputs("unsorted", True, seed=15)
    assert rel_err(tp(x, y), get_ref("unsorted", regroup_output=False)(x, y)) <= 1e-12


def test_broadcast_y_equals_replicated_channels():
    tp = get_tp("l1")
    x, y = make_inputs("l1", False, seed=16)
    y_rep = np.repeat(y[:, :, None], C, axis=2)
    np.testing.assert_allclose(tp(x, y), tp(x, y_rep), rtol=1e-14, atol=1e-14)
