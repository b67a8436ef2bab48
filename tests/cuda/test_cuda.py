"""e3j-cuda: the CUDA kernels on the CPU against the reference, and the FFI plumbing.

Two CPU targets run the conformance cases: ``_host`` runs the per-thread code of the CUDA kernels
(csrc/ops.cuh) in loops, and ``_simt`` runs the CUDA kernels themselves (csrc/ffi_cuda.cu) under
csrc/simt.h's emulation of CUDA's launches, shared memory and barriers, with sm_90's launch limits.
Both use the same packed records, FFI binding and attributes; together they exercise everything but
the GPU's timing. The CUDA target is checked for being built (where nvcc exists), for its registers,
and for lowering.
"""

import functools
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from e3j_cuda import _ffi, kernels
from kernel_cases import (
    CONV_CASES,
    GROUPED,
    GROUPED_PART_ALIGNED,
    HIGH_L_CASES,
    IRREPS,
    LAUNCH_CASES,
    ODD_CHANNEL_CASES,
    TP_CASES,
    Case,
    assert_close,
    check_convolution,
    check_deterministic,
    check_gradients_through_primitives,
    check_grouped_convolution,
    check_grouped_lowering,
    check_launch_case,
    check_padding_rows,
    check_tensor_product,
    hard_graph,
)

import e3j
from e3j.backends import get_backend, kernels_of
from e3j.reference import convolution as ref_conv
from e3j.reference import tensor_product as ref_tp
from e3j_core import tensor_product_coo

HOST = "cuda_host"
SIMT = "cuda_simt"


@pytest.fixture(scope="module", params=[HOST, SIMT])
def host(request):
    """The kernels of each CPU target: the host loops and the emulated CUDA kernels."""
    return kernels_of(get_backend(request.param))


@pytest.mark.parametrize("case", TP_CASES, ids=str)
def test_tensor_product_matches_reference(host, case):
    check_tensor_product(host, case)


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_convolution_matches_reference(host, case):
    check_convolution(host, case)


@pytest.mark.parametrize("case", ODD_CHANNEL_CASES, ids=str)
def test_odd_channel_counts(host, case):
    check_tensor_product(host, case)
    check_convolution(host, case)


@pytest.mark.parametrize("case", HIGH_L_CASES, ids=str)
def test_high_degree_tables(host, case):
    check_tensor_product(host, case)
    check_convolution(host, case)


# the part-aligned plan (~15 s per target) adds paths at columns no vector width divides: slow session
@pytest.mark.parametrize(
    ("op", "dtype"),
    [(GROUPED, "float64"), pytest.param(GROUPED_PART_ALIGNED, "float32", marks=pytest.mark.slow)],
    ids=["groups-of-4-2-1", "part-aligned"],
)
def test_grouped_convolution_matches_reference(host, op, dtype):
    """Mixed multiplicities, one launch per group on e3nn's [E, num_weights] weights in place: each
    path's weights read at its own column (staged rows, or element-wise from global memory), and
    each group's cotangent written into its columns of one buffer aliased from launch to launch,
    padding edges' columns zeroed; every subset of cotangents."""
    check_grouped_convolution(host, dtype, op=op)


@functools.cache
def _int32_case(dtype: str, y_channels: bool):
    """Operands and float64 reference results of the int32-record case (shared by both CPU targets)."""
    coo = tensor_product_coo(IRREPS[3], IRREPS[3])
    rng = np.random.default_rng(5)
    f64 = functools.partial(jnp.asarray, dtype=jnp.float64)
    c, n = 6, 5
    x = rng.normal(size=(n, coo.dim_x, c)).astype(dtype)
    y = rng.normal(size=(n, coo.dim_y, c) if y_channels else (n, coo.dim_y)).astype(dtype)
    dz = rng.normal(size=(n, coo.dim_out, c)).astype(dtype)
    graph = hard_graph(n)
    e = graph.num_edges
    ye = rng.normal(size=(e, coo.dim_y, c) if y_channels else (e, coo.dim_y)).astype(dtype)
    s = rng.normal(size=(e, coo.num_paths, c)).astype(dtype)
    want = {
        "z": ref_tp.tensor_product(coo, f64(x), f64(y), y_channels=y_channels),
        "tp": ref_tp.tensor_product_bwd(coo, f64(x), f64(y), f64(dz), outs=("x", "y"), y_channels=y_channels),
        "m": ref_conv.convolution(coo, f64(x), f64(ye), f64(s), graph, y_channels=y_channels),
        "conv": ref_conv.convolution_bwd(
            coo, f64(x), f64(ye), f64(s), f64(dz), graph, outs=("x", "y", "s"), y_channels=y_channels
        ),
    }
    return coo, graph, (x, y, dz, ye, s), want


# the per-channel y case takes ~1 min per target: slow session (the int32 records run in both)
@pytest.mark.parametrize(
    ("dtype", "y_channels"), [pytest.param("float32", True, marks=pytest.mark.slow), ("float64", False)]
)
def test_int32_records(host, dtype, y_channels):
    """lmax 3 ⊗ lmax 3 unfiltered: 256 output rows, so records carry int32 indices (16/24 bytes)."""
    coo, graph, (x, y, dz, ye, s), want = _int32_case(dtype, y_channels)
    assert coo.table.index_dtype == np.int32
    assert_close(host.tensor_product(coo, x, y, y_channels=y_channels), want["z"], dtype, "z")
    got = host.tensor_product_bwd(coo, x, y, dz, outs=("x", "y"), y_channels=y_channels)
    for o in "xy":
        assert_close(got[o], want["tp"][o], dtype, f"d{o}")
    assert_close(host.convolution(coo, x, ye, s, graph, y_channels=y_channels), want["m"], dtype, "m")
    got = host.convolution_bwd(coo, x, ye, s, dz, graph, outs=("x", "y", "s"), y_channels=y_channels)
    for o in "xys":
        assert_close(got[o], want["conv"][o], dtype, f"conv d{o}")


def test_bitwise_deterministic(host):
    check_deterministic(host, Case(3, 64, 10, False))


_HOST_BITS = """
import pathlib, sys
sys.path.insert(0, {tests!r})
import jax, numpy as np
from kernel_cases import Case, conv_operands, grouped_operands, tp_operands
from e3j.backends import get_backend, kernels_of
k = kernels_of(get_backend("cuda_host"))
out = {{}}
for yc in (False, True):
    coo, graph, x, y, s, dm = conv_operands(Case(2, 16, 300, yc), seed=4)
    out[f"m{{yc}}"] = jax.jit(lambda x, y, s, g: k.convolution(coo, x, y, s, g, y_channels=yc))(x, y, s, graph)
    bwd = jax.jit(lambda *a: k.convolution_bwd(coo, *a, outs=("x", "y", "s"), y_channels=yc))(x, y, s, dm, graph)
    out.update({{f"d{{o}}{{yc}}": v for o, v in bwd.items()}})
    coo, x, y, dz = tp_operands(Case(2, 16, 300, yc), seed=5)
    out[f"z{{yc}}"] = jax.jit(lambda x, y: k.tensor_product(coo, x, y, y_channels=yc))(x, y)
    tbwd = jax.jit(lambda *a: k.tensor_product_bwd(coo, *a, outs=("x", "y"), y_channels=yc))(x, y, dz)
    out.update({{f"t{{o}}{{yc}}": v for o, v in tbwd.items()}})
# mixed multiplicities: one launch per group, each writing its columns of one aliased ds
plan, graph, x, y, s, dm = grouped_operands("float32", seed=6, num_nodes=300)
out["gm"] = jax.jit(lambda *a: k.grouped_convolution(plan, *a))(x, y, s, graph)
gbwd = jax.jit(lambda *a: k.grouped_convolution_bwd(plan, *a, outs=("x", "y", "s")))(x, y, s, dm, graph)
out.update({{f"gd{{o}}": v for o, v in gbwd.items()}})
# the threads of XLA's CPU pool (named XLAEigen) that the handlers were given
names = [p.read_text().strip() for p in pathlib.Path("/proc/self/task").glob("*/comm")]
out["pool_threads"] = np.int64(sum("XLAEigen" in n for n in names))
np.savez({path!r}, **{{n: np.asarray(v) for n, v in out.items()}})
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts XLA's pool threads in /proc (Linux)")
def test_host_results_do_not_depend_on_its_threads(tmp_path):
    """The host target splits its units into blocks over XLA's CPU thread pool (about four per thread):
    with a pool of one thread (one block) and of four, the same bits (each output element has one
    owner, each sum a fixed order). ``PJRT_NPROC`` sets the pool's size in XLA's CPU client, unless
    several host devices are asked for (conftest's ``XLA_FLAGS``, ``JAX_NUM_CPU_DEVICES``): with four,
    the pool had four threads. Each run counts its pool's threads, so the test cannot pass vacuously."""
    runs = {}
    for threads in (1, 4):
        path = tmp_path / f"{threads}.npz"
        script = _HOST_BITS.format(tests=str(Path(__file__).parents[1]), path=str(path))
        env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
        env.update(PJRT_NPROC=str(threads), XLA_FLAGS="")
        subprocess.run([sys.executable, "-c", script], check=True, timeout=600, env=env)
        runs[threads] = dict(np.load(path))
        assert runs[threads].pop("pool_threads") == threads
    assert len(runs[1]) == 18
    for name in runs[1]:
        np.testing.assert_array_equal(runs[1][name], runs[4][name], err_msg=name)


@pytest.mark.parametrize("name", [HOST, SIMT])
def test_gradients_through_primitives(name):
    check_gradients_through_primitives(
        name, Case(2, 16, 5, True, dtype="float64"), Case(2, 16, 6, False, dtype="float64")
    )
    check_gradients_through_primitives(name, Case(1, 32, 5, False), Case(1, 16, 6, True))
    check_gradients_through_primitives(name, HIGH_L_CASES[1], HIGH_L_CASES[0])


def test_descriptors():
    cuda, host_backend = get_backend("cuda"), get_backend(HOST)
    assert cuda.platforms == ("cuda",) and cuda.auto and cuda.deterministic
    assert host_backend.platforms == ("cpu",) and not host_backend.auto
    assert cuda.incompatibility() is None
    req = e3j.backends.OpRequest("convolution", "cpu", "float32", 64, 2)
    assert e3j.backends.select_backend(req, None).name != HOST


# -- build records and compatibility ---------------------------------------------------------


def _check_build_record(module):
    """The module records the FFI API of the headers it was compiled against and that jax's version:
    the same as the running jaxlib's when built against it, else an older minor of the same major
    (a wheel built on the oldest supported jaxlib, run on a newer one)."""
    built, runtime = tuple(module.FFI_API_VERSION), _ffi.runtime_ffi_api_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", module.BUILT_WITH_JAX)
    if module.BUILT_WITH_JAX == jax.__version__:
        assert built == runtime
    else:
        assert built[0] == runtime[0] and built[1] <= runtime[1], (built, runtime)
    _ffi.check_compatible(built, module.BUILT_WITH_JAX, runtime, jax.__version__)


def test_host_module_records_its_build():
    host_module = importlib.import_module("e3j_cuda._host")
    assert host_module.PLATFORM == "cpu"
    _check_build_record(host_module)
    assert set(host_module.handlers()) == {"e3j_tp_fwd", "e3j_tp_bwd", "e3j_conv_fwd", "e3j_conv_bwd"}


def test_simt_module_records_its_build():
    simt_module = importlib.import_module("e3j_cuda._simt")
    assert simt_module.PLATFORM == "cpu" and simt_module.FFI_PREFIX == "e3j_simt"
    _check_build_record(simt_module)
    assert set(simt_module.handlers()) == {f"e3j_simt_{op}" for op in ("tp_fwd", "tp_bwd", "conv_fwd", "conv_bwd")}


# -- the emulation of CUDA's execution model ----------------------------------------------------------


def test_simt_emulation_model(tmp_path):
    """simt.h's launches: every (block, thread) runs once with its coordinates, unwritten shared
    memory reads as 0xff, barriers hold (also when threads have left), shared memory is per block,
    a misaligned float4 load fails the launch, and sm_90's launch limits (threads, grid, shared
    memory and its opt-in) fail as CUDA fails, a failed opt-in also as the last error."""
    import os
    import subprocess
    from pathlib import Path

    here = Path(__file__).resolve().parent
    csrc = here.parents[1] / "packages" / "e3j-cuda" / "csrc"
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    assert cxx, "no C++ compiler found (building e3j-cuda's host targets needs one too)"
    exe = tmp_path / "simt_check"
    subprocess.run([cxx, "-std=c++17", "-O1", "-pthread", f"-I{csrc}", str(here / "simt_check.cc"), "-o", str(exe)],
                   check=True)  # fmt: skip
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    lines = run.stdout.splitlines()
    assert run.returncode == 0 and len(lines) == 15 and all(line.endswith(" ok") for line in lines), run.stdout


def test_simt_backward_writes_what_it_owes_with_nothing_to_launch(tmp_path):
    """The CUDA backward handlers with no channels (a broadcast y's dy [B|E, Dy] is still owed, as
    zeros) or no nodes (every edge padding: dy and ds's path columns zeroed, ds's other columns
    kept) write over outputs prefilled with garbage: they returned before writing them. A failed
    shared-memory opt-in is returned and read, not left for the next call's launch check."""
    import os
    import subprocess
    from pathlib import Path

    here = Path(__file__).resolve().parent
    csrc = here.parents[1] / "packages" / "e3j-cuda" / "csrc"
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    assert cxx, "no C++ compiler found (building e3j-cuda's host targets needs one too)"
    exe = tmp_path / "empty_backward_check"
    subprocess.run([cxx, "-std=c++17", "-O1", "-pthread", "-w", f"-I{csrc}", f"-I{jax.ffi.include_dir()}",
                    str(here / "empty_backward_check.cc"), "-o", str(exe)], check=True)  # fmt: skip
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    lines = run.stdout.splitlines()
    assert run.returncode == 0 and len(lines) == 5 and all(line.endswith(" ok") for line in lines), run.stdout


@pytest.mark.parametrize("case", LAUNCH_CASES, ids=str)
def test_simt_launches_within_limits(case):
    """The CUDA kernels' launch configurations where shared memory runs short (see LAUNCH_CASES)
    stay within sm_90's limits in the emulation, and compute the reference's values."""
    check_launch_case(kernels_of(get_backend(SIMT)), case)


@pytest.mark.parametrize("y_channels", [False, True])
def test_simt_padding_edges_cleared_by_several_blocks(y_channels):
    """Above 512 edge slots the backward launches more blocks that zero the padding edges' dy / ds
    rows, a run each (``clearing_blocks``): here 549 slots, 2 blocks of 39 rows."""
    graph = hard_graph(10, degree=60)
    assert graph.num_edges == 549 and graph.num_edges - graph.num_valid == 78
    check_padding_rows(kernels_of(get_backend(SIMT)), Case(1, 4, 10, y_channels), graph)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="the CUDA target is only built where nvcc exists")
def test_cuda_module_is_built_where_nvcc_exists():
    assert importlib.util.find_spec("e3j_cuda._cuda") is not None, "nvcc is on PATH but _cuda was not built"
    cuda_module = importlib.import_module("e3j_cuda._cuda")
    assert cuda_module.PLATFORM == "CUDA"
    _check_build_record(cuda_module)


def test_info_says_when_the_cuda_kernels_were_not_built():
    """Installed without nvcc, e3j-cuda has no _cuda module: ``e3j info`` listed its cuda backend as
    compatible with nothing to say it cannot load; it now carries a note."""
    code = """
import importlib.util, sys
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "e3j_cuda._cuda" else real(name, *a)
from e3j.__main__ import main
main(["info"])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    block = out.stdout.split("\n  cuda ", 1)[1].split("\n  cuda_host ", 1)[0]
    assert "note:          not built: e3j-cuda was installed without nvcc" in block, block
    # where nvcc built it (this test environment), no such note
    assert get_backend("cuda").notes == ()


def test_compatibility_rules():
    ok = ((0, 4), "0.11.1", (0, 4), "0.11.2")
    _ffi.check_compatible(*ok)  # built on older headers: loads
    with pytest.raises(_ffi.IncompatibleBuild, match=r"FFI API 1\.0 .* provides FFI API 0\.4"):
        _ffi.check_compatible((1, 0), "0.11.1", (0, 4), "0.11.2")
    with pytest.raises(_ffi.IncompatibleBuild, match=r"FFI API 0\.5 .*provides FFI API 0\.4"):
        _ffi.check_compatible((0, 5), "0.12.0", (0, 4), "0.11.2")
    with pytest.raises(
        _ffi.IncompatibleBuild, match=re.escape("compiled against jax 0.12.0, newer than the installed jax 0.11.2")
    ):
        _ffi.check_compatible((0, 4), "0.12.0", (0, 4), "0.11.2")


def test_paths_out_of_output_order_are_refused():
    """The backward splits ds's rows at path boundaries; a table whose paths interleave is refused."""
    import types

    with pytest.raises(ValueError, match="paths are not in output order"):
        kernels._i3(types.SimpleNamespace(i3=[0, 1, 0]))


def test_missing_target_says_how_to_get_it():
    with pytest.raises(ImportError, match="e3j-cuda has no compiled _nowhere target; reinstall it with nvcc on PATH"):
        _ffi.load_target("_nowhere")


def test_incompatible_build_refuses_to_load(monkeypatch):
    module = importlib.import_module("e3j_cuda._host")
    monkeypatch.setattr(_ffi, "runtime_ffi_api_version", lambda: (module.FFI_API_VERSION[0] + 1, 0))
    _ffi.load_target.cache_clear()
    try:
        with pytest.raises(_ffi.IncompatibleBuild, match="rebuild e3j-cuda"):
            _ffi.load_target("_host")
    finally:
        monkeypatch.undo()
        _ffi.load_target.cache_clear()
        _ffi.load_target("_host")


# -- lowering for CUDA ------------------------------------------------------------------------------

CALLS = {"e3j_tp_fwd", "e3j_tp_bwd", "e3j_conv_fwd", "e3j_conv_bwd"}


def _lower_cuda(fn, *args) -> str:
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), args)
    return jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("case", [Case(2, 32, 6, False), Case(3, 64, 6, True, dtype="float64")], ids=str)
def test_kernels_lower_to_ffi_calls_for_cuda(case):
    from kernel_cases import conv_operands, tp_operands

    coo, x, y, dz = tp_operands(case)
    yc = case.y_channels
    text = _lower_cuda(functools.partial(kernels.tensor_product, coo, y_channels=yc), x, y)
    text += _lower_cuda(functools.partial(kernels.tensor_product_bwd, coo, outs=("x", "y"), y_channels=yc), x, y, dz)
    coo, graph, x, y, s, dm = conv_operands(case)
    text += _lower_cuda(lambda x, y, s, g: kernels.convolution(coo, x, y, s, g, y_channels=yc), x, y, s, graph)
    bwd = functools.partial(kernels.convolution_bwd, coo, outs=("x", "y", "s"), y_channels=yc)
    text += _lower_cuda(lambda x, y, s, dm, g: bwd(x, y, s, dm, g), x, y, s, dm, graph)
    assert set(re.findall(r"custom_call @(e3j_\w+)", text)) == CALLS
    assert "index_bytes = 1 : i64" in text


def test_launches_past_cudas_grid_limit_are_refused():
    # one thread block per row or node: the handlers' cast of a count past 2**32 to the grid's
    # unsigned int wrapped and left rows unwritten, silently. Abstract shapes: nothing is allocated
    from kernel_cases import conv_operands, tp_operands

    case = Case(1, 1, 2, False)
    coo, x, y, dz = tp_operands(case)
    big = 2**31
    fwd = functools.partial(kernels.tensor_product, coo, y_channels=False)
    bwd = functools.partial(kernels.tensor_product_bwd, coo, outs=("x",), y_channels=False)
    for fn, args in ((fwd, (x, y)), (bwd, (x, y, dz))):
        shapes = [jax.ShapeDtypeStruct((big, *a.shape[1:]), a.dtype) for a in args]
        with pytest.raises(ValueError, match=r"a tensor product of 2147483648 rows need 2147483648 thread blocks"):
            jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
        fits = [jax.ShapeDtypeStruct((big - 1, *a.shape[1:]), a.dtype) for a in args]
        assert "custom_call @e3j_tp_" in jax.jit(fn).trace(*fits).lower(lowering_platforms=("cuda",)).as_text()
        (b,) = jax.export.symbolic_shape("B")  # a symbolic batch still exports (nothing to compare)
        symbolic = [jax.ShapeDtypeStruct((b, *a.shape[1:]), a.dtype) for a in args]
        checks = [jax.export.DisabledSafetyCheck.custom_call(f"e3j_tp_{kind}") for kind in ("fwd", "bwd")]
        jax.export.export(jax.jit(fn), platforms=("cuda",), disabled_checks=checks)(*symbolic)
    coo, graph, x, y, s, dm = conv_operands(case)
    conv_bwd = functools.partial(kernels.convolution_bwd, coo, outs=("x",), y_channels=False)
    nodes = big - 1000  # the backward's up to 1,024 clearing blocks take it past the limit
    shapes = [jax.ShapeDtypeStruct((nodes, *a.shape[1:]), a.dtype) for a in (x, dm)]
    graph_shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), graph)
    offsets = jax.ShapeDtypeStruct((nodes + 1,), np.int32)
    graph_shapes = graph_shapes._replace(receiver_offsets=offsets, sender_offsets=offsets)
    y_s, s_s = (jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (y, s))
    with pytest.raises(ValueError, match=r"a convolution's backward over 2147482648 nodes \(and its clearing\) need"):
        jax.jit(lambda x, y, s, dm, g: conv_bwd(x, y, s, dm, g)).trace(
            shapes[0], y_s, s_s, shapes[1], graph_shapes
        ).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("factored", [False, True], ids=["array", "factored"])
def test_grouped_convolution_lowers_for_cuda_without_copying_the_weights(factored):
    check_grouped_lowering(_lower_cuda, "cuda", "custom_call @e3j_conv_", factored=factored)


def test_e3j_ops_lower_to_the_cuda_backend():
    """With only e3j-cuda eligible, e3j's primitives lower to its FFI calls on CUDA."""
    case = Case(2, 64, 8, False)
    from kernel_cases import conv_operands

    coo, graph, x, y, s, _ = conv_operands(case)
    conv = e3j.Convolution(coo.irreps_x, coo.irreps_y, coo.irreps_out)

    def loss(x, y, s, g):
        return jnp.sin(conv(x, y, s, g, backend="cuda")).sum()

    text = _lower_cuda(jax.grad(loss, argnums=(0, 1, 2)), x, y, s, graph)
    assert set(re.findall(r"custom_call @(e3j_\w+)", text)) == {"e3j_conv_fwd", "e3j_conv_bwd"}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="compiling the CUDA kernels needs nvcc")
def test_cuda_kernels_fit_in_registers(tmp_path):
    """ptxas's resource report for every kernel instance on sm_90a (H100/H200): no spills to local
    memory, no stack frame, and at most 128 registers per thread, so an SM keeps at least 16 warps
    resident (65,536 registers / (128 x 32)) to hide the memory latency these streaming kernels live on.
    A kernel edit that breaks this shows up here, before any GPU run."""
    import subprocess
    from pathlib import Path

    csrc = Path(__file__).resolve().parents[2] / "packages" / "e3j-cuda" / "csrc"
    cmd = ["nvcc", "-std=c++17", "-arch=sm_90a", "-cubin", "-Xptxas", "-v", "-DE3J_WITH_CUDA=1"]
    cmd += ["-diag-suppress=940,2473", f"-I{csrc}", f"-I{jax.ffi.include_dir()}"]
    cmd += ["-o", str(tmp_path / "k.cubin"), str(csrc / "ffi_cuda.cu")]
    report = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    kernels_ = re.findall(
        r"Compiling entry function '(\w+)' for 'sm_90a'\s+ptxas info\s+: Function properties for \1\s+"
        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads\s+"
        r"ptxas info\s+: Used (\d+) registers",
        report,
    )
    # 5 kernels (TP forward and backward, convolution forward, staged and global convolution backward)
    # x 3 channel vector widths x 4 record types (uint8/int32 indices, f32/f64)
    assert len(kernels_) == 60, report
    for name, stack, stores, loads, registers in kernels_:
        assert (int(stack), int(stores), int(loads)) == (0, 0, 0), name
        assert int(registers) <= 128, (name, registers)
