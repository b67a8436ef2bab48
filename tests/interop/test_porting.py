"""docs/porting.md, executed: the NequIP layer and the MACE interaction, e3nn-jax before and e3j after.

The ported layers must keep the parameter tree (same names, shapes and initial values from one key)
and give the same energy and forces in float64 (1e-12 relative) on every CPU-runnable backend (in
float32, within 1e-5, on the float32-only ones).
Oracle: the e3nn-jax layers of the same page.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import e3nn_jax as e3nn
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from installed import require_backend

import e3j

DOC = Path(__file__).resolve().parents[2] / "docs" / "porting.md"
BACKENDS = ["reference", "cuda_host", "pallas_gpu_interpret"]
# the other CPU-runnable backends: the emulated CUDA kernels and the Pallas TPU and Mosaic GPU interpreters
SLOW_BACKENDS = ["cuda_simt", "pallas_tpu_interpret", "pallas_mosaic_interpret"]
NUM_NODES, NUM_SPECIES, CUTOFF = 10, 3, 2.5


@cache
def layers() -> dict:
    namespace: dict = {}
    for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S):
        exec(compile(block, str(DOC), "exec"), namespace)
    return namespace


@cache
def system():
    rng = np.random.default_rng(0)
    positions = rng.uniform(0, 3.0, (NUM_NODES, 3))
    d = np.linalg.norm(positions[:, None] - positions[None], axis=-1)
    senders, receivers = np.nonzero((d < CUTOFF) & (d > 0))
    species = rng.integers(0, NUM_SPECIES, NUM_NODES)
    return jnp.asarray(positions), senders, receivers, jnp.asarray(species)


def nequip_energy(layer_cls):
    """One layer and a scalar readout: energy(params, positions)."""
    _, senders, receivers, species = system()

    class Model(nn.Module):
        @nn.compact
        def __call__(self, positions):
            vectors = e3nn.IrrepsArray("1o", positions[receivers] - positions[senders])
            feats = e3nn.IrrepsArray(f"{NUM_SPECIES}x0e", jax.nn.one_hot(species, NUM_SPECIES, dtype=positions.dtype))
            feats = layer_cls(name="layer")(vectors, feats, species, senders, receivers)
            return jnp.sum(e3nn.flax.Linear("0e", name="readout")(feats).array)

    return Model()


def mace_energy(layer_cls):
    _, senders, receivers, species = system()

    class Model(nn.Module):
        @nn.compact
        def __call__(self, positions):
            vectors = e3nn.IrrepsArray("1o", positions[receivers] - positions[senders])
            lengths = e3nn.norm(vectors).array[:, 0]
            radial = e3nn.bessel(lengths, 8, x_max=CUTOFF) * e3nn.poly_envelope(5, 2, x_max=CUTOFF)(lengths)[:, None]
            feats = e3nn.IrrepsArray(f"{NUM_SPECIES}x0e", jax.nn.one_hot(species, NUM_SPECIES, dtype=positions.dtype))
            feats = e3nn.flax.Linear("16x0e", name="embed")(feats)
            feats = layer_cls(name="interaction")(vectors, feats, radial, senders, receivers)
            return jnp.sum(e3nn.flax.Linear("0e", name="readout")(feats).array ** 2)

    return Model()


MODELS = {
    "nequip": (nequip_energy, "NequIPLayer", "NequIPLayerE3j"),
    "mace": (mace_energy, "MACEInteraction", "MACEInteractionE3j"),
}


@cache
def reference(model):
    make, before, _ = MODELS[model]
    positions = system()[0]
    net = make(layers()[before])
    params = net.init(jax.random.key(0), positions)
    energy, grad = jax.jit(jax.value_and_grad(lambda p: net.apply(params, p)))(positions)
    return params, energy, -grad


@pytest.mark.parametrize("backend", BACKENDS + [pytest.param(b, marks=pytest.mark.slow) for b in SLOW_BACKENDS])
@pytest.mark.parametrize("model", MODELS)
def test_ported_layer_same_parameters_energy_and_forces(model, backend):
    require_backend(backend)
    make, _, after = MODELS[model]
    params, energy, forces = reference(model)
    positions = system()[0]
    net = make(layers()[after])
    ours = net.init(jax.random.key(0), positions)
    assert jax.tree.structure(ours) == jax.tree.structure(params)
    jax.tree.map(np.testing.assert_array_equal, ours, params)
    # float64 to 1e-12; a float32-only backend (the Pallas TPU and Mosaic GPU kernels) runs the model
    # in float32, within its rounding of the float64 e3nn-jax oracle
    tol = 1e-12 if "float64" in e3j.backends.get_backend(backend).dtypes else 1e-5
    if tol > 1e-12:
        params, positions = jax.tree.map(lambda a: a.astype(jnp.float32), (params, positions))
    with e3j.use_backend(backend):
        e, g = jax.jit(jax.value_and_grad(lambda p: net.apply(params, p)))(positions)
    assert e.dtype == positions.dtype
    np.testing.assert_allclose(e, energy, rtol=tol)
    np.testing.assert_allclose(-g, forces, rtol=tol, atol=tol * float(jnp.abs(forces).max()))
    assert float(jnp.abs(forces).max()) > 1e-3  # the forces are not trivially zero


def test_functional_tensor_product_section():
    """The `FunctionalTensorProduct` / `uvu` section: NequIP's original convolution, before and after."""
    ns = layers()
    positions, senders, receivers, _ = system()
    sh = e3nn.spherical_harmonics("0e + 1o + 2e", positions[receivers] - positions[senders], normalize=True)
    tp = ns["nequip_conv_tp"](e3nn.Irreps("4x0e + 2x1o"), sh.irreps, e3nn.Irreps("0e + 1o + 1e + 2e"))
    k = jax.random.split(jax.random.key(2), 2)
    x = e3nn.IrrepsArray(tp.irreps_in1, jax.random.normal(k[0], (NUM_NODES, tp.irreps_in1.dim), jnp.float64))
    w = jax.random.normal(k[1], (len(senders), sum(int(np.prod(i.path_shape)) for i in tp.instructions)), jnp.float64)
    want = jax.jit(lambda x, w: ns["nequip_conv_e3nn"](tp, x, sh, w, senders, receivers).array)(x, w)
    got = jax.jit(lambda x, w: ns["nequip_conv_e3j"](tp, x, sh, w, senders, receivers).array)(x, w)
    assert float(jnp.abs(want).max()) > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
