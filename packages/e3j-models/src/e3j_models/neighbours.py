"""Neighbour lists (vesin) and static-shape padded batches of structures.

:func:`neighbour_list` finds every pair within ``cutoff`` for an open or periodic (any triclinic)
cell on the host with vesin (cell lists, linear in the atom count; all periodic images, so cutoffs
larger than half the cell are handled). :func:`batch_structures` concatenates structures into one
:class:`~e3j_models.GraphBatch` padded to bucket sizes (:func:`bucket_size`: a geometric grid with
``headroom``, 10 % by default, as the paper pads edges), so that an MD run sees the same shapes step
after step and compiles once per bucket. Padding nodes carry ``node_mask`` False, padding edges
``edge_mask`` False: they change no energy, force or gradient.

>>> import numpy as np
>>> s, r, shifts = neighbour_list(np.array([[0.0, 0, 0], [1.0, 0, 0]]), cutoff=1.5)
>>> sorted(zip(s.tolist(), r.tolist()))
[(0, 1), (1, 0)]
>>> bucket_size(1000), bucket_size(1000, headroom=0.0, multiple=1)
(1144, 1000)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._checks import (
    check_float_dtype,
    check_int,
    check_positive_int,
    check_positive_real,
    check_real,
    check_structure_list,
    zero_length_edges,
)
from .batch import GraphBatch, make_batch
from .config import check_atomic_numbers

__all__ = ["batch_structures", "bucket_size", "check_structure", "neighbour_list"]


def _real(name: str, value, where: str) -> np.ndarray:
    """``value`` as float64, refused naming ``name`` unless its numbers are real (a complex one
    would lose its imaginary part with only a warning; strings would be parsed)."""
    try:
        a = np.asarray(value)
    except ValueError as err:  # ragged
        raise ValueError(f"{name}{where} must be an array of real numbers: {err}") from None
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{name}{where} must hold real numbers, got dtype {a.dtype}")
    return a.astype(np.float64)


def _check_structure(positions, cell, pbc, where: str = ""):
    positions = _real("positions", positions, where)
    if positions.ndim != 2 or positions.shape[1] != 3:
        raise ValueError(f"positions{where} must be [N, 3], got shape {positions.shape}")
    if positions.shape[0] == 0:
        raise ValueError(f"positions{where} is empty: a structure needs at least one atom")
    if not np.all(np.isfinite(positions)):
        raise ValueError(
            f"positions{where} must be finite, got NaN or inf at atom {int(np.argwhere(~np.isfinite(positions))[0, 0])}"
        )
    flags = np.asarray(pbc)
    # bools, or 0 and 1 (ASE takes pbc=1); a string would be truthy ("False" periodic)
    if flags.shape not in ((), (1,), (3,)) or not (
        flags.dtype == bool or (flags.dtype.kind in "iu" and np.isin(flags, (0, 1)).all())
    ):
        raise ValueError(f"pbc{where} must be a bool or 3 bools, got {pbc!r}")
    pbc = np.broadcast_to(flags.astype(bool), (3,))
    cell = _real("cell", np.zeros((3, 3)) if cell is None else cell, where)
    if cell.shape != (3, 3):
        raise ValueError(f"cell{where} must be a 3×3 matrix (rows: lattice vectors), got shape {cell.shape}")
    if not np.all(np.isfinite(cell)):
        raise ValueError(f"cell{where} must be finite")
    if pbc.all() and abs(np.linalg.det(cell)) < 1e-12:
        raise ValueError(f"cell{where} is singular but pbc{where} is {pbc.tolist()}: a periodic cell needs volume")
    # mixed periodicity (slabs, wires): only the periodic lattice vectors must span their directions;
    # the others may be zero (ASE's slabs without vacuum), as no edge crosses them
    if pbc.any() and not pbc.all() and np.linalg.svd(cell[pbc], compute_uv=False).min() < 1e-6:
        raise ValueError(
            f"cell{where}'s periodic vectors {cell[pbc].tolist()} are degenerate (pbc{where} {pbc.tolist()}): "
            "each periodic direction needs a lattice vector of its own"
        )
    return positions, cell, pbc


def _near_origin(positions, cell, pbc, senders, receivers, shifts):
    """``positions`` moved near the origin with every edge vector unchanged, so that a float32 batch
    keeps their differences' digits (unwrapped MD coordinates ~1,000 Å from the origin lose 4 of
    float32's 7): each atom by whole lattice vectors along the periodic axes, its edges' ``shifts``
    taking up the difference (any integer move is exact), then all atoms by their mean."""
    positions = np.asarray(positions, np.float64)
    shifts = np.asarray(shifts, np.float64)
    if pbc.any() and len(positions):
        lattice = cell[pbc]  # the periodic lattice vectors, [k, 3]
        whole = np.zeros((len(positions), 3))
        whole[:, pbc] = np.floor(positions @ np.linalg.pinv(lattice))
        positions = positions - whole @ cell
        if len(senders):
            shifts = shifts + whole[senders] - whole[receivers]
    if len(positions):
        positions = positions - positions.mean(axis=0)
    return positions, shifts


def _given_neighbours(entry, num_atoms: int, where: str):
    """A caller's ``(senders, receivers, shifts)`` of one structure, checked against its atom count
    (an index past it would connect this structure to the next one in the batch)."""
    if not isinstance(entry, (tuple, list)):
        raise TypeError(f"neighbours{where} must be a (senders, receivers, shifts) tuple, got {type(entry).__name__}")
    if len(entry) != 3:
        raise ValueError(f"neighbours{where} must be (senders, receivers, shifts), got {len(entry)} items")
    s, r, shifts = (np.asarray(a) for a in entry)
    for name, a in (("senders", s), ("receivers", r)):
        if not np.issubdtype(a.dtype, np.integer) and a.size:
            raise TypeError(f"neighbours{where}: {name} must be integers, got dtype {a.dtype}")
    if s.ndim != 1 or r.shape != s.shape or shifts.shape != (s.shape[0], 3):
        raise ValueError(
            f"neighbours{where} must be senders [E], receivers [E], shifts [E, 3], got shapes "
            f"{s.shape}, {r.shape}, {shifts.shape}"
        )
    for name, a in (("senders", s), ("receivers", r)):
        bad = np.flatnonzero((a < 0) | (a >= num_atoms))
        if bad.size:
            raise ValueError(
                f"neighbours{where}: {name}[{int(bad[0])}] = {int(a[bad[0]])} is out of range for its {num_atoms} atoms"
            )
    return s.astype(np.int64), r.astype(np.int64), shifts  # shifts: cast with the positions, as make_batch does


def neighbour_list(positions, cutoff: float, cell=None, pbc=False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(senders, receivers, shifts)`` of all pairs closer than ``cutoff`` (both directions).

    The edge vector is ``positions[senders] - positions[receivers] + shifts @ cell`` (``shifts`` int
    ``[E, 3]``). ``cell`` rows are lattice vectors; ``pbc`` a bool or 3 bools.
    """
    positions, cell, pbc = _check_structure(positions, cell, pbc)
    cutoff = check_positive_real("cutoff", cutoff)
    from vesin import NeighborList

    box = cell if pbc.any() else np.zeros((3, 3))
    nl = NeighborList(cutoff=float(cutoff), full_list=True)
    i, j, shifts = nl.compute(
        points=positions, box=box, periodic=bool(pbc.all()) if pbc.all() == pbc.any() else pbc, quantities="ijS"
    )
    return j.astype(np.int64), i.astype(np.int64), shifts.astype(np.int64)


def bucket_size(n: int, headroom: float = 0.1, multiple: int = 8) -> int:
    """The smallest size on the grid ``multiple · ceil((1 + headroom)^k)`` that holds ``n·(1 + headroom)``."""
    n = check_int("n", n, 0)
    headroom = check_real("headroom", headroom, 0)
    check_positive_int("multiple", multiple)
    target = n * (1.0 + headroom)
    if 1.0 + headroom == 1.0:  # no grid: (1 + headroom)^k is 1 for every k
        return int(multiple * math.ceil(target / multiple))
    # (1 + headroom)^k >= target / multiple is enough, not needed: ceil() may lift the k below it
    k = max(0, math.ceil(math.log(max(target / multiple, 1.0), 1.0 + headroom)) - 1)
    while multiple * math.ceil((1.0 + headroom) ** k) < target:
        k += 1
    return int(multiple * math.ceil((1.0 + headroom) ** k))


def _structure_graph(st, index: dict, cutoff: float, dtype, where: str, given=None, g: int = 0):
    """One structure's checked ``(positions, numbers, cell, pbc, senders, receivers, shifts)``,
    positions moved near the origin: what :func:`batch_structures` refuses in it (``where`` names
    it), the one place those checks live. ``index`` maps the model's atomic numbers to species;
    ``given``: the structure's neighbour list, when the caller has it."""
    if isinstance(st, dict):
        if "positions" not in st or "numbers" not in st:
            raise ValueError(f"a structure given as a dict needs 'positions' and 'numbers', got keys {sorted(st)}")
        positions, numbers = st["positions"], st["numbers"]
        cell, pbc = st.get("cell"), st.get("pbc", False)
    else:  # ase.Atoms
        positions, numbers, cell, pbc = st.get_positions(), st.numbers, np.asarray(st.cell), st.pbc
    positions, cell, pbc = _check_structure(positions, cell, pbc, where)
    numbers = np.asarray(numbers)
    if not np.issubdtype(numbers.dtype, np.integer):  # a cast would truncate 1.7 to hydrogen
        raise TypeError(f"numbers{where} must be integer atomic numbers, got dtype {numbers.dtype}")
    if numbers.shape != (positions.shape[0],):
        raise ValueError(f"numbers{where} must be [N={positions.shape[0]}], got {numbers.shape}")
    unknown = sorted({int(z) for z in numbers} - set(index))
    if unknown:
        raise ValueError(
            f"numbers{where} holds atomic numbers {unknown} unknown to the model (atomic_numbers={list(index)})"
        )
    if given is None:
        s, r, shifts = neighbour_list(positions, cutoff, cell, pbc)
    else:
        named = where or f" (structure {g})"
        s, r, shifts = _given_neighbours(given, positions.shape[0], named)
        # an image along an open direction is no image: the edge would move by that cell vector
        across = np.flatnonzero(np.any(np.asarray(shifts)[:, ~pbc] != 0, axis=1))
        if across.size:
            k = int(across[0])
            raise ValueError(
                f"neighbours{named}: edge {k} has shifts {np.asarray(shifts)[k].tolist()}, an image along a "
                f"direction that is not periodic (pbc {pbc.tolist()})"
            )
    positions, shifts = _near_origin(positions, cell, pbc, s, r, shifts)
    lattice = cell if pbc.any() else np.zeros((3, 3))
    zero = zero_length_edges(positions, s, r, np.asarray(shifts), lattice, (np.float64, dtype))
    if zero.size:
        k = zero[0]
        raise ValueError(f"atoms {s[k]} and {r[k]}{where} coincide (distance 0): positions must be distinct")
    return positions, numbers, cell, pbc, s, r, shifts


def check_structure(
    structure, atomic_numbers: Sequence[int], cutoff: float, *, dtype=np.float64, where: str = ""
) -> None:
    """``structure`` (as :func:`batch_structures` takes it) checked as :func:`batch_structures`
    checks each of its structures, without building a batch: ``ValueError`` (or ``TypeError``)
    naming ``where`` for what a model cannot read."""
    _checked_graph(structure, atomic_numbers, cutoff, dtype, where)


def _checked_graph(structure, atomic_numbers, cutoff, dtype, where: str = ""):
    """:func:`check_structure`, returning what :func:`_assemble` batches of the structure:
    :func:`_structure_graph`'s ``(positions, numbers, cell, pbc, senders, receivers, shifts)``, so
    that a caller that checks and then batches (again and again: ``fit``'s epochs) builds it once.
    The atomic numbers, indices and shifts come in the narrowest integer type that holds them."""
    index = {z: k for k, z in enumerate(check_atomic_numbers(atomic_numbers))}
    positions, numbers, cell, pbc, s, r, shifts = _structure_graph(
        structure, index, check_positive_real("cutoff", cutoff), check_float_dtype(dtype), where
    )
    # kept for a whole run: 5 bytes per edge under 128 atoms, 7 under 32,768, where int64 indices
    # and float64 shifts took 40 (edges outnumber atoms ~50 to 1 at a 5-6 Å cutoff)
    return positions, _narrowest_int(numbers), cell, pbc, _narrowest_int(s), _narrowest_int(r), _narrowest_int(shifts)


def _narrowest_int(a: np.ndarray) -> np.ndarray:
    """``a`` in the narrowest signed integer type that holds its values, if they are all integers;
    otherwise ``a`` as it is (shifts that :func:`~e3j_models.make_batch` will refuse)."""
    if a.size == 0:
        return a.astype(np.int8)
    if not np.issubdtype(a.dtype, np.integer) and not (
        np.isfinite(a).all() and (a == np.round(a)).all() and np.abs(a).max() < 2.0**53  # floats exact as ints
    ):
        return a
    lo, hi = a.min(), a.max()
    for t in (np.int8, np.int16, np.int32, np.int64):
        if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max:
            return a.astype(t)
    return a


def batch_structures(
    structures: Sequence[Any],
    atomic_numbers: Sequence[int],
    cutoff: float,
    *,
    num_nodes: int | None = None,
    num_edges: int | None = None,
    headroom: float = 0.1,
    dtype=np.float64,
    neighbours: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None,
    num_graphs: int | None = None,
) -> GraphBatch:
    """One padded :class:`GraphBatch` of ``structures`` (``ase.Atoms``, or dicts with ``positions``,
    ``numbers`` and optionally ``cell``, ``pbc``).

    ``atomic_numbers`` maps each element to the model's species index. ``num_nodes`` / ``num_edges``
    fix the padded sizes (an error if too small); by default they are :func:`bucket_size` of the
    counts (the nodes get one padding node at least so padding edges have somewhere to point).
    ``num_graphs`` (default: one per structure) pads the graphs too: the structures are the first,
    the rest empty (no atoms, a zero cell: an energy of 0), so that a smaller last batch keeps the
    shapes of the others.
    ``neighbours``: each structure's ``(senders, receivers, shifts)`` from :func:`neighbour_list` with
    this ``cutoff``, when the caller has them already (default: computed here).

    The batch's ``positions`` and ``shifts`` are not the input's: each structure is moved near the
    origin (atoms by whole lattice vectors along periodic axes, their edges' shifts compensating,
    then all atoms by their mean), so that a float32 batch keeps the digits of coordinates far from
    the origin. Every edge vector, and so every energy, force and stress, is the input's.
    """
    check_structure_list("structures", structures)
    if len(structures) == 0:
        raise ValueError("structures is empty: give at least one structure")
    if neighbours is not None and len(neighbours) != len(structures):
        raise ValueError(f"neighbours must hold one entry per structure ({len(structures)}), got {len(neighbours)}")
    index = {z: k for k, z in enumerate(check_atomic_numbers(atomic_numbers))}
    cutoff = check_positive_real("cutoff", cutoff)
    dtype = check_float_dtype(dtype)
    num_nodes = None if num_nodes is None else check_int("num_nodes", num_nodes, 0, " or None")
    num_edges = None if num_edges is None else check_int("num_edges", num_edges, 0, " or None")
    num_graphs = len(structures) if num_graphs is None else check_int("num_graphs", num_graphs, 1, " or None")
    if num_graphs < len(structures):
        raise ValueError(f"num_graphs={num_graphs} cannot hold {len(structures)} structures")
    graphs = [
        _structure_graph(
            st,
            index,
            cutoff,
            dtype,
            f" (structure {g})" if len(structures) > 1 else "",
            None if neighbours is None else neighbours[g],
            g,
        )
        for g, st in enumerate(structures)
    ]
    return _assemble(graphs, index, num_nodes, num_edges, headroom, dtype, num_graphs)


def _assemble(graphs, index: dict, num_nodes, num_edges, headroom: float, dtype, num_graphs: int) -> GraphBatch:
    """One padded :class:`GraphBatch` of checked structures (:func:`_structure_graph`'s each;
    ``index``: atomic number -> species), as :func:`batch_structures` documents it."""
    lookup = np.full(max(index) + 1, -1, np.int64)
    lookup[list(index)] = list(index.values())
    pos_all, spec_all, graph_all, s_all, r_all, sh_all, cells = [], [], [], [], [], [], []
    offset = 0
    for g, (positions, numbers, cell, _pbc, s, r, shifts) in enumerate(graphs):
        pos_all.append(positions)
        spec_all.append(lookup[numbers])
        graph_all.append(np.full(positions.shape[0], g))
        s_all.append(s.astype(np.int64) + offset)  # a cached graph's indices may be int8 or int16
        r_all.append(r.astype(np.int64) + offset)
        sh_all.append(shifts)
        # kept whatever pbc says (a molecule's box too): edges use it only through their shifts,
        # zero in open directions, and the stress divides by its volume, as ASE's calculators do
        cells.append(cell)
        offset += positions.shape[0]
    n, e = offset, sum(len(s) for s in s_all)
    n_pad = bucket_size(n + 1, headroom) if num_nodes is None else num_nodes
    e_pad = bucket_size(e, headroom) if num_edges is None else num_edges
    if n_pad < n or e_pad < e:
        raise ValueError(f"num_nodes={n_pad} / num_edges={e_pad} cannot hold {n} atoms and {e} edges")
    pad_n, pad_e = n_pad - n, e_pad - e
    last = len(graphs) - 1
    return make_batch(
        np.concatenate([*pos_all, np.zeros((pad_n, 3))]).astype(dtype),
        np.concatenate([*spec_all, np.zeros(pad_n, np.int64)]),
        np.concatenate([*s_all, np.full(pad_e, n_pad - 1)]),
        np.concatenate([*r_all, np.full(pad_e, n_pad - 1)]),
        shifts=np.concatenate([*sh_all, np.zeros((pad_e, 3), np.int64)]),
        cell=np.concatenate([np.stack(cells), np.zeros((num_graphs - len(graphs), 3, 3))]),
        node_graph=np.concatenate([*graph_all, np.full(pad_n, last)]),
        node_mask=np.arange(n_pad) < n,
        edge_mask=np.arange(e_pad) < e,
        num_graphs=num_graphs,
    )
