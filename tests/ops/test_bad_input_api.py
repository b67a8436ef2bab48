"""The rest of e3j's public API (layout, Linear, spherical harmonics, MulIr ops, interop, flax) on bad input.

Each bad call raises a named exception whose message names the argument; every irreps argument takes
every form e3nn-jax takes (a string, e3j's or e3nn-jax's ``Irreps``, ``(mul, (l, p))`` pairs, a list
of irreps) with equal results. ``tests/ops/test_bad_input.py`` covers TensorProduct and Convolution.
"""

from __future__ import annotations

import e3nn_jax as e3nn
import jax.numpy as jnp
import numpy as np
import pytest
from bad_input import FORMS, KEY, f64, ones, rand

import e3j
import e3j.flax as e3j_flax
from e3j import interop

FORM_IDS = list(FORMS)


# -- every irreps form gives the same result ------------------------------------------------------


def _mul_ir_conv(v):
    conv = e3j.MulIrConvolution("2x0e + 1o", v, filter=v, self_connection=v)
    graph = e3j.Graph.from_edges(np.array([0, 1, 2]), np.array([1, 2, 0]), num_nodes=3)
    return conv(rand(3, 5), rand(3, 4, seed=1), rand(3, conv.num_weights, seed=2), graph)


def _flax_linear(v):
    lin = e3j_flax.Linear(v, channels_out=3, irreps_in=v)
    return lin.apply(lin.init(KEY, rand(5, 4, 2)), rand(5, 4, 2))


FORM_CALLS = {
    "TensorProduct": lambda v: e3j.TensorProduct(v, v, filter=v)(rand(3, 4, 2), rand(3, 4, seed=1)),
    "Convolution.irreps_out": lambda v: jnp.asarray(e3j.Convolution(v, v, filter=v).irreps_out.ls),
    "MulIrTensorProduct": lambda v: e3j.MulIrTensorProduct(v, v, v)(rand(3, 4), rand(3, 4, seed=1)),
    "MulIrConvolution": _mul_ir_conv,
    "Linear": lambda v: e3j.Linear(v, v, channels_in=2, channels_out=3)(
        e3j.Linear("0e + 1o", "0e + 1o", channels_in=2, channels_out=3).init(KEY, f64), rand(5, 4, 2)
    ),
    "to_mul_ir": lambda v: e3j.to_mul_ir(rand(2, 4, 3), v),
    "from_mul_ir": lambda v: e3j.from_mul_ir(rand(2, 12), v, 3),
    "mul_ir_irreps": lambda v: jnp.asarray(e3j.mul_ir_irreps(v, 3).ls),
    "irrep_blocks": lambda v: jnp.concatenate([b.reshape(2, -1) for b in e3j.irrep_blocks(rand(2, 4, 3), v)], 1),
    "spherical_harmonics": lambda v: e3j.spherical_harmonics(v, rand(5, 3), True),
    "interop.tensor_product": lambda v: (
        interop.tensor_product(
            e3nn.IrrepsArray("2x0e + 1o", rand(3, 5)), e3nn.IrrepsArray("0e + 1o", rand(3, 4, seed=1)), filter_ir_out=v
        ).array
    ),
    "interop.MessagePassing": lambda v: jnp.asarray(interop.MessagePassing(v, v, v, self_connection=v).num_weights),
    "interop.spherical_harmonics": lambda v: interop.spherical_harmonics(v, rand(5, 3), True).array,
    "interop.to_irreps_array": lambda v: interop.to_irreps_array(rand(2, 4, 3), v).array,
    "flax.Linear": _flax_linear,
}


@pytest.mark.parametrize("call", list(FORM_CALLS))
def test_every_irreps_form_gives_the_same_result(call):
    results = {form: FORM_CALLS[call](value) for form, value in FORMS.items()}
    reference = results.pop("str")
    for form, result in results.items():
        np.testing.assert_array_equal(result, reference, err_msg=f"{call} with irreps given as {form}")


def test_filter_forms_against_e3nn():
    """A filter of (mul, irrep) pairs keeps the irreps e3nn-jax's filter_ir_out keeps."""
    x = e3nn.IrrepsArray("2x0e + 1o", rand(3, 5))
    y = e3nn.IrrepsArray("0e + 1o", rand(3, 4, seed=1))
    want = e3nn.tensor_product(x, y, filter_ir_out="0e + 1o")
    got = interop.tensor_product(x, y, filter_ir_out=[(3, (0, 1)), (1, (1, -1))])
    assert got.irreps == want.irreps
    np.testing.assert_allclose(got.array, want.array, rtol=1e-12)


# -- bad input: exception type and a message naming the argument ----------------------------------

X3 = e3nn.IrrepsArray("2x0e + 1o", ones(3, 5))
Y3 = e3nn.IrrepsArray("0e + 1o", ones(3, 4))
LIN = e3j.Linear("0e + 1o", "0e + 1o", channels_in=2, channels_out=3)
LIN_PARAMS = LIN.init(KEY, f64)
MP = interop.MessagePassing("2x0e + 1o", "0e + 1o", "0e + 1o")
SENDERS, RECEIVERS = jnp.array([0, 1, 2]), jnp.array([1, 2, 0])


_MUL_CONV = e3j.MulIrConvolution("2x0e + 1o", "0e + 1o", filter="0e + 1o")


def _mul_ir_factored(bias):
    w = e3j.FactoredWeights(ones(3, 4), ones(4, _MUL_CONV.num_weights), bias)
    return _MUL_CONV(ones(3, 5), ones(3, 4), w, e3j.Graph.from_edges(SENDERS, RECEIVERS, 3))


def _mlp(x, **kw):
    return e3j_flax.MultiLayerPerceptron(**kw).init_with_output(KEY, x)[0]


def _flax_lin(x=None, *, index=None, **kw):
    x = ones(5, 4, 2) if x is None else x
    lin = e3j_flax.Linear(**{"irreps_out": "0e", "channels_out": 3, "irreps_in": "0e + 1o", **kw})
    args = (x,) if index is None else (index, x)
    return lin.init_with_output(KEY, *args)[0]


BAD = {
    # id: (call, exception, message fragment naming the argument)
    # irreps arguments
    "Linear irreps_in": (
        lambda: e3j.Linear("2z", "0e", channels_in=1, channels_out=1),
        ValueError,
        r"irreps_in: invalid irrep '2z'",
    ),
    "Linear irreps_out": (
        lambda: e3j.Linear("0e", "1x", channels_in=1, channels_out=1),
        ValueError,
        r"irreps_out: invalid irrep ''",
    ),
    "Linear irreps None": (
        lambda: e3j.Linear(None, "0e", channels_in=1, channels_out=1),
        ValueError,
        r"irreps_in must be irreps .* got None",
    ),
    "MulIrTensorProduct irreps_x None": (
        lambda: e3j.MulIrTensorProduct(None, "0e"),
        ValueError,
        r"irreps_x must be irreps",
    ),
    "TensorProduct irreps_y None": (lambda: e3j.TensorProduct("0e", None), ValueError, r"irreps_y must be irreps"),
    "MulIrConvolution self_connection": (
        lambda: e3j.MulIrConvolution("0e", "0e", self_connection="2z"),
        ValueError,
        r"self_connection: cannot interpret '2z'",
    ),
    "MulIrConvolution self_connection pairs": (
        lambda: e3j.MulIrConvolution("0e", "0e", self_connection=[(1, (0, 2))]),
        ValueError,
        r"self_connection: .*parity p must be 1 or -1",
    ),
    "to_mul_ir irreps": (
        lambda: e3j.to_mul_ir(ones(2, 1, 3), "-1x0e"),
        ValueError,
        r"irreps: invalid multiplicity '-1'",
    ),
    "from_mul_ir irreps": (
        lambda: e3j.from_mul_ir(ones(2, 3), "x0e", 3),
        ValueError,
        r"irreps: invalid multiplicity ''",
    ),
    "mul_ir_irreps irreps": (lambda: e3j.mul_ir_irreps([(1, (0, 2))], 3), ValueError, r"irreps: Irrep parity"),
    "irrep_blocks irreps": (
        lambda: e3j.irrep_blocks(ones(2, 1, 3), "1.5x0e"),
        ValueError,
        r"irreps: invalid multiplicity '1.5'",
    ),
    "to_mul_ir irreps None": (
        lambda: e3j.to_mul_ir(ones(2, 1, 3), None),
        ValueError,
        r"irreps must be irreps .* got None",
    ),
    "spherical_harmonics irreps_out": (
        lambda: e3j.spherical_harmonics("2z", ones(4, 3), True),
        ValueError,
        r"irreps_out: .*invalid irrep '2z'",
    ),
    "spherical_harmonics irreps_out None": (
        lambda: e3j.spherical_harmonics(None, ones(4, 3), True),
        ValueError,
        r"irreps_out: .*got None",
    ),
    "spherical_harmonics l<0": (
        lambda: e3j.spherical_harmonics(-1, ones(4, 3), True),
        ValueError,
        r"irreps_out: l must be an int >= 0",
    ),
    "spherical_harmonics l float": (
        lambda: e3j.spherical_harmonics(2.0, ones(4, 3), True),
        ValueError,
        r"irreps_out: .*got 2.0",
    ),
    # channels
    "mul_ir_irreps channels None": (
        lambda: e3j.mul_ir_irreps("0e", None),
        ValueError,
        r"channels must be an int > 0, got None",
    ),
    "mul_ir_irreps channels -1": (
        lambda: e3j.mul_ir_irreps("0e", -1),
        ValueError,
        r"channels must be an int > 0, got -1",
    ),
    "mul_ir_irreps channels 0": (lambda: e3j.mul_ir_irreps("0e", 0), ValueError, r"channels must be an int > 0, got 0"),
    "from_mul_ir channels 2.0": (
        lambda: e3j.from_mul_ir(ones(2, 2), "0e", 2.0),
        ValueError,
        r"channels must be an int > 0, got 2.0",
    ),
    # arrays
    "to_mul_ir x list": (
        lambda: e3j.to_mul_ir(np.ones((2, 4, 3)).tolist(), "0e + 1o"),
        TypeError,
        r"x must be an array, got list",
    ),
    "to_mul_ir x None": (lambda: e3j.to_mul_ir(None, "0e + 1o"), TypeError, r"x must be an array, got NoneType"),
    "from_mul_ir x list": (
        lambda: e3j.from_mul_ir([[1.0] * 12], "0e + 1o", 3),
        TypeError,
        r"x must be an array, got list",
    ),
    "irrep_blocks x None": (lambda: e3j.irrep_blocks(None, "0e + 1o"), TypeError, r"x must be an array, got NoneType"),
    "spherical_harmonics input None": (
        lambda: e3j.spherical_harmonics(2, None, True),
        TypeError,
        r"input must be an array, got NoneType",
    ),
    "Linear params None": (lambda: LIN(None, ones(5, 4, 2)), TypeError, r"params must be a dict of arrays"),
    "Linear params int": (
        lambda: LIN({k: v.astype(jnp.int32) for k, v in LIN_PARAMS.items()}, ones(5, 4, 2)),
        TypeError,
        r"params\['0e'\] must be a floating-point array, got dtype int32",
    ),
    "Linear params list": (
        lambda: LIN({k: np.asarray(v).tolist() for k, v in LIN_PARAMS.items()}, ones(5, 4, 2)),
        TypeError,
        r"params\['0e'\] must be an array, got list",
    ),
    "Linear x None": (lambda: LIN(LIN_PARAMS, None), TypeError, r"x must be an array, got NoneType"),
    # interop
    "interop tp input1 None": (
        lambda: interop.tensor_product(None, Y3),
        TypeError,
        r"input1 must be an e3nn.IrrepsArray",
    ),
    # an irreps operand beside an array: e3j's Irrep, a tuple, was read as data
    "interop tp input2 Irrep": (
        lambda: interop.tensor_product(X3, e3j.Irrep("1o")),
        TypeError,
        r"input2 is irreps \(1o\) but input1 is IrrepsArray: give two IrrepsArrays",
    ),
    "interop tp input1 str": (
        lambda: interop.tensor_product("1o", X3),
        TypeError,
        r"input1 is irreps \('1o'\) but input2 is IrrepsArray",
    ),
    "interop tp shapes": (
        lambda: interop.tensor_product(X3, e3nn.IrrepsArray("0e + 1o", ones(4, 4))),
        ValueError,
        r"input1 and input2 must have leading shapes that broadcast, got \(3,\) and \(4,\)",
    ),
    "interop tp filter_ir_out": (
        lambda: interop.tensor_product(X3, Y3, filter_ir_out="2z"),
        ValueError,
        r"filter_ir_out: cannot interpret '2z'",
    ),
    "interop tp irrep_normalization": (
        lambda: interop.tensor_product(X3, Y3, irrep_normalization="unit"),
        ValueError,
        r"irrep_normalization must be one of",
    ),
    "interop MP filter_ir_out": (
        lambda: interop.MessagePassing("0e", "0e", filter_ir_out="1x"),
        ValueError,
        r"filter_ir_out: cannot interpret '1x'",
    ),
    "interop MP self_connection": (
        lambda: interop.MessagePassing("0e", "0e", self_connection="2z"),
        ValueError,
        r"self_connection: cannot interpret '2z'",
    ),
    "interop MP irrep_normalization": (
        lambda: interop.MessagePassing("0e", "0e", irrep_normalization="unit"),
        ValueError,
        r"irrep_normalization must be one of",
    ),
    "interop MP edge_attrs list": (
        lambda: MP(X3, np.ones((3, 4)).tolist(), ones(3, MP.num_weights), SENDERS, RECEIVERS),
        TypeError,
        r"edge_attrs must be an e3nn.IrrepsArray or an array, got list",
    ),
    "interop MP weights list": (
        lambda: MP(X3, Y3, np.ones((3, MP.num_weights)).tolist(), SENDERS, RECEIVERS),
        TypeError,
        r"weights must be an array \[E=3, num_weights=\d+\] or FactoredWeights, got list",
    ),
    "interop MP weights complex": (
        lambda: MP(X3, Y3, jnp.ones((3, MP.num_weights), jnp.complex64), SENDERS, RECEIVERS),
        TypeError,
        r"weights must be real \(e3j's products are real\), got dtype complex64",
    ),
    "interop MP edge_attrs complex": (
        lambda: MP(X3, jnp.ones((3, 4), jnp.complex64), ones(3, MP.num_weights), SENDERS, RECEIVERS),
        TypeError,
        r"edge_attrs must be real \(e3j's products are real\), got dtype complex64",
    ),
    "interop MP weights rows": (
        lambda: MP(X3, Y3, ones(4, MP.num_weights), SENDERS, RECEIVERS),
        ValueError,
        r"weights has 4 rows and edge_attrs 3: both take one row per edge",
    ),
    "interop MP weights 1-D": (  # [num_weights] broadcasts (e3nn's m * w), another length does not
        lambda: MP(X3, Y3, ones(MP.num_weights + 1), SENDERS, RECEIVERS),
        ValueError,
        r"weights must be \[E=3, num_weights=\d+\] .*got shape \(\d+,\)",
    ),
    # an IrrepsArray has a shape: without the check it passed the shape checks and JAX refused it unnamed
    "TensorProduct y IrrepsArray": (
        lambda: e3j.TensorProduct("0e + 1o", "0e + 1o")(ones(3, 4, 2), Y3),
        TypeError,
        r"y must be a plain array, got an e3nn IrrepsArray \(1x0e\+1x1o\): its .array is e3nn's flat mul_ir",
    ),
    "MulIrConvolution x IrrepsArray": (
        lambda: _MUL_CONV(X3, ones(3, 4), ones(3, _MUL_CONV.num_weights), e3j.Graph.from_edges(SENDERS, RECEIVERS, 3)),
        TypeError,
        r"x must be a plain array, got an e3nn IrrepsArray",
    ),
    "to_mul_ir IrrepsArray": (
        lambda: e3j.to_mul_ir(Y3, "0e + 1o"),
        TypeError,
        r"x must be a plain array, got an e3nn IrrepsArray",
    ),
    "spherical_harmonics algorithm str": (
        lambda: e3j.spherical_harmonics(1, ones(3, 3), True, algorithm="fast"),
        TypeError,
        r"algorithm must be None or a tuple of",
    ),
    "spherical_harmonics complex": (
        lambda: e3j.spherical_harmonics(1, jnp.ones((3, 3), jnp.complex64), True),
        TypeError,
        r"input must be a real array, got dtype complex64",
    ),
    "interop MP weights IrrepsArray not scalars": (
        lambda: MP(X3, Y3, e3nn.IrrepsArray(f"{MP.num_weights}x0o", ones(3, MP.num_weights)), SENDERS, RECEIVERS),
        ValueError,
        r"weights given as an IrrepsArray must be scalars \(\d+x0e\), got \d+x0o",
    ),
    "interop message_passing node_feats": (
        lambda: interop.message_passing(np.ones((3, 5)).tolist(), Y3, ones(3, 1), SENDERS, RECEIVERS),
        TypeError,
        r"node_feats must be an e3nn.IrrepsArray, got list",
    ),
    "interop sh irreps_out": (
        lambda: interop.spherical_harmonics("2z", ones(3, 3), True),
        ValueError,
        r"irreps_out: .*invalid irrep '2z'",
    ),
    "interop sh l<0": (
        lambda: interop.spherical_harmonics(-1, e3nn.IrrepsArray("1o", ones(3, 3)), True),
        ValueError,
        r"irreps_out: .*l must be an int >= 0",
    ),
    "interop to_irreps_array x list": (
        lambda: interop.to_irreps_array(np.ones((2, 4, 3)).tolist(), "0e + 1o"),
        TypeError,
        r"x must be an array, got list",
    ),
    "interop to_irreps_array irreps": (
        lambda: interop.to_irreps_array(ones(2, 4, 3), "2z"),
        ValueError,
        r"irreps: invalid irrep '2z'",
    ),
    # flax
    "flax Linear irreps_out": (lambda: _flax_lin(irreps_out="2z"), ValueError, r"irreps_out: invalid irrep '2z'"),
    "flax Linear irreps_in": (lambda: _flax_lin(irreps_in=None), ValueError, r"irreps_in must be irreps"),
    "flax Linear num_indexed_weights 0": (
        lambda: _flax_lin(index=jnp.zeros(5, int), num_indexed_weights=0),
        ValueError,
        r"num_indexed_weights must be an int > 0 or None, got 0",
    ),
    "flax Linear num_indexed_weights 2.0": (
        lambda: _flax_lin(index=jnp.zeros(5, int), num_indexed_weights=2.0),
        ValueError,
        r"num_indexed_weights must be an int > 0 or None, got 2.0",
    ),
    "flax Linear path_normalization": (
        lambda: _flax_lin(path_normalization=[1.0]),
        ValueError,
        r"path_normalization must be 'element', 'path' or a float",
    ),
    "flax MLP list_neurons -1": (
        lambda: _mlp(ones(5, 3), list_neurons=[4, -1]),
        ValueError,
        r"list_neurons must be an int > 0 per layer .*got -1",
    ),
    "flax MLP list_neurons 2.5": (
        lambda: _mlp(ones(5, 3), list_neurons=[2.5]),
        ValueError,
        r"list_neurons must be an int > 0 .*got 2.5",
    ),
    "flax MLP list_neurons 0": (
        lambda: _mlp(ones(5, 3), list_neurons=[0]),
        ValueError,
        r"list_neurons must be an int > 0 .*got 0",
    ),
    "flax MLP x list": (lambda: _mlp([[1.0, 2.0]], list_neurons=[4]), TypeError, r"x must be an array, got list"),
    "flax MLP x None": (lambda: _mlp(None, list_neurons=[4]), TypeError, r"x must be an array, got NoneType"),
    "flax MLP list_neurons int": (
        lambda: _mlp(ones(5, 3), list_neurons=4),
        TypeError,
        r"list_neurons must be a tuple of layer widths, got 4",
    ),
    "flax MLP act str": (lambda: _mlp(ones(5, 3), list_neurons=[4], act="silu"), TypeError, r"act must be a callable"),
    # a string flag would read as True
    "flax MLP with_bias str": (
        lambda: _mlp(ones(5, 3), list_neurons=[4], with_bias="no"),
        TypeError,
        r"with_bias must be a bool, got 'no'",
    ),
    "flax MLP factored str": (
        lambda: _mlp(ones(5, 3), list_neurons=[4], output_activation=False, factored="no"),
        TypeError,
        r"factored must be a bool, got 'no'",
    ),
    "flax MLP gradient_normalization bool": (
        lambda: _mlp(ones(5, 3), list_neurons=[4], gradient_normalization=True),
        ValueError,
        r"gradient_normalization must be 'element', 'path' or a float, got True",
    ),
    "flax Linear force_irreps_out str": (
        lambda: _flax_lin(force_irreps_out="no"),
        TypeError,
        r"force_irreps_out must be a bool, got 'no'",
    ),
    # complex input would lose its imaginary part (e3nn-jax keeps it; e3j's products are real)
    "interop tensor_product complex": (
        lambda: interop.tensor_product(X3, e3nn.IrrepsArray("0e + 1o", ones(3, 4) * 1j)),
        TypeError,
        r"input2 must be real .*got dtype complex128",
    ),
    "MulIrConvolution FactoredWeights bias dtype": (
        lambda: _mul_ir_factored(bias=jnp.ones(_MUL_CONV.num_weights, jnp.float32)),
        TypeError,
        r"w.bias: float32",
    ),
    "MulIrConvolution FactoredWeights bias list": (
        lambda: _mul_ir_factored(bias=[1.0] * _MUL_CONV.num_weights),
        TypeError,
        r"w: FactoredWeights.bias must be an array, got list",
    ),
    "Graph.from_edges None": (
        lambda: e3j.Graph.from_edges(None, [0], 3),
        TypeError,
        r"senders must be an integer array \[E\], got None",
    ),
    "TensorProduct x str": (
        lambda: e3j.TensorProduct("0e", "0e")("abc", ones(3, 1)),
        TypeError,
        r"x must be an array, got str",
    ),
    "flax MLP x int": (
        lambda: _mlp(jnp.ones((5, 3), jnp.int32), list_neurons=[4]),
        TypeError,
        r"x must be a floating-point array, got dtype int32",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_names_the_argument(case):
    call, exc, match = BAD[case]
    with pytest.raises(exc, match=match):
        call()


# -- edge cases that are valid, as in e3nn-jax ----------------------------------------------------


def test_empty_batch_as_e3nn():
    """0 rows is a batch like any other (it used to fail in the flat layout's reshape)."""
    x, y = e3nn.IrrepsArray("2x0e + 1o", ones(0, 5)), e3nn.IrrepsArray("0e + 1o", ones(0, 4))
    want = e3nn.tensor_product(x, y)
    got = interop.tensor_product(x, y)
    assert got.irreps == want.irreps and got.shape == want.shape == (0, want.irreps.dim)
    tp = e3j.MulIrTensorProduct("2x0e + 1o", "0e + 1o")
    assert tp(ones(0, 5), ones(0, 4)).shape == (0, tp.irreps_out.dim)


def test_flax_linear_normalization_none_is_e3nn_default():
    """None means e3nn-jax's configured default ("element" / "path"), as in e3nn.flax.Linear."""
    x = rand(5, 4, 2)
    default = e3j_flax.Linear("0e + 1o", channels_out=3, irreps_in="0e + 1o")
    nones = e3j_flax.Linear(
        "0e + 1o", channels_out=3, irreps_in="0e + 1o", path_normalization=None, gradient_normalization=None
    )
    params = default.init(KEY, x)
    np.testing.assert_array_equal(nones.apply(params, x), default.apply(params, x))
