"""Render the benchmark tables of docs/benchmarks.md from the committed results files (never typed in).

    python benchmarks/readme_tables.py          # print the tables
    python benchmarks/readme_tables.py --write  # replace the marked blocks in docs/benchmarks.md

Each block in docs/benchmarks.md sits between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` where
``benchmarks/results/NAME.json`` is the results file; a test checks that the page is up to date.
The block ``accelerators`` collects every ``python -m e3j bench`` results file measured on a GPU or
TPU (``benchmarks/paper_sizes.py``, ``benchmarks/device.sh``), grouped by device, with the paper's
Table 1 scaled to the device's datasheet bandwidth and the kernel goals as fractions of the copy
bandwidth measured in the same run.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: The generated page (its image links are relative to docs/).
PAGE = ROOT / "docs" / "benchmarks.md"
GB = 1e9


def markdown(rows: list[dict]) -> str:
    """Tables of `benchmarks/reference_vs_e3nn.py` rows, as ratios measured in the run (a CPU's
    absolute throughput is not reported: the results file keeps it)."""
    lines = [
        "| op | lmax | y | fwd: reference vs e3nn-jax | fwd: reference / copy | bwd: reference vs e3nn-jax |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["op"] != "tensor_product":
            continue
        lines.append(
            f"| TP | {r['lmax']} | {r['y']} | {r['fwd_speedup']:.2f}x | {r['fwd_fraction_of_copy']:.0%} | "
            f"{r['bwd_speedup']:.2f}x |"
        )
    for r in rows:
        if r["op"].startswith("convolution"):
            lines.append("")
            lines.append(
                f"Convolution value-and-gradient, lmax 3, {r['nodes']} nodes, {r['edges']} edges, "
                f"{r['channels']} channels: inputs+outputs+cotangents {r['io_bytes'] / GB:.2f} GB, "
                f"messages alone would be {r['message_array_bytes'] / GB:.2f} GB; XLA peak "
                f"(arguments + outputs + temporaries): reference {r['reference_xla_peak_bytes'] / GB:.2f} GB "
                f"({r['reference_peak_over_io']:.2f}x I/O), e3nn-jax {r['e3nn_xla_peak_bytes'] / GB:.2f} GB "
                f"({r['e3nn_peak_over_io']:.2f}x I/O)."
            )
    return "\n".join(lines)


def ratio_table(result: dict, baseline: str = "e3nn") -> str:
    """A CPU sweep of ``python -m e3j bench`` as ratios measured in its run: each implementation's
    throughput as a fraction of the jitted copy's, and its speedup over ``baseline``'s."""
    rows = [r for r in result["rows"] if r["op"] != "convolution_memory"]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    others = [i for i in impls if i != baseline]

    def key(r: dict) -> tuple:
        return r["op"], r["direction"], r["lmax"], r["channels"], r["size"]

    keys = list(dict.fromkeys(key(r) for r in rows))
    by = {(*key(r), r["impl"]): r["GBps"] for r in rows if "GBps" in r}
    copy = result["copy"]["GBps"]
    head = (
        "| op | dir | lmax | C | size | "
        + " | ".join(f"{i} / copy" for i in impls)
        + "".join(f" | {i} vs {baseline}" for i in others if baseline in impls)
        + " |"
    )
    width = 5 + len(impls) + (len(others) if baseline in impls else 0)
    lines = [head, "|" + " --- |" * width]
    for key in keys:  # a measurement that failed stays as "error"
        cells = [f"{by[(*key, i)] / copy:.0%}" if (*key, i) in by else "error" for i in impls]
        if baseline in impls:
            base = by.get((*key, baseline))
            cells += [f"{by[(*key, i)] / base:.2f}x" if base and (*key, i) in by else "n/a" for i in others]
        lines.append("| " + " | ".join(map(str, key)) + " | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_bench(name: str, result: dict) -> str:
    """A ``python -m e3j bench`` results file: its own Markdown table, and its PNG when committed.
    On a CPU, ratios measured in the run instead of GB/s, and no plot (it draws GB/s)."""
    from e3j._sweep import memory_table, table

    d = result["device"]
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    cpu = d["kind"] == "cpu"
    head = (
        f"Measured on {d['kind']} ({d['host']}, {d['cores']} cores), {result['date'][:10]}, {versions}; "
        f"command: `{result['command']}`; {result['method']}"
        + ("; ratios to a jitted copy (and to e3nn-jax, where run) measured in the same run." if cpu else
           f"; jitted copy in the same run: {result['copy']['GBps']:.2f} GB/s.")
    )  # fmt: skip
    if cpu:
        memory = memory_table(result)
        return head + "\n\n" + ratio_table(result) + ("\n\n" + memory if memory else "")
    text = head + "\n\n" + table(result)
    if (RESULTS / f"{name}.png").exists():
        text += f"\n\n![{name}](../benchmarks/results/{name}.png)"
    return text


# The paper's Table 1 (NVIDIA H100, 3.35 TB/s HBM), GB/s at 64, 128, 256, 512, 1024 channels; N·C = 2^22
# at lmax 2 and 2^21 at lmax 3, 45 neighbours. Keys: (implementation, direction, lmax).
PAPER_DEVICE_GBPS = 3350
PAPER_CHANNELS = (64, 128, 256, 512, 1024)
PAPER_TABLE1 = {
    ("cuEquivariance", "fwd", 2): (779, 833, 786, 807, 755),
    ("cuEquivariance", "fwd", 3): (829, 1072, 662, 632, 629),
    ("cuEquivariance", "bwd", 2): (1245, 1287, 1263, 1264, 1248),
    ("cuEquivariance", "bwd", 3): (1059, 1104, 1119, 1118, 1128),
    ("e3j (CUDA)", "fwd", 2): (625, 955, 913, 956, 880),
    ("e3j (CUDA)", "fwd", 3): (389, 569, 573, 562, 538),
    ("e3j (CUDA)", "bwd", 2): (446, 709, 638, 560, 623),
    ("e3j (CUDA)", "bwd", 3): (310, 423, 402, 317, 183),
    ("e3j (Pallas GPU)", "fwd", 2): (None, 1621, 1669, 1716, 1871),
    ("e3j (Pallas GPU)", "fwd", 3): (None, 1818, 1859, 2074, 2067),
    ("e3j (Pallas GPU)", "bwd", 2): (None, 1267, 1292, 1319, 1328),
    ("e3j (Pallas GPU)", "bwd", 3): (None, 1407, 1432, 1483, 1599),
}
# Kernel goals on the GPU (issues 5 and 6), as fractions of the copy bandwidth measured in the same
# run: (backend, op, direction, lmax, channel counts, fraction).
GOALS = (
    ("pallas_gpu", "tensor_product", "fwd", 3, "128+", 0.85),
    ("pallas_gpu", "convolution", "fwd", 3, "128+", 0.70),
    ("pallas_gpu", "convolution", "bwd", 3, "128+", 0.50),
    ("cuda", "tensor_product", "fwd", 3, "256", 0.85),
)


def _best(rows, impl, op, direction, lmax, channels):
    ok = [
        r
        for r in rows
        if (r["impl"], r["op"], r.get("direction"), r["lmax"]) == (impl, op, direction, lmax)
        and "error" not in r
        and (r["channels"] >= 128 if channels == "128+" else r["channels"] == int(channels))
    ]
    return max(ok, key=lambda r: r["fraction_of_copy"]) if ok else None


def goals(results: list[dict]) -> str:
    """The GPU kernel goals against one device's results files (empty when none applies)."""
    rows = [r for result in results for r in result["rows"]]
    lines = []
    for impl, op, direction, lmax, channels, target in GOALS:
        best = _best(rows, impl, op, direction, lmax, channels)
        if best is None:
            continue
        reached = best["fraction_of_copy"]
        where = f"C={best['channels']}, size {best['size']}, {best['GBps']:.0f} GB/s" + best.get("how", "")
        verdict = "met" if reached >= target else "missed"
        lines.append(
            f"| {impl} | {op} {direction} | {lmax} | {channels} | {target:.0%} | {reached:.1%} ({where}) | {verdict} |"
        )
    key = ("cuda", "convolution", "fwd", 3)
    cuda_fwd = [r for r in rows if (r["impl"], r["op"], r.get("direction"), r["lmax"]) == key]
    datasheet = next((x["datasheet_GBps"] for x in results if x.get("datasheet_GBps")), None)
    if datasheet:
        scale = datasheet / PAPER_DEVICE_GBPS
        for c, paper in zip(PAPER_CHANNELS, PAPER_TABLE1[("e3j (CUDA)", "fwd", 3)]):
            ok = [r["GBps"] for r in cuda_fwd if r["channels"] == c and "error" not in r]
            if ok:
                goal = f"paper's e3j (CUDA) x {scale:.2f} = {paper * scale:.0f} GB/s"
                verdict = "met" if max(ok) >= paper * scale else "missed"
                lines.append(f"| cuda | convolution fwd | 3 | {c} | {goal} | {max(ok):.0f} GB/s | {verdict} |")
    if not lines:
        return ""
    head = ["| backend | op | lmax | C | goal | reached (best size) | |", "| --- | --- | --- | --- | --- | --- | --- |"]
    return "\n".join(head + lines)


def paper_table1(datasheet_GBps: float) -> str:
    """The paper's Table 1 scaled by this device's datasheet bandwidth over the H100's."""
    scale = datasheet_GBps / PAPER_DEVICE_GBPS
    lines = [
        f"| paper Table 1 x {scale:.2f} (GB/s) | dir | lmax | " + " | ".join(f"C={c}" for c in PAPER_CHANNELS) + " |",
        "|" + " --- |" * (3 + len(PAPER_CHANNELS)),
    ]
    for (impl, direction, lmax), values in PAPER_TABLE1.items():
        cells = ["-" if v is None else f"{v * scale:.0f}" for v in values]
        lines.append(f"| {impl} | {direction} | {lmax} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def diag_rows(kind: str) -> list[dict]:
    """``benchmarks/tp_fwd_diag.py``'s rows measured on ``kind``, as :func:`goals` reads rows: its
    calls streamed back to back against the largest copy of the same run (no lowering beside them)."""
    rows = []
    for path in sorted(RESULTS.glob("*-tp-fwd-diag.json")):
        result = json.loads(path.read_text())
        if result["device"] != kind:
            continue
        for r in result["rows"]:
            rows.append(
                {"op": "tensor_product", "direction": r["direction"], "lmax": r["lmax"], "channels": r["channels"],
                 "size": r["batch"], "impl": r["impl"], "GBps": r["stream_GBps"],
                 "fraction_of_copy": r["stream_fraction_of_copy"], "how": f"; streamed, `{path.name}`"}
            )  # fmt: skip
    return rows


def accelerator_results() -> dict[str, list[tuple[str, dict]]]:
    """``python -m e3j bench`` results files measured off the CPU, by device kind."""
    by_device: dict[str, list[tuple[str, dict]]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        result = json.loads(path.read_text())
        # (benchmarks/tp_fwd_diag.py's files, whose device is a name, have blocks of their own)
        if "copy" in result and isinstance(result["device"], dict) and result["device"]["platform"] != "cpu":
            by_device.setdefault(result["device"]["kind"], []).append((path.stem, result))
    return by_device


def render_accelerators(by_device: dict[str, list[tuple[str, dict]]]) -> str:
    if not by_device:
        return (
            "No GPU or TPU run is committed yet. `bash benchmarks/device.sh` on a GPU machine (or "
            "`bash benchmarks/tpu.sh` on a TPU VM) writes the results files "
            "this section is generated from."
        )
    parts = []
    for kind, named in by_device.items():
        results = [r for _, r in named]
        parts.append(f"### {kind}")
        for name, result in named:
            parts.append(f"#### `{name}`\n\n" + render_bench(name, result))
        datasheet = next((r["datasheet_GBps"] for r in results if r.get("datasheet_GBps")), None)
        if datasheet and any(r["op"] == "convolution" for x in results for r in x["rows"]):
            parts.append(paper_table1(datasheet))
        summary = goals([*results, {"rows": diag_rows(kind)}])
        if summary:
            parts.append("Kernel goals (fractions of the copy measured in the same run):\n\n" + summary)
    return "\n\n".join(parts)


def render_diag(result: dict) -> str:
    """``benchmarks/tp_fwd_diag.py``: each backend's op timed alone, streamed, beside a Python thread
    and under the profiler, against the largest copy of the same run."""
    copy = max(result["copy"], key=lambda c: c["bytes"])
    lines = [
        f"Measured on {result['device']}, {result['date'][:10]}; command: `{result['command']}`; the largest "
        f"jitted copy in the same run ({copy['bytes'] / 2**30:.0f} GiB): {copy['GBps']:.0f} GB/s.",
        "",
        "| op | backend | lmax | C | rows | alone ms | streamed ms | beside Python ms | kernel ms (profiler) "
        "| streamed GB/s | fraction of copy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        kernel = " + ".join(f"{e['mean_s'] * 1e3:.3f}" for e in r.get("device_events", [])) or "-"
        lines.append(
            f"| tensor_product {r['direction']} | {r['impl']} | {r['lmax']} | {r['channels']} | {r['batch']} "
            f"| {r['quiet_s'] * 1e3:.3f} | {r['stream_s'] * 1e3:.3f} | {r['beside_python_s'] * 1e3:.3f} | {kernel} "
            f"| {r['stream_GBps']:.0f} | {r['stream_fraction_of_copy']:.0%} |"
        )
    return "\n".join(lines)


def _share(s: dict) -> str:
    cell = f"{s['median']:+.1%} [{s['q1']:+.1%}, {s['q3']:+.1%}]"
    return cell + (f" ({s['a_ms']:.3f} / {s['b_ms']:.3f} ms)" if "a_ms" in s else "")


def render_shares(result: dict) -> str:
    """``benchmarks/grouped_kernel_parts.py``: the grouped kernels' share beyond the groups' own."""
    head = "Measured on " + ", ".join(str(result[k]) for k in ("device", "machine", "date") if k in result)
    if "command" in result:
        head += f"; command: `{result['command']}`"
    lines = [
        head + ". Share = 1 − groups / grouped, median [quartiles] of paired single calls"
        " (with the medians' ms, grouped / groups, where recorded).",
        "",
        "| backend | nodes | edges | pairs | forward share | backward share |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['backend']} | {r['nodes']} | {r['edges']} | {r['pairs']} | {_share(r['fwd'])} | {_share(r['bwd'])} |"
        )
    return "\n".join(lines)


def render(name: str) -> str:
    if name == "accelerators":
        return render_accelerators(accelerator_results())
    result = json.loads((RESULTS / f"{name}.json").read_text())
    if "switch_interval_s" in result:  # benchmarks/tp_fwd_diag.py
        return render_diag(result)
    if isinstance((result.get("rows") or [{}])[0].get("fwd"), dict):
        return render_shares(result)  # benchmarks/grouped_kernel_parts.py
    if "target" in result:  # benchmarks/triton_resources.py
        spec = importlib.util.spec_from_file_location("triton_resources", ROOT / "benchmarks" / "triton_resources.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return (
            f"Measured {result['date'][:10]} on {result['host']}, jax {result['versions']['jax']}, "
            f"Triton {result['versions']['triton']}, target {result['target']}; command: `{result['command']}`."
            "\n\n" + module.markdown(result)
        )
    if "e2e" in result:  # benchmarks/e2e.py
        spec = importlib.util.spec_from_file_location("e2e_tables", ROOT / "benchmarks" / "e2e_tables.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        text = module.markdown(result)
        if (RESULTS / f"{name}.png").exists():
            text += f"\n\n![{name}](../benchmarks/results/{name}.png)"
        return text
    if "copy" in result:
        return render_bench(name, result)
    head = (
        f"Measured on {result['device']}, {result['date'][:10]}, jax {result['jax']}, e3j {result['e3j']}, "
        f"e3nn-jax {result['e3nn_jax']}; command: `{result['command']}`."
    )
    return head + "\n\n" + markdown(result["rows"])


def blocks(text: str) -> list[str]:
    return re.findall(r"<!-- ([\w.-]+):start -->", text)


def updated(text: str) -> str:
    for name in blocks(text):
        pattern = re.compile(rf"(<!-- {re.escape(name)}:start -->).*?(<!-- {re.escape(name)}:end -->)", re.S)
        text = pattern.sub(lambda m, name=name: m.group(1) + "\n" + render(name) + "\n" + m.group(2), text)
    return text


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Render docs/benchmarks.md's tables from benchmarks/results.")
    parser.add_argument("--write", action="store_true", help="replace the marked blocks in docs/benchmarks.md")
    if parser.parse_args().write:
        PAGE.write_text(updated(PAGE.read_text()))
    else:
        for name in blocks(PAGE.read_text()):
            print(render(name))
