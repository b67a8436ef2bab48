"""Argument checks shared by e3j-core's modules (private)."""

from __future__ import annotations

import numpy as np


def check_degree(l: object, name: str = "l") -> int:
    """A degree ``l``: a Python or numpy int >= 0 (never a bool or a float), as a Python int."""
    if isinstance(l, (bool, np.bool_)) or not isinstance(l, (int, np.integer)):
        raise ValueError(f"{name} must be an int >= 0, got {l!r}")
    if l < 0:
        raise ValueError(f"{name} must be >= 0, got {l}")
    return int(l)
