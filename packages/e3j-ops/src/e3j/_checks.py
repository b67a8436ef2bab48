"""Argument validation shared by the public ops (private)."""

from __future__ import annotations

import jax.numpy as jnp


def check_array(name: str, a) -> None:
    """An array (jax, numpy, a scalar), not ``None`` or a nested list.

    jnp would read ``None`` as a float or a rank-0 array and a list as an array (deprecated), and
    its errors would not name the argument.
    """
    if a is None or isinstance(a, (list, tuple)):
        raise TypeError(f"{name} must be an array, got {type(a).__name__}")


def float_dtype(name: str, a) -> jnp.dtype:
    check_array(name, a)
    try:
        dtype = jnp.result_type(a)
    except TypeError as err:  # e.g. a nested list: name the argument
        raise TypeError(f"{name} must be an array, got {type(a).__name__}") from err
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {dtype}")
    return dtype


def check_positive_int(name: str, value: object, what: str = "") -> None:
    """A static count (channels, layers, species): a Python int > 0, never a bool or a float."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be an int > 0{what}, got {value!r}")


def check_rank(name: str, a, ranks: tuple[int, ...], layout: str) -> None:
    check_array(name, a)
    if jnp.ndim(a) not in ranks:
        raise ValueError(f"{name} must have shape {layout}, got shape {jnp.shape(a)}")


def check_same_dtype(**arrays) -> jnp.dtype:
    dtypes = {name: float_dtype(name, a) for name, a in arrays.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{n}: {d}" for n, d in dtypes.items())
        raise TypeError(f"operands must share one floating dtype, got {listed}")
    return next(iter(dtypes.values()))
