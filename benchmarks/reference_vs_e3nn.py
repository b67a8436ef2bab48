"""The reference backend against e3nn-jax on this machine, in one run (issue: the `e3j` package).

    python benchmarks/reference_vs_e3nn.py [--runs 20] [--quick] [--out benchmarks/results/...json]

Tensor product (float32, 64 channels, batch 20,000, lmax 2 and 3, outputs filtered to the
spherical-harmonic irreps up to lmax) with y broadcast over channels ([B, Dy]: e3nn's
`64x... ⊗ 1x...`) and channel-wise ([B, Dy, C]: e3nn's tensor product vmapped over channels),
forward and backward. Throughput as the paper defines it (input + output bytes; backward: primals,
output cotangent and input cotangents) over the mean of the fastest 20 % of the runs, beside a
jitted copy of an output-sized array measured in the same run (the ceiling here).

Convolution at lmax 3 (filter 0e+1o+2e+3o, 23 paths, D_out = 99), 32 channels, 20,000 nodes,
45 neighbours per node: the jitted value-and-gradient's memory from XLA's own buffer assignment
(`compiled.memory_analysis()`), against the bytes of its inputs, outputs and cotangents and against
the [E, D_out, C] message array it must never hold; the same analysis for e3nn-jax's per-edge tensor
product + segment sum; and one timed value-and-gradient for the reference.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
from readme_tables import markdown

import e3j
from e3j._bench import copy_bandwidth, nbytes, time_call
from e3j._sweep import _e3nn_convolution as e3nn_convolution
from e3j._sweep import _graph as random_graph
from e3j.layout import mul_ir_irreps, to_mul_ir

GB = 1e9


def tp_cases(args):
    for lmax in (2, 3):
        irreps = str(e3j.Irreps.spherical_harmonics(lmax))  # strings: e3nn-jax parses its own
        for mode in ("broadcast", "channelwise"):
            yield lmax, irreps, mode


def bench_tp(args, key):
    rows = []
    B, C = args.batch, args.channels
    for lmax, irreps, mode in tp_cases(args):
        tp = e3j.TensorProduct(irreps, irreps, filter=irreps)
        kx, ky, kz = jax.random.split(jax.random.fold_in(key, lmax * 2 + (mode == "channelwise")), 3)
        dim = e3j.Irreps(irreps).dim
        x = jax.random.normal(kx, (B, dim, C), jnp.float32)
        y_shape = (B, dim) if mode == "broadcast" else (B, dim, C)
        y = jax.random.normal(ky, y_shape, jnp.float32)
        dz = jax.random.normal(kz, (B, tp.irreps_out.dim, C), jnp.float32)

        ours_fwd = jax.jit(lambda x, y, tp=tp: tp(x, y))
        ours_bwd = jax.jit(lambda x, y, dz, tp=tp: jax.vjp(tp, x, y)[1](dz))

        if mode == "broadcast":
            ix, iy = str(mul_ir_irreps(irreps, C)), irreps

            def e3nn_tp(xf, yf, ix=ix, iy=iy, irreps=irreps):
                return e3nn.tensor_product(
                    e3nn.IrrepsArray(ix, xf), e3nn.IrrepsArray(iy, yf), filter_ir_out=irreps
                ).array

            ex, ey = to_mul_ir(x, irreps), y
        else:

            def e3nn_tp(xc, yc, irreps=irreps):
                def one(a, b):
                    return e3nn.tensor_product(
                        e3nn.IrrepsArray(irreps, a), e3nn.IrrepsArray(irreps, b), filter_ir_out=irreps
                    ).array

                return jax.vmap(one, in_axes=(-1, -1), out_axes=-1)(xc, yc)

            ex, ey = x, y
        e3nn_fwd = jax.jit(e3nn_tp)
        out_e3nn = jax.eval_shape(e3nn_fwd, ex, ey)
        edz = jnp.zeros(out_e3nn.shape, out_e3nn.dtype)
        e3nn_bwd = jax.jit(lambda a, b, g, f=e3nn_tp: jax.vjp(f, a, b)[1](g))

        fwd_bytes = nbytes(x, y, dz)  # inputs + output (dz has the output's shape)
        bwd_bytes = nbytes(x, y, dz, x, y)  # primals + output cotangent + input cotangents
        _, copy_bw = copy_bandwidth(nbytes(dz), runs=args.runs)
        t_ours_f = time_call(ours_fwd, x, y, runs=args.runs)
        t_e3nn_f = time_call(e3nn_fwd, ex, ey, runs=args.runs)
        t_ours_b = time_call(ours_bwd, x, y, dz, runs=args.runs)
        t_e3nn_b = time_call(e3nn_bwd, ex, ey, edz, runs=args.runs)
        # agreement, so the timed programs are known to compute the same thing
        ours_val = np.asarray(ours_fwd(x[:64], y[:64]))
        ref_val = np.asarray(e3nn_fwd(ex[:64], ey[:64]))
        if mode == "broadcast":
            ref_val = np.asarray(e3j.from_mul_ir(ref_val, tp.irreps_out, C))
        err = float(np.abs(ours_val - ref_val).max() / np.abs(ref_val).max())
        rows.append(
            {
                "op": "tensor_product",
                "lmax": lmax,
                "y": mode,
                "batch": B,
                "channels": C,
                "irreps_out": str(tp.irreps_out),
                "fwd_bytes": fwd_bytes,
                "bwd_bytes": bwd_bytes,
                "copy_GBps": copy_bw / GB,
                "reference_fwd_s": t_ours_f,
                "e3nn_fwd_s": t_e3nn_f,
                "reference_bwd_s": t_ours_b,
                "e3nn_bwd_s": t_e3nn_b,
                "reference_fwd_GBps": fwd_bytes / t_ours_f / GB,
                "e3nn_fwd_GBps": fwd_bytes / t_e3nn_f / GB,
                "reference_bwd_GBps": bwd_bytes / t_ours_b / GB,
                "e3nn_bwd_GBps": bwd_bytes / t_e3nn_b / GB,
                "fwd_speedup": t_e3nn_f / t_ours_f,
                "bwd_speedup": t_e3nn_b / t_ours_b,
                "fwd_fraction_of_copy": fwd_bytes / t_ours_f / copy_bw,
                "max_rel_diff_vs_e3nn": err,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_conv(args, key):
    irreps = e3j.Irreps.spherical_harmonics(3)
    conv = e3j.Convolution(irreps, irreps, filter=irreps)
    N, C, K = args.nodes, args.conv_channels, args.degree
    snd, rcv = random_graph(N, K)  # the graph `e3j bench` uses: K in-edges per node, shuffled
    E = snd.size
    graph = e3j.Graph.from_edges(snd, rcv, N)
    kx, ky, ks, kg = jax.random.split(key, 4)
    x = jax.random.normal(kx, (N, irreps.dim, C), jnp.float32)
    y = jax.random.normal(ky, (E, irreps.dim), jnp.float32)
    s = jax.random.normal(ks, (E, conv.num_paths, C), jnp.float32)
    dm = jax.random.normal(kg, (N, conv.irreps_out.dim, C), jnp.float32)

    def ours(x, y, s, dm):
        m, vjp = jax.vjp(lambda x, y, s: conv(x, y, s, graph), x, y, s)
        return m, vjp(dm)

    e3nn_conv = e3nn_convolution(str(irreps), conv.coo.i3, snd, rcv, N)

    def e3nn_vg(x, y, s, dm):
        m, vjp = jax.vjp(e3nn_conv, x, y, s)
        return m, vjp(dm)

    io_bytes = nbytes(x, y, s, dm, x, y, s, dm)  # inputs, output, output cotangent, input cotangents
    message_bytes = E * conv.irreps_out.dim * C * 4
    row = {
        "op": "convolution value_and_grad",
        "lmax": 3,
        "nodes": N,
        "edges": E,
        "channels": C,
        "paths": conv.num_paths,
        "dim_out": conv.irreps_out.dim,
        "io_bytes": io_bytes,
        "message_array_bytes": message_bytes,
    }
    for name, fn in (("reference", ours), ("e3nn", e3nn_vg)):
        compiled = jax.jit(fn).lower(x, y, s, dm).compile()
        mem = compiled.memory_analysis()
        peak = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
        row[f"{name}_xla_peak_bytes"] = int(peak)
        row[f"{name}_xla_temp_bytes"] = int(mem.temp_size_in_bytes)
        row[f"{name}_peak_over_io"] = peak / io_bytes
    compiled = jax.jit(ours)
    row["reference_value_and_grad_s"] = time_call(compiled, x, y, s, dm, runs=args.conv_runs, fastest=1.0, warmup=1)
    row["reference_value_and_grad_GBps"] = io_bytes / row["reference_value_and_grad_s"] / GB
    print(json.dumps(row), flush=True)
    return [row]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="timed runs per measurement (fastest 20%% kept)")
    p.add_argument("--batch", type=int, default=20_000)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--nodes", type=int, default=20_000)
    p.add_argument("--degree", type=int, default=45)
    p.add_argument("--conv-channels", type=int, default=32)
    p.add_argument("--conv-runs", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    p.add_argument("--skip-conv", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.nodes, args.runs, args.conv_runs = 512, 200, 5, 1
    key = jax.random.key(0)
    rows = bench_tp(args, key)
    if not args.skip_conv:
        rows += bench_conv(args, key)
    result = {
        "command": " ".join(["python", *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": f"{jax.devices()[0].device_kind} ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores)",
        "jax": jax.__version__,
        "e3j": e3j.__version__,
        "e3nn_jax": e3nn.__version__,
        "rows": rows,
    }
    print(markdown(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
