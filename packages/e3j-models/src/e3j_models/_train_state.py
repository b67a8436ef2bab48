"""``fit``'s training state on disk: what a run needs to go on from where it stopped.

One ``.npz`` (no pickle), written through a temp file renamed over the old one, so that a run
killed while writing leaves the previous state whole:

- ``__header__``: UTF-8 JSON as a ``uint8`` array: ``{"format": "e3j-models-train-state",
  "format_version": 1, "package_version": ..., "run": {...}, "step": ..., ...}``; ``run`` is the
  run's fingerprint (its arguments and a hash of its data), which a resumed run must match, and the
  rest is ``fit``'s bookkeeping (steps done, history, best validation, elapsed time);
- ``params/...``: the parameters, named as :func:`e3j_models.save` names them;
- ``opt_state/<k>``: the optimizer state's leaves in ``jax.tree.leaves`` order (the tree is rebuilt
  from ``optimizer.init(params)``, so the file holds no Python objects);
- ``extra/<name>``: other arrays of the bookkeeping.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._version import __version__
from .io import _UNREADABLE, _flatten, _nest, _read_arrays

FORMAT = "e3j-models-train-state"
#: bumped when the layout or the meaning of an entry changes
FORMAT_VERSION = 1


def save_state(path: str, header: Mapping[str, Any], params, opt_leaves, extra: Mapping[str, np.ndarray]) -> None:
    """Write a state file at ``path`` atomically (``header``: JSON-able bookkeeping)."""
    arrays: dict[str, np.ndarray] = {}
    _flatten({"params": params}, "", arrays)
    for k, leaf in enumerate(opt_leaves):
        arrays[f"opt_state/{k}"] = np.asarray(leaf)
    for name, a in extra.items():
        arrays[f"extra/{name}"] = np.asarray(a)
    full = {"format": FORMAT, "format_version": FORMAT_VERSION, "package_version": __version__, **header}
    arrays["__header__"] = np.frombuffer(json.dumps(full).encode(), np.uint8)
    tmp = path + ".partial"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())  # on disk before it replaces the state a crash would fall back to
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, path)


def load_state(path: str) -> tuple[dict[str, Any], dict[str, Any], list[np.ndarray], dict[str, np.ndarray]]:
    """``(header, params, opt_leaves, extra)`` from a file :func:`save_state` wrote; ``ValueError``
    naming ``path`` for anything else (``FileNotFoundError`` when there is none)."""
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except _UNREADABLE as err:
        raise ValueError(f"{path!r} is not a training state (an .npz fit writes): {err}") from err
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"{path!r} is not a training state (an .npz fit writes): a single array")
    with data:
        if "__header__" not in data.files:
            raise ValueError(f"{path!r} is not a training state (no __header__)")
        try:
            header = json.loads(bytes(data["__header__"]).decode())
        except (*_UNREADABLE, UnicodeDecodeError) as err:
            raise ValueError(f"{path!r} has an unreadable __header__: {err}") from err
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            found = header.get("format") if isinstance(header, dict) else type(header).__name__
            raise ValueError(f"{path!r} has format {found!r}, expected {FORMAT!r} (fit's state, not a model file)")
        if header.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{path!r} has format_version {header.get('format_version')!r}; this e3j-models reads {FORMAT_VERSION}"
            )
        arrays = _read_arrays(data, [n for n in data.files if n != "__header__"], path, "entry")
    params = _nest({n[len("params/") :]: a for n, a in arrays.items() if n.startswith("params/")})
    opt = {int(n.split("/")[1]): a for n, a in arrays.items() if n.startswith("opt_state/")}
    if sorted(opt) != list(range(len(opt))):
        raise ValueError(f"{path!r} is damaged: its optimizer state's leaves are {sorted(opt)}")
    extra = {n[len("extra/") :]: a for n, a in arrays.items() if n.startswith("extra/")}
    return header, params, [opt[k] for k in range(len(opt))], extra
