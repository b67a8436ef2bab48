"""The paper's unit benchmarks at its sizes, on whatever accelerator this machine has (GPU or TPU).

Runs ``python -m e3j bench`` once per suite and writes ``<out>/<device>-<suite>.json`` and ``.md``
(and ``.png`` with ``--plot``; or later, from the JSON, ``python -m e3j bench --replot F.json --plot F.png``):

- ``fig1``: tensor product, forward and backward, lmax 2 and 3, 32–256 channels, batch 2^12–2^17
  (paper Fig. 1);
- ``fig2``: convolution, forward and backward, lmax 3, 256 channels, 45 neighbours, 2^9–2^13 nodes
  (paper Fig. 2);
- ``table1``: convolution, forward and backward, 45 neighbours, N·C = 2^22 at lmax 2 and 2^21 at
  lmax 3, 64–1024 channels (paper Table 1; one results file).

Every installed backend for the platform is measured (the kernel backends and the reference), plus
e3nn-jax when importable (``--backends`` narrows the list), each beside a device copy measured in the
same run. Sizes that do not fit are recorded as errors, not fatal. Example (on the TPU or GPU machine)::

    python benchmarks/paper_sizes.py --out benchmarks/results --suites fig1 fig2 table1 --runs 100
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

SUITES = {
    "fig1": ["--ops", "tensor_product", "--lmax", "2", "3", "--channels", "32", "64", "128", "256"]
    + ["--sizes", *(str(2**k) for k in range(12, 18))],
    "fig2": ["--ops", "convolution", "--lmax", "3", "--channels", "256", "--degree", "45"]
    + ["--sizes", *(str(2**k) for k in range(9, 14))],
    # N * C fixed: 2^22 at lmax 2, 2^21 at lmax 3 (the largest power of two the paper fits on an H100)
    "table1": ["--ops", "convolution", "--lmax", "2", "3", "--channels", "64", "128", "256", "512", "1024"]
    + ["--degree", "45", "--elements", str(2**22), str(2**21)],
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--suites", nargs="+", default=["fig1", "fig2", "table1"], choices=["fig1", "fig2", "table1"])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--no-e3nn", action="store_true")
    p.add_argument("--backends", nargs="+", help="only these implementations (backend names or 'e3nn'; default: all)")
    p.add_argument("--plot", action="store_true", help="also write a PNG per suite (needs matplotlib)")
    p.add_argument("--jobs", type=int, default=1, help="compile each suite's kernels on this many threads first")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.dry_run:
        slug = "DEVICE"
    else:
        from e3j._bench import device_slug

        slug = device_slug()
    if not args.dry_run:
        out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for suite in args.suites:
        stem = out / f"{slug}-{suite}"
        cmd = ["python", "-m", "e3j", "bench", *SUITES[suite], "--runs", str(args.runs)]
        cmd += ["--json", f"{stem}.json", "--markdown", f"{stem}.md", "--no-progress"]
        if args.plot:
            cmd += ["--plot", f"{stem}.png"]
        if args.jobs > 1:
            cmd += ["--jobs", str(args.jobs)]
        if args.no_e3nn:
            cmd.append("--no-e3nn")
        if args.backends:
            cmd += ["--backends", *args.backends]
        print("+", " ".join(cmd), flush=True)
        if args.dry_run:
            continue
        failed += subprocess.run([sys.executable, *cmd[1:]], check=False).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
