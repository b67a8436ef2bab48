"""``e3j.spherical_harmonics`` against ``e3nn_jax.spherical_harmonics`` on this machine, in one run.

Random edge vectors ``[E, 3]`` (float32, ``normalize=True``), irreps ``0e + 1o + ... + lmax``; the value
and the gradient of ``sum(sin(Y))`` with respect to the vectors (what a force computation runs), all
jitted, timed in ``--rounds`` interleaved rounds (best round's mean of its fastest 20 % of calls).

    python benchmarks/spherical_harmonics_vs_e3nn.py [--edges 54000] [--lmax 3 6 ...] [--runs 200] [--json F]

Prints one JSON row per lmax; ``--json`` also writes them with the command, date and host.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np

import e3j
from e3j._bench import provenance, versus_e3nn


def measure(edges: int, lmax: int, runs: int, rounds: int) -> dict:
    """One row: both libraries' value and gradient at ``lmax`` on ``edges`` random vectors."""
    irreps = " + ".join(f"{l}{'e' if l % 2 == 0 else 'o'}" for l in range(lmax + 1))
    v = jnp.asarray(np.random.default_rng(0).normal(size=(edges, 3)), jnp.float32)

    def ours(v):
        return e3j.spherical_harmonics(irreps, v, True)

    def theirs(v):
        return e3nn.spherical_harmonics(irreps, v, True).array

    err = float(jnp.abs(ours(v) - theirs(v)).max())
    return {"edges": edges, "irreps": irreps, "max_abs_diff": err, **versus_e3nn(ours, theirs, (v,), runs, rounds)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=int, default=54_000)
    parser.add_argument("--lmax", type=int, nargs="+", default=[3])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", help="also write the rows here, with the command, date and host")
    args = parser.parse_args(argv)
    record = provenance("benchmarks/spherical_harmonics_vs_e3nn.py", argv)
    rows = []
    for lmax in args.lmax:
        rows.append(measure(args.edges, lmax, args.runs, args.rounds))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({**record, "jax": jax.__version__, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
