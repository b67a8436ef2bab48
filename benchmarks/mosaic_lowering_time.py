"""Lowering time of the Mosaic GPU kernels for an abstract H200, without a GPU, each case in a fresh interpreter.

    JAX_PLATFORMS=cpu python benchmarks/mosaic_lowering_time.py [--lmax 3] [--channels 128] [--ab] [--json F]

Needs JAX's Mosaic GPU bindings (``pip install "jax[cuda13]"``; no GPU needed). Lowers e3j's
tensor product (batch 16384) and convolution (1024 nodes, 16 neighbours) forward and backward (VJP)
through the ``pallas_mosaic`` backend for ``cuda`` and prints the wall time of ``.lower()`` per case.
``--ab`` also lowers each kernel with the other choice of pin (docs/mosaic_gpu.md "Lowering cost"):
the tensor product with its shared-memory row loads unpinned (the code before the pin), the
convolution with them pinned as the tensor product's are, each right after the current code: compare
within one run, the timings depend on the machine's load.
"""

import argparse
import json
import subprocess
import sys

from e3j._bench import provenance

CHILD = """
import functools, sys, time
import jax
from jax.sharding import AbstractDevice, AbstractMesh
import e3j._sweep as sweep
from e3j_pallas_gpu import mosaic_convolution, mosaic_tensor_product
from e3j_pallas_gpu._mosaic import strided

op, direction, lmax, channels, variant = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
if variant == "other":  # the other choice of pin
    if op == "tensor_product":
        mosaic_tensor_product.strided = lambda v: v
    else:
        mosaic_convolution._rows = lambda ref: functools.cache(lambda i: strided(ref[:, i, :]))
size, degree = (16384, 1) if op == "tensor_product" else (1024, 16)
fn, shapes, _ = sweep.build(sweep.Case(op, direction, lmax, channels, size, degree), "pallas_mosaic", abstract=True)
device = AbstractDevice(device_kind="NVIDIA H200", num_cores=None, platform="cuda")
t = time.perf_counter()
with jax.sharding.use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=device)):
    text = fn.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
assert "mosaic_gpu_v2" in text, "not lowered to a Mosaic GPU call"
print(f"{time.perf_counter() - t:.2f}")
"""


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lmax", type=int, default=3)
    parser.add_argument("--channels", type=int, default=128)
    parser.add_argument("--ab", action="store_true", help="also each kernel with the other choice of pin")
    parser.add_argument("--json", help="also write the rows here, with the command, date and host")
    args = parser.parse_args(argv)
    record = provenance("benchmarks/mosaic_lowering_time.py", argv)  # the load average at the start
    rows = []
    print(f"{'op':16s} {'dir':4s} {'row loads':10s} {'lower [s]':>10s}")
    for op in ("tensor_product", "convolution"):
        for direction in ("fwd", "bwd"):
            variants = ("current", "other") if args.ab else ("current",)
            for variant in variants:
                child = [op, direction, str(args.lmax), str(args.channels), variant]
                out = subprocess.run([sys.executable, "-c", CHILD, *child], capture_output=True, text=True, check=True)
                pinned = (op == "tensor_product") == (variant == "current")
                label = "pinned" if pinned else "unpinned"
                seconds = float(out.stdout.split()[-1])
                rows.append({"op": op, "direction": direction, "row_loads": label, "seconds": seconds})
                print(f"{op:16s} {direction:4s} {label:10s} {seconds:10.1f}", flush=True)
    if args.json:
        import jax

        record["versions"] = {"jax": jax.__version__}
        record.update(lmax=args.lmax, channels=args.channels, device_kind="NVIDIA H200 (abstract)", rows=rows)
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
