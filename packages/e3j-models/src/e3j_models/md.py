"""Molecular dynamics with a trained potential through ASE's integrators.

Ensembles: ``"nve"`` (:class:`ase.md.verlet.VelocityVerlet`), ``"nvt"`` (:class:`ase.md.langevin.Langevin`)
and ``"npt"`` (:class:`ase.md.nose_hoover_chain.IsotropicMTKNPT`: the Martyna–Tobias–Klein
isotropic barostat with Nose–Hoover chains, time-reversible and sampling the isothermal–isobaric
ensemble, unlike ``NPTBerendsen`` (no correct fluctuations) or ``ase.md.npt.NPT`` (Melchionna, known to
misbehave for small cells). ASE rather than jax-md: the model already sits behind an ASE
:class:`~e3j_models.Calculator` (host neighbour list, padding buckets), ASE reads and writes every
structure format and its integrators are the reference users compare with; the per-step cost is
the model call, which is what the benchmark measures.

:func:`run_md` returns a log of time (ps), potential/total energy (eV), temperature (K), volume (Å³)
and pressure (GPa, NPT only) every ``log_every`` steps and the ms/step and ns/day of the run
(excluding the first call, which compiles).

>>> import jax
>>> from ase.build import bulk
>>> from e3j_models import Calculator, Potential, batch_structures, nequip
>>> atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
>>> pot = Potential(nequip((29,), num_layers=1, num_channels=2, node_irreps="0e + 1o", l_max=1, cutoff=3.0))
>>> params = pot.init(jax.random.key(0), batch_structures([atoms], (29,), 3.0))
>>> log = run_md(atoms, Calculator(pot, params), "nve", steps=4, temperature_K=300, progress=False)
>>> sorted(log), len(log["time_ps"])
(['energy', 'ms_per_step', 'ns_per_day', 'temperature', 'time_ps', 'total_energy', 'volume'], 5)
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ._checks import check_int, check_output_path, check_positive_real, check_real
from ._optional import require

if TYPE_CHECKING:  # ASE is an optional extra: imported when run_md runs
    import ase
    from ase.calculators.calculator import BaseCalculator

__all__ = ["ENSEMBLES", "VELOCITIES", "check_ensemble", "check_temperature", "check_velocities", "plot_md", "run_md"]

ENSEMBLES = ("nve", "nvt", "npt")
# where a run's velocities come from: drawn at its temperature, or the structure's own momenta
VELOCITIES = ("thermalize", "keep")


def check_ensemble(atoms, ensemble: str) -> None:
    """``ValueError`` unless ``ensemble`` is one of :data:`ENSEMBLES` and can run on ``atoms``
    (``"npt"`` changes the cell: it needs ``atoms.pbc`` all True)."""
    if ensemble not in ENSEMBLES:
        raise ValueError(f"ensemble must be one of {ENSEMBLES}, got {ensemble!r}")
    if ensemble == "npt" and not atoms.pbc.all():
        raise ValueError("ensemble 'npt' needs a fully periodic structure (atoms.pbc all True)")


def check_temperature(temperature: float, ensemble: str, name: str = "temperature_K") -> float:
    """``temperature`` (K) as a float: finite and >= 0, and > 0 for ``"npt"``, whose thermostat
    divides by ``k T`` (ASE raised ZeroDivisionError). ``name`` names it in the error."""
    temperature = check_real(name, temperature, 0, " (K)")
    if ensemble == "npt" and temperature == 0:
        raise ValueError(f"{name} must be > 0 for ensemble 'npt' (its thermostat divides by kT), got 0")
    return temperature


def check_velocities(atoms, velocities: str, name: str = "velocities") -> None:
    """``ValueError`` unless ``velocities`` is one of :data:`VELOCITIES` and, for ``"keep"``,
    ``atoms`` carries momenta (a frame of :func:`run_md`'s trajectory does). ``name`` names it."""
    if velocities not in VELOCITIES:
        raise ValueError(f"{name} must be one of {VELOCITIES}, got {velocities!r}")
    if velocities == "keep":
        if not atoms.has("momenta"):
            raise ValueError(
                f"{name}='keep' needs a structure with momenta (a frame of run_md's trajectory has "
                "them), but it has none"
            )
        if not np.all(np.isfinite(atoms.get_momenta())):
            raise ValueError(f"{name}='keep': the structure's momenta are not all finite")


def run_md(
    atoms: ase.Atoms,
    calculator: BaseCalculator,
    ensemble: str,
    *,
    steps: int,
    timestep_fs: float = 2.0,
    temperature_K: float = 300.0,
    pressure_GPa: float = 0.0,
    friction_per_fs: float = 0.01,
    seed: int = 0,
    log_every: int = 1,
    trajectory: str | os.PathLike | None = None,
    progress: bool = True,
    velocities: str = "thermalize",
) -> dict[str, Any]:
    """Run ``steps`` steps of ``ensemble`` on ``atoms`` (modified in place) with ``calculator``.

    With ``velocities="thermalize"`` velocities start Maxwell–Boltzmann at ``temperature_K``
    (seeded, zero total momentum); with ``"keep"`` they are ``atoms``' own momenta, unchanged, and
    the log's clock starts at ``atoms.info["time_ps"]`` where it is set: a frame of a previous
    run's trajectory continues that run (positions, momenta and cell to the 8 decimals extxyz
    writes; Langevin's noise and NPT's thermostat and barostat variables start afresh, so only NVE
    continues as one run would have). ``"npt"`` needs ``temperature_K > 0``
    (:func:`check_temperature`).
    ``trajectory`` (extxyz, every ``log_every`` steps, each frame with its momenta and
    ``info["time_ps"]``) is written to a ``.partial`` file renamed at the end, so an interrupted run
    leaves no file that looks complete.
    """
    require("ase.md.nose_hoover_chain", "run_md", "train")  # NPT's integrator: the train extra's ASE
    if progress:
        require("tqdm", "run_md's progress bar (progress=False runs without)")
    from ase import units
    from ase.calculators.calculator import BaseCalculator
    from ase.md.langevin import Langevin
    from ase.md.nose_hoover_chain import IsotropicMTKNPT
    from ase.md.velocitydistribution import Stationary

    try:  # ASE >= 3.29 (the same draws; MaxwellBoltzmannDistribution, its old name, warns there)
        from ase.md.velocitydistribution import thermalize_momenta
    except ImportError:
        from ase.md.velocitydistribution import MaxwellBoltzmannDistribution as thermalize_momenta
    from ase.md.verlet import VelocityVerlet

    if not isinstance(calculator, BaseCalculator):
        raise TypeError(
            f"calculator must be an ASE calculator, got {type(calculator).__name__}: for a model, "
            "e3j_models.Calculator(potential, params)"
        )
    check_ensemble(atoms, ensemble)
    check_velocities(atoms, velocities)
    steps = check_int("steps", steps, 1)
    timestep_fs = check_positive_real("timestep_fs", timestep_fs, " (fs)")
    temperature_K = check_temperature(temperature_K, ensemble)
    pressure_GPa = check_real("pressure_GPa", pressure_GPa, None, " (GPa)")
    friction_per_fs = check_real("friction_per_fs", friction_per_fs, 0, " (1/fs)")
    log_every = check_int("log_every", log_every, 1)
    seed = check_int("seed", seed, 0)
    if trajectory is not None:  # now: the frames are written at the end
        trajectory = check_output_path("trajectory", trajectory)
    start_ps = 0.0
    if velocities == "keep":
        start_ps = check_real('atoms.info["time_ps"]', atoms.info.get("time_ps", 0.0), None, " (ps)")
    atoms.calc = calculator
    rng = np.random.default_rng(seed)
    if velocities == "thermalize":
        thermalize_momenta(atoms, temperature_K=temperature_K, rng=rng)
        # one atom has only its centre of mass to move: zero momentum, whose temperature cannot be
        # rescaled back (ASE would divide 0 by 0)
        Stationary(atoms, preserve_temperature=len(atoms) > 1)
    dt = timestep_fs * units.fs
    if ensemble == "nve":
        dyn = VelocityVerlet(atoms, dt)
    elif ensemble == "nvt":
        # ASE's default keeps the centre of mass still, dividing by N - 1: not for one atom
        one_atom = {} if len(atoms) > 1 else {"fixcm": False}
        friction = friction_per_fs / units.fs
        dyn = Langevin(atoms, dt, temperature_K=temperature_K, friction=friction, rng=rng, **one_atom)
    else:
        dyn = IsotropicMTKNPT(
            atoms,
            dt,
            temperature_K=temperature_K,
            pressure_au=pressure_GPa * units.GPa,
            tdamp=100 * dt,
            pdamp=1000 * dt,
        )
    log: dict[str, list] = {"time_ps": [], "energy": [], "total_energy": [], "temperature": [], "volume": []}
    if ensemble == "npt":
        log["pressure_GPa"] = []
    frames = []

    def record():
        epot = atoms.get_potential_energy()
        etot = epot + atoms.get_kinetic_energy()
        if not np.isfinite(etot):
            raise ValueError(
                f"the trajectory diverged by {dyn.get_time() / units.fs:g} fs (energy {epot}): "
                f"a timestep of {timestep_fs:g} fs is too large, or atoms came too close"
            )
        time_ps = start_ps + dyn.get_time() / (1000 * units.fs)
        log["time_ps"].append(time_ps)
        log["energy"].append(epot)
        log["total_energy"].append(etot)
        log["temperature"].append(atoms.get_temperature())
        log["volume"].append(atoms.get_volume() if atoms.pbc.all() else float("nan"))
        if ensemble == "npt":
            log["pressure_GPa"].append(-np.mean(atoms.get_stress(include_ideal_gas=True)[:3]) / units.GPa)
        if trajectory is not None:
            frames.append(atoms.copy())
            frames[-1].calc = None
            frames[-1].info["time_ps"] = time_ps

    record()  # the first evaluation compiles: not timed
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=steps, desc=f"md {ensemble}", unit="step")
    t0 = time.perf_counter()
    for i in range(steps):
        dyn.run(1)
        if (i + 1) % log_every == 0 or i + 1 == steps:
            record()
        if bar is not None:
            bar.update()
            if (i + 1) % 10 == 0:
                bar.set_postfix(
                    T=f"{atoms.get_temperature():.0f}K", ms_per_step=f"{1e3 * (time.perf_counter() - t0) / (i + 1):.1f}"
                )
    seconds = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    out: dict[str, Any] = {k: np.asarray(v) for k, v in log.items()}
    out["ms_per_step"] = 1e3 * seconds / steps
    # ns/day = (timestep in ns) × (steps per day)
    out["ns_per_day"] = timestep_fs * 1e-6 * 86400.0 / (seconds / steps)
    if trajectory is not None:
        from ase.io import write

        write(trajectory + ".partial", frames, format="extxyz")
        os.replace(trajectory + ".partial", trajectory)
    return out


def plot_md(log: dict[str, Any], path: str | os.PathLike, title: str = "") -> None:
    """Energy, temperature and volume against time to a PNG."""
    require("matplotlib", "plot_md")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
    t = log["time_ps"]
    axes[0].plot(t, log["total_energy"], label="total")
    axes[0].plot(t, log["energy"], label="potential")
    axes[0].set_ylabel("energy (eV)")
    axes[0].legend()
    axes[1].plot(t, log["temperature"])
    axes[1].set_ylabel("temperature (K)")
    axes[2].plot(t, log["volume"])
    axes[2].set_ylabel("volume (Å³)")
    axes[2].set_xlabel("time (ps)")
    if title:
        axes[0].set_title(title)
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=100)
    plt.close(fig)
