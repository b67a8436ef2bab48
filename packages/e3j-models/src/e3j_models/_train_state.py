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

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._checks import is_int
from ._training_data import _config_type, _results
from ._version import __version__
from .config import config_to_dict
from .data import WEIGHT_KEYS
from .io import _UNREADABLE, _flatten, _nest, _non_finite, _read_arrays

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


#: the history's records of every step, kept in a state file as arrays of these types
_PER_STEP = {"step": np.int64, "train_loss": np.float64, "time": np.float64}


def _run_fingerprint(config, train, valid, params, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """What a resumed run must share with the run whose state it goes on from (as JSON reads it
    back): the config as given, ``arguments`` (``fit``'s that change what is trained), the number of
    training and validation structures, and SHA-256 digests of their atoms, cells, labels, weights
    and config types, and of ``params`` (a fine-tuning run's start; None from scratch)."""
    data = hashlib.sha256()
    for part in (train, valid):
        data.update(f"{len(part)};".encode())
        for atoms in part:
            res = _results(atoms)
            labels = [np.asarray(res[k], np.float64) for k in ("energy", "forces", "stress") if k in res]
            for a in (atoms.positions, atoms.numbers, np.asarray(atoms.cell), atoms.pbc, *labels):
                a = np.ascontiguousarray(a)
                data.update(f"{a.dtype.str}{a.shape};".encode())
                data.update(a.tobytes())
            data.update(repr([k for k in ("energy", "forces", "stress") if k in res]).encode())
            data.update(repr([atoms.info.get(k) for k in WEIGHT_KEYS] + [_config_type(atoms)]).encode())
    start = None
    if params is not None:
        flat: dict[str, np.ndarray] = {}
        _flatten(jax.device_get(params), "", flat)
        digest = hashlib.sha256()
        for name in sorted(flat):
            digest.update(f"{name}:{flat[name].dtype.str}{flat[name].shape};".encode())
            digest.update(np.ascontiguousarray(flat[name]).tobytes())
        start = digest.hexdigest()
    run = {
        "config": config_to_dict(config),
        **arguments,
        "train_structures": len(train),
        "valid_structures": len(valid),
        "data_sha256": data.hexdigest(),
        "params_sha256": start,
    }
    return json.loads(json.dumps(run))  # tuples as lists, as a state file holds them


def _resumed_state(path: str, run: Mapping[str, Any], flags: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The training state at ``path`` (:mod:`~e3j_models._train_state`), refused naming what
    differs when it is another run's (``run``: :func:`_run_fingerprint` of this call; ``flags``:
    see :func:`_differences`)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"state {path!r} does not exist: nothing to resume (resume=False starts the run)")
    header, params, opt_leaves, extra = load_state(path)
    theirs = header.get("run")
    if not isinstance(theirs, dict):
        raise ValueError(f"state {path!r} is malformed: its header has no 'run' object")
    differ = _differences(theirs, run, flags)
    if differ:
        raise ValueError(
            f"state {path!r} is of another run: {'; '.join(differ)} (resume with the arguments and data of the run "
            "that wrote it, or start anew)"
        )

    def tree(prefix: str):
        return _nest({n[len(prefix) :]: a for n, a in extra.items() if n.startswith(prefix)})

    step, steps = header.get("step"), run.get("steps")
    if not (is_int(step) and 0 <= step <= (steps if is_int(steps) else step)):
        # numpy's and islice's errors named neither the file nor the step
        raise ValueError(f"state {path!r} is malformed: its step {step!r} is not an int in [0, {steps}]")
    flat: dict[str, np.ndarray] = {}
    _flatten(params, "", flat)
    bad = _non_finite(flat)
    if bad:  # the resumed run would stop at once, blaming the learning rate
        raise ValueError(f"state {path!r} holds non-finite parameters: {bad}")
    try:
        return {
            "step": int(step),
            "history": {**header["history"], **{k: extra[f"history/{k}"].tolist() for k in _PER_STEP}},
            "best": np.inf if header["best"] is None else float(header["best"]),
            "elapsed": float(header["elapsed"]),
            "params": params,
            "opt_leaves": opt_leaves,
            "epoch_sums": {t: extra[f"epoch_sums/{t}"] for t in header["epoch_terms"]},
            "counted": extra["counted"],
            "ema": tree("ema/"),
            "best_params": tree("best/") or None,
        }
    except (KeyError, TypeError, ValueError) as err:  # a header or entry fit did not write
        raise ValueError(f"state {path!r} is malformed: {type(err).__name__} {err}") from None


def _differences(
    theirs: Mapping[str, Any], ours: Mapping[str, Any], flags: Mapping[str, str] | None = None
) -> list[str]:
    """What differs between two :func:`_run_fingerprint`, each with the state's value and this
    call's (the config field by field; the data and the fine-tuning start by digest). ``flags``
    (the command line's) maps a key (``"steps"``, ``"config.num_channels"``) to the flags that set
    it, named after it: ``steps (--steps): 5 there, 6 here``."""
    hashed = {"data_sha256": "the training or validation data", "params_sha256": "params (fine-tuning's start)"}
    flags = flags or {}

    def named(key: str) -> str:
        return f"{key} ({flags[key]})" if key in flags else key

    out = []
    for key in sorted(set(theirs) | set(ours)):
        a, b = theirs.get(key), ours.get(key)
        if a == b:
            continue
        if key in hashed:
            out.append(f"{hashed[key]}{f' ({flags[key]})' if key in flags else ''} differ")
        elif key == "config" and isinstance(a, dict) and isinstance(b, dict):
            out += [
                f"{named(f'config.{f}')}: {a.get(f)!r} there, {b.get(f)!r} here"
                for f in sorted(set(a) | set(b))
                if a.get(f) != b.get(f)
            ]
        else:
            out.append(f"{named(key)}: {a!r} there, {b!r} here")
    return out


def _restored_leaves(template, leaves: Sequence[np.ndarray], path: str):
    """``template`` (a pytree: the optimizer's fresh state) with ``leaves`` in its place, which must
    match it leaf for leaf in shape and dtype."""
    want, tree = jax.tree.flatten(template)
    if len(leaves) != len(want) or any(
        np.shape(a) != np.shape(b) or np.asarray(a).dtype != np.asarray(b).dtype for a, b in zip(leaves, want)
    ):
        raise ValueError(f"state {path!r} holds an optimizer state that does not match this run's optimizer")
    return jax.tree.unflatten(tree, [jnp.asarray(a) for a in leaves])
