"""The benchmark machinery: the paper's byte accounting and ``python -m e3j bench``."""

import itertools
import json
import struct

import pytest

import e3j
from e3j import _plot, _sweep
from e3j.__main__ import main
from e3j._bench import convolution_bytes, datasheet_bandwidth, device_slug, tensor_product_bytes, time_call
from e3j._sweep import implementations
from e3j_core import tensor_product_coo


@pytest.fixture(scope="module")
def coo():
    # 0e+1o ⊗ 0e+1o filtered to 0e+1o: outputs 0e, 1o, 1o, 0e -> 2x0e+2x1o, D_out = 8, 4 paths
    c = tensor_product_coo("0e + 1o", "0e + 1o", filter="0e + 1o")
    assert (c.dim_x, c.dim_y, c.dim_out, c.num_paths) == (4, 4, 8, 4)
    return c


@pytest.mark.parametrize(
    ("kind", "slug"),
    [
        ("NVIDIA H200", "nvidia-h200"),  # the committed benchmarks/results/nvidia-h200-* names
        ("TPU v5 lite", "tpu-v5-lite"),  # tpu.sh: tpu-v5-lite-table1.json, tpu-v5-lite-e2e.json
        ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
        ("NVIDIA A100-SXM4-80GB", "nvidia-a100-sxm4-80gb"),
        ("cpu", "cpu"),  # the committed cpu-e2e.json, cpu-scaling-l.json
        (" TPU v6e (8 chips) ", "tpu-v6e-8-chips"),  # runs of other characters: one dash, none at the ends
    ],
)
def test_device_slug(kind, slug):
    assert device_slug(kind) == slug


def test_device_slug_of_this_machine():
    import jax

    if jax.devices()[0].platform != "cpu":
        pytest.skip("checks the CPU's slug; on an accelerator the kinds above are the check")
    assert device_slug() == "cpu"


def test_device_slug_rejects_bad_kinds():
    with pytest.raises(ValueError, match=r"kind must contain a letter or digit.*' - '"):
        device_slug(" - ")
    with pytest.raises(TypeError, match=r"kind must be a str.*int"):
        device_slug(3)


def test_tensor_product_bytes_by_hand(coo):
    # B=10, C=3, float32, y broadcast: x 10*4*3=120, y 10*4=40, z 10*8*3=240 elements
    assert tensor_product_bytes(coo, 10, 3, y_channels=False, itemsize=4, backward=False) == (120 + 40 + 240) * 4
    # backward: x, y, dz, dx, dy
    assert (
        tensor_product_bytes(coo, 10, 3, y_channels=False, itemsize=4, backward=True) == (120 + 40 + 240 + 120 + 40) * 4
    )
    # channel-wise y in float64: y is 10*4*3 = 120
    assert tensor_product_bytes(coo, 10, 3, y_channels=True, itemsize=8, backward=False) == (120 + 120 + 240) * 8


def test_convolution_bytes_by_hand(coo):
    # N=5, E=7, C=2: x 5*4*2=40, y 7*4=28, s 7*4*2=56, m 5*8*2=80
    assert convolution_bytes(coo, 5, 7, 2, y_channels=False, itemsize=4, backward=False) == (40 + 28 + 56 + 80) * 4
    assert (
        convolution_bytes(coo, 5, 7, 2, y_channels=False, itemsize=4, backward=True)
        == (40 + 28 + 56 + 80 + 40 + 28 + 56) * 4
    )


def test_time_call_and_datasheet():
    calls = []
    seconds = time_call(lambda: calls.append(1) or 0, runs=10, warmup=2)
    assert seconds >= 0 and len(calls) == 12
    with pytest.raises(ValueError, match="runs"):
        time_call(lambda: 0, runs=0)
    with pytest.raises(ValueError, match="fastest"):
        time_call(lambda: 0, fastest=0)
    assert datasheet_bandwidth("NVIDIA H200") == 4.8e12
    assert datasheet_bandwidth("cpu") is None


def test_bench_quick_writes_parsable_results(tmp_path, capsys):
    out = tmp_path / "bench.json"
    md = tmp_path / "bench.md"
    code = main(
        [
            "bench", "--quick", "--lmax", "1", "--channels", "8", "--sizes", "32", "--degree", "4",
            "--runs", "3", "--backends", "reference", "e3nn", "--json", str(out), "--markdown", str(md),
            "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    assert result["copy"]["GBps"] > 0 and "fastest 20%" in result["method"]
    rows = result["rows"]
    assert {(r["op"], r["direction"], r["impl"]) for r in rows} == {
        (op, d, impl)
        for op in ("tensor_product", "convolution")
        for d in ("fwd", "bwd")
        for impl in ("reference", "e3nn")
    }
    for r in rows:
        assert "error" not in r, r
        assert r["GBps"] == pytest.approx(r["bytes"] / r["seconds"] / 1e9)
    text = capsys.readouterr().out
    assert "| tensor_product | fwd | 1 | 8 | 32 |" in text
    assert md.read_text().startswith("| op | dir | lmax | C | size | reference GB/s | e3nn GB/s |")
    # --replot renders the same table (and a figure) from the JSON without measuring
    md2, png = tmp_path / "again.md", tmp_path / "again.png"
    assert main(["bench", "--replot", str(out), "--markdown", str(md2), "--plot", str(png)]) == 0
    assert md2.read_text() == md.read_text() and png.read_bytes()[:4] == b"\x89PNG"


def test_a_sweep_cut_short_keeps_its_rows(tmp_path, monkeypatch, capsys):
    class Killed(BaseException):  # as a time limit stops the process: nothing after it runs
        pass

    calls = []

    def timing(fn, *args, runs):
        calls.append(runs)
        if len(calls) == 3:
            raise Killed
        return 1e-3

    monkeypatch.setattr(_sweep, "time_call", timing)
    monkeypatch.setattr(_sweep, "copy_bandwidth", lambda nbytes, runs: (1e-3, 1e9))
    out = tmp_path / "cut.json"
    argv = ["bench", "--ops", "tensor_product", "--lmax", "1", "--channels", "4", "8", "--sizes", "16"]
    argv += ["--backends", "reference", "--runs", "3", "--json", str(out), "--no-progress"]
    with pytest.raises(Killed):
        main(argv)
    partial = json.loads(out.read_text())
    assert partial["partial"] is True and len(partial["rows"]) == 2
    assert [(r["direction"], r["channels"]) for r in partial["rows"]] == [("fwd", 4), ("fwd", 8)]
    assert "stopped after 2 measurements" in _sweep.table(partial)
    assert not list(tmp_path.glob("*.tmp"))
    # an uninterrupted sweep ends with a complete file
    calls[:] = [0, 0, 0]  # past the interruption
    assert main(argv) == 0
    done = json.loads(out.read_text())
    assert "partial" not in done and len(done["rows"]) == 4


def test_table1_keeps_the_best_node_count_per_channel_count():
    def row(impl, c, n, g=None):
        r = {"op": "convolution", "direction": "fwd", "impl": impl, "lmax": 3, "channels": c, "size": n}
        return {**r, "GBps": g} if g is not None else {**r, "error": "OOM"}

    result = {"rows": [row("a", 64, 8, 1.5), row("a", 64, 16, 2.5), row("a", 128, 8, 4.0), row("b", 64, 8)]}
    result["rows"].append({"op": "tensor_product", "direction": "fwd", "impl": "a", "lmax": 3, "channels": 64})
    assert _sweep.table1(result).splitlines() == [
        "| max convolution GB/s | dir | lmax | C=64 | C=128 |",
        "| --- | --- | --- | --- | --- |",
        "| a | fwd | 3 | 2.50 | 4.00 |",
        "| b | fwd | 3 | - | - |",
    ]
    assert _sweep.table1({"rows": result["rows"][-1:]}) == ""


def test_elements_fix_size_times_channels_per_lmax():
    # the paper's Table 1: N * C = 2^22 at lmax 2 and 2^21 at lmax 3
    got = list(_sweep.cases(["convolution"], ["fwd"], [2, 3], [64, 1024], None, 45, [2**22, 2**21]))
    assert [(c.lmax, c.channels, c.size) for c in got] == [
        (2, 64, 65536), (2, 1024, 4096), (3, 64, 32768), (3, 1024, 2048)
    ]  # fmt: skip
    one = list(_sweep.cases(["tensor_product"], ["bwd"], [1, 2], [16], None, 8, [64]))
    assert [(c.lmax, c.size) for c in one] == [(1, 4), (2, 4)]
    with pytest.raises(ValueError, match="one per --lmax"):
        list(_sweep.cases(["convolution"], ["fwd"], [1, 2, 3], [8], None, 4, [64, 32]))
    with pytest.raises(ValueError, match=r"smaller than the channel count\(s\) \[128\]"):
        list(_sweep.cases(["convolution"], ["fwd"], [1], [8, 128], None, 4, [64]))
    with pytest.raises(SystemExit, match="--sizes or --elements"):
        main(["bench", "--sizes", "8", "--elements", "64"])


def test_default_implementations_leave_out_explicit_only_backends():
    names = implementations(include_e3nn=False)
    assert names[0] == "reference"
    explicit_only = {b.name for b in e3j.available_backends() if not b.auto}
    assert explicit_only and not explicit_only & set(names)


def test_plot_writes_a_png_of_every_panel(tmp_path):
    result = {
        "device": {"kind": "cpu"},
        "versions": {"jax": "0.11.2"},
        "copy": {"GBps": 10.0},
        "datasheet_GBps": 20.0,
        "rows": [
            {"op": op, "direction": d, "impl": impl, "lmax": 2, "channels": 32, "size": n, "GBps": g}
            for op in ("tensor_product", "convolution")
            for d in ("fwd", "bwd")
            for impl, g in (("reference", 3.0), ("e3nn", 1.0))
            for n in (256, 512, 1024)
        ]
        + [
            {"op": "convolution", "direction": "fwd", "impl": "x", "lmax": 2, "channels": 32, "size": 8, "error": "OOM"}
        ],
    }
    path = tmp_path / "fig.png"
    _plot.plot(result, str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 4 * height  # four panels side by side
    with pytest.raises(ValueError, match="no successful measurement"):
        _plot.plot({**result, "rows": result["rows"][-1:]}, str(path))


def test_plot_without_matplotlib_stops_before_the_sweep(tmp_path, monkeypatch):
    """Without e3j[bench], --plot is refused before anything is measured (it stopped after the whole
    sweep, losing the figure but not the time)."""
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # any import of it now fails

    def sweep(args):
        raise AssertionError("the sweep ran")

    monkeypatch.setattr(_sweep, "run", sweep)
    with pytest.raises(
        SystemExit, match=r"^e3j bench: --plot: plotting needs matplotlib: pip install 'matplotlib>=3.8'$"
    ):
        main(["bench", "--quick", "--plot", str(tmp_path / "fig.png")])


@pytest.mark.parametrize(
    "names, message",
    [
        (["reference", "e3nn"], r"^e3j bench: --backends e3nn needs e3nn-jax: pip install 'e3nn-jax<0.22,>=0.21'$"),
        (
            ["reference", "nonesuch"],
            r"^e3j bench: --backends nonesuch: not an installed backend \(installed: reference, ",
        ),
    ],
)
def test_backends_that_cannot_run_stop_before_the_sweep(names, message, monkeypatch):
    """--backends e3nn without e3nn-jax was a traceback after the copy baseline; an unknown name an
    error row per case."""
    import sys

    monkeypatch.setitem(sys.modules, "e3nn_jax", None)  # any import of it now fails

    def sweep(args):
        raise AssertionError("the sweep ran")

    monkeypatch.setattr(_sweep, "run", sweep)
    with pytest.raises(SystemExit, match=message):
        main(["bench", "--quick", "--backends", *names])


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--channels", "0"], "--channels must be >= 1, got 0"),
        (["--sizes", "0"], "--sizes must be >= 1, got 0"),
        (["--degree", "0"], "--degree must be >= 1, got 0"),
        (["--runs", "0"], "--runs must be >= 1, got 0"),
        (["--memory-budget", "0"], "--memory-budget must be >= 1, got 0"),
        (["--jobs", "0"], "--jobs must be >= 1, got 0"),
        (["--lmax", "-1"], "--lmax must be >= 0, got -1"),
        (["--json", "{missing}/x.json"], "--json .*: not a writable file or a new file in a writable folder"),
        (["--markdown", "{tmp}"], "--markdown .*: not a writable file or a new file in a writable folder"),
        (
            ["--elements", "4", "--channels", "16"],
            r"--elements: 4 at lmax 1 is smaller than the channel count\(s\) \[16\]",
        ),
    ],
)
def test_bad_arguments_stop_before_the_sweep(tmp_path, monkeypatch, extra, message):
    """A zero count was measured (nothing reaches a kernel) and reported as a throughput; a zero
    --memory-budget became the machine's memory; a bad --json or --markdown path failed after the
    sweep, with a traceback."""

    def sweep(args):
        raise AssertionError("the sweep ran")

    monkeypatch.setattr(_sweep, "run", sweep)
    extra = [a.format(missing=tmp_path / "missing", tmp=tmp_path) for a in extra]
    with pytest.raises(SystemExit, match=message):
        main(["bench", "--quick", *extra])


def test_convolution_memory_and_max_nodes():
    from e3j._sweep import max_nodes, peak_bytes

    budget = 100_000_000
    fits = {}
    for impl in ("reference", "e3nn"):
        fits[impl] = n = max_nodes(impl, 1, 8, 8, budget, start=512)
        assert peak_bytes(impl, 1, 8, n, 8)[0] <= budget
        assert peak_bytes(impl, 1, 8, int(n * 1.07) + 1, 8)[0] > budget
    # the fused reference never holds the messages: it fits more nodes than e3nn-jax's gather/scatter
    assert fits["reference"] > fits["e3nn"]
    peak, io = peak_bytes("reference", 2, 16, 20_000, 16)
    # by hand: 0e+1o+2e ⊗ 0e+1o+2e filtered to 0e+1o+2e has 3x0e+4x1o+4x2e: 11 paths, D_out = 35;
    # the paper's backward count: primals x, y, s, the cotangent dm and the cotangents dx, dy, ds
    assert io == 4 * (2 * (20_000 * 9 * 16 + 320_000 * 9 + 320_000 * 11 * 16) + 20_000 * 35 * 16)
    assert peak < 1.3 * io


def test_precompiled_executables_compute_what_the_jitted_functions_do():
    import jax
    import numpy as np

    keys = [
        (_sweep.Case("tensor_product", "bwd", 1, 8, 16, 4), "reference"),
        (_sweep.Case("convolution", "fwd", 1, 8, 16, 4), "reference"),
        (_sweep.Case("convolution", "bwd", 1, 8, 16, 4), "no_such_backend"),  # fails: left to the measuring loop
    ]
    exes = _sweep.Precompiled(keys, jobs=2)
    for key in keys[:2]:
        fn, args, _ = _sweep.build(*key)
        exe = exes.get(key, None)
        assert exe is not None and exe is not fn
        for got, want in zip(jax.tree.leaves(exe(*args)), jax.tree.leaves(fn(*args)), strict=True):
            np.testing.assert_array_equal(got, want)
    assert exes.get(keys[2], "default") == "default"
    exes.close()
    assert _sweep.Precompiled(keys, jobs=1).get(keys[0], "default") == "default"
    # a sweep with --jobs measures the same rows as without
    argv = ["bench", "--quick", "--ops", "convolution", "--lmax", "1", "--channels", "8", "--sizes", "16"]
    argv += ["--degree", "4", "--runs", "2", "--backends", "reference", "--no-progress"]
    assert main([*argv, "--jobs", "2"]) == 0


def test_no_lowering_runs_while_a_call_is_timed():
    # Lowering a Pallas kernel is seconds of GIL-holding Python; on the H200 a 0.4-ms kernel timed
    # beside it measured ~5.4 ms: the timed thread gets the GIL back one switch interval after the
    # kernel. Timings and lowerings must not overlap.
    import sys
    import threading
    import time
    import types

    intervals, started, measured = [], threading.Event(), threading.Event()

    def lower(key):  # stands in for tracing and lowering a kernel: pure Python
        t0 = time.perf_counter()
        started.set()
        # the first lowering lasts until the calls beside it are measured (a loaded host may not
        # schedule this thread within a call's sleep for a while); the others, 0.1 s
        while time.perf_counter() < t0 + 0.1 or (not measured.is_set() and time.perf_counter() < t0 + 30):
            pass
        intervals.append((t0, time.perf_counter()))
        return types.SimpleNamespace(compile=lambda: key)

    def call():  # a device call: the GIL is released while waiting, as in jax.block_until_ready
        time.sleep(5e-4)

    keys = [(_sweep.Case("tensor_product", "fwd", 1, 8, 16, 4), name) for name in "abc"]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.05)  # the effect, made large: each GIL wait is >= 50 ms
    try:
        exes = _sweep.Precompiled(keys, jobs=2, lower=lower)
        started.wait()
        beside = []  # what the sweep measured before: calls timed while a lowering holds the GIL
        while max(beside, default=0) <= 0.04 and len(beside) < 200:
            beside.append(time_call(call, runs=1, warmup=0))
        beside = max(beside)
        measured.set()
        with exes.timing():
            t0 = time.perf_counter()
            time.sleep(0.1)  # time enough for a waiting lowering to start, were it allowed to
            quiet = time_call(call, runs=10, warmup=0)
            t1 = time.perf_counter()
        assert [exes.get(k, None) for k in keys] == keys
        exes.close()
    finally:
        sys.setswitchinterval(interval)
    assert len(intervals) == 3
    intervals.sort()
    # the timing was announced while the first lowering ran: it waited for that one, the others for it
    assert intervals[0][1] <= t0 and all(start >= t1 for start, _ in intervals[1:]), (intervals, t0, t1)
    # one lowering at a time: they share the GIL anyway, and the first is ready first
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(intervals)), intervals
    assert beside > 0.04 and quiet < 0.01, (beside, quiet)


def test_default_copy_bytes_reach_streaming_bandwidth_on_accelerators():
    import types

    import jax

    from e3j import _bench

    assert _bench.default_copy_bytes(jax.devices("cpu")[0]) == _bench.CPU_COPY_BYTES == 2**26

    def device(limit):
        return types.SimpleNamespace(platform="cuda", memory_stats=lambda: {"bytes_limit": limit} if limit else None)

    assert _bench.default_copy_bytes(device(140 * 2**30)) == 2**30  # H200: 1 GiB read + 1 GiB written
    assert _bench.default_copy_bytes(device(None)) == 2**30
    assert _bench.default_copy_bytes(device(2**32)) == 2**29  # at most an eighth of a small device
    with pytest.raises(ValueError, match="num_bytes"):
        _bench.copy_bandwidth(0)


def test_bench_records_the_copy_size_it_measured(tmp_path, monkeypatch):
    sizes = []
    monkeypatch.setattr(_sweep, "copy_bandwidth", lambda nbytes, runs: sizes.append(nbytes) or (1e-3, 1e9))
    monkeypatch.setattr(_sweep, "time_call", lambda fn, *args, runs: 1e-3)
    out = tmp_path / "copy.json"
    argv = ["bench", "--ops", "tensor_product", "--directions", "fwd", "--lmax", "1", "--channels", "4"]
    argv += ["--sizes", "8", "--backends", "reference", "--runs", "2", "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    assert main([*argv, "--copy-bytes", "4096"]) == 0
    assert sizes == [2**26, 4096]  # the CPU default, then as asked
    assert json.loads(out.read_text())["copy"]["bytes"] == 4096
    with pytest.raises(SystemExit, match="--copy-bytes must be >= 1, got 0"):
        main([*argv, "--copy-bytes", "0"])
