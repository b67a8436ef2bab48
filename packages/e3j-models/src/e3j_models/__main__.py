"""Command line: ``python -m e3j_models {data,train} ...`` (``--help`` on each).

``data`` writes the deterministic EMT Cu–Ni set (:mod:`e3j_models.data`) as extxyz; ``train`` fits a
MACE or NequIP preset (:mod:`e3j_models.train`) and writes ``model.npz`` (the package's file format),
``history.json``, ``loss.png`` and ``metrics.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

_PRESETS = ("mace_a", "mace_b", "nequip")


def _data(args) -> None:
    from .data import emt_structures, write_dataset

    structures = emt_structures(args.num, seed=args.seed)
    write_dataset(args.out, structures)
    print(f"wrote {len(structures)} structures ({sum(len(a) for a in structures)} atoms) to {args.out}")


def _train(args) -> None:
    from . import config as cfgs
    from .data import read_dataset
    from .train import fit, plot_history, write_history

    structures = read_dataset(args.data)
    if args.valid_fraction <= 0 or args.valid_fraction >= 1:
        raise SystemExit(f"error: --valid-fraction must be in (0, 1), got {args.valid_fraction}")
    n_valid = max(1, round(len(structures) * args.valid_fraction))
    if len(structures) - n_valid < 1:
        raise SystemExit(f"error: --data holds {len(structures)} structures: too few to split off a validation set")
    # the split is the last structures of the file: a generated set is already in seeded random order
    train, valid = structures[:-n_valid], structures[-n_valid:]
    elements = sorted({int(z) for a in structures for z in a.numbers})
    overrides = {"num_channels": args.channels, "l_max": args.l_max, "cutoff": args.cutoff}
    if args.layers is not None:
        overrides["num_layers"] = args.layers
    if args.preset.startswith("mace"):
        overrides["radial_mlp"] = (args.radial_hidden,) * 2
        overrides["node_symmetry"] = min(args.l_max, 1 if args.preset == "mace_b" else 2)
    else:
        overrides["radial_mlp"] = (args.radial_hidden,) * 2
        overrides["node_irreps"] = "2x0e + 1o" if args.l_max == 1 else "2x0e + 1o + 2e"
    config = getattr(cfgs, args.preset)(elements, **overrides)
    os.makedirs(args.out, exist_ok=True)
    for stale in ("model.npz", "metrics.json"):
        if os.path.exists(os.path.join(args.out, stale)):
            os.remove(os.path.join(args.out, stale))
    t0 = time.perf_counter()
    result = fit(
        config,
        train,
        valid,
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        weights=(args.energy_weight, args.force_weight, args.stress_weight),
        seed=args.seed,
        backend=args.backend,
        eval_every=args.eval_every,
        checkpoint=os.path.join(args.out, "model.npz"),
    )
    seconds = time.perf_counter() - t0
    write_history(result.history, os.path.join(args.out, "history.json"))
    plot_history(result.history, os.path.join(args.out, "loss.png"))
    best = min(result.history["valid"], key=lambda v: v["force_mae"]) if result.history["valid"] else result.validation
    metrics = {
        "preset": args.preset,
        "command": " ".join(sys.argv),
        "train_structures": len(train),
        "valid_structures": len(valid),
        "wall_seconds": seconds,
        "final_validation": result.validation,
        "checkpoint_validation": best,
        "parameters": int(sum(x.size for x in __import__("jax").tree.leaves(result.params))),
    }
    # metrics.json last: its presence says the run completed
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    print(json.dumps(metrics, indent=1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m e3j_models")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("data", help="generate the EMT Cu-Ni dataset (extxyz)")
    p.add_argument("--num", type=int, default=200, help="number of structures")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output .extxyz path")
    p.set_defaults(func=_data)

    p = sub.add_parser("train", help="train a MACE or NequIP preset on energies and forces")
    p.add_argument("--data", required=True, help="extxyz with energy/forces (python -m e3j_models data)")
    p.add_argument("--preset", choices=_PRESETS, default="mace_a")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--channels", type=int, default=16)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--l-max", type=int, default=2)
    p.add_argument("--cutoff", type=float, default=4.5)
    p.add_argument("--radial-hidden", type=int, default=32)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--energy-weight", type=float, default=1.0)
    p.add_argument("--force-weight", type=float, default=1.0)
    p.add_argument("--stress-weight", type=float, default=0.0)
    p.add_argument("--valid-fraction", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--backend", default=None, help="e3j backend name, or 'e3nn' for the e3nn-jax twin")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_train)

    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from err


if __name__ == "__main__":
    main()
