"""Training on a dataset of mixed sizes: one padded batch size for all against a size per bucket.

    python benchmarks/training_padding.py [--structures 32] [--epochs 3] [--batch-size 4]
        [--small 1 1 2] [--large 4 4 4] [--large-every 4] [--shapes 1 4] [--channels 16] [--l-max 2]
        [--json out.json]

EMT Cu–Ni structures: every ``--large-every``-th a ``--large`` supercell of the 4-atom fcc cell
(256 atoms at 4 4 4), the others ``--small`` (8 atoms), minus up to two vacancies each. For each
``--shapes`` (``fit``'s ``batch_shapes``), ``fit`` trains the same seeded batches for ``--epochs``
epochs (NequIP, ``--channels`` 16, ``--l-max`` 2, cutoff 4.5 Å: ``python -m e3j_models train``'s
defaults, in float32, on the reference backend) and the script reports the padded over real nodes
and edges of the batches trained on (``fit``'s ``history["padding"]``), the compiles (distinct batch
shapes), the whole run's wall time (compiles included), the steps' throughput in structures per
second without the steps that compiled (``history["structures_per_second"]``), and the training
losses, which padding must not change. ``--json`` writes the rows with the command, date and host.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("E3J_BACKEND", "reference")  # the CPU path, not a development test plugin

import numpy as np

from e3j._bench import provenance
from e3j_models import nequip
from e3j_models.data import emt_structures
from e3j_models.train import fit


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--structures", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--small", type=int, nargs=3, default=(1, 1, 2))
    p.add_argument("--large", type=int, nargs=3, default=(4, 4, 4))
    p.add_argument("--large-every", type=int, default=4)
    p.add_argument("--shapes", type=int, nargs="+", default=(1, 4))
    p.add_argument("--channels", type=int, default=16)
    p.add_argument("--l-max", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.epochs < 2:
        p.error("--epochs must be >= 2: the throughput leaves out each shape's first (compiling) step")
    repeats = [tuple(args.small)] * (args.large_every - 1) + [tuple(args.large)]
    structures = emt_structures(args.structures + 4, repeats=repeats)
    train, valid = structures[: args.structures], structures[args.structures :]
    steps_per_epoch = -(-len(train) // args.batch_size)
    elements = sorted({int(z) for a in structures for z in a.numbers})
    config = nequip(elements, num_channels=args.channels, l_max=args.l_max, cutoff=4.5)
    rows = []
    for shapes in args.shapes:
        t0 = time.perf_counter()
        result = fit(
            config,
            train,
            valid,
            steps=args.epochs * steps_per_epoch,
            batch_size=args.batch_size,
            batch_shapes=shapes,
            progress=False,
        )
        wall = time.perf_counter() - t0
        padding = result.history["padding"]
        rate = result.history["structures_per_second"]
        rows.append(
            {
                "batch_shapes": shapes,
                "shapes": [list(s) for s in result.history["batch_shapes"]],
                "compiles": len(result.history["batch_shapes"]),
                "atoms_per_epoch": int(sum(len(a) for a in train)),
                "padded_over_real": padding,
                "wall_s": wall,
                "structures_per_s": rate,
                "train_loss": [float(x) for x in result.history["train_loss"]],
            }
        )
        print(
            f"batch_shapes={shapes}: {rows[-1]['compiles']} shapes {rows[-1]['shapes']}, padded/real nodes "
            f"{padding['nodes']:.2f}, edges {padding['edges']:.2f}; run {wall:.1f} s, "
            f"{rate:.2f} structures/s without the compiling steps"
        )
    base = rows[0]
    for row in rows[1:]:
        same = np.allclose(row["train_loss"], base["train_loss"], rtol=1e-4)
        print(
            f"batch_shapes={row['batch_shapes']} against {base['batch_shapes']}: steps "
            f"{row['structures_per_s'] / base['structures_per_s']:.2f}x faster, whole run "
            f"{base['wall_s'] / row['wall_s']:.2f}x, losses equal to 1e-4: {same}"
        )
    if args.json:
        record = {**provenance("benchmarks/training_padding.py", argv), "backend": os.environ["E3J_BACKEND"]}
        with open(args.json, "w") as f:
            json.dump({**record, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
