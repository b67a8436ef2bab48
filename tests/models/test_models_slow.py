"""The e3j path against the e3nn-jax twin at the paper's full sizes, on larger systems and in float32
(``nox -s models_slow``: minutes of compilation on 2 cores, so not in the CI session)."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from model_systems import CONFIGS, Z, structure

import e3j_models as em

pytest.importorskip("e3nn_jax")
pytestmark = pytest.mark.models_slow

#: the float32 bound measured here (relative to the largest magnitude of each output)
FLOAT32_RTOL = 1e-5


def _compare(cfg, structures, dtype, rtol):
    pot, twin = em.Potential(cfg), em.Potential(cfg, backend="e3nn")
    batch = em.batch_structures(structures, cfg.atomic_numbers, cfg.cutoff, dtype=dtype)
    params = jax.tree.map(lambda a: a * 0.5 + 0.1, pot.init(jax.random.key(0), batch))
    got = jax.jit(functools.partial(pot.__call__, stress=True))(params, batch)
    want = jax.jit(functools.partial(twin.__call__, stress=True))(params, batch)
    assert got["energy"].dtype == dtype
    periodic = np.array([i for i, s in enumerate(structures) if s.get("pbc", False) is True])
    errors = {}
    for key, a, b in (
        ("energy", got["energy"], want["energy"]),
        ("forces", got["forces"], want["forces"]),
        ("stress", got["stress"][periodic], want["stress"][periodic]),
    ):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        errors[key] = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
    print(errors)
    assert all(v <= rtol for v in errors.values()), errors


@pytest.mark.parametrize("preset", ["mace_a", "mace_b", "nequip"])
def test_full_presets_equal_twin_float64(preset):
    cfg = getattr(em, preset)(Z)
    _compare(cfg, [structure(1), structure(2, periodic=False)], np.float64, 1e-10)


@pytest.mark.parametrize("name", ["mace_corr2", "mace_corr3", "nequip"])
def test_twin_float32(name):
    _compare(CONFIGS[name], [structure(1), structure(2, periodic=False)], np.float32, FLOAT32_RTOL)


@pytest.mark.parametrize("name", ["mace_corr2", "mace_corr3", "nequip"])
def test_twin_float64_water(name):
    box = em.water_box(300, seed=1)  # periodic, ~300 atoms
    drop = em.water_box(60, seed=2)  # open
    drop = {"positions": drop["positions"], "numbers": drop["numbers"], "pbc": False}
    _compare(CONFIGS[name], [box, drop], np.float64, 1e-10)
