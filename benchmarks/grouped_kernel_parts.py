"""A backend's grouped kernels against the groups' own kernels, forward and backward apart.

Splits the array drop-in's conversion share (``benchmarks/interop_message_passing.py``) between the
two sweeps, for one backend's kernels (``--backend``, default the reference): ``grouped_convolution``
(e3nn's flat ``x``, ``[E, num_weights]`` weights read in place, e3nn's output) against one
``convolution`` per group on operands already in the groups' layouts, and
``grouped_convolution_bwd`` (cotangents of ``x``, ``y`` and the weights) against one
``convolution_bwd`` per group. Each share is ``1 - groups / grouped``: the median (and quartiles)
over ``--pairs`` alternated single calls, jitted, float32, 27 neighbours per node. On a GPU the
same: what the grouped route costs beyond the groups' kernels (on Mosaic GPU,
``e3j_pallas_gpu.mosaic_convolution.reads_in_place`` says which groups read e3nn's weights in
place; all three of the default plan do).

    python benchmarks/grouped_kernel_parts.py --nodes 1000 3000 --pairs 60
    python benchmarks/grouped_kernel_parts.py --backend pallas_mosaic --nodes 3000 10000 --json out.json
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
from interop_message_passing import case, paired_share

import e3j


def measure(n: int, pairs: int, backend: str = "reference") -> dict:
    mp, x, sh, w, senders, receivers = case(n, 27, "64x0e + 32x1o + 16x2e", 3, "0e + 1o + 2e", jnp.float32)
    graph = e3j.Graph.from_edges(senders, receivers, n)
    plan, y = mp.plan, sh.array
    groups = plan.groups
    dm = jnp.asarray(np.random.default_rng(0).normal(size=(n, plan.irreps_out.dim)), jnp.float32)
    xs, dms, ss = plan.split_x(x.array), plan.split_out(dm), [g.split_weights(w) for g in groups]
    outs = ("x", "y", "s")
    rc = e3j.backends.kernels_of(e3j.backends.get_backend(backend))

    @jax.jit
    def grouped_fwd(x, y, s, graph):
        return rc.grouped_convolution(plan, x, y, s, graph)

    @jax.jit
    def groups_fwd(xs, y, ss, graph):
        return [rc.convolution(g.coo, a, y, b, graph, y_channels=False) for g, a, b in zip(groups, xs, ss)]

    @jax.jit
    def grouped_bwd(x, y, s, dm, graph):
        return rc.grouped_convolution_bwd(plan, x, y, s, dm, graph, outs=outs)

    @jax.jit
    def groups_bwd(xs, y, ss, dms, graph):
        return [
            rc.convolution_bwd(g.coo, a, y, b, d, graph, outs=outs, y_channels=False)
            for g, a, b, d in zip(groups, xs, ss, dms)
        ]

    fwd = paired_share((grouped_fwd, (x.array, y, w, graph)), (groups_fwd, (xs, y, ss, graph)), pairs)
    bwd = paired_share((grouped_bwd, (x.array, y, w, dm, graph)), (groups_bwd, (xs, y, ss, dms, graph)), pairs)
    return {"backend": backend, "nodes": n, "edges": int(senders.shape[0]), "pairs": pairs, "fwd": fwd, "bwd": bwd}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 3000])
    parser.add_argument("--pairs", type=int, default=60)
    parser.add_argument("--backend", default="reference", help="the e3j backend whose kernels are timed")
    parser.add_argument("--json", help="also write the rows here (each row as it is measured)")
    args = parser.parse_args(argv)
    rows = []
    for n in args.nodes:
        rows.append(measure(n, args.pairs, args.backend))
        print(json.dumps(rows[-1]), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": jax.devices()[0].device_kind, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
