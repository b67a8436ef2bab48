"""Argument validation shared by e3j-models' public functions and modules (private).

The array rules are e3j's (one rule for both packages); what only models need is here.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from e3j._checks import (
    check_array,
    check_bool,
    check_host_index,
    check_int,
    check_positive_int,
    check_rank,
    float_dtype,
)
from e3j_core._checks import check_positive_real, check_real, is_int

__all__ = [
    "check_array",
    "check_bool",
    "check_float_dtype",
    "check_host_index",
    "check_int",
    "check_model_dtype",
    "check_output_path",
    "check_positive_int",
    "check_positive_real",
    "check_rank",
    "check_real",
    "check_structure_list",
    "float_dtype",
    "index_array",
    "is_int",
    "zero_length_edges",
]


def check_float_dtype(dtype) -> type:
    """``dtype``, a host array's float type: float32 or float64 (what a batch or a model holds)."""
    try:
        kind = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be float32 or float64, got {dtype!r}") from None
    if kind not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {kind}")
    return kind.type


def check_model_dtype(dtype) -> type:
    """A model's float dtype: ``None`` is JAX's default (float64 under ``jax_enable_x64``, else
    float32); float64 needs ``jax_enable_x64`` (JAX would otherwise compute in float32 without a word)."""
    x64 = bool(jax.config.jax_enable_x64)
    if dtype is None:
        return np.float64 if x64 else np.float32
    kind = check_float_dtype(dtype)
    if kind == np.float64 and not x64:
        raise ValueError(
            "dtype=float64 needs JAX's 64-bit mode (jax.config.update('jax_enable_x64', True)); "
            "without it JAX computes in float32. Enable it, or pass dtype=np.float32"
        )
    return kind


def index_array(name: str, a, shape: tuple[int, ...] | None = None, layout: str = "") -> jax.Array:
    """``a`` as an integer array (of ``shape`` when given); a float or a list of indices is an error.

    Values are not checked: under ``jit`` they are not known (out-of-range indices clamp, as in JAX).
    """
    if isinstance(a, (list, tuple)):
        raise TypeError(f"{name} must be an integer array, got {type(a).__name__}")
    check_array(name, a)
    a = jnp.asarray(a)
    if not jnp.issubdtype(a.dtype, jnp.integer):
        raise TypeError(f"{name} must be an integer array, got dtype {a.dtype}")
    if shape is not None and a.shape != shape:
        raise ValueError(f"{name} must have shape {layout or list(shape)}, got shape {a.shape}")
    return a


def zero_length_edges(positions, senders, receivers, shifts, lattice, dtypes) -> np.ndarray:
    """Indices of the edges whose vector ``positions[senders] - positions[receivers] + shifts @ lattice``
    is exactly 0 in any of ``dtypes`` (``lattice`` ``[3, 3]``, or ``[E, 3, 3]``: one per edge).

    A zero-length edge has no direction, so a model drops it: two coincident atoms not interacting,
    which no real structure means. Checked in every dtype the model may compute in, as atoms distinct
    in float64 may coincide in float32.
    """
    zero = np.zeros(len(senders), bool)
    for dt in set(map(np.dtype, dtypes)):
        p = positions.astype(dt)
        cells = np.broadcast_to(lattice.astype(dt), (len(senders), 3, 3))
        vectors = p[senders] - p[receivers] + np.einsum("ei,eij->ej", shifts.astype(dt), cells)
        zero |= np.einsum("ei,ei->e", vectors, vectors) == 0
    return np.flatnonzero(zero)


def check_structure_list(name: str, structures) -> None:
    """``TypeError`` naming ``name`` when ``structures`` is one structure (``ase.Atoms``, whose
    iteration gives atoms, or a dict) or a string instead of a list of them."""
    if isinstance(structures, (dict, str)) or hasattr(structures, "get_positions"):
        raise TypeError(f"{name} must be a list of structures, got one {type(structures).__name__}: wrap it in a list")


def check_output_path(name: str, path) -> str:
    """``path`` (a file a run writes at its end) as a string, refused naming ``name`` before the run
    when its folder does not exist or is not writable, or when it is a folder."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a file path (str or os.PathLike), got {type(path).__name__}")
    path = os.fspath(path)
    if not path:
        raise ValueError(f"{name} must be a file path, got an empty one")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise ValueError(f"{name}: the folder {folder!r} does not exist (create it first)")
    if os.path.isdir(path):
        raise ValueError(f"{name}: {path!r} is a folder, not a file path")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{name}: the folder {folder!r} is not writable")
    return path
