"""e3j-pallas-gpu: the Triton kernels, run by Pallas's interpreter on the CPU and lowered for CUDA.

Values are checked against the reference backend (float64) on the shared conformance cases; the same
kernel configurations are then lowered for ``cuda`` and must emit the Triton custom call.
"""

import functools
import warnings

import jax
import numpy as np
import pytest
from e3j_pallas_gpu import _blocks, _records
from jax.sharding import AbstractDevice, AbstractMesh
from kernel_cases import (
    ALL_OUTS,
    CONV_CASES,
    GROUPED,
    GROUPED_PART_ALIGNED,
    HIGH_L_CASES,
    ODD_CHANNEL_CASES,
    TP_CASES,
    Case,
    check_convolution,
    check_deterministic,
    check_gradients_through_primitives,
    check_grouped_convolution,
    check_grouped_lowering,
    check_padding_rows,
    check_tensor_product,
    conv_operands,
    grouped_operands,
    interpreted_conv_cases,
    tp_operands,
)

import e3j
from e3j.backends import get_backend, kernels_of
from e3j_core import tensor_product_coo

INTERPRET = "pallas_gpu_interpret"
TRITON_CALL = "__gpu$xla.gpu.triton"


@pytest.fixture(scope="module")
def kernels():
    return kernels_of(get_backend(INTERPRET))


@pytest.mark.parametrize("case", TP_CASES, ids=str)
def test_tensor_product_matches_reference(kernels, case):
    check_tensor_product(kernels, case)


# the lmax-3 cases in the slow session (test_odd_channel_counts' 300 channels run several channel
# blocks of a convolution here)
@pytest.mark.parametrize("case", interpreted_conv_cases(CONV_CASES), ids=str)
def test_convolution_matches_reference(kernels, case):
    check_convolution(kernels, case)


# channel blocks of 1 and 2 (float64) and a 300-channel count in blocks of 4 (the interpreter is slow:
# the other odd cases add nothing these do not cover here)
@pytest.mark.parametrize("case", [ODD_CHANNEL_CASES[i] for i in (0, 2, 4)], ids=str)
def test_odd_channel_counts(kernels, case):
    check_tensor_product(kernels, case)
    check_convolution(kernels, case)


# the issue-18 table (320 output rows) takes a minute in the interpreter: slow session
WALKED = [HIGH_L_CASES[0], pytest.param(HIGH_L_CASES[1], marks=pytest.mark.slow)]


@pytest.mark.parametrize("case", WALKED, ids=str)
def test_high_degree_tables_walk_records(kernels, case):
    assert not _records.unrolls(case.coo.table)  # the record walk, not the unrolled program
    check_tensor_product(kernels, case)
    check_convolution(kernels, case)


def test_bitwise_deterministic(kernels):
    check_deterministic(kernels, Case(2, 32, 9, False))
    check_deterministic(kernels, HIGH_L_CASES[0])  # walked records


def test_gradients_through_primitives():
    check_gradients_through_primitives(
        INTERPRET, Case(2, 16, 5, True, dtype="float64"), Case(2, 16, 6, False, dtype="float64")
    )


def test_walked_records_gradients_through_primitives():
    check_gradients_through_primitives(INTERPRET, HIGH_L_CASES[1], HIGH_L_CASES[0])


def test_descriptors():
    gpu, interp = get_backend("pallas_gpu"), get_backend(INTERPRET)
    assert gpu.platforms == ("cuda",) and gpu.auto and gpu.deterministic
    assert interp.platforms == ("cpu",) and not interp.auto
    assert gpu.incompatibility() is None
    # never chosen automatically on the CPU
    req = e3j.backends.OpRequest("convolution", "cpu", "float32", 64, 2)
    assert e3j.backends.select_backend(req, None).name != INTERPRET
    # no degree limit: tables above the unroll limit are walked; the switch is stated in `e3j info`
    # (lowered for a GPU named: without one the Triton lowering cannot tell it, see below)
    with jax.sharding.use_abstract_mesh(_H100):
        for lmax in range(9):
            assert gpu.unsupported(e3j.backends.OpRequest("convolution", "cuda", "float32", 64, lmax)) is None
    assert any(f"<= {_records.UNROLL_RECORDS} COO records" in note for note in gpu.notes)
    sh = [tensor_product_coo(*(["+".join(f"{k}{'eo'[k % 2]}" for k in range(lmax + 1))] * 3)) for lmax in (3, 4)]
    assert _records.unrolls(sh[0].table) and not _records.unrolls(sh[1].table)  # as the note says


def test_info_states_the_unroll_switch_and_no_degree_limit(capsys):
    from e3j.__main__ import main

    main(["info"])
    out = capsys.readouterr().out
    block = out[out.index("  pallas_gpu ") :].split("compatible:")[0]
    assert "limits:        none" in block
    assert f"note:          tables of <= {_records.UNROLL_RECORDS} COO records" in block


# -- lowering for CUDA on this (GPU-less) machine ----------------------------------------------

_H100 = AbstractMesh(
    (1,), ("x",), abstract_device=AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=None, platform="cuda")
)


def _lower_cuda(fn, *args) -> str:
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), args)
    with jax.sharding.use_abstract_mesh(_H100):
        return jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("case", TP_CASES + HIGH_L_CASES, ids=str)
def test_tensor_product_lowers_for_cuda(case):
    kernels = kernels_of(get_backend("pallas_gpu"))
    coo, x, y, dz = tp_operands(case)
    yc = case.y_channels
    assert TRITON_CALL in _lower_cuda(functools.partial(kernels.tensor_product, coo, y_channels=yc), x, y)
    bwd = functools.partial(kernels.tensor_product_bwd, coo, outs=("x", "y"), y_channels=yc)
    assert TRITON_CALL in _lower_cuda(bwd, x, y, dz)


@pytest.mark.parametrize("case", CONV_CASES + HIGH_L_CASES, ids=str)
def test_convolution_lowers_for_cuda(case):
    kernels = kernels_of(get_backend("pallas_gpu"))
    coo, graph, x, y, s, dm = conv_operands(case)
    yc = case.y_channels
    text = _lower_cuda(lambda x, y, s, g: kernels.convolution(coo, x, y, s, g, y_channels=yc), x, y, s, graph)
    assert TRITON_CALL in text
    for outs in (("x", "y", "s"), ("x",), ("y", "s")):
        fn = functools.partial(kernels.convolution_bwd, coo, outs=outs, y_channels=yc)
        assert TRITON_CALL in _lower_cuda(lambda x, y, s, dm, g, fn=fn: fn(x, y, s, dm, g), x, y, s, dm, graph)


@pytest.mark.parametrize("factored", [False, True], ids=["array", "factored"])
def test_e3j_ops_select_pallas_gpu_when_lowered_for_cuda(factored):
    """Without any request, e3j's primitives lower to these kernels on CUDA (forward and backward);
    edge scalars given as ``FactoredWeights`` are multiplied out once before the call (no factored
    kernels here: the array's route) and take the same two launches."""
    case = Case(2, 64, 8, False)
    coo, graph, x, y, s, _ = conv_operands(case)
    conv = e3j.Convolution(coo.irreps_x, coo.irreps_y, coo.irreps_out)
    if factored:
        s = (s[:, 0, :3], s.reshape(s.shape[0], -1)[:3])  # hidden [E, 3], kernel [3, P * C]

    def loss(x, y, s, g):
        return jax.numpy.sin(conv(x, y, e3j.FactoredWeights(*s) if factored else s, g)).sum()

    text = _lower_cuda(jax.grad(loss, argnums=(0, 1, 2)), x, y, s, graph)
    assert text.count(TRITON_CALL) == 2  # the forward and one fused backward
    assert 'name = "e3j_convolution"' in text and 'name = "e3j_convolution_bwd"' in text
    if factored:  # no factored kernels here: the scalars multiplied out once, before the call
        width = coo.num_paths * case.channels
        products = [line for line in text.splitlines() if "dot_general" in line]
        assert sum(f"-> tensor<{graph.num_edges}x{width}xf32>" in line for line in products) == 1, products
        assert f"tensor<{graph.num_edges}x{coo.num_paths}x{case.channels}xf32>" in text


def test_lowering_for_cuda_without_naming_the_gpu():
    """Pallas's Triton lowering cannot tell the GPU without a CUDA device or an abstract mesh naming
    one, and failed inside JAX ("No supported GPU devices found"), an automatic choice included
    (docs/usage.md's multi-platform export): asked for by name, the backend now refuses with e3j's
    error saying how to name the GPU; chosen automatically, it is skipped."""
    if jax.devices()[0].platform == "gpu":
        pytest.skip("a CUDA device is there: the lowering knows its GPU")
    case = Case(1, 8, 4, False)
    coo, graph, x, y, s, _ = conv_operands(case)
    conv = e3j.Convolution(coo.irreps_x, coo.irreps_y, coo.irreps_out)

    def lower(backend):
        fn = jax.jit(lambda x, y, s: conv(x, y, s, graph, backend=backend))
        return fn.trace(x, y, s).lower(lowering_platforms=("cuda",)).as_text()

    with pytest.raises(
        e3j.BackendError, match=r"'pallas_gpu' cannot run convolution on cuda: no CUDA device.*use_abstract_mesh"
    ):
        lower("pallas_gpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a fallback to the reference, if that is next
        assert TRITON_CALL not in lower(None)
    with jax.sharding.use_abstract_mesh(_H100):
        assert TRITON_CALL in lower("pallas_gpu")


# -- mixed multiplicities: the grouped kernels (e3nn's weights read in place) --------------------


@pytest.mark.parametrize("walk", [False, True], ids=["unrolled", "walked"])
def test_grouped_kernels_match_the_reference(kernels, monkeypatch, walk):
    """One launch per group reading e3nn's weight columns in place; the weights' cotangent is one
    buffer every group writes its columns of (a column no group wrote would not match)."""
    if walk:
        monkeypatch.setattr(_records, "UNROLL_RECORDS", 0)
    assert all(_records.unrolls(g.coo.table) != walk for g in GROUPED.plan.groups)
    # walked: the cotangents all together and ds alone (a fresh buffer); the subsets that leave
    # operands out are the uniform kernels' code, tested on their own
    check_grouped_convolution(kernels, "float64", (("x", "y", "s"), ("s",)) if walk else ALL_OUTS)


@pytest.mark.parametrize("factored", [False, True], ids=["array", "factored"])
def test_grouped_convolution_lowers_for_cuda_without_copying_the_weights(factored):
    # aliased from launch to launch: the weights' cotangent (backward) and e3nn's output (forward)
    aliases = 2 * (len(GROUPED.plan.groups) - 1)
    check_grouped_lowering(_lower_cuda, "pallas_gpu", TRITON_CALL, aliases=aliases, factored=factored)


@pytest.mark.parametrize("op", [GROUPED, GROUPED_PART_ALIGNED], ids=["mixed", "part-aligned"])
def test_grouped_forward_writes_e3nn_output_in_place(op):
    """Each group's launch stores its output blocks where e3nn's ``[N, Dout_flat]`` has them, into one
    buffer aliased from launch to launch: the lowered forward moves no output after the launches
    (no concatenate into e3nn's output, no ``[N, Dout_g, C_g]`` output to transpose)."""
    plan, graph, x, y, s, _ = grouped_operands("float32", op=op)
    kernels = kernels_of(get_backend("pallas_gpu"))
    text = _lower_cuda(lambda x, y, s, g: kernels.grouped_convolution(plan, x, y, s, g), x, y, s, graph)
    n, groups = x.shape[0], plan.groups
    assert text.count(TRITON_CALL) == len(groups)
    assert text.count("output_operand_aliases") == len(groups) - 1
    out = f"tensor<{n}x{plan.irreps_out.dim}xf32>"
    assert not [line for line in text.splitlines() if "concatenate" in line and out in line]
    for g in groups:  # no launch returns the group's own layout
        assert f"tensor<{n}x{g.coo.dim_out}x{g.channels}xf32>" not in text


@pytest.mark.parametrize("op", [GROUPED, GROUPED_PART_ALIGNED], ids=["mixed", "part-aligned"])
def test_grouped_gradient_reads_and_writes_e3nn_layouts_in_place(op):
    """Value and gradient: every launch reads ``x`` and the output cotangent where e3nn's flat layouts
    have them and writes ``dx`` there (strided loads and stores), so no group's ``[N, Dx_g, C_g]``
    features or ``[N, Dout_g, C_g]`` output, or their cotangents, exist in the program."""
    plan, graph, x, y, s, _ = grouped_operands("float32", op=op)

    def loss(x, y, s, g):
        return jax.numpy.sum(jax.numpy.sin(op(x, y, s, g, backend="pallas_gpu")))

    if plan.constant_row:
        y = y[:, 1:]  # the op prepends the self connection's constant column itself
    text = _lower_cuda(jax.grad(loss, argnums=(0, 1, 2)), x, y, s, graph)
    assert text.count(TRITON_CALL) == 2 * len(plan.groups)
    n = x.shape[0]
    for g in plan.groups:
        for dim in (g.coo.dim_x, g.coo.dim_out):
            assert f"tensor<{n}x{dim}x{g.channels}xf32>" not in text, (g.irreps_x, dim)


def test_grouped_in_place_over_channel_blocks(kernels, monkeypatch):
    """The in-place loads and stores of a group run in several channel blocks (programs) read and land
    each block's channels at their own columns (``column + c · dim``)."""
    monkeypatch.setattr(_blocks, "MAX_CHANNEL_BLOCK", 8)  # 24 channels: 3 programs, 40: 5
    op = e3j.MulIrConvolution("24x0e + 8x1o + 40x2e", "0e + 1o", "0e + 1o + 2e")
    check_grouped_convolution(kernels, "float64", ALL_OUTS, op=op)


# hard_graph(5): 20 edge slots, 3 of them padding: 4 programs clear a row each but the last (5 slots
# per program), or 2 programs 2 rows and 1 (10 slots)
@pytest.mark.parametrize("slots", [5, 10])
def test_padding_edges_cleared_by_several_programs(kernels, monkeypatch, slots):
    monkeypatch.setattr(_blocks, "EDGES_PER_CLEARING_PROGRAM", slots)
    case = Case(1, 16, 5, False)
    assert _blocks.clearing_programs(conv_operands(case)[1].num_edges) == 20 // slots
    check_padding_rows(kernels, case)
