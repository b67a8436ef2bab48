"""The paper's scaling-in-L benchmark (Fig. 5–6 shape): tensor product forward and backward vs lmax.

``lmax ⊗ lmax → lmax`` over all irreps up to lmax, for lmax 1…8, at a fixed batch and channel count,
for every usable backend on the default platform and e3nn-jax: ``python -m e3j bench`` with those
arguments, results named after the machine under ``benchmarks/results/``:

    python benchmarks/scaling_l.py                      # this machine's default platform
    python benchmarks/scaling_l.py --backends reference e3nn --runs 10

On a GPU run it from ``benchmarks/device.sh``'s checkout; on a TPU from the TPU entry point (same
command). Above the Pallas kernels' unroll limit (lmax ≥ 4) their records are walked, so every lmax runs
on every kernel backend.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lmax", nargs="+", type=int, default=list(range(1, 9)))
    p.add_argument("--channels", type=int, default=32)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--backends", nargs="+", default=None, help="implementations (default: every usable one + e3nn)")
    p.add_argument("--out", default="benchmarks/results", help="directory for <machine>-scaling-l.{json,md}")
    args = p.parse_args(argv)
    from e3j._bench import device_slug  # cpu, nvidia-h200, tpu-v5-lite

    stem = Path(args.out) / f"{device_slug()}-scaling-l"
    cmd = [sys.executable, "-m", "e3j", "bench", "--ops", "tensor_product", "--directions", "fwd", "bwd"]
    cmd += ["--lmax", *map(str, args.lmax), "--channels", str(args.channels), "--sizes", str(args.batch)]
    cmd += ["--runs", str(args.runs), "--json", f"{stem}.json", "--markdown", f"{stem}.md", "--no-progress"]
    if args.backends:
        cmd += ["--backends", *args.backends]
    print(" ".join(cmd), flush=True)
    return subprocess.run(cmd, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
