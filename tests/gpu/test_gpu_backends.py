"""On a CUDA GPU: every installed GPU kernel backend against the reference, in the real compiler.

Run on the device machine by ``benchmarks/device.sh`` (or ``pytest -m gpu tests/gpu`` on any
machine with a GPU); the CPU test session deselects the ``gpu`` marker, and without a GPU the module
is skipped with that reason.
"""

import re

import jax
import numpy as np
import pytest
from kernel_cases import (
    CONV_CASES,
    GROUPED,
    GROUPED_ALIGNED,
    GROUPED_HYBRID,
    GROUPED_MOSAIC_FIRST,
    GROUPED_PART_ALIGNED,
    HIGH_L_CASES,
    LAUNCH_CASES,
    ODD_CHANNEL_CASES,
    TP_CASES,
    Case,
    check_convolution,
    check_deterministic,
    check_gradients_through_primitives,
    check_grouped_convolution,
    check_launch_case,
    check_tensor_product,
    conv_operands,
)

import e3j
from e3j.backends import OpRequest, available_backends, get_backend, kernels_of, select_backend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a CUDA GPU (benchmarks/device.sh)"),
]

GPU_BACKENDS = [b.name for b in available_backends() if "cuda" in b.platforms and b.name != "reference"]


#: How each GPU backend's convolution forward shows in a lowered module: its kernel's custom call.
KERNEL_CALLS = {
    "pallas_mosaic": r"custom_call @mosaic_gpu_v2\(.*e3j_mosaic_convolution",  # the name is in the serialized module
    "pallas_gpu": r'custom_call @__gpu\$xla\.gpu\.triton\(.*name = "e3j_convolution"',
    "cuda": r"custom_call @e3j_conv_fwd\(",  # e3j-cuda's FFI target
}


@pytest.fixture(params=GPU_BACKENDS)
def backend(request):
    return request.param


def _refuses_dtype(name: str, coo, channels: int, y_channels: bool, dtype: str) -> None:
    """Each kernel of backend ``name``, whose descriptor does not declare ``dtype``, refuses it with a
    ``TypeError`` naming the kernel, the dtypes it supports and the one it got (on two rows, one edge each way)."""
    declared = get_backend(name).dtypes
    assert dtype not in declared
    kernels = kernels_of(get_backend(name))
    rng = np.random.default_rng(0)

    def rand(*shape):
        return rng.normal(size=shape).astype(dtype)

    graph = e3j.Graph.from_edges(np.array([0, 1]), np.array([1, 0]), 2)
    x, dz = rand(2, coo.dim_x, channels), rand(2, coo.dim_out, channels)
    y = rand(2, coo.dim_y, channels) if y_channels else rand(2, coo.dim_y)
    s = rand(2, coo.num_paths, channels)
    calls = {
        "tensor_product": lambda: kernels.tensor_product(coo, x, y, y_channels=y_channels),
        "tensor_product_bwd": lambda: kernels.tensor_product_bwd(coo, x, y, dz, outs=("x", "y"), y_channels=y_channels),
        "convolution": lambda: kernels.convolution(coo, x, y, s, graph, y_channels=y_channels),
        "convolution_bwd": lambda: kernels.convolution_bwd(
            coo, x, y, s, dz, graph, outs=("x", "y", "s"), y_channels=y_channels
        ),
    }
    for op, call in calls.items():
        with pytest.raises(TypeError, match=rf"^{op}: .*support {re.escape(', '.join(declared))}, got {dtype}\b"):
            call()


def _check_or_refused(name: str, case: Case, *checks) -> None:
    """``checks`` on ``case`` where backend ``name`` declares its dtype; else its kernels must refuse it."""
    if case.dtype in get_backend(name).dtypes:
        for check in checks:
            check(kernels_of(get_backend(name)), case)
    else:
        _refuses_dtype(name, case.coo, case.channels, case.y_channels, case.dtype)


@pytest.mark.parametrize("case", TP_CASES, ids=str)
def test_tensor_product(backend, case):
    _check_or_refused(backend, case, check_tensor_product)


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_convolution(backend, case):
    _check_or_refused(backend, case, check_convolution)


@pytest.mark.parametrize("case", ODD_CHANNEL_CASES, ids=str)
def test_odd_channel_counts(backend, case):
    _check_or_refused(backend, case, check_tensor_product, check_convolution)


@pytest.mark.parametrize("case", HIGH_L_CASES, ids=str)
def test_high_degree_tables(backend, case):
    # the backend's kernels themselves, whatever its max_l (pallas_mosaic's 3 sends such tables to
    # pallas_gpu only when e3j selects the backend)
    _check_or_refused(backend, case, check_tensor_product, check_convolution)


@pytest.mark.parametrize(
    ("name", "case"),
    # the CUDA kernels' launch configurations where shared memory runs short, and the paper's sizes;
    # the Pallas kernels walk the long tables' records (unrolled, they would take minutes to compile)
    [(b, c) for b in GPU_BACKENDS for c in LAUNCH_CASES],
    ids=str,
)
def test_launch_limits(name, case):
    if case.dtype in get_backend(name).dtypes:
        check_launch_case(kernels_of(get_backend(name)), case)
    else:
        _refuses_dtype(name, case.coo, case.channels, case.y_channels, case.dtype)


@pytest.mark.parametrize(
    "op",
    [GROUPED, GROUPED_ALIGNED, GROUPED_PART_ALIGNED, GROUPED_HYBRID, GROUPED_MOSAIC_FIRST],
    ids=["mixed", "aligned", "part-aligned", "triton-then-mosaic", "mosaic-then-triton"],
)
def test_grouped_convolution(backend, op):
    # mixed multiplicities on e3nn's flat operands and [E, num_weights] weights read in place (issue
    # 14), each dtype the backend declares; Mosaic GPU's grouped kernels give groups of <= 64
    # channels to the Triton kernels (the first three, whole), and read a 128-channel group's
    # weights through TMA in place beside such a group, after it or before it (the last two)
    for dtype in get_backend(backend).dtypes:
        check_grouped_convolution(kernels_of(get_backend(backend)), dtype, op=op)


def test_bitwise_deterministic(backend):
    assert get_backend(backend).deterministic  # every GPU backend of ours claims it: hold it to that
    check_deterministic(kernels_of(get_backend(backend)), Case(3, 128, 300, False))


def test_gradients_through_primitives(backend):
    check_gradients_through_primitives(backend, Case(2, 64, 50, True), Case(3, 128, 40, False))


def test_gpu_selects_a_kernel_backend_without_warning(recwarn):
    """e3j picks a kernel backend on this GPU (pallas_mosaic on Hopper, else pallas_gpu or cuda) and the
    lowered convolution calls that backend's kernel."""
    case = Case(2, 128, 30, False)
    coo, graph, x, y, s, _ = conv_operands(case)
    conv = e3j.Convolution(coo.irreps_x, coo.irreps_y, coo.irreps_out)
    chosen = select_backend(OpRequest("convolution", "cuda", case.dtype, case.channels, case.lmax), None).name
    text = jax.jit(lambda x, y, s: conv(x, y, s, graph)).lower(x, y, s).as_text()
    assert not [w for w in recwarn if "falls back" in str(w.message)]
    assert chosen in KERNEL_CALLS, f"e3j chose {chosen!r}, not one of the GPU kernel backends {sorted(KERNEL_CALLS)}"
    assert re.search(KERNEL_CALLS[chosen], text), f"the lowered convolution does not call {chosen}'s kernel"
    np.testing.assert_allclose(conv(x, y, s, graph), conv(x, y, s, graph, backend="reference"), rtol=1e-4, atol=1e-4)
