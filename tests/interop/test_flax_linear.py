"""``e3j.flax.Linear`` has ``e3nn.flax.Linear``'s parameters and computes the same function.

Oracle: e3nn-jax's Flax ``Linear`` on the flat (``mul_ir``) layout of the same features: same
parameter tree from the same key, and e3nn's parameters applied by e3j give e3nn's output.
"""

from __future__ import annotations

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import e3j
from e3j.flax import Linear


@pytest.mark.parametrize(
    "irreps_in, c_in, irreps_out, c_out, force, indexed, biases",
    [
        ("0e + 1o", 8, "2x0e + 1o + 2e", 4, False, False, False),  # 2e absent from the input: dropped
        ("0e + 1o", 8, "2x0e + 1o + 2e", 4, False, True, False),  # species-indexed
        ("1o + 2x0e + 1o", 3, "0e + 2x1o", 5, False, True, False),  # unsorted input: e3nn regroups it
        ("0e + 1o", 4, "0e + 1o + 1e", 4, True, False, False),  # force_irreps_out: zeros for 1e
        ("0e + 1o", 3, "2x0e + 1o + 0o", 4, False, False, True),  # biases on 0e only (0o absent)
        ("1o + 0o", 3, "1o + 0e + 0o", 2, True, True, True),  # indexed biases; the 0e output is bias alone
    ],
)
def test_same_parameters_and_outputs_as_e3nn(irreps_in, c_in, irreps_out, c_out, force, indexed, biases):
    irreps_in, irreps_out = e3j.Irreps(irreps_in), e3j.Irreps(irreps_out)
    x = jax.random.normal(jax.random.key(0), (6, irreps_in.dim, c_in), jnp.float64)
    flat = e3nn.IrrepsArray(str(e3j.mul_ir_irreps(irreps_in, c_in)), e3j.to_mul_ir(x, irreps_in))
    species = jnp.array([0, 2, 1, 1, 0, 2])
    kw = dict(num_indexed_weights=3 if indexed else None, force_irreps_out=force, biases=biases)
    theirs = e3nn.flax.Linear(str(e3j.mul_ir_irreps(irreps_out, c_out)), **kw)
    ours = Linear(irreps_out, channels_out=c_out, irreps_in=irreps_in, **kw)
    args_theirs = (species, flat) if indexed else (flat,)
    args_ours = (species, x) if indexed else (x,)
    key = jax.random.key(1)
    p_theirs = theirs.init(key, *args_theirs)
    p_ours = ours.init(key, *args_ours)
    assert jax.tree.structure(p_ours) == jax.tree.structure(p_theirs)
    jax.tree.map(np.testing.assert_array_equal, p_ours, p_theirs)  # same names, shapes, draws
    assert any(k.startswith("b[") for k in p_theirs["params"]) == biases
    # perturb e3nn's parameters so the check does not rest on the shared initialization
    p = jax.tree.map(lambda a: a + 0.1 * jax.random.normal(jax.random.key(2), a.shape, a.dtype), p_theirs)
    ref = theirs.apply(p, *args_theirs)
    out = ours.apply(p, *args_ours)
    out_irreps = _out_irreps(irreps_in, irreps_out, force)
    assert ours.output_irreps() == out_irreps
    assert e3j.mul_ir_irreps(out_irreps, c_out) == ref.irreps
    np.testing.assert_allclose(e3j.to_mul_ir(out, out_irreps), ref.array, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "irreps_in, irreps_out, indexed, biases",
    [
        ("0e + 1o", "0e + 1o + 2e", False, False),  # one copy per channel: both numberings agree
        ("2x0e + 1o", "3x0e + 1o", False, True),  # several: e3nn's channel-major copies
        ("1o + 2x0e + 0e", "2x1o + 3x0e", True, True),  # unsorted, merged by e3nn's regroup; indexed
    ],
)
def test_channel_axis_reads_e3nn_channel_out_checkpoints(irreps_in, irreps_out, indexed, biases):
    """``e3nn.flax.Linear(irreps_out, channel_out=C)`` on ``[N, C, irreps]`` features: the same
    parameters give the same function with ``channel_axis=True`` on the swapped array."""
    c_in, c_out = 3, 2
    x = e3nn.IrrepsArray(irreps_in, jax.random.normal(jax.random.key(0), (5, c_in, e3nn.Irreps(irreps_in).dim)))
    species = jnp.array([0, 1, 2, 0, 1])
    kw = dict(num_indexed_weights=3 if indexed else None, biases=biases)
    theirs = e3nn.flax.Linear(irreps_out, channel_out=c_out, **kw)
    ours = Linear(irreps_out, c_out, irreps_in, channel_axis=True, **kw)
    x_ours = jnp.swapaxes(x.array, -1, -2)
    args_theirs, args_ours = ((species, x), (species, x_ours)) if indexed else ((x,), (x_ours,))
    p = theirs.init(jax.random.key(1), *args_theirs)
    assert jax.tree.structure(ours.init(jax.random.key(1), *args_ours)) == jax.tree.structure(p)
    p = jax.tree.map(lambda a: a + jax.random.normal(jax.random.key(2), a.shape, a.dtype), p)
    ref = theirs.apply(p, *args_theirs)
    assert ours.output_irreps() == ref.irreps
    out = jnp.swapaxes(ours.apply(p, *args_ours), -1, -2)
    np.testing.assert_allclose(out, ref.array, rtol=1e-12, atol=1e-12)
    if "2x" in irreps_in:  # the flat numbering is another function of the same parameters
        flat = Linear(irreps_out, c_out, irreps_in, **kw).apply(p, *args_ours)
        assert not np.allclose(jnp.swapaxes(flat, -1, -2), ref.array, atol=1e-3)


def test_index_and_x_broadcast_together_as_in_e3nn():
    x = jax.random.normal(jax.random.key(0), (4, 4, 2))  # "0e + 1o", 2 channels
    flat = e3nn.IrrepsArray(str(e3j.mul_ir_irreps("0e + 1o", 2)), e3j.to_mul_ir(x, "0e + 1o"))
    theirs = e3nn.flax.Linear(str(e3j.mul_ir_irreps("0e + 1o", 3)), num_indexed_weights=2)
    ours = Linear("0e + 1o", 3, "0e + 1o", num_indexed_weights=2)
    p = theirs.init(jax.random.key(1), jnp.array(1), flat)
    ref = theirs.apply(p, jnp.array(1), flat)
    np.testing.assert_allclose(e3j.to_mul_ir(ours.apply(p, jnp.array(1), x), "0e + 1o"), ref.array, rtol=1e-12)
    np.testing.assert_array_equal(ours.apply(p, jnp.array(1), x), ours.apply(p, jnp.ones(4, int), x))
    # one x for several indices: e3nn broadcasts the input too
    species = jnp.array([[0], [1], [1]])  # [3, 1] with x's [4] -> [3, 4]
    ref = theirs.apply(p, species, flat)
    out = ours.apply(p, species, x)
    assert out.shape == (3, 4, 4, 3)
    np.testing.assert_allclose(e3j.to_mul_ir(out, "0e + 1o"), ref.array, rtol=1e-12)
    with pytest.raises(ValueError, match=r"index must broadcast with x's batch \[4\], got \(3,\)"):
        ours.apply(p, jnp.ones(3, int), x)


def test_host_index_values_out_of_range_are_refused():
    """A host index outside ``[-S, S)`` gave the last row's result (JAX's indexing clamps it, as
    e3nn-jax's does): refused now. Negative ones count from the end, as in e3nn-jax; traced ones
    cannot be read and keep JAX's indexing."""
    x = jax.random.normal(jax.random.key(0), (2, 4, 2))
    lin = Linear("0e + 1o", 3, "0e + 1o", num_indexed_weights=3)
    p = lin.init(jax.random.key(1), np.array([0, 1]), x)
    np.testing.assert_array_equal(lin.apply(p, np.array([-1, -3]), x), lin.apply(p, np.array([2, 0]), x))
    for bad, value in (([5, 0], 5), ([0, 3], 3), ([-4, 0], -4)):
        with pytest.raises(ValueError, match=rf"index must be in \[-3, 3\) \(num_indexed_weights=3; .*got {value}"):
            lin.apply(p, np.array(bad), x)
        with pytest.raises(ValueError, match="index must be in"):
            lin.apply(p, jnp.array(bad), x)  # a concrete jax.Array too
    with pytest.raises(ValueError, match="index must be in"):
        lin.init(jax.random.key(1), np.array([0, 3]), x)
    traced = jax.jit(lin.apply)(p, np.array([0, 3]), x)  # clamped to row 2, as e3nn-jax does
    np.testing.assert_array_equal(traced, lin.apply(p, np.array([0, 2]), x))


@pytest.mark.parametrize("channel_axis", [False, True])
@pytest.mark.parametrize("biases", [False, True])
def test_float_weights_are_mixed_with_the_parameters_as_in_e3nn(channel_axis, biases):
    """``lin(weights, x)`` with float ``weights [..., d]``: e3nn's ``linear_mixed``; parameters
    ``[d, ...]`` and each element's ``weights @ parameter``, broadcast with x's batch."""
    irreps_in, irreps_out, c_in, c_out = e3j.Irreps("2x0e + 1o"), e3j.Irreps("0e + 2x1o + 2e"), 3, 2
    x = jax.random.normal(jax.random.key(0), (5, irreps_in.dim, c_in), jnp.float64)
    emb = jax.random.normal(jax.random.key(3), (5, 4), jnp.float64)
    ours = Linear(irreps_out, c_out, irreps_in, biases=biases, channel_axis=channel_axis)
    if channel_axis:
        theirs = e3nn.flax.Linear(str(irreps_out), channel_out=c_out, biases=biases)
        x_theirs = e3nn.IrrepsArray(str(irreps_in), jnp.swapaxes(x, -1, -2))
    else:
        theirs = e3nn.flax.Linear(str(e3j.mul_ir_irreps(irreps_out, c_out)), biases=biases)
        x_theirs = e3nn.IrrepsArray(str(e3j.mul_ir_irreps(irreps_in, c_in)), e3j.to_mul_ir(x, irreps_in))
    p = theirs.init(jax.random.key(1), emb, x_theirs)
    p_ours = ours.init(jax.random.key(1), emb, x)
    assert jax.tree.structure(p_ours) == jax.tree.structure(p)
    jax.tree.map(np.testing.assert_array_equal, p_ours, p)  # same names, [d, ...] shapes, draws
    assert all(a.shape[0] == 4 for a in jax.tree.leaves(p))
    p = jax.tree.map(lambda a: a + jax.random.normal(jax.random.key(2), a.shape, a.dtype), p)
    out_irreps = ours.output_irreps()
    for w in (emb, emb[:1], emb[0]):  # per element, and one set broadcast to all
        ref = theirs.apply(p, w, x_theirs)
        out = ours.apply(p, w, x)
        if channel_axis:
            np.testing.assert_allclose(jnp.swapaxes(out, -1, -2), ref.array, rtol=1e-12, atol=1e-12)
        else:
            np.testing.assert_allclose(e3j.to_mul_ir(out, out_irreps), ref.array, rtol=1e-12, atol=1e-12)
    # weights as a scalar IrrepsArray, as e3nn-jax takes them
    np.testing.assert_array_equal(ours.apply(p, e3nn.IrrepsArray("4x0e", emb), x), ours.apply(p, emb, x))


@pytest.mark.parametrize("biases", [False, True])
def test_weights_per_channel_as_in_e3nn(biases):
    """e3nn's ``weights_per_channel`` on ``[N, C, irreps]``: each channel its own mixed parameters;
    e3j's array is the same with its last two axes swapped."""
    irreps_in, irreps_out, c = "1o + 2x0e + 1o", "3x0e + 1o", 3
    x = e3nn.IrrepsArray(irreps_in, jax.random.normal(jax.random.key(0), (5, c, e3nn.Irreps(irreps_in).dim)))
    emb = jax.random.normal(jax.random.key(3), (5, 6))
    theirs = e3nn.flax.Linear(irreps_out, weights_per_channel=True, biases=biases)
    ours = Linear(irreps_out, c, irreps_in, weights_per_channel=True, biases=biases)
    x_ours = jnp.swapaxes(x.array, -1, -2)
    p = theirs.init(jax.random.key(1), emb, x)
    p_ours = ours.init(jax.random.key(1), emb, x_ours)
    jax.tree.map(np.testing.assert_array_equal, p_ours, p)
    assert jax.tree.structure(p_ours) == jax.tree.structure(p)
    p = jax.tree.map(lambda a: a + jax.random.normal(jax.random.key(2), a.shape, a.dtype), p)
    ref = theirs.apply(p, emb, x)
    assert ours.output_irreps() == ref.irreps
    np.testing.assert_allclose(jnp.swapaxes(ours.apply(p, emb, x_ours), -1, -2), ref.array, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "irreps_in, irreps_out, instructions, force",
    [
        ("0e + 1o + 0e", "0e + 1o + 0e", [(0, 2), (2, 0), (1, 1)], False),  # chosen block pairs
        ("0e + 1o + 0e", "0e + 1o + 2e", None, True),  # all pairs of the unmerged blocks; 2e zeros
        ("0x0e + 1o + 0e + 0e", "0e + 0e + 0x1o + 1o + 0o", None, False),  # zero-multiplicity blocks kept
        ("1o + 0e", "0e + 0e + 1o", [(1, 1), (0, 2)], False),  # output 0 reached by no instruction
    ],
)
def test_unsimplified_irreps_and_instructions_as_in_e3nn(irreps_in, irreps_out, instructions, force):
    irreps_in_, c_in, c_out = e3j.Irreps(irreps_in), 2, 3
    x = jax.random.normal(jax.random.key(0), (4, irreps_in_.dim, c_in), jnp.float64)
    flat_in = str(e3j.mul_ir_irreps(irreps_in_, c_in))
    x_theirs = e3nn.IrrepsArray(flat_in, e3j.to_mul_ir(x, irreps_in_))
    kw = dict(simplify_irreps_internally=False, instructions=instructions, force_irreps_out=force, biases=True)
    theirs = e3nn.flax.Linear(str(e3j.mul_ir_irreps(irreps_out, c_out)), irreps_in=e3nn.Irreps(flat_in), **kw)
    ours = Linear(irreps_out, c_out, irreps_in, **kw)
    p = theirs.init(jax.random.key(1), x_theirs)
    p_ours = ours.init(jax.random.key(1), x)
    assert jax.tree.structure(p_ours) == jax.tree.structure(p)
    jax.tree.map(np.testing.assert_array_equal, p_ours, p)
    p = jax.tree.map(lambda a: a + jax.random.normal(jax.random.key(2), a.shape, a.dtype), p)
    ref = theirs.apply(p, x_theirs)
    out_irreps = ours.output_irreps()
    assert e3j.mul_ir_irreps(out_irreps, c_out) == e3j.Irreps(str(ref.irreps))
    np.testing.assert_allclose(e3j.to_mul_ir(ours.apply(p, x), out_irreps), ref.array, rtol=1e-12, atol=1e-12)


def test_parameter_initializer_as_in_e3nn():
    def init():
        return jax.nn.initializers.uniform(0.5)

    x = jax.random.normal(jax.random.key(0), (4, 4, 2))
    flat = e3nn.IrrepsArray(str(e3j.mul_ir_irreps("0e + 1o", 2)), e3j.to_mul_ir(x, "0e + 1o"))
    theirs = e3nn.flax.Linear(str(e3j.mul_ir_irreps("2x0e + 1o", 3)), parameter_initializer=init, biases=True)
    ours = Linear("2x0e + 1o", 3, "0e + 1o", parameter_initializer=init, biases=True)
    p = theirs.init(jax.random.key(1), flat)
    p_ours = ours.init(jax.random.key(1), x)
    jax.tree.map(np.testing.assert_array_equal, p_ours, p)
    assert all(np.all((a >= 0) & (a < 0.5)) and np.any(a > 0) for a in jax.tree.leaves(p_ours))  # biases too


def _out_irreps(irreps_in, irreps_out, force):
    return irreps_out if force else irreps_out.simplify().filter(keep=[ir for _, ir in irreps_in])


def test_bad_calls_are_named():
    lin = Linear("0e", channels_out=2, irreps_in="0e", num_indexed_weights=2)
    with pytest.raises(ValueError, match=r"lin\(index, x\)"):
        lin.init(jax.random.key(0), jnp.ones((3, 1, 2)))
    with pytest.raises(ValueError, match="x must be"):
        Linear("0e", channels_out=2, irreps_in="0e + 1o").init(jax.random.key(0), jnp.ones((3, 1, 2)))
    with pytest.raises(TypeError, match="biases must be a bool"):
        Linear("0e", channels_out=2, irreps_in="0e", biases="yes").init(jax.random.key(0), jnp.ones((3, 1, 2)))
    with pytest.raises(TypeError, match="channel_axis must be a bool"):
        Linear("0e", 2, "0e", channel_axis=1).init(jax.random.key(0), jnp.ones((3, 1, 2)))
    with pytest.raises(TypeError, match=r"got an IrrepsArray of 1x0e\+1x1o \(e3j's layout: here x.array\[..., None\]"):
        Linear("0e", 2, "0e + 1o").init(jax.random.key(0), e3nn.IrrepsArray("0e + 1o", jnp.ones((3, 4))))
    # 16 channels: the hint names the conversion with its count, and it is the right one
    x16 = e3nn.normal("16x0e + 16x1o", jax.random.key(1), (3,))
    with pytest.raises(TypeError, match=r"here e3j\.from_mul_ir\(x\.array, '1x0e\+1x1o', 16\), 16 channels"):
        Linear("0e", 2, "0e + 1o").init(jax.random.key(0), x16)
    Linear("0e", 2, "0e + 1o").init(jax.random.key(0), e3j.from_mul_ir(x16.array, "1x0e+1x1o", 16))  # as said
    # layouts equal up to merged blocks: the one-channel hint, and it is taken
    x2 = e3nn.IrrepsArray("2x0e", jnp.ones((3, 2)))
    with pytest.raises(TypeError, match=r"here x.array\[..., None\], one channel"):
        Linear("0e", 2, "0e + 0e").init(jax.random.key(0), x2)
    Linear("0e", 2, "0e + 0e").init(jax.random.key(0), x2.array[..., None])
    with pytest.raises(TypeError, match=r"x's irreps are not 1x0e\+1x1o times a channel count"):
        Linear("0e", 2, "0e + 1o").init(jax.random.key(0), e3nn.normal("2x0e + 1x1o", jax.random.key(1), (3,)))
    with pytest.raises(ValueError, match=r"got \(3, 4\) \(e3j's layout"):
        Linear("0e", 2, "0e + 1o").init(jax.random.key(0), jnp.ones((3, 4)))
    x = jnp.ones((3, 1, 2))
    emb = jnp.ones((3, 4))
    with pytest.raises(ValueError, match=r"instructions need simplify_irreps_internally=False"):
        Linear("0e", 2, "0e", instructions=[(0, 0)]).init(jax.random.key(0), x)
    with pytest.raises(ValueError, match=r"instructions cannot be combined with channel_axis"):
        Linear("0e", 2, "0e", instructions=[(0, 0)], simplify_irreps_internally=False, channel_axis=True).init(
            jax.random.key(0), x
        )
    with pytest.raises(ValueError, match=r"instruction \(0, 1\) connects 0e to 0o: the irreps must be equal"):
        Linear("0e + 0o", 2, "0e", instructions=[(0, 1)], simplify_irreps_internally=False, force_irreps_out=True).init(
            jax.random.key(0), x
        )
    with pytest.raises(ValueError, match=r"instruction \(0, 1\) is out of range: irreps_in has 1 blocks, .* 1 \("):
        Linear("0e + 0o", 2, "0e", instructions=[(0, 1)], simplify_irreps_internally=False).init(jax.random.key(0), x)
    with pytest.raises(TypeError, match=r"instructions must be \(i_in, i_out\) pairs of ints, got \(0, 0.0\)"):
        Linear("0e", 2, "0e", instructions=[(0, 0.0)], simplify_irreps_internally=False).init(jax.random.key(0), x)
    with pytest.raises(ValueError, match=r"weights_per_channel needs float weights: call lin\(weights, x\)"):
        Linear("0e", 2, "0e", weights_per_channel=True).init(jax.random.key(0), x)
    with pytest.raises(ValueError, match=r"weights_per_channel cannot be combined with channel_axis"):
        Linear("0e", 2, "0e", weights_per_channel=True, channel_axis=True).init(jax.random.key(0), emb, x)
    with pytest.raises(ValueError, match=r"channels_out=3 must equal x's C_in=2"):
        Linear("0e", 3, "0e", weights_per_channel=True).init(jax.random.key(0), emb, x)
    with pytest.raises(TypeError, match=r"index must be an integer array \(num_indexed_weights is set\), got dtype f"):
        Linear("0e", 2, "0e", num_indexed_weights=2).init(jax.random.key(0), emb, x)
    with pytest.raises(ValueError, match=r"lin\(index, x\) needs num_indexed_weights"):
        Linear("0e", 2, "0e").init(jax.random.key(0), jnp.zeros(3, int), x)
    with pytest.raises(ValueError, match=r"weights \[..., d\] must broadcast with x's batch \[3\], got \(2, 4\)"):
        Linear("0e", 2, "0e").init(jax.random.key(0), jnp.ones((2, 4)), x)
    with pytest.raises(ValueError, match=r"weights must have shape \[..., d\], got shape \(\)"):
        Linear("0e", 2, "0e").init(jax.random.key(0), jnp.ones(()), x)
    with pytest.raises(ValueError, match=r"weights given as an IrrepsArray must be scalars \(0e\), got 1x1o"):
        Linear("0e", 2, "0e").init(jax.random.key(0), e3nn.IrrepsArray("1o", jnp.ones((3, 3))), x)
    with pytest.raises(TypeError, match=r"parameter_initializer must be a callable"):
        Linear("0e", 2, "0e", parameter_initializer=0.1).init(jax.random.key(0), x)


def test_features_other_than_the_parameters_were_made_for_are_named():
    """Applied to features of another channel count or irreps than at init, flax said only that a
    parameter was not found ("w[0,0] 7x0e,8x0e" in scope "/"), which reads as a wrong checkpoint."""
    lin = Linear("0e + 1o", 3, "0e + 1o")
    p = lin.init(jax.random.key(1), jnp.ones((2, 4, 8)))
    with pytest.raises(ValueError, match=r"x \(1x0e\+1x1o, C_in=7\) is not the input these parameters were made for"):
        lin.apply(p, jnp.ones((2, 4, 7)))
    other = Linear("0e + 1o", 3, "2x0e + 1o")
    with pytest.raises(ValueError, match=r"no parameter 'w\[0,0\] 16x0e,3x0e' \(they have \['w\[0,0\] 8x0e,3x0e'"):
        other.apply(p, jnp.ones((2, 5, 8)))
    assert lin.apply(p, jnp.ones((2, 4, 8))).shape == (2, 4, 3)
    # a mutable params collection creates what is missing, as flax's own layers do
    out, made = lin.apply({}, jnp.ones((2, 4, 8)), rngs={"params": jax.random.key(1)}, mutable=["params"])
    assert jax.tree.structure(made) == jax.tree.structure(p) and out.shape == (2, 4, 3)
