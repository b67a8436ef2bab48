"""End-to-end benchmarks of e3j-models on e3j against the e3nn-jax twin, in one run (issue 16).

    python benchmarks/e2e.py [--models mace_a mace_b nequip] [--atoms 100 200] [--runs 3]
                             [--md cuni_mace:6 mace_a:3 mace_a@64:8] [--md-steps 5] [--md-rounds 2]
                             [--repeats 20] [--out benchmarks/results/cpu-e2e.json]

Four sections, all e3j (default backend) and the twin with the same parameters:

- **forces**: ms per jitted energy + forces vs atom count for each preset (Table 3 sizes) on a water
  box; the timing loop, memory analysis and fit check are ``models_vs_e3nn.measure_forces``.
- **md**: ms per NVE step (ASE ``VelocityVerlet`` through ``e3j_models.Calculator``, float32, 1 fs) on
  a Cu–Ni fcc supercell; ``--md NAME:N`` is a committed checkpoint (``cuni_mace``, ``cuni_nequip``) or
  a preset with random parameters (``mace_a``, ...) on ``4·N³`` atoms; ``NAME@C:N`` sets a preset's
  channel count to ``C`` (same architecture, narrower: ``mace_a@64:8``). The backends run
  ``--md-rounds`` rounds of ``--md-steps`` steps, interleaved (order alternating each round) so the
  shared CPU's load hits both alike; the round's best is reported. A backend whose compiled step needs
  more than 90 % of the free memory (XLA's memory analysis) is recorded as not fitting and not run.
  Only e3j's ``reference`` backend is practical on a CPU: the Pallas backends run here only in
  interpret mode (each kernel evaluated op by op in Python), orders of magnitude slower.
- **determinism**: ``--repeats`` evaluations of the same structure (committed checkpoints, 256
  atoms): max |E_i − E_0| and max |F_i − F_0| per backend (the paper's Figs. 9–10).
- **largest**: the largest atom count measured per model and backend, over this run and the
  committed ``cpu-models-vs-e3nn*.json`` files, and XLA's estimate of the largest that fits.

Results: JSON (``"complete": false`` until the last section is written), Markdown and a PNG beside
``--out``; ``python benchmarks/readme_tables.py --write`` renders them into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from e2e_tables import LABEL, markdown
from models_vs_e3nn import (
    PRESETS,
    command_line,
    convolution_backend,
    fits_free_memory,
    machine_info,
    measure_forces,
    memory_bytes,
)

import e3j_models as em
from e3j._bench import device_slug

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINTS = ROOT / "packages" / "e3j-models" / "checkpoints"


def _model(name: str):
    """(config, params) of a committed checkpoint, or of a Cu–Ni preset (``mace_a``, or ``mace_a@C`` with
    ``C`` channels) with random parameters."""
    if (CHECKPOINTS / name / "model.npz").exists():
        return em.load(CHECKPOINTS / name / "model.npz")
    preset, _, channels = name.partition("@")
    if preset not in PRESETS or (channels and (not channels.isdigit() or int(channels) < 1)):
        raise ValueError(
            f"--md model {name!r} is neither a committed checkpoint nor a preset {sorted(PRESETS)} "
            "(optionally with @CHANNELS, a positive int)"
        )
    cfg = PRESETS[preset]((28, 29), **({"num_channels": int(channels)} if channels else {}))
    params = em.Potential(cfg).init(jax.random.key(0), em.batch_structures([em.cuni_fcc(1)], (28, 29), cfg.cutoff))
    return cfg, params


def _fits(potential, params, atoms, dtype) -> tuple[bool, int | None]:
    """Whether the calculator's compiled step (at its first bucket) fits the free memory, and its bytes."""
    cfg = potential.config
    batch = em.batch_structures([atoms], cfg.atomic_numbers, cfg.cutoff, dtype=dtype)
    run = jax.jit(functools.partial(potential.__call__, stress=True))
    mem = memory_bytes(run.lower(jax.tree.map(lambda a: jnp.asarray(a, dtype), params), batch).compile())
    return fits_free_memory(mem), mem


def measure_md(
    name: str, repeats: int, backends, *, steps: int, rounds: int, dtype=np.float32, factored_radial: bool = True
) -> list[dict]:
    """ms per NVE step of model ``name`` on ``4·repeats³`` Cu–Ni atoms, backends interleaved."""
    from e3j_models.md import run_md

    cfg, params = _model(name)
    atoms = em.cuni_fcc(repeats)
    rows, calcs = {}, {}
    for backend in backends:
        pot = em.Potential(cfg, None if backend == "e3j" else backend, factored_radial=factored_radial)
        fits, mem = _fits(pot, params, atoms, dtype)
        rows[backend] = {
            "model": name,
            "backend": backend,
            "kernel_backend": convolution_backend(cfg, backend, dtype),
            "factored_radial": factored_radial,
            "atoms": len(atoms),
            "dtype": np.dtype(dtype).name,
            "memory_bytes": mem,
            "fits_free_memory": fits,
            "steps": steps,
            "rounds_ms_per_step": [],
        }
        if fits:
            calcs[backend] = em.Calculator(pot, params, dtype=dtype)
            t0 = time.perf_counter()
            probe = atoms.copy()
            probe.calc = calcs[backend]
            probe.get_forces()
            rows[backend]["compile_s"] = time.perf_counter() - t0
    for r in range(rounds):
        for backend in list(calcs)[:: 1 if r % 2 == 0 else -1]:
            log = run_md(atoms.copy(), calcs[backend], "nve", steps=steps, timestep_fs=1.0, seed=r, progress=False)
            rows[backend]["rounds_ms_per_step"].append(log["ms_per_step"])
            print(
                json.dumps({"md": name, "backend": backend, "round": r, "ms_per_step": log["ms_per_step"]}), flush=True
            )
    out = list(rows.values())
    for row in out:
        ms = row["rounds_ms_per_step"]
        row["ms_per_step"] = min(ms) if ms else float("nan")
        row["buckets"] = calcs[row["backend"]].buckets if row["backend"] in calcs else []
    return out


def measure_determinism(
    name: str, backends, *, repeats: int, supercell: int = 4, factored_radial: bool = True
) -> list[dict]:
    """Max deviation of energy and forces over ``repeats`` evaluations of one structure, per backend."""
    cfg, params = _model(name)
    batch = em.batch_structures([em.cuni_fcc(supercell)], cfg.atomic_numbers, cfg.cutoff, dtype=np.float32)
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    n = int(batch.node_mask.sum())
    rows = []
    for backend in backends:
        fn = jax.jit(em.Potential(cfg, None if backend == "e3j" else backend, factored_radial=factored_radial).__call__)
        outs = [jax.device_get(fn(params, batch)) for _ in range(repeats)]
        e = np.array([o["energy"][0] for o in outs], np.float64)
        f = np.stack([o["forces"][:n] for o in outs]).astype(np.float64)
        rows.append(
            {
                "model": name,
                "backend": backend,
                "kernel_backend": convolution_backend(cfg, backend, np.float32),
                "factored_radial": factored_radial,
                "atoms": n,
                "dtype": "float32",
                "repeats": repeats,
                "energy": float(e[0]),
                "max_abs_dE_eV": float(np.max(np.abs(e - e[0]))),
                "max_abs_dF_eV_per_A": float(np.max(np.abs(f - f[0]))),
                "forces0": f[0],
            }
        )
    f_first = rows[0]["forces0"]
    for row in rows:
        row["max_abs_F_vs_first_backend"] = float(np.max(np.abs(row["forces0"] - f_first)))
        row["abs_E_vs_first_backend"] = abs(row["energy"] - rows[0]["energy"])
        del row["forces0"]
    return rows


def largest(force_rows: list[dict]) -> list[dict]:
    """Per model and backend: the largest atom count run, the smallest that did not fit, XLA's estimate."""
    rows = list(force_rows)
    # the committed runs of this kind of device only (a GPU's table must not list a CPU's sizes)
    for path in sorted((ROOT / "benchmarks" / "results").glob(f"{device_slug()}-models-vs-e3nn*.json")):
        rows += [dict(r, source=path.name) for r in json.loads(path.read_text())["rows"]]
    out = []
    for key in sorted({(r["model"], r["backend"]) for r in rows}):
        mine = [r for r in rows if (r["model"], r["backend"]) == key]
        ran = [r for r in mine if not math.isnan(r["ms"])]
        best = max(ran, key=lambda r: r["atoms"]) if ran else None
        # a size that ran once but not in another (busier) run is not the limit
        failed = [
            r for r in mine if r.get("fits_free_memory") is False and (best is None or r["atoms"] > best["atoms"])
        ]
        top = max(mine, key=lambda r: r["atoms"])
        out.append(
            {
                "model": key[0],
                "backend": key[1],
                "largest_run_atoms": best["atoms"] if best else None,
                "largest_run_ms": best["ms"] if best else None,
                "largest_run_memory_bytes": best["memory_bytes"] if best else None,
                "largest_run_source": best.get("source", "this run") if best else None,
                "smallest_not_fitting_atoms": min((r["atoms"] for r in failed), default=None),
                "max_atoms_estimate": top["max_atoms_estimate"],
            }
        )
    return out


def plot(result: dict, path: Path) -> None:
    """Force inference time vs atom count per model, e3j solid, twin dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = [r for r in result.get("forces", []) if not math.isnan(r["ms"])]
    for k, model in enumerate(sorted({r["model"] for r in rows})):
        for backend, style in (("e3j", "-o"), ("e3nn", "--s")):
            pts = sorted((r["atoms"], r["ms"]) for r in rows if (r["model"], r["backend"]) == (model, backend))
            if pts:
                x, y = zip(*pts)
                ax.plot(x, y, style, color=f"C{k}", label=f"{model}, {LABEL[backend]}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("atoms (water box)")
    ax.set_ylabel("ms per energy + forces")
    ax.set_title(f"Force inference, {result['machine']['processor']} ({result['machine']['cpus']} cores)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _md_spec(text: str) -> tuple[str, int]:
    name, _, n = text.partition(":")
    if not n.isdigit() or int(n) < 1:
        raise argparse.ArgumentTypeError(f"--md takes NAME:N (N fcc repeats, 4·N³ atoms), got {text!r}")
    return name, int(n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=["mace_a", "mace_b", "nequip"], choices=sorted(PRESETS))
    ap.add_argument("--atoms", nargs="*", type=int, default=[100, 200])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--md", nargs="*", type=_md_spec, default=[("cuni_mace", 6), ("mace_a", 3)])
    ap.add_argument("--md-steps", type=int, default=5)
    ap.add_argument("--md-rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20, help="evaluations of one structure (determinism)")
    ap.add_argument("--determinism", nargs="*", default=["cuni_mace", "cuni_nequip"])
    ap.add_argument("--backends", nargs="+", default=["e3j", "e3nn"])
    ap.add_argument(
        "--array-radial", action="store_true", help="the radial MLP's output as an array (factored_radial=False)"
    )
    ap.add_argument("--out", default="benchmarks/results/cpu-e2e.json")
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "e2e": 1,
        "machine": machine_info(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command_line("benchmarks/e2e.py", args, skip=("out",)),
        "complete": False,
        "load_average_start": os.getloadavg(),
    }

    def write():
        out.with_suffix(".md").write_text(markdown(result) + "\n")
        out.write_text(json.dumps(result, indent=1) + "\n")

    fr = not args.array_radial  # the models' default: the radial MLP's output given factored
    t0 = time.perf_counter()
    result["md"] = [
        r
        for name, n in args.md
        for r in measure_md(name, n, args.backends, steps=args.md_steps, rounds=args.md_rounds, factored_radial=fr)
    ]
    write()
    result["determinism"] = [
        r
        for name in args.determinism
        for r in measure_determinism(name, args.backends, repeats=args.repeats, factored_radial=fr)
    ]
    write()
    result["forces"] = []
    for model in args.models:
        for n in args.atoms:
            result["forces"] += measure_forces(model, n, args.backends, runs=args.runs, factored_radial=fr)
        write()
    if result["forces"]:
        result["largest"] = largest(result["forces"])
    result["wall_seconds"] = time.perf_counter() - t0
    result["load_average_end"] = os.getloadavg()
    result["complete"] = True
    if result["forces"]:
        plot(result, out.with_suffix(".png"))
    write()  # the JSON last: "complete" True says every section ran
    print(markdown(result))


if __name__ == "__main__":
    jnp.zeros(())  # initialize the backend before timing anything
    main()
