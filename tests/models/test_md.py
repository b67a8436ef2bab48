"""Molecular dynamics through ASE (e3j_models.md) and the md command line."""

import json
import os

import jax
import numpy as np
import pytest

pytest.importorskip("ase")

from ase.build import bulk
from model_systems import edited_checkpoint

from e3j_models import Calculator, Potential, batch_structures, nequip, save
from e3j_models.__main__ import main
from e3j_models.md import run_md

CFG = nequip((28, 29), num_layers=1, num_channels=4, node_irreps="0e + 1o", l_max=1, cutoff=3.0, radial_mlp=(8,))


@pytest.fixture(scope="module")
def model():
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    pot = Potential(CFG)
    params = pot.init(jax.random.key(0), batch_structures([atoms], CFG.atomic_numbers, CFG.cutoff))
    return pot, params


def _cell(seed=0):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    atoms.numbers = np.where(np.random.default_rng(seed).uniform(size=len(atoms)) < 0.5, 28, 29)
    return atoms


def test_nve_conserves_energy(model):
    pot, params = model
    atoms = _cell()
    log = run_md(atoms, Calculator(pot, params), "nve", steps=40, timestep_fs=1.0, temperature_K=600, progress=False)
    n = len(atoms)
    etot, epot = log["total_energy"], log["energy"]
    # the kinetic/potential exchange is far larger than the total-energy error
    assert np.ptp(epot) / n > 1e-4
    assert np.max(np.abs(etot - etot[0])) / n < 0.05 * np.ptp(epot) / n
    assert log["ms_per_step"] > 0 and log["ns_per_day"] > 0


def test_a_diverging_trajectory_is_an_error():
    """A NaN energy (a timestep far too large, atoms on top of each other) stops the run by name
    rather than logging NaNs and returning normally."""
    from ase.calculators.calculator import Calculator as AseCalculator

    class Diverging(AseCalculator):
        implemented_properties = ("energy", "forces")

        def calculate(self, atoms=None, properties=("energy",), system_changes=()):
            super().calculate(atoms, properties, system_changes)
            self.calls = getattr(self, "calls", 0) + 1
            nan = self.calls > 2
            self.results = {"energy": np.nan if nan else 0.0, "forces": np.zeros((len(self.atoms), 3))}

    with pytest.raises(ValueError, match=r"the trajectory diverged by .* fs \(energy nan\): a timestep of 1e\+06 fs"):
        run_md(_cell(), Diverging(), "nve", steps=5, timestep_fs=1e6, temperature_K=300, progress=False)


def test_nvt_and_npt_run(model, tmp_path):
    pot, params = model
    atoms = _cell(1)
    log = run_md(atoms, Calculator(pot, params), "nvt", steps=5, progress=False, trajectory=tmp_path / "t.extxyz")
    from ase.io import read

    assert len(read(tmp_path / "t.extxyz", index=":")) == 6 and not os.path.exists(tmp_path / "t.extxyz.partial")
    atoms = _cell(2)
    v0 = atoms.get_volume()
    log = run_md(atoms, Calculator(pot, params), "npt", steps=5, progress=False)
    assert np.all(np.isfinite(log["pressure_GPa"])) and log["volume"][0] == pytest.approx(v0)
    assert np.ptp(log["volume"]) > 0  # the barostat moves the cell

    # the thermostat heats a lattice at rest, where every force vanishes and NVE stays at 0 K
    def at_rest():
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
        atoms.set_momenta(np.zeros((len(atoms), 3)))
        return atoms

    kw = dict(steps=20, temperature_K=600, velocities="keep", progress=False)
    nve = run_md(at_rest(), Calculator(pot, params), "nve", **kw)
    nvt = run_md(at_rest(), Calculator(pot, params), "nvt", friction_per_fs=0.05, **kw)
    assert np.max(nve["temperature"]) < 1e-6 and nvt["temperature"][-1] > 100
    with pytest.raises(ValueError, match="ensemble must be one of"):
        run_md(atoms, Calculator(pot, params), "nph", steps=1)
    open_atoms = _cell()
    open_atoms.pbc = False
    with pytest.raises(ValueError, match="needs a fully periodic"):
        run_md(open_atoms, Calculator(pot, params), "npt", steps=1)


def test_cli_md_outputs_and_bad_input(model, tmp_path):
    _, params = model
    ckpt = tmp_path / "m.npz"
    save(ckpt, CFG, jax.tree.map(np.asarray, params))
    out = tmp_path / "run"
    main(["md", "--model", str(ckpt), "--supercell", "2", "--steps", "3", "--out", str(out)])
    summary = json.loads((out / "md.json").read_text())
    assert summary["atoms"] == 32 and len(summary["log"]["time_ps"]) == 4
    assert (out / "md.png").stat().st_size > 1000 and (out / "trajectory.extxyz").exists()

    bad_out = tmp_path / "bad"
    with pytest.raises(SystemExit, match="does not exist"):
        main(["md", "--model", str(tmp_path / "none.npz"), "--out", str(bad_out)])
    au = bulk("Au", "fcc", a=4.08, cubic=True)
    au.write(tmp_path / "au.extxyz")
    with pytest.raises(SystemExit, match=r"atomic numbers \[79\] that the model"):
        main(["md", "--model", str(ckpt), "--structure", str(tmp_path / "au.extxyz"), "--out", str(bad_out)])
    (tmp_path / "junk.extxyz").write_text("not\na structure\n")
    with pytest.raises(SystemExit, match="not readable"):
        main(["md", "--model", str(ckpt), "--structure", str(tmp_path / "junk.extxyz"), "--out", str(bad_out)])
    (tmp_path / "junk.npz").write_text("not a checkpoint\n")
    with pytest.raises(SystemExit, match=r"--model: .*junk.npz' is not an e3j-models file"):
        main(["md", "--model", str(tmp_path / "junk.npz"), "--out", str(bad_out)])
    with pytest.raises(SystemExit, match="--steps must be >= 1"):
        main(["md", "--model", str(ckpt), "--steps", "0", "--out", str(bad_out)])
    with pytest.raises(SystemExit, match="--supercell must be >= 1"):
        main(["md", "--model", str(ckpt), "--supercell", "0", "--out", str(bad_out)])
    with pytest.raises(SystemExit, match="--log-every must be >= 1, got 0"):
        main(["md", "--model", str(ckpt), "--log-every", "0", "--out", str(bad_out)])
    for flag, value, match in [
        ("--temperature", "-5", r"--temperature must be a finite number >= 0 \(K\), got -5"),
        ("--temperature", "inf", r"--temperature must be a finite number >= 0 \(K\), got inf"),
        ("--timestep", "-1", r"--timestep must be a finite number > 0 \(fs\), got -1"),
        ("--timestep", "inf", r"--timestep must be a finite number > 0 \(fs\), got inf"),
    ]:
        with pytest.raises(SystemExit, match=match):
            main(["md", "--model", str(ckpt), flag, value, "--out", str(bad_out)])
    with pytest.raises(SystemExit, match=r"--pressure must be a finite number \(GPa\), got nan"):
        main(["md", "--model", str(ckpt), "--ensemble", "npt", "--pressure", "nan", "--out", str(bad_out)])
    with pytest.raises(SystemExit, match=r"--pressure applies to --ensemble npt only, got --ensemble nvt"):
        main(["md", "--model", str(ckpt), "--ensemble", "nvt", "--pressure", "1", "--out", str(bad_out)])
    # NPT's thermostat divides by kT: a ZeroDivisionError traceback, after the files had gone
    with pytest.raises(SystemExit, match=r"--temperature must be > 0 for ensemble 'npt' .*got 0"):
        main(["md", "--model", str(ckpt), "--ensemble", "npt", "--temperature", "0", "--out", str(bad_out)])
    assert not os.path.exists(bad_out)  # refused before anything is written

    # refused after the structure is read, but still before a previous run's files are touched
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    mol = bulk("Cu", "fcc", a=3.6, cubic=True)
    mol.pbc = False
    mol.write(tmp_path / "mol.extxyz")
    with pytest.raises(SystemExit, match="--backend: backend must be None, 'e3nn' or an installed e3j backend"):
        main(["md", "--model", str(ckpt), "--supercell", "1", "--backend", "nope", "--out", str(out)])
    with pytest.raises(SystemExit, match="ensemble 'npt' needs a fully periodic structure"):
        main(
            [
                "md",
                "--model",
                str(ckpt),
                "--structure",
                str(tmp_path / "mol.extxyz"),
                "--ensemble",
                "npt",
                "--out",
                str(out),
            ]
        )
    # a checkpoint whose header was edited: refused by load, before the files go
    edited_checkpoint(ckpt, tmp_path / "edited.npz", lambda config: config.update(num_channels=99))
    with pytest.raises(SystemExit, match=r"--model: .*edited.npz' holds parameters that do not fit its config"):
        main(["md", "--model", str(tmp_path / "edited.npz"), "--supercell", "1", "--out", str(out)])
    # atoms the calculator refuses at its first call: refused before the files go too
    for k, change in enumerate(
        [lambda a: a.positions.__setitem__(5, a.positions[0]), lambda a: a.positions.__setitem__((1, 2), np.nan)]
    ):
        bad = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
        change(bad)
        bad.write(tmp_path / f"bad{k}.extxyz")
        with pytest.raises(SystemExit, match=r"--structure: (atoms 5 and 0 coincide|positions must be finite)"):
            main(["md", "--model", str(ckpt), "--structure", str(tmp_path / f"bad{k}.extxyz"), "--out", str(out)])
        with pytest.raises(SystemExit, match=r"--structure: "):
            main(["md", "--model", str(ckpt), "--structure", str(tmp_path / f"bad{k}.extxyz"), "--out", str(bad_out)])
    assert not os.path.exists(bad_out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SystemExit, match=r"--out '.*a_file' exists and is not a directory"):
        main(["md", "--model", str(ckpt), "--supercell", "1", "--out", str(tmp_path / "a_file")])
    # an open structure's volume is null in md.json (a bare NaN is not JSON: jq refuses it)
    main(["md", "--model", str(ckpt), "--structure", str(tmp_path / "mol.extxyz"), "--steps", "1", "--out", str(out)])
    text = (out / "md.json").read_text()
    assert "NaN" not in text and json.loads(text)["log"]["volume"] == [None, None]


@pytest.mark.parametrize("ensemble", ["nve", "nvt", "npt"])
def test_one_atom_runs(model, ensemble):
    """One atom has no motion but its centre of mass's, which the start removes: ASE's rescaling of
    the temperature then divided 0 by 0 and every momentum was NaN."""
    pot, params = model
    atoms = bulk("Cu", "fcc", a=3.6)  # the primitive cell: one atom
    log = run_md(atoms, Calculator(pot, params), ensemble, steps=3, temperature_K=300, progress=False)
    assert np.all(np.isfinite(log["total_energy"])) and np.all(np.isfinite(log["temperature"]))
    if ensemble == "nve":
        assert np.all(log["temperature"] == 0)


def test_run_md_refuses_non_finite_numbers(model):
    pot, params = model
    for kwargs, match in [
        ({"timestep_fs": float("inf")}, r"timestep_fs must be a finite number > 0 \(fs\), got inf"),
        ({"temperature_K": float("nan")}, r"temperature_K must be a finite number >= 0 \(K\), got nan"),
        ({"pressure_GPa": float("inf")}, r"pressure_GPa must be a finite number \(GPa\), got inf"),
        ({"friction_per_fs": -1.0}, r"friction_per_fs must be a finite number >= 0 \(1/fs\), got -1.0"),
    ]:
        with pytest.raises(ValueError, match=match):
            run_md(_cell(), Calculator(pot, params), "nvt", steps=1, progress=False, **kwargs)
    with pytest.raises(ValueError, match=r"temperature_K must be > 0 for ensemble 'npt' \(its thermostat divides"):
        run_md(_cell(), Calculator(pot, params), "npt", steps=1, temperature_K=0, progress=False)


def test_run_md_names_what_it_refuses_before_running(model, tmp_path):
    # a Potential for the calculator failed inside ASE; a missing trajectory folder after the run
    pot, params = model
    with pytest.raises(TypeError, match=r"calculator must be an ASE calculator, got Potential: for a model, e3j"):
        run_md(_cell(), pot, "nve", steps=1, progress=False)
    with pytest.raises(ValueError, match=r"seed must be an int >= 0, got -1"):
        run_md(_cell(), Calculator(pot, params), "nve", steps=1, seed=-1, progress=False)
    calc = Calculator(pot, params)
    with pytest.raises(ValueError, match=r"trajectory must be a file path, got an empty one"):
        run_md(_cell(), calc, "nve", steps=1, trajectory="", progress=False)
    with pytest.raises(ValueError, match=r"trajectory: the folder '.*missing' does not exist"):
        run_md(_cell(), calc, "nve", steps=1, trajectory=tmp_path / "missing" / "t.extxyz", progress=False)
    assert calc.buckets == []  # refused before the first evaluation


def test_run_md_draws_velocities_without_ases_deprecated_name(model):
    # ASE 3.29 deprecated MaxwellBoltzmannDistribution (same draws as thermalize_momenta): every
    # run_md printed its warning
    import warnings

    pot, params = model
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Use thermalize_momenta")
        run_md(_cell(), Calculator(pot, params), "nve", steps=1, progress=False)


def test_keep_velocities_continues_an_nve_run(model, tmp_path):
    """The last frame of a trajectory, run on with its momenta kept, goes on as one run would have:
    NVE's energies and clock continue to the 8 decimals extxyz writes."""
    from ase.io import read

    pot, params = model
    whole = run_md(_cell(), Calculator(pot, params), "nve", steps=6, timestep_fs=1.0, temperature_K=600, progress=False)
    first = run_md(
        _cell(),
        Calculator(pot, params),
        "nve",
        steps=3,
        timestep_fs=1.0,
        temperature_K=600,
        progress=False,
        trajectory=tmp_path / "t.extxyz",
    )
    frame = read(tmp_path / "t.extxyz")  # the last frame
    assert frame.info["time_ps"] == pytest.approx(first["time_ps"][-1], abs=1e-15)
    p0 = frame.get_momenta()
    rest = run_md(
        frame,
        Calculator(pot, params),
        "nve",
        steps=3,
        timestep_fs=1.0,
        temperature_K=5,  # NVE with kept momenta: the temperature draws nothing
        seed=7,
        progress=False,
        velocities="keep",
    )
    np.testing.assert_allclose(rest["time_ps"], whole["time_ps"][3:], rtol=0, atol=1e-12)
    np.testing.assert_allclose(rest["total_energy"], whole["total_energy"][3:], rtol=0, atol=1e-5)
    np.testing.assert_allclose(rest["energy"], whole["energy"][3:], rtol=0, atol=1e-5)
    # drawn afresh, the start would be at 5 K with other momenta
    assert rest["temperature"][0] == pytest.approx(first["temperature"][-1], rel=1e-6)
    assert not np.array_equal(frame.get_momenta(), p0)  # the run moved them, in place


def test_keep_velocities_refuses_a_structure_without_usable_momenta(model):
    pot, params = model
    calc = Calculator(pot, params)
    with pytest.raises(ValueError, match=r"velocities='keep' needs a structure with momenta .* it has none"):
        run_md(_cell(), calc, "nve", steps=1, velocities="keep", progress=False)
    with pytest.raises(ValueError, match=r"velocities must be one of \('thermalize', 'keep'\), got 'maxwell'"):
        run_md(_cell(), calc, "nve", steps=1, velocities="maxwell", progress=False)
    atoms = _cell()
    atoms.set_momenta(np.full((len(atoms), 3), np.nan))
    with pytest.raises(ValueError, match=r"velocities='keep': the structure's momenta are not all finite"):
        run_md(atoms, calc, "nve", steps=1, velocities="keep", progress=False)
    atoms.set_momenta(np.zeros((len(atoms), 3)))
    atoms.info["time_ps"] = "late"
    with pytest.raises(ValueError, match=r"atoms.info\[\"time_ps\"\] must be a finite number \(ps\), got 'late'"):
        run_md(atoms, calc, "nve", steps=1, velocities="keep", progress=False)
    assert calc.buckets == []  # refused before the first evaluation


def test_cli_md_keep_velocities_continues_a_run(model, tmp_path):
    _, params = model
    ckpt = tmp_path / "m.npz"
    save(ckpt, CFG, jax.tree.map(np.asarray, params))
    first, second, bad_out = tmp_path / "first", tmp_path / "second", tmp_path / "bad"
    with pytest.raises(SystemExit, match=r"--keep-velocities needs --structure"):
        main(["md", "--model", str(ckpt), "--keep-velocities", "--out", str(bad_out)])
    bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2).write(tmp_path / "still.extxyz")
    with pytest.raises(SystemExit, match=r"--keep-velocities: --structure '.*still.extxyz' has no momenta"):
        main(["md", "--model", str(ckpt), "--structure", str(tmp_path / "still.extxyz"), "--keep-velocities",
              "--out", str(bad_out)])  # fmt: skip
    assert not os.path.exists(bad_out)
    main(["md", "--model", str(ckpt), "--supercell", "2", "--steps", "2", "--out", str(first)])
    main(["md", "--model", str(ckpt), "--structure", str(first / "trajectory.extxyz"), "--keep-velocities",
          "--steps", "2", "--out", str(second)])  # fmt: skip
    a = json.loads((first / "md.json").read_text())
    b = json.loads((second / "md.json").read_text())
    assert (a["velocities"], b["velocities"]) == ("thermalize", "keep")
    assert b["log"]["time_ps"][0] == pytest.approx(a["log"]["time_ps"][-1]) and b["log"]["time_ps"][0] > 0
    assert b["log"]["total_energy"][0] == pytest.approx(a["log"]["total_energy"][-1], abs=1e-5)
