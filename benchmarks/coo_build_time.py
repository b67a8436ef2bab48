"""Time to build COO tables from nothing (cold caches), each case in a fresh interpreter.

    python benchmarks/coo_build_time.py

Prints one line per case: wall time of `tensor_product_coo` (Clebsch–Gordan included) and of the
derived tables (VJP permutations, trilinear table, packed records, groupings).
"""

import subprocess
import sys

CASES = {
    "0e+1o+2e+3o x 0e+1o+2e+3o": ("0e+1o+2e+3o", "0e+1o+2e+3o"),
    "l<=8 x l<=8": ("+".join(f"{l}{'eo'[l % 2]}" for l in range(9)),) * 2,
}

CHILD = """
import sys, time
from e3j_core import tensor_product_coo
t = time.perf_counter(); coo = tensor_product_coo(sys.argv[1], sys.argv[2]); t1 = time.perf_counter() - t
t = time.perf_counter()
coo.vjp_x, coo.vjp_y, coo.trilinear, coo.table.packed(), coo.table.by_i0_i1
t2 = time.perf_counter() - t
print(f"{coo.num_paths} {coo.table.num_records} {t1:.4f} {t2:.4f}")
"""

if __name__ == "__main__":
    print(f"{'case':32s} {'paths':>6s} {'records':>8s} {'build [s]':>10s} {'derived [s]':>12s}")
    for name, (a, b) in CASES.items():
        out = subprocess.run([sys.executable, "-c", CHILD, a, b], capture_output=True, text=True, check=True)
        paths, records, t1, t2 = out.stdout.split()
        print(f"{name:32s} {paths:>6s} {records:>8s} {t1:>10s} {t2:>12s}")
