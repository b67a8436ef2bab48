"""Where the Pallas kernels stop unrolling COO records: compile cost of unrolled vs walked kernels vs lmax.

For each lmax (``lmax ⊗ lmax → lmax`` with all irreps up to lmax, as the paper's scaling plots) and
each kernel, forces the unrolled or the walked formulation (``_records.UNROLL_RECORDS``) and measures

* Pallas GPU: the time to trace and lower for ``cuda`` here (Pallas emits the Triton IR then), and —
  with Triton installed (``pip install triton==3.6.0``) — Triton's compile time for ``sm_90a`` and
  ptxas's registers and spills (``benchmarks/triton_resources.py``'s method);
* Pallas TPU: the time to trace and lower for ``tpu`` (Pallas emits the Mosaic program then; Mosaic
  compiles it only on a TPU) and the size of that program, and the kernels' VMEM buffers
  (:mod:`e3j_pallas_tpu.vmem`) at the chosen tile.

    python benchmarks/unroll_switch.py --out benchmarks/results/cpu-unroll-switch.json

Times are this machine's (a shared CPU: noisy); registers and program sizes are not.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

KERNELS = ("tp_fwd", "tp_bwd", "conv_fwd", "conv_bwd")


def _calls(kernels, coo, channels: int):
    import jax.numpy as jnp
    from triton_resources import kernel_calls  # this folder's script: the same abstract calls

    return kernel_calls(kernels, coo, channels, jnp.float32)


def _lower(fn, args, platform_: str, device_kind: str):
    import jax
    from jax.sharding import AbstractDevice, AbstractMesh

    num_cores = 1 if platform_ == "tpu" else None
    mesh = AbstractMesh(
        (1,), ("x",), abstract_device=AbstractDevice(device_kind=device_kind, num_cores=num_cores, platform=platform_)
    )
    start = time.perf_counter()
    with jax.sharding.use_abstract_mesh(mesh):
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=(platform_,)).as_text()
    return time.perf_counter() - start, text


def measure_gpu(lmax: int, channels: int, kernel: str, walk: bool, triton: bool) -> dict:
    from e3j_pallas_gpu import _records

    from e3j.backends import get_backend, kernels_of
    from e3j_core import Irreps, tensor_product_coo

    irreps = Irreps.spherical_harmonics(lmax)
    coo = tensor_product_coo(irreps, irreps, filter=irreps)
    saved = _records.UNROLL_RECORDS
    _records.UNROLL_RECORDS = -1 if walk else 10**9
    try:
        fn, args = _calls(kernels_of(get_backend("pallas_gpu")), coo, channels)[kernel]
        row = {"backend": "pallas_gpu", "kernel": kernel, "lmax": lmax, "channels": channels}
        row.update({"records": coo.table.num_records, "mode": "walked" if walk else "unrolled"})
        if triton:
            sys.path.insert(0, str(Path(__file__).parent))
            import triton_resources

            start = time.perf_counter()
            (ir_text, warps) = _capture_one(triton_resources, fn, args)
            row["lower_s"] = round(time.perf_counter() - start, 2)
            row.update(triton_resources.compile_for_hopper(ir_text, warps))
        else:
            seconds, _ = _lower(fn, args, "cuda", "NVIDIA H100 80GB HBM3")
            row["lower_s"] = round(seconds, 2)
    finally:
        _records.UNROLL_RECORDS = saved
    return row


def _capture_one(triton_resources, fn, args):
    """The Triton IR and warps of the one kernel in ``fn`` (triton_resources' capture, for any call)."""
    import re

    from jax._src.pallas.triton import pallas_call_registration as registration

    lower_module = registration.lowering.lower_jaxpr_to_triton_module  # private: where Pallas builds the IR
    modules: list[str] = []

    def capture(*a, **k):
        result = lower_module(*a, **k)
        modules.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    registration.lowering.lower_jaxpr_to_triton_module = capture
    try:
        _, text = _lower(fn, args, "cuda", "NVIDIA H100 80GB HBM3")
    finally:
        registration.lowering.lower_jaxpr_to_triton_module = lower_module
    warps = [int(w) for w in re.findall(r"num_warps = (\d+) : i32", text)]
    if len(modules) != 1 or len(warps) != 1:
        raise RuntimeError(f"expected one Triton kernel, found {len(modules)}")
    return modules[0], warps[0]


def measure_tpu(lmax: int, channels: int, kernel: str, walk: bool) -> dict:
    from e3j_pallas_tpu import _records, vmem

    from e3j.backends import get_backend, kernels_of
    from e3j_core import Irreps, tensor_product_coo

    irreps = Irreps.spherical_harmonics(lmax)
    coo = tensor_product_coo(irreps, irreps, filter=irreps)
    saved = _records.UNROLL_RECORDS
    _records.UNROLL_RECORDS = -1 if walk else 10**9
    try:
        fn, args = _calls(kernels_of(get_backend("pallas_tpu")), coo, channels)[kernel]
        seconds, text = _lower(fn, args, "tpu", "TPU v5 lite")
    finally:
        _records.UNROLL_RECORDS = saved
    opts = {"channels": channels, "itemsize": 4, "y_channels": False, "walk": walk}
    tile = {
        "tp_fwd": lambda: vmem.tensor_product_tile(coo, **opts),
        "tp_bwd": lambda: vmem.tensor_product_tile(coo, backward=True, **opts),
        "conv_fwd": lambda: vmem.convolution_tile(coo, **opts),
        "conv_bwd": lambda: vmem.convolution_bwd_tile(coo, **opts),
    }[kernel]()
    row = {"backend": "pallas_tpu", "kernel": kernel, "lmax": lmax, "channels": channels}
    row.update({"records": coo.table.num_records, "mode": "walked" if walk else "unrolled"})
    row.update({"lower_s": round(seconds, 2), "program_kib": round(len(text) / 1024)})
    row.update({"tile": tile.edges, "vmem_buffers_mib": round(tile.total / 2**20, 2)})
    if walk:
        tables = {"tp_fwd": [coo.table], "tp_bwd": [coo.vjp_x, coo.vjp_y], "conv_fwd": [coo.table]}
        tables["conv_bwd"] = [coo.trilinear.transpose(k) for k in (1, 2, 3)]
        row["smem_records_kib"] = round(_records.smem_bytes(*tables[kernel]) / 1024, 1)
    return row


def markdown(rows: list[dict]) -> str:
    keys = [
        k
        for k in (
            "backend",
            "kernel",
            "lmax",
            "records",
            "mode",
            "lower_s",
            "triton_compile_s",
            "registers",
            "spill_stores",
            "program_kib",
            "tile",
            "vmem_buffers_mib",
            "smem_records_kib",
        )
        if any(k in r for r in rows)
    ]
    lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write the results JSON (and a .md beside it) here")
    p.add_argument("--backends", nargs="+", default=["pallas_gpu", "pallas_tpu"])
    p.add_argument("--lmax", nargs="+", type=int, default=[1, 2, 3, 4, 5, 6])
    p.add_argument("--kernels", nargs="+", default=list(KERNELS))
    p.add_argument("--modes", nargs="+", default=["unrolled", "walked"])
    p.add_argument("--channels", type=int, default=128)
    p.add_argument("--max-unrolled-records", type=int, default=1200, help="skip unrolled tables larger than this")
    p.add_argument("--triton", action="store_true", help="compile the GPU kernels with Triton (registers, spills)")
    args = p.parse_args(argv)
    import jax

    from e3j_core import Irreps, tensor_product_coo

    rows = []
    for backend in args.backends:
        for lmax in args.lmax:
            irreps = Irreps.spherical_harmonics(lmax)
            records = tensor_product_coo(irreps, irreps, filter=irreps).table.num_records
            for kernel in args.kernels:
                for mode in args.modes:
                    walk = mode == "walked"
                    if not walk and records > args.max_unrolled_records:
                        continue
                    if backend == "pallas_gpu":
                        row = measure_gpu(lmax, args.channels, kernel, walk, args.triton)
                    else:
                        row = measure_tpu(lmax, args.channels, kernel, walk)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    result = {
        "command": "python benchmarks/unroll_switch.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": f"{platform.machine()}, {os.cpu_count()} cores, shared (times are this machine's, noisy)",
        "versions": {"jax": jax.__version__},
        "rows": rows,
    }
    table = markdown(rows)
    print(table)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        Path(args.out).with_suffix(".md").write_text(
            f"`{result['command']}` ({result['date']}, {result['host']})\n\n{table}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
