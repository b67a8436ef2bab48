"""Model configurations and the paper's Table 3 presets.

A config is a frozen dataclass (hashable, so it can be a Flax module attribute) that round-trips
through a plain JSON-able dict (:func:`config_to_dict`, :func:`config_from_dict`). ``atomic_numbers``
lists the elements the model knows, in the order of its species index.

>>> cfg = mace_a((1, 8), num_channels=16)
>>> cfg.num_layers, cfg.correlation, cfg.l_max, cfg.num_channels
(2, 2, 3, 16)
>>> config_from_dict(config_to_dict(cfg)) == cfg
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from e3j import Irreps
from e3j_core import as_irreps

from ._checks import check_bool, check_int, check_positive_real, check_real, is_int

__all__ = [
    "MACEConfig",
    "NequIPConfig",
    "config_from_dict",
    "config_to_dict",
    "mace_a",
    "mace_b",
    "nequip",
]


def _freeze(cfg, name: str, value) -> None:
    object.__setattr__(cfg, name, value)  # a frozen dataclass's own __post_init__ may normalize


def check_atomic_numbers(z) -> tuple[int, ...]:
    """``atomic_numbers`` (the model's elements, in species order) as a tuple of distinct ints in [1, 118]."""
    if isinstance(z, (np.ndarray, range)):
        z = list(z)
    if not isinstance(z, (tuple, list)) or not z or not all(is_int(a) and 1 <= a <= 118 for a in z):
        raise ValueError(f"atomic_numbers must be a non-empty tuple of ints in [1, 118], got {z!r}")
    z = tuple(int(a) for a in z)
    if len(set(z)) != len(z):
        raise ValueError(f"atomic_numbers must not repeat, got {z!r}")
    return z


def _check_common(cfg) -> None:
    """Check the fields every model has; sequences given as lists become tuples (hashable, as a Flax
    module attribute must be)."""
    for name in ("atomic_numbers", "radial_mlp", "atomic_energies"):
        v = getattr(cfg, name)
        if isinstance(v, (list, tuple, np.ndarray)):
            _freeze(cfg, name, tuple(v.tolist() if isinstance(v, np.ndarray) else v))
    z = check_atomic_numbers(cfg.atomic_numbers)
    _freeze(cfg, "atomic_numbers", z)
    for name in ("num_layers", "num_channels", "l_max", "num_rbf", "envelope_p", "readout_hidden"):
        minimum = 0 if name == "l_max" else 1
        _freeze(cfg, name, check_int(name, getattr(cfg, name), minimum))
    for name, unit in (("cutoff", " (Å)"), ("avg_num_neighbors", "")):
        _freeze(cfg, name, check_positive_real(name, getattr(cfg, name), unit))
    r = cfg.radial_mlp
    if not isinstance(r, tuple) or not all(is_int(h) and h >= 1 for h in r):
        raise ValueError(f"radial_mlp must be a tuple of positive ints (the hidden widths), got {r!r}")
    _freeze(cfg, "radial_mlp", tuple(int(h) for h in r))
    e0 = cfg.atomic_energies
    if e0 is not None:
        try:  # numbers, NumPy scalars or 0-d arrays (the one rule for real arguments)
            if not isinstance(e0, tuple):
                raise ValueError
            values = tuple(check_real("atomic_energies", e) for e in e0)
        except ValueError:
            raise ValueError(f"atomic_energies must be None or a tuple of finite numbers (eV), got {e0!r}") from None
        _freeze(cfg, "atomic_energies", values)  # JSON-able: no numpy scalars
    if cfg.atomic_energies is not None and len(cfg.atomic_energies) != len(z):
        raise ValueError(f"atomic_energies must have one value per atomic number ({len(z)}), got {cfg.atomic_energies}")


@dataclass(frozen=True)
class MACEConfig:
    """MACE (Batatia et al. 2023) with the power-expansion symmetric contraction.

    ``node_symmetry``: the largest l of the hidden node features (``"0e + 1o + 2e"`` for 2 without
    pseudotensors); ``l_max``: of the edge spherical harmonics and the ``A`` features;
    ``node_gating``: a gated nonlinearity on the hidden features after each layer but the last.
    The last layer keeps scalars only and reads out through a ``readout_hidden``-wide SiLU MLP.
    """

    atomic_numbers: tuple[int, ...]
    num_layers: int = 2
    num_channels: int = 128
    correlation: int = 2
    node_symmetry: int = 2
    l_max: int = 3
    cutoff: float = 5.0
    num_rbf: int = 8
    node_gating: bool = True
    include_pseudotensors: bool = False
    radial_mlp: tuple[int, ...] = (64, 64, 64)
    avg_num_neighbors: float = 30.0
    readout_hidden: int = 16
    envelope_p: int = 6
    atomic_energies: tuple[float, ...] | None = None

    kind: ClassVar[str] = "mace"

    def __post_init__(self) -> None:
        _check_common(self)
        _freeze(self, "correlation", check_int("correlation", self.correlation, 1))
        ns = self.node_symmetry
        if not is_int(ns) or not 0 <= ns <= self.l_max * self.correlation:
            raise ValueError(
                f"node_symmetry must be an int in [0, l_max·correlation] = [0, {self.l_max * self.correlation}], "
                f"got {self.node_symmetry!r}"
            )
        _freeze(self, "node_symmetry", int(ns))
        for name in ("node_gating", "include_pseudotensors"):
            _freeze(self, name, check_bool(name, getattr(self, name)))

    def _irreps(self, lmax: int) -> Irreps:
        if self.include_pseudotensors:
            return Irreps([(1, (l, p)) for l in range(lmax + 1) for p in (1, -1)]).regroup()
        return Irreps.spherical_harmonics(lmax)

    @property
    def irreps_sh(self) -> Irreps:
        """The edges' spherical harmonics, ``0e + 1o + …`` up to ``l_max``."""
        return Irreps.spherical_harmonics(self.l_max)

    @property
    def irreps_a(self) -> Irreps:
        """The irreps of the ``A`` features (the symmetric contraction's input), ``C`` channels each."""
        return self._irreps(self.l_max)

    @property
    def irreps_hidden(self) -> Irreps:
        """The node features' irreps between layers (degrees up to ``node_symmetry``), ``C`` channels each."""
        return self._irreps(self.node_symmetry)


@dataclass(frozen=True)
class NequIPConfig:
    """NequIP (Batzner et al. 2022): gated interaction blocks with a self-connection.

    ``node_irreps`` are per channel (``num_channels`` channels each block); any irreps form is
    taken (a string, e3j's or e3nn-jax's ``Irreps``, ``(mul, (l, p))`` pairs) and kept as its string.
    """

    atomic_numbers: tuple[int, ...]
    num_layers: int = 5
    num_channels: int = 32
    node_irreps: str = "2x0e + 2x0o + 1o + 1e + 2e + 2o"
    l_max: int = 2
    cutoff: float = 5.0
    num_rbf: int = 8
    radial_mlp: tuple[int, ...] = (64, 64)
    avg_num_neighbors: float = 30.0
    readout_hidden: int = 16
    envelope_p: int = 6
    atomic_energies: tuple[float, ...] | None = None

    kind: ClassVar[str] = "nequip"

    def __post_init__(self) -> None:
        _check_common(self)
        irreps = as_irreps(self.node_irreps, "node_irreps")
        if irreps.dim == 0:
            raise ValueError(f"node_irreps must not be empty, got {self.node_irreps!r}")
        if not any(mul > 0 and ir.l == 0 and ir.p == 1 for mul, ir in irreps):
            # the readout maps the last layer's 0e features to the energy: without them it is always 0
            raise ValueError(
                f"node_irreps must hold 0e features (the energy is read from them), got {self.node_irreps!r}"
            )
        dead = sorted({str(ir) for mul, ir in irreps if mul > 0 and (ir.l, ir.p) != (0, 1)})
        if self.l_max == 0 and dead:
            # products with 0e edge attributes keep the 0e embedding 0e: these features stay zero
            raise ValueError(
                f"node_irreps {self.node_irreps!r}: with l_max 0 (spherical harmonics 0e only) the "
                f"features of {', '.join(dead)} are always zero; keep only 0e, or raise l_max"
            )
        # stored as its string, whatever form it came in (e3j or e3nn-jax Irreps, (mul, (l, p))
        # pairs): the config stays hashable and JSON-able, so it saves and loads
        _freeze(self, "node_irreps", str(irreps))

    @property
    def irreps_sh(self) -> Irreps:
        """The edges' spherical harmonics, ``0e + 1o + …`` up to ``l_max``."""
        return Irreps.spherical_harmonics(self.l_max)

    @property
    def irreps_node(self) -> Irreps:
        """``node_irreps`` regrouped (sorted, equal irreps merged): the hidden features' irreps."""
        return Irreps(self.node_irreps).regroup()


_KINDS = {"mace": MACEConfig, "nequip": NequIPConfig}


def check_config(config) -> MACEConfig | NequIPConfig:
    """``config``, a model's config (``TypeError`` naming it otherwise)."""
    if not isinstance(config, (MACEConfig, NequIPConfig)):
        raise TypeError(f"config must be a MACEConfig or NequIPConfig, got {type(config).__name__}")
    return config


def config_to_dict(config: MACEConfig | NequIPConfig) -> dict[str, Any]:
    """A JSON-able dict with ``"model"`` naming the architecture."""
    check_config(config)
    out = {"model": config.kind}
    for f in dataclasses.fields(config):
        v = getattr(config, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def config_from_dict(d: dict[str, Any]) -> MACEConfig | NequIPConfig:
    """The inverse of :func:`config_to_dict`; unknown keys are an error."""
    d = dict(d)
    kind = d.pop("model", None)
    if kind not in _KINDS:
        raise ValueError(f"config 'model' must be one of {sorted(_KINDS)}, got {kind!r}")
    cls = _KINDS[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"unknown {kind} config keys: {sorted(unknown)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def mace_a(atomic_numbers: Sequence[int], **overrides: Any) -> MACEConfig:
    """Table 3's MACE (a): 2 layers, 128 channels, correlation 2, node_symmetry 2, l_max 3, 5 Å, 8 RBF, gating."""
    return MACEConfig(check_atomic_numbers(atomic_numbers), **overrides)


def mace_b(atomic_numbers: Sequence[int], **overrides: Any) -> MACEConfig:
    """Table 3's MACE (b): as (a) with correlation 3 and node_symmetry 1."""
    return MACEConfig(check_atomic_numbers(atomic_numbers), **{"correlation": 3, "node_symmetry": 1, **overrides})


def nequip(atomic_numbers: Sequence[int], **overrides: Any) -> NequIPConfig:
    """Table 3's NequIP: 5 layers, 32 channels, ``2x0e + 2x0o + 1o + 1e + 2e + 2o``, l_max 2, 5 Å, 8 RBF."""
    return NequIPConfig(check_atomic_numbers(atomic_numbers), **overrides)
