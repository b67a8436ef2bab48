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
    assert e3j.mul_ir_irreps(out_irreps, c_out) == ref.irreps
    np.testing.assert_allclose(e3j.to_mul_ir(out, out_irreps), ref.array, rtol=1e-12, atol=1e-12)


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
