"""Training on partly labelled data and per-structure weights (mace-torch's conventions)."""

import warnings

import numpy as np
import pytest

pytest.importorskip("ase")
pytest.importorskip("optax")

from ase.calculators.singlepoint import SinglePointCalculator

from e3j_models import Potential, nequip
from e3j_models._batching import _batches
from e3j_models.data import emt_structures, read_dataset, write_dataset
from e3j_models.train import evaluate_structures, fit, loss_fn, prepare_config

TINY = dict(num_layers=1, num_channels=4, node_irreps="0e + 1o", l_max=1, cutoff=3.0, radial_mlp=(8,))


def _relabel(atoms, *, energy=True, forces=True, stress=True, **info):
    """A copy of ``atoms`` keeping only the labels asked for, with ``info`` added."""
    copy = atoms.copy()
    res = {}
    if energy:
        res["energy"] = atoms.get_potential_energy()
    if forces:
        res["forces"] = atoms.get_forces()
    if stress:
        res["stress"] = atoms.get_stress()
    copy.calc = SinglePointCalculator(copy, **res)
    copy.info.update(info)
    return copy


@pytest.fixture(scope="module")
def setup():
    import jax

    structures = emt_structures(4, repeats=[(2, 2, 2)])
    cfg = prepare_config(nequip((28, 29), **TINY), structures)
    pot = Potential(cfg)
    ((batch, _),) = _batches(structures[:1], cfg, 1, None, np.float64)
    params = pot.init(jax.random.key(0), jax.device_put(batch), dtype=np.float64)
    return structures, cfg, pot, params


def _loss(setup, structures, weights=(1.0, 1.0, 1.0)):
    import jax

    _, cfg, pot, params = setup
    ((batch, labels),) = _batches(structures, cfg, len(structures), None, np.float64)
    loss, parts = loss_fn(pot, params, jax.device_put(batch), jax.device_put(labels), weights)
    return float(loss), {k: float(v) for k, v in parts.items()}


def _errors(setup, atoms):
    """One structure's squared errors: energy per atom, forces (sum over components), stress (mean)."""
    import jax

    _, cfg, pot, params = setup
    ((batch, labels),) = _batches([atoms], cfg, 1, None, np.float64)
    out = pot(params, jax.device_put(batch), forces=True, stress=True)
    n = len(atoms)
    e = float(((out["energy"][0] - labels.energy[0]) / n) ** 2)
    f = float(np.sum((np.asarray(out["forces"])[:n] - atoms.get_forces()) ** 2))
    s = float(np.mean((np.asarray(out["stress"][0]) - np.asarray(labels.stress[0])) ** 2))
    return e, f, s


def test_per_structure_weights_scale_each_term_as_mace_torch_does(setup):
    structures = setup[0][:3]
    errors = [_errors(setup, a) for a in structures]
    n = [len(a) for a in structures]
    plain = [_relabel(a) for a in structures]
    weighted = [
        _relabel(structures[0], config_weight=2.0),
        _relabel(structures[1], config_energy_weight=3.0, config_stress_weight=0.5),
        _relabel(structures[2], config_forces_weight=0.25),
    ]
    _, p = _loss(setup, plain)
    _, w = _loss(setup, weighted)
    # the oracle: each structure's errors weighted and averaged over the structures (atoms) by hand
    e = [x[0] for x in errors]
    f = [x[1] for x in errors]
    s = [x[2] for x in errors]
    assert p["energy"] == pytest.approx(np.mean(e), rel=1e-9)
    assert p["forces"] == pytest.approx(sum(f) / (3 * sum(n)), rel=1e-9)
    assert w["energy"] == pytest.approx((2 * e[0] + 3 * e[1] + e[2]) / 3, rel=1e-9)
    assert w["forces"] == pytest.approx((2 * f[0] + f[1] + 0.25 * f[2]) / (3 * sum(n)), rel=1e-9)
    assert w["stress"] == pytest.approx((2 * s[0] + 0.5 * s[1] + s[2]) / 3, rel=1e-9)


def test_a_structure_of_weight_zero_or_without_a_label_counts_for_nothing(setup):
    structures = setup[0][:3]
    both = [_relabel(a) for a in structures[:2]]
    loss_two, parts_two = _loss(setup, both)
    loss_zero, _ = _loss(setup, [*both, _relabel(structures[2], config_weight=0.0)])
    assert loss_zero == pytest.approx(loss_two, rel=1e-12)
    # no forces on the third: the force term is the first two's, the energy term all three's
    _, no_forces = _loss(setup, [*both, _relabel(structures[2], forces=False)])
    _, all_three = _loss(setup, [_relabel(a) for a in structures])
    assert no_forces["forces"] == pytest.approx(parts_two["forces"], rel=1e-12)
    assert no_forces["energy"] == pytest.approx(all_three["energy"], rel=1e-12)
    _, no_energy = _loss(setup, [*both, _relabel(structures[2], energy=False)])
    assert no_energy["energy"] == pytest.approx(parts_two["energy"], rel=1e-12)
    assert no_energy["forces"] == pytest.approx(all_three["forces"], rel=1e-12)


def test_energy_only_data_trains_and_is_refused_with_a_force_weight():
    structures = [_relabel(a, forces=False) for a in emt_structures(5, repeats=[(2, 2, 2)])]
    cfg = nequip((28, 29), **TINY)
    with pytest.raises(ValueError, match=r"weights\[1\] \(forces\) is 1.0 but no training structure has forces"):
        fit(cfg, structures[:3], structures[3:], steps=1, progress=False)
    result = fit(cfg, structures[:3], structures[3:], steps=2, weights=(1.0, 0.0, 0.0), eval_every=1, progress=False)
    assert set(result.validation) == {"energy_mae_per_atom"} and np.isfinite(result.validation["energy_mae_per_atom"])
    assert all(set(v) == {"energy_mae_per_atom"} for v in result.history["valid"])


def test_partly_labelled_test_set_metrics_count_the_labelled(setup):
    structures, _, pot, params = setup
    full = evaluate_structures(pot, params, structures[:2], batch_size=4)
    only_first = evaluate_structures(pot, params, structures[:1], batch_size=4)
    mixed = [_relabel(structures[0]), _relabel(structures[1], forces=False)]
    got = evaluate_structures(pot, params, mixed, batch_size=4)
    assert got["structures"] == 2 and got["atoms"] == len(structures[0]) + len(structures[1])
    assert got["energy_mae_per_atom"] == pytest.approx(full["energy_mae_per_atom"], rel=1e-9)
    assert got["force_mae"] == pytest.approx(only_first["force_mae"], rel=1e-9)
    assert got["force_rmse"] == pytest.approx(only_first["force_rmse"], rel=1e-9)
    # config weights do not enter metrics
    weighted = evaluate_structures(pot, params, [_relabel(a, config_weight=0.0) for a in structures[:2]])
    assert weighted["force_mae"] == pytest.approx(full["force_mae"], rel=1e-9)


def test_bad_per_structure_weights_and_labels_are_named():
    structures = emt_structures(3, repeats=[(2, 2, 2)])
    cfg = nequip((28, 29), **TINY)
    kw = {"steps": 1, "progress": False}
    for value, shown in ((-1.0, "-1.0"), (float("nan"), "nan"), ("heavy", "'heavy'")):
        bad = [structures[0], _relabel(structures[1], config_forces_weight=value)]
        with pytest.raises(ValueError, match=rf"train\[1\] has config_forces_weight {shown}: a per-structure weight"):
            fit(cfg, bad, structures[2:], **kw)
    bare = structures[1].copy()  # no calculator: no label at all
    with pytest.raises(ValueError, match=r"train\[1\] has no reference energy or forces"):
        fit(cfg, [structures[0], bare], structures[2:], **kw)
    from e3j_models.train import isolated_atom_energies

    atom = structures[0][:1]
    atom.pbc = False
    atom.calc = SinglePointCalculator(atom, forces=np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"structure 0 is an isolated atom without an energy label"):
        isolated_atom_energies([atom])


def test_read_dataset_takes_partly_labelled_files_and_reads_weights(tmp_path):
    structures = emt_structures(3, repeats=[(2, 2, 2)])
    mixed = [_relabel(structures[0]), _relabel(structures[1], forces=False), _relabel(structures[2], energy=False)]
    mixed[0].info["config_weight"] = 0.5
    write_dataset(tmp_path / "mixed.extxyz", mixed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # config_weight is read: no warning
        back = read_dataset(tmp_path / "mixed.extxyz")
    assert [sorted(a.calc.results) for a in back] == [
        ["energy", "forces", "stress"],
        ["energy", "stress"],
        ["forces", "stress"],
    ]
    assert back[0].info["config_weight"] == 0.5
    # a label absent from every structure while the file holds one like it: named, not skipped
    renamed = [_relabel(a, forces=False) for a in structures]
    for atoms, ref in zip(renamed, structures, strict=True):
        atoms.arrays["REF_forces"] = ref.get_forces()
    write_dataset(tmp_path / "renamed.extxyz", renamed)
    with pytest.raises(ValueError, match=r"no structure has forces; it has \['REF_forces'\]"):
        read_dataset(tmp_path / "renamed.extxyz")
    # an energy-only file (nothing like forces in it) is read as one
    write_dataset(tmp_path / "energies.extxyz", [_relabel(a, forces=False) for a in structures])
    assert all("forces" not in a.calc.results for a in read_dataset(tmp_path / "energies.extxyz"))
    # mace-torch's virials weight weighs the stress read from virials
    virial = [_relabel(a, stress=False, config_virials_weight=0.25) for a in structures]
    for atoms, ref in zip(virial, structures, strict=True):
        atoms.info["REF_virials"] = (-ref.get_volume() * ref.get_stress(voigt=False)).reshape(9)
    write_dataset(tmp_path / "virials.extxyz", virial)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the weight is read: it warned that it was not
        back = read_dataset(tmp_path / "virials.extxyz", virials_key="REF_virials")
    assert all(a.info["config_stress_weight"] == 0.25 for a in back)
    with pytest.warns(UserWarning, match=r"\['config_virials_weight'\] are not read.*with virials_key"):
        read_dataset(tmp_path / "virials.extxyz")  # no virials read: nor their weight
    np.testing.assert_allclose(back[0].get_stress(), structures[0].get_stress(), atol=1e-9)
    other = [_relabel(a, my_weight=2.0) for a in structures]
    write_dataset(tmp_path / "other.extxyz", other)
    with pytest.warns(UserWarning, match=r"per-structure weights \['my_weight'\] are not read"):
        read_dataset(tmp_path / "other.extxyz")


def test_read_dataset_finds_labels_ase_filed_as_results(tmp_path):
    """ASE's extxyz reader files the names it knows (``free_energy``, ``energy``) as calculator
    results, not in ``atoms.info``: a key naming one is read from there, and a key naming nothing
    while the results hold an energy is refused with its name (it used to drop the energies)."""
    path = tmp_path / "free.extxyz"
    path.write_text(
        '2\nfree_energy=-1.6 pbc="F F F" Properties=species:S:1:pos:R:3:forces:R:3\n'
        "H 0 0 0 0.1 0 0\nH 0.74 0 0 -0.1 0 0\n"
    )
    (atoms,) = read_dataset(path, energy_key="free_energy")
    assert atoms.get_potential_energy() == -1.6
    np.testing.assert_array_equal(atoms.get_forces()[:, 0], [0.1, -0.1])
    with pytest.raises(ValueError, match=r"no structure has energy; it has \['free_energy'\]"):
        read_dataset(path)  # forces alone would train silently without the energies the file holds
    structures = emt_structures(2, repeats=[(2, 2, 2)])
    write_dataset(tmp_path / "plain.extxyz", structures)
    with pytest.raises(ValueError, match=r"no structure has REF_energy; it has \['energy'"):
        read_dataset(tmp_path / "plain.extxyz", energy_key="REF_energy")
    text = tmp_path / "text.extxyz"  # numpy's "could not convert string to float" named nothing
    text.write_text('2\nREF_energy=abc pbc="F F F" Properties=species:S:1:pos:R:3\nH 0 0 0\nH 0.74 0 0\n')
    with pytest.raises(ValueError, match=r"text.extxyz': structure 0's REF_energy is not numbers"):
        read_dataset(text, energy_key="REF_energy")


def test_cli_trains_an_energy_only_file_with_no_force_weight(tmp_path):
    import json

    from e3j_models.__main__ import main

    write_dataset(tmp_path / "e.extxyz", [_relabel(a, forces=False) for a in emt_structures(6, repeats=[(2, 2, 2)])])
    args = ["train", "--data", str(tmp_path / "e.extxyz"), "--preset", "nequip", "--channels", "2", "--layers", "1"]
    args += [
        "--l-max",
        "1",
        "--radial-hidden",
        "4",
        "--steps",
        "2",
        "--eval-every",
        "1",
        "--out",
        str(tmp_path / "run"),
    ]
    with pytest.raises(
        SystemExit, match=r"--data: --force-weight \(forces\) is 1.0 but no training structure has forces"
    ):
        main(args)
    assert not (tmp_path / "run").exists()
    main([*args, "--force-weight", "0"])
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(metrics["checkpoint_validation"]) == {"energy_mae_per_atom"}
    assert np.isfinite(metrics["final_validation"]["energy_mae_per_atom"])


def test_config_type_weights_multiply_each_structures_weights_as_mace_torch_does(setup):
    """mace-torch's config_type_weights: a structure's weight is its config_weight times its type's
    (atoms.info["config_type"], "Default" when absent); checked against the errors weighted by hand,
    in the loss and in fit's first step; a type no training structure has, or a bad weight, is named."""
    import jax

    from e3j_models._batching import _batch
    from e3j_models.neighbours import _checked_graph

    structures, cfg, pot, params = setup
    errors = [_errors(setup, a) for a in structures[:3]]
    n = [len(a) for a in structures[:3]]
    typed = [
        _relabel(structures[0], config_type="slab", config_weight=2.0),
        _relabel(structures[1], config_type="bulk", config_energy_weight=3.0),
        _relabel(structures[2]),  # "Default"
    ]
    graphs = [_checked_graph(a, cfg.atomic_numbers, cfg.cutoff, np.float64) for a in typed]
    batch, labels = _batch(
        typed, [0, 1, 2], (128, 4096), cfg, np.float64, None, graphs, type_weights={"slab": 5.0, "Default": 0.5}
    )
    _, w = loss_fn(pot, params, jax.device_put(batch), jax.device_put(labels), (1.0, 1.0, 1.0))
    e, f, s = ([x[k] for x in errors] for k in range(3))
    assert float(w["energy"]) == pytest.approx((10 * e[0] + 3 * e[1] + 0.5 * e[2]) / 3, rel=1e-9)
    assert float(w["forces"]) == pytest.approx((10 * f[0] + f[1] + 0.5 * f[2]) / (3 * sum(n)), rel=1e-9)
    assert float(w["stress"]) == pytest.approx((10 * s[0] + s[1] + 0.5 * s[2]) / 3, rel=1e-9)

    # fit: the type weights reach the training loss as the same config_weight would
    args = dict(steps=1, batch_size=3, progress=False)
    by_type = fit(cfg, typed, structures[3:], config_type_weights={"slab": 5.0, "Default": 0.5}, **args)
    by_info = [_relabel(structures[0], config_weight=10.0), typed[1], _relabel(structures[2], config_weight=0.5)]
    assert by_type.history["train_loss"] == fit(cfg, by_info, structures[3:], **args).history["train_loss"]
    assert by_type.history["train_loss"] != fit(cfg, typed, structures[3:], **args).history["train_loss"]
    with pytest.raises(ValueError, match=r"names config types \['sla'\] that no structure has .*'bulk', 'slab'"):
        fit(cfg, typed, structures[3:], config_type_weights={"sla": 1.0}, **args)
    with pytest.raises(ValueError, match=r"config_type_weights\['slab'\] is -1: a weight must be a finite number >= 0"):
        fit(cfg, typed, structures[3:], config_type_weights={"slab": -1}, **args)
    with pytest.raises(ValueError, match=r"config_type_weights\['slab'\] is True: a weight must be a finite number"):
        fit(cfg, typed, structures[3:], config_type_weights={"slab": True}, **args)
    with pytest.raises(TypeError, match=r"config_type_weights's keys must be config types as strings, got 1"):
        fit(cfg, typed, structures[3:], config_type_weights={1: 2.0}, **args)
    # a type of the validation structures alone is theirs, not a misspelling
    fit(cfg, typed[1:], [typed[0]], config_type_weights={"slab": 2.0}, **args)


def test_cli_config_type_weights_are_checked_before_out(tmp_path):
    from e3j_models.__main__ import main

    data = tmp_path / "d.extxyz"
    write_dataset(data, [_relabel(a, config_type="bulk") for a in emt_structures(3)])
    run = ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--config-type-weights"]
    with pytest.raises(SystemExit, match=r"--config-type-weights is not JSON .*give e.g."):
        main([*run, "{bulk: 2}"])
    with pytest.raises(SystemExit, match=r"--config-type-weights must be a JSON object"):
        main([*run, "[2]"])
    with pytest.raises(SystemExit, match=r"--config-type-weights\['bulk'\] is -2"):
        main([*run, '{"bulk": -2}'])
    with pytest.raises(SystemExit, match=r"--config-type-weights names config types \['slab'\] .* are \['bulk'\]"):
        main([*run, '{"slab": 2}'])
    assert not (tmp_path / "run").exists()


def test_cli_config_type_weights_do_not_depend_on_the_split(tmp_path):
    """A type is checked against the file, before the seeded split: one structure of type "slab"
    trains whichever seed holds it out, and the isolated atoms' type may be named (they give the
    reference energies and do not train)."""
    from e3j_models.__main__ import main

    structures = [_relabel(a) for a in emt_structures(6, repeats=[(1, 1, 2)])]
    structures[2] = _relabel(structures[2], config_type="slab")
    cu = _relabel(structures[0], config_type="IsolatedAtom")
    del cu[1:]
    cu.numbers, cu.pbc = [29], False
    cu.calc = SinglePointCalculator(cu, energy=-0.1, forces=np.zeros((1, 3)))
    ni = cu.copy()
    ni.numbers = [28]
    ni.calc = SinglePointCalculator(ni, energy=-0.2, forces=np.zeros((1, 3)))
    data = tmp_path / "d.extxyz"
    write_dataset(data, [cu, ni, *structures])
    args = ["train", "--data", str(data), "--preset", "nequip", "--channels", "2", "--layers", "1", "--l-max", "1"]
    args += ["--cutoff", "3.0", "--radial-hidden", "4", "--steps", "1", "--e0s", "isolated", "--valid-fraction", "0.2"]
    args += ["--config-type-weights", '{"slab": 5, "IsolatedAtom": 0}']
    for seed in range(4):  # the slab is held out for some seeds
        main([*args, "--seed", str(seed), "--out", str(tmp_path / f"run{seed}")])
        assert (tmp_path / f"run{seed}" / "metrics.json").exists()
