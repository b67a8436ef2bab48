"""e3j-models on e3j against the e3nn-jax twin, same parameters, in one run (issue 15).

    python benchmarks/models_vs_e3nn.py [--models mace_a nequip] [--atoms 1000 5000] [--runs 5]
                                        [--dtype float32] [--out benchmarks/results/cpu-models-vs-e3nn.json]

For each model preset (Table 3: MACE (a), NequIP; full sizes) and each atom count: a periodic water
box at liquid density (0.1 atoms/Å³, molecules on a jittered grid), neighbour list within 5 Å
(vesin), padded by 10 %; then the jitted energy + forces of the e3j path and of the e3nn-jax twin with
the same parameters: ms per evaluation (mean of the fastest 20 % of ``--runs`` after one warm-up),
compile time, XLA's own memory analysis of the compiled executable (temporaries + arguments +
outputs), and from it the largest atom count that would fit in this machine's memory (linear in the
atom count at fixed density; an estimate, not a run). Results: JSON + Markdown beside ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import e3j_models as em
from e3j._bench import host_info, kernel_backend, time_call

PRESETS = {"mace_a": em.mace_a, "mace_b": em.mace_b, "nequip": em.nequip}


def memory_bytes(compiled) -> int | None:
    m = compiled.memory_analysis()
    if m is None:
        return None
    return int(m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes)


def command_line(script: str, args: argparse.Namespace, skip: tuple[str, ...] = ()) -> str:
    """The command that reruns ``script`` with ``args`` (a results file's ``command``): flags spelled
    as argparse takes them, a true switch as itself and a false one left out, tuples as ``a:b``;
    ``E3J_BACKEND`` in front when set (it picks e3j's kernels)."""
    backend = os.environ.get("E3J_BACKEND", "").strip()
    words = ([f"E3J_BACKEND={backend}"] if backend else []) + ["python", script]
    for key, value in vars(args).items():
        if key in skip or value is False or value is None:
            continue
        words.append("--" + key.replace("_", "-"))
        if value is True:
            continue
        values = value if isinstance(value, list) else [value]
        words += [":".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in values]
    return " ".join(words)


def convolution_backend(cfg, backend: str, dtype) -> str | None:
    """The kernel backend that runs ``cfg``'s convolutions for a row's ``backend`` (``"e3j"``: e3j's own
    choice on this device, which is the ``test`` plugin's on a development environment's CPU; the
    twin: none)."""
    if backend == "e3nn":
        return None
    name = None if backend == "e3j" else backend
    return kernel_backend("convolution", cfg.num_channels, cfg.l_max, np.dtype(dtype).name, name)


def fits_free_memory(mem: int | None) -> bool:
    """Whether an executable of ``mem`` bytes (None: unknown) fits 90 % of the memory free now.

    One larger would be killed for memory: it is recorded as not fitting, not run.
    """
    return mem is None or mem < 0.9 * device_memory()[1]


def device_memory() -> tuple[int, int]:
    """``(total, free)`` bytes of the memory the default device computes in: an accelerator's from
    JAX's memory statistics, the host's on a CPU (whose device reports none)."""
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]), int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    page = os.sysconf("SC_PAGE_SIZE")
    return page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")


def host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def machine_info() -> dict:
    """This machine, as the results files name it."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu": host_info()["cpu"],
        "cpus": os.cpu_count(),
        "memory_bytes": host_memory(),
        "device_memory_bytes": device_memory()[0],
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        # what the script knows: the load (beside it in the results) says how busy the machine was
        "note": f"{os.cpu_count()} CPU cores: timings vary with the machine's load"
        if jax.devices()[0].platform == "cpu"
        else "",
    }


def measure_forces(
    model: str,
    atoms: int,
    backends=("e3j", "e3nn"),
    *,
    runs: int = 5,
    dtype="float32",
    memory_only: bool = False,
    factored_radial: bool = True,
) -> list[dict]:
    """One row per backend: jitted energy + forces of preset ``model`` on a water box of ``atoms`` atoms.

    The backends share the parameters (initialized once); a backend whose compiled executable needs
    more than 90 % of the free memory is compiled but not run (``fits_free_memory`` False, ``ms`` NaN).
    """
    dtype = np.dtype(dtype)
    cfg = PRESETS[model]((1, 8))
    batch = em.batch_structures([em.water_box(atoms)], cfg.atomic_numbers, cfg.cutoff, dtype=dtype)
    n_real, e_real = int(batch.node_mask.sum()), int(batch.graph.num_valid)
    params, rows = None, []
    for backend in backends:
        pot = em.Potential(cfg, None if backend == "e3j" else backend, factored_radial=factored_radial)
        if params is None:
            params = pot.init(jax.random.key(0), batch, dtype=dtype)
        fn = jax.jit(lambda p, b, pot=pot: pot(p, b))
        t0 = time.perf_counter()
        compiled = fn.lower(params, batch).compile()
        compile_s = time.perf_counter() - t0
        mem = memory_bytes(compiled)
        fits = fits_free_memory(mem)
        if fits and not memory_only:
            seconds = time_call(compiled, params, batch, runs=runs, warmup=1)
            energy = float(compiled(params, batch)["energy"][0])
        else:
            seconds, energy = float("nan"), float("nan")
        del compiled
        row = {
            "model": model,
            "backend": backend,
            "kernel_backend": convolution_backend(cfg, backend, dtype),
            "factored_radial": factored_radial,
            "atoms": n_real,
            "edges": e_real,
            "padded_nodes": int(batch.node_mask.shape[0]),
            "padded_edges": int(batch.graph.num_edges),
            "dtype": dtype.name,
            "ms": seconds * 1e3,
            "compile_s": compile_s,
            "memory_bytes": mem,
            "max_atoms_estimate": None if not mem else int(device_memory()[0] / mem * n_real),
            "fits_free_memory": fits,
            "energy": energy,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    for r in rows:
        r["energy_rel_diff_vs_first"] = abs(r["energy"] - rows[0]["energy"]) / abs(rows[0]["energy"])
        r["speedup_of_first"] = r["ms"] / rows[0]["ms"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["mace_a", "nequip"], choices=sorted(PRESETS))
    ap.add_argument("--atoms", nargs="+", type=int, default=[1000])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--backends", nargs="+", default=["e3j", "e3nn"])
    ap.add_argument("--out", default="benchmarks/results/cpu-models-vs-e3nn.json")
    ap.add_argument(
        "--array-radial", action="store_true", help="the radial MLP's output as an array (factored_radial=False)"
    )
    ap.add_argument("--memory-only", action="store_true", help="compile and report XLA's memory analysis; run nothing")
    args = ap.parse_args()
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    rows = []
    for model in args.models:
        for n in args.atoms:
            rows += measure_forces(
                model,
                n,
                args.backends,
                runs=args.runs,
                dtype=args.dtype,
                memory_only=args.memory_only,
                factored_radial=not args.array_radial,
            )
    result = {
        "machine": machine_info(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command_line("benchmarks/models_vs_e3nn.py", args),
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "| model | atoms | edges | backend | ms / energy+forces | first backend faster by | compile s "
        "| memory (XLA) | est. max atoms |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        mem = f"{r['memory_bytes'] / 2**30:.2f} GiB" if r["memory_bytes"] else "n/a"
        lines.append(
            f"| {r['model']} | {r['atoms']} | {r['edges']} | {r['backend']} | {r['ms']:.0f} "
            f"| {r['speedup_of_first']:.2f}× | {r['compile_s']:.0f} "
            f"| {mem} | {r['max_atoms_estimate'] or 'n/a'} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    jnp.zeros(())  # initialize the backend before timing anything
    main()
