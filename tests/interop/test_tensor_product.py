"""``e3j.interop.tensor_product`` against ``e3nn.tensor_product`` (float64, values and gradients)."""

from __future__ import annotations

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxpr_paths import paths_bound

import e3j
from e3j import interop
from e3j_core import MulIrrep


def _random(irreps, shape, seed):
    irreps = e3nn.Irreps(irreps)
    return e3nn.IrrepsArray(irreps, jax.random.normal(jax.random.key(seed), (*shape, irreps.dim), jnp.float64))


CASES = [
    ("4x0e + 4x1o", "0e + 1o + 2e", None),  # uniform channels, spherical-harmonics-like y
    ("4x0e + 2x1o + 6x2e", "1o + 2e + 3o", "0e + 1o + 2e"),  # mixed multiplicities
    ("2x1o + 4x0e + 2x1o", "1o + 0e", "1o + 1e"),  # unsorted x: e3nn regroups it first
    ("2x0e + 2x1o", "2x0e + 1o + 3x1e", None),  # y multiplicities > 1: a static output gather
    ("3x1e + 0x2o + 3x0o", "2e", None),  # odd channel count, a zero multiplicity
]


@pytest.mark.parametrize("irreps_x, irreps_y, filter_", CASES)
@pytest.mark.parametrize("regroup_output", [True, False])
def test_equals_e3nn(irreps_x, irreps_y, filter_, regroup_output):
    x, y = _random(irreps_x, (5,), 0), _random(irreps_y, (5,), 1)
    kw = dict(filter_ir_out=filter_, regroup_output=regroup_output)
    ref = jax.jit(lambda a, b: e3nn.tensor_product(a, b, **kw))(x, y)
    out = jax.jit(lambda a, b: interop.tensor_product(a, b, **kw))(x, y)
    assert out.irreps == ref.irreps
    np.testing.assert_allclose(out.array, ref.array, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("normalization", ["component", "norm", "none"])
def test_normalizations_and_broadcast_leading_shapes(normalization):
    x, y = _random("2x0e + 2x1o + 2x2e", (2, 1), 2), _random("0e + 1o", (1, 3), 3)
    ref = jax.jit(lambda a, b: e3nn.tensor_product(a, b, irrep_normalization=normalization))(x, y)
    out = jax.jit(lambda a, b: interop.tensor_product(a, b, irrep_normalization=normalization))(x, y)
    assert out.shape == ref.shape == (2, 3, ref.irreps.dim)
    np.testing.assert_allclose(out.array, ref.array, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("y_channels", [8, 1])
def test_channel_axis_layout_equals_e3nn(y_channels):
    """Allegro's product: both operands in e3nn's ``mul_to_axis`` layout ``[E, C, irreps]`` with
    multiplicities 1 (``input2`` also broadcast over the channels), value and gradients; e3j runs the
    rows as its channels (test_mul_ir.py)."""
    ix, iy = e3nn.Irreps("0e + 1o + 2e"), e3nn.Irreps("0o + 1o + 1e + 2e")
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(13, 8, ix.dim)), rng.normal(size=(13, y_channels, iy.dim))

    def product(tp):
        return lambda a, b: tp(e3nn.IrrepsArray(ix, a), e3nn.IrrepsArray(iy, b), filter_ir_out="0e + " + str(iy)).array

    want = product(e3nn.tensor_product)(a, b)
    np.testing.assert_allclose(product(interop.tensor_product)(a, b), want, rtol=1e-12, atol=1e-12)
    cot = rng.normal(size=want.shape)
    ours, theirs = product(interop.tensor_product), product(e3nn.tensor_product)
    got = jax.grad(lambda a, b: jnp.sum(ours(a, b) * cot), (0, 1))(a, b)
    expected = jax.grad(lambda a, b: jnp.sum(theirs(a, b) * cot), (0, 1))(a, b)
    for g, r in zip(got, expected):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


def test_gradients_equal_e3nn():
    x, y = _random("4x0e + 2x1o", (4,), 4), _random("2x0e + 1o", (4,), 5)
    cot = jax.random.normal(jax.random.key(6), e3nn.tensor_product(x, y).shape, jnp.float64)

    def loss(tp, a, b):
        return jnp.sum(tp(e3nn.IrrepsArray(x.irreps, a), e3nn.IrrepsArray(y.irreps, b)).array * cot)

    ours = jax.jit(jax.grad(lambda a, b: loss(interop.tensor_product, a, b), argnums=(0, 1)))(x.array, y.array)
    ref = jax.jit(jax.grad(lambda a, b: loss(e3nn.tensor_product, a, b), argnums=(0, 1)))(x.array, y.array)
    for o, r in zip(ours, ref):
        np.testing.assert_allclose(o, r, rtol=1e-12, atol=1e-12)


def test_y_multiplicities_join_as_a_permutation_in_every_derivative():
    """With ``y``'s multiplicities above 1 e3nn's output interleaves the paths' copies: the join is
    one permutation whose transpose is the inverse's gather (as slices, its backward was a pad and
    an add of the whole cotangent per slice: 0.17x e3nn-jax's speed on the CPU). Values, reverse and
    forward derivatives, the Hessian and vmap equal e3nn-jax's; no scatter in the backward."""
    x, y = _random("4x0e + 4x1o", (6,), 11), _random("2x0e + 2x1o", (6,), 12)

    def product(tp):
        return lambda a, b: tp(e3nn.IrrepsArray(x.irreps, a), e3nn.IrrepsArray(y.irreps, b)).array

    ours, theirs = product(interop.tensor_product), product(e3nn.tensor_product)
    a, b = x.array, y.array
    checks = {
        "grad": lambda f: jax.grad(lambda a, b: jnp.sum(jnp.sin(f(a, b))), argnums=(0, 1))(a, b),
        "jvp": lambda f: jax.jvp(f, (a, b), (jnp.cos(a), jnp.sin(b)))[1],
        "hessian": lambda f: jax.hessian(lambda a: jnp.sum(jnp.sin(f(a, b[:2]))))(a[:2]),
        "vmap": lambda f: jax.vmap(f, in_axes=(1, None), out_axes=1)(a.reshape(2, 3, -1), b[:2]),
    }
    for name, check in checks.items():
        for o, r in zip(jax.tree.leaves(check(ours)), jax.tree.leaves(check(theirs)), strict=True):
            np.testing.assert_allclose(o, r, rtol=1e-12, atol=1e-12, err_msg=name)
    backward = str(jax.make_jaxpr(jax.grad(lambda a: jnp.sum(jnp.sin(ours(a, b)))))(a))
    assert "e3j_permute" in backward and "scatter" not in backward


def test_many_paths_join_as_one_split():
    """Each path's rows of e3j's output become one copy-major block of e3nn's: cut by one ``split``
    per group, whose backward is one concatenation. Sliced path by path, the backward was a pad of
    the whole cotangent per path, all added (at 32 channels of ``0e..4e`` ⊗ ``0e..4e``, 85 paths,
    4.5x e3nn-jax's time for value and gradient on the CPU). The input's blocks are cut the same
    way. Here 3 copies of ``0e..3o`` ⊗ ``0e..3o`` (44 paths): gradients equal e3nn-jax's, no pad in
    the backward."""
    irreps = "0e + 1o + 2e + 3o"
    x, y = _random(" + ".join(f"3x{ir}" for ir in irreps.split(" + ")), (4,), 13), _random(irreps, (4,), 14)

    def product(tp):
        return lambda a, b: tp(e3nn.IrrepsArray(x.irreps, a), e3nn.IrrepsArray(y.irreps, b)).array

    def grad(f):
        return jax.grad(lambda a, b: jnp.sum(jnp.sin(f(a, b))), argnums=(0, 1))

    ours, theirs = product(interop.tensor_product), product(e3nn.tensor_product)
    for o, r in zip(jax.jit(grad(ours))(x.array, y.array), jax.jit(grad(theirs))(x.array, y.array), strict=True):
        np.testing.assert_allclose(o, r, rtol=1e-12, atol=1e-12)
    backward = jax.make_jaxpr(grad(ours))(x.array, y.array).jaxpr
    names = [e.primitive.name for e in backward.eqns]
    assert "split" in names and "pad" not in names, names


@pytest.mark.parametrize("regroup_output", [True, False])
def test_zero_flags_are_e3nns(regroup_output):
    """Blocks marked zero in the inputs (e3nn's ``zero_flags``, e.g. from ``e3nn.from_chunks`` with
    ``None``) mark the output's blocks as ``e3nn.tensor_product`` marks them, inside a trace too,
    where they are static and code may branch on them (``remove_zero_chunks``)."""
    kw = dict(filter_ir_out="0e + 1o + 2e + 3o + 4e", regroup_output=regroup_output)

    def marked(a, b):
        # one of the 1o blocks and the 2e block zero in x (regrouped, 1o is not), the 0e block in y:
        # 4e comes from 2e x 2e alone
        a = e3nn.IrrepsArray("4x0e + 2x1o + 2x2e + 2x1o", a)
        b = e3nn.IrrepsArray("0e + 1o + 2e", b)
        a = e3nn.from_chunks(a.irreps, [a.chunks[0], None, None, a.chunks[3]], a.shape[:-1])
        return a, e3nn.from_chunks(b.irreps, [None, b.chunks[1], b.chunks[2]], b.shape[:-1])

    a, b = _random("4x0e + 2x1o + 2x2e + 2x1o", (3,), 9).array, _random("0e + 1o + 2e", (3,), 10).array
    ref, out = e3nn.tensor_product(*marked(a, b), **kw), interop.tensor_product(*marked(a, b), **kw)
    assert any(ref.zero_flags) and not all(ref.zero_flags)
    assert out.irreps == ref.irreps and out.zero_flags == ref.zero_flags
    np.testing.assert_allclose(out.array, ref.array, rtol=1e-12, atol=1e-13)
    ours, theirs = (
        jax.jit(lambda a, b, f=f: f(*marked(a, b), **kw).remove_zero_chunks().array)(a, b)
        for f in (interop.tensor_product, e3nn.tensor_product)
    )
    assert ours.shape == theirs.shape and ours.shape[-1] < ref.shape[-1]
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-13)
    # a marked block is zero whatever its data holds: e3nn never reads it (gradients too: none flows)
    data = jnp.full((3, 1 + 3 * 3), jnp.nan).at[:, 0].set(2.0)
    x, y = e3nn.IrrepsArray("0e + 3x1o", data, zero_flags=(False, True)), _random("1o", (3,), 13)
    for f in (interop.tensor_product, e3nn.tensor_product):
        assert f(x, y, **kw).zero_flags == e3nn.tensor_product(x, y, **kw).zero_flags
    np.testing.assert_allclose(
        interop.tensor_product(x, y, **kw).array, e3nn.tensor_product(x, y, **kw).array, rtol=1e-12, atol=1e-13
    )
    # unmarked inputs: nothing marked, as in e3nn
    plain = interop.tensor_product(_random(ref.irreps, (3,), 11), _random("0e + 1o", (3,), 12), **kw)
    assert plain.zero_flags == (False,) * len(plain.irreps)


@pytest.mark.parametrize("regroup_output", [True, False])
@pytest.mark.parametrize(
    "zero_x, zero_y, paths",
    [
        ((False, True, True), (False, False, False), 3),  # 0e x {0e, 1o, 2e}: 3 of the 11 products
        ((True, False, True), (True, False, False), 3),  # 1o x 1o: 0e, 2e; 1o x 2e: 1o
        ((True, True, True), (False, False, False), 0),  # nothing left: zeros, all marked
    ],
)
def test_marked_blocks_are_skipped_as_e3nn_skips_them(regroup_output, zero_x, zero_y, paths):
    """e3nn-jax skips every product that reads a block marked zero: so does the drop-in (fewer paths
    bound), with e3nn's values, gradients and marks (float64)."""
    irreps_x, irreps_y = "4x0e + 2x1o + 2x2e", "0e + 1o + 2e"
    kw = dict(filter_ir_out="0e + 1o + 2e", regroup_output=regroup_output)

    def marked(a, irreps, marks):
        a = e3nn.IrrepsArray(irreps, a)
        return e3nn.from_chunks(a.irreps, [None if z else c for c, z in zip(a.chunks, marks)], a.shape[:-1], a.dtype)

    def loss(f):
        return lambda a, b: jnp.sum(jnp.sin(f(marked(a, irreps_x, zero_x), marked(b, irreps_y, zero_y), **kw).array))

    a, b = _random(irreps_x, (5,), 21).array, _random(irreps_y, (5,), 22).array
    got, ref = loss(interop.tensor_product), loss(e3nn.tensor_product)
    np.testing.assert_allclose(jax.jit(got)(a, b), jax.jit(ref)(a, b), rtol=1e-12, atol=1e-13)
    for g, r in zip(jax.grad(got, (0, 1))(a, b), jax.grad(ref, (0, 1))(a, b)):
        np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-13)
    out = interop.tensor_product(marked(a, irreps_x, zero_x), marked(b, irreps_y, zero_y), **kw)
    theirs = e3nn.tensor_product(marked(a, irreps_x, zero_x), marked(b, irreps_y, zero_y), **kw)
    assert out.irreps == theirs.irreps and out.zero_flags == theirs.zero_flags
    run = paths_bound(lambda a, b: interop.tensor_product(marked(a, irreps_x, zero_x), marked(b, irreps_y, zero_y),
                                                          **kw).array, a, b)  # fmt: skip
    assert run == paths
    assert (
        paths_bound(
            lambda a, b: (
                interop.tensor_product(marked(a, irreps_x, (False,) * 3), marked(b, irreps_y, (False,) * 3), **kw).array
            ),
            a,
            b,
        )
        == 11
    )


def test_marked_blocks_leaving_no_path_give_e3nns_zeros():
    """The unmarked blocks reach no wanted output (``1o`` marked, ``0e ⊗ 1o`` filtered out), where the
    marked ones would: e3nn-jax's zeros, irreps and marks, not a refusal of a pathless product."""
    x = e3nn.from_chunks("1o + 0e", [None, jnp.ones((2, 1, 1))], (2,), jnp.float64)
    y = _random("1o", (2,), 9)
    out, ref = interop.tensor_product(x, y, filter_ir_out="0e"), e3nn.tensor_product(x, y, filter_ir_out="0e")
    assert out.irreps == ref.irreps and out.zero_flags == ref.zero_flags and out.shape == ref.shape == (2, 1)
    np.testing.assert_array_equal(out.array, ref.array)


def test_no_path_gives_e3nn_empty_output():
    x, y = _random("2x0e", (3,), 7), _random("1o", (3,), 8)
    out = interop.tensor_product(x, y, filter_ir_out="0e")
    ref = e3nn.tensor_product(x, y, filter_ir_out="0e")
    assert out.irreps == ref.irreps and out.shape == ref.shape == (3, 0)


@pytest.mark.parametrize(
    ("irreps1", "irreps2", "kwargs"),
    [
        ("2x1e + 2e", "2e", {"filter_ir_out": "0e + 1e + 2e"}),
        (e3nn.Irreps("1o + 2x0e"), e3nn.Irreps("1o"), {}),
        ("1o + 1o", "1e", {"regroup_output": False}),
    ],
)
def test_irreps_without_arrays_give_the_output_irreps_as_e3nn(irreps1, irreps2, kwargs):
    want = e3nn.tensor_product(irreps1, irreps2, **kwargs)
    got = interop.tensor_product(irreps1, irreps2, **kwargs)
    assert isinstance(got, e3nn.Irreps) and got == want


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ((e3j.Irrep("1o"), e3j.Irrep("1o")), (e3nn.Irreps("1o"), e3nn.Irreps("1o"))),
        ((e3j.Irrep("2e"), e3j.Irreps("1o + 0e")), (e3nn.Irreps("2e"), e3nn.Irreps("1o + 0e"))),
        ((MulIrrep(2, e3j.Irrep("1o")), "1e"), (e3nn.Irreps("2x1o"), "1e")),
    ],
)
def test_e3j_irreps_without_arrays_give_the_output_irreps(ours, theirs):
    # an e3j Irrep is the pair (l, p): it must not be read as a two-element array
    got = interop.tensor_product(*ours)
    assert isinstance(got, e3nn.Irreps) and got == e3nn.tensor_product(*theirs)
