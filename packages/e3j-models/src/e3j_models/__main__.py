"""Command line: ``python -m e3j_models {data,train,md} ...`` (``--help`` on each).

``data`` writes the deterministic EMT Cu–Ni set (:mod:`e3j_models.data`) as extxyz; ``train`` fits a
MACE or NequIP preset (:mod:`e3j_models.train`) and writes ``model.npz`` (the package's file format),
``history.json``, ``loss.png`` and ``metrics.json`` into ``--out``; ``md`` runs NVE / NVT / NPT
(:mod:`e3j_models.md`) with a checkpoint and writes ``trajectory.extxyz``, ``md.png`` and
``md.json`` (written last: its presence says the run completed) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import sys
import time

import numpy as np

_PRESETS = ("mace_a", "mace_b", "nequip")


class _DefaultsHelpFormatter(argparse.HelpFormatter):
    """Each option's default in its help, but for ``None`` (its help says what happens then) and
    for switches (``--float32``: off unless given), help text or not."""

    def _get_help_string(self, action):
        if action.default in (None, argparse.SUPPRESS) or action.nargs == 0 or not action.option_strings:
            return action.help
        return f"{action.help} (default: %(default)s)" if action.help else "default: %(default)s"


def _requires(command: str) -> None:
    """The train extra's modules a command uses, checked before it does anything."""
    from ._optional import require

    modules = {
        "data": ("ase",),
        "train": ("ase", "optax", "tqdm", "matplotlib"),
        "md": ("ase.md.nose_hoover_chain", "tqdm", "matplotlib"),
        "test": ("ase",),
    }
    for module in modules[command]:
        require(module, f"python -m e3j_models {command}", "train")


def _data(args) -> None:
    from .data import dataset_format, emt_structures, write_dataset

    if os.path.isdir(args.out):  # the dataset is one file
        raise ValueError(f"--out {args.out!r} is a directory: name the extxyz file to write")
    try:
        dataset_format(args.out)  # before the structures are computed
    except ValueError as err:
        raise ValueError(f"--out: {err}") from None
    folder = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"--out {args.out!r}: its folder {folder!r} does not exist")
    structures = emt_structures(args.num, seed=args.seed)
    write_dataset(args.out, structures)
    print(f"wrote {len(structures)} structures ({sum(len(a) for a in structures)} atoms) to {args.out}")


def _write_json(obj, path: str, indent: int | None = None) -> None:
    """``obj`` as strict JSON (``null`` for a NaN or infinite number: a bare ``NaN``, as Python's
    ``json`` writes it, is refused by jq and JavaScript's ``JSON.parse``)."""

    def strict(o):
        if isinstance(o, float) and not math.isfinite(o):
            return None
        if isinstance(o, dict):
            return {k: strict(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [strict(v) for v in o]
        return o

    with open(path, "w") as f:
        json.dump(strict(obj), f, indent=indent, allow_nan=False)


def _check_out(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--out {path!r} exists and is not a directory")


def _make_out(path: str, stale: tuple[str, ...]) -> None:
    """Make ``--out`` and remove a previous run's ``stale`` files: only once every argument is checked,
    so that a refused command leaves the previous run's files as they were."""
    os.makedirs(path, exist_ok=True)
    for name in stale:
        if os.path.exists(os.path.join(path, name)):
            os.remove(os.path.join(path, name))


def _named_in_files(message: str, names: dict) -> str:
    """``message`` of the training checks with each ``train[k]`` / ``valid[k]`` named by its file
    and place there (``names``: part -> (flag, each structure's index in that file)); a message
    that names no structure is said of ``--data``.

    >>> _named_in_files("valid[1] has no forces", {"valid": ("--data", [4, 9])})
    '--data structure 9 (validation) has no forces'
    """

    def named(m: re.Match) -> str:
        flag, index = names[m[1]]
        return f"{flag} structure {index[int(m[2])]}" + (
            " (validation)" if m[1] == "valid" and flag == "--data" else ""
        )

    out = re.sub(r"\b(train|valid)\[(\d+)\]", named, message)
    return out if out != message else f"--data: {message}"


#: the flags of ``train`` that set each of fit's arguments and config fields a resumed run must
#: share with the run that wrote its state (named when a state is refused)
_RESUME_FLAGS = {
    "steps": "--steps",
    "batch_size": "--batch-size",
    "batch_shapes": "--batch-shapes",
    "learning_rate": "--lr",
    "weights": "--energy-weight, --force-weight, --stress-weight",
    "seed": "--seed",
    "eval_every": "--eval-every",
    "factored_radial": "--array-radial",
    "ema_decay": "--ema-decay",
    "config_type_weights": "--config-type-weights",
    "train_structures": "--data, --valid-file, --valid-fraction, --e0s",
    "valid_structures": "--data, --valid-file, --valid-fraction, --e0s",
    "data_sha256": "--data, --valid-file, --valid-fraction, --seed, --e0s, the label keys",
    "config.model": "--preset",
    "config.num_channels": "--channels",
    "config.num_layers": "--layers",
    "config.l_max": "--l-max",
    "config.cutoff": "--cutoff",
    "config.radial_mlp": "--radial-hidden",
    "config.node_symmetry": "--preset, --l-max",
    "config.node_irreps": "--l-max",
    "config.correlation": "--preset",
    "config.atomic_numbers": "--data, --valid-file",
    "config.atomic_energies": "--e0s, --data",
    "config.avg_num_neighbors": "--data, --cutoff",
}


def _train(args) -> None:
    from . import Potential
    from . import config as cfgs
    from ._checks import check_int
    from ._history import plot_history, write_history
    from ._loss import _selection_metric
    from ._training_data import _check_training_data, _check_type_weights, _config_type, isolated_atom_energies
    from .train import _check_weights, fit

    # checked before anything is read or made, and named as the command line names them
    if not (math.isfinite(args.lr) and args.lr > 0):  # a negative rate climbs the loss
        raise SystemExit(f"error: --lr must be > 0, got {args.lr}")
    if args.eval_every < 0:
        raise SystemExit(f"error: --eval-every must be >= 0 (0: no validation during training), got {args.eval_every}")
    check_int("--steps", args.steps, 1)
    check_int("--batch-size", args.batch_size, 1)
    check_int("--batch-shapes", args.batch_shapes, 1)
    check_int("--state-every", args.state_every, 1)
    if args.ema_decay is not None and not 0 < args.ema_decay < 1:
        raise SystemExit(f"error: --ema-decay must be in (0, 1), got {args.ema_decay}")
    type_weights = None
    if args.config_type_weights is not None:  # mace-torch's --config_type_weights: a JSON object
        try:
            type_weights = json.loads(args.config_type_weights)
        except ValueError as err:
            example = '{"Default": 1.0, "slab": 2.0}'
            raise SystemExit(f"error: --config-type-weights is not JSON ({err}): give e.g. '{example}'") from None
        if not isinstance(type_weights, dict):
            raise SystemExit(
                "error: --config-type-weights must be a JSON object of config types to weights, "
                f"got {args.config_type_weights}"
            )
        _check_type_weights(type_weights, None, "--config-type-weights")  # the types: once --data is read
    weights = (args.energy_weight, args.force_weight, args.stress_weight)
    flags = ("--energy-weight", "--force-weight", "--stress-weight")
    _check_weights(weights, flags)
    if not 0 < args.valid_fraction < 1:
        raise SystemExit(f"error: --valid-fraction must be in (0, 1), got {args.valid_fraction}")
    _check_out(args.out)
    state = os.path.join(args.out, "state.npz")
    if args.resume and not os.path.isfile(state):
        raise SystemExit(f"error: --resume: {state} does not exist (the run to go on from writes it)")
    structures = _read_data(args)
    in_file = list(range(len(structures)))  # each structure's index in --data
    valid_file = None if args.valid_file is None else _read_data(args, args.valid_file)
    if type_weights is not None:  # the types of the files, before the split (which a seed draws)
        _check_type_weights(type_weights, [*structures, *(valid_file or [])], "--config-type-weights")
    e0 = None
    if args.e0s == "isolated":  # the isolated atoms give the reference energies and do not train
        e0, others = isolated_atom_energies(structures)
        kept = {id(a) for a in others}
        in_file = [k for k, a in enumerate(structures) if id(a) in kept]
        structures = others
        if not structures:
            raise SystemExit("error: --data holds only isolated atoms: nothing to train on")
    if args.valid_file is not None:  # a validation set of its own (mace-torch's --valid_file)
        train, valid = structures, valid_file
        names = {"train": ("--data", in_file), "valid": ("--valid-file", range(len(valid)))}
    else:
        n_valid = max(1, round(len(structures) * args.valid_fraction))
        if len(structures) - n_valid < 1:
            raise SystemExit(f"error: --data holds {len(structures)} structures: too few to split off a validation set")
        # a random split, seeded (mace-torch's): a file sorted by configuration type validates on all types
        held = np.sort(np.random.default_rng(args.seed).permutation(len(structures))[:n_valid])
        kept = np.setdiff1d(np.arange(len(structures)), held)
        train, valid = [structures[k] for k in kept], [structures[k] for k in held]
        names = {"train": ("--data", [in_file[k] for k in kept]), "valid": ("--data", [in_file[k] for k in held])}
    if type_weights is not None:  # a type of isolated atoms alone (--e0s isolated) trains no structure
        present = {_config_type(a) for a in [*train, *valid]} | {"Default"}
        type_weights = {k: v for k, v in type_weights.items() if k in present}
    elements = sorted({int(z) for a in [*train, *valid] for z in a.numbers})
    _check_elements_trained(elements, train, valid, names["valid"], args.valid_file is not None)
    overrides = {"num_channels": args.channels, "l_max": args.l_max, "cutoff": args.cutoff}
    if args.layers is not None:
        overrides["num_layers"] = args.layers
    overrides["radial_mlp"] = (args.radial_hidden,) * 2
    preset = getattr(cfgs, args.preset)
    if args.preset.startswith("mace"):  # the preset's node symmetry, capped by --l-max
        overrides["node_symmetry"] = min(args.l_max, preset(elements).node_symmetry)
    else:
        overrides["node_irreps"] = {0: "2x0e", 1: "2x0e + 1o"}.get(args.l_max, "2x0e + 1o + 2e")
    if e0 is not None:
        missing = [z for z in elements if z not in e0]
        if missing:
            raise SystemExit(f"error: --e0s isolated: --data has no isolated atom of element(s) {missing}")
        overrides["atomic_energies"] = tuple(e0[z] for z in elements)
    try:
        config = preset(elements, **overrides)
    except (TypeError, ValueError) as err:  # a config field refused: named by the flag that set it
        field = str(err).split(" ", 1)[0]
        flag = _RESUME_FLAGS.get(f"config.{field}")
        raise ValueError(f"{flag}: {err}" if flag else str(err)) from err
    try:
        Potential(config, args.backend)  # the backend checked now, before --out is touched
    except ValueError as err:
        raise ValueError(f"--backend: {err}") from err
    try:  # fit takes the graphs the checks built: each neighbour list is built once
        checked = _check_training_data(
            config,
            train,
            weights,
            valid,
            type_weights=type_weights,
            names=flags,
            type_weights_name="--config-type-weights",
        )
    except ValueError as err:
        raise ValueError(_named_in_files(str(err), names)) from err
    # history.json and loss.png of an earlier run are rewritten at the end. A resumed run removes
    # nothing (fit may yet refuse the state); what it ends with is rewritten then
    if not args.resume:
        _make_out(args.out, ("model.npz", "metrics.json", "history.json", "loss.png", "state.npz"))
    t0 = time.perf_counter()
    result = fit(
        config,
        train,
        valid,
        steps=args.steps,
        batch_size=args.batch_size,
        batch_shapes=args.batch_shapes,
        learning_rate=args.lr,
        weights=weights,
        seed=args.seed,
        backend=args.backend,
        factored_radial=not args.array_radial,
        eval_every=args.eval_every,
        checkpoint=os.path.join(args.out, "model.npz"),
        state=state,
        state_every=args.state_every,
        resume=args.resume,
        ema_decay=args.ema_decay,
        config_type_weights=type_weights,
        _checked=checked,
        _flags=_RESUME_FLAGS,
    )
    seconds = time.perf_counter() - t0
    write_history(result.history, os.path.join(args.out, "history.json"))
    plot_history(result.history, os.path.join(args.out, "loss.png"))
    evaluations = result.history["valid"]
    best = min(evaluations, key=lambda v: v[_selection_metric(v)]) if evaluations else result.validation
    metrics = {
        "preset": args.preset,
        "command": "python -m e3j_models " + shlex.join(args.argv),
        "train_structures": len(train),
        "valid_structures": len(valid),
        "wall_seconds": seconds,
        "final_validation": result.validation,
        "checkpoint_validation": best,
        "parameters": int(sum(x.size for x in __import__("jax").tree.leaves(result.params))),
    }
    # metrics.json last: its presence says the run completed
    _write_json(metrics, os.path.join(args.out, "metrics.json"), indent=1)
    print(json.dumps(metrics, indent=1))


def _structure(args):
    if args.structure is not None:
        from ase.io import read

        if not os.path.exists(args.structure):
            raise FileNotFoundError(f"--structure {args.structure!r} does not exist")
        try:
            return read(args.structure)
        except Exception as err:  # ASE raises many types for unreadable files
            raise ValueError(f"--structure {args.structure!r} is not readable by ase.io.read: {err}") from err
    from .systems import cuni_fcc

    return cuni_fcc(args.supercell, seed=args.seed)


def _md(args) -> None:
    from . import Calculator, Potential, load
    from ._checks import check_positive_real, check_real
    from .md import check_ensemble, check_temperature, check_velocities, plot_md, run_md
    from .neighbours import check_structure

    if not args.float32:
        import jax

        # the calculator's float64 needs JAX's 64-bit mode, off by default; this is the program's entry
        jax.config.update("jax_enable_x64", True)
    if not os.path.exists(args.model):
        raise FileNotFoundError(f"--model {args.model!r} does not exist")
    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    # checked before --out is made, and named as the command line names them
    if args.log_every < 1:
        raise ValueError(f"--log-every must be >= 1, got {args.log_every}")
    check_positive_real("--timestep", args.timestep, " (fs)")
    check_temperature(args.temperature, args.ensemble, "--temperature")
    check_real("--pressure", args.pressure, None, " (GPa)")
    if args.pressure != 0 and args.ensemble != "npt":
        raise ValueError(f"--pressure applies to --ensemble npt only, got --ensemble {args.ensemble}")
    if args.structure is None and args.supercell < 1:
        raise ValueError(f"--supercell must be >= 1, got {args.supercell}")
    if args.keep_velocities and args.structure is None:
        raise ValueError(
            "--keep-velocities needs --structure (a frame with momenta: a previous run's trajectory.extxyz)"
        )
    _check_out(args.out)
    try:
        config, params = load(args.model)
    except ValueError as err:
        raise ValueError(f"--model: {err}") from err
    atoms = _structure(args)
    unknown = sorted({int(z) for z in atoms.numbers} - set(config.atomic_numbers))
    if unknown:
        raise ValueError(
            f"the structure holds atomic numbers {unknown} that the model {args.model!r} does not know "
            f"(it knows {list(config.atomic_numbers)})"
        )
    check_ensemble(atoms, args.ensemble)
    velocities = "keep" if args.keep_velocities else "thermalize"
    if args.keep_velocities and not atoms.has("momenta"):
        raise ValueError(
            f"--keep-velocities: --structure {args.structure!r} has no momenta (a previous run's "
            "trajectory.extxyz has them)"
        )
    try:
        check_velocities(atoms, velocities)
    except ValueError as err:
        raise ValueError(f"--structure {args.structure!r}: {err}") from err
    try:
        pot = Potential(config, args.backend, factored_radial=not args.array_radial)
    except ValueError as err:
        raise ValueError(f"--backend: {err}") from err
    dtype = np.float32 if args.float32 else np.float64
    try:  # what the calculator would refuse at its first call, before the previous run's files go
        check_structure(atoms, config.atomic_numbers, config.cutoff, dtype=dtype)
    except ValueError as err:
        raise ValueError(f"{'--structure' if args.structure is not None else 'the structure'}: {err}") from err
    calc = Calculator(pot, params, dtype=dtype)
    _make_out(args.out, ("md.json", "trajectory.extxyz", "md.png"))
    log = run_md(
        atoms,
        calc,
        args.ensemble,
        steps=args.steps,
        timestep_fs=args.timestep,
        temperature_K=args.temperature,
        pressure_GPa=args.pressure,
        seed=args.seed,
        log_every=args.log_every,
        trajectory=os.path.join(args.out, "trajectory.extxyz"),
        velocities=velocities,
    )
    plot_md(log, os.path.join(args.out, "md.png"), f"{args.ensemble.upper()}, {len(atoms)} atoms")
    etot = log["total_energy"]
    summary = {
        "command": "python -m e3j_models " + shlex.join(args.argv),
        "atoms": len(atoms),
        "ensemble": args.ensemble,
        "backend": args.backend or "e3j",
        "steps": args.steps,
        "timestep_fs": args.timestep,
        "velocities": velocities,
        "ms_per_step": log["ms_per_step"],
        "ns_per_day": log["ns_per_day"],
        "mean_temperature_K": float(np.mean(log["temperature"][len(etot) // 2 :])),
        "total_energy_drift_eV_per_atom": float((etot[-1] - etot[0]) / len(atoms)),
        "total_energy_max_deviation_eV_per_atom": float(np.max(np.abs(etot - etot[0])) / len(atoms)),
        "log": {k: v.tolist() for k, v in log.items() if isinstance(v, np.ndarray)},
    }
    _write_json(summary, os.path.join(args.out, "md.json"))  # the volume of an open structure is null
    print(json.dumps({k: v for k, v in summary.items() if k != "log"}, indent=1))


def _check_elements_trained(elements, train, valid, valid_names, own_file: bool) -> None:
    """The model's elements are the data's; one held only by validation structures has no training
    structure to fit its reference energy from. Named here with those structures and the flags that
    move them (fit's own message suggests editing atomic_numbers, which the command line builds)."""
    from ._training_data import absent_elements

    only = absent_elements(elements, train)
    if not only:
        return
    file, index = valid_names
    holders = [int(index[k]) for k, a in enumerate(valid) if {int(z) for z in a.numbers} & set(only)]
    more = f" (and {len(holders) - 10} more)" if len(holders) > 10 else ""
    fix = (
        "move structures holding them into --data"
        if own_file
        else "another --seed or a smaller --valid-fraction draws some of them for training"
    )
    raise SystemExit(
        f"error: element(s) {only} occur only in validation structures ({file} structure(s) "
        f"{holders[:10]}{more}): no training structure fits their reference energies; {fix}"
    )


def _test(args) -> None:
    from . import Potential, load
    from ._checks import check_int, check_output_path
    from .train import evaluate_structures

    check_int("--batch-size", args.batch_size, 1)
    if args.out is not None:
        check_output_path("--out", args.out)
    try:
        config, params = load(args.model)
    except ValueError as err:
        raise ValueError(f"--model: {err}") from err
    import jax

    if any(np.asarray(a).dtype == np.float64 for a in jax.tree.leaves(params)):
        # a float64 checkpoint (fit(dtype=np.float64)'s) is scored in float64, which needs JAX's
        # 64-bit mode, off by default; this is the program's entry, as for md
        jax.config.update("jax_enable_x64", True)
    try:
        potential = Potential(config, args.backend)
    except ValueError as err:
        raise ValueError(f"--backend: {err}") from err
    structures = _read_data(args)
    try:
        metrics = evaluate_structures(potential, params, structures, batch_size=args.batch_size)
    except ValueError as err:  # structures[k] is --data's structure k (read_dataset keeps them all)
        named = re.sub(r"\bstructures\[(\d+)\]", r"--data structure \1", str(err))
        if named == str(err):
            raise
        raise ValueError(named) from err
    record = {"command": "python -m e3j_models " + shlex.join(args.argv), "model": args.model, "data": args.data}
    record |= metrics
    if args.out is not None:
        _write_json(record, args.out, indent=1)
    print(json.dumps(record, indent=1))


def _add_backend(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend", default=None, help="e3j backend name, or 'e3nn' for the e3nn-jax twin (default: e3j's choice)"
    )


def _add_label_keys(p: argparse.ArgumentParser) -> None:
    """The names of --data's labels (read_dataset's keys), as train and test take them."""
    p.add_argument(
        "--energy-key", default="energy", help="--data's energy label (e.g. REF_energy, in atoms.info; free_energy)"
    )
    p.add_argument("--forces-key", default="forces", help="--data's forces label (e.g. REF_forces, in atoms.arrays)")
    p.add_argument("--stress-key", default="stress", help="--data's stress label (e.g. REF_stress, in atoms.info)")
    p.add_argument("--virials-key", default=None, help="--data's virials (e.g. REF_virials), read as stress -W/V")


def _read_data(args, path: str | None = None) -> list:
    """``--data`` (or ``path``) read with the label keys given."""
    from .data import read_dataset

    keys = {k: getattr(args, k) for k in ("energy_key", "forces_key", "stress_key", "virials_key")}
    return read_dataset(args.data if path is None else path, **keys)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m e3j_models")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("data", help="generate the EMT Cu-Ni dataset (extxyz)", formatter_class=_DefaultsHelpFormatter)
    p.add_argument("--num", type=int, default=200, help="number of structures")
    p.add_argument("--seed", type=int, default=0, help="draws the structures")
    p.add_argument("--out", required=True, help="output .extxyz path (.traj: an ASE trajectory)")
    p.set_defaults(func=_data)

    p = sub.add_parser(
        "train",
        help="train a MACE or NequIP preset on energies and forces",
        formatter_class=_DefaultsHelpFormatter,
    )
    p.add_argument("--data", required=True, help="extxyz with energy/forces (python -m e3j_models data)")
    _add_label_keys(p)
    p.add_argument(
        "--preset",
        choices=_PRESETS,
        default="mace_a",
        help="the architecture; its sizes come from the flags below, not from the paper's Table 3",
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--channels", type=int, default=16, help="channels per irrep")
    p.add_argument("--layers", type=int, default=None, help="interaction layers (default: the preset's)")
    p.add_argument("--l-max", type=int, default=2, help="largest degree of the spherical harmonics")
    p.add_argument("--cutoff", type=float, default=4.5, help="Å")
    p.add_argument("--radial-hidden", type=int, default=32, help="width of the radial MLP's 2 hidden layers")
    p.add_argument("--steps", type=int, default=500, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=4, help="structures per batch")
    p.add_argument(
        "--batch-shapes",
        type=int,
        default=4,
        help="most padded batch sizes (each compiles the training step once; 1: one size for all)",
    )
    p.add_argument("--lr", type=float, default=5e-3, help="peak learning rate (Adam, cosine decay)")
    p.add_argument("--energy-weight", type=float, default=1.0, help="loss weight of the energy per atom")
    p.add_argument("--force-weight", type=float, default=1.0, help="loss weight of the forces")
    p.add_argument("--stress-weight", type=float, default=0.0, help="loss weight of the stress")
    p.add_argument(
        "--valid-fraction", type=float, default=0.1, help="share of --data held out, drawn at random (--seed)"
    )
    p.add_argument(
        "--valid-file", default=None, help="a validation set of its own (labels as --data's); all of --data trains"
    )
    p.add_argument(
        "--e0s",
        choices=("fit", "isolated"),
        default="fit",
        help="reference energies: least squares on the training energies, or --data's isolated atoms (not trained on)",
    )
    p.add_argument("--eval-every", type=int, default=100, help="validate every so many steps (0: never)")
    _add_backend(p)
    p.add_argument(
        "--array-radial",
        action="store_true",
        help="multiply the radial MLP's output out before each convolution (factored_radial=False)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="draws the parameters, the validation split and each epoch's batches"
    )
    p.add_argument(
        "--config-type-weights",
        default=None,
        help="the structures' weights by atoms.info['config_type'], a JSON object (mace-torch's): "
        '\'{"Default": 1, "slab": 2}\'',
    )
    p.add_argument(
        "--ema-decay",
        type=float,
        default=None,
        help="validate and save a moving average of the parameters (mace-torch's --ema_decay, e.g. 0.99)",
    )
    p.add_argument(
        "--state-every", type=int, default=100, help="write the training state (--out/state.npz) every so many steps"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="go on from --out/state.npz (a stopped run: the same command, checked) to the same end",
    )
    p.set_defaults(func=_train)

    p = sub.add_parser(
        "md",
        help="molecular dynamics (NVE, NVT Langevin, NPT MTK) with a checkpoint",
        formatter_class=_DefaultsHelpFormatter,
    )
    p.add_argument("--model", required=True, help="checkpoint written by train (model.npz)")
    p.add_argument("--structure", default=None, help="ASE-readable structure file (default: an fcc Cu-Ni supercell)")
    p.add_argument("--supercell", type=int, default=4, help="fcc repeats n: 4·n³ atoms (without --structure)")
    p.add_argument("--ensemble", choices=("nve", "nvt", "npt"), default="nve", help="NVE, NVT (Langevin) or NPT (MTK)")
    p.add_argument("--steps", type=int, default=100, help="time steps")
    p.add_argument("--timestep", type=float, default=2.0, help="fs")
    p.add_argument("--temperature", type=float, default=300.0, help="K")
    p.add_argument("--pressure", type=float, default=0.0, help="GPa (npt)")
    p.add_argument("--log-every", type=int, default=1, help="log every so many steps")
    _add_backend(p)
    p.add_argument(
        "--array-radial",
        action="store_true",
        help="multiply the radial MLP's output out before each convolution (factored_radial=False)",
    )
    p.add_argument("--float32", action="store_true", help="evaluate the model in float32 (default float64)")
    p.add_argument(
        "--keep-velocities",
        action="store_true",
        help="start from --structure's momenta (the last frame of a previous run's trajectory.extxyz "
        "continues that run) instead of drawing them at --temperature",
    )
    p.add_argument("--seed", type=int, default=0, help="draws the initial velocities and the Langevin noise")
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(func=_md)

    p = sub.add_parser(
        "test",
        help="a checkpoint's errors on a labelled data file (energy, forces, stress: MAE and RMSE)",
        formatter_class=_DefaultsHelpFormatter,
    )
    p.add_argument("--model", required=True, help="checkpoint written by train (model.npz)")
    p.add_argument("--data", required=True, help="ASE-readable file with energy/forces (as train's --data)")
    _add_label_keys(p)
    p.add_argument("--batch-size", type=int, default=4, help="structures per batch")
    _add_backend(p)
    p.add_argument("--out", default=None, help="also write the metrics here (JSON)")
    p.set_defaults(func=_test)

    args = parser.parse_args(argv)
    # the command as given, also when called as main([...]) (sys.argv is then the caller's)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        from ._checks import check_int

        # the counts several commands share, named by their flags (numpy would say "expected
        # non-negative integer" of a negative seed)
        for dest, flag, least in (("seed", "--seed", 0), ("num", "--num", 1)):
            if hasattr(args, dest):
                check_int(flag, getattr(args, dest), least)
        _requires(args.command)
        args.func(args)
    except (OSError, ValueError, ImportError, FloatingPointError) as err:  # OSError: files, FileNotFoundError
        raise SystemExit(f"error: {err}") from err


if __name__ == "__main__":
    main()
