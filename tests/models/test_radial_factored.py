"""The models' radial MLP given to the convolution factored (``e3j.FactoredWeights``).

``RadialMLP(factored=True)`` returns the last hidden layer and the last kernel instead of their
product: the same parameter tree and init, the same scalars. A model's convolutions then bind the
factored primitive, and its training loss's parameter gradient (forces differentiated again) equals
the e3nn-jax twin's, which multiplies the scalars out (float64).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_systems import CONFIGS, CUTOFF, Z, structure

import e3j
import e3j_models as em
from e3j_models.train import Labels, loss_fn


def test_factored_radial_mlp_has_the_same_parameters_and_scalars():
    radial = jax.random.normal(jax.random.key(0), (10, 8), jnp.float64)
    plain, factored = em.RadialMLP((16, 12), 5, 4), em.RadialMLP((16, 12), 5, 4, factored=True)
    params = plain.init(jax.random.key(1), radial)
    assert jax.tree.all(jax.tree.map(jnp.array_equal, params, factored.init(jax.random.key(1), radial)))
    s = factored.apply(params, radial)
    assert isinstance(s, e3j.FactoredWeights) and s.kernel.shape == (12, 20)
    np.testing.assert_allclose(s.materialize().reshape(10, 5, 4), plain.apply(params, radial), rtol=1e-13)


def _primitive_names(jaxpr) -> set[str]:
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for v in eqn.params.values():
            inner = getattr(v, "jaxpr", None)
            if inner is not None:
                names |= _primitive_names(getattr(inner, "jaxpr", inner))
    return names


@pytest.mark.parametrize("name", ["nequip", "mace_corr2"])
def test_training_gradient_through_factored_scalars_equals_the_twin(name):
    pytest.importorskip("e3nn_jax")
    cfg = CONFIGS[name]
    batch = em.batch_structures([structure(1)], Z, CUTOFF)
    pot, twin = em.Potential(cfg, "reference"), em.Potential(cfg, "e3nn")
    params = jax.tree.map(lambda a: a * 0.5 + 0.1, pot.init(jax.random.key(0), batch))
    nodes = batch.node_mask.shape[0]
    labels = Labels(
        energy=jnp.ones(1),
        num_atoms=jnp.full(1, float(batch.node_mask.sum())),
        forces=jnp.ones((nodes, 3)),
        stress=jnp.zeros((1, 3, 3)),
        has_stress=jnp.asarray(False),
    )

    def gradient(p, potential):
        return jax.grad(lambda q: loss_fn(potential, q, batch, labels)[0])(p)

    names = _primitive_names(jax.make_jaxpr(functools.partial(gradient, potential=pot))(params).jaxpr)
    assert "e3j_convolution_factored" in names and "e3j_convolution" not in names
    got, want = jax.jit(gradient, static_argnums=1)(params, pot), jax.jit(gradient, static_argnums=1)(params, twin)
    scale = max(float(jnp.max(jnp.abs(w))) for w in jax.tree.leaves(want))
    radial = 0
    for path, g in jax.tree_util.tree_leaves_with_path(got):
        w = functools.reduce(lambda t, k: t[k.key], path, want)
        if "radial" in jax.tree_util.keystr(path):  # the factors' gradients: each is not 0 == 0
            radial += 1
            assert float(jnp.max(jnp.abs(w))) > 1e-8 * scale, path
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12 * scale, err_msg=jax.tree_util.keystr(path))
    assert radial >= 2 * len(cfg.radial_mlp)  # every layer of every interaction's radial MLP


def test_factored_radial_false_multiplies_the_scalars_out_with_the_same_results():
    cfg = CONFIGS["nequip"]
    batch = em.batch_structures([structure(1)], Z, CUTOFF)
    factored, array = em.Potential(cfg, "reference"), em.Potential(cfg, "reference", factored_radial=False)
    assert factored != array and array.with_backend(None).factored_radial is False
    params = factored.init(jax.random.key(0), batch)
    assert jax.tree.structure(array.init(jax.random.key(0), batch)) == jax.tree.structure(params)
    names = _primitive_names(jax.make_jaxpr(lambda p: array(p, batch))(params).jaxpr)
    assert "e3j_convolution" in names and "e3j_convolution_factored" not in names
    got, want = jax.jit(factored)(params, batch), jax.jit(array)(params, batch)
    for key in ("energy", "forces"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-12, atol=1e-14)
    with pytest.raises(TypeError, match="factored_radial must be a bool"):
        em.Potential(cfg, factored_radial="no")
