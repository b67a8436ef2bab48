"""Markdown tables of a ``benchmarks/e2e.py`` results file (no JAX: ``readme_tables.py`` renders them too)."""

from __future__ import annotations

import math

LABEL = {"e3j": "e3j", "e3nn": "e3nn-jax twin"}


def _label(row: dict) -> str:
    """The row's backend, e3j's with the kernel backend its convolutions ran on when recorded."""
    label = LABEL.get(row["backend"], row["backend"])
    kernels = row.get("kernel_backend")
    return f"{label} ({kernels})" if row["backend"] == "e3j" and kernels else label


def _gib(b) -> str:
    return f"{b / 2**30:.2f} GiB" if b else "n/a"


def _vs_twin(rows: list[dict], key: str) -> list[str]:
    """Each row's speed against the e3nn-jax twin's run of the same model and size: the twin's time over
    the row's ("n/a" without a twin row; above 1, faster than the twin)."""
    twin = {(r["model"], r["atoms"]): r for r in rows if r["backend"] == "e3nn"}
    out = []
    for r in rows:
        t = twin.get((r["model"], r["atoms"]))
        if t is not None and not t.get("fits_free_memory", True) and r is not t:
            out.append("twin does not fit")
        elif t is not None and t.get("fits_free_memory", True) and r.get(key) and math.isfinite(t[key] / r[key]):
            out.append(f"{t[key] / r[key]:.2f}×")
        else:
            out.append("n/a")
    return out


def markdown(result: dict) -> str:
    """The results as Markdown tables (also rendered into docs/benchmarks.md)."""
    m = result["machine"]
    end = result.get("load_average_end")
    load = f"1-min load average {result['load_average_start'][0]:.1f} at the start, " + (
        f"{end[0]:.1f} at the end" if end else "none recorded at the end (the run was cut short)"
    )
    cpu = m.get("cpu") or m.get("processor", "?")
    parts = [
        f"Measured {result['date'][:10]} on {m['device']}, {cpu} ({m['cpus']} cores, "
        f"{m['memory_bytes'] / 2**30:.0f} GiB, {m['platform']}), jax {m['jax']}; "
        + (f"{m['note']}; " if m["note"] else "")
        + f"{load}; command: `{result['command']}`."
        + ("" if result.get("complete") else " **Incomplete run.**")
    ]
    forces = result.get("forces", [])
    if forces:
        lines = [
            "Force inference (jitted energy + forces, water box, float32; mean of the fastest 20 % of the runs; "
            "vs e3nn-jax twin: the twin's ms over the row's):",
            "",
            "| model | atoms | edges | backend | ms | vs e3nn-jax twin | memory (XLA) | est. max atoms |",
            "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
        ]
        for r, vs in zip(forces, _vs_twin(forces, "ms"), strict=True):
            ms = "does not fit" if not r["fits_free_memory"] else f"{r['ms']:.0f}"
            lines.append(
                f"| {r['model']} | {r['atoms']} | {r['edges']} | {_label(r)} | {ms} "
                f"| {vs} | {_gib(r['memory_bytes'])} | {r['max_atoms_estimate'] or 'n/a'} |"
            )
        parts.append("\n".join(lines))
    md = result.get("md", [])
    if md:
        lines = [
            "MD (NVE, ASE VelocityVerlet through `e3j_models.Calculator`, Cu–Ni fcc, float32, 1 fs; best round of "
            "interleaved rounds; ms/step includes the host neighbour list and ASE; vs e3nn-jax twin: the twin's "
            "ms/step over the row's):",
            "",
            "| model | atoms | backend | ms/step | rounds (ms/step) | vs e3nn-jax twin | memory (XLA) |",
            "| --- | ---: | --- | ---: | --- | ---: | ---: |",
        ]
        for r, vs in zip(md, _vs_twin(md, "ms_per_step"), strict=True):
            if not r["fits_free_memory"]:
                ms, ratio = "does not fit", "n/a"
            else:
                ms, ratio = f"{r['ms_per_step']:.0f}", vs
            rounds = ", ".join(f"{x:.0f}" for x in r["rounds_ms_per_step"]) or "-"
            lines.append(
                f"| {r['model']} | {r['atoms']} | {_label(r)} | {ms} | {rounds} | {ratio} | {_gib(r['memory_bytes'])} |"
            )
        parts.append("\n".join(lines))
    det = result.get("determinism", [])
    if det:
        lines = [
            "Run-to-run deviation (the same structure evaluated repeatedly, float32):",
            "",
            "| model | atoms | backend | evaluations | max \\|ΔE\\| (eV) | max \\|ΔF\\| (eV/Å) "
            "| \\|E − E(e3j)\\| (eV) | max \\|F − F(e3j)\\| (eV/Å) |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in det:
            lines.append(
                f"| {r['model']} | {r['atoms']} | {_label(r)} | {r['repeats']} "
                f"| {r['max_abs_dE_eV']:.1e} | {r['max_abs_dF_eV_per_A']:.1e} | {r['abs_E_vs_first_backend']:.1e} "
                f"| {r['max_abs_F_vs_first_backend']:.1e} |"
            )
        parts.append("\n".join(lines))
    big = result.get("largest", [])
    if big:
        lines = [
            "Largest system per model and backend (water box, float32; runs from this file and the committed "
            "`cpu-models-vs-e3nn*` results; the estimate scales XLA's memory analysis to this machine's memory):",
            "",
            "| model | backend | largest run (atoms) | its ms | its memory (XLA) | smallest not fitting "
            "| est. max atoms |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in big:
            ms = f"{r['largest_run_ms']:.0f}" if r["largest_run_ms"] else "-"
            lines.append(
                f"| {r['model']} | {_label(r)} | {r['largest_run_atoms'] or '-'} | {ms} "
                f"| {_gib(r['largest_run_memory_bytes'])} | {r['smallest_not_fitting_atoms'] or '-'} "
                f"| {r['max_atoms_estimate'] or 'n/a'} |"
            )
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
