"""Argument checks shared by e3j-core, e3j and e3j-models (private; one rule for each kind).

Counts, degrees and flags are static: Python or numpy scalars are taken (numpy ones come from array
sizes, ``np.unique``, masks) and returned as Python ones; bools are not counts, and only bools are
flags (a string such as ``"no"`` would read as True).
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def is_int(value: object) -> bool:
    """A Python or numpy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value: object, minimum: int = 0, what: str = "") -> int:
    """``value`` as a Python int ``>= minimum``, else ``ValueError`` naming ``name``."""
    if not is_int(value) or value < minimum:
        bound = "> 0" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{name} must be an int {bound}{what}, got {value!r}")
    return int(value)


def check_degree(l: object, name: str = "l") -> int:
    """A degree ``l >= 0``."""
    return check_int(name, l, 0)


def check_bool(name: str, value: object) -> bool:
    """``value`` as a Python bool, else ``TypeError`` naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def _number(value: object) -> object:
    """A 0-d NumPy or JAX array of an integer or float dtype as its Python number (a traced one, whose
    value is not known, is returned as it is); anything else unchanged."""
    if isinstance(value, (bool, numbers.Real)) or getattr(value, "shape", None) != ():
        return value
    kind = getattr(getattr(value, "dtype", None), "kind", "")
    if not (kind and kind in "fiu"):
        return value
    try:
        return value.item()
    except Exception:  # a tracer: no value to check
        return value


def check_real(name: str, value: object, minimum: float | None = None, what: str = "") -> float:
    """A finite real number (``>= minimum`` when given; a 0-d NumPy or JAX array too) as a Python
    float, else ``ValueError``."""
    value = _number(value)
    ok = not isinstance(value, (bool, np.bool_)) and isinstance(value, numbers.Real) and math.isfinite(value)
    if not ok or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum:g}"
        raise ValueError(f"{name} must be a finite number{bound}{what}, got {value!r}")
    return float(value)


def check_positive_real(name: str, value: object, what: str = "") -> float:
    """A finite real number ``> 0`` (a length, a scale; a 0-d NumPy or JAX array too) as a Python
    float, else ``ValueError``."""
    value = _number(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a finite number > 0{what}, got {value!r}")
    return float(value)
