"""The training data as ``fit`` reads it: each structure's labels and their weights, the checks
that refuse what the loss or the model cannot use, and the constants fitted to the data (per-element
reference energies, the mean neighbour count).

Labels are ``atoms.calc.results`` (``energy``, ``forces``, ``stress``); per-structure weights are
mace-torch's (``config_weight``, ``config_{energy,forces,stress}_weight`` and ``config_type`` in
``atoms.info``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._checks import check_structure_list
from .config import MACEConfig, NequIPConfig, check_config
from .data import WEIGHT_KEYS
from .neighbours import _checked_graph, neighbour_list


def _results(atoms) -> Mapping[str, Any]:
    """The structure's labels (``atoms.calc.results``; empty without a calculator)."""
    return atoms.calc.results if atoms.calc is not None else {}


def check_labelled_structures(name: str, structures) -> None:
    """:func:`check_structure_list`, then a ``TypeError`` naming ``name[k]`` for a structure that
    is not an ``ase.Atoms``: training, its checks and its metrics read the labels in
    ``atoms.calc.results`` and the per-structure weights in ``atoms.info``, which the dicts of
    positions and numbers that batching takes do not carry (they failed with an ``AttributeError``
    naming no argument)."""
    check_structure_list(name, structures)
    for k, atoms in enumerate(structures):
        if not all(hasattr(atoms, a) for a in ("calc", "info", "numbers", "pbc")):
            raise TypeError(
                f"{name}[{k}] must be an ase.Atoms with its labels in atoms.calc.results (e.g. atoms.calc = "
                f"SinglePointCalculator(atoms, energy=..., forces=...)), got {type(atoms).__name__}: a dict of "
                "positions and numbers carries no labels (batch_structures and Potential.batch take those)"
            )


def _label_weights(
    atoms, results, config_weights: bool = True, type_weights: Mapping[str, float] | None = None
) -> tuple[float, float, float]:
    """The structure's weights of its energy, forces and stress terms: 0 for a label it lacks (the
    stress: unless periodic in all directions), else mace-torch's ``config_weight`` times
    ``config_{energy,forces,stress}_weight`` from ``atoms.info`` (each 1 when absent; all 1 without
    ``config_weights``), times ``type_weights[atoms.info["config_type"]]`` (mace-torch's
    ``config_type_weights``; the type ``"Default"`` when absent, 1 for a type not given).
    ``ValueError`` for a weight that is not a finite number >= 0."""
    present = ("energy" in results, "forces" in results, _has_stress(atoms, results))
    if not config_weights:
        return tuple(float(p) for p in present)
    values = {}
    for key in WEIGHT_KEYS:
        value = atoms.info.get(key, 1.0)
        try:
            values[key] = float(value)
        except (TypeError, ValueError):
            values[key] = math.nan
        if not (math.isfinite(values[key]) and values[key] >= 0):
            shown = value.item() if isinstance(value, np.generic) else value  # -1.0, not np.float64(-1.0)
            raise ValueError(f"has {key} {shown!r}: a per-structure weight must be a finite number >= 0")
    base = values["config_weight"] * (type_weights or {}).get(_config_type(atoms), 1.0)
    terms = (base * values[f"config_{p}_weight"] for p in ("energy", "forces", "stress"))
    return tuple(w if p else 0.0 for w, p in zip(terms, present, strict=True))


def _config_type(atoms) -> str:
    """The structure's ``config_type`` (``atoms.info``), mace-torch's ``"Default"`` when absent."""
    return str(atoms.info.get("config_type", "Default"))


def _check_type_weights(
    type_weights, structures: Sequence | None, name: str = "config_type_weights"
) -> dict[str, float] | None:
    """``type_weights`` as ``{config_type: weight}``, refused naming ``name`` unless each key is a
    string, each weight a finite number >= 0 (not a bool), and each type (but ``"Default"``) some
    structure's of ``structures`` (a misspelt type would weigh nothing, silently; None: not
    checked)."""
    if type_weights is None:
        return None
    if not isinstance(type_weights, Mapping):
        raise TypeError(f"{name} must map config types to weights, got {type(type_weights).__name__}")
    out = {}
    for key, value in type_weights.items():
        if not isinstance(key, str):  # 1 and "1" would become one key
            raise TypeError(f"{name}'s keys must be config types as strings, got {key!r}")
        try:
            out[key] = math.nan if isinstance(value, bool) else float(value)
        except (TypeError, ValueError):
            out[key] = math.nan
        if not (math.isfinite(out[key]) and out[key] >= 0):
            raise ValueError(f"{name}[{key!r}] is {value!r}: a weight must be a finite number >= 0")
    if structures is None:
        return out
    present = {_config_type(a) for a in structures}
    unknown = sorted(set(out) - present - {"Default"})
    if unknown:
        raise ValueError(
            f"{name} names config types {unknown} that no structure has (atoms.info['config_type']; "
            f"the structures' are {sorted(present)})"
        )
    return out


def isolated_atom_energies(structures: Sequence) -> tuple[dict[int, float], list]:
    """``({atomic number: energy}, others)``: the energies of ``structures``' isolated atoms (one
    atom, no periodic direction, or ``info["config_type"] == "IsolatedAtom"`` as mace-torch marks
    them) and the other structures, in order. The energies are a config's ``atomic_energies`` taken
    from the reference method itself; an element with two isolated atoms of different energies is
    refused (``ValueError``).

    >>> from ase import Atoms
    >>> from ase.calculators.singlepoint import SinglePointCalculator
    >>> h = Atoms("H")
    >>> h.calc = SinglePointCalculator(h, energy=-13.6, forces=[[0.0, 0.0, 0.0]])
    >>> isolated_atom_energies([h])
    ({1: -13.6}, [])
    """
    check_labelled_structures("structures", structures)
    energies: dict[int, float] = {}
    others = []
    for k, atoms in enumerate(structures):
        isolated = atoms.info.get("config_type") == "IsolatedAtom" or (len(atoms) == 1 and not atoms.pbc.any())
        if not isolated:
            others.append(atoms)
            continue
        if len(atoms) != 1:
            raise ValueError(f"structure {k} is marked IsolatedAtom but holds {len(atoms)} atoms")
        if "energy" not in _results(atoms):
            raise ValueError(f"structure {k} is an isolated atom without an energy label")
        z, energy = int(atoms.numbers[0]), float(_results(atoms)["energy"])
        if z in energies and energies[z] != energy:
            raise ValueError(f"structure {k}: element {z} has isolated-atom energies {energies[z]} and {energy}")
        energies[z] = energy
    return energies, others


def prepare_config(config: MACEConfig | NequIPConfig, structures: Sequence) -> MACEConfig | NequIPConfig:
    """``config`` with ``atomic_energies`` (least squares on the energies) and ``avg_num_neighbors``
    (mean over atoms) taken from ``structures``. Every element of the config must occur in them
    (``ValueError`` naming those that do not: their energies could not be fitted, nor their
    embeddings trained); where the compositions do not tell the elements' energies apart (all
    structures in one ratio) the least-squares solution of smallest norm is taken. Structures
    without an energy label do not enter the fit (none with one: the energies are 0). A config that
    has ``atomic_energies`` already (isolated atoms' energies from the reference method, or an
    earlier fit's) keeps them."""
    check_labelled_structures("structures", structures)
    return _fitted_config(config, structures, [len(_neighbours(atoms, config.cutoff)[0]) for atoms in structures])


def _fitted_config(config, structures: Sequence, num_edges: Sequence[int]):
    """:func:`prepare_config` given each structure's neighbour count (``fit`` has them from its checks)."""
    z = list(config.atomic_numbers)
    counts = np.zeros((len(structures), len(z)))
    energies = np.zeros(len(structures))
    labelled = np.zeros(len(structures), bool)
    neighbours = 0
    atoms_total = 0
    for k, atoms in enumerate(structures):
        unknown = sorted(set(atoms.numbers.tolist()) - set(z))
        if unknown:
            raise ValueError(f"structure {k} holds atomic numbers {unknown} unknown to the config ({z})")
        for i, zi in enumerate(z):
            counts[k, i] = np.sum(atoms.numbers == zi)
        labelled[k] = "energy" in _results(atoms)
        energies[k] = _results(atoms)["energy"] if labelled[k] else 0.0
        neighbours += num_edges[k]
        atoms_total += len(atoms)
    _check_elements_present(z, structures)
    given = config.atomic_energies
    if given is not None:
        e0 = given
    elif labelled.any():
        e0 = np.linalg.lstsq(counts[labelled], energies[labelled], rcond=None)[0]
    else:  # forces alone fix no energy offset
        e0 = np.zeros(len(z))
    return dataclasses.replace(
        config,
        atomic_energies=tuple(float(x) for x in e0),
        avg_num_neighbors=max(float(neighbours / atoms_total), 1.0),
    )


def absent_elements(atomic_numbers: Sequence[int], structures: Sequence) -> list[int]:
    """The elements of ``atomic_numbers`` that no structure of ``structures`` holds, in that order."""
    present = {int(n) for atoms in structures for n in atoms.numbers}
    return [int(z) for z in atomic_numbers if int(z) not in present]


def _check_elements_present(atomic_numbers: Sequence[int], structures: Sequence) -> None:
    absent = absent_elements(atomic_numbers, structures)
    if absent:
        raise ValueError(
            f"atomic numbers {absent} of the config ({list(atomic_numbers)}) occur in none of the "
            f"{len(structures)} training structures: their reference energies cannot be fitted; drop them "
            "from atomic_numbers or add structures holding them"
        )


def check_training_data(
    config: MACEConfig | NequIPConfig,
    train: Sequence,
    weights: tuple,
    valid: Sequence = (),
    *,
    dtype=np.float32,
    every_element: bool = True,
    config_type_weights: Mapping[str, float] | None = None,
) -> None:
    """What :func:`fit` refuses in its data (``ValueError``), checked before anything is trained:
    in any structure of ``train`` or ``valid`` (named ``train[k]``, ``valid[k]``), neither energy
    nor forces, non-finite labels (energy; forces ``[N, 3]``; stress where the loss reads it),
    per-structure weights that are not finite numbers >= 0 (``config_weight`` ...,
    :data:`~e3j_models.data.WEIGHT_KEYS`) and what the model cannot read (an element not in the
    config, no atoms, non-finite positions, atoms that coincide in ``dtype``); a config element in
    no training structure (unless ``every_element`` is False: fine-tuning trained parameters on a
    subset of the elements); a loss weight > 0 of a term no training structure has a label of
    (energy-only data needs ``weights[1] = 0``); ``config_type_weights`` (as :func:`fit`'s) with a
    weight that is not a finite number >= 0 or a type no structure of train or valid has."""
    _check_training_data(
        config, train, weights, valid, dtype=dtype, every_element=every_element, type_weights=config_type_weights
    )


def _check_training_data(
    config,
    train,
    weights,
    valid=(),
    *,
    dtype=np.float32,
    every_element=True,
    type_weights=None,
    names=("weights[0]", "weights[1]", "weights[2]"),
    type_weights_name="config_type_weights",
    parts=("train", "valid"),
    reads_stress=None,
    config_weights=True,
):
    """:func:`check_training_data`, returning each structure's checked graph it built (for
    :func:`_batch`; :func:`~e3j_models.neighbours._checked_graph`): ``(train's, valid's)``. ``names``
    and ``type_weights_name`` name the loss weights and the type weights in errors (the command
    line's flags), ``parts`` the two lists' structures (``train[k]``); ``reads_stress``: whether
    the caller reads the stress labels (default: when ``weights[2] > 0``; metrics read them all);
    ``config_weights``: whether it reads the per-structure weights (metrics do not)."""
    check_config(config)
    check_labelled_structures(parts[0], train)
    check_labelled_structures(parts[1] or "valid", valid)
    type_weights = _check_type_weights(type_weights, [*train, *valid], type_weights_name)
    found = {"train": [], "valid": []}
    label_weights = []  # the training structures' (energy, forces, stress) weights
    reads_stress = weights[2] > 0 if reads_stress is None else reads_stress
    for part, name, structures in (("train", parts[0], train), ("valid", parts[1], valid)):
        for k, atoms in enumerate(structures):
            graph, its_weights = _check_structure_data(
                config, atoms, f"{name}[{k}]", reads_stress, dtype, type_weights, config_weights
            )
            found[part].append(graph)
            if part == "train":
                label_weights.append(its_weights)
    if every_element:
        _check_elements_present(config.atomic_numbers, train)
    labels = (
        "an energy label",
        "forces",
        "a stress label on a fully periodic cell (atoms.calc.results['stress']; read_dataset reads virials too)",
    )
    used = np.array(label_weights).reshape(-1, 3).max(axis=0, initial=0) > 0
    for i, (term, label) in enumerate(zip(("energy", "forces", "stress"), labels, strict=True)):
        if weights[i] > 0 and not used[i]:
            raise ValueError(
                f"{names[i]} ({term}) is {weights[i]} but no training structure has {label} with a weight > 0 "
                f"(its own weights in atoms.info times its config type's): the term would be 0 ({names[i]} 0 trains "
                "on the other labels alone)"
            )
    return found["train"], found["valid"]


def _check_structure_data(config, atoms, name: str, reads_stress: bool, dtype, type_weights=None, config_weights=True):
    """``ValueError`` naming structure ``name`` for labels the loss would read and cannot use, or
    atoms the model cannot read (a NaN force passed to a validation MAE of NaN and no checkpoint;
    coincident atoms were named by their place in a shuffled batch). A stress label (on a fully
    periodic cell) must be 6 or 3×3 numbers, which the batches read, and finite where
    ``reads_stress``. Returns the structure's checked graph, built by the check, and its
    :func:`_label_weights`."""
    res = _results(atoms)
    n = len(atoms)
    if "energy" not in res and "forces" not in res:
        raise ValueError(f"{name} has no reference energy or forces (atoms.calc.results)")
    if "energy" in res:
        energy = np.asarray(res["energy"], np.float64)
        if energy.size != 1 or not np.isfinite(energy).all():
            raise ValueError(f"{name} has a reference energy that is not one finite number: {res['energy']}")
    if "forces" in res:
        forces = np.asarray(res["forces"], np.float64)
        if forces.shape != (n, 3):
            raise ValueError(f"{name} has reference forces of shape {forces.shape}, expected [{n}, 3]")
        if not np.isfinite(forces).all():
            raise ValueError(
                f"{name} has non-finite reference forces (atom {int(np.argwhere(~np.isfinite(forces))[0, 0])})"
            )
    try:
        label_weights = _label_weights(atoms, res, config_weights, type_weights)
    except ValueError as err:
        raise ValueError(f"{name} {err}") from None
    if _has_stress(atoms, res):  # the batches read it (Voigt or 3×3); the loss or the metrics its values
        try:
            stress = np.asarray(res["stress"], np.float64)
        except (TypeError, ValueError):
            stress = np.full(1, np.nan)
        if stress.shape not in ((6,), (3, 3)) or (reads_stress and not np.isfinite(stress).all()):
            raise ValueError(
                f"{name} has a reference stress that is not 6 or 3×3 {'finite ' if reads_stress else ''}numbers: "
                f"{res['stress']!r}"
            )
    graph = _checked_graph(atoms, config.atomic_numbers, config.cutoff, dtype, where=f" ({name})")
    return graph, label_weights


def _neighbours(atoms, cutoff: float):
    """A structure's unchecked neighbour list ``(senders, receivers, shifts)`` (for structures that
    were not checked here)."""
    return neighbour_list(atoms.positions, cutoff, np.asarray(atoms.cell), atoms.pbc)


def _has_stress(atoms, results) -> bool:
    """Whether a structure's stress is a label: given, and the cell periodic in all directions."""
    return "stress" in results and bool(np.all(atoms.pbc))
