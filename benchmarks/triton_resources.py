"""Registers, spills and compile time of the Pallas GPU kernels on Hopper, measured without a GPU.

Lowers each e3j-pallas-gpu kernel for ``cuda`` here (an abstract H100 in scope), takes the Triton IR
that Pallas hands to XLA, compiles it with Triton's own compiler for ``sm_90a`` (Triton 3.6.0, the
GPU machine image's version; XLA's Triton on the device may differ in detail), and reads ptxas's
resource report for the PTX. A register count at the 255 limit or any spill is where a kernel edit
should look first; the Triton compile time says how long the device spends before the first run.

    python benchmarks/triton_resources.py --out benchmarks/results/sm90a-pallas-gpu-resources.json

needs ``pip install triton==3.6.0`` beside JAX and the packages (``nox -s gpu_compile`` does that).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = ["2:128", "3:32", "3:128", "3:128:float64"]  # lmax:channels[:dtype] (float32 unless said); y broadcast
KERNELS = ("tp_fwd", "tp_bwd", "conv_fwd", "conv_bwd")


def kernel_calls(kernels, coo, channels: int, dtype) -> dict:
    """The four kernels of ``kernels`` on abstract operands at the sizes these scripts measure.

    ``{"tp_fwd" | "tp_bwd" | "conv_fwd" | "conv_bwd": (function, abstract args)}``: a batch of 4096
    for the tensor product, 1024 nodes x 45 neighbours for the convolution, ``y`` broadcast.
    """
    import jax
    import numpy as np

    import e3j

    spec = jax.ShapeDtypeStruct
    batch, nodes, degree = 4096, 1024, 45
    senders = np.random.default_rng(0).integers(0, nodes, nodes * degree).astype(np.int32)
    graph = e3j.Graph.from_edges(senders, np.repeat(np.arange(nodes, dtype=np.int32), degree), nodes)
    graph = jax.tree.map(lambda a: spec(np.shape(a), a.dtype), graph)
    edges = nodes * degree
    x, y = spec((batch, coo.dim_x, channels), dtype), spec((batch, coo.dim_y), dtype)
    dz = spec((batch, coo.dim_out, channels), dtype)
    xn, ye = spec((nodes, coo.dim_x, channels), dtype), spec((edges, coo.dim_y), dtype)
    se, dm = spec((edges, coo.num_paths, channels), dtype), spec((nodes, coo.dim_out, channels), dtype)
    return {
        "tp_fwd": (functools.partial(kernels.tensor_product, coo, y_channels=False), (x, y)),
        "tp_bwd": (functools.partial(kernels.tensor_product_bwd, coo, outs=("x", "y"), y_channels=False), (x, y, dz)),
        "conv_fwd": (lambda x, y, s, g: kernels.convolution(coo, x, y, s, g, y_channels=False), (xn, ye, se, graph)),
        "conv_bwd": (
            lambda x, y, s, dm, g: kernels.convolution_bwd(coo, x, y, s, dm, g, outs=("x", "y", "s"), y_channels=False),
            (xn, ye, se, dm, graph),
        ),
    }


def capture_triton_ir(lmax: int, channels: int, dtype: str = "float32") -> dict[str, tuple[str, int]]:
    """``{kernel: (Triton IR text, num_warps)}`` of the pallas_gpu kernels lowered for cuda on CPU."""
    import jax
    import jax.numpy as jnp
    from jax._src.pallas.triton import pallas_call_registration as registration
    from jax.sharding import AbstractDevice, AbstractMesh

    from e3j.backends import get_backend, kernels_of
    from e3j_core import Irreps, tensor_product_coo

    lower_module = registration.lowering.lower_jaxpr_to_triton_module  # private: where Pallas builds the IR
    modules: list[str] = []

    def capture(*args, **kwargs):
        result = lower_module(*args, **kwargs)
        modules.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    gpu = AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=None, platform="cuda")
    mesh = AbstractMesh((1,), ("x",), abstract_device=gpu)
    kernels = kernels_of(get_backend("pallas_gpu"))
    irreps = Irreps.spherical_harmonics(lmax)
    coo = tensor_product_coo(irreps, irreps, filter=irreps)
    if dtype == "float64":
        jax.config.update("jax_enable_x64", True)  # (this script's process only)
    calls = kernel_calls(kernels, coo, channels, jnp.dtype(dtype))
    out = {}
    registration.lowering.lower_jaxpr_to_triton_module = capture
    try:
        for name, (fn, args) in calls.items():
            modules.clear()
            with jax.sharding.use_abstract_mesh(mesh):
                text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
            warps = [int(w) for w in re.findall(r"num_warps = (\d+) : i32", text)]
            if len(modules) != 1 or len(warps) != 1:
                raise RuntimeError(f"{name}: expected one Triton kernel, found {len(modules)}")
            out[name] = (modules[0], warps[0])
    finally:
        registration.lowering.lower_jaxpr_to_triton_module = lower_module
    return out


#: PTX instruction classes counted per kernel: global and local memory traffic, shared memory, barriers.
PTX_OPS = ("ld.global", "st.global", "ld.shared", "st.shared", "ld.local", "st.local", "bar.sync")


def ptx_op_counts(ptx: str) -> dict[str, int]:
    """Static counts of the :data:`PTX_OPS` instructions in ``ptx`` (predicated ones included), plus
    ``vector_global``: global loads and stores of 2 or 4 elements (``.v2`` / ``.v4``).

    >>> counts = ptx_op_counts("@%p1 ld.global.b32 {%r1}, [%rd1];\\n st.global.v4.b32 [%rd2], {%r1, %r2, %r3, %r4};")
    >>> {k: n for k, n in counts.items() if n}
    {'ld.global': 1, 'st.global': 1, 'vector_global': 1}
    """
    ops = re.findall(r"^\s*(?:@!?%p\w+\s+)?([a-z]+\.[a-z]+)((?:\.\w+)*)", ptx, flags=re.MULTILINE)
    counts = {name: sum(1 for op, _ in ops if op == name) for name in PTX_OPS}
    counts["vector_global"] = sum(
        1 for op, mods in ops if op in ("ld.global", "st.global") and re.search(r"\.v[24]\b", mods)
    )
    return counts


def compile_for_hopper(ir_text: str, num_warps: int) -> dict:
    """Compile Triton IR for sm_90a with Triton; ptxas's report of the PTX it emits."""
    os.environ["TRITON_ALWAYS_COMPILE"] = "1"  # a cached kernel would report no compile time
    import triton
    import triton.backends.nvidia as nvidia
    from triton.backends.compiler import GPUTarget

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "kernel.ttir")
        path.write_text(ir_text)
        start = time.perf_counter()
        compiled = triton.compile(str(path), target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
        seconds = time.perf_counter() - start
        ptx = Path(tmp, "kernel.ptx")
        ptx.write_text(compiled.asm["ptx"])
        ptxas = Path(nvidia.__file__).parent / "bin" / "ptxas"
        cmd = [str(ptxas), "-arch=sm_90a", "-v", str(ptx), "-o", os.devnull]
        report = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    found = re.search(
        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads\s+"
        r"ptxas info\s+: Used (\d+) registers",
        report,
    )
    if found is None:
        raise RuntimeError(f"no resource report in ptxas's output:\n{report}")
    stack, spill_stores, spill_loads, registers = map(int, found.groups())
    return {
        "registers": registers,
        "spill_stores": spill_stores,
        "spill_loads": spill_loads,
        "stack_frame": stack,
        "triton_compile_s": round(seconds, 1),
        "ptx_lines": compiled.asm["ptx"].count("\n"),
        "ptx_ops": ptx_op_counts(compiled.asm["ptx"]),
        "triton": triton.__version__,
    }


def markdown(result: dict) -> str:
    lines = [
        "| kernel | lmax | C | warps | registers | spill stores / loads (bytes) | Triton compile s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        kernel = f"{r['kernel']} {r['dtype']}" if "dtype" in r else r["kernel"]
        lines.append(
            f"| {kernel} | {r['lmax']} | {r['channels']} | {r['num_warps']} | {r['registers']} | "
            f"{r['spill_stores']} / {r['spill_loads']} | {r['triton_compile_s']} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write the results JSON here")
    p.add_argument("--configs", nargs="+", default=CONFIGS, help="lmax:channels[:float64] ...")
    args = p.parse_args(argv)
    import jax

    rows = []
    for config in args.configs:
        lmax, channels, *dtype = config.split(":")
        lmax, channels, dtype = int(lmax), int(channels), (dtype or ["float32"])[0]
        if dtype not in ("float32", "float64"):
            p.error(f"--configs: dtype must be float32 or float64, got {dtype!r} in {config!r}")
        for name, (ir_text, warps) in capture_triton_ir(lmax, channels, dtype).items():
            row = {"kernel": name, "lmax": lmax, "channels": channels, "num_warps": warps}
            if dtype != "float32":
                row["dtype"] = dtype
            row.update(compile_for_hopper(ir_text, warps))
            print(json.dumps(row), flush=True)
            rows.append(row)
    result = {
        "command": "python benchmarks/triton_resources.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": f"{platform.machine()}, {os.cpu_count()} cores (compile times are this machine's)",
        "target": "sm_90a (Triton GPUTarget cuda 90), ptxas from Triton's package",
        "versions": {"jax": jax.__version__, "triton": rows[0]["triton"] if rows else None},
        "rows": rows,
    }
    print(markdown(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
