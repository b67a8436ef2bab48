"""Save and load a model (config + parameters) as one version-tagged ``.npz`` file, without pickle.

Layout: a zip of ``.npy`` arrays (numpy's ``.npz``), read back with ``allow_pickle=False``:

- ``__header__``: UTF-8 JSON as a ``uint8`` array:
  ``{"format": "e3j-models", "format_version": 1, "package_version": ..., "config": {...}}`` where
  ``config`` is :func:`e3j_models.config_to_dict` (``"model"``: ``"mace"`` or ``"nequip"``).
- one array per parameter leaf, named by its path in the Flax tree joined with ``/``
  (e.g. ``params/interaction_0/linear_up/0e``).

A file of another ``format`` or a newer ``format_version`` is refused with a clear error.

>>> import jax, numpy as np, tempfile, os
>>> from e3j_models import Potential, make_batch, nequip
>>> pot = Potential(nequip((1,), num_layers=1, num_channels=2, node_irreps="0e", l_max=1))
>>> params = pot.init(jax.random.key(0), make_batch(np.zeros((1, 3)), [0], [], []))
>>> path = os.path.join(tempfile.mkdtemp(), "model.npz")
>>> save(path, pot.config, params)
>>> config, loaded = load(path)
>>> config == pot.config, jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), params, loaded))
(True, True)
"""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._version import __version__
from .config import _KINDS, MACEConfig, NequIPConfig, check_config, config_from_dict, config_to_dict

__all__ = ["FORMAT", "FORMAT_VERSION", "load", "save"]

FORMAT = "e3j-models"
#: bumped when the file layout or the meaning of a parameter changes
FORMAT_VERSION = 1
#: what numpy raises for a file that is not a zip of .npy arrays, or one cut short or damaged
_UNREADABLE = (ValueError, OSError, EOFError, zipfile.BadZipFile)


def _flatten(tree: Any, prefix: str, out: dict[str, np.ndarray]) -> None:
    if isinstance(tree, Mapping):  # dicts, and flax's FrozenDict
        for k, v in tree.items():
            if "/" in str(k):
                raise ValueError(f"parameter name {k!r} must not contain '/'")
            _flatten(v, f"{prefix}/{k}" if prefix else str(k), out)
        return
    if not prefix:
        raise TypeError(f"params must be a nested dict of arrays (as Potential.init gives), got {type(tree).__name__}")
    try:
        a = np.asarray(tree)
    except Exception as err:  # e.g. a jax array that cannot leave its device: name the parameter
        raise TypeError(f"parameter {prefix!r} is not an array: {err}") from err
    if a.dtype.kind not in "biuf":
        # numpy's .npz keeps only its own dtypes: bfloat16 would come back as raw bytes
        raise TypeError(
            f"parameter {prefix!r} has dtype {a.dtype}, which an .npz cannot store (bool, int and numpy float "
            "dtypes only): cast the parameters to float32 first, "
            "e.g. jax.tree.map(lambda a: a.astype('float32'), params)"
        )
    out[prefix] = a


def _read_arrays(data, names, where: str, what: str = "parameter") -> dict[str, np.ndarray]:
    """The arrays ``names`` of an open ``.npz``, each refused naming it (as a ``what``) and ``where``
    when damaged or not a bool, int or float array (what :func:`save` writes; text failed later,
    unnamed)."""
    out = {}
    for name in names:
        try:
            out[name] = data[name]
        except _UNREADABLE as err:  # e.g. a CRC error
            raise ValueError(f"{where!r} is damaged: its {what} {name!r} cannot be read: {err}") from err
        if out[name].dtype.kind not in "biuf":
            raise ValueError(f"{where!r}: {what} {name!r} has dtype {out[name].dtype}, not a bool, int or float array")
    return out


def _non_finite(flat: Mapping[str, np.ndarray]) -> str:
    """The names of the float arrays of ``flat`` holding a NaN or an infinity (the first three), or ""."""
    bad = [k for k, a in flat.items() if a.dtype.kind == "f" and not np.all(np.isfinite(a))]
    return "" if not bad else f"{bad[:3]}{' ...' if len(bad) > 3 else ''}"


def _nest(flat: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """:func:`_flatten`'s inverse: ``{"a/b": x}`` -> ``{"a": {"b": x}}``."""
    tree: dict[str, Any] = {}
    for name, a in flat.items():
        node = tree
        *parents, leaf = name.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = a
    return tree


def save(path: str | os.PathLike, config: MACEConfig | NequIPConfig, params: dict[str, Any]) -> None:
    """Write ``config`` and ``params`` (a nested dict of arrays, as ``Potential.init`` gives) to ``path``."""
    check_config(config)
    arrays: dict[str, np.ndarray] = {}
    _flatten(params, "", arrays)
    if not arrays:
        raise ValueError("params holds no arrays: save the tree Potential.init gives")
    from .potential import Potential

    Potential(config).check_params(params)  # a file whose parameters its config cannot read
    bad = _non_finite(arrays)
    if bad:  # load would refuse the file
        raise ValueError(f"params holds non-finite values: {bad}")
    if "__header__" in arrays:
        raise ValueError("a parameter may not be named '__header__'")
    header = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "package_version": __version__,
        "config": config_to_dict(config),
    }
    arrays["__header__"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load(path: str | os.PathLike) -> tuple[MACEConfig | NequIPConfig, dict[str, Any]]:
    """``(config, params)`` from a file written by :func:`save`; ``ValueError`` naming the file when
    it is not one, is damaged, or holds parameters that do not fit its config or are not finite."""
    where = os.fspath(path)
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except _UNREADABLE as err:
        # numpy reads a file that is neither a zip nor a .npy array as a pickle, and its refusal
        # suggests loading it unsafely: not advice for a model file
        why = "neither a zip archive nor a .npy array" if "pickle" in str(err) else str(err)
        raise ValueError(f"{where!r} is not an e3j-models file (an .npz written by save): {why}") from err
    if not isinstance(data, np.lib.npyio.NpzFile):  # a lone .npy array
        raise ValueError(f"{where!r} is not an e3j-models file (an .npz written by save): a single array")
    with data:
        if "__header__" not in data.files:
            raise ValueError(f"{where!r} is not an e3j-models file (no __header__)")
        try:
            raw = data["__header__"]
        except _UNREADABLE as err:  # e.g. a CRC error
            raise ValueError(f"{where!r} is damaged: its __header__ cannot be read: {err}") from err
        try:
            header = json.loads(bytes(raw).decode())
        except ValueError as err:  # not UTF-8 or not JSON
            raise ValueError(f"{where!r} has an unreadable __header__ (not UTF-8 JSON): {err}") from err
        if not isinstance(header, dict):
            raise ValueError(
                f"{where!r} has a malformed __header__: a JSON object expected, got {type(header).__name__}"
            )
        if header.get("format") != FORMAT:
            raise ValueError(f"{where!r} has format {header.get('format')!r}, expected {FORMAT!r}")
        version = header.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
            raise ValueError(f"{where!r} has format_version {version!r}; this e3j-models reads up to {FORMAT_VERSION}")
        flat = _read_arrays(data, [n for n in data.files if n != "__header__"], where)
    config = header.get("config")
    if not isinstance(config, dict):
        raise ValueError(f"{where!r} has a malformed __header__: no 'config' object")
    kind = _KINDS.get(config.get("model"))
    missing = [] if kind is None else [f.name for f in dataclasses.fields(kind) if f.name not in config]
    if missing:  # save writes every field; a default in its place would be another model, silently
        raise ValueError(f"{where!r} holds a config without the fields {missing} (save writes every field)")
    try:
        config = config_from_dict(config)
    except (TypeError, ValueError) as err:  # a config its dataclass refuses (missing or bad fields)
        raise ValueError(f"{where!r} holds a config this e3j-models cannot read: {err}") from err
    from .potential import Potential

    params = _nest(flat)
    try:  # an edited header: the model would fail at its first call, naming no file
        Potential(config).check_params(params)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where!r} holds parameters that do not fit its config: {err}") from err
    bad = _non_finite(flat)
    if bad:  # a diverged run's: every energy would be NaN, and MD would blame the timestep
        raise ValueError(f"{where!r} holds non-finite parameters: {bad}")
    return config, params
