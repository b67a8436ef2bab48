"""On a CUDA GPU: every installed GPU kernel backend against the reference, in the real compiler.

Run on the device machine by ``benchmarks/device.sh`` (or ``pytest -m gpu tests/gpu`` on any
machine with a GPU); the CPU test session deselects the ``gpu`` marker, and without a GPU the module
is skipped with that reason.
"""

import jax
import numpy as np
import pytest
from kernel_cases import (
    CONV_CASES,
    HIGH_L_CASES,
    LAUNCH_CASES,
    ODD_CHANNEL_CASES,
    TP_CASES,
    Case,
    check_convolution,
    check_deterministic,
    check_gradients_through_primitives,
    check_launch_case,
    check_tensor_product,
    conv_operands,
)

import e3j
from e3j.backends import available_backends, get_backend, kernels_of

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a CUDA GPU (benchmarks/device.sh)"),
]

GPU_BACKENDS = [b.name for b in available_backends() if "cuda" in b.platforms and b.name != "reference"]


@pytest.fixture(params=GPU_BACKENDS)
def backend(request):
    return request.param


@pytest.mark.parametrize("case", TP_CASES, ids=str)
def test_tensor_product(backend, case):
    check_tensor_product(kernels_of(get_backend(backend)), case)


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_convolution(backend, case):
    check_convolution(kernels_of(get_backend(backend)), case)


@pytest.mark.parametrize("case", ODD_CHANNEL_CASES, ids=str)
def test_odd_channel_counts(backend, case):
    check_tensor_product(kernels_of(get_backend(backend)), case)
    check_convolution(kernels_of(get_backend(backend)), case)


@pytest.mark.parametrize("case", HIGH_L_CASES, ids=str)
def test_high_degree_tables(backend, case):
    check_tensor_product(kernels_of(get_backend(backend)), case)
    check_convolution(kernels_of(get_backend(backend)), case)


@pytest.mark.parametrize(
    ("name", "case"),
    # the CUDA kernels' launch configurations where shared memory runs short, and the paper's sizes;
    # the Pallas kernels walk the long tables' records (unrolled, they would take minutes to compile)
    [(b, c) for b in GPU_BACKENDS for c in LAUNCH_CASES],
    ids=str,
)
def test_launch_limits(name, case):
    check_launch_case(kernels_of(get_backend(name)), case)


def test_bitwise_deterministic(backend):
    assert get_backend(backend).deterministic  # every GPU backend of ours claims it: hold it to that
    check_deterministic(kernels_of(get_backend(backend)), Case(3, 128, 300, False))


def test_gradients_through_primitives(backend):
    check_gradients_through_primitives(backend, Case(2, 64, 50, True), Case(3, 128, 40, False))


def test_gpu_selects_a_kernel_backend_without_warning(recwarn):
    coo, graph, x, y, s, _ = conv_operands(Case(2, 128, 30, False))
    conv = e3j.Convolution(coo.irreps_x, coo.irreps_y, coo.irreps_out)
    text = jax.jit(lambda x, y, s: conv(x, y, s, graph)).lower(x, y, s).as_text()
    assert not [w for w in recwarn if "falls back" in str(w.message)]
    assert "e3j_convolution" in text or "e3j_cuda" in text
    np.testing.assert_allclose(conv(x, y, s, graph), conv(x, y, s, graph, backend="reference"), rtol=1e-4, atol=1e-4)
