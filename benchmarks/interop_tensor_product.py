"""``e3j.interop.tensor_product`` against ``e3nn_jax.tensor_product`` on Allegro's product, in one run.

Allegro (allegro-jax) multiplies each edge's features in e3nn's ``mul_to_axis`` layout: both operands
``[E, C, irreps]`` with every multiplicity 1, ``input1`` the weighted spherical harmonics
``0e .. lmax``, ``input2`` the edge features ``0o + 1o + 1e + 2e + 2o (+ 3o + 3e)``, filtered to
``0e + input2``. ``--broadcast`` also times ``input2`` as ``[E, 1, irreps]`` (one row for all
channels). Float32; the value and the gradient of ``sum(sin(z))`` with respect to both operands, all
jitted, on the reference backend, timed in ``--rounds`` interleaved rounds (best round's mean of
its fastest 20 % of calls).

    python benchmarks/interop_tensor_product.py [--edges 2500] [--channels 16 32] [--lmax 2 3] [--json F]

Prints one JSON row per case; ``--json`` also writes them with the command, date and host.
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

from e3j import interop
from e3j._bench import provenance, versus_e3nn


def _irreps(lmax: int) -> tuple[e3nn.Irreps, e3nn.Irreps]:
    harmonics = e3nn.Irreps.spherical_harmonics(lmax)
    features = e3nn.Irreps("0o + 1o + 1e + 2e + 2o" + (" + 3o + 3e" if lmax >= 3 else ""))
    return harmonics, features


def measure(edges: int, channels: int, lmax: int, y_rows: int, runs: int, rounds: int) -> dict:
    """One row: both libraries' value and gradient for ``[edges, channels, .]`` operands (``input2``
    with ``y_rows`` rows per edge: ``channels``, or 1 broadcast)."""
    ix, iy = _irreps(lmax)
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.normal(size=(edges, channels, ix.dim)), jnp.float32)
    b = jnp.asarray(rng.normal(size=(edges, y_rows, iy.dim)), jnp.float32)
    filter_ = "0e + " + str(iy)

    def ours(a, b):
        x, y = e3nn.IrrepsArray(ix, a), e3nn.IrrepsArray(iy, b)
        return interop.tensor_product(x, y, filter_ir_out=filter_, backend="reference").array

    def theirs(a, b):
        return e3nn.tensor_product(e3nn.IrrepsArray(ix, a), e3nn.IrrepsArray(iy, b), filter_ir_out=filter_).array

    err = float(jnp.abs(ours(a, b) - theirs(a, b)).max() / jnp.abs(theirs(a, b)).max())
    row = {"edges": edges, "channels": channels, "input1": str(ix), "input2": f"[E, {y_rows}, {iy}]"}
    return {**row, "max_rel_diff": err, **versus_e3nn(ours, theirs, (a, b), runs, rounds)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=int, default=2500)
    parser.add_argument("--channels", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--lmax", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--broadcast", action="store_true", help="also input2 as [E, 1, irreps]")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", help="also write the rows here, with the command, date and host")
    args = parser.parse_args(argv)
    record = provenance("benchmarks/interop_tensor_product.py", argv)
    rows = []
    for lmax in args.lmax:
        for channels in args.channels:
            for y_rows in (channels, 1) if args.broadcast else (channels,):
                rows.append(measure(args.edges, channels, lmax, y_rows, args.runs, args.rounds))
                print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({**record, "jax": jax.__version__, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
