"""MACE and NequIP on e3j against their e3nn-jax twins, and the physics every potential must obey.

Oracles: the e3nn-jax twin (same parameters, e3nn-jax operations only), rotations / inversion,
translations, permutations, central finite differences of the energy (forces) and of the energy
under a homogeneous strain (stress), and padding. All float64 on tiny systems and configs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_systems import CONFIGS, CUTOFF, Z, random_rotation, structure

import e3j
import e3j_models as em

pytest.importorskip("e3nn_jax")

# correlation 3 compiles for minutes on 2 shared cores: in `nox -s models_slow`, not the CI session
NAMES = ["mace_corr2", "nequip", pytest.param("mace_corr3", marks=pytest.mark.models_slow)]


@functools.cache
def _setup(name: str):
    cfg = CONFIGS[name]
    pot, twin = em.Potential(cfg), em.Potential(cfg, backend="e3nn")
    batch = em.batch_structures([structure(1), structure(2, periodic=False)], Z, CUTOFF)
    params = pot.init(jax.random.key(0), batch)
    params = jax.tree.map(lambda a: a * 0.5 + 0.1, params)  # not the init's symmetric draw
    run = jax.jit(functools.partial(pot.__call__, stress=True))
    run_twin = jax.jit(functools.partial(twin.__call__, stress=True))
    return pot, batch, params, run, run_twin


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.mark.parametrize("name", NAMES)
def test_e3j_equals_e3nn_twin_float64(name):
    _, batch, params, run, run_twin = _setup(name)
    got, want = run(params, batch), run_twin(params, batch)
    assert np.all(np.asarray(got["energy"]) != 0)
    assert np.max(np.abs(np.asarray(want["forces"]))) > 1e-6  # the comparison below is not 0 == 0
    for key in ("energy", "forces"):
        assert _rel(got[key], want[key]) <= 1e-10, key
    periodic = slice(0, 1)  # structure 0 has a cell; structure 1 is open (NaN stress)
    assert _rel(got["stress"][periodic], want["stress"][periodic]) <= 1e-10
    assert np.all(np.isnan(np.asarray(got["stress"][1])))


def _transformed(batch, positions=None, cell=None):
    return batch._replace(
        positions=batch.positions if positions is None else positions, cell=batch.cell if cell is None else cell
    )


@pytest.mark.parametrize("name", NAMES)
def test_rotation_inversion_translation(name):
    _, batch, params, run, _ = _setup(name)
    ref = run(params, batch)
    for seed, sign in ((3, 1.0), (4, -1.0)):  # a rotation, then a rotation with inversion
        rot = jnp.asarray(sign * random_rotation(seed))
        shift = jnp.asarray([0.3, -1.2, 2.5])
        out = run(params, _transformed(batch, batch.positions @ rot.T + shift, batch.cell @ rot.T))
        np.testing.assert_allclose(out["energy"], ref["energy"], rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(out["forces"], ref["forces"] @ rot.T, rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(out["stress"][0], rot @ ref["stress"][0] @ rot.T, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name", NAMES)
def test_permutation(name):
    _, batch, params, run, _ = _setup(name)
    ref = run(params, batch)
    n_real = int(batch.node_mask.sum())
    perm = np.concatenate([np.random.default_rng(5).permutation(n_real), np.arange(n_real, batch.node_mask.shape[0])])
    inv = np.argsort(perm)  # new index of old node k is inv[k]
    g = batch.graph
    permuted = em.make_batch(
        np.asarray(batch.positions)[perm],
        np.asarray(batch.species)[perm],
        inv[np.asarray(g.senders)],
        inv[np.asarray(g.receivers)],
        shifts=batch.shifts,
        cell=batch.cell,
        node_graph=np.asarray(batch.node_graph)[perm],
        node_mask=np.asarray(batch.node_mask)[perm],
        edge_mask=g.edge_mask,
    )
    out = run(params, permuted)
    np.testing.assert_allclose(out["energy"], ref["energy"], rtol=1e-11)
    np.testing.assert_allclose(out["forces"], np.asarray(ref["forces"])[perm], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_forces_and_stress_are_finite_differences(name):
    _, batch, params, run, _ = _setup(name)
    ref = run(params, batch)
    h = 1e-5
    for atom, axis in ((0, 0), (3, 2), (9, 1)):
        d = jnp.zeros_like(batch.positions).at[atom, axis].set(h)
        plus = run(params, _transformed(batch, batch.positions + d))["energy"].sum()
        minus = run(params, _transformed(batch, batch.positions - d))["energy"].sum()
        np.testing.assert_allclose(-(plus - minus) / (2 * h), ref["forces"][atom, axis], rtol=1e-6, atol=1e-9)
    volume = abs(np.linalg.det(np.asarray(batch.cell[0])))
    for i, j in ((0, 0), (0, 1), (2, 1)):
        energies = []
        for sign in (1, -1):
            deform = jnp.eye(3).at[i, j].add(sign * h)
            pos = jnp.where((batch.node_graph == 0)[:, None], batch.positions @ deform.T, batch.positions)
            cell = batch.cell.at[0].set(batch.cell[0] @ deform.T)
            energies.append(run(params, _transformed(batch, pos, cell))["energy"][0])
        np.testing.assert_allclose((energies[0] - energies[1]) / (2 * h) / volume, ref["stress"][0, i, j], atol=1e-9)


def test_partially_periodic_stress_is_over_the_cells_volume():
    # a slab (periodic in x and y only) with a cell of nonzero volume: the stress is (1/V) dE/de over
    # that cell's volume, the vacuum direction included, as for a fully periodic cell
    pot = em.Potential(CONFIGS["nequip_tiny"])
    slab = {**structure(1), "pbc": (True, True, False)}
    batch = em.batch_structures([slab], Z, CUTOFF)
    params = pot.init(jax.random.key(0), batch)
    run = jax.jit(functools.partial(pot.__call__, stress=True))
    stress = np.asarray(run(params, batch)["stress"][0])
    assert np.all(np.isfinite(stress)) and np.max(np.abs(stress)) > 1e-8
    volume = abs(np.linalg.det(np.asarray(batch.cell[0])))
    h = 1e-5
    for i, j in ((0, 0), (2, 2), (0, 2), (1, 0)):
        energies = []
        for sign in (1, -1):
            deform = jnp.eye(3).at[i, j].add(sign * h)
            moved = _transformed(batch, batch.positions @ deform.T, batch.cell @ deform.T)
            energies.append(run(params, moved)["energy"][0])
        np.testing.assert_allclose((energies[0] - energies[1]) / (2 * h) / volume, stress[i, j], atol=1e-9)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.models_slow) for n in ("mace_corr2", "nequip")] + ["nequip_tiny"]
)
def test_padding_changes_nothing(name):
    pot, batch, params, run, _ = _setup(name)
    ref = run(params, batch)
    n, e = batch.node_mask.shape[0], batch.graph.num_edges
    # the same structures padded further, padding edges pointing at real atoms and at padding ones
    padded = em.batch_structures(
        [structure(1), structure(2, periodic=False)], Z, CUTOFF, num_nodes=n + 5, num_edges=e + 7
    )
    g = padded.graph
    senders = np.asarray(g.senders).copy()
    senders[-7:] = [0, 1, n + 2, 3, n + 4, 2, 0]
    receivers = np.asarray(g.receivers).copy()
    receivers[-7:] = [1, n + 1, 0, n + 3, 2, 2, 0]
    padded = padded._replace(
        positions=padded.positions.at[n:].set(jnp.asarray(np.random.default_rng(0).normal(size=(5, 3)))),
        graph=e3j.Graph.from_edges(senders, receivers, n + 5, edge_mask=g.edge_mask),
    )
    out = jax.jit(functools.partial(pot.__call__, stress=True))(params, padded)
    np.testing.assert_allclose(out["energy"], ref["energy"], rtol=1e-12)
    np.testing.assert_allclose(out["forces"][:n], ref["forces"], rtol=1e-10, atol=1e-13)
    assert np.all(np.asarray(out["forces"][n:]) == 0)
    np.testing.assert_allclose(out["stress"][0], ref["stress"][0], rtol=1e-10, atol=1e-13)

    def loss(p, b):  # parameter gradients of the energies (the force gradients are checked above)
        return jnp.sum(pot.energy(p, b) * jnp.array([1.0, -0.7]))

    g_ref = jax.jit(jax.grad(loss))(params, batch)
    g_pad = jax.jit(jax.grad(loss))(params, padded)
    assert max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(g_ref)) > 1e-6
    for a, b in zip(jax.tree.leaves(g_pad), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_init_draws_the_same_model_in_float32_and_float64():
    pot, batch, *_ = _setup("nequip")
    p64 = pot.init(jax.random.key(3), batch, dtype=jnp.float64)
    p32 = pot.init(jax.random.key(3), batch, dtype=jnp.float32)
    leaves64, leaves32 = jax.tree.leaves(p64), jax.tree.leaves(p32)
    assert {a.dtype for a in leaves64} == {jnp.dtype(jnp.float64)}
    assert {a.dtype for a in leaves32} == {jnp.dtype(jnp.float32)}
    for a, b in zip(leaves64, leaves32, strict=True):
        np.testing.assert_array_equal(a, np.asarray(b, np.float64))


# ``A`` without 0e reaches an irrep in an even or an odd number of products only: each power must
# keep what reaches the output within (not exactly) the products left; correlation 4 of 1o was
# refused ("leaves no path"), and so was correlation 2 of 1o -> 1o
SPECS = [("1o", "1o", 2), ("1o", "1o", 4), ("1o + 2e", "0e + 1o", 4), ("0o + 1e", "0e + 1o", 3), ("0e + 1o", "1o", 3)]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_symmetric_contraction_keeps_every_copy_the_powers_reach(spec):
    """The copies of each output irrep in ``B_1 … B_ν`` against unfiltered e3nn-jax products (a
    filter may drop only what reaches no output), and the contraction against the twin's."""
    import e3nn_jax as e3nn

    irreps_in, irreps_out, correlation = spec
    sc = em.SymmetricContractionSpec(irreps_in, irreps_out, correlation)
    b, a, counts = e3nn.zeros(irreps_in, ()), e3nn.zeros(irreps_in, ()), {}
    for k in range(1, correlation + 1):
        if k > 1:
            b = e3nn.tensor_product(b, a)
        for mul, ir in b.irreps:
            counts[str(ir)] = counts.get(str(ir), 0) + mul
    outs = [str(ir) for _, ir in e3nn.Irreps(irreps_out)]
    assert {str(ir): n for ir, n in sc.copies_per_irrep()} == {o: counts[o] for o in outs if counts.get(o)}
    x = jax.random.normal(jax.random.key(0), (5, sc.irreps_in.dim, 3))
    species = jnp.arange(5) % 2
    mods = [em.SymmetricContraction(irreps_in, irreps_out, correlation, 2, backend=b) for b in (None, "e3nn")]
    params = mods[0].init(jax.random.key(1), x, species)
    got, want = (m.apply(params, x, species) for m in mods)
    assert got.shape == (5, sc.irreps_result.dim, 3)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
