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


def test_one_species_index_broadcasts_as_in_e3nn():
    x = jax.random.normal(jax.random.key(0), (4, 4, 2))  # "0e + 1o", 2 channels
    flat = e3nn.IrrepsArray(str(e3j.mul_ir_irreps("0e + 1o", 2)), e3j.to_mul_ir(x, "0e + 1o"))
    theirs = e3nn.flax.Linear(str(e3j.mul_ir_irreps("0e + 1o", 3)), num_indexed_weights=2)
    ours = Linear("0e + 1o", 3, "0e + 1o", num_indexed_weights=2)
    p = theirs.init(jax.random.key(1), jnp.array(1), flat)
    ref = theirs.apply(p, jnp.array(1), flat)
    np.testing.assert_allclose(e3j.to_mul_ir(ours.apply(p, jnp.array(1), x), "0e + 1o"), ref.array, rtol=1e-12)
    np.testing.assert_array_equal(ours.apply(p, jnp.array(1), x), ours.apply(p, jnp.ones(4, int), x))
    with pytest.raises(ValueError, match=r"index must broadcast to x's batch \[4\], got \(3,\)"):
        ours.apply(p, jnp.ones(3, int), x)


def _out_irreps(irreps_in, irreps_out, force):
    out = irreps_out.simplify()
    return out if force else out.filter(keep=[ir for _, ir in irreps_in])


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
    with pytest.raises(TypeError, match=r"got an IrrepsArray \(e3j's layout: .*x.array\[..., None\]"):
        Linear("0e", 2, "0e + 1o").init(jax.random.key(0), e3nn.IrrepsArray("0e + 1o", jnp.ones((3, 4))))
    with pytest.raises(ValueError, match=r"got \(3, 4\) \(e3j's layout"):
        Linear("0e", 2, "0e + 1o").init(jax.random.key(0), jnp.ones((3, 4)))
