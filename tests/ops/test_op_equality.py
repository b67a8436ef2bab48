"""Ops built from equal arguments are equal and hash alike: as static ``jit`` arguments they
compile once (they compared by identity, so every op built again compiled again)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import e3j


def _pairs():
    """(op, the same op built again from equal arguments written otherwise, a different op)."""
    return [
        (
            e3j.TensorProduct("0e + 1o", "1o", filter="0e + 1o"),
            e3j.TensorProduct(e3j.Irreps("1x0e+1x1o"), "1o", filter=["1o", "0e"]),
            e3j.TensorProduct("0e + 1o", "1o", filter="0e + 1o + 1e"),
        ),
        (
            e3j.Convolution("0e + 1o", "0e + 1o"),
            e3j.Convolution("0e+1o", "0e+1o"),
            e3j.Convolution("0e + 1o", "0e + 1o", normalization="norm"),
        ),
        (
            e3j.MulIrConvolution("4x0e + 2x1o", "1o", self_connection="0e"),
            e3j.MulIrConvolution("4x0e+2x1o", "1x1o", self_connection="0e"),
            e3j.MulIrConvolution("4x0e + 2x1o", "1o"),
        ),
        (
            e3j.MulIrTensorProduct("8x0e + 4x1o", "0e + 1o", filter="1o"),
            e3j.MulIrTensorProduct("8x0e+4x1o", "0e+1o", filter="1o"),
            e3j.MulIrTensorProduct("8x0e + 4x1o", "0e + 1o", filter="1o", regroup_output=False),
        ),
        (
            e3j.Linear("2x0e + 1o", "0e + 2x1o", channels_in=4, channels_out=3),
            e3j.Linear("2x0e+1o", "0e+2x1o", channels_in=4, channels_out=3),
            e3j.Linear("2x0e + 1o", "0e + 2x1o", channels_in=4, channels_out=2),
        ),
    ]


@pytest.mark.parametrize("index", range(5))
def test_ops_of_equal_arguments_are_equal(index):
    op, again, other = _pairs()[index]
    assert op == again and hash(op) == hash(again) and len({op, again}) == 1
    assert op != other and not (op == other)
    assert op != "op" and op != None  # noqa: E711 - the comparison itself is tested


def test_a_tensor_product_and_a_convolution_of_one_table_differ():
    tp = e3j.TensorProduct("0e + 1o", "0e + 1o")
    conv = e3j.Convolution.from_coo(tp.coo)
    assert tp.coo == conv.coo and tp != conv
    assert e3j.Convolution.from_coo(tp.coo) == conv


def test_an_op_built_again_as_a_static_argument_does_not_compile_again():
    f = jax.jit(lambda op, x, y: op(x, y), static_argnums=0)
    x, y = jnp.ones((2, 4, 3)), jnp.ones((2, 4))
    compiles = []
    listener = lambda event, duration, **kw: compiles.append(event) if "backend_compile" in event else None  # noqa: E731
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        first = f(e3j.TensorProduct("0e + 1o", "0e + 1o"), x, y)
        n = len(compiles)
        second = f(e3j.TensorProduct("0e+1o", "0e+1o"), x, y)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert n >= 1 and len(compiles) == n, f"compiled {len(compiles) - n} more times"
    np.testing.assert_array_equal(first, second)
