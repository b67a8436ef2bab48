"""The fused e3nn-jax drop-in (``e3j.interop.MessagePassing``) against the e3nn-jax code it replaces.

Message passing at mixed multiplicities (default ``64x0e + 32x1o + 16x2e`` ⊗ spherical harmonics
``0e..3o`` -> ``0e + 1o + 2e``; random graph, ``--neighbours`` edges per node), forward (value) and
forward + backward (value and gradient with respect to node features, edge attributes and weights),
all jitted, float32, on this machine's default backend. Mixed multiplicities run natively (one
convolution per multiplicity); also timed with a prebuilt graph: the same call as gcd copies
(``grouping="gcd"``, the old path: one convolution of 16 channels and 27 paths), and uniform
multiplicity of about the same node-feature size (``27x0e + 27x1o + 27x2e`` for the default). Also
measured, to split the fused call's cost: e3j's convolutions alone on operands already split into
the groups, the layout conversions alone (node features and weights in, output out) and the
``e3j.Graph`` build. The array route also as a model takes it (``mlp_array``: the radial MLP's
last layer computed in the program and its ``[E, num_weights]`` output given to the drop-in), against
the groups' own products and convolutions. The same with the weights given as the radial MLP's last layer,
``hidden [E, --hidden] @ kernel`` (as NequIP's and MACE's radial networks end; ``hidden`` is the
activation of a pre-activation operand, computed in the program as in a model): e3nn-jax computes
``w = hidden @ kernel`` and runs its pattern; e3j takes ``e3j.FactoredWeights(hidden, kernel)``
("factored": on the reference, its factored grouped kernels compute each chunk's weights inside the
sweep, so no per-edge array of weights exists), against each group's own product ``hidden @
kernel_g`` and its convolution on already-split operands ("factored bare": the weights multiplied
out per group, as a model written per group would); these are differentiated with respect to the
kernel too, and their value-and-gradient programs' XLA temporary memory is recorded
(``temp_mb_fwd_bwd``). The factored call's share against its bare groups is then the fusion's gain
as well as the layouts' cost; the layouts' cost alone is ``benchmarks/grouped_kernel_parts.py
--weights factored``. All variants
are timed in ``--rounds`` interleaved rounds (the CPU may be shared); each time is the best round's
mean of its fastest 20 % of calls. The factored call's share against its bare groups is also
measured in ``--pairs`` alternating calls of both: the median over the pairs of ``1 - bare /
factored``, and its quartiles (negative where the factored call is faster); the same for the drop-in
with an array of weights against its groups alone (there: what e3nn's layout costs).

With an array of weights the drop-in runs one primitive for all groups that reads the weights in
e3nn's layout in place (``layouts`` times the conversions the per-group route pays instead: the
route of backends without grouped kernels). Its weights' cotangent is one
``[E, num_weights]`` array where the bare variant's are one per group; ``weights_buffer`` and
``group_weights_buffers`` time zeroed buffers of each alone (glibc hands out an allocation over
32 MiB as fresh pages; ``GLIBC_TUNABLES``, recorded in the JSON, can change that).

    python benchmarks/interop_message_passing.py --nodes 1000 3000 --runs 20
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np

import e3j
from e3j import interop
from e3j._bench import interleaved, provenance


def case(num_nodes, neighbours, irreps_x, lmax, filter_ir_out, dtype, seed=0):
    rng = np.random.default_rng(seed)
    num_edges = num_nodes * neighbours
    senders = jnp.asarray(rng.integers(0, num_nodes, num_edges), jnp.int32)
    receivers = jnp.asarray(np.sort(rng.integers(0, num_nodes, num_edges)), jnp.int32)
    irreps_x = e3nn.Irreps(irreps_x)
    x = e3nn.IrrepsArray(irreps_x, jnp.asarray(rng.normal(size=(num_nodes, irreps_x.dim)), dtype))
    sh = e3nn.spherical_harmonics(
        e3nn.Irreps.spherical_harmonics(lmax), jnp.asarray(rng.normal(size=(num_edges, 3)), dtype), True
    )
    mp = interop.MessagePassing(irreps_x, sh.irreps, filter_ir_out)
    w = jnp.asarray(rng.normal(size=(num_edges, mp.num_weights)), dtype)
    return mp, x, sh, w, senders, receivers


def paired_share(a, b, pairs: int) -> dict:
    """``1 - t_b / t_a`` (the share of ``a`` that ``b`` does not do) from ``pairs`` alternating single
    calls of ``a = (f, operands)`` and ``b``: median and quartiles over the pairs, and each call's
    median milliseconds (``a_ms``, ``b_ms``). Load that lasts longer than one pair falls on both
    calls alike, so the share is steadier than that of two separately timed minima."""
    (fa, oa), (fb, ob) = a, b
    for f, ops in (a, b):
        jax.block_until_ready(f(*ops))
    shares, ta, tb = [], [], []
    for i in range(pairs):
        # alternate which goes first: a fixed order would charge one call with the other's after-effects
        order = ((fa, oa), (fb, ob)) if i % 2 == 0 else ((fb, ob), (fa, oa))
        t = {}
        for f, ops in order:
            t0 = time.perf_counter()
            jax.block_until_ready(f(*ops))
            t[f] = time.perf_counter() - t0
        shares.append(1 - t[fb] / t[fa])
        ta.append(t[fa])
        tb.append(t[fb])
    q1, median, q3 = (round(float(v), 4) for v in np.percentile(shares, [25, 50, 75]))
    ms = {k: round(float(np.median(v)) * 1e3, 4) for k, v in (("a_ms", ta), ("b_ms", tb))}
    return {"median": median, "q1": q1, "q3": q3, **ms}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 3000])
    parser.add_argument("--neighbours", type=int, default=27)
    parser.add_argument("--irreps", default="64x0e + 32x1o + 16x2e")
    parser.add_argument("--lmax", type=int, default=3)
    parser.add_argument("--filter", default="0e + 1o + 2e")
    parser.add_argument("--hidden", type=int, default=64, help="width of the radial MLP's last hidden layer")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4, help="interleaved timing rounds (runs split among them)")
    parser.add_argument("--pairs", type=int, default=60, help="alternating call pairs for the conversion share")
    parser.add_argument("--backend", default=None, help="e3j backend (default: selected per platform)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    with e3j.use_backend(args.backend) if args.backend else contextlib.nullcontext():
        rows = [measure(n, args) for n in args.nodes]
    if args.json:
        with open(args.json, "w") as f:
            # the allocator's settings matter to fresh buffers' costs
            env = {k: os.environ[k] for k in ("GLIBC_TUNABLES",) if k in os.environ}
            json.dump(
                {
                    **provenance("benchmarks/interop_message_passing.py", argv),
                    "backend": jax.default_backend(),
                    "unit": "ms",
                    "env": env,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    return 0


def uniform_irreps(irreps) -> e3nn.Irreps:
    """The same irreps with one multiplicity, the one closest to the same total dimension."""
    irreps = e3nn.Irreps(irreps)
    mul = max(1, round(irreps.dim / sum(ir.dim for _, ir in irreps)))
    return e3nn.Irreps([(mul, ir) for _, ir in irreps])


def measure(n: int, args) -> dict:
    mp, x, sh, w, senders, receivers = case(n, args.neighbours, args.irreps, args.lmax, args.filter, jnp.float32)
    gcd = interop.MessagePassing(x.irreps, sh.irreps, args.filter, grouping="gcd")
    uni_mp, uni_x, _, uni_w, _, _ = case(
        n, args.neighbours, uniform_irreps(args.irreps), args.lmax, args.filter, jnp.float32, seed=1
    )
    num_nodes = n

    def ref(xa, ya, wa, senders, receivers):
        m = e3nn.tensor_product(
            e3nn.IrrepsArray(x.irreps, xa)[senders], e3nn.IrrepsArray(sh.irreps, ya), filter_ir_out=args.filter
        )
        return e3nn.scatter_sum(m * wa, dst=receivers, output_size=num_nodes).array

    def fused(xa, ya, wa, senders, receivers):
        return mp(e3nn.IrrepsArray(x.irreps, xa), e3nn.IrrepsArray(sh.irreps, ya), wa, senders, receivers).array

    graph = e3j.Graph.from_edges(senders, receivers, num_nodes)
    assert not mp.plan.gathers and not gcd.plan.gathers
    platform = e3j.backends.device_platform(jax.devices()[0])
    request = e3j.backends.OpRequest("convolution", platform, "float32", mp.plan.groups[0].channels, args.lmax)
    selected = e3j.backends.select_backend(request, args.backend)

    def with_graph(m, irreps):
        def f(xa, ya, wa, g):
            return m(e3nn.IrrepsArray(irreps, xa), e3nn.IrrepsArray(sh.irreps, ya), wa, graph=g).array

        return f

    # e3j's convolutions alone, on operands already split into the groups' [N, D_g, C_g] / [E, P_g, C_g]
    groups = mp.plan.groups
    x_ops = [g.split_x(x.array) for g in groups]
    s_ops = [g.split_weights(w) for g in groups]

    def bare(xs, ya, ss, g):
        return [conv(xg, ya, sg, g) for (_, conv), xg, sg in zip(mp.groups, xs, ss)]

    # the radial MLP's last layer: hidden features [E, H] and kernel [H, num_weights] (e3nn's order)
    rng = np.random.default_rng(2)
    hidden = jnp.asarray(rng.normal(size=(w.shape[0], args.hidden)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(args.hidden, mp.num_weights)) / np.sqrt(args.hidden), jnp.float32)
    kernels = [g.weights(kernel) for g in groups]  # each group's columns, split once as a model would

    # As in a model, the hidden features are computed in the program (here the MLP's activation of a
    # pre-activation operand). With both matrix-product operands program parameters, the bare variant
    # ran ~10 % faster on this CPU's XLA than with its hidden features computed (the drop-in, whose
    # kernel columns are selected in the program, did not): a difference of operands, not a layout cost.
    def ref_mlp(xa, ya, h, k, senders, receivers):
        return ref(xa, ya, jax.nn.silu(h) @ k, senders, receivers)

    def factored(xa, ya, h, k, g):
        weights = e3j.FactoredWeights(jax.nn.silu(h), k)
        return mp(e3nn.IrrepsArray(x.irreps, xa), e3nn.IrrepsArray(sh.irreps, ya), weights, graph=g).array

    # the array route as a model takes it: its radial network's last layer computed in the program and
    # its output, e3nn's [E, num_weights], given to the drop-in (the weights' cotangent a temporary)
    def mlp_array(xa, ya, h, k, g):
        return with_graph(mp, x.irreps)(xa, ya, jax.nn.silu(h) @ k, g)

    def mlp_layer(h, k):  # that layer alone, to tell the drop-in's part of the program
        return jax.nn.silu(h) @ k

    def factored_bare(xs, ya, h, ks, g):
        h = jax.nn.silu(h)
        ss = [(h @ k).reshape(h.shape[0], gr.coo.num_paths, gr.channels) for gr, k in zip(groups, ks)]
        return bare(xs, ya, ss, g)

    def grad_of(f, argnums=(0, 1, 2)):
        def loss(*a):
            return sum(jnp.sum(o) for o in jax.tree.leaves(f(*a)))

        return jax.jit(jax.value_and_grad(loss, argnums=argnums))

    # the graph is an argument (not a constant folded into the executable), as in a training step
    operands = {
        "e3nn": (ref, (x.array, sh.array, w, senders, receivers)),
        "e3j": (fused, (x.array, sh.array, w, senders, receivers)),
        "e3j_graph": (with_graph(mp, x.irreps), (x.array, sh.array, w, graph)),
        "e3j_bare": (bare, (x_ops, sh.array, s_ops, graph)),
        "e3j_gcd_graph": (with_graph(gcd, x.irreps), (x.array, sh.array, w, graph)),
        "e3j_uniform_graph": (with_graph(uni_mp, uni_x.irreps), (uni_x.array, sh.array, uni_w, graph)),
        "e3nn_mlp": (ref_mlp, (x.array, sh.array, hidden, kernel, senders, receivers)),
        "e3j_factored_graph": (factored, (x.array, sh.array, hidden, kernel, graph)),
        "e3j_factored_bare": (factored_bare, (x_ops, sh.array, hidden, kernels, graph)),
        "e3j_mlp_array_graph": (mlp_array, (x.array, sh.array, hidden, kernel, graph)),
        "mlp_layer": (mlp_layer, (hidden, kernel)),
    }
    # correctness first (the relative error of the fused call against e3nn-jax, float32)
    a, b = jax.jit(ref)(*operands["e3nn"][1]), jax.jit(fused)(*operands["e3j"][1])
    err = float(jnp.abs(a - b).max() / jnp.abs(a).max())
    c = jax.jit(operands["e3j_gcd_graph"][0])(*operands["e3j_gcd_graph"][1])
    err_gcd = float(jnp.abs(a - c).max() / jnp.abs(a).max())
    a = jax.jit(ref_mlp)(*operands["e3nn_mlp"][1])
    c = jax.jit(factored)(*operands["e3j_factored_graph"][1])
    err_factored = float(jnp.abs(a - c).max() / jnp.abs(a).max())
    c = jax.jit(mlp_array)(*operands["e3j_mlp_array_graph"][1])
    err_mlp_array = float(jnp.abs(a - c).max() / jnp.abs(a).max())
    # compile everything, then time in interleaved rounds so that load from other processes on a
    # shared machine falls on every variant alike
    jitted = {}
    for name, (f, ops) in operands.items():
        jitted[f"{name}_fwd"] = (jax.jit(f), ops)
        # the MLP variants: also the gradient with respect to the kernel (a parameter)
        with_kernel = name in ("e3nn_mlp", "e3j_factored_graph", "e3j_factored_bare", "e3j_mlp_array_graph")
        argnums = (0, 1) if name == "mlp_layer" else (0, 1, 2, 3) if with_kernel else (0, 1, 2)
        jitted[f"{name}_fwd_bwd"] = (grad_of(f, argnums), ops)
    outs = jax.jit(bare)(x_ops, sh.array, s_ops, graph)

    def layouts(xa, wa, outs):  # node features and weights in, output out
        return [g.split_x(xa) for g in groups], [g.split_weights(wa) for g in groups], mp.plan.join_out(outs)

    jitted["layouts"] = (jax.jit(layouts), (x.array, w, outs))
    # a fresh buffer of the weights' cotangent: one [E, num_weights] (the drop-in's) against the
    # groups' [E, P_g, C_g] (the bare variant's); glibc serves one over its 32 MiB mmap threshold
    # with new pages from the kernel, where smaller ones are reused
    jitted["weights_buffer"] = (jax.jit(jnp.zeros_like), (w,))
    jitted["group_weights_buffers"] = (jax.jit(lambda ss: [jnp.zeros_like(s) for s in ss]), (s_ops,))
    jitted["graph_build"] = (jax.jit(lambda s, r: e3j.Graph.from_edges(s, r, num_nodes)), (senders, receivers))
    times = interleaved(jitted, args.runs, args.rounds)
    paired = {
        kind: paired_share(jitted[f"e3j_factored_graph_{kind}"], jitted[f"e3j_factored_bare_{kind}"], args.pairs)
        for kind in ("fwd", "fwd_bwd")
    }
    paired_array = {
        kind: paired_share(jitted[f"e3j_graph_{kind}"], jitted[f"e3j_bare_{kind}"], args.pairs)
        for kind in ("fwd", "fwd_bwd")
    }
    paired_mlp_array = {
        kind: paired_share(jitted[f"e3j_mlp_array_graph_{kind}"], jitted[f"e3j_factored_bare_{kind}"], args.pairs)
        for kind in ("fwd", "fwd_bwd")
    }
    for kind, share in paired_mlp_array.items():
        # an estimate of the conversions' share of the fused call alone: the difference of the two
        # median times over the program's median less the network's last layer timed on its own
        # (whose program returns its output and differentiates a sum: not the layer as it runs
        # inside the program, so of unknown bias)
        drop_in_ms = share["a_ms"] - times[f"mlp_layer_{kind}"] * 1e3
        share["of_drop_in"] = round((share["a_ms"] - share["b_ms"]) / drop_in_ms, 4)

    def path_channels(m):
        return sum(g.coo.num_paths * g.channels for g in m.plan.groups)

    row = {
        "nodes": n,
        "edges": int(senders.shape[0]),
        # the backend e3j selected for the groups (a plugin of higher priority may displace the
        # reference on a CPU), and whether it runs all groups in one call
        "backend": selected.name,
        "grouped_kernels": e3j.backends.kernels_of(selected).provides("grouped_convolution"),
        "irreps": args.irreps,
        "lmax": args.lmax,
        # (channels, paths) of each uniform-channel convolution a call runs
        "groups": [[g.channels, g.coo.num_paths] for g in mp.plan.groups],
        "groups_gcd": [[g.channels, g.coo.num_paths] for g in gcd.plan.groups],
        "uniform_irreps": str(uni_x.irreps),
        # sizes of the work: node feature dim, output dim, Σ paths × channels
        "dims": {
            k: [int(m.irreps_node.dim), int(m.irreps_out.dim), path_channels(m)]
            for k, m in (("mixed", mp), ("gcd", gcd), ("uniform", uni_mp))
        },
        "max_rel_err_vs_e3nn": err,
        "max_rel_err_gcd_vs_e3nn": err_gcd,
        "max_rel_err_factored_vs_e3nn": err_factored,
        "max_rel_err_mlp_array_vs_e3nn": err_mlp_array,
        "hidden": args.hidden,
        **{k: round(v * 1e3, 3) for k, v in times.items()},
        "speedup_fwd": round(times["e3nn_fwd"] / times["e3j_fwd"], 2),
        "speedup_fwd_bwd": round(times["e3nn_fwd_bwd"] / times["e3j_fwd_bwd"], 2),
        "grouped_vs_gcd_fwd": round(times["e3j_gcd_graph_fwd"] / times["e3j_graph_fwd"], 2),
        "grouped_vs_gcd_fwd_bwd": round(times["e3j_gcd_graph_fwd_bwd"] / times["e3j_graph_fwd_bwd"], 2),
        "grouped_vs_uniform_fwd": round(times["e3j_uniform_graph_fwd"] / times["e3j_graph_fwd"], 2),
        "grouped_vs_uniform_fwd_bwd": round(times["e3j_uniform_graph_fwd_bwd"] / times["e3j_graph_fwd_bwd"], 2),
        # what the drop-in adds to e3j's convolutions: layouts (with a prebuilt graph), and the
        # graph build when it is given senders and receivers
        "layout_share_fwd": round(1 - times["e3j_bare_fwd"] / times["e3j_graph_fwd"], 3),
        "layout_share_fwd_bwd": round(1 - times["e3j_bare_fwd_bwd"] / times["e3j_graph_fwd_bwd"], 3),
        "layouts_share_fwd": round(times["layouts"] / times["e3j_fwd"], 4),
        "graph_build_share_fwd": round(times["graph_build"] / times["e3j_fwd"], 3),
        # what one zeroed [E, num_weights] buffer costs over the groups' separate ones, each timed
        # alone, as a share of the drop-in's value and gradient
        "weights_buffer_share_fwd_bwd": round(
            (times["weights_buffer"] - times["group_weights_buffers"]) / times["e3j_graph_fwd_bwd"], 3
        ),
        # weights as the radial MLP's last layer: e3nn-jax multiplies them out; e3j folds the
        # reordering into the kernel's columns ("factored"), against the groups' own products
        "speedup_factored_fwd": round(times["e3nn_mlp_fwd"] / times["e3j_factored_graph_fwd"], 2),
        "speedup_factored_fwd_bwd": round(times["e3nn_mlp_fwd_bwd"] / times["e3j_factored_graph_fwd_bwd"], 2),
        "factored_layout_share_fwd": round(1 - times["e3j_factored_bare_fwd"] / times["e3j_factored_graph_fwd"], 3),
        "factored_layout_share_fwd_bwd": round(
            1 - times["e3j_factored_bare_fwd_bwd"] / times["e3j_factored_graph_fwd_bwd"], 3
        ),
        # the same from paired calls (1 - bare / factored per pair): median and quartiles. The key
        # keeps its name across runs; on a backend with factored kernels (the reference) the share
        # is the fusion's gain with the layouts' cost (grouped_kernel_parts.py --weights factored
        # measures the layouts alone)
        "factored_conversions_paired": {**paired, "pairs": args.pairs},
        # and for an array of weights (1 - bare / drop-in with a prebuilt graph, per pair)
        "array_conversions_paired": {**paired_array, "pairs": args.pairs},
        # an array computed in the program by the network's last layer (as a model gives it) against
        # the groups' own products and convolutions: per pair, of the whole program; "of_drop_in":
        # the estimate above, over the drop-in's part (the program less the layer alone)
        "mlp_array_conversions_paired": {**paired_mlp_array, "pairs": args.pairs},
        "speedup_mlp_array_fwd_bwd": round(times["e3nn_mlp_fwd_bwd"] / times["e3j_mlp_array_graph_fwd_bwd"], 2),
        # XLA's temporary memory of each value-and-gradient program (MiB; inputs and outputs apart)
        "temp_mb_fwd_bwd": {
            name: round(
                jitted[f"{name}_fwd_bwd"][0].lower(*ops).compile().memory_analysis().temp_size_in_bytes / 2**20, 1
            )
            for name, (_, ops) in operands.items()
            if name in ("e3nn_mlp", "e3j_factored_graph", "e3j_factored_bare", "e3j_mlp_array_graph")
        },
    }
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
