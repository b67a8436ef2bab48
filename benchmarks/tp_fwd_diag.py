"""Why the H200 sweep timed the tensor-product forward at 7 % of a copy: timings that tell the causes apart.

The sweep (``python -m e3j bench --jobs 12``) timed the lmax-3 TP forward (C = 128, 16,384 rows) first,
at 5.4 ms on pallas_mosaic and pallas_gpu and 7.9 ms on cuda, while the threads that compiled the later
kernels were still lowering them: Python that holds the GIL for tens of seconds. A timed call gives the
GIL up while it waits for the device and gets it back one switch interval (5 ms) later: a 0.5-ms wait
that releases the GIL (``time.sleep``) times at 5.7 ms beside a spinning Python thread on a CPU (20.7 ms
at a 20-ms switch interval). The backward, timed after the last lowering ended, ran at the copy's
bandwidth. This script times each backend's forward (and, with
``--bwd``, its backward) in a process with nothing else running, then again beside a Python thread that
holds the GIL, and as ``--stream`` calls enqueued back to back (host overhead amortized: the kernel's
own time), beside a copy of 2^28, 2^30 and 2^31 bytes; ``--profile`` calls run under the JAX profiler,
whose device planes give each kernel's duration. Expected if the GIL is the cause: ``quiet`` and
``stream`` near the copy, ``beside_python`` ≈ ``quiet`` + 5 ms, the profiled kernel ≈ ``stream``. A
``stream`` or kernel time still far above the copy would point at the kernel instead.

    python benchmarks/tp_fwd_diag.py --out benchmarks/results/nvidia-h200-tp-fwd-diag.json   # ~60 s on an H200
    python benchmarks/tp_fwd_diag.py --backends reference --batch 512 --channels 32           # rehearsal on a CPU
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import json
import os
import sys
import tempfile
import threading
import time

import jax

from e3j import _sweep
from e3j._bench import copy_bandwidth, time_call


def stream_seconds(fn, *args, calls: int) -> float:
    """Seconds per call of ``calls`` calls enqueued back to back and waited for once (after one warm-up)."""
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        out = [fn(*args) for _ in range(calls)]
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / calls)
        del out
    return best


def device_events(fn, *args, calls: int, top: int = 6) -> list[dict]:
    """:func:`summarize_device_planes` of a JAX profile of ``calls`` calls: the kernels' own times."""
    from jax.profiler import ProfileData

    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            for _ in range(calls):
                jax.block_until_ready(fn(*args))
        (path,) = glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True)
        return summarize_device_planes(ProfileData.from_file(path).planes, top=top)


def summarize_device_planes(planes, top: int = 6) -> list[dict]:
    """Events of the profile planes named ``/device:...``, by plane, line and name.

    ``[{"plane", "line", "name", "count", "mean_s"}]``, the ``top`` largest by total time (durations
    are in nanoseconds in the profile); empty where there is no device plane (a CPU).
    """
    totals = collections.defaultdict(lambda: [0, 0.0])
    for plane in planes:
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            for event in line.events:
                entry = totals[(plane.name, line.name, event.name)]
                entry[0] += 1
                entry[1] += event.duration_ns * 1e-9
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]
    return [
        {"plane": plane, "line": line, "name": name[:120], "count": n, "mean_s": total / n}
        for (plane, line, name), (n, total) in ranked
    ]


def beside_python(fn, *args, runs: int) -> float:
    """:func:`time_call` while another thread runs pure Python (as the sweep's lowering threads did)."""
    stop = [False]

    def spin():  # bytecode only, as tracing is: the GIL is given up only when another thread asks
        n = 0
        while not stop[0]:
            n += 1

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        return time_call(fn, *args, runs=runs)
    finally:
        stop[0] = True
        thread.join()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", nargs="+", default=None, help="default: pallas_mosaic pallas_gpu cuda, if usable")
    p.add_argument("--lmax", type=int, default=3)
    p.add_argument("--channels", type=int, default=128)
    p.add_argument("--batch", type=int, default=16384)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--stream", type=int, default=20, help="calls enqueued back to back per stream timing")
    p.add_argument("--bwd", action="store_true", help="also the backward (a control: it measured at the copy)")
    p.add_argument("--profile", type=int, default=5, help="calls under the JAX profiler (kernel times; 0: none)")
    p.add_argument("--copy-bytes", nargs="+", type=int, default=[2**28, 2**30, 2**31])
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)

    usable = _sweep.implementations(include_e3nn=False)
    impls = args.backends or [b for b in ("pallas_mosaic", "pallas_gpu", "cuda") if b in usable] or ["reference"]
    directions = ["fwd", "bwd"] if args.bwd else ["fwd"]
    device = jax.devices()[0]
    result = {
        "command": "python benchmarks/tp_fwd_diag.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": getattr(device, "device_kind", device.platform),
        "switch_interval_s": sys.getswitchinterval(),
        "copy": [],
        "rows": [],
    }
    for nbytes in args.copy_bytes:
        seconds, bw = copy_bandwidth(nbytes, runs=args.runs)
        result["copy"].append({"bytes": nbytes, "seconds": seconds, "GBps": bw / 1e9})
        print(f"copy {nbytes / 2**20:7.0f} MiB: {seconds * 1e3:7.3f} ms  {bw / 1e9:8.1f} GB/s", flush=True)
    best_copy = max(c["GBps"] for c in result["copy"]) if result["copy"] else None

    keys = [
        (_sweep.Case("tensor_product", d, args.lmax, args.channels, args.batch, 1), i)
        for d in directions
        for i in impls
    ]
    t0 = time.perf_counter()
    compiled = _sweep.Precompiled(keys, jobs=len(keys))
    try:
        for key in keys:
            case, impl = key
            row = {"direction": case.direction, "impl": impl, "lmax": case.lmax, "channels": case.channels}
            row["batch"] = case.size
            try:
                fn, fargs, nbytes = _sweep.build(case, impl)
                exe = compiled.get(key, fn)
                row["ready_after_s"] = time.perf_counter() - t0
                with compiled.timing():  # no lowering thread beside these two
                    quiet = time_call(exe, *fargs, runs=args.runs)
                    stream = stream_seconds(exe, *fargs, calls=args.stream)
                beside = beside_python(exe, *fargs, runs=args.runs)
                row.update(bytes=nbytes, quiet_s=quiet, stream_s=stream, beside_python_s=beside)
                row.update({f"{k}_GBps": nbytes / row[f"{k}_s"] / 1e9 for k in ("quiet", "stream", "beside_python")})
                if best_copy:
                    row["stream_fraction_of_copy"] = row["stream_GBps"] / best_copy
                print(
                    f"TP {case.direction} {impl:14s} quiet {quiet * 1e3:7.3f} ms  stream {stream * 1e3:7.3f} ms  "
                    f"beside Python {beside * 1e3:7.3f} ms  ({row['stream_GBps']:.0f} GB/s streamed)",
                    flush=True,
                )
                if args.profile:
                    try:
                        with compiled.timing():
                            row["device_events"] = device_events(exe, *fargs, calls=args.profile)
                    except Exception as err:  # a profiler that cannot start must not cost the timings
                        row["device_events_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
                    for event in row.get("device_events", [])[:3]:
                        print(f"    device: {event['mean_s'] * 1e3:7.3f} ms x{event['count']}  {event['name']}")
            except Exception as err:
                row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
                print(f"TP {case.direction} {impl}: {row['error']}", flush=True)
            result["rows"].append(row)
            if args.out:
                with open(args.out, "w") as fh:
                    json.dump(result, fh, indent=1)
    finally:
        compiled.close()
    return 1 if any("error" in r for r in result["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
