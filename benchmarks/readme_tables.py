"""Render the README's benchmark tables from the committed results files (never typed in).

    python benchmarks/readme_tables.py          # print the tables
    python benchmarks/readme_tables.py --write  # replace the marked blocks in README.md

Each block in README.md sits between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` where
``benchmarks/results/NAME.json`` is the results file; a test checks that the README is up to date.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
GB = 1e9


def markdown(rows: list[dict]) -> str:
    """Tables of `benchmarks/reference_vs_e3nn.py` rows."""
    lines = [
        "| op | lmax | y | reference fwd GB/s | e3nn-jax fwd GB/s | fwd speedup | reference fwd / copy | "
        "reference bwd GB/s | e3nn-jax bwd GB/s | bwd speedup |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["op"] != "tensor_product":
            continue
        lines.append(
            f"| TP | {r['lmax']} | {r['y']} | {r['reference_fwd_GBps']:.2f} | {r['e3nn_fwd_GBps']:.2f} | "
            f"{r['fwd_speedup']:.2f}x | {r['fwd_fraction_of_copy']:.0%} | {r['reference_bwd_GBps']:.2f} | "
            f"{r['e3nn_bwd_GBps']:.2f} | {r['bwd_speedup']:.2f}x |"
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
                f"({r['e3nn_peak_over_io']:.2f}x I/O); reference time {r['reference_value_and_grad_s']:.1f} s."
            )
    return "\n".join(lines)


def render_bench(name: str, result: dict) -> str:
    """A ``python -m e3j bench`` results file: its own Markdown table, and its PNG when committed."""
    from e3j._sweep import table

    d = result["device"]
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    head = (
        f"Measured on {d['kind']} ({d['host']}, {d['cores']} cores), {result['date'][:10]}, {versions}; "
        f"command: `{result['command']}`; {result['method']}; jitted copy in the same run: "
        f"{result['copy']['GBps']:.2f} GB/s."
    )
    text = head + "\n\n" + table(result)
    if (RESULTS / f"{name}.png").exists():
        text += f"\n\n![{name}](benchmarks/results/{name}.png)"
    return text


def render(name: str) -> str:
    result = json.loads((RESULTS / f"{name}.json").read_text())
    if "copy" in result:
        return render_bench(name, result)
    copy = next((r["copy_GBps"] for r in result["rows"] if "copy_GBps" in r), None)
    head = (
        f"Measured on {result['device']}, {result['date'][:10]}, jax {result['jax']}, e3j {result['e3j']}, "
        f"e3nn-jax {result['e3nn_jax']}; command: `{result['command']}`"
        + (f"; jitted copy in the same run: {copy:.2f} GB/s" if copy else "")
        + "."
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
    readme = ROOT / "README.md"
    if "--write" in sys.argv:
        readme.write_text(updated(readme.read_text()))
    else:
        for name in blocks(readme.read_text()):
            print(render(name))
