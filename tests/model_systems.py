"""Small float64 systems and tiny model configs shared by the model tests."""

from __future__ import annotations

import json

import numpy as np

import e3j_models as em

Z = (1, 8)
CUTOFF = 3.0
SMALL = {"cutoff": CUTOFF, "radial_mlp": (8,), "num_rbf": 4, "avg_num_neighbors": 8.0}
CONFIGS = {
    "mace_corr2": em.mace_a(Z, num_channels=3, l_max=2, node_symmetry=1, **SMALL),
    "mace_corr3": em.mace_b(Z, num_channels=2, l_max=1, node_symmetry=1, **SMALL),
    "nequip": em.nequip(Z, num_layers=2, num_channels=2, node_irreps="2x0e + 0o + 1o + 1e", l_max=1, **SMALL),
    "nequip_tiny": em.nequip(Z, num_layers=1, num_channels=2, node_irreps="0e + 1o", l_max=1, **SMALL),
}
CELL = np.array([[4.2, 0.0, 0.0], [0.9, 4.0, 0.0], [0.4, -0.5, 4.4]])


def structure(seed: int, n: int = 8, periodic: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    if periodic:
        positions = rng.uniform(0, 1, (n, 3)) @ CELL
    else:  # a loose cluster, atoms at least 0.8 Å apart
        positions = []
        while len(positions) < n:
            p = rng.uniform(0, 3.0, 3)
            if all(np.linalg.norm(p - q) > 0.8 for q in positions):
                positions.append(p)
        positions = np.array(positions)
    numbers = rng.choice(Z, n)
    return {"positions": positions, "numbers": numbers, "cell": CELL if periodic else None, "pbc": periodic}


def random_rotation(seed: int) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q * np.sign(np.linalg.det(q))


def edited_checkpoint(src, dst, edit) -> None:
    """A copy at ``dst`` of the checkpoint ``src`` whose header's config ``edit(config)`` changed in
    place (what ``save`` would refuse to write: a hand-edited file)."""
    arrays = dict(np.load(src, allow_pickle=False))
    header = json.loads(bytes(arrays["__header__"]).decode())
    edit(header["config"])
    arrays["__header__"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    np.savez(dst, **arrays)
