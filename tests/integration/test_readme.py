"""The README is a working front door; docs/benchmarks.md is rendered from the committed results files."""

import contextlib
import importlib.util
import io
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tables():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "benchmarks" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_tables_match_results_files():
    tables = _tables()
    page = tables.PAGE.read_text()
    assert tables.PAGE == ROOT / "docs" / "benchmarks.md"
    assert tables.blocks(page), "docs/benchmarks.md has no generated benchmark block"
    assert tables.updated(page) == page, "docs/benchmarks.md is stale: run python benchmarks/readme_tables.py --write"
    for image in re.findall(r"!\[[^]]*\]\(([^)]+)\)", page):
        assert (tables.PAGE.parent / image).resolve().is_file(), f"docs/benchmarks.md links a missing image {image}"


def test_cpu_blocks_give_ratios_not_throughput():
    # the project's rule: a shared CPU's timings are reported as ratios against a baseline measured
    # in the same run; absolute throughput only from a GPU or TPU
    tables = _tables()
    cpu = [name for name in tables.blocks(tables.PAGE.read_text()) if name.startswith("cpu-")]
    assert "cpu-e3j-bench" in cpu and "cpu-reference-vs-e3nn" in cpu
    for name in cpu:
        assert "GB/s" not in tables.render(name), name
    sweep = {
        "device": {"kind": "cpu", "host": "x86_64", "cores": 2},
        "copy": {"GBps": 4.0},
        "rows": [
            {"op": "tensor_product", "direction": "fwd", "lmax": 2, "channels": 8, "size": 64, "impl": i, "GBps": g}
            for i, g in (("reference", 6.0), ("e3nn", 2.0))
        ],
    }
    sweep["rows"] += [
        {"op": "tensor_product", "direction": "fwd", "lmax": 2, "channels": 8, "size": 256, "impl": i, "error": "oom"}
        for i in ("reference", "e3nn")
    ]
    assert tables.ratio_table(sweep).splitlines()[-2:] == [
        "| tensor_product | fwd | 2 | 8 | 64 | 150% | 50% | 3.00x |",
        "| tensor_product | fwd | 2 | 8 | 256 | error | error | n/a |",  # a failed measurement is kept
    ]


def test_readme_first_code_block_is_a_working_example():
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"^```(\w*)\n(.*?)^```", readme, re.S | re.M)
    assert match is not None, "README has no code block"
    assert match.group(1) == "python", "the README's first code block must be the Python example"
    first_line = readme[: match.start()].count("\n") + 1
    last_line = first_line + match.group(2).count("\n") + 1
    assert last_line <= 40, f"the example must end within the README's first 40 lines, ends at line {last_line}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(match.group(2), "README.md", "exec"), {})
    assert out.getvalue().strip() == "(6, 35, 32) (6, 35, 32) (6, 9, 32)"


def test_readme_links_exist():
    readme = (ROOT / "README.md").read_text()
    links = [link for link in re.findall(r"\]\(([^)#]+)\)", readme) if "://" not in link]
    assert links, "README links nothing"
    for link in links:
        assert (ROOT / link).exists(), f"README links a missing file {link}"


def test_readme_quickstart_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m nox -s tests" in readme and "python3 -m nox -s tests" in ci


def _gpu_result(rows, datasheet=4800.0):
    return {
        "command": "python -m e3j bench ...",
        "date": "2026-12-01T00:00:00+00:00",
        "device": {"platform": "gpu", "kind": "NVIDIA H200", "host": "x86_64", "cores": 16},
        "versions": {"jax": "0.11.2"},
        "copy": {"bytes": 2**28, "seconds": 1e-4, "GBps": 4000.0},
        "datasheet_GBps": datasheet,
        "method": "mean of the fastest 20% of 20 runs",
        "rows": rows,
    }


def _row(impl, op, direction, lmax, c, fraction, size=1024):
    return {
        "op": op, "direction": direction, "lmax": lmax, "channels": c, "size": size, "degree": 45, "impl": impl,
        "GBps": 4000.0 * fraction, "fraction_of_copy": fraction, "seconds": 1.0, "bytes": 1,
    }  # fmt: skip


def test_accelerator_section_renders_goals_from_results_files(tmp_path, monkeypatch):
    tables = _tables()
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert "No GPU or TPU run is committed yet" in tables.render("accelerators")
    fig1 = [
        _row("pallas_gpu", "tensor_product", "fwd", 3, 64, 0.95),  # below 128 channels: not counted
        _row("pallas_gpu", "tensor_product", "fwd", 3, 128, 0.80),
        _row("pallas_gpu", "tensor_product", "fwd", 3, 256, 0.88, size=4096),
        _row("cuda", "tensor_product", "fwd", 3, 256, 0.84),
        {**_row("cuda", "tensor_product", "fwd", 3, 512, 0.0), "error": "OOM"},
    ]
    table1 = [
        _row("pallas_gpu", "convolution", "fwd", 3, 128, 0.60),
        _row("pallas_gpu", "convolution", "bwd", 3, 256, 0.55),
        _row("cuda", "convolution", "fwd", 3, 256, 0.2055),  # 822 GB/s vs 573 * 4800 / 3350 = 821 GB/s
        _row("cuda", "convolution", "fwd", 3, 512, 0.2),  # 800 GB/s vs 562 * 4800 / 3350 = 805 GB/s
    ]
    (tmp_path / "cpu-e3j-bench.json").write_text(json.dumps({**_gpu_result([]), "device": {"platform": "cpu"}}))
    (tmp_path / "nvidia-h200-fig1.json").write_text(json.dumps(_gpu_result(fig1)))
    (tmp_path / "nvidia-h200-table1.json").write_text(json.dumps(_gpu_result(table1)))
    text = tables.render("accelerators")
    assert text.startswith("### NVIDIA H200\n") and "cpu-e3j-bench" not in text
    assert "#### `nvidia-h200-fig1`" in text and "#### `nvidia-h200-table1`" in text
    goal_rows = {line for line in text.splitlines() if line.endswith(("| met |", "| missed |"))}
    assert goal_rows == {
        "| pallas_gpu | tensor_product fwd | 3 | 128+ | 85% | 88.0% (C=256, size 4096, 3520 GB/s) | met |",
        "| pallas_gpu | convolution fwd | 3 | 128+ | 70% | 60.0% (C=128, size 1024, 2400 GB/s) | missed |",
        "| pallas_gpu | convolution bwd | 3 | 128+ | 50% | 55.0% (C=256, size 1024, 2200 GB/s) | met |",
        "| cuda | tensor_product fwd | 3 | 256 | 85% | 84.0% (C=256, size 1024, 3360 GB/s) | missed |",
        "| cuda | convolution fwd | 3 | 256 | paper's e3j (CUDA) x 1.43 = 821 GB/s | 822 GB/s | met |",
        "| cuda | convolution fwd | 3 | 512 | paper's e3j (CUDA) x 1.43 = 805 GB/s | 800 GB/s | missed |",
    }
    # the paper's Table 1 beside it, scaled by 4800 / 3350: Pallas GPU fwd lmax 3 at 128 channels 1818 -> 2605
    assert "| e3j (Pallas GPU) | fwd | 3 | - | 2605 | 2664 | 2972 | 2962 |" in text
