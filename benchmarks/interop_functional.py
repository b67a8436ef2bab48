"""The fused ``e3j.interop.FunctionalMessagePassing`` against e3nn-jax's legacy ``FunctionalTensorProduct``.

NequIP's original convolution: ``tp = FunctionalTensorProduct(irreps_x, sh, irreps_mid, instructions)``
with one ``uvu`` instruction per ``(x irrep, sh irrep, output irrep in --filter)`` (NequIP's own
construction, output sorted), ``scatter_sum(vmap(tp.left_right)(w, x[senders], sh), dst=receivers)``.
Random graph, ``--neighbours`` edges per node, float32, jitted, value and value + gradient (node
features, edge attributes, weights), on the backend e3j selects (``--backend`` to choose; on a CPU
with test plugins installed, give ``--backend reference``). Also timed with a prebuilt graph, and
the same product with every path weight 1 (``gradient_normalization="element"``), which skips the
static multiply of the output columns by the instructions' path weights: the difference is that
multiply's cost. All variants are timed in interleaved rounds (``e3j._bench.interleaved``).
With ``--pairs N`` also the conversions' share of the call with a prebuilt graph, paired (as
``interop_message_passing.paired_share``) against "ops alone": each of ``fmp.ops``' convolutions
on operands already in its layout (node features split, weights taken and scaled, outputs left per
op), the baseline ``interop_message_passing.py`` uses for ``MessagePassing``'s groups. Where the
backend has grouped kernels the drop-in runs all ops in one call reading the weights in place, so
the share can be negative.

    python benchmarks/interop_functional.py --nodes 1000 --runs 20 --backend reference
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
from e3nn_jax.legacy import FunctionalTensorProduct
from interop_message_passing import paired_share

import e3j
from e3j import interop
from e3j._bench import interleaved, provenance
from e3j.layout import from_mul_ir


def nequip_tp(irreps_x, irreps_sh, filter_ir_out, **kwargs) -> FunctionalTensorProduct:
    """NequIP's convolution tensor product: one ``uvu`` instruction per allowed output, output sorted."""
    irreps_x, irreps_sh, allowed = e3nn.Irreps(irreps_x), e3nn.Irreps(irreps_sh), e3nn.Irreps(filter_ir_out)
    irreps_mid, instructions = [], []
    for i, (mul, ir_in) in enumerate(irreps_x):
        for j, (_, ir_edge) in enumerate(irreps_sh):
            for ir_out in ir_in * ir_edge:
                if ir_out in allowed:
                    instructions.append((i, j, len(irreps_mid), "uvu", True))
                    irreps_mid.append((mul, ir_out))
    irreps_mid, p, _ = e3nn.Irreps(irreps_mid).sort()
    instructions = [(i1, i2, p[i_out], mode, train) for i1, i2, i_out, mode, train in instructions]
    return FunctionalTensorProduct(irreps_x, irreps_sh, irreps_mid, instructions, **kwargs)


def measure(n: int, args) -> dict:
    rng = np.random.default_rng(0)
    num_edges = n * args.neighbours
    senders = jnp.asarray(rng.integers(0, n, num_edges), jnp.int32)
    receivers = jnp.asarray(np.sort(rng.integers(0, n, num_edges)), jnp.int32)
    irreps_sh = e3nn.Irreps.spherical_harmonics(args.lmax)
    tp = nequip_tp(args.irreps, irreps_sh, args.filter)
    tp_unit = nequip_tp(args.irreps, irreps_sh, args.filter, gradient_normalization="element")
    fmp, fmp_unit = interop.FunctionalMessagePassing(tp), interop.FunctionalMessagePassing(tp_unit)
    assert all((op.scale != 1).any() for op in fmp.ops) and all((op.scale == 1).all() for op in fmp_unit.ops)
    x = jnp.asarray(rng.normal(size=(n, tp.irreps_in1.dim)), jnp.float32)
    sh = e3nn.spherical_harmonics(irreps_sh, jnp.asarray(rng.normal(size=(num_edges, 3)), jnp.float32), True).array
    w = jnp.asarray(rng.normal(size=(num_edges, fmp.num_weights)), jnp.float32)
    graph = e3j.Graph.from_edges(senders, receivers, n)

    def ref(xa, ya, wa, senders, receivers):
        m = jax.vmap(tp.left_right)(wa, e3nn.IrrepsArray(tp.irreps_in1, xa)[senders], e3nn.IrrepsArray(irreps_sh, ya))
        return e3nn.scatter_sum(m, dst=receivers, output_size=n).array

    def fused(xa, ya, wa, senders, receivers):
        return fmp(e3nn.IrrepsArray(tp.irreps_in1, xa), ya, wa, senders, receivers).array

    def with_graph(f):
        return lambda xa, ya, wa, g: f(e3nn.IrrepsArray(tp.irreps_in1, xa), ya, wa, graph=g).array

    def grad_of(f):
        return jax.jit(jax.value_and_grad(lambda *a: jnp.sum(f(*a)), argnums=(0, 1, 2)))

    operands = {
        "e3nn": (ref, (x, sh, w, senders, receivers)),
        "e3j": (fused, (x, sh, w, senders, receivers)),
        "e3j_graph": (with_graph(fmp), (x, sh, w, graph)),
        "e3j_graph_unit_weights": (with_graph(fmp_unit), (x, sh, w, graph)),
    }
    a, b = jax.jit(ref)(*operands["e3nn"][1]), jax.jit(fused)(*operands["e3j"][1])
    err = float(jnp.abs(a - b).max() / jnp.abs(a).max())
    jitted = {}
    for name, (f, ops) in operands.items():
        jitted[f"{name}_fwd"] = (jax.jit(f), ops)
        jitted[f"{name}_fwd_bwd"] = (grad_of(f), ops)
    times = interleaved(jitted, args.runs, args.rounds)
    platform = e3j.backends.device_platform(jax.devices()[0])
    request = e3j.backends.OpRequest("convolution", platform, "float32", fmp.ops[0].channels, args.lmax)
    row = {
        "nodes": n,
        # the backend e3j selected (a plugin of higher priority may displace the reference on a CPU)
        # and whether it runs all the ops in one call (one sweep reading the weights in place)
        "backend": (selected := e3j.backends.select_backend(request, args.backend)).name,
        "grouped_kernels": e3j.backends.kernels_of(selected).provides("grouped_convolution"),
        "edges": num_edges,
        "tp": repr(tp),
        "ops": [[op.channels, op.conv.num_paths] for op in fmp.ops],
        "max_rel_err_vs_e3nn": err,
        **{k: round(v * 1e3, 3) for k, v in times.items()},
        "speedup_fwd": round(times["e3nn_fwd"] / times["e3j_fwd"], 2),
        "speedup_fwd_bwd": round(times["e3nn_fwd_bwd"] / times["e3j_fwd_bwd"], 2),
        # the static multiply by the path weights, as a share of the call with a prebuilt graph
        "scale_share_fwd": round(1 - times["e3j_graph_unit_weights_fwd"] / times["e3j_graph_fwd"], 3),
        "scale_share_fwd_bwd": round(1 - times["e3j_graph_unit_weights_fwd_bwd"] / times["e3j_graph_fwd_bwd"], 3),
    }
    if args.pairs:
        xs = [from_mul_ir(op.x(x), op.irreps_x, op.channels) for op in fmp.ops]
        ss = [op.weights(w).reshape(num_edges, op.conv.num_paths, op.channels) * op.scale.astype(np.float32)
              for op in fmp.ops]  # fmt: skip

        def alone(xs, y, ss, g):
            return [op.conv(a, y, c, g) for op, a, c in zip(fmp.ops, xs, ss)]

        def loss(f):
            return lambda *a: sum(jnp.sum(jnp.sin(o)) for o in jax.tree.leaves(f(*a)))

        fused_g, grouped = with_graph(fmp), (xs, sh, ss, graph)
        for part, wrap in (("fwd", lambda f: jax.jit(loss(f))),
                           ("fwd_bwd", lambda f: jax.jit(jax.value_and_grad(loss(f), (0, 1, 2))))):  # fmt: skip
            share = paired_share((wrap(fused_g), (x, sh, w, graph)), (wrap(alone), grouped), args.pairs)
            row[f"conversion_share_{part}"] = share
    print(json.dumps(row), flush=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000])
    parser.add_argument("--neighbours", type=int, default=27)
    parser.add_argument("--irreps", default="32x0e + 16x1o")
    parser.add_argument("--lmax", type=int, default=2)
    parser.add_argument("--filter", default="0e + 1o + 1e + 2e")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4, help="interleaved timing rounds (runs split among them)")
    parser.add_argument(
        "--pairs", type=int, default=0, help="paired calls for the conversions' share (0: not measured)"
    )
    parser.add_argument("--backend", default=None, help="e3j backend (default: selected per platform)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    with e3j.use_backend(args.backend) if args.backend else contextlib.nullcontext():
        rows = [measure(n, args) for n in args.nodes]
    if args.json:
        with open(args.json, "w") as f:
            record = provenance("benchmarks/interop_functional.py", argv)
            json.dump({**record, "platform": jax.default_backend(), "unit": "ms", "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
