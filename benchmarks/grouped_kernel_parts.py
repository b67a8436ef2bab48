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
place, and ``on_triton`` which groups its grouped kernels give to the Triton kernels: those of at
most 64 channels, so ``--backend pallas_mosaic`` times ``MOSAIC_IRREPS``, whose groups are Mosaic's).

With ``--weights factored`` (the reference only): its ``grouped_convolution_factored`` kernels (the
weights ``h [E, 64] @ k [64, num_weights]`` computed chunk by chunk in the sweep; cotangents of
``x``, ``y``, ``h`` and ``k``) against the same sweeps on operands already in the groups' layouts
(``x`` split, the output and its cotangent left per group): the share is exactly the layout
conversions, since the groups' own kernels would multiply the weights out (a different amount of
work).

With ``--profile CALLS`` (XLA's CPU) it also says where each share goes: a ``jax.profiler`` trace of ``CALLS``
interleaved calls of the four programs in one process, each fusion's time (CPU time: summed over
XLA's threads) per call, fusions of one kind (the name less its number) summed, grouped against
groups side by side. Fusion names are XLA's; read them with the programs' optimized HLO
(``jax.jit(f).lower(...).compile().as_text()``).

    python benchmarks/grouped_kernel_parts.py --nodes 1000 3000 --pairs 60
    python benchmarks/grouped_kernel_parts.py --backend pallas_mosaic --nodes 3000 10000 --json out.json
    taskset -c 0 python benchmarks/grouped_kernel_parts.py --nodes 1000 --pairs 0 --profile 10
"""

from __future__ import annotations

import argparse
import bisect
import collections
import datetime
import glob
import json
import re
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from interop_message_passing import case, paired_share

import e3j
from e3j._bench import host_info

#: the node features of the case timed by default; pallas_mosaic's grouped kernels run groups of at
#: most 64 channels on the Triton kernels (mosaic_convolution.on_triton), so its own are timed at
#: MOSAIC_IRREPS, whose groups are all Mosaic's
IRREPS = "64x0e + 32x1o + 16x2e"
MOSAIC_IRREPS = "256x0e + 128x1o"


def programs(n: int, backend: str = "reference", irreps: str = IRREPS) -> dict:
    """``{"grouped_fwd" | "groups_fwd" | "grouped_bwd" | "groups_bwd": (jitted function, operands)}``."""
    mp, x, sh, w, senders, receivers = case(n, 27, irreps, 3, "0e + 1o + 2e", jnp.float32)
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

    return {
        "grouped_fwd": (grouped_fwd, (x.array, y, w, graph)),
        "groups_fwd": (groups_fwd, (xs, y, ss, graph)),
        "grouped_bwd": (grouped_bwd, (x.array, y, w, dm, graph)),
        "groups_bwd": (groups_bwd, (xs, y, ss, dms, graph)),
    }


def factored_programs(n: int, hidden: int = 64) -> dict:
    """As :func:`programs` for the reference's factored grouped kernels; ``groups_*`` are the same
    sweeps on operands in the groups' layouts (the reference's private sweep cores)."""
    from e3j.reference import convolution as ref

    mp, x, sh, _, senders, receivers = case(n, 27, IRREPS, 3, "0e + 1o + 2e", jnp.float32)
    graph = e3j.Graph.from_edges(senders, receivers, n)
    plan, y = mp.plan, sh.array
    rng = np.random.default_rng(0)
    dm = jnp.asarray(rng.normal(size=(n, plan.irreps_out.dim)), jnp.float32)
    h = jnp.asarray(rng.normal(size=(graph.num_edges, hidden)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(hidden, plan.num_weights)) / np.sqrt(hidden), jnp.float32)
    xs, dms = plan.split_x(x.array), plan.split_out(dm)
    outs = ("x", "y", "h", "k")

    def weights(h, k, graph):
        return ref._FactoredWeights.of_plan(plan, h, k, graph.num_edges, hidden)

    @jax.jit
    def grouped_fwd(x, y, h, k, graph):
        return ref.grouped_convolution_factored(plan, x, y, h, k, graph)

    @jax.jit
    def groups_fwd(xs, y, h, k, graph):
        return ref._grouped_sweep(plan.groups, xs, y, weights(h, k, graph), graph)

    @jax.jit
    def grouped_bwd(x, y, h, k, dm, graph):
        return ref.grouped_convolution_factored_bwd(plan, x, y, h, k, dm, graph, outs=outs)

    @jax.jit
    def groups_bwd(xs, y, h, k, dms, graph):
        return ref._grouped_bwd_sweep(plan.groups, xs, y, dms, graph, outs, weights(h, k, graph))

    return {
        "grouped_fwd": (grouped_fwd, (x.array, y, h, k, graph)),
        "groups_fwd": (groups_fwd, (xs, y, h, k, graph)),
        "grouped_bwd": (grouped_bwd, (x.array, y, h, k, dm, graph)),
        "groups_bwd": (groups_bwd, (xs, y, h, k, dms, graph)),
    }


def measure(n: int, pairs: int, backend: str = "reference", progs: dict | None = None, weights: str = "array") -> dict:
    p = progs or (programs(n, backend) if weights == "array" else factored_programs(n))
    fwd = paired_share(p["grouped_fwd"], p["groups_fwd"], pairs)
    bwd = paired_share(p["grouped_bwd"], p["groups_bwd"], pairs)
    graph = p["grouped_fwd"][1][-1]
    return {
        "backend": backend,
        "weights": weights,
        "nodes": n,
        "edges": graph.num_edges,
        "pairs": pairs,
        "fwd": fwd,
        "bwd": bwd,
    }


def profile(progs: dict, calls: int) -> dict:
    """``{program: {fusion kind: ms per call}}`` from a trace of ``calls`` interleaved calls of each.

    A fusion's event is charged to the call whose ``block_until_ready`` it precedes: the calls run
    one after another, so every event of one call's execution falls between the end of the previous
    call's wait and the end of its own."""
    from jax.profiler import ProfileData

    for f, ops in progs.values():
        jax.block_until_ready(f(*ops))
    names = []
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(calls):
                for name, (f, ops) in progs.items():
                    jax.block_until_ready(f(*ops))
                    names.append(name)
        (path,) = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
        data = ProfileData.from_file(path)
    waits, events = [], []
    for plane in data.planes:
        for line in plane.lines:
            for ev in line.events:
                if line.name == "python" and "block_until_ready" in ev.name:
                    waits.append(ev.start_ns + ev.duration_ns)
                elif "XLA" in line.name and "::" not in ev.name and not ev.name.startswith(("while", "end:")):
                    # XLA's CPU threads: one event per fusion or other thunk (``::``: the executor's
                    # own scopes, which contain them; ``while``: loops, whose bodies' thunks count)
                    events.append((ev.start_ns, ev.duration_ns, ev.name))
    waits.sort()
    if len(waits) != len(names):
        raise RuntimeError(f"the trace has {len(waits)} waits for {len(names)} calls")
    starts = [0, *waits[:-1]]
    kinds = {name: collections.Counter() for name in progs}
    for start, duration, name in events:
        i = bisect.bisect_right(starts, start) - 1
        if 0 <= i and start < waits[i]:
            kinds[names[i]][re.sub(r"\.\d+$", "", name)] += duration
    return {p: {k: round(ns / 1e6 / calls, 2) for k, ns in c.most_common()} for p, c in kinds.items()}


def print_profile(prof: dict, top: int = 16) -> None:
    for sweep in ("fwd", "bwd"):
        a, b = prof[f"grouped_{sweep}"], prof[f"groups_{sweep}"]
        print(f"{sweep}: ms per call, grouped {sum(a.values()):.1f}, groups {sum(b.values()):.1f}")
        for kind in sorted(set(a) | set(b), key=lambda k: -max(a.get(k, 0), b.get(k, 0)))[:top]:
            print(f"  {kind:36s} {a.get(kind, 0):8.2f} {b.get(kind, 0):8.2f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 3000])
    parser.add_argument("--pairs", type=int, default=60)
    parser.add_argument("--backend", default="reference", help="the e3j backend whose kernels are timed")
    parser.add_argument(
        "--weights",
        choices=("array", "factored"),
        default="array",
        help="the weights as e3nn's [E, num_weights] array, or as hidden @ kernel (the reference's factored kernels)",
    )
    parser.add_argument(
        "--irreps",
        default=None,
        help=f"the node features (default {IRREPS!r}; with --backend pallas_mosaic {MOSAIC_IRREPS!r})",
    )
    parser.add_argument("--json", help="also write the rows here (each row as it is measured)")
    parser.add_argument("--profile", type=int, default=0, metavar="CALLS", help="also profile CALLS calls of each")
    args = parser.parse_args(argv)
    if args.weights == "factored" and args.backend != "reference":
        parser.error("--weights factored times the reference's kernels only (--backend reference)")
    if args.irreps is not None and args.weights == "factored":
        parser.error("--irreps: the factored case is fixed (--weights array takes it)")
    irreps = args.irreps or (MOSAIC_IRREPS if args.backend == "pallas_mosaic" else IRREPS)
    if args.backend == "pallas_mosaic":
        from e3j_pallas_gpu.mosaic_convolution import on_triton

        triton = [g.channels for g in case(1, 1, irreps, 3, "0e + 1o + 2e", jnp.float32)[0].plan.groups if on_triton(g)]
        if triton:  # the grouped call would run them on the Triton kernels, the groups' own on Mosaic's
            parser.error(f"--irreps: pallas_mosaic's grouped kernels give the groups of {triton} channels to Triton")
    head = {
        "device": jax.devices()[0].device_kind,
        "command": "python benchmarks/grouped_kernel_parts.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "jax": jax.__version__,
        "host": host_info(),
        "irreps": irreps if args.weights == "array" else IRREPS,
    }
    rows = []
    for n in args.nodes:
        progs = programs(n, args.backend, irreps) if args.weights == "array" else factored_programs(n)
        row = (
            measure(n, args.pairs, args.backend, progs, args.weights)
            if args.pairs
            else {"backend": args.backend, "nodes": n}
        )
        if args.profile:
            row["profile_ms"] = profile(progs, args.profile)
            print_profile(row["profile_ms"])
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "profile_ms"}), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({**head, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
