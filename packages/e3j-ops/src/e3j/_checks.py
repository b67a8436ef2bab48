"""Argument validation shared by the public ops (private)."""

from __future__ import annotations

import jax.numpy as jnp


def float_dtype(name: str, a) -> jnp.dtype:
    try:
        dtype = jnp.result_type(a)
    except TypeError as err:  # e.g. a nested list: name the argument
        raise TypeError(f"{name} must be an array, got {type(a).__name__}") from err
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {dtype}")
    return dtype


def check_rank(name: str, a, ranks: tuple[int, ...], layout: str) -> None:
    if isinstance(a, (list, tuple)):  # jnp.ndim of a list is deprecated, and would not name the argument
        raise TypeError(f"{name} must be an array, got {type(a).__name__}")
    if jnp.ndim(a) not in ranks:
        raise ValueError(f"{name} must have shape {layout}, got shape {jnp.shape(a)}")


def check_same_dtype(**arrays) -> jnp.dtype:
    dtypes = {name: float_dtype(name, a) for name, a in arrays.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{n}: {d}" for n, d in dtypes.items())
        raise TypeError(f"operands must share one floating dtype, got {listed}")
    return next(iter(dtypes.values()))
