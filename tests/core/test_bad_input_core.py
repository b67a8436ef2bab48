"""e3j-core's public functions on bad input: the error names the argument; no silent NaN or truncation."""

from __future__ import annotations

import e3nn_jax as e3nn
import numpy as np
import pytest

import e3j_core
from e3j_core.coo import normalize_filter

COO = e3j_core.tensor_product_coo("0e + 1o", "0e + 1o")

BAD = {
    # id: (call, exception, message fragment naming the argument)
    "as_irreps bad string": (
        lambda: e3j_core.as_irreps("2z", "irreps_in"),
        ValueError,
        r"irreps_in: invalid irrep '2z'",
    ),
    "as_irreps None": (
        lambda: e3j_core.as_irreps(None, "irreps_out"),
        ValueError,
        r"irreps_out must be irreps .*got None",
    ),
    "as_irreps negative pair": (
        lambda: e3j_core.as_irreps([(-1, (0, 1))], "irreps_x"),
        ValueError,
        r"irreps_x: invalid multiplicity",
    ),
    "as_irreps int": (lambda: e3j_core.as_irreps(3, "irreps_y"), ValueError, r"irreps_y: cannot interpret 3 as Irreps"),
    "tensor_product_coo irreps_x None": (
        lambda: e3j_core.tensor_product_coo(None, "0e"),
        ValueError,
        r"irreps_x must be irreps",
    ),
    "normalize_filter named": (
        lambda: normalize_filter("1x", "filter_ir_out"),
        ValueError,
        r"filter_ir_out: cannot interpret '1x'",
    ),
    # Irreps reads a lone degree as even (e3nn-jax's rule): a filter [0, 1] dropped 1o silently
    "normalize_filter degrees": (
        lambda: normalize_filter([0, 1], "filter_ir_out"),
        ValueError,
        r"filter_ir_out: cannot interpret \[0, 1\] as irreps \(a filter names irreps \('1o'\), not degrees",
    ),
    "normalize_filter bad pair": (
        lambda: normalize_filter([(1, (0, 2))], "self_connection"),
        ValueError,
        r"self_connection: .*parity",
    ),
    "select_paths float index": (
        lambda: e3j_core.select_paths(COO, [1.5]),
        ValueError,
        r"order must be a sequence of path indices, got \[1.5\]",
    ),
    "matrix_x None": (lambda: e3j_core.matrix_x(None), ValueError, r"angle must be real numbers \(radians\), got None"),
    "angles_to_matrix beta None": (
        lambda: e3j_core.angles_to_matrix(0.1, None, 0.3),
        ValueError,
        r"beta must be real numbers",
    ),
    "wigner_D_from_angles alpha str": (
        lambda: e3j_core.wigner_D_from_angles(1, "0.1", 0.0, 0.0),
        ValueError,
        r"alpha must be real numbers",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_names_the_argument(case):
    call, exc, match = BAD[case]
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize(
    "form",
    ["1o + 0e", e3nn.Irreps("0e + 1o"), e3j_core.Irreps("0e + 1o"), [(2, (0, 1)), (1, (1, -1))], ["0e", (1, -1)]],
    ids=["str", "e3nn", "e3j", "mul_ir_pairs", "irrep_list"],
)
def test_filter_forms(form):
    """Every irreps form names the same filter (multiplicities and order ignored, as e3nn-jax's filter_ir_out)."""
    assert normalize_filter(form) == (e3j_core.Irrep("0e"), e3j_core.Irrep("1o"))
    coo = e3j_core.tensor_product_coo("0e + 1o", "0e + 1o", form)
    assert coo.irreps_out == e3j_core.tensor_product_coo("0e + 1o", "0e + 1o", "0e + 1o").irreps_out


def test_integer_angles_still_work():
    np.testing.assert_allclose(e3j_core.matrix_x(0), np.eye(3))
    assert e3j_core.select_paths(COO, [np.int64(1), 0]).num_paths == 2


def test_a_filter_given_as_a_generator_of_pairs_is_read_whole():
    """The pairs were read twice (as irreps, then as (mul, irrep) pairs): a generator was empty the
    second time, and the filter kept nothing."""
    assert normalize_filter((m, ir) for m, ir in [(1, "0e"), (2, "1o")]) == normalize_filter("0e + 1o")
