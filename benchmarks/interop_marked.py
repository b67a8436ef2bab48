"""The message-passing drop-in on node features with blocks marked zero, against e3nn-jax.

A first layer as e3nn-jax models build it: scalars embedded into ``--irreps`` by
``e3nn.flax.Linear(..., force_irreps_out=True)``, which marks the irreps it cannot reach
(``zero_flags``); e3nn-jax then skips their products. Times, interleaved in one process (best of
``--rounds`` rounds), value and value-and-gradient (with respect to the node features, edge
attributes and weights), float32, the reference backend's kernels on the CPU:

- ``e3nn``: the e3nn-jax pattern on the marked features (it skips the marked blocks' products);
- ``e3j``: ``e3j.interop.MessagePassing`` on the same marked features (it skips them too);
- ``e3j_unmarked``: the drop-in on the same values without marks (every product run; what the
  drop-in did before it read the marks).

With ``--pattern functional``, NequIP's original convolution instead
(``scatter_sum(vmap(tp.left_right)(w, x[senders], sh))``, ``tp`` as
``interop_functional.nequip_tp`` builds it) against ``e3j.interop.FunctionalMessagePassing``: there
e3nn-jax computes the marked blocks' products (``vmap`` drops the marks), with zeros.

The marks are made inside each program (``e3nn.from_chunks`` with ``None``): they are static and do
not cross ``jit``'s boundary.

    python benchmarks/interop_marked.py --nodes 1000 --backend reference [--pattern functional]
"""

from __future__ import annotations

import argparse
import json

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
from interop_functional import nequip_tp
from interop_message_passing import case

import e3j
from e3j import interop
from e3j._bench import interleaved, provenance


def programs(n: int, neighbours: int, irreps: str, lmax: int, filter_ir_out: str, backend: str | None,
             pattern: str = "message_passing") -> dict:  # fmt: skip
    mp, x, sh, w, senders, receivers = case(n, neighbours, irreps, lmax, filter_ir_out, jnp.float32)
    graph = e3j.Graph.from_edges(senders, receivers, n)
    if pattern == "functional":
        tp = nequip_tp(irreps, sh.irreps, filter_ir_out)
        fmp = interop.FunctionalMessagePassing(tp)
        w = jnp.asarray(np.random.default_rng(1).normal(size=(w.shape[0], fmp.num_weights)), jnp.float32)
    irreps_x = x.irreps
    marks = [ir.l > 0 for _, ir in irreps_x]  # the blocks a Linear from scalars cannot reach

    def marked(a):
        a = e3nn.IrrepsArray(irreps_x, a)
        return e3nn.from_chunks(irreps_x, [None if z else c for c, z in zip(a.chunks, marks)], a.shape[:-1], a.dtype)

    def e3nn_pattern(a, b, c):
        if pattern == "functional":
            m = jax.vmap(tp.left_right)(c, marked(a)[senders], e3nn.IrrepsArray(sh.irreps, b))
            return e3nn.scatter_sum(m, dst=receivers, output_size=n).array
        m = e3nn.tensor_product(marked(a)[senders], e3nn.IrrepsArray(sh.irreps, b), filter_ir_out=filter_ir_out)
        return e3nn.scatter_sum(m * c, dst=receivers, output_size=n).array

    op = fmp if pattern == "functional" else mp

    def drop_in(a, b, c):
        return op(marked(a), e3nn.IrrepsArray(sh.irreps, b), c, graph=graph, backend=backend).array

    def unmarked(a, b, c):
        # the same values (the marked blocks zeroed) with no marks: every product is run
        zeroed = marked(a).array
        return op(e3nn.IrrepsArray(irreps_x, zeroed), e3nn.IrrepsArray(sh.irreps, b), c, graph=graph,
                  backend=backend).array  # fmt: skip

    ops = (x.array, sh.array, w)
    progs = {}
    for name, f in (("e3nn", e3nn_pattern), ("e3j", drop_in), ("e3j_unmarked", unmarked)):
        progs[f"{name}_fwd"] = (jax.jit(f), ops)
        loss = lambda a, b, c, f=f: jnp.sum(jnp.sin(f(a, b, c)))  # noqa: E731
        progs[f"{name}_fwd_bwd"] = (jax.jit(jax.value_and_grad(loss, (0, 1, 2))), ops)
    return progs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000])
    parser.add_argument("--neighbours", type=int, default=27)
    parser.add_argument("--irreps", default="64x0e + 32x1o + 16x2e")
    parser.add_argument("--lmax", type=int, default=3)
    parser.add_argument("--filter", default="0e + 1o + 2e")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pattern", choices=["message_passing", "functional"], default="message_passing")
    parser.add_argument("--backend", default=None, help="e3j backend (default: selected per platform)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    rows = []
    for n in args.nodes:
        progs = programs(n, args.neighbours, args.irreps, args.lmax, args.filter, args.backend, args.pattern)
        ref, got = (jax.jit(progs[k][0])(*progs[k][1]) for k in ("e3nn_fwd", "e3j_fwd"))
        err = float(jnp.max(jnp.abs(got - ref)) / jnp.max(jnp.abs(ref)))
        t = interleaved(progs, args.runs, args.rounds)
        row = {"pattern": args.pattern, "nodes": n, "edges": n * args.neighbours, "irreps": args.irreps,
               "max_rel_err_vs_e3nn": err}  # fmt: skip
        row.update({k: round(v * 1e3, 3) for k, v in t.items()})
        for part in ("fwd", "fwd_bwd"):
            row[f"speedup_{part}"] = round(t[f"e3nn_{part}"] / t[f"e3j_{part}"], 2)
            row[f"skipping_gain_{part}"] = round(t[f"e3j_unmarked_{part}"] / t[f"e3j_{part}"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            record = provenance("benchmarks/interop_marked.py", argv)
            json.dump({**record, "device": jax.devices()[0].device_kind, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
