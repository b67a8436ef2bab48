"""Test and benchmark structures: a water box at liquid density.

>>> box = water_box(30)
>>> box["positions"].shape, sorted(set(box["numbers"].tolist())), box["cell"][0, 0].round(2)
((30, 3), [1, 8], np.float64(6.69))
"""

from __future__ import annotations

import numpy as np

__all__ = ["water_box"]


def water_box(num_atoms: int, seed: int = 0) -> dict:
    """About ``num_atoms`` atoms (whole molecules) of water at 0.1 atoms/Å³ in a cubic periodic cell."""
    molecules = max(1, round(num_atoms / 3))
    side = (3 * molecules / 0.1) ** (1 / 3)
    per_side = int(np.ceil(molecules ** (1 / 3)))
    rng = np.random.default_rng(seed)
    grid = np.array(list(np.ndindex(per_side, per_side, per_side)))[:molecules] * (side / per_side)
    oxygens = grid + rng.normal(scale=0.1, size=grid.shape)
    positions, numbers = [], []
    for o in oxygens:
        u = rng.normal(size=3)
        u /= np.linalg.norm(u)
        v = np.cross(u, rng.normal(size=3))
        v /= np.linalg.norm(v)
        h1 = o + 0.96 * u
        h2 = o + 0.96 * (np.cos(1.824) * u + np.sin(1.824) * v)  # 104.5°
        positions += [o, h1, h2]
        numbers += [8, 1, 1]
    return {
        "positions": np.array(positions) % side,
        "numbers": np.array(numbers),
        "cell": np.eye(3) * side,
        "pbc": True,
    }
