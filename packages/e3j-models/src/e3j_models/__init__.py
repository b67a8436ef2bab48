"""e3j-models: MACE and NequIP interatomic potentials on e3j, and their building blocks.

Building blocks (Flax modules and functions, e3j layout ``[N, D, C]``): :func:`radial_embedding`
(Bessel basis × polynomial envelope), :class:`RadialMLP`, :func:`edge_features`,
:class:`SpeciesEmbedding`, :class:`Interaction` (around ``e3j.Convolution``),
:class:`EquivariantLinear`, :func:`gate` (:func:`gate_irreps_in`), :class:`SymmetricContraction`
(:class:`MaceJaxSymmetricContraction`: mace-jax's, with its parameters).
Models: :class:`MACE`, :class:`NequIP` with the paper's presets :func:`mace_a`, :func:`mace_b`,
:func:`nequip`; :class:`Potential` gives energies, forces and stress on a :class:`GraphBatch`
(:func:`batch_structures`, :func:`check_structure`, :func:`neighbour_list`), with
``backend="e3nn"`` evaluating the same parameters with e3nn-jax operations only.

>>> import e3j_models
>>> e3j_models.mace_a((1, 8)).num_channels
128
"""

from typing import TYPE_CHECKING

from . import _optional  # noqa: F401  (first: names a wrong 'e3j' before the imports that would fail on it)
from ._version import __version__
from .batch import GraphBatch, edge_vectors, make_batch
from .config import MACEConfig, NequIPConfig, config_from_dict, config_to_dict, mace_a, mace_b, nequip
from .embedding import SpeciesEmbedding
from .gate import gate, gate_irreps_in
from .interaction import Interaction, RadialMLP, edge_features
from .io import load, save
from .linear import EquivariantLinear
from .mace_jax import MaceJaxSymmetricContraction
from .models import MACE, NequIP
from .neighbours import batch_structures, bucket_size, check_structure, neighbour_list
from .ops import E3jOps, Ops, get_ops
from .potential import Potential
from .radial import bessel_basis, polynomial_envelope, radial_embedding
from .symmetric_contraction import SymmetricContraction, SymmetricContractionSpec
from .systems import cuni_fcc, water_box

__all__ = [
    "MACE",
    "Calculator",
    "E3jOps",
    "EquivariantLinear",
    "GraphBatch",
    "Interaction",
    "MACEConfig",
    "MaceJaxSymmetricContraction",
    "NequIP",
    "NequIPConfig",
    "Ops",
    "Potential",
    "RadialMLP",
    "SpeciesEmbedding",
    "SymmetricContraction",
    "SymmetricContractionSpec",
    "__version__",
    "batch_structures",
    "bessel_basis",
    "bucket_size",
    "check_structure",
    "config_from_dict",
    "config_to_dict",
    "cuni_fcc",
    "edge_features",
    "edge_vectors",
    "gate",
    "gate_irreps_in",
    "get_ops",
    "load",
    "mace_a",
    "mace_b",
    "make_batch",
    "neighbour_list",
    "nequip",
    "polynomial_envelope",
    "radial_embedding",
    "save",
    "water_box",
]


def __getattr__(name: str):
    # the ASE calculator imports ase, an optional extra: loaded on first use only
    if name == "Calculator":
        from .calculator import Calculator

        return Calculator
    raise AttributeError(f"module 'e3j_models' has no attribute {name!r}")


if TYPE_CHECKING:
    from .calculator import Calculator
