"""Test and benchmark structures: a water box at liquid density; a Cu–Ni fcc solid solution.

>>> box = water_box(30)
>>> box["positions"].shape, sorted(set(box["numbers"].tolist())), box["cell"][0, 0].round(2)
((30, 3), [1, 8], np.float64(6.69))
>>> atoms = cuni_fcc((2, 2, 3))
>>> len(atoms), sorted(set(atoms.numbers.tolist()))
(48, [28, 29])
"""

from __future__ import annotations

import numpy as np

from ._checks import check_int, check_positive_real, is_int
from ._optional import require

__all__ = ["cuni_fcc", "water_box"]


def water_box(num_atoms: int, seed: int = 0) -> dict:
    """About ``num_atoms`` atoms (whole molecules) of water at 0.1 atoms/Å³ in a cubic periodic cell."""
    num_atoms = check_int("num_atoms", num_atoms, 1)
    seed = check_int("seed", seed, 0)
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


def cuni_fcc(repeats: int | tuple[int, int, int], seed: int = 0, lattice_constant: float = 3.565):
    """A periodic fcc Cu–Ni solid solution (``ase.Atoms``) of ``4·nx·ny·nz`` atoms, the training set's chemistry.

    ``repeats``: cubic unit cells along each axis (an int repeats all three); each site is Ni or Cu
    with probability 1/2 (seeded); ``lattice_constant`` in Å (default: the 50/50 Vegard value).
    Needs ``ase``.
    """
    require("ase", "cuni_fcc")
    from ase.build import bulk

    iterable = np.iterable(repeats) and not isinstance(repeats, str)  # tuples, lists, arrays, ranges
    reps = (repeats,) * 3 if is_int(repeats) else tuple(repeats) if iterable else ()
    if len(reps) != 3 or not all(is_int(r) and r >= 1 for r in reps):
        raise ValueError(f"repeats must be a positive int or 3 positive ints, got {repeats!r}")
    seed = check_int("seed", seed, 0)
    lattice_constant = check_positive_real("lattice_constant", lattice_constant, " (Å)")
    atoms = bulk("Cu", "fcc", a=lattice_constant, cubic=True).repeat(reps)
    rng = np.random.default_rng(seed)
    atoms.numbers = np.where(rng.uniform(size=len(atoms)) < 0.5, 28, 29)
    return atoms
