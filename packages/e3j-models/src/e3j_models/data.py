"""A deterministic training set from a classical reference: ASE's EMT on Cu–Ni fcc alloys.

Each structure is a periodic fcc supercell (``repeats`` conventional cells of 4 atoms: 32 to 108
atoms) of a random Cu/Ni composition (Ni fraction uniform in [0, 1], sites assigned at random) at
Vegard's-law lattice constant, with a random symmetric strain ``(ε + εᵀ) / 2`` of a matrix ``ε``
whose components are normal with standard deviation ``strain`` (so ``strain`` on the diagonal and
``strain / √2`` off it), 0 to ``max_vacancies`` vacancies and Gaussian thermal displacements
of standard deviation ``0.1 Å · sqrt(T / 1000 K)`` for a temperature uniform in ``temperatures``.
Energy, forces and stress come from :class:`ase.calculators.emt.EMT` (ASE's effective-medium theory,
which ships parameters for Al, Cu, Ag, Au, Ni, Pd, Pt; Cu–Ni is a textbook fcc solid solution).

Structure ``i`` of seed ``s`` depends only on ``(s, i)`` (``numpy.random.SeedSequence([s, i])``), so
a set is reproducible and a larger set extends a smaller one. :func:`write_dataset` writes extxyz
(``energy``, ``forces``, ``stress`` fields; or an ASE trajectory, by the file's suffix), read back by
:func:`read_dataset` or ``ase.io.read``.

>>> atoms = emt_structures(2, seed=0)
>>> [len(a) for a in atoms], sorted(atoms[0].calc.results)  # 32 and 48 sites, 2 vacancies each
([30, 46], ['energy', 'forces', 'stress'])
>>> bool(atoms[0].get_potential_energy() == emt_structures(1, seed=0)[0].get_potential_energy())
True
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence

import numpy as np

from ._checks import check_int, is_int
from ._optional import require

__all__ = ["LATTICE_CONSTANTS", "WEIGHT_KEYS", "dataset_format", "emt_structures", "read_dataset", "write_dataset"]

LATTICE_CONSTANTS = {"Cu": 3.61, "Ni": 3.52}
"""fcc lattice constants (Å) mixed by Vegard's law."""

WEIGHT_KEYS = ("config_weight", "config_energy_weight", "config_forces_weight", "config_stress_weight")
"""mace-torch's per-structure loss weights, read from ``atoms.info`` by ``fit``: the first
multiplies each of the others (energy, forces, stress terms); each is 1 when absent."""

_REPEATS = ((2, 2, 2), (3, 2, 2), (3, 3, 2), (3, 3, 3))


def emt_structures(
    num_structures: int,
    seed: int = 0,
    *,
    repeats: Sequence[tuple[int, int, int]] = _REPEATS,
    strain: float = 0.02,
    max_vacancies: int = 2,
    temperatures: tuple[float, float] = (100.0, 1200.0),
) -> list:
    """``num_structures`` ``ase.Atoms`` with EMT energy, forces and stress attached (``atoms.calc``).

    Supercell sizes cycle through ``repeats`` (structure ``i`` gets ``repeats[i % len(repeats)]``).
    """
    require("ase", "e3j_models.data.emt_structures")
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator

    num_structures = check_int("num_structures", num_structures, 1)
    seed = check_int("seed", seed, 0)
    if (
        isinstance(repeats, str)
        or not repeats
        or any(
            isinstance(r, str) or not np.iterable(r) or len(r) != 3 or not all(is_int(n) and n >= 1 for n in r)
            for r in repeats
        )
    ):
        raise ValueError(f"repeats must be a non-empty list of 3 positive ints each, got {repeats!r}")
    smallest = 4 * min(int(np.prod(r)) for r in repeats)  # atoms of the smallest supercell
    max_vacancies = check_int("max_vacancies", max_vacancies, 0)
    if max_vacancies >= smallest:
        raise ValueError(
            f"max_vacancies must be < {smallest}, the atoms of the smallest supercell of repeats, got {max_vacancies}"
        )
    if not 0 <= strain < 0.2:
        raise ValueError(f"strain must be in [0, 0.2), got {strain!r}")
    lo, hi = temperatures
    if not 0 <= lo <= hi:
        raise ValueError(f"temperatures must be (low, high) with 0 <= low <= high (K), got {temperatures!r}")
    out = []
    for i in range(num_structures):
        rng = np.random.default_rng(np.random.SeedSequence([seed, i]))
        x_ni = rng.uniform()
        a = (1 - x_ni) * LATTICE_CONSTANTS["Cu"] + x_ni * LATTICE_CONSTANTS["Ni"]
        atoms = bulk("Cu", "fcc", a=a, cubic=True).repeat(repeats[i % len(repeats)])
        atoms.numbers = np.where(rng.uniform(size=len(atoms)) < x_ni, 28, 29)
        eps = rng.normal(scale=strain, size=(3, 3))
        atoms.set_cell(atoms.cell @ (np.eye(3) + (eps + eps.T) / 2), scale_atoms=True)
        vacancies = rng.integers(0, max_vacancies + 1)
        if vacancies:
            del atoms[rng.choice(len(atoms), size=vacancies, replace=False).tolist()]
        temperature = rng.uniform(lo, hi)
        atoms.positions += rng.normal(scale=0.1 * np.sqrt(temperature / 1000.0), size=atoms.positions.shape)
        atoms.wrap()
        atoms.info["temperature"] = temperature
        atoms.calc = EMT()
        results = {
            "energy": atoms.get_potential_energy(),
            "forces": atoms.get_forces(),
            "stress": atoms.get_stress(),
        }
        atoms.calc = SinglePointCalculator(atoms, **results)
        out.append(atoms)
    return out


# the formats that keep every structure's energy, forces and stress, by the name ASE reads them as
_DATASET_FORMATS = ("extxyz", "traj")


def dataset_format(path: str | os.PathLike) -> str:
    """The format :func:`write_dataset` writes ``path`` in: the one ``ase.io.read`` will read it as.

    ``.extxyz`` or ``.xyz`` (or a name without a suffix, which ASE reads by content): extxyz;
    ``.traj``: an ASE trajectory. A name ASE reads as another format (``.cif``, ``.json``, ...) is
    refused: those formats do not keep the energies and forces, or would be read as something else;
    so is a compressed name (``.xyz.gz``).

    >>> dataset_format("set.xyz"), dataset_format("set.traj"), dataset_format("set")
    ('extxyz', 'traj', 'extxyz')
    """
    require("ase", "e3j_models.data.dataset_format")
    from ase.io.formats import UnknownFileTypeError, filetype, get_compression

    path = os.fspath(path)
    if get_compression(path)[1] is not None:  # the temporary file would be written uncompressed
        raise ValueError(f"dataset path {path!r}: write_dataset writes uncompressed files; drop the compression suffix")
    try:
        fmt = filetype(path, read=False)
    except UnknownFileTypeError:
        return "extxyz"
    if fmt not in _DATASET_FORMATS:
        raise ValueError(
            f"dataset path {path!r}: ASE reads that name as {fmt!r}; name an extxyz file (.extxyz, .xyz) "
            "or an ASE trajectory (.traj), the formats that keep each structure's energy and forces"
        )
    return fmt


def write_dataset(path: str | os.PathLike, structures: Sequence) -> None:
    """Write ``structures`` (with energies/forces attached) in the format ``path``'s suffix names
    (:func:`dataset_format`: extxyz or an ASE trajectory); atomically (temp file, rename)."""
    require("ase", "e3j_models.data.write_dataset")
    from ase.io import write

    fmt = dataset_format(path)
    path = os.fspath(path)
    tmp = path + ".partial"
    write(tmp, list(structures), format=fmt)
    os.replace(tmp, path)


def read_dataset(
    path: str | os.PathLike,
    *,
    energy_key: str = "energy",
    forces_key: str = "forces",
    stress_key: str = "stress",
    virials_key: str | None = None,
) -> list:
    """``ase.Atoms`` from an extxyz (or any ASE-readable) file, each with an energy, forces or both.

    By default the labels are what ASE reads as the structure's calculator results (extxyz's
    ``energy``, ``forces`` and ``stress``). Datasets that keep them under other names (mace-torch's
    ``REF_energy``, ``REF_forces``, ``REF_stress``; a ``DFT_energy``) name them: each ``*_key``
    other than the default is read from ``atoms.info`` (energy, stress: 6 Voigt or 9 numbers) or
    ``atoms.arrays`` (forces ``[N, 3]``), else from the calculator results as read (where ASE files
    the names it knows, e.g. ``free_energy``), and becomes the structure's result, replacing what
    the file's calculator results held. A stress is optional. ``virials_key`` (mace-torch's
    ``REF_virials``: ``W = -V·σ``, in ``atoms.info``) gives the stress as ``-W / V`` instead, on
    structures with a cell of nonzero volume; a virial is not a stress, so naming one as
    ``stress_key`` would train on numbers of the wrong sign and size.

    A structure may lack its energy or its forces (not both): :func:`~e3j_models.train.fit` gives
    that term weight 0 there, as mace-torch does. A label absent from every structure while the
    file holds keys that look like it is refused with their names (a label under another name is
    the usual cause). mace-torch's per-structure weights (``WEIGHT_KEYS`` in ``atoms.info``) stay
    there for ``fit`` to read; ``config_virials_weight`` weighs the stress read from virials.

    >>> import os, tempfile, numpy as np
    >>> from ase import Atoms
    >>> atoms = Atoms("H2", positions=[[0, 0, 0], [0.74, 0, 0]])
    >>> atoms.info["REF_energy"] = -1.2
    >>> atoms.arrays["REF_forces"] = np.zeros((2, 3))
    >>> path = os.path.join(tempfile.mkdtemp(), "h2.extxyz")
    >>> atoms.write(path)
    >>> [a.get_potential_energy() for a in read_dataset(path, energy_key="REF_energy", forces_key="REF_forces")]
    [-1.2]
    """
    require("ase", "e3j_models.data.read_dataset")
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.io import read

    named = [("energy_key", energy_key), ("forces_key", forces_key), ("stress_key", stress_key)]
    for name, key in named + ([("virials_key", virials_key)] if virials_key is not None else []):
        if not isinstance(key, str) or not key:
            raise TypeError(f"{name} must be a non-empty str, got {key!r}")
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"data file {path!r} does not exist")
    try:
        structures = read(path, index=":")
    except Exception as err:  # ASE raises many types for unreadable files
        raise ValueError(f"data file {path!r} is not readable by ase.io.read: {err}") from err
    if not structures:
        raise ValueError(f"data file {path!r} holds no structures")
    keys = {"energy": energy_key, "forces": forces_key, "stress": stress_key}
    renamed = {p: k for p, k in keys.items() if k != p}
    # per-structure loss weights other than mace-torch's config_*_weight are not read: say so
    # (config_virials_weight is, as the stress's, where the stress comes from virials)
    read = set(WEIGHT_KEYS) | ({"config_virials_weight"} if virials_key is not None else set())
    weighted = sorted({n for atoms in structures for n in atoms.info if "weight" in n.lower()} - read)
    if weighted:
        extra = "" if virials_key is not None else "; config_virials_weight with virials_key"
        warnings.warn(
            f"data file {path!r}: per-structure weights {weighted} are not read; fit reads "
            f"{', '.join(WEIGHT_KEYS)} (mace-torch's){extra}",
            stacklevel=2,
        )
    has = {"energy": [], "forces": []}
    filed = []  # each structure's calculator results as read: ASE files the names it knows there
    for k, atoms in enumerate(structures):
        results = dict(atoms.calc.results) if atoms.calc is not None else {}
        filed.append(dict(results))
        if renamed:
            for prop, key in renamed.items():
                results.pop(prop, None)  # the named label replaces the default one, or there is none
                # ASE's extxyz reader files the names it knows (free_energy, energy, ...) as results
                source = atoms.arrays if prop == "forces" else atoms.info
                source = source if key in source else filed[-1]
                if key in source:
                    try:
                        value = np.asarray(source[key], np.float64)
                    except (TypeError, ValueError) as err:  # text: numpy's message would name nothing
                        raise ValueError(f"data file {path!r}: structure {k}'s {key} is not numbers: {err}") from err
                    if prop == "energy" and value.size == 1:
                        value = value.item()
                    elif prop == "stress" and value.size == 9:
                        value = value.reshape(3, 3)
                    results[prop] = value
        if virials_key is not None and virials_key in atoms.info:
            volume = abs(float(np.linalg.det(atoms.cell.array)))
            if volume == 0:
                raise ValueError(f"data file {path!r}: structure {k} has {virials_key} but no cell volume")
            virials = np.asarray(atoms.info[virials_key], np.float64)
            virials = virials.reshape(3, 3) if virials.size == 9 else virials
            results["stress"] = -virials / volume
            if "config_virials_weight" in atoms.info and "config_stress_weight" not in atoms.info:
                atoms.info["config_stress_weight"] = atoms.info["config_virials_weight"]
        if renamed or virials_key is not None:
            atoms.calc = SinglePointCalculator(atoms, **results)
        for p in has:
            has[p].append(p in results)
        if not (has["energy"][-1] or has["forces"][-1]):
            hint = _label_hint(atoms, filed[-1], ("energy", "force"))
            raise ValueError(f"data file {path!r}: structure {k} has no {energy_key} or {forces_key}{hint}")
    for p, name in (("energy", "energy"), ("forces", "force")):
        # absent from every structure: under another name (mace-torch's REF_energy), or not in the file
        hint = _label_hint(structures[0], filed[0], (name,), exclude=set(keys.values()))
        if not any(has[p]) and hint:
            raise ValueError(f"data file {path!r}: no structure has {keys[p]}{hint}")
    return structures


def _label_hint(atoms, results: dict, words: tuple[str, ...], exclude: set = frozenset()) -> str:
    """What a structure holds that looks like a label (its info, arrays and calculator ``results``
    as read, the keys containing ``words``), as an error's hint to name them; "" when nothing does."""
    names = {*atoms.info, *atoms.arrays, *results}
    other = sorted(n for n in names if n not in exclude and any(w in n.lower() for w in words))
    return f"; it has {other}: name them with energy_key= / forces_key= (--energy-key ...)" if other else ""
