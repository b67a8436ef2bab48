"""Does an NPT run hold its pressure, and does its volume fluctuate as the isothermal–isobaric ensemble says?

    python benchmarks/npt_check.py RUN_DIR [RUN_DIR ...] --model CHECKPOINT [--skip-ps 20] [--blocks 4]
                                   [--out benchmarks/results/cpu-npt.json]

Each ``RUN_DIR`` is the ``--out`` of ``python -m e3j_models md --ensemble npt`` (its ``md.json`` and
``trajectory.extxyz``); several runs (different seeds) are pooled block by block. After ``--skip-ps``
of equilibration, the production part of each run is cut into ``--blocks`` equal blocks:

- pressure: the mean over all blocks ± the standard error of the block means, against the target;
- volume: ``σ_V²`` is the mean over blocks of the squared deviation from the pooled mean volume, its
  error the standard error of those block values; the expectation is ``σ_V = sqrt(k_B·T·⟨V⟩ / B)``
  with ``B`` the model's isothermal bulk modulus at 0 K, ``-V·dP/dV`` of the run's first frame (the
  perfect lattice) scaled homogeneously to ``⟨V⟩·(1 ± 1 %)`` (static: no thermal motion, no internal
  relaxation). The run's own ``B = k_B·T·⟨V⟩ / σ_V²`` is reported beside it.

Results (the numbers, per-block values and the command lines of the runs) go to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

KB_EV_PER_K = 8.617333262e-5
EV_PER_A3_IN_GPA = 160.21766208


def production_blocks(md: dict, skip_ps: float, blocks: int) -> list[dict[str, np.ndarray]]:
    """The log after ``skip_ps`` cut into ``blocks`` equal blocks of volume, pressure and temperature."""
    log = {k: np.asarray(v) for k, v in md["log"].items()}
    if "pressure_GPa" not in log:
        raise ValueError(f"the run {md['command']!r} is not an NPT run (no pressure in its log)")
    keep = log["time_ps"] >= skip_ps
    if keep.sum() < 2 * blocks:
        raise ValueError(f"the run has {int(keep.sum())} samples after {skip_ps} ps: too few for {blocks} blocks")
    cols = {name: log[key][keep] for name, key in (("V", "volume"), ("P", "pressure_GPa"), ("T", "temperature"))}
    split = {name: np.array_split(col, blocks) for name, col in cols.items()}
    return [{name: split[name][b] for name in cols} for b in range(blocks)]


def static_bulk_modulus_GPa(atoms, calculator, volume: float, strain: float = 0.01) -> float:
    """``-V·dP/dV`` (GPa) of ``atoms`` scaled homogeneously to ``volume·(1 ± strain)``."""
    from ase import units

    def pressure(v: float) -> float:
        a = atoms.copy()
        a.set_cell(atoms.cell * (v / atoms.get_volume()) ** (1 / 3), scale_atoms=True)
        a.calc = calculator
        return float(-np.mean(a.get_stress()[:3]) / units.GPa)

    return -(pressure(volume * (1 + strain)) - pressure(volume * (1 - strain))) / (2 * strain)


def analyse(blocks_per_run: list[list[dict]], dt_log_ps: float, target_GPa: float, bulk_GPa: float) -> dict:
    """Pressure and volume statistics over the blocks of every run (see the module docstring)."""
    blocks = [b for run in blocks_per_run for b in run]
    n = len(blocks)
    v_all = np.concatenate([b["V"] for b in blocks])
    t_all = np.concatenate([b["T"] for b in blocks])
    p_means = np.array([b["P"].mean() for b in blocks])
    v_means = np.array([b["V"].mean() for b in blocks])
    v_vars = np.array([np.mean((b["V"] - v_all.mean()) ** 2) for b in blocks])
    var, var_err = v_vars.mean(), v_vars.std(ddof=1) / math.sqrt(n)
    sigma = math.sqrt(var)
    kt_v = KB_EV_PER_K * t_all.mean() * v_all.mean()  # eV
    expected = math.sqrt(kt_v / (bulk_GPa / EV_PER_A3_IN_GPA))
    return {
        "blocks": n,
        "block_ps": len(blocks[0]["V"]) * dt_log_ps,
        "pressure_target_GPa": target_GPa,
        "pressure_mean_GPa": float(p_means.mean()),
        "pressure_block_sem_GPa": float(p_means.std(ddof=1) / math.sqrt(n)),
        "pressure_block_means_GPa": p_means.round(4).tolist(),
        "pressure_sample_std_GPa": float(np.concatenate([b["P"] for b in blocks]).std()),
        "temperature_mean_K": float(t_all.mean()),
        "temperature_std_K": float(t_all.std()),
        "volume_mean_A3": float(v_all.mean()),
        "volume_block_means_A3": v_means.round(2).tolist(),
        "volume_mean_block_sem_A3": float(v_means.std(ddof=1) / math.sqrt(n)),
        "sigma_V_A3": sigma,
        "sigma_V_err_A3": var_err / (2 * sigma),
        "sigma_V_per_block_A3": np.sqrt(v_vars).round(2).tolist(),
        "bulk_modulus_static_GPa": bulk_GPa,
        "sigma_V_expected_A3": expected,
        "bulk_modulus_from_fluctuation_GPa": kt_v / var * EV_PER_A3_IN_GPA,
        "bulk_modulus_from_fluctuation_err_GPa": kt_v / var * EV_PER_A3_IN_GPA * var_err / var,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="output directories of `python -m e3j_models md --ensemble npt`")
    ap.add_argument("--model", required=True, help="the checkpoint the runs used (for the static bulk modulus)")
    ap.add_argument("--skip-ps", type=float, default=20.0, help="equilibration dropped from each run")
    ap.add_argument("--blocks", type=int, default=4, help="blocks per run")
    ap.add_argument("--pressure", type=float, default=0.0, help="the target pressure (GPa)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", True)  # the runs' float64, as `python -m e3j_models md` does
    from ase.io import read

    import e3j_models as em

    runs, blocks = [], []
    for run in args.runs:
        md = json.loads((run / "md.json").read_text())
        runs.append(md)
        blocks.append(production_blocks(md, args.skip_ps, args.blocks))
    config, params = em.load(args.model)
    calc = em.Calculator(em.Potential(config), params)
    v_mean = float(np.mean(np.concatenate([b["V"] for run in blocks for b in run])))
    bulk = static_bulk_modulus_GPa(read(args.runs[0] / "trajectory.extxyz", index=0), calc, v_mean)
    dt_log = runs[0]["log"]["time_ps"][1] - runs[0]["log"]["time_ps"][0]
    result = analyse(blocks, dt_log, args.pressure, bulk)
    result = {
        "runs": [{k: md[k] for k in ("command", "atoms", "steps", "timestep_fs", "ms_per_step")} for md in runs],
        "skip_ps": args.skip_ps,
        "blocks_per_run": args.blocks,
        "command": "python benchmarks/npt_check.py "
        + " ".join([*map(str, args.runs), "--model", args.model, "--skip-ps", str(args.skip_ps)])
        + f" --blocks {args.blocks}",
        **result,
    }
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
