"""An ASE calculator: energy, forces and stress, compiled once per padding bucket.

Each call builds the neighbour list on the host (vesin), pads nodes and edges to a bucket (one used
before when the system fits it without padding it to more than about twice its size, else a new
:func:`~e3j_models.bucket_size` for the system) and runs one jitted energy + forces + stress
evaluation, so an MD run recompiles only when the edge count outgrows its ~10 % headroom, and a
dataset of mixed sizes compiles a few buckets. Needs the ``ase`` extra.

>>> import jax, numpy as np
>>> from ase import Atoms
>>> from e3j_models import Calculator, Potential, batch_structures, nequip
>>> pot = Potential(nequip((1, 8), num_layers=1, num_channels=2, node_irreps="0e + 1o", l_max=1))
>>> atoms = Atoms("OH2", positions=[[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]])
>>> params = pot.init(jax.random.key(0), batch_structures([atoms], (1, 8), 5.0))
>>> atoms.calc = Calculator(pot, params)
>>> atoms.get_forces().shape
(3, 3)
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from e3j.backends import current_backend_request, use_backend

from ._checks import check_model_dtype
from ._optional import missing

try:
    from ase.calculators.calculator import Calculator as _AseCalculator
    from ase.calculators.calculator import PropertyNotImplementedError, all_changes
    from ase.stress import full_3x3_to_voigt_6_stress
except ImportError as err:
    raise missing("ase", "e3j_models.Calculator") from err

from .neighbours import batch_structures, bucket_size, neighbour_list
from .potential import Potential, _reference_energy

__all__ = ["Calculator"]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _energy_forces_stress(potential: Potential, request: str | None, params, batch):
    # one jitted function for every calculator: keyed by the potential (equal potentials are equal
    # keys), the e3j.use_backend request in force at the call (read when traced, so a key) and the
    # batch's shapes, so a new calculator of the same model (one per structure, a pickled copy)
    # reuses the compiled buckets instead of compiling its own. jax.clear_caches() frees them.
    with use_backend(request):
        return potential(params, batch, stress=True)


def _choose_bucket(need: tuple[int, int], current, used: list, headroom: float) -> tuple[int, int]:
    """The ``(num_nodes, num_edges)`` bucket for a system needing ``need``: ``current`` while it fits
    and is at most twice the system's own bucket in both, else the smallest such bucket of ``used``,
    else the system's own (``bucket_size`` of each count)."""
    tight = tuple(bucket_size(k, headroom) for k in need)
    usable = [b for b in used if all(k <= have <= 2 * t for have, k, t in zip(b, need, tight, strict=True))]
    return current if current in usable else min(usable, key=lambda b: b[0] * b[1], default=tight)


class Calculator(_AseCalculator):
    """``Calculator(potential, params, headroom=0.1, dtype=None)``: ASE ``energy``, ``forces``, ``stress``.

    ``stress`` (Voigt, ASE's sign: ``(1/V) ∂E/∂ε``) needs a cell of nonzero volume, as ASE's own
    calculators do: a slab (``pbc`` ``(True, True, False)``) gets the stress over its cell's volume,
    the vacuum included (what ASE's filters relax in the periodic directions). The padding bucket:
    the current one while the system fits it and it is at most twice the system's own
    :func:`~e3j_models.bucket_size` in nodes and in edges (an MD run keeps one), else the smallest
    such bucket used before, else a new one sized to the system (a dataset of small and large
    structures compiles a few buckets and pays no large padding on the small ones). ``buckets``
    lists the distinct ``(num_nodes, num_edges)`` shapes used so far, in the order first used.

    ``dtype``: the computation's float type, ``None`` for JAX's default (float64 under
    ``jax_enable_x64``, else float32); ``np.float64`` needs ``jax_enable_x64`` (JAX would otherwise
    compute in float32 without a word), checked at each calculation too (a pickled float64
    calculator in a process without it is refused). Calculators of equal potentials share their
    compilations (one per bucket). A calculator can be pickled (for ``multiprocessing`` and
    workflow tools).
    """

    implemented_properties = ("energy", "free_energy", "forces", "stress")
    name = "e3j_models"  # what ASE's trajectories and databases record (ASE's default: the class name)

    def __init__(self, potential: Potential, params: Any, *, headroom: float = 0.1, dtype=None, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(potential, Potential):
            raise TypeError(f"potential must be an e3j_models.Potential, got {type(potential).__name__}")
        dtype = check_model_dtype(dtype)
        bucket_size(1, headroom)  # checks headroom now, not at the first calculation
        self.potential, self.headroom, self.dtype = potential, headroom, dtype
        # the reference energies are added on the host in float64 (as fit subtracts them from its
        # labels): in float32 a large one (~1e4 eV per atom) would round the energy by ~0.1-1 eV
        self._bare = potential._bare()
        self.params = jax.tree.map(lambda a: jnp.asarray(a, dtype), params)
        self._size: tuple[int, int] | None = None
        self.buckets: list[tuple[int, int]] = []

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes) -> None:
        super().calculate(atoms, properties, system_changes)
        # self.atoms is the new structure now: a check failing below must not leave the old one's
        # results standing for it (ASE serves self.results while the atoms compare equal)
        if system_changes:
            self.results = {}
        atoms = self.atoms
        # ASE's rule (its EMT's): a stress wherever the cell has a volume, periodic or not
        has_volume = atoms.cell.rank == 3
        if "stress" in properties and not has_volume:
            raise PropertyNotImplementedError(
                f"stress needs a cell of nonzero volume (atoms.cell.rank 3), got rank {atoms.cell.rank}"
            )
        cfg = self.potential.config
        n = len(atoms)
        if n == 0:
            raise ValueError("atoms is empty: a structure needs at least one atom")
        # the neighbour list once per call: it sizes the bucket and fills the batch
        edges = neighbour_list(atoms.get_positions(), cfg.cutoff, np.asarray(atoms.cell), atoms.pbc)
        need = (n + 1, len(edges[0]))  # one padding node at least: padding edges point at it
        size = _choose_bucket(need, self._size, self.buckets, self.headroom)
        batch = batch_structures(
            [atoms],
            cfg.atomic_numbers,
            cfg.cutoff,
            num_nodes=size[0],
            num_edges=size[1],
            dtype=check_model_dtype(self.dtype),  # again: an unpickled float64 calculator may lack x64
            neighbours=[edges],
        )
        self._size = size
        if size not in self.buckets:
            self.buckets.append(size)
        out = _energy_forces_stress(self._bare, current_backend_request(), self.params, batch)
        energy = float(out["energy"][0]) + _reference_energy(cfg.atomic_numbers, cfg.atomic_energies, atoms.numbers)
        # float64 copies, whatever the model's float type (as ASE's calculators give them): ASE's
        # callers may edit results in place
        self.results = {"energy": energy, "free_energy": energy, "forces": np.array(out["forces"][:n], np.float64)}
        if has_volume:
            self.results["stress"] = full_3x3_to_voigt_6_stress(np.asarray(out["stress"][0], np.float64))
