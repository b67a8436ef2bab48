"""EMT data generation and training (e3j_models.data, e3j_models.train, the CLI)."""

import itertools
import json
import os

import numpy as np
import pytest

pytest.importorskip("ase")
pytest.importorskip("optax")

from ase.calculators.emt import EMT

from e3j_core import Irreps
from e3j_models import Potential, load, nequip
from e3j_models.__main__ import main
from e3j_models.data import emt_structures, read_dataset, write_dataset
from e3j_models.train import (
    check_training_data,
    epoch_losses,
    evaluate_structures,
    fit,
    isolated_atom_energies,
    prepare_config,
)

TINY = dict(num_layers=1, num_channels=4, node_irreps="0e + 1o", l_max=1, cutoff=3.0, radial_mlp=(8,))


def test_emt_structures_deterministic_and_labelled():
    a = emt_structures(3, seed=7)
    b = emt_structures(5, seed=7)  # a larger set extends a smaller one
    for x, y in zip(a, b[:3], strict=True):
        np.testing.assert_array_equal(x.positions, y.positions)
        np.testing.assert_array_equal(x.numbers, y.numbers)
    assert not np.array_equal(emt_structures(1, seed=8)[0].positions, a[0].positions)
    for atoms in a:
        assert atoms.pbc.all() and set(atoms.numbers.tolist()) <= {28, 29}
        ref = atoms.copy()
        ref.calc = EMT()  # the oracle: a fresh EMT evaluation of the stored structure
        np.testing.assert_allclose(atoms.get_potential_energy(), ref.get_potential_energy(), rtol=1e-12)
        np.testing.assert_allclose(atoms.get_forces(), ref.get_forces(), atol=1e-12)
        np.testing.assert_allclose(atoms.get_stress(), ref.get_stress(), atol=1e-12)
    # thermal displacements and vacancies: not a perfect lattice
    assert max(np.abs(x.get_forces()).max() for x in a) > 0.1


def test_dataset_roundtrip_and_bad_files(tmp_path):
    structures = emt_structures(2)
    path = tmp_path / "d.extxyz"
    write_dataset(path, structures)
    back = read_dataset(path)
    np.testing.assert_allclose(back[1].get_forces(), structures[1].get_forces(), atol=1e-7)  # extxyz: 8 decimals
    np.testing.assert_allclose(back[1].get_stress(), structures[1].get_stress(), atol=1e-7)
    # the suffix names the format: .traj is an ASE trajectory, which keeps the labels exactly (extxyz
    # text under a .traj name was written, and could not be read back)
    write_dataset(tmp_path / "d.traj", structures)
    for x, y in zip(read_dataset(tmp_path / "d.traj"), structures, strict=True):
        np.testing.assert_array_equal(x.positions, y.positions)
        assert x.get_potential_energy() == y.get_potential_energy()
        np.testing.assert_array_equal(x.get_forces(), y.get_forces())
        np.testing.assert_array_equal(x.get_stress(), y.get_stress())
    write_dataset(tmp_path / "no-suffix", structures)  # ASE reads it by content: extxyz
    back = read_dataset(tmp_path / "no-suffix")
    np.testing.assert_allclose(back[1].get_forces(), structures[1].get_forces(), atol=1e-7)
    with pytest.raises(ValueError, match=r"dataset path '.*d.json': ASE reads that name as 'json'; name an extxyz"):
        write_dataset(tmp_path / "d.json", structures)
    with pytest.raises(ValueError, match=r"dataset path '.*d.xyz.gz': write_dataset writes uncompressed files"):
        write_dataset(tmp_path / "d.xyz.gz", structures)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_dataset(tmp_path / "missing.extxyz")
    bad = tmp_path / "bad.extxyz"
    bad.write_text("this is not\nan xyz file\n")
    with pytest.raises(ValueError, match="not readable"):
        read_dataset(bad)
    unlabelled = tmp_path / "u.extxyz"
    from ase.io import write

    write(unlabelled, emt_structures(1)[0].copy(), format="extxyz")  # copy() drops the calculator
    with pytest.raises(ValueError, match="no energy"):
        read_dataset(unlabelled)


def _relabelled(structures, prefix="REF_"):
    """The structures with their labels under other names (mace-torch's convention), no calculator."""
    out = []
    for atoms in structures:
        copy = atoms.copy()  # drops the calculator and its results
        copy.info[prefix + "energy"] = atoms.get_potential_energy()
        copy.arrays[prefix + "forces"] = atoms.get_forces()
        copy.info[prefix + "stress"] = atoms.get_stress(voigt=False).reshape(9)
        out.append(copy)
    return out


def test_dataset_labels_under_other_names(tmp_path):
    # mace-torch's datasets keep the labels as REF_energy / REF_forces / REF_stress: read_dataset
    # said they had no energy, and the user had to rewrite the file
    structures = emt_structures(2)
    path = tmp_path / "ref.extxyz"
    write_dataset(path, _relabelled(structures))
    with pytest.raises(ValueError, match=r"structure 0 has no energy or forces; it has \['REF_energy', 'REF_forces'\]"):
        read_dataset(path)
    back = read_dataset(path, energy_key="REF_energy", forces_key="REF_forces", stress_key="REF_stress")
    for x, y in zip(back, structures, strict=True):
        np.testing.assert_allclose(x.get_potential_energy(), y.get_potential_energy(), rtol=1e-12)
        np.testing.assert_allclose(x.get_forces(), y.get_forces(), atol=1e-7)
        np.testing.assert_allclose(x.get_stress(), y.get_stress(), atol=1e-7)
    # mace-torch's virials W = -V·stress: read as a stress (named as one, they were taken as it)
    with_virials = _relabelled(structures)
    for atoms in with_virials:
        atoms.info["REF_virials"] = (-atoms.get_volume() * atoms.info.pop("REF_stress")).reshape(9)
    write_dataset(tmp_path / "virials.extxyz", with_virials)
    back = read_dataset(
        tmp_path / "virials.extxyz", energy_key="REF_energy", forces_key="REF_forces", virials_key="REF_virials"
    )
    for x, y in zip(back, structures, strict=True):
        np.testing.assert_allclose(x.get_stress(), y.get_stress(), atol=1e-9)
    with pytest.raises(ValueError, match=r"no structure has DFT_energy; it has \['REF_energy'\]"):
        read_dataset(path, energy_key="DFT_energy", forces_key="REF_forces")
    with pytest.raises(TypeError, match=r"forces_key must be a non-empty str, got ''"):
        read_dataset(path, forces_key="")
    weighted = _relabelled(structures)
    weighted[1].info["energy_weight"] = 0.0  # not mace-torch's name (config_energy_weight): not read
    write_dataset(tmp_path / "weighted.extxyz", weighted)
    with pytest.warns(UserWarning, match=r"per-structure weights \['energy_weight'\] are not read"):
        read_dataset(tmp_path / "weighted.extxyz", energy_key="REF_energy", forces_key="REF_forces")
    # the named label replaces the file's own: a file with both takes the one asked for
    both = _relabelled(structures)
    for atoms, ref in zip(both, structures, strict=True):
        atoms.calc = ref.calc
        atoms.info["REF_energy"] = 1.0
    write_dataset(tmp_path / "both.extxyz", both)
    assert read_dataset(tmp_path / "both.extxyz", energy_key="REF_energy")[0].get_potential_energy() == 1.0


def test_cli_train_reads_labels_under_the_names_given(tmp_path, monkeypatch):
    import e3j_models.train as train_module

    data = tmp_path / "ref.extxyz"
    write_dataset(data, _relabelled(emt_structures(3)))
    seen = []

    def fake_fit(config, train, valid, **kwargs):
        seen.extend(train)
        assert valid and all(a.get_forces().shape == (len(a), 3) for a in valid)
        raise SystemExit("fit called")

    monkeypatch.setattr(train_module, "fit", fake_fit)
    keys = ["--energy-key", "REF_energy", "--forces-key", "REF_forces", "--stress-key", "REF_stress"]
    with pytest.raises(SystemExit, match="fit called"):
        main(["train", "--data", str(data), "--preset", "nequip", "--out", str(tmp_path / "run"), *keys])
    assert len(seen) == 2 and seen[0].get_forces().shape == (len(seen[0]), 3)
    # a validation file of its own (mace-torch's --valid_file): all of --data trains
    valid = tmp_path / "valid.extxyz"
    write_dataset(valid, _relabelled(emt_structures(2)))
    seen.clear()
    with pytest.raises(SystemExit, match="fit called"):
        main(["train", "--data", str(data), "--valid-file", str(valid), "--out", str(tmp_path / "run2"), *keys])
    assert len(seen) == 3


def _isolated(symbol: str):
    from ase import Atoms

    atom = Atoms(symbol)
    atom.calc = EMT()
    atom.get_forces()
    return atom


def test_isolated_atoms_give_the_reference_energies(tmp_path, monkeypatch):
    # mace-torch's datasets carry IsolatedAtom frames for the E0s; they were trained on as data
    import e3j_models.train as train_module

    ni, cu = _isolated("Ni"), _isolated("Cu")
    structures = emt_structures(4)
    energies, others = isolated_atom_energies([ni, *structures, cu])
    assert energies == {28: ni.get_potential_energy(), 29: cu.get_potential_energy()} and len(others) == 4
    other = _isolated("Cu")
    other.calc.results["energy"] += 1.0
    with pytest.raises(ValueError, match=r"element 29 has isolated-atom energies"):
        isolated_atom_energies([cu, other])
    data = tmp_path / "d.extxyz"
    write_dataset(data, [ni, *structures, cu])
    seen = {}

    def fake_fit(config, train, valid, **kwargs):
        seen.update(config=config, train=train, valid=valid)
        raise SystemExit("fit called")

    monkeypatch.setattr(train_module, "fit", fake_fit)
    with pytest.raises(SystemExit, match="fit called"):
        main(["train", "--data", str(data), "--preset", "nequip", "--e0s", "isolated", "--out", str(tmp_path / "r")])
    assert seen["config"].atomic_energies == (ni.get_potential_energy(), cu.get_potential_energy())
    assert all(len(a) > 1 for a in [*seen["train"], *seen["valid"]])
    write_dataset(data, [cu, *structures])
    with pytest.raises(SystemExit, match=r"--e0s isolated: --data has no isolated atom of element\(s\) \[28\]"):
        main(["train", "--data", str(data), "--e0s", "isolated", "--out", str(tmp_path / "r2")])


def test_prepare_config_fits_reference_energies():
    structures = emt_structures(6)
    cfg = prepare_config(nequip((28, 29), **TINY), structures)
    counts = np.array([[np.sum(a.numbers == 28), np.sum(a.numbers == 29)] for a in structures])
    energies = np.array([a.get_potential_energy() for a in structures])
    resid = energies - counts @ np.array(cfg.atomic_energies)
    # least squares: the residual is orthogonal to the columns (normal equations)
    np.testing.assert_allclose(counts.T @ resid, 0, atol=1e-8 * np.abs(energies).sum())
    assert 1 < cfg.avg_num_neighbors < 20  # fcc Cu/Ni with a 3 Å cutoff: ~12 nearest neighbours
    with pytest.raises(ValueError, match=r"atomic numbers \[29\] unknown"):
        prepare_config(nequip((28,), **TINY), structures)
    # an element in no structure: least squares would give it 0 eV silently
    with pytest.raises(ValueError, match=r"atomic numbers \[13\] of the config \(\[13, 28, 29\]\) occur in none"):
        prepare_config(nequip((13, 28, 29), **TINY), structures)
    # isolated atoms' energies given in the config are kept (they were replaced by the fit)
    given = prepare_config(nequip((28, 29), atomic_energies=(-1.5, -2.5), **TINY), structures)
    assert given.atomic_energies == (-1.5, -2.5) and given.avg_num_neighbors == cfg.avg_num_neighbors


def _shifted(structures, shift: dict):
    """The structures with each energy moved by ``shift[z]`` per atom of element ``z``."""
    from ase.calculators.singlepoint import SinglePointCalculator

    out = []
    for atoms in structures:
        copy = atoms.copy()
        energy = atoms.get_potential_energy() + sum(shift[int(z)] for z in atoms.numbers)
        copy.calc = SinglePointCalculator(copy, energy=energy, forces=atoms.get_forces(), stress=atoms.get_stress())
        out.append(copy)
    return out


def test_float32_training_keeps_the_digits_of_large_absolute_energies():
    # all-electron totals (~4e4 eV per atom for Cu) cast to float32 were rounded by ~0.1 eV before
    # the reference energies were taken out: a noise floor of meV/atom in targets and metrics
    structures = emt_structures(4)
    e0 = prepare_config(nequip((28, 29), **TINY), structures[:3]).atomic_energies
    shift = {28: -41000.0, 29: -44000.0}
    kw = {"steps": 3, "batch_size": 2, "progress": False, "eval_every": 3}
    plain = fit(nequip((28, 29), atomic_energies=e0, **TINY), structures[:3], structures[3:], **kw)
    moved_e0 = tuple(e + shift[z] for e, z in zip(e0, (28, 29), strict=True))
    moved = _shifted(structures, shift)
    big = fit(nequip((28, 29), atomic_energies=moved_e0, **TINY), moved[:3], moved[3:], **kw)
    np.testing.assert_allclose(big.history["train_loss"], plain.history["train_loss"], rtol=1e-5)
    assert abs(big.validation["energy_mae_per_atom"] - plain.validation["energy_mae_per_atom"]) < 1e-5


def test_fit_continues_from_given_parameters(tmp_path):
    # fine-tuning: the loaded config's constants are what its parameters compute with; recomputing
    # avg_num_neighbors on the new data changed the loaded model's energies before any step
    import jax

    from e3j_models import Potential, save

    structures = emt_structures(5)
    first = fit(nequip((28, 29), **TINY), structures[:3], structures[3:], steps=2, progress=False)
    save(tmp_path / "m.npz", first.config, first.params)
    config, params = load(tmp_path / "m.npz")
    from ase.build import bulk

    only_cu = []  # a subset of the elements: copper alone
    for seed in (1, 2):
        atoms = bulk("Cu", cubic=True) * (2, 2, 2)
        atoms.rattle(0.05, seed=seed)
        atoms.calc = EMT()
        atoms.get_stress()
        only_cu.append(atoms)
    more = fit(config, only_cu, structures[3:], steps=1, learning_rate=1e-12, progress=False, params=params)
    assert more.config == config
    batch = Potential(config).batch(structures[3:])
    before = Potential(config).energy(params, batch)
    after = Potential(more.config).energy(jax.tree.map(np.asarray, more.params), batch)
    np.testing.assert_allclose(after, before, rtol=1e-5)  # a step of 1e-12 changes nothing visible
    with pytest.raises(ValueError, match=r"config has no atomic_energies: fine-tuning params needs the config"):
        fit(nequip((28, 29), **TINY), structures[:3], structures[3:], steps=1, progress=False, params=params)


def test_evaluate_structures_and_the_test_command(tmp_path, capsys):
    # a test set's errors: there was no public way to compute them but a Calculator loop
    import json

    from e3j_models import Potential, save
    from e3j_models.train import evaluate_structures

    structures = emt_structures(5)
    result = fit(nequip((28, 29), **TINY), structures[:3], structures[3:], steps=2, progress=False)
    pot, params = Potential(result.config), result.params
    got = evaluate_structures(pot, params, structures[3:], batch_size=1)
    # the oracle: each structure evaluated alone, errors taken in numpy
    de, df, ds = [], [], []
    for atoms in structures[3:]:
        out = pot(params, pot.batch([atoms]), stress=True)
        de.append((float(out["energy"][0]) - atoms.get_potential_energy()) / len(atoms))
        df.append(np.asarray(out["forces"])[: len(atoms)] - atoms.get_forces())
        ds.append(np.asarray(out["stress"][0]) - atoms.get_stress(voigt=False))
    de, df, ds = np.array(de), np.concatenate(df), np.array(ds)
    assert got["structures"] == 2 and got["atoms"] == sum(len(a) for a in structures[3:])
    np.testing.assert_allclose(got["energy_mae_per_atom"], np.abs(de).mean(), rtol=1e-4)
    np.testing.assert_allclose(got["energy_rmse_per_atom"], np.sqrt(np.square(de).mean()), rtol=1e-4)
    np.testing.assert_allclose(got["force_mae"], np.abs(df).mean(), rtol=1e-4)
    np.testing.assert_allclose(got["force_rmse"], np.sqrt(np.square(df).mean()), rtol=1e-4)
    np.testing.assert_allclose(got["stress_mae"], np.abs(ds).mean(), rtol=1e-3)
    np.testing.assert_allclose(got["energy_mae_per_atom"], result.validation["energy_mae_per_atom"], rtol=1e-4)
    # the command line: the same numbers, from a checkpoint and a file
    save(tmp_path / "m.npz", result.config, params)
    write_dataset(tmp_path / "test.extxyz", structures[3:])
    model, data = str(tmp_path / "m.npz"), str(tmp_path / "test.extxyz")
    main(["test", "--model", model, "--data", data, "--out", str(tmp_path / "t.json")])
    written = json.loads((tmp_path / "t.json").read_text())
    assert written["command"].startswith("python -m e3j_models test --model")
    np.testing.assert_allclose(written["force_mae"], got["force_mae"], rtol=1e-5)
    with pytest.raises(SystemExit, match=r"--out: the folder '.*missing' does not exist"):
        main(["test", "--model", str(tmp_path / "m.npz"), "--data", "x", "--out", str(tmp_path / "missing" / "t.json")])
    with pytest.raises(SystemExit, match=r"error: --batch-size must be an int > 0, got 0"):
        main(["test", "--model", model, "--data", data, "--batch-size", "0"])
    (tmp_path / "junk.npz").write_text("not a checkpoint")
    with pytest.raises(SystemExit, match=r"error: --model: .*junk.npz' is not an e3j-models file"):
        main(["test", "--model", str(tmp_path / "junk.npz"), "--data", data])
    # the metrics read every stress label: a NaN one was a stress MAE of NaN, and the structures are
    # named as the caller knows them (the command line's: by their place in --data, not train[k])
    bad = read_dataset(data)
    bad[1].calc.results["stress"] = np.full(6, np.nan)
    with pytest.raises(ValueError, match=r"structures\[1\] has a reference stress that is not 6 or 3×3 finite"):
        evaluate_structures(pot, params, bad)
    write_dataset(tmp_path / "bad.extxyz", bad)
    with pytest.raises(SystemExit, match=r"error: --data structure 1 has a reference stress that is not 6 or 3×3"):
        main(["test", "--model", model, "--data", str(tmp_path / "bad.extxyz")])
    bad = read_dataset(data)
    bad[0].positions[1] = np.nan
    write_dataset(tmp_path / "bad.extxyz", bad)
    with pytest.raises(SystemExit, match=r"error: positions \(--data structure 0\) must be finite"):
        main(["test", "--model", model, "--data", str(tmp_path / "bad.extxyz")])
    # per-structure weights do not enter the metrics: one the loss would refuse does not stop them
    weighted = read_dataset(data)
    weighted[1].info["config_weight"] = -1.0
    write_dataset(tmp_path / "weighted.extxyz", weighted)
    main(["test", "--model", model, "--data", str(tmp_path / "weighted.extxyz"), "--out", str(tmp_path / "w.json")])
    assert json.loads((tmp_path / "w.json").read_text())["force_mae"] == written["force_mae"]
    with pytest.raises(ValueError, match=r"train\[1\] has config_weight -1.0: a per-structure weight must be"):
        check_training_data(result.config, weighted, (1.0, 1.0, 0.0))
    # a float64 checkpoint (fit(dtype=np.float64)'s) is scored in a process without JAX's 64-bit
    # mode, as md runs it: the command switches it on (it refused, naming a call a shell cannot make)
    import subprocess
    import sys

    import jax

    save(tmp_path / "m64.npz", result.config, jax.tree.map(lambda a: np.asarray(a, np.float64), params))
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    command = [sys.executable, "-m", "e3j_models", "test", "--model", str(tmp_path / "m64.npz"), "--data", data]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    want = evaluate_structures(pot, jax.tree.map(lambda a: np.asarray(a, np.float64), params), structures[3:])
    np.testing.assert_allclose(json.loads(out.stdout)["force_mae"], want["force_mae"], rtol=1e-9)  # float32: ~1e-7


def test_training_decreases_loss_and_matches_e3nn_twin():
    pytest.importorskip("e3nn_jax")
    s = emt_structures(3, repeats=[(2, 2, 2)])
    cfg = nequip((28, 29), **TINY)
    kw = dict(steps=12, batch_size=2, learning_rate=1e-2, progress=False)
    e3j = fit(cfg, s[:2], s[2:], **kw)
    loss = np.array(e3j.history["train_loss"])
    assert loss[-1] < 0.97 * loss[0]
    assert np.all(np.diff(loss) < 0)  # one batch, small steps: every step lowers the loss
    twin = fit(cfg, s[:2], s[2:], backend="e3nn", **kw)
    np.testing.assert_allclose(twin.history["train_loss"][:5], loss[:5], rtol=1e-5)
    with pytest.raises(ValueError, match="steps must be an int > 0"):
        fit(cfg, s[:2], s[2:], steps=0)
    with pytest.raises(ValueError, match="valid is empty"):
        fit(cfg, s[:2], [], steps=1)
    with pytest.raises(ValueError, match=r"learning_rate must be a finite number > 0, got -0.01"):
        fit(cfg, s[:2], s[2:], steps=1, learning_rate=-0.01)
    with pytest.raises(ValueError, match=r"learning_rate must be a finite number > 0, got -0.01"):
        fit(cfg, s[:2], s[2:], steps=1, learning_rate=np.array(-0.01))  # a 0-d array is its number
    with pytest.raises(ValueError, match=r"eval_every must be an int >= 0"):
        fit(cfg, s[:2], s[2:], steps=1, eval_every=-1)
    # a NaN weight once switched its term off silently (NaN > 0 is False) or blamed the learning rate
    for weights, match in [
        ((1.0, 1.0, float("nan")), r"weights\[2\] must be a finite number >= 0, got nan"),
        ((float("inf"), 1.0, 0.0), r"weights\[0\] must be a finite number >= 0, got inf"),
        ((0.0, 0.0, 0.0), r"weights\[0\], weights\[1\], weights\[2\] are all 0"),
        ((1.0, 1.0), r"weights must be 3 numbers >= 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            fit(cfg, s[:2], s[2:], steps=1, weights=weights)


def test_repeated_evaluation_compiles_once():
    """fit validates every eval_every steps through evaluate: the second call on the same potential
    and batch shapes must not compile again (each one cost a compile of energy and forces)."""
    import jax

    from e3j_models import Potential
    from e3j_models._batching import _batches
    from e3j_models.train import evaluate

    s = emt_structures(2, repeats=[(2, 2, 2)])
    cfg = prepare_config(nequip((28, 29), **TINY), s)
    pot = Potential(cfg)
    batches = _batches(s, cfg, 2, None, np.float32)
    params = pot.init(jax.random.key(0), batches[0][0])
    compiles = []
    listener = lambda event, duration, **kw: compiles.append(event) if "backend_compile" in event else None  # noqa: E731
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        first = evaluate(pot, params, batches)
        n_first = len(compiles)
        second = evaluate(pot, params, batches)
        third = evaluate(Potential(cfg), params, batches)  # an equal potential (fit builds its own)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert n_first >= 1 and len(compiles) == n_first, f"compiled {len(compiles) - n_first} more times"
    assert first == second == third and np.isfinite(first["force_mae"])
    assert Potential(cfg) == pot and hash(Potential(cfg)) == hash(pot) and Potential(cfg, "e3nn") != pot


def test_smoothed_loss_decreases_monotonically():
    # the smoothed curve is the epoch mean (epoch_losses): 4 batches of 2 structures, 6 epochs
    s = emt_structures(9, repeats=[(2, 2, 2)])
    result = fit(nequip((28, 29), **TINY), s[:8], s[8:], steps=24, batch_size=2, learning_rate=5e-2, progress=False)
    assert result.history["steps_per_epoch"] == 4
    epochs = epoch_losses(result.history)
    assert epochs.shape == (6,)
    assert np.all(np.diff(epochs) < 0), f"epoch-mean loss not monotone: {epochs}"
    assert epochs[-1] < 0.7 * epochs[0]
    # the definition: a per-step curve with a hard batch every epoch is not monotone, its epoch means are
    history = {"train_loss": [3.0, 1.0, 2.9, 0.9, 2.8, 0.8], "steps_per_epoch": 2}
    np.testing.assert_allclose(epoch_losses(history), [2.0, 1.9, 1.8])
    with pytest.raises(ValueError, match="steps_per_epoch must be an int > 0"):
        epoch_losses({"train_loss": [1.0]})


def test_cli_train_writes_outputs_and_refuses_bad_input(tmp_path, capsys):
    data = tmp_path / "d.extxyz"
    main(["data", "--num", "3", "--out", str(data)])
    out = tmp_path / "run"
    args = ["train", "--data", str(data), "--preset", "nequip", "--out", str(out), "--channels", "2", "--layers", "1"]
    args += ["--l-max", "1", "--cutoff", "3.0", "--radial-hidden", "4", "--steps", "2", "--batch-size", "2"]
    main([*args, "--eval-every", "1", "--valid-fraction", "0.34"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train_structures"] == 2 and metrics["valid_structures"] == 1
    # the command as given (sys.argv is pytest's here)
    assert metrics["command"] == "python -m e3j_models " + " ".join(
        [*args, "--eval-every", "1", "--valid-fraction", "0.34"]
    )
    assert (out / "loss.png").stat().st_size > 1000
    cfg, _ = load(out / "model.npz")
    assert cfg.atomic_numbers == (28, 29) and cfg.atomic_energies is not None
    with pytest.raises(SystemExit, match="does not exist"):
        main(["train", "--data", str(tmp_path / "nope.extxyz"), "--out", str(tmp_path / "x")])
    assert not os.path.exists(tmp_path / "x" / "metrics.json")
    # a negative rate would climb the loss and exit 0; a negative interval validated every step
    with pytest.raises(SystemExit, match=r"--lr must be > 0, got -1.0"):
        main([*args[:5], "--out", str(tmp_path / "y"), "--lr", "-1"])
    with pytest.raises(SystemExit, match=r"--eval-every must be >= 0 .*got -1"):
        main([*args[:5], "--out", str(tmp_path / "y"), "--eval-every", "-1"])
    # the config's fields named by the flags that set them (the message named num_channels)
    for flag, value, field in [("--channels", "0", "num_channels"), ("--radial-hidden", "0", "radial_mlp")]:
        with pytest.raises(SystemExit, match=rf"error: {flag}: {field} must be"):
            main([*args[:5], "--out", str(tmp_path / "y"), flag, value])
    assert not os.path.exists(tmp_path / "y")
    # a refused command leaves the previous run's files as they were
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for extra, match in [
        (["--steps", "0"], r"--steps must be an int > 0, got 0"),
        (["--batch-size", "0"], r"--batch-size must be an int > 0, got 0"),
        (["--stress-weight", "nan"], r"--stress-weight must be a finite number >= 0, got nan"),
        (["--energy-weight", "-1"], r"--energy-weight must be a finite number >= 0, got -1.0"),
        (
            ["--energy-weight", "0", "--force-weight", "0"],
            r"--energy-weight, --force-weight, --stress-weight are all 0",
        ),
        (["--valid-fraction", "nan"], r"--valid-fraction must be in \(0, 1\), got nan"),
        (["--backend", "nope"], r"--backend: backend must be None, 'e3nn' or an installed e3j backend"),
    ]:
        with pytest.raises(SystemExit, match=match):
            main([*args, *extra])
    # training data that fit refuses: refused before --out is touched too
    unlabelled = read_dataset(args[2])
    for atoms in unlabelled:
        atoms.calc.results.pop("stress", None)
    write_dataset(tmp_path / "no-stress.extxyz", unlabelled)
    with pytest.raises(SystemExit, match=r"--data: --stress-weight \(stress\) is 1.0 but no training structure"):
        main([*args[:1], "--data", str(tmp_path / "no-stress.extxyz"), *args[3:], "--stress-weight", "1"])
    # labels fit cannot use and atoms the model cannot read, named by their place in the file (a
    # coincident pair was named by its place in a shuffled batch, after --out was emptied; a NaN
    # force in the validation part gave a "completed" run without a model)
    for k, (change, match) in enumerate(
        [
            (lambda a: a.positions.__setitem__(2, a.positions[0]), r"atoms 2 and 0 \(STRUCTURE\) coincide"),
            (lambda a: a.positions.__setitem__((0, 1), np.nan), r"positions \(STRUCTURE\) must be finite"),
            (
                lambda a: a.calc.results["forces"].__setitem__((0, 0), np.inf),
                r"STRUCTURE has non-finite reference forces",
            ),
            (
                lambda a: a.calc.results.__setitem__("energy", np.nan),
                r"STRUCTURE has a reference energy that is not one",
            ),
        ]
    ):
        # one of the file's 3 structures validates; each is named by its place in the file
        held = {}
        for seed, which in itertools.product(range(4) if k == 0 else (0,), (0, 1, 2)):
            bad = read_dataset(args[2])
            change(bad[which])
            write_dataset(tmp_path / f"bad{k}.extxyz", bad)
            pattern = "error: " + match.replace("STRUCTURE", rf"--data structure {which}( \(validation\))?")
            with pytest.raises(SystemExit, match=pattern) as err:
                extra = ["--valid-fraction", "0.34", "--seed", str(seed)]
                main([*args[:1], "--data", str(tmp_path / f"bad{k}.extxyz"), *args[3:], *extra])
            if "(validation)" in str(err.value):
                held.setdefault(seed, []).append(which)
        assert all(len(v) == 1 for v in held.values()) and len(held) == (4 if k == 0 else 1), held
        if k == 0:  # the split is drawn by --seed (mace-torch's), not the file's tail
            assert len({v[0] for v in held.values()}) > 1, held
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SystemExit, match=r"--out '.*a_file' exists and is not a directory"):
        main([*args[:5], "--out", str(tmp_path / "a_file")])
    # forces of another shape (extxyz cannot hold them: given in memory, to fit)
    bad = read_dataset(args[2])
    bad[0].calc.results["forces"] = np.zeros((1, 3))
    with pytest.raises(ValueError, match=r"train\[0\] has reference forces of shape \(1, 3\), expected \[30, 3\]"):
        check_training_data(nequip((28, 29), num_layers=1), bad[:2], (1.0, 1.0, 0.0), bad[2:])
    # a stress the loss does not read is not checked: with no stress weight, data that trained still does
    bad = read_dataset(args[2])
    bad[1].calc.results["stress"] = np.full(6, np.nan)
    check_training_data(nequip((28, 29), num_layers=1), bad[:2], (1.0, 1.0, 0.0), bad[2:])
    with pytest.raises(ValueError, match=r"train\[1\] has a reference stress that is not 6 or 3×3 finite numbers"):
        check_training_data(nequip((28, 29), num_layers=1), bad[:2], (1.0, 1.0, 1.0), bad[2:])
    # but its shape is, whatever the weight: the batches read every stress label (a 9-vector was an
    # unpacking error naming no structure)
    bad[1].calc.results["stress"] = np.zeros(9)
    with pytest.raises(ValueError, match=r"train\[1\] has a reference stress that is not 6 or 3×3 numbers"):
        check_training_data(nequip((28, 29), num_layers=1), bad[:2], (1.0, 1.0, 0.0), bad[2:])
    # data writes one file: a directory as --out was a traceback and a stray .partial file
    with pytest.raises(SystemExit, match=r"--out '.*run' is a directory: name the extxyz file to write"):
        main(["data", "--num", "1", "--out", str(out)])
    # numpy's own words for these named no flag ("expected non-negative integer")
    for command, flag, bad_value, rule in (
        (["data", "--num", "1", "--out", str(tmp_path / "s.extxyz")], "--seed", "-1", ">= 0"),
        ([*args[:5], "--out", str(tmp_path / "seeded")], "--seed", "-1", ">= 0"),
        (["data", "--out", str(tmp_path / "s.extxyz")], "--num", "0", "> 0"),
    ):
        with pytest.raises(SystemExit, match=rf"error: {flag} must be an int {rule}, got {bad_value}"):
            main([*command, flag, bad_value])
    assert not (tmp_path / "s.extxyz").exists() and not (tmp_path / "seeded").exists()
    assert not os.path.exists(str(out) + ".partial")
    with pytest.raises(SystemExit, match=r"--out '.*nowhere/d.extxyz': its folder '.*nowhere' does not exist"):
        main(["data", "--num", "1", "--out", str(tmp_path / "nowhere" / "d.extxyz")])
    # a name ASE reads as another format: refused before the structures are computed (extxyz text
    # under a .cif name was written, and read back as CIF)
    with pytest.raises(SystemExit, match=r"--out: dataset path '.*d.cif': ASE reads that name as 'cif'"):
        main(["data", "--num", "1", "--out", str(tmp_path / "d.cif")])
    assert not os.path.exists(tmp_path / "d.cif") and not os.path.exists(tmp_path / "d.cif.partial")


def test_stress_weight_with_an_open_structure_gives_finite_gradients():
    """A structure without a cell has no stress label: it adds 0 to the stress term and so does its
    gradient (the NaN stress of an open structure once made every gradient NaN), while its
    batch-mates' labels count."""
    import jax
    import jax.numpy as jnp
    from ase.build import bulk
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.cluster import Octahedron

    from e3j_models import Potential
    from e3j_models._batching import _batches
    from e3j_models.train import loss_fn

    def labelled(atoms):
        atoms.calc = EMT()
        res = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces()}
        if atoms.pbc.all():
            res["stress"] = atoms.get_stress()
        atoms.calc = SinglePointCalculator(atoms, **res)
        return atoms

    rng = np.random.default_rng(0)
    periodic = bulk("Cu", "fcc", a=3.6, cubic=True)
    periodic.positions += rng.normal(scale=0.05, size=periodic.positions.shape)
    cluster = Octahedron("Cu", 2)
    cluster.positions += rng.normal(scale=0.05, size=cluster.positions.shape)
    structures = [labelled(periodic), labelled(cluster)]
    cfg = nequip((29,), **{**TINY, "num_channels": 2})
    pot = Potential(cfg)
    ((batch, labels),) = _batches(structures, cfg, 2, None, np.float32)
    # per structure: the periodic one's label counts though its batch-mate has none (a whole batch
    # once lost its stress term to one open structure, which batches depend on the seed)
    assert labels.has_stress.tolist() == [True, False]
    ((open_batch, open_labels),) = _batches(structures[1:], cfg, 1, None, np.float32)
    assert labels.has_stress.shape == (2,) and open_labels.has_stress.tolist() == [False]
    params = pot.init(jax.random.key(0), batch)
    grads, parts = {}, {}
    for key, (b, lab) in {"mixed": (batch, labels), "open": (open_batch, open_labels)}.items():
        for w in ((1.0, 1.0, 0.0), (1.0, 1.0, 1.0)):
            (loss, parts[key, w]), grads[key, w] = jax.value_and_grad(
                lambda p, w=w, b=b, lab=lab: loss_fn(pot, p, b, lab, w), has_aux=True
            )(params)
            assert np.isfinite(float(loss))
            assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads[key, w]))
    # the stress of the open structure stays NaN in the potential's output (ASE: undefined)
    out = pot(params, batch, stress=True)
    assert bool(jnp.all(jnp.isnan(out["stress"][1]))) and bool(jnp.all(jnp.isfinite(out["stress"][0])))
    want = float(jnp.mean((out["stress"][0] - labels.stress[0]) ** 2))
    assert float(parts["mixed", (1.0, 1.0, 1.0)]["stress"]) == pytest.approx(want, rel=1e-5) and want > 0
    # no stress label in the batch: the term is 0 and the stress weight changes nothing
    assert float(parts["open", (1.0, 1.0, 1.0)]["stress"]) == 0.0
    jax.tree.map(np.testing.assert_allclose, grads["open", (1.0, 1.0, 0.0)], grads["open", (1.0, 1.0, 1.0)])
    fit(cfg, structures, structures[:1], steps=2, batch_size=2, weights=(1.0, 1.0, 1.0), progress=False)
    # a stress weight with no stress label anywhere in the training data would train without it
    with pytest.raises(ValueError, match=r"weights\[2\] \(stress\) is 1.0 but no training structure has a stress"):
        fit(cfg, structures[1:], structures[:1], steps=2, weights=(1.0, 1.0, 1.0), progress=False)


def test_fit_refuses_float64_without_x64():
    # JAX would train in float32 without a word (as the Calculator already refused)
    import jax

    structures = emt_structures(2)
    with jax.enable_x64(False), pytest.raises(ValueError, match="jax_enable_x64"):
        fit(nequip((28, 29), **TINY), structures, structures, steps=1, dtype=np.float64, progress=False)
    with pytest.raises(ValueError, match="float32 or float64"):
        fit(nequip((28, 29), **TINY), structures, structures, steps=1, dtype=np.int32, progress=False)


def test_fit_names_what_it_refuses_before_training(tmp_path):
    # each used to fail deep inside (an Atom without .calc, numpy's seed message) or, for the
    # checkpoint, after the whole run, when the model was written
    structures = emt_structures(2)
    cfg = nequip((28, 29), **TINY)
    kw = {"steps": 1, "progress": False}
    one = structures[0]
    for call, exc, match in [
        (lambda: fit(cfg, one, structures, **kw), TypeError, r"train must be a list of structures, got one Atoms"),
        (lambda: fit(cfg, structures, one, **kw), TypeError, r"valid must be a list of structures, got one Atoms"),
        (lambda: fit("nequip", structures, structures, **kw), TypeError, r"config must be a MACEConfig or"),
        (lambda: fit(cfg, structures, structures, seed=-1, **kw), ValueError, r"seed must be an int >= 0, got -1"),
        (
            lambda: fit(cfg, structures, structures, checkpoint=tmp_path / "missing" / "m.npz", **kw),
            ValueError,
            r"checkpoint: the folder '.*missing' does not exist",
        ),
        (lambda: fit(cfg, structures, structures, checkpoint=tmp_path, **kw), ValueError, r"is a folder"),
    ]:
        with pytest.raises(exc, match=match):
            call()
    # the dicts batching takes carry no labels: an AttributeError named no argument
    unlabelled = {"positions": one.positions, "numbers": one.numbers, "cell": one.cell[:], "pbc": one.pbc}
    atoms = r"must be an ase.Atoms with its labels in atoms.calc.results .* got dict"
    for call, name in [
        (lambda: fit(cfg, [*structures, unlabelled], structures, **kw), r"train\[2\]"),
        (lambda: fit(cfg, structures, [unlabelled], **kw), r"valid\[0\]"),
        (lambda: prepare_config(cfg, [unlabelled]), r"structures\[0\]"),
        (lambda: isolated_atom_energies([unlabelled]), r"structures\[0\]"),
        (lambda: evaluate_structures(Potential(cfg), {}, [unlabelled]), r"structures\[0\]"),
    ]:
        with pytest.raises(TypeError, match=name + " " + atoms):
            call()


@pytest.mark.parametrize(
    "flag, key, value",
    [
        ([], "factored_radial", True),
        (["--array-radial"], "factored_radial", False),
        ([], "batch_shapes", 4),
        (["--batch-shapes", "1"], "batch_shapes", 1),
    ],
)
def test_cli_train_passes_its_flags_to_fit(tmp_path, monkeypatch, flag, key, value):
    import e3j_models.train as train_module

    data = tmp_path / "d.extxyz"
    main(["data", "--num", "3", "--out", str(data)])
    seen = {}

    def fake_fit(*args, **kwargs):
        seen.update(kwargs)
        raise SystemExit("fit called")

    monkeypatch.setattr(train_module, "fit", fake_fit)
    with pytest.raises(SystemExit, match="fit called"):
        main(["train", "--data", str(data), "--preset", "nequip", "--out", str(tmp_path / "run"), *flag])
    assert seen[key] == value and type(seen[key]) is type(value)


@pytest.mark.parametrize(
    "preset, l_max, field, value",
    [
        ("nequip", 0, "node_irreps", "2x0e"),
        ("nequip", 1, "node_irreps", "2x0e + 1o"),
        ("nequip", 2, "node_irreps", "2x0e + 1o + 2e"),
        ("nequip", 3, "node_irreps", "2x0e + 1o + 2e"),
        ("mace_a", 0, "node_symmetry", 0),
        ("mace_a", 1, "node_symmetry", 1),
        ("mace_a", 3, "node_symmetry", 2),  # Table 3's MACE (a): 2
        ("mace_b", 3, "node_symmetry", 1),  # Table 3's MACE (b): 1
    ],
)
def test_cli_train_hidden_irreps_follow_l_max(tmp_path, monkeypatch, preset, l_max, field, value):
    """The preset's node features, capped by ``--l-max`` (with ``--l-max 0`` the edges carry 0e
    only, so features of higher degree would stay zero)."""
    import e3j_models.train as train_module

    data = tmp_path / "d.extxyz"
    main(["data", "--num", "3", "--out", str(data)])
    seen = []

    def fake_fit(config, *args, **kwargs):
        seen.append(config)
        raise SystemExit("fit called")

    monkeypatch.setattr(train_module, "fit", fake_fit)
    with pytest.raises(SystemExit, match="fit called"):
        main(["train", "--data", str(data), "--preset", preset, "--l-max", str(l_max), "--out", str(tmp_path / "r")])
    want = str(Irreps(value)) if field == "node_irreps" else value
    assert (seen[0].l_max, getattr(seen[0], field)) == (l_max, want)


def test_cli_names_elements_held_only_by_validation_structures(tmp_path, monkeypatch):
    """The command line's elements are the data's: one that only validation structures hold got
    fit's message, which suggests editing atomic_numbers (the command line builds them) and names
    no structure. Named with the structures and the flags that move them."""
    from ase.build import bulk

    import e3j_models.train as train_module

    monkeypatch.setattr(train_module, "fit", lambda *a, **k: pytest.fail("fit called"))
    gold = bulk("Au", "fcc", a=4.08, cubic=True)
    gold.calc = EMT()
    gold.get_forces()
    structures = emt_structures(5)
    data = tmp_path / "d.extxyz"
    write_dataset(data, [*structures[:3], gold, *structures[3:]])  # gold is --data's structure 3
    seeds = [s for s in range(40) if 3 in np.random.default_rng(s).permutation(6)[:1]]
    held = r"element\(s\) \[79\] occur only in validation structures \(--data structure\(s\) \[3\]\).*--seed"
    with pytest.raises(SystemExit, match=held):
        main(["train", "--data", str(data), "--seed", str(seeds[0]), "--out", str(tmp_path / "r")])
    write_dataset(data, structures)
    valid = tmp_path / "v.extxyz"
    write_dataset(valid, [structures[0], gold])
    with pytest.raises(
        SystemExit,
        match=r"\[79\] occur only in validation structures \(--valid-file structure\(s\) \[1\]\).*into --data",
    ):
        main(["train", "--data", str(data), "--valid-file", str(valid), "--out", str(tmp_path / "r2")])
