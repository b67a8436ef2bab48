"""On a TPU: the pallas_tpu backend against the reference, compiled by Mosaic and run on the chip.

Run on a TPU VM by ``benchmarks/tpu.sh`` (or ``pytest -m tpu tests/tpu`` on any machine with a TPU);
without a TPU the module is skipped with that reason. On a CPU, ``tests/pallas_tpu`` runs the same
kernels in Pallas's TPU interpreter and checks that they lower to Mosaic. Mosaic has no float64: the
cases run in float32 against the reference.
"""

import dataclasses

import jax
import numpy as np
import pytest
from kernel_cases import (
    CONV_CASES,
    HIGH_L_CASES,
    TP_CASES,
    Case,
    check_convolution,
    check_deterministic,
    check_gradients_through_primitives,
    check_tensor_product,
    conv_operands,
)

import e3j
from e3j.backends import get_backend, kernels_of

pytestmark = [
    pytest.mark.tpu,
    pytest.mark.skipif(jax.default_backend() != "tpu", reason="needs a TPU (benchmarks/tpu.sh)"),
]

BACKEND = "pallas_tpu"


def _f32(cases):
    return list(dict.fromkeys(dataclasses.replace(c, dtype="float32") for c in cases))


@pytest.mark.parametrize("case", _f32(TP_CASES), ids=str)
def test_tensor_product(case):
    check_tensor_product(kernels_of(get_backend(BACKEND)), case)


@pytest.mark.parametrize("case", _f32(CONV_CASES), ids=str)
def test_convolution(case):
    check_convolution(kernels_of(get_backend(BACKEND)), case)


@pytest.mark.parametrize("case", _f32(HIGH_L_CASES), ids=str)
def test_high_degree_tables(case):
    check_tensor_product(kernels_of(get_backend(BACKEND)), case)
    check_convolution(kernels_of(get_backend(BACKEND)), case)


def test_bitwise_deterministic():
    assert get_backend(BACKEND).deterministic
    check_deterministic(kernels_of(get_backend(BACKEND)), Case(3, 128, 300, False))


def test_gradients_through_primitives():
    check_gradients_through_primitives(BACKEND, Case(2, 64, 50, True), Case(3, 128, 40, False))


def test_tpu_selects_pallas_tpu_without_warning(recwarn):
    coo, graph, x, y, s, _ = conv_operands(Case(2, 128, 30, False))
    conv = e3j.Convolution(coo.irreps_x, coo.irreps_y, coo.irreps_out)
    text = jax.jit(lambda x, y, s: conv(x, y, s, graph)).lower(x, y, s).as_text()
    assert not [w for w in recwarn if "falls back" in str(w.message)]
    assert "tpu_custom_call" in text
    np.testing.assert_allclose(conv(x, y, s, graph), conv(x, y, s, graph, backend="reference"), rtol=1e-4, atol=1e-4)
