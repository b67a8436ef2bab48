"""Shared scaffolding of the bad-input tests (tests/*/test_bad_input_*.py)."""

from __future__ import annotations

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np

import e3j

f32, f64 = jnp.float32, jnp.float64
KEY = jax.random.key(0)

# the same irreps "0e + 1o" in every form an irreps argument takes
FORMS = {
    "str": "0e + 1o",
    "e3j": e3j.Irreps("0e + 1o"),
    "e3nn": e3nn.Irreps("0e + 1o"),
    "mul_ir_pairs": [(1, (0, 1)), (1, (1, -1))],
    "irrep_list": [e3nn.Irrep("0e"), e3j.Irrep("1o")],
}


def ones(*shape, dtype=f64):
    return jnp.ones(shape, dtype)


def rand(*shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape))
