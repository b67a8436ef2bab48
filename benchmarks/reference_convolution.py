"""The reference backend's convolution on this machine's CPU: value and value + gradient.

Message passing at mixed multiplicities (``64x0e + 32x1o + 16x2e`` ⊗ spherical harmonics ``0e..3o``
-> ``0e + 1o + 2e``, ``--neighbours`` random edges per node, float32, all jitted, compile excluded)
in the two shapes a caller can run it as:

- ``gcd``: one convolution at the channels' gcd (``4x0e + 2x1o + 1x2e`` with C = 16, 27 paths);
- ``mult``: one convolution per multiplicity (``0e`` with C = 64, ``1o`` with C = 32, ``2e`` with
  C = 16), summed.

``--baseline FILE`` also times the kernels of another copy of ``e3j/reference/convolution.py`` (for
instance ``git show main:packages/e3j-ops/src/e3j/reference/convolution.py > /tmp/old.py``) in the
same interleaved rounds, and ``--e3nn`` times e3nn-jax's gather / tensor product / scatter on the
same operands. Each time is the best round's mean of its fastest 20 % of calls; rounds interleave
every variant so that load from other processes on a shared machine falls on all alike.

    python benchmarks/reference_convolution.py --nodes 1000 3000 --baseline /tmp/old.py --e3nn
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import e3j
from e3j import backends
from e3j._bench import host_info, interleaved

SH = "0e + 1o + 2e + 3o"
FILTER = "0e + 1o + 2e"
SHAPES = {"gcd": [("4x0e + 2x1o + 1x2e", 16)], "mult": [("0e", 64), ("1o", 32), ("2e", 16)]}


def _operands(shape: str, num_nodes: int, neighbours: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    num_edges = num_nodes * neighbours
    senders = rng.integers(0, num_nodes, num_edges)
    receivers = rng.integers(0, num_nodes, num_edges)
    graph = e3j.Graph.from_edges(senders, receivers, num_nodes)
    sh = e3j.spherical_harmonics(SH, jnp.asarray(rng.normal(size=(num_edges, 3)), jnp.float32), True)
    convs, xs, ss = [], [], []
    for irreps_x, channels in SHAPES[shape]:
        conv = e3j.Convolution(irreps_x, SH, FILTER)
        convs.append(conv)
        xs.append(jnp.asarray(rng.normal(size=(num_nodes, conv.coo.dim_x, channels)), jnp.float32))
        ss.append(jnp.asarray(rng.normal(size=(num_edges, conv.num_paths, channels)), jnp.float32))
    return convs, (tuple(xs), sh, tuple(ss), graph)


def _functions(convs):
    def value(xs, y, ss, graph):
        return [conv(x, y, s, graph) for conv, x, s in zip(convs, xs, ss)]

    def loss(xs, y, ss, graph):
        return sum(jnp.sum(m * m) for m in value(xs, y, ss, graph))

    return jax.jit(value), jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _e3nn_functions(convs, senders, receivers, num_nodes):
    import e3nn_jax as e3nn

    def value(xs, y, ss):
        out = []
        for conv, x, s in zip(convs, xs, ss):
            irreps = e3nn.Irreps([(mul * x.shape[-1], ir) for mul, ir in e3nn.Irreps(str(conv.coo.irreps_x))])
            xm = e3nn.IrrepsArray(irreps, e3j.to_mul_ir(x, conv.coo.irreps_x))
            z = e3nn.tensor_product(xm[senders], e3nn.IrrepsArray(SH, y), filter_ir_out=FILTER)
            # one weight per path and channel, as e3j's s (e3nn's chunks are [E, mul, d], Σ mul = P * C)
            w, parts, start = s.reshape(s.shape[0], -1), [], 0
            for c in z.chunks:
                parts.append((c * w[:, start : start + c.shape[1], None]).reshape(c.shape[0], -1))
                start += c.shape[1]
            assert start == w.shape[1]
            msg = jnp.concatenate(parts, axis=1)
            out.append(e3nn.scatter_sum(msg, dst=receivers, output_size=num_nodes))
        return out

    def loss(xs, y, ss):
        return sum(jnp.sum(m * m) for m in value(xs, y, ss))

    return jax.jit(value), jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _load_kernels(path: str) -> backends.Kernels:
    spec = importlib.util.spec_from_file_location("e3j.reference._baseline_convolution", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ref = backends._kernels("reference")
    return dataclasses.replace(ref, convolution=module.convolution, convolution_bwd=module.convolution_bwd)


def _compiled_with(kernels, fns, ops):
    """Compile ``fns`` on ``ops`` with the reference backend's convolution kernels set to ``kernels``."""
    original = backends._kernels
    backends._kernels = lambda name: kernels if name == "reference" else original(name)
    try:
        return [f.lower(*ops).compile() for f in fns]
    finally:
        backends._kernels = original


def measure(shape: str, num_nodes: int, args) -> dict:
    convs, ops = _operands(shape, num_nodes, args.neighbours)
    # fresh jitted functions per variant: jit caches lowerings, which would hide the swapped kernels
    variants = {"e3j": _compiled_with(backends._kernels("reference"), _functions(convs), ops)}
    if args.baseline:
        variants["baseline"] = _compiled_with(_load_kernels(args.baseline), _functions(convs), ops)
    calls = {}
    for name, (v, g) in variants.items():
        calls[f"{name}_fwd"] = (v, ops)
        calls[f"{name}_fwd_bwd"] = (g, ops)
    if args.e3nn:
        graph = ops[3]
        v, g = _e3nn_functions(convs, graph.senders, graph.receivers, num_nodes)
        calls["e3nn_fwd"] = (v, ops[:3])
        calls["e3nn_fwd_bwd"] = (g, ops[:3])
    best = interleaved(calls, args.runs, args.rounds)
    row = {"shape": shape, "nodes": num_nodes, "edges": num_nodes * args.neighbours}
    row.update({f"{k}_ms": round(v * 1e3, 2) for k, v in best.items()})
    for other in ("baseline", "e3nn"):
        for kind in ("fwd", "fwd_bwd"):
            if f"{other}_{kind}" in best:
                row[f"speedup_{kind}_vs_{other}"] = round(best[f"{other}_{kind}"] / best[f"e3j_{kind}"], 2)
    print(json.dumps(row), flush=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 3000])
    parser.add_argument("--neighbours", type=int, default=27)
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--baseline", help="another copy of e3j/reference/convolution.py to time alongside")
    parser.add_argument("--e3nn", action="store_true", help="also time e3nn-jax on the same operands")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    with e3j.use_backend("reference"):
        rows = [measure(shape, n, args) for n in args.nodes for shape in args.shapes]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"unit": "ms", "host": host_info(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
