"""The accelerator benchmark script builds valid ``python -m e3j bench`` command lines."""

import argparse
import os
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from e3j import _sweep
from e3j._sweep import add_parser

ROOT = Path(__file__).resolve().parents[2]


def test_paper_sizes_commands_parse(capsys):
    script = runpy.run_path(str(ROOT / "benchmarks/paper_sizes.py"))
    assert script["main"](["--dry-run", "--runs", "7"]) == 0
    commands = [line[2:] for line in capsys.readouterr().out.splitlines() if line.startswith("+ ")]
    assert len(commands) == 3  # one results file per suite: fig1, fig2, table1
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    parsed = {}
    for cmd in commands:
        argv = shlex.split(cmd)
        assert argv[:4] == ["python", "-m", "e3j", "bench"]
        args = parser.parse_args(argv[3:])
        assert args.runs == 7 and args.json.endswith(".json")
        parsed[Path(args.json).stem.split("-")[-1]] = args
    # paper Table 1: N * C = 2^22 at lmax 2 and 2^21 at lmax 3, 45 neighbours, 64-1024 channels
    t1 = parsed["table1"]
    cases = list(_sweep.cases(t1.ops, t1.directions, t1.lmax, t1.channels, t1.sizes, t1.degree, t1.elements))
    assert {(c.lmax, c.channels, c.size * c.channels, c.degree) for c in cases} == {
        (l, c, 2**24 // 2**l, 45) for l in (2, 3) for c in (64, 128, 256, 512, 1024)
    }
    assert {(c.op, c.direction) for c in cases} == {("convolution", "fwd"), ("convolution", "bwd")}
    # paper Fig. 2: lmax 3, 256 channels, 45 neighbours; Fig. 1: tensor product, lmax 2-3, up to 256 channels
    assert (parsed["fig2"].lmax, parsed["fig2"].channels, parsed["fig2"].degree) == ([3], [256], 45)
    assert parsed["fig1"].ops == ["tensor_product"] and max(parsed["fig1"].channels) == 256


def test_paper_sizes_backends_pass_through(capsys):
    # benchmarks/tpu.sh measures only pallas_tpu and the reference
    script = runpy.run_path(str(ROOT / "benchmarks/paper_sizes.py"))
    assert script["main"](["--dry-run", "--suites", "table1", "--backends", "pallas_tpu", "reference"]) == 0
    (cmd,) = [line[2:] for line in capsys.readouterr().out.splitlines() if line.startswith("+ ")]
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(shlex.split(cmd)[3:]).backends == ["pallas_tpu", "reference"]


def test_device_scripts_name_results_by_e3j_device_slug(tmp_path):
    # device.sh and tpu.sh name their results files with _device_common.sh's device_slug (e3j's rule);
    # this machine is a CPU: "cpu", the name of the committed cpu-e2e.json
    env = {**os.environ, "OUT": str(tmp_path), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "packages" / p / "src") for p in ("e3j-core", "e3j-ops")])
    run = subprocess.run(
        ["bash", "-c", 'source benchmarks/_device_common.sh && device_slug && echo "$(device_slug)-e2e.json"'],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["cpu", "cpu-e2e.json"]
    # nothing else under benchmarks/ spells a slug of its own
    for path in [*ROOT.glob("benchmarks/*.sh"), *ROOT.glob("benchmarks/*.py")]:
        assert "device_kind.lower" not in path.read_text(), f"{path.name}: use e3j._bench.device_slug"


def test_device_scripts_pack_new_and_rewritten_results(tmp_path):
    # a device run that reruns a committed benchmark rewrites its results file: pack() must send it
    # back as well as the new files, and nothing the run left untouched
    work = tmp_path / "repo"
    results = work / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "untouched.json").write_text("{}")
    (results / "rerun.json").write_text("{}")
    script = f"""
        source {ROOT / "benchmarks/_device_common.sh"}
        snapshot_results
        echo '{{"new": 1}}' > benchmarks/results/rerun.json
        echo '{{}}' > benchmarks/results/new.json
        pack
        tar tzf "$OUT/results.tgz" | sort
    """
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    run = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["benchmarks/results/new.json", "benchmarks/results/rerun.json"]


NAMES = {"tp_fwd": "tensor_product", "tp_bwd": "tensor_product_bwd", "conv_fwd": "convolution"}
NAMES["conv_bwd"] = "convolution_bwd"


def test_triton_resources_captures_the_ir_of_every_pallas_gpu_kernel():
    # the part of benchmarks/triton_resources.py that needs no Triton: it reaches into Pallas's
    # private lowering, so a JAX upgrade that moves it fails here rather than in `nox -s gpu_compile`
    script = runpy.run_path(str(ROOT / "benchmarks/triton_resources.py"))
    captured = script["capture_triton_ir"](1, 16)
    assert set(captured) == set(script["KERNELS"])
    for name, (text, warps) in captured.items():
        assert f"tt.func public @e3j_{NAMES[name]}(" in text, name
        assert 1 <= warps <= 4


def test_tp_fwd_diag_times_each_backend_three_ways(tmp_path, capsys):
    # benchmarks/device.sh's `diag` step, at a CPU's sizes on the reference backend
    import json

    from e3j._bench import tensor_product_bytes
    from e3j_core import Irreps, tensor_product_coo

    script = runpy.run_path(str(ROOT / "benchmarks/tp_fwd_diag.py"))
    out = tmp_path / "diag.json"
    argv = ["--backends", "reference", "--lmax", "1", "--channels", "4", "--batch", "8", "--copy-bytes", "4096"]
    assert script["main"]([*argv, "--runs", "2", "--stream", "2", "--bwd", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [c["bytes"] for c in result["copy"]] == [4096]
    assert [(r["direction"], r["impl"]) for r in result["rows"]] == [("fwd", "reference"), ("bwd", "reference")]
    irreps = Irreps.spherical_harmonics(1)
    coo = tensor_product_coo(irreps, irreps, filter=irreps)
    for r in result["rows"]:
        want = tensor_product_bytes(coo, 8, 4, y_channels=False, itemsize=4, backward=r["direction"] == "bwd")
        assert r["bytes"] == want
        for k in ("quiet", "stream", "beside_python"):
            assert r[f"{k}_s"] > 0 and r[f"{k}_GBps"] * 1e9 * r[f"{k}_s"] == pytest.approx(want)
    assert "TP bwd reference" in capsys.readouterr().out


def test_triton_resources_counts_ptx_memory_instructions():
    script = runpy.run_path(str(ROOT / "benchmarks/triton_resources.py"))
    ptx = """
    ld.param.u64 %rd1, [param_0];
    @%p1 ld.global.b32 { %r1 }, [ %rd1 + 0 ];
    @!%p2 ld.global.v4.b32 { %r2, %r3, %r4, %r5 }, [ %rd1 + 16 ];
    st.shared.b32 [ %r6 ], %r1;
    bar.sync 0;
    ld.shared.b32 %r7, [ %r6 ];
    st.local.b32 [ %rd3 ], %r7;
    st.global.v2.b32 [ %rd2 + 0 ], { %r7, %r1 };
    st.global.b32 [ %rd2 + 8 ], %r7;
    // ld.global in a comment is not counted
    """
    assert script["ptx_op_counts"](ptx) == {
        "ld.global": 2,
        "st.global": 2,
        "ld.shared": 1,
        "st.shared": 1,
        "ld.local": 0,
        "st.local": 1,
        "bar.sync": 1,
        "vector_global": 2,
    }


def test_tp_fwd_diag_reads_kernel_times_off_the_device_planes():
    from types import SimpleNamespace as NS

    script = runpy.run_path(str(ROOT / "benchmarks/tp_fwd_diag.py"))

    def events(*pairs):
        return [NS(name=name, duration_ns=ns) for name, ns in pairs]

    host = NS(name="/host:CPU", lines=[NS(name="python", events=events(("dispatch", 9e9)))])
    gpu = NS(
        name="/device:GPU:0",
        lines=[
            NS(
                name="Stream #13",
                events=events(("e3j_tensor_product", 4e5), ("e3j_tensor_product", 2e5), ("memset", 1e3)),
            ),
            NS(name="XLA Ops", events=events(("custom-call", 7e5))),
        ],
    )
    got = script["summarize_device_planes"]([host, gpu], top=2)
    assert [(e["line"], e["name"], e["count"]) for e in got] == [
        ("XLA Ops", "custom-call", 1),  # ranked by total time
        ("Stream #13", "e3j_tensor_product", 2),
    ]
    assert [e["mean_s"] for e in got] == pytest.approx([7e-4, 3e-4])
    assert {e["plane"] for e in got} == {"/device:GPU:0"}
    assert script["summarize_device_planes"]([host]) == []


def test_interop_benchmark_paired_share_measures_the_difference():
    # benchmarks/interop_message_passing.py's conversion share from alternating pairs of calls:
    # a call that waits 20 ms against one that waits 10 ms is half made of what the other does not do
    import time

    script = runpy.run_path(str(ROOT / "benchmarks/interop_message_passing.py"))

    def wait(seconds):
        def f(a):
            time.sleep(seconds)
            return a

        return f

    share = script["paired_share"]((wait(0.02), (1.0,)), (wait(0.01), (1.0,)), 20)
    assert set(share) == {"median", "q1", "q3", "a_ms", "b_ms"}
    assert share["q1"] <= share["median"] <= share["q3"]
    assert 0.3 < share["median"] < 0.6, share
    assert 19 < share["a_ms"] < 40 and 9 < share["b_ms"] < 30, share
    same = script["paired_share"]((wait(0.01), (1.0,)), (wait(0.01), (1.0,)), 20)
    assert abs(same["median"]) < 0.2, same


def test_device_e2e_step_takes_other_sections_and_results_file(tmp_path):
    # run_e2e with E3J_E2E_ARGS / E3J_E2E_OUT (a second call measuring what a bounded first one cut):
    # python3 is a stand-in that records how benchmarks/e2e.py was called
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.txt"
    (bin_dir / "python3").write_text(
        f"""#!/usr/bin/env bash
if [ "$1" = benchmarks/e2e.py ]; then shift; echo "$*" >> {log}; exit 0; fi
if [ "$1" = -c ]; then echo fake; fi
exit 0
"""
    )
    (bin_dir / "python3").chmod(0o755)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for name in ("E3J_DEVICE_REHEARSAL", "E3J_E2E_ARGS", "E3J_E2E_OUT", "E3J_E2E_BACKENDS", "E3J_E2E_TIMEOUT"):
        env.pop(name, None)
    script = f"""
        source {ROOT / "benchmarks/_device_common.sh"}
        snapshot_results
        run_e2e
        E3J_E2E_ARGS="--md --models nequip --atoms 1000 --runs 3" E3J_E2E_OUT=benchmarks/results/x-forces.json run_e2e
    """
    run = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    default, chosen = log.read_text().splitlines()
    assert "--md cuni_mace:8 mace_a:8" in default and default.endswith("--out benchmarks/results/fake-e2e.json")
    want = "--md --models nequip --atoms 1000 --runs 3 --backends fake e3nn --out benchmarks/results/x-forces.json"
    assert chosen == want
    # a failing benchmark is the caller's to see (device.sh exits); a timeout keeps what was written
    for code, want_rc in ((3, 3), (124, 0)):
        (bin_dir / "python3").write_text(
            f'#!/usr/bin/env bash\nif [ "$1" = benchmarks/e2e.py ]; then exit {code}; fi\n'
            'if [ "$1" = -c ]; then echo fake; fi\nexit 0\n'
        )
        script = f"source {ROOT / 'benchmarks/_device_common.sh'}; snapshot_results; run_e2e; echo rc=$?"
        run = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert run.stdout.strip().endswith(f"rc={want_rc}"), run.stdout
        assert ("end to end FAILED (exit 3)" in run.stdout) == (code == 3), run.stdout
        assert ("stopped at" in run.stdout) == (code == 124), run.stdout


def test_models_fit_in_the_memory_of_the_device_they_run_on(monkeypatch):
    # on a GPU the model's executable lives in its memory: judged against the host's RAM, sizes a
    # GPU cannot hold were run (and killed) and the estimates of the largest size were the host's
    script = runpy.run_path(str(ROOT / "benchmarks/models_vs_e3nn.py"))
    host = script["device_memory"]()
    assert host[0] == script["host_memory"]() and 0 < host[1] <= host[0]

    class Accelerator:
        def memory_stats(self):
            return {"bytes_limit": 1000, "bytes_in_use": 300}

    monkeypatch.setattr(jax, "devices", lambda *a: [Accelerator()])
    assert script["device_memory"]() == (1000, 700)
    assert script["fits_free_memory"](600) and not script["fits_free_memory"](650)


def test_largest_sizes_come_from_runs_on_the_same_kind_of_device(monkeypatch):
    # e2e.py's "largest" table adds the committed models_vs_e3nn runs: a GPU's table listed the CPU's
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        script = runpy.run_path(str(ROOT / "benchmarks/e2e.py"))
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    sources = {r["largest_run_source"] for r in script["largest"]([])}
    assert sources and all(s.startswith("cpu-models-vs-e3nn") for s in sources), sources
    script["largest"].__globals__["device_slug"] = lambda: "nvidia-h200"  # no committed runs there yet
    assert script["largest"]([]) == []


def test_end_to_end_runs_the_backends_that_load_here():
    # the development environment's plugin declares broken backends for CPU (an incompatible one,
    # one needing another JAX, one failing to load): e2e.py crashed on the first of them
    from e3j._bench import runnable_backends

    assert runnable_backends("cpu") == ["test"]
    assert runnable_backends() == ["test"]


def test_e2e_tables_compare_each_backend_with_the_twin():
    # benchmarks/e2e.py's tables: each row's ratio is the e3nn-jax twin's time over the row's, for the
    # same model and size (several e3j backends on a GPU), whatever order the rows come in
    tables = runpy.run_path(str(ROOT / "benchmarks/e2e_tables.py"))
    machine = {"device": "gpu:0", "cpu": "x", "cpus": 16, "memory_bytes": 2**36, "platform": "p", "jax": "0"}
    machine["note"] = ""

    def md(model, backend, ms, fits=True):
        return {"model": model, "atoms": 2048, "backend": backend, "ms_per_step": ms, "rounds_ms_per_step": [ms],
                "fits_free_memory": fits, "memory_bytes": 2**30}  # fmt: skip

    result = {
        "machine": machine, "date": "2026-12-04", "command": "c", "complete": True, "load_average_start": [1.0],
        "md": [md("a", "cuda", 50.0), md("a", "e3nn", 100.0), md("a", "pallas_gpu", 40.0),
               md("b", "cuda", 10.0), md("b", "e3nn", 0.0, fits=False), md("c", "cuda", 10.0)],
    }  # fmt: skip
    rows = [line.split(" | ") for line in tables["markdown"](result).splitlines() if line.startswith("| a |")]
    assert [(r[2], r[5]) for r in rows] == [("cuda", "2.00×"), ("e3nn-jax twin", "1.00×"), ("pallas_gpu", "2.50×")]
    text = tables["markdown"](result)
    assert "| b | 2048 | cuda | 10 | 10 | twin does not fit |" in text
    assert "| c | 2048 | cuda | 10 | 10 | n/a |" in text


def test_models_benchmarks_record_the_kernel_backend_that_ran(monkeypatch):
    # benchmarks/e2e.py and models_vs_e3nn.py label e3j's rows "e3j" (e3j's own choice): the rows also
    # name the kernel backend, which on a development CPU is the test plugin's, not the reference
    import e3j
    import e3j_models as em

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    script = runpy.run_path(str(ROOT / "benchmarks/models_vs_e3nn.py"))
    cfg = em.nequip((1, 8), num_channels=8)
    which = script["convolution_backend"]
    installed = {b.name for b in e3j.available_backends()}
    expected = "test" if "test" in installed else "reference"
    assert which(cfg, "e3j", "float32") == expected
    assert which(cfg, "reference", "float32") == "reference"
    assert which(cfg, "e3nn", "float32") is None
    with e3j.use_backend("reference"):
        assert which(cfg, "e3j", "float64") == "reference"


def test_models_benchmarks_write_a_command_that_reruns_them(monkeypatch):
    # the results files' "command": switches as argparse takes them (a false one left out, no
    # "--memory_only False"), lists spelled out, e2e.py's --md specs as model:repeats
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    command_line = runpy.run_path(str(ROOT / "benchmarks/models_vs_e3nn.py"))["command_line"]
    args = argparse.Namespace(
        models=["mace_a", "nequip"], atoms=[100], md=[("cuni_mace", 8)], array_radial=True, memory_only=False,
        out="x.json",
    )  # fmt: skip
    assert command_line("benchmarks/e2e.py", args, skip=("out",)) == (
        "python benchmarks/e2e.py --models mace_a nequip --atoms 100 --md cuni_mace:8 --array-radial"
    )
    for script in ("e2e.py", "models_vs_e3nn.py"):
        run = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / script), "--help"], capture_output=True, text=True, cwd=ROOT
        )
        assert run.returncode == 0 and "--array-radial" in run.stdout, run.stderr


def test_grouped_kernel_parts_factored_baseline_computes_the_same(monkeypatch):
    """``benchmarks/grouped_kernel_parts.py --weights factored`` times the reference's factored
    kernels against the same sweeps on split operands: both sides compute the same values, so the
    share is the layout conversions alone."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    script = runpy.run_path(str(ROOT / "benchmarks/grouped_kernel_parts.py"))
    progs = script["factored_programs"](12, hidden=8)
    (f, a), (g, b) = progs["grouped_fwd"], progs["groups_fwd"]
    plan = script["case"](12, 27, "64x0e + 32x1o + 16x2e", 3, "0e + 1o + 2e", jnp.float32)[0].plan
    np.testing.assert_allclose(f(*a), plan.join_out(g(*b)), rtol=1e-5, atol=1e-5)
    (f, a), (g, b) = progs["grouped_bwd"], progs["groups_bwd"]
    got, want = f(*a), g(*b)
    assert set(got) == set(want) == {"x", "y", "h", "k"}
    np.testing.assert_allclose(got["x"], plan.join_x(want["x"]), rtol=1e-5, atol=1e-5)
    for k in ("y", "h", "k"):
        assert float(jnp.abs(want[k]).max()) > 0
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)


def test_grouped_kernel_parts_times_mosaic_on_groups_mosaic_runs(monkeypatch):
    """pallas_mosaic's grouped kernels run groups of at most 64 channels on the Triton kernels, so
    ``grouped_kernel_parts.py --backend pallas_mosaic`` times another case (MOSAIC_IRREPS), whose
    groups (two or more) are all Mosaic's; there too both programs compute the same."""
    from e3j_pallas_gpu.mosaic_convolution import on_triton

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    script = runpy.run_path(str(ROOT / "benchmarks/grouped_kernel_parts.py"))

    def plan(irreps):
        return script["case"](8, 27, irreps, 3, "0e + 1o + 2e", jnp.float32)[0].plan

    assert all(on_triton(g) for g in plan(script["IRREPS"]).groups)
    mosaic = plan(script["MOSAIC_IRREPS"])
    assert len(mosaic.groups) >= 2 and not any(on_triton(g) for g in mosaic.groups)
    progs = script["programs"](8, "reference", script["MOSAIC_IRREPS"])
    (f, a), (g, b) = progs["grouped_fwd"], progs["groups_fwd"]
    np.testing.assert_allclose(f(*a), mosaic.join_out(g(*b)), rtol=1e-5, atol=1e-4)
    # a case whose groups Mosaic's grouped kernels give to Triton would time Triton against Mosaic
    with pytest.raises(SystemExit):
        script["main"](["--backend", "pallas_mosaic", "--irreps", "128x0e + 32x1o", "--pairs", "0"])


def test_radial_factored_benchmark_compares_the_two_routes_of_one_model():
    # benchmarks/radial_factored.py: the factored and array routes of the same potential and
    # parameters give the same energies and forces, the factored one with less XLA temporary memory
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        script = runpy.run_path(str(ROOT / "benchmarks/radial_factored.py"))
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    (row,) = script["measure"]("nequip", 20, 1, False)
    assert row["program"] == "energy_forces" and row["max_rel_diff"] < 1e-5
    assert row["factored_temp_mib"] < row["array_temp_mib"] / 2
    assert row["array_ms"] > 0 and row["factored_ms"] > 0 and row["share_q1"] <= row["share_q3"]


def test_interop_tensor_product_benchmark_writes_rows_that_rerun(tmp_path):
    # benchmarks/interop_tensor_product.py: both libraries' Allegro product agree, each case is a row
    out = tmp_path / "tp.json"
    script = runpy.run_path(str(ROOT / "benchmarks/interop_tensor_product.py"))
    argv = ["--edges", "40", "--channels", "4", "--lmax", "2", "--broadcast", "--runs", "1", "--rounds", "1"]
    assert script["main"]([*argv, "--json", str(out)]) == 0
    import json

    record = json.loads(out.read_text())
    assert record["command"] == "python benchmarks/interop_tensor_product.py " + " ".join([*argv, "--json", str(out)])
    assert [r["input2"].split(",")[1].strip() for r in record["rows"]] == ["4", "1"]
    assert all(r["max_rel_diff"] < 1e-5 and r["e3j_grad"] > 0 and r["e3nn_grad"] > 0 for r in record["rows"])


def test_md_step_pieces_runs_on_the_reference_and_writes_its_timings(tmp_path):
    # it ran on e3j's default choice: a development environment's test plugin, not the CPU path
    out = tmp_path / "pieces.json"
    cmd = [sys.executable, str(ROOT / "benchmarks/md_step_pieces.py"), "--repeats", "1", "--rounds", "1"]
    cmd += ["--only", "step", "convolution_0", "--json", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    import json

    record = json.loads(out.read_text())
    assert record["backend"] == "reference" and record["command"].startswith("python benchmarks/md_step_pieces.py")
    assert set(record["best_ms"]) == {"step", "convolution_0"} and all(t > 0 for t in record["best_ms"].values())
    # one call of each: under load the piece can time above the step (2.9x once, beside a second
    # pytest), so the share is checked as a share, not bounded by the step
    share = record["share_of_step"]["convolution_0"]
    assert share == record["best_ms"]["convolution_0"] / record["best_ms"]["step"] > 0


@pytest.mark.slow
def test_training_padding_pads_less_by_bucket_with_the_same_losses(tmp_path):
    # ~1.5 min on 2 cores (four training compiles): in `nox -s slow`
    out = tmp_path / "padding.json"
    cmd = [sys.executable, str(ROOT / "benchmarks/training_padding.py"), "--structures", "4", "--epochs", "2"]
    cmd += ["--batch-size", "1", "--small", "1", "1", "1", "--large", "2", "2", "2", "--large-every", "2"]
    cmd += ["--shapes", "1", "2", "--channels", "2", "--l-max", "1", "--json", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=900)
    import json

    record = json.loads(out.read_text())
    assert record["backend"] == "reference" and record["command"].startswith("python benchmarks/training_padding.py")
    one, by_bucket = record["rows"]
    assert (one["compiles"], by_bucket["compiles"]) == (1, 2)
    assert 1 <= by_bucket["padded_over_real"]["nodes"] < one["padded_over_real"]["nodes"]
    assert 1 <= by_bucket["padded_over_real"]["edges"] < one["padded_over_real"]["edges"]
    np.testing.assert_allclose(by_bucket["train_loss"], one["train_loss"], rtol=1e-4)
