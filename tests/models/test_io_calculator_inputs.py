"""Save/load, the ASE calculator (compiles once per bucket; stress against ASE's finite
differences), neighbour lists against brute force, and bad input named in the error."""

from __future__ import annotations

import dataclasses
import json
import zipfile

import jax
import numpy as np
import pytest
from model_systems import CELL, CONFIGS, CUTOFF, Z, edited_checkpoint, structure

import e3j_models as em

TINY = em.nequip(Z, num_layers=1, num_channels=2, node_irreps="0e + 1o", l_max=1, cutoff=CUTOFF, radial_mlp=(4,))


@pytest.fixture(scope="module")
def tiny():
    pot = em.Potential(TINY)
    batch = em.batch_structures([structure(1)], Z, CUTOFF)
    params = jax.tree.map(lambda a: a + 0.1, pot.init(jax.random.key(1), batch))
    return pot, batch, params


def test_exported_potential_takes_a_graph_batch(tiny):
    """A potential deployed with jax.export takes its GraphBatch (whose Graph is a pytree known by
    name): serialized, deserialized, the same bits (docs/usage.md#deploying-with-jaxexport)."""
    pytest.importorskip("flatbuffers")  # jax.export's serialization format
    pot, batch, params = tiny
    f = jax.jit(lambda p, b: pot(p, b, stress=True))
    exported = jax.export.export(f, platforms=("cpu",))(params, batch)
    restored = jax.export.deserialize(exported.serialize())
    got, want = restored.call(params, batch), f(params, batch)
    assert sorted(got) == ["energy", "forces", "stress"]
    for key in got:
        np.testing.assert_array_equal(got[key], want[key])


def test_exported_training_step_labels_deserialize_after_importing_the_package(tmp_path, tiny):
    """A function taking Labels exported here deserializes in a process that only imported
    e3j_models (the tree types are registered on the package's import)."""
    pytest.importorskip("flatbuffers")
    import subprocess
    import sys

    from e3j_models.train import Labels

    _, batch, _ = tiny
    g, n = batch.num_graphs, batch.positions.shape[0]
    labels = Labels(np.ones(g), np.full(g, 2.0), np.ones((n, 3)), np.zeros((g, 3, 3)), np.ones(g, bool))
    exported = jax.export.export(jax.jit(lambda b, lab: lab.energy.sum() + b.positions.sum()), platforms=("cpu",))(
        batch, labels
    )
    path = tmp_path / "step.bin"
    path.write_bytes(exported.serialize())
    code = (
        "import jax, e3j_models, sys; "
        f"e = jax.export.deserialize(bytearray(open({str(path)!r}, 'rb').read())); print(e.in_tree)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Labels" in out.stdout and "GraphBatch" in out.stdout


def test_save_load_round_trip(tmp_path, tiny):
    pot, batch, params = tiny
    path = tmp_path / "m.npz"
    em.save(path, pot.config, params)
    config, loaded = em.load(path)
    assert config == pot.config
    assert jax.tree.structure(loaded) == jax.tree.structure(params)
    np.testing.assert_array_equal(pot.energy(loaded, batch), pot.energy(params, batch))
    with np.load(path, allow_pickle=False) as data:  # the documented header
        header = json.loads(bytes(data["__header__"]).decode())
    assert header["format"] == "e3j-models" and header["format_version"] == 1 and header["config"]["model"] == "nequip"


def test_save_takes_any_mapping_and_refuses_what_it_cannot_store(tmp_path, tiny):
    """A FrozenDict was stored as one array of its keys (every parameter lost, load succeeding);
    None and bfloat16 leaves were written and unusable after loading."""
    import flax
    import jax.numpy as jnp

    pot, batch, params = tiny
    em.save(tmp_path / "f.npz", pot.config, flax.core.freeze(params))
    _, loaded = em.load(tmp_path / "f.npz")
    assert jax.tree.structure(loaded) == jax.tree.structure(params)
    np.testing.assert_array_equal(pot.energy(loaded, batch), pot.energy(params, batch))
    with pytest.raises(TypeError, match=r"params must be a nested dict of arrays .*got NoneType"):
        em.save(tmp_path / "n.npz", pot.config, None)
    with pytest.raises(ValueError, match=r"params holds no arrays"):
        em.save(tmp_path / "e.npz", pot.config, {"params": {}})
    bf16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
    with pytest.raises(TypeError, match=r"parameter 'params/.*' has dtype bfloat16, which an .npz cannot store"):
        em.save(tmp_path / "b.npz", pot.config, bf16)
    with pytest.raises(TypeError, match=r"parameter 'params/x' has dtype <U4"):
        em.save(tmp_path / "o.npz", pot.config, {"params": {"x": "text"}})
    with pytest.raises(FileNotFoundError):
        em.load(tmp_path / "missing.npz")


def test_load_refuses_other_formats(tmp_path):
    np.savez(tmp_path / "x.npz", a=np.zeros(2))
    with pytest.raises(ValueError, match="not an e3j-models file"):
        em.load(tmp_path / "x.npz")
    header = {"format": "e3j-models", "format_version": 99, "config": {}}
    np.savez(tmp_path / "y.npz", __header__=np.frombuffer(json.dumps(header).encode(), np.uint8))
    with pytest.raises(ValueError, match="format_version 99"):
        em.load(tmp_path / "y.npz")
    header["format_version"] = 0
    np.savez(tmp_path / "z.npz", __header__=np.frombuffer(json.dumps(header).encode(), np.uint8))
    with pytest.raises(ValueError, match="format_version 0"):
        em.load(tmp_path / "z.npz")
    (tmp_path / "junk.npz").write_text("not a zip of arrays\n")
    with pytest.raises(ValueError, match=r"junk.npz' is not an e3j-models file \(an .npz written by save\)") as err:
        em.load(tmp_path / "junk.npz")
    assert str(err.value).endswith("neither a zip archive nor a .npy array") and "allow_pickle" not in str(err.value)
    np.save(tmp_path / "lone.npy", np.zeros(3))
    with pytest.raises(ValueError, match=r"not an e3j-models file.*a single array"):
        em.load(tmp_path / "lone.npy")
    # malformed headers: a ValueError naming the file (the md command line reports those), not a
    # KeyError or AttributeError from inside
    cases = {
        b"\xff\xfe": r"has an unreadable __header__ \(not UTF-8 JSON\)",
        b"[1, 2]": r"has a malformed __header__: a JSON object expected, got list",
        json.dumps({"format": "e3j-models", "format_version": 1}).encode(): r"has a malformed __header__: no 'config'",
        json.dumps({"format": "e3j-models", "format_version": 1, "config": {"model": "nequip"}}).encode(): (
            r"holds a config without the fields \['atomic_numbers', "
        ),
        json.dumps({"format": "e3j-models", "format_version": 1, "config": {"model": "x"}}).encode(): (
            r"holds a config this e3j-models cannot read: config 'model' must be one of"
        ),
    }
    for k, (raw, match) in enumerate(cases.items()):
        np.savez(tmp_path / f"h{k}.npz", __header__=np.frombuffer(raw, np.uint8))
        with pytest.raises(ValueError, match=rf"h{k}.npz' " + match):
            em.load(tmp_path / f"h{k}.npz")


def test_load_refuses_damaged_files_and_partial_configs(tmp_path, tiny):
    """A file cut short or with a flipped bit raised zipfile.BadZipFile (no path; the md command
    printed a traceback), and a config missing a field loaded with that field's default: another
    model, silently (a NequIP without its cutoff took 5 Å for 4 Å)."""
    pot, _, params = tiny
    good = tmp_path / "m.npz"
    em.save(good, pot.config, params)
    raw = good.read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=r"cut.npz' is not an e3j-models file \(an .npz written by save\)"):
        em.load(tmp_path / "cut.npz")
    with np.load(good, allow_pickle=False) as data:
        name = next(n for n in data.files if n != "__header__")
    for member, match in ((name, f"its parameter '{name}'"), ("__header__", "its __header__")):
        with zipfile.ZipFile(good) as z:  # one bit of a member's stored bytes flipped: its CRC fails
            info = z.getinfo(f"{member}.npy")
        flipped = bytearray(raw)
        flipped[info.header_offset + 30 + len(info.filename) + info.compress_size // 2] ^= 1
        (tmp_path / "flip.npz").write_bytes(bytes(flipped))
        with pytest.raises(ValueError, match=rf"flip.npz' is damaged: {match} cannot be read"):
            em.load(tmp_path / "flip.npz")
    edited_checkpoint(good, tmp_path / "partial.npz", lambda config: config.pop("cutoff"))
    with pytest.raises(ValueError, match=r"partial.npz' holds a config without the fields \['cutoff'\]"):
        em.load(tmp_path / "partial.npz")
    # a parameter save would not write: text loaded, and failed in the Calculator naming no parameter
    arrays = dict(np.load(good, allow_pickle=False))
    arrays[name] = np.array(["text"] * arrays[name].size)
    np.savez(tmp_path / "text.npz", **arrays)
    with pytest.raises(ValueError, match=rf"text.npz': parameter '{name}' has dtype <U4, not a bool, int or float"):
        em.load(tmp_path / "text.npz")


def test_load_refuses_parameters_that_do_not_fit_or_are_not_finite(tmp_path, tiny):
    """A header edited after saving (another channel count) loaded, and the model failed at its first
    call naming no file (the md command had already removed the previous run's files); a NaN
    parameter loaded, and MD blamed the timestep. save refuses the NaN too: load would."""
    pot, _, params = tiny
    good = tmp_path / "m.npz"
    em.save(good, pot.config, params)
    edited_checkpoint(good, tmp_path / "edited.npz", lambda config: config.update(num_channels=3))
    with pytest.raises(ValueError, match=r"edited.npz' holds parameters that do not fit its config: .*shape"):
        em.load(tmp_path / "edited.npz")
    arrays = dict(np.load(good, allow_pickle=False))
    name = next(n for n in arrays if n != "__header__" and arrays[n].dtype.kind == "f")
    arrays[name] = arrays[name].copy()
    arrays[name].flat[0] = np.nan
    np.savez(tmp_path / "nan.npz", **arrays)
    with pytest.raises(ValueError, match=rf"nan.npz' holds non-finite parameters: \['{name}'\]"):
        em.load(tmp_path / "nan.npz")
    bad = jax.tree.map(lambda a: np.full_like(a, np.inf), params)
    with pytest.raises(ValueError, match=r"params holds non-finite values: \['"):
        em.save(tmp_path / "inf.npz", pot.config, bad)
    assert not (tmp_path / "inf.npz").exists()


def _periodic_atoms():
    """``structure(1)`` as periodic ``ase.Atoms`` (the calculator tests' system)."""
    ase = pytest.importorskip("ase")
    s = structure(1)
    return ase.Atoms(numbers=s["numbers"], positions=s["positions"], cell=CELL, pbc=True)


def test_calculator_compiles_once_per_bucket_and_matches_ase_numerics(tiny):
    ase = pytest.importorskip("ase")
    pot, _, params = tiny
    s = structure(1)
    atoms = _periodic_atoms()
    from e3j_models.calculator import _energy_forces_stress as run

    calc = em.Calculator(pot, params)
    atoms.calc = calc
    e0 = atoms.get_potential_energy()
    compiled = run._cache_size()  # shared by every calculator: other tests' buckets too
    rng = np.random.default_rng(0)
    for _ in range(3):  # small MD-like moves keep the bucket
        atoms.positions += rng.normal(scale=0.01, size=atoms.positions.shape)
        atoms.get_forces()
    assert len(calc.buckets) == 1 and run._cache_size() == compiled
    # a new calculator of an equal potential (one per structure, as ASE scripts often make them)
    # reuses the compilation: each used to jit its own function
    other = atoms.copy()
    other.calc = em.Calculator(em.Potential(pot.config), params)
    np.testing.assert_array_equal(other.get_forces(), atoms.get_forces())
    assert run._cache_size() == compiled
    # the backend request in force is part of the key: under another, the model compiles for it
    import e3j

    third = atoms.copy()
    third.calc = em.Calculator(pot, params)
    with e3j.use_backend("reference"):
        np.testing.assert_allclose(third.get_forces(), atoms.get_forces(), atol=1e-5)
    assert run._cache_size() == compiled + 1
    assert e0 != atoms.get_potential_energy()
    np.testing.assert_allclose(atoms.get_stress(), calc.calculate_numerical_stress(atoms, d=1e-5), atol=1e-7)
    np.testing.assert_allclose(atoms.get_forces(), calc.calculate_numerical_forces(atoms, d=1e-5), atol=1e-7)
    open_atoms = ase.Atoms(numbers=s["numbers"], positions=s["positions"])
    open_atoms.calc = em.Calculator(pot, params)
    assert open_atoms.get_forces().shape == (8, 3)
    with pytest.raises(ase.calculators.calculator.PropertyNotImplementedError, match="nonzero volume"):
        open_atoms.get_stress()


@pytest.mark.parametrize("pbc", [(True, True, False), (False, False, False)], ids=["slab", "molecule_in_a_box"])
def test_calculator_gives_stress_wherever_the_cell_has_a_volume(tiny, pbc):
    """ASE's rule (its EMT's): a stress wherever ``atoms.cell.rank == 3``, periodic or not; the
    calculator refused any structure not periodic in all three directions, so a slab's in-plane cell
    could not relax under ASE's filters. Equal to ASE's finite differences of a strain, and
    to EMT's convention: a cell without a volume is refused."""
    pytest.importorskip("ase")
    from ase.calculators.calculator import PropertyNotImplementedError

    pot, _, params = tiny
    atoms = _periodic_atoms()
    atoms.pbc = pbc
    atoms.calc = em.Calculator(pot, params)
    stress = atoms.get_stress()
    assert np.max(np.abs(stress)) > 1e-6
    np.testing.assert_allclose(stress, atoms.calc.calculate_numerical_stress(atoms, d=1e-5), atol=1e-7)
    flat = atoms.copy()
    flat.cell[2] = 0  # no volume: refused, as EMT refuses it
    flat.calc = em.Calculator(pot, params)
    assert np.isfinite(flat.get_potential_energy())
    with pytest.raises(PropertyNotImplementedError, match="nonzero volume"):
        flat.get_stress()


def test_calculator_keeps_no_results_of_another_structure_after_a_refusal(tiny):
    # calculate() takes the new atoms first: a refusal after that must not leave the previous
    # structure's results standing as the new one's
    pytest.importorskip("ase")
    from ase.calculators.calculator import PropertyNotImplementedError, all_changes

    pot, _, params = tiny
    a = _periodic_atoms()
    calc = em.Calculator(pot, params)
    calc.calculate(a, ["energy", "forces"], all_changes)
    slab = a.copy()
    slab.positions[0] += 0.3
    slab.pbc = [True, True, False]
    slab.cell[2] = 0  # no volume: no stress
    with pytest.raises(PropertyNotImplementedError, match="nonzero volume"):
        calc.calculate(slab, ["energy", "stress"], all_changes)
    fresh = em.Calculator(pot, params)
    assert calc.get_potential_energy(slab) == fresh.get_potential_energy(slab) != fresh.get_potential_energy(a)
    with pytest.raises(PropertyNotImplementedError, match="nonzero volume"):
        calc.get_stress(slab)  # the same atoms: their energy stays (no recalculation needed)
    assert calc.results.get("energy") == fresh.get_potential_energy(slab)
    unknown = a.copy()
    unknown.numbers[0] = 29  # not in Z
    with pytest.raises(ValueError, match="numbers"):
        calc.calculate(unknown, ["energy"], all_changes)
    with pytest.raises(ValueError, match="numbers"):
        calc.get_forces(unknown)


def test_calculator_pickles_and_its_copy_computes_the_same(tiny):
    # for multiprocessing and workflow tools: the jitted function could not be pickled
    import pickle

    pytest.importorskip("ase")
    pot, _, params = tiny
    atoms = _periodic_atoms()
    calc = em.Calculator(pot, params)
    atoms.calc = calc
    forces = atoms.get_forces()
    copy = pickle.loads(pickle.dumps(calc))
    assert copy.buckets == calc.buckets and copy.headroom == calc.headroom
    moved = atoms.copy()
    moved.positions[0] += 0.05
    moved.calc = copy
    fresh = moved.copy()
    fresh.calc = em.Calculator(pot, params)
    np.testing.assert_array_equal(moved.get_forces(), fresh.get_forces())
    assert not np.array_equal(moved.get_forces(), forces)
    np.testing.assert_array_equal(atoms.get_forces(), forces)  # the original still works


def test_calculator_sizes_its_bucket_to_each_structure_of_a_dataset(tiny):
    # one calculator over a dataset: a small structure after a large one is not padded to the
    # large one's size, alternating structures list each shape once, and a refused structure
    # changes no bucket
    pytest.importorskip("ase")
    pot, _, params = tiny
    small = _periodic_atoms()
    large = small.repeat((2, 2, 2))
    calc = em.Calculator(pot, params)
    fresh = em.Calculator(pot, params)
    fresh.get_potential_energy(small)
    calc.get_potential_energy(large)
    np.testing.assert_array_equal(calc.get_forces(small), fresh.get_forces(small))
    assert calc._size == fresh._size == fresh.buckets[0] and len(calc.buckets) == 2
    for atoms in (large, small, large):
        calc.get_potential_energy(atoms)
    assert calc.buckets == [calc.buckets[0], fresh.buckets[0]] and calc.buckets[0] != fresh.buckets[0]
    unknown = small.copy()  # would take the small bucket, were it not refused
    unknown.numbers[0] = 29  # not in Z
    with pytest.raises(ValueError, match="numbers"):
        calc.get_potential_energy(unknown)
    assert calc._size == calc.buckets[0] and len(calc.buckets) == 2
    calc.get_forces(small)
    assert calc.results["forces"].flags.writeable  # ASE's callers may edit results in place
    assert calc.name == "e3j_models"
    # a second pass over a dataset reuses the buckets of the first: a structure that fits a bucket
    # used before within twice its own size compiles nothing new
    dataset = [small, large, small.repeat((2, 1, 1)), small.repeat((2, 2, 1)), large, small]
    for atoms in dataset:
        calc.get_potential_energy(atoms)
    used = list(calc.buckets)
    for atoms in dataset[::-1]:
        calc.get_potential_energy(atoms)
    assert calc.buckets == used and len(used) <= 4


def test_calculator_bucket_choice_compiles_few_buckets_over_a_mixed_dataset():
    # each bucket is a compilation: sizing a new one whenever the current one was too large compiled
    # 54 buckets over this dataset, one per few structures
    pytest.importorskip("ase")
    from e3j_models.calculator import _choose_bucket

    rng = np.random.default_rng(0)
    used, current = [], None
    for n in rng.integers(3, 200, 500):
        need = (int(n) + 1, int(n) * 20)
        current = _choose_bucket(need, current, used, 0.1)
        assert all(k <= have <= 2 * em.bucket_size(k) for have, k in zip(current, need, strict=True))
        if current not in used:
            used.append(current)
    assert len(used) <= 15
    # a small system after a large one: the earlier small bucket, not a new one nor the large one
    assert _choose_bucket((10, 100), (72, 1024), [(16, 128), (72, 1024)], 0.1) == (16, 128)
    # MD: a system wandering inside its bucket keeps it, though a smaller one it fits was used before
    assert _choose_bucket((60, 700), (72, 1024), [(64, 704), (72, 1024)], 0.1) == (72, 1024)


def test_unpickled_float64_calculator_without_x64_is_refused(tiny):
    # a float64 calculator sent to a worker process without jax_enable_x64: its parameters come
    # back as float32 there, and it computed in float32 while its dtype said float64
    import pickle

    pytest.importorskip("ase")
    pot, _, params = tiny
    atoms = _periodic_atoms()
    data = pickle.dumps(em.Calculator(pot, params, dtype=np.float64))
    with jax.enable_x64(False):
        calc = pickle.loads(data)
        with pytest.raises(ValueError, match="dtype=float64 needs JAX's 64-bit mode"):
            calc.get_potential_energy(atoms)


@pytest.mark.parametrize("periodic", [True, False])
def test_neighbour_list_is_brute_force(periodic):
    s = structure(7, n=10, periodic=periodic)
    cutoff = 3.4  # larger than half the cell's height: several images of one atom
    senders, receivers, shifts = em.neighbour_list(s["positions"], cutoff, s["cell"], periodic)
    pos = s["positions"]
    cell = CELL if periodic else np.zeros((3, 3))
    got = sorted(
        (int(a), int(b), *np.round(d, 9))
        for a, b, d in zip(receivers, senders, pos[senders] - pos[receivers] + shifts @ cell)
    )
    want = []
    images = np.array(list(np.ndindex(5, 5, 5))) - 2 if periodic else np.zeros((1, 3), int)
    for a in range(len(pos)):
        for b in range(len(pos)):
            for img in images:
                d = pos[b] - pos[a] + img @ cell
                if 0 < np.linalg.norm(d) < cutoff:
                    want.append((a, b, *np.round(d, 9)))
    assert got == sorted(want) and len(got) > 0


@pytest.mark.parametrize("pbc", [True, (True, False, True), False])
def test_float32_batches_keep_far_structures_digits(tiny, pbc):
    # unwrapped MD coordinates far from the origin: a float32 batch built from them as they are
    # loses 4 of float32's 7 digits in every edge vector (forces off by ~1e-4 at 1,000 Å)
    pot, _, params = tiny
    s = structure(3)
    params32 = jax.tree.map(lambda a: a.astype(np.float32), params)
    run = jax.jit(pot.__call__)

    def forces(positions, dtype):
        st = {**s, "positions": positions, "pbc": pbc}
        batch = em.batch_structures([st], Z, CUTOFF, dtype=dtype)
        return np.asarray(run(params32 if dtype == np.float32 else params, batch)["forces"][: len(positions)])

    exact = forces(s["positions"], np.float64)
    far = s["positions"] + np.array([1000.0, -700.0, 1300.0])
    image = s["positions"] + (np.array([40, -30, 25]) * np.broadcast_to(pbc, 3)) @ CELL  # whole lattice vectors
    scale = np.abs(exact).max()
    for positions in (s["positions"], far, image):
        np.testing.assert_allclose(forces(positions, np.float32), exact, atol=2e-6 * scale)
    batch = em.batch_structures([{**s, "positions": far, "pbc": pbc}], Z, CUTOFF)
    np.testing.assert_allclose(forces(far, np.float64), exact, atol=1e-10 * scale)
    assert np.abs(np.asarray(batch.positions)[: len(far)]).max() < 2 * np.abs(CELL).sum()


def test_float32_calculator_keeps_large_reference_energies_digits(tiny):
    """Reference energies of all-electron size (~1e4 eV per atom) are added on the host in float64:
    in the float32 model a 216-atom energy of ~2.4e6 eV would keep ~0.1-1 eV (float32's spacing
    there is 0.25 eV), the same rounding that fit's labels avoid."""
    from ase import Atoms

    pot, _, params = tiny
    big = em.Potential(dataclasses.replace(TINY, atomic_energies=(-13604.21, -2042.37)))
    s = structure(5, n=216)
    atoms = Atoms(numbers=s["numbers"], positions=s["positions"] * 3.0, cell=CELL * 3.0, pbc=True)
    energies = {}
    for dtype in (np.float32, np.float64):
        atoms.calc = em.Calculator(big, params, dtype=dtype)
        energies[dtype] = atoms.get_potential_energy()
        # float64 results whatever the model's type, as ASE's calculators give them
        assert atoms.get_forces().dtype == atoms.get_stress().dtype == np.float64
    bare = em.Calculator(pot, params)  # the same model without reference energies, float64
    atoms.calc = bare
    e0 = sum({1: -13604.21, 8: -2042.37}[int(z)] for z in s["numbers"])
    np.testing.assert_allclose(energies[np.float64], atoms.get_potential_energy() + e0, rtol=0, atol=1e-8)
    assert abs(energies[np.float32] - energies[np.float64]) < 1e-3, energies


def test_slab_without_vacuum_equals_slab_with_vacuum(tiny):
    """ASE's slabs without vacuum have a zero lattice vector along their open direction; nothing
    crosses it, so the energy and forces are those of the same slab given a vacuum vector."""
    from ase.build import fcc111

    pot, _, params = tiny
    bare = fcc111("Cu", size=(2, 2, 2), a=3.6)
    bare.positions += np.random.default_rng(0).normal(scale=0.05, size=bare.positions.shape)
    assert bare.pbc.tolist() == [True, True, False] and not bare.cell[2].any()
    padded = bare.copy()
    padded.cell[2] = [0.0, 0.0, 30.0]
    bare.numbers[:] = padded.numbers[:] = Z[0]
    out = [pot(params, em.batch_structures([a], Z, CUTOFF)) for a in (bare, padded)]
    np.testing.assert_allclose(out[0]["energy"], out[1]["energy"], rtol=1e-12)
    np.testing.assert_allclose(out[0]["forces"], out[1]["forces"], rtol=1e-10, atol=1e-12)
    chain = {"positions": np.array([[0.0, 0, 0]]), "numbers": np.array([Z[0]]), "cell": np.diag([2.5, 0, 0]),
             "pbc": [True, False, False]}  # fmt: skip
    assert em.batch_structures([chain], Z, CUTOFF).graph.num_valid > 0
    with pytest.raises(ValueError, match=r"periodic vectors .* are degenerate"):
        em.batch_structures([{**chain, "pbc": [True, True, False]}], Z, CUTOFF)


def test_given_neighbours_give_the_same_batch():
    s = structure(1)
    edges = em.neighbour_list(s["positions"], CUTOFF, s.get("cell"), s.get("pbc", False))
    a = em.batch_structures([s], Z, CUTOFF)
    b = em.batch_structures([s], Z, CUTOFF, neighbours=[edges])
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert a.graph.num_valid == len(edges[0]) > 0
    # an image along a direction that is not periodic would move its edge by that cell vector (an
    # open structure keeps its box): refused, named
    slab = {**s, "pbc": (True, True, False)}
    senders, receivers, shifts = em.neighbour_list(slab["positions"], CUTOFF, slab["cell"], slab["pbc"])
    shifts = np.array(shifts)
    shifts[1, 2] = 1
    with pytest.raises(
        ValueError, match=r"edge 1 has shifts \[.*, 1\], an image along a direction that is not periodic"
    ):
        em.batch_structures([slab], Z, CUTOFF, neighbours=[(senders, receivers, shifts)])


def test_params_of_another_config_and_batches_of_the_model(tmp_path, tiny):
    """Parameters of another config failed inside Flax (ScopeParamShapeError naming neither);
    Potential.batch builds with the model's element order and cutoff."""
    pot, batch, params = tiny
    wider = em.Potential(em.nequip(Z, num_layers=1, num_channels=3, node_irreps="0e + 1o", l_max=1, cutoff=CUTOFF,
                                   radial_mlp=(4,)))  # fmt: skip
    with pytest.raises(ValueError, match=r"params do not fit this nequip config .*params/embedding/table has shape"):
        wider(params, batch)
    with pytest.raises(ValueError, match=r"params do not fit this nequip config"):
        jax.jit(wider.energy)(params, batch)
    with pytest.raises(ValueError, match=r"params do not fit .*: missing params/"):
        partial = {"params": {k: v for k, v in params["params"].items() if k != "embedding"}}
        em.save(tmp_path / "w.npz", wider.config, partial)
    pot.check_params(params)  # its own: no error
    s = structure(1)
    mine = pot.batch([s])
    for x, y in zip(jax.tree.leaves(mine), jax.tree.leaves(em.batch_structures([s], Z, CUTOFF)), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    with pytest.raises(TypeError, match=r"structures must be a list of structures, got one dict: wrap it in a list"):
        pot.batch(s)
    with pytest.raises(ValueError, match=r"needs 'positions' and 'numbers', got keys \['positions'\]"):
        pot.batch([{"positions": s["positions"]}])
    # two atoms at one place: the model would drop their zero-length edge (no interaction)
    twins = {"positions": np.array([[0.0, 0, 0], [1.0, 0, 0], [1.0, 0, 0]]), "numbers": np.array([Z[0]] * 3)}
    with pytest.raises(ValueError, match=r"atoms [12] and [12] coincide \(distance 0\)"):
        pot.batch([twins])


def test_bad_input_names_the_argument():
    s = structure(1)
    with pytest.raises(ValueError, match=r"numbers.*\[6\].*unknown"):
        em.batch_structures([{**s, "numbers": np.full(8, 6)}], Z, CUTOFF)
    with pytest.raises(ValueError, match="cell must be a 3×3"):
        em.batch_structures([{**s, "cell": np.eye(2)}], Z, CUTOFF)
    bad = s["positions"].copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"positions must be finite.*atom 2"):
        em.batch_structures([{**s, "positions": bad}], Z, CUTOFF)
    with pytest.raises(ValueError, match="positions is empty"):
        em.batch_structures([{"positions": np.zeros((0, 3)), "numbers": np.zeros(0, int)}], Z, CUTOFF)
    with pytest.raises(ValueError, match="structures is empty"):
        em.batch_structures([], Z, CUTOFF)
    with pytest.raises(ValueError, match="cell is singular"):
        em.batch_structures([{**s, "cell": np.zeros((3, 3))}], Z, CUTOFF)
    with pytest.raises(ValueError, match="num_nodes=4"):
        em.batch_structures([s], Z, CUTOFF, num_nodes=4)
    with pytest.raises(ValueError, match=r"neighbours must hold one entry per structure \(1\), got 2"):
        em.batch_structures([s], Z, CUTOFF, neighbours=[None, None])
    with pytest.raises(ValueError, match="atomic_numbers"):
        em.nequip((1, 1))
    with pytest.raises(ValueError, match="correlation"):
        em.mace_a(Z, correlation=0)
    with pytest.raises(TypeError, match="config must be"):
        em.Potential(CONFIGS)


def test_e3j_path_runs_without_e3nn_jax():
    """e3nn-jax is an optional extra: block its import and run a model; the twin then says what to install."""
    code = """
import sys
sys.modules["e3nn_jax"] = None  # any import of it now fails
import jax, numpy as np
import e3j_models as em
cfg = em.nequip((1,), num_layers=1, num_channels=2, node_irreps="0e + 1o", l_max=1)
batch = em.make_batch(np.array([[0.0, 0, 0], [1.0, 0.2, 0]]), [0, 0], [0, 1], [1, 0])
pot = em.Potential(cfg)
print(float(jax.jit(pot)(pot.init(jax.random.key(0), batch), batch)["energy"][0]))
try:
    em.get_ops("e3nn")
except ImportError as err:
    print("twin:", err)
try:  # when built, not at the first call: the train and md commands check their backend so
    em.Potential(cfg, "e3nn")
except ImportError as err:
    print("built:", err)
"""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "twin: backend='e3nn' needs e3nn-jax: pip install 'e3nn-jax<0.22,>=0.21'" in out.stdout
    assert "built: backend='e3nn' needs e3nn-jax: pip install 'e3nn-jax<0.22,>=0.21'" in out.stdout


def test_missing_extras_are_named(tmp_path):
    """ase, optax, tqdm and matplotlib come with extras: without them, what needed one says which
    extra to install (a bare ModuleNotFoundError before), and the commands stop before writing."""
    code = f"""
import sys
for m in ("ase", "tqdm", "matplotlib", "optax"):
    sys.modules[m] = None  # any import of them now fails
import e3j_models as em
from e3j_models.__main__ import main
from e3j_models.train import plot_history
for f in (lambda: em.Calculator, lambda: em.cuni_fcc(1), lambda: plot_history({{}}, "x.png")):
    try:
        f()
    except ImportError as err:
        print(err)
for command in (["train", "--data", "d.extxyz"], ["md", "--model", "m.npz"], ["data"]):
    try:
        main([*command, "--out", {str(tmp_path / "out")!r}])
    except SystemExit as err:
        print(err)
"""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "e3j_models.Calculator needs ase: pip install 'ase>=3.23'",
        "cuni_fcc needs ase: pip install 'ase>=3.23'",
        "plot_history needs matplotlib: pip install 'ase>=3.25' 'matplotlib>=3.8' 'optax>=0.2' 'tqdm>=4'",
        "error: python -m e3j_models train needs ase: pip install 'ase>=3.25' 'matplotlib>=3.8' 'optax>=0.2' 'tqdm>=4'",
        "error: python -m e3j_models md needs ase: pip install 'ase>=3.25' 'matplotlib>=3.8' 'optax>=0.2' 'tqdm>=4'",
        "error: python -m e3j_models data needs ase: pip install 'ase>=3.25' 'matplotlib>=3.8' 'optax>=0.2' 'tqdm>=4'",
    ]
    assert not os.path.exists(tmp_path / "out")


def test_a_too_old_extra_is_named(tmp_path):
    """ase < 3.25 has no ase.md.nose_hoover_chain, which md needs: the error said ase was missing."""
    code = f"""
import sys
import ase
sys.modules["ase.md.nose_hoover_chain"] = None  # as in ase 3.23 and 3.24
from e3j_models.__main__ import main
try:
    main(["md", "--model", "m.npz", "--out", {str(tmp_path / "out")!r}])
except SystemExit as err:
    print(err)
print(ase.__version__)
"""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=300)
    assert out.returncode == 0, out.stderr
    error, version = out.stdout.splitlines()
    assert error == (
        f"error: python -m e3j_models md needs ase.md.nose_hoover_chain, which the installed ase {version} "
        "lacks: pip install --upgrade 'ase>=3.25' 'matplotlib>=3.8' 'optax>=0.2' 'tqdm>=4'"
    )
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("command", ["train", "md"])
def test_command_help_names_no_none_default(command, capsys):
    from e3j_models.__main__ import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and "(default: e3j's choice)" in text


def test_an_unrelated_e3j_is_named(tmp_path):
    """PyPI's unrelated 'e3j' satisfies e3j-models' requirement when this project's e3j is not installed
    first: the import names it instead of failing on a missing name."""
    (tmp_path / "e3j").mkdir()
    (tmp_path / "e3j" / "__init__.py").write_text("")
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", "import e3j_models"], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode != 0
    assert "ImportError: the installed 'e3j'" in out.stderr and "an unrelated package of the same name" in out.stderr


def test_calculator_checks_headroom_when_built(tiny):
    pot, _, params = tiny
    with pytest.raises(ValueError, match=r"headroom must be a finite number >= 0, got -1"):
        em.Calculator(pot, params, headroom=-1)


def test_calculator_refuses_float64_without_x64(tiny):
    """JAX without 64-bit mode would run a float64 request in float32: the calculator says so instead."""
    pot, _, params = tiny
    with jax.enable_x64(False), pytest.raises(ValueError, match="jax_enable_x64"):
        em.Calculator(pot, params, dtype=np.float64)
    with pytest.raises(ValueError, match="float32 or float64"):
        em.Calculator(pot, params, dtype=np.int32)
