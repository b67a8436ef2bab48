"""Every bad input to TensorProduct and Convolution gives a clear error that names the argument."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import e3j
from e3j import BackendError, Convolution, Graph, TensorProduct

f32, f64 = jnp.float32, jnp.float64

TP = TensorProduct("0e + 1o", "0e + 1o")  # Dx = Dy = 4, Dout = 16
CONV = Convolution("0e + 1o", "0e + 1o", filter="0e + 1o")  # Dx = Dy = 4, 4 paths
GRAPH = Graph.from_edges(np.array([0, 1, 2, 1]), np.array([1, 0, 1, 2]), num_nodes=3)  # N = 3, E = 4
B, C = 3, 8


def ones(*shape, dtype=f64):
    return jnp.ones(shape, dtype)


def test_good_inputs_work():
    """The baseline every case below perturbs."""
    assert TP(ones(B, 4, C), ones(B, 4)).shape == (B, 16, C)
    assert TP(ones(B, 4, C), ones(B, 4, C)).shape == (B, 16, C)
    assert CONV(ones(3, 4, C), ones(4, 4), ones(4, 4, C), GRAPH).shape == (3, CONV.irreps_out.dim, C)
    assert CONV(ones(3, 4, C), ones(4, 4, C), ones(4, 4, C), GRAPH).shape == (3, CONV.irreps_out.dim, C)
    assert TP(ones(B, 4, C, dtype=f32), ones(B, 4, dtype=f32)).dtype == f32


# -- TensorProduct.__call__ -------------------------------------------------------------------------

TP_CASES = [
    # (x, y, exception, message)
    (ones(B, 4), ones(B, 4), ValueError, r"x must have shape \[B, Dx=4, C\], got shape \(3, 4\)"),
    (ones(1, B, 4, C), ones(B, 4), ValueError, r"x must have shape \[B, Dx=4, C\], got shape \(1, 3, 4, 8\)"),
    (ones(B, 4, C), ones(4), ValueError, r"y must have shape \[B, Dy=4\] or \[B, Dy, C\], got shape \(4,\)"),
    (ones(B, 4, C), ones(B, 4, C, 1), ValueError, r"y must have shape \[B, Dy=4\] or \[B, Dy, C\]"),
    (ones(B, 4, C), 1.0, ValueError, r"y must have shape .* got shape \(\)"),
    (ones(B, 5, C), ones(B, 4), ValueError, r"x has 5 rows but irreps_x 1x0e\+1x1o has dimension 4"),
    (ones(B, 4, C), ones(B, 3), ValueError, r"y has 3 rows but irreps_y 1x0e\+1x1o has dimension 4"),
    (ones(B, 4, C), ones(B, 9, C), ValueError, r"y has 9 rows but irreps_y"),
    (ones(B, 4, C), ones(B + 1, 4), ValueError, r"x and y must share the batch size, got 3 and 4"),
    (ones(B, 4, C), ones(B, 4, C + 1), ValueError, r"x has 8 channels but y has 9"),
    (ones(B, 4, C, dtype=f32), ones(B, 4), TypeError, r"one floating dtype, got x: float32, y: float64"),
    (ones(B, 4, C), ones(B, 4, dtype=jnp.bfloat16), TypeError, r"x: float64, y: bfloat16"),
    (ones(B, 4, C, dtype=jnp.int32), ones(B, 4), TypeError, r"x must be a floating-point array, got dtype int32"),
    (ones(B, 4, C), np.ones((B, 4), np.int64), TypeError, r"y must be a floating-point array, got dtype int64"),
    (ones(B, 4, C), ones(B, 4, dtype=bool), TypeError, r"y must be a floating-point array, got dtype bool"),
    (ones(B, 4, C, dtype=jnp.complex64), ones(B, 4), TypeError, r"x must be a floating-point .* complex64"),
    (np.ones((B, 4, C)).tolist(), ones(B, 4), TypeError, r"x must be an array, got list"),
]


@pytest.mark.parametrize(("x", "y", "exc", "match"), TP_CASES)
def test_tensor_product_bad_input(x, y, exc, match):
    with pytest.raises(exc, match=match):
        TP(x, y)


@pytest.mark.parametrize(("x", "y", "exc", "match"), [c for c in TP_CASES if not isinstance(c[0], list)][:12])
def test_tensor_product_bad_input_under_jit(x, y, exc, match):
    with pytest.raises(exc, match=match):
        jax.jit(TP.__call__)(x, y)


def test_tensor_product_unknown_backend():
    with pytest.raises(BackendError, match="unknown e3j backend 'cudnn'"):
        TP(ones(B, 4, C), ones(B, 4), backend="cudnn")
    with pytest.raises(BackendError, match="unknown e3j backend 'cudnn'"), e3j.use_backend("cudnn"):
        pass


# -- Convolution.__call__ ---------------------------------------------------------------------------

N, E, P = 3, 4, CONV.num_paths
GOOD = {"x": ones(N, 4, C), "y": ones(E, 4), "s": ones(E, P, C), "graph": GRAPH}

CONV_CASES = [
    # ({argument: bad value}, exception, message)
    ({"graph": tuple(GRAPH)}, TypeError, r"graph must be an e3j.Graph \(see Graph.from_edges\), got tuple"),
    ({"graph": None}, TypeError, r"graph must be an e3j.Graph .* got NoneType"),
    ({"graph": GRAPH._asdict()}, TypeError, r"graph must be an e3j.Graph .* got dict"),
    ({"x": ones(N, 4)}, ValueError, r"x must have shape \[N, Dx=4, C\], got shape \(3, 4\)"),
    ({"y": ones(E)}, ValueError, r"y must have shape \[E, Dy=4\] or \[E, Dy, C\], got shape \(4,\)"),
    ({"s": ones(E, P)}, ValueError, r"s must have shape \[E, num_paths=4, C\], got shape \(4, 4\)"),
    ({"s": ones(1, E, P, C)}, ValueError, r"s must have shape \[E, num_paths=4, C\]"),
    ({"x": ones(N, 5, C)}, ValueError, r"x must be \[N=3, Dx=4, C\] for irreps_x 1x0e\+1x1o .* got \(3, 5, 8\)"),
    ({"x": ones(N + 2, 4, C)}, ValueError, r"x must be \[N=3, Dx=4, C\] .* got \(5, 4, 8\)"),
    ({"y": ones(E, 3)}, ValueError, r"y must be \[E=4, Dy=4\(, C\)\] for irreps_y 1x0e\+1x1o .* got \(4, 3\)"),
    ({"y": ones(E + 1, 4)}, ValueError, r"y must be \[E=4, Dy=4\(, C\)\] .* got \(5, 4\)"),
    ({"y": ones(E - 1, 4, C)}, ValueError, r"y must be \[E=4, .* got \(3, 4, 8\)"),
    ({"s": ones(E + 1, P, C)}, ValueError, r"s must be \[E=4, num_paths=4, C\], got \(5, 4, 8\)"),
    ({"s": ones(E, P + 1, C)}, ValueError, r"s must be \[E=4, num_paths=4, C\], got \(4, 5, 8\)"),
    ({"s": ones(E, P, C + 1)}, ValueError, r"x has 8 channels but s has 9"),
    ({"y": ones(E, 4, C - 1)}, ValueError, r"x has 8 channels but y has 7"),
    ({"x": ones(N, 4, C, dtype=f32)}, TypeError, r"one floating dtype, got x: float32, y: float64, s: float64"),
    ({"y": ones(E, 4, dtype=f32)}, TypeError, r"x: float64, y: float32, s: float64"),
    ({"s": ones(E, P, C, dtype=f32)}, TypeError, r"x: float64, y: float64, s: float32"),
    ({"x": ones(N, 4, C, dtype=jnp.int32)}, TypeError, r"x must be a floating-point array, got dtype int32"),
    ({"y": np.ones((E, 4), np.int64)}, TypeError, r"y must be a floating-point array, got dtype int64"),
    ({"s": ones(E, P, C, dtype=jnp.uint8)}, TypeError, r"s must be a floating-point array, got dtype uint8"),
    ({"s": np.ones((E, P, C)).tolist()}, TypeError, r"s must be an array, got list"),
]


def call_conv(overrides, jit=False):
    a = {**GOOD, **overrides}
    fn = jax.jit(CONV.__call__) if jit else CONV.__call__
    return fn(a["x"], a["y"], a["s"], a["graph"])


@pytest.mark.parametrize(("overrides", "exc", "match"), CONV_CASES)
def test_convolution_bad_input(overrides, exc, match):
    with pytest.raises(exc, match=match):
        call_conv(overrides)


@pytest.mark.parametrize(("overrides", "exc", "match"), CONV_CASES[3:19])
def test_convolution_bad_input_under_jit(overrides, exc, match):
    with pytest.raises(exc, match=match):
        call_conv(overrides, jit=True)


def test_convolution_graph_of_another_size():
    other = Graph.from_edges(np.array([0, 1]), np.array([1, 0]), num_nodes=2)
    with pytest.raises(ValueError, match=r"x must be \[N=2, Dx=4, C\]"):
        CONV(GOOD["x"], GOOD["y"], GOOD["s"], other)
    with pytest.raises(ValueError, match=r"y must be \[E=2, Dy=4"):
        CONV(ones(2, 4, C), GOOD["y"], GOOD["s"], other)
    with pytest.raises(ValueError, match=r"s must be \[E=2, num_paths=4, C\]"):
        CONV(ones(2, 4, C), ones(2, 4), GOOD["s"], other)


def test_convolution_unknown_backend():
    with pytest.raises(BackendError, match=r"unknown e3j backend 'cudnn'.*installed: reference"):
        CONV(GOOD["x"], GOOD["y"], GOOD["s"], GRAPH, backend="cudnn")


# -- construction ---------------------------------------------------------------------------------


@pytest.mark.parametrize("op", [TensorProduct, Convolution])
@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("0q", "0e"), {}, r"irreps_x: invalid irrep '0q'"),
        (("0e", "1e + 2z"), {}, r"irreps_y: invalid irrep '2z'"),
        (("2x", "0e"), {}, r"irreps_x: invalid irrep"),
        (("-1x0e", "1o"), {}, r"irreps_x: invalid multiplicity '-1'"),
        ((3, "0e"), {}, r"irreps_x: cannot interpret 3 as Irreps"),
        (("0e", "0e", "2e"), {}, r"filter 2e leaves no path in 1x0e ⊗ 1x0e \(outputs this product can have: 0e\)"),
        (("1o", "1o", "1o + 2o"), {}, r"filter .* leaves no path in 1x1o ⊗ 1x1o \(outputs this product can have: "),
        (("0e", "0e", "bogus"), {}, r"filter: cannot interpret 'bogus' as irreps"),
        (("", "0e"), {}, r"the inputs leave no path in \(empty\) ⊗ 1x0e"),
        (("0e", "0e", ""), {}, r"filter \(empty\) leaves no path in 1x0e ⊗ 1x0e"),
        (("0e", "0e"), {"normalization": "unit"}, r"normalization must be one of .*got 'unit'"),
    ],
)
def test_bad_construction(op, args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        op(*args, **kwargs)
