"""The reference tensor product with a broadcast operand: unrolled records against the dense form.

A call where one operand has no channels (the forward with spherical harmonics ``y``, its ``dx``
with ``y`` broadcast, and ``dy`` summed over the channels) runs either dense (the broadcast operand
contracted with the dense table into a per-row matrix, then one batched matrix product) or with the
records unrolled; ``e3j.reference.tensor_product._unrolling_pays`` picks one from the ratio of the
dense form's multiply-adds to the records'. This times both forms of each direction on products
from mixed-multiplicity message passing (gcd copies; one ``x`` irrep per call), few-channel
drop-ins and NequIP-like sizes, interleaved (``e3j._bench.interleaved``), float32, compile
excluded, and prints the ratio and which form the rule picks.

    python benchmarks/reference_broadcast_forms.py --json benchmarks/results/cpu-reference-broadcast-forms.json
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from e3j._bench import host_info, interleaved
from e3j.reference import tensor_product as ref_tp
from e3j_core import tensor_product_coo

CASES = [  # (irreps_x, irreps_y, filter, channels)
    ("4x0e + 2x1o + 1x2e", "0e + 1o + 2e + 3o", "0e + 1o + 2e", 16),
    ("1o", "0e + 1o + 2e + 3o", "0e + 1o + 2e", 32),
    ("2e", "0e + 1o + 2e + 3o", "0e + 1o + 2e", 16),
    ("0e + 1o + 2e", "0e + 1o + 2e", "0e + 1o + 2e", 1),
    ("0e + 1o + 2e + 3o", "0e + 1o + 2e + 3o", "0e + 1o + 2e + 3o", 8),
    ("0e + 1o + 2e + 3o + 4e", "0e + 1o + 2e + 3o + 4e", "0e + 1o + 2e + 3o + 4e", 2),
    ("0e + 1o + 2e", "0e + 1o + 2e + 3o", "0e + 1o + 2e + 3o", 32),
    ("0e + 1o", "0e + 1o + 2e", "0e + 1o + 2e", 64),
]
FORMS = {  # direction: (which table, a_channels, b_channels, out_channels)
    "forward": ("table", True, False, True),
    "dx": ("vjp_x", False, True, True),
    "dy": ("vjp_y", True, True, False),
}


def _compiled(table, form, operands, unrolled: bool):
    """``apply_table`` compiled with the given form forced."""
    saved = (ref_tp._unrolling_pays, ref_tp._DENSE_LIMIT)
    ref_tp._unrolling_pays = lambda *_: unrolled
    if unrolled:
        ref_tp._DENSE_LIMIT = 0  # no dense form: the unrolled records
    try:
        ac, bc, oc = form
        fn = jax.jit(lambda a, b: ref_tp.apply_table(table, a, b, a_channels=ac, b_channels=bc, out_channels=oc))
        return fn.lower(*operands).compile()
    finally:
        ref_tp._unrolling_pays, ref_tp._DENSE_LIMIT = saved


def measure(case, rows: int, runs: int, rounds: int) -> list[dict]:
    irreps_x, irreps_y, filter_, channels = case
    coo = tensor_product_coo(irreps_x, irreps_y, filter_)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(rows, coo.dim_x, channels)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(rows, coo.dim_y)), jnp.float32)
    dz = jnp.asarray(rng.normal(size=(rows, coo.dim_out, channels)), jnp.float32)
    operands = {"forward": (x, y), "dx": (y, dz), "dy": (x, dz)}
    out = []
    for direction, (name, *form) in FORMS.items():
        table, ops = getattr(coo, name), operands[direction]
        fns = {kind: (_compiled(table, form, ops, kind == "unrolled"), ops) for kind in ("dense", "unrolled")}
        best = interleaved(fns, runs, rounds)
        row = {"x": irreps_x, "y": irreps_y, "filter": filter_, "channels": channels, "rows": rows}
        row.update({"direction": direction, "records": table.num_records})
        row["dense_over_records_work"] = round(
            ref_tp._dense_work(table.dims, channels, tuple(form)) / (table.num_records * channels), 1
        )
        row.update({f"{k}_ms": round(v * 1e3, 3) for k, v in best.items()})
        row["dense_over_unrolled"] = round(best["dense"] / best["unrolled"], 2)
        row["rule_picks"] = "unrolled" if ref_tp._unrolling_pays(table, channels, tuple(form)) else "dense"
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[400, 4000])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    rows = [r for case in CASES for n in args.rows for r in measure(case, n, args.runs, args.rounds)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"unit": "ms", "host": host_info(), "command": " ".join(sys.argv), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
