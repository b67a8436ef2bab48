"""``python -m e3j bench``: sweeps of the tensor product and the convolution (private).

Every installed backend that can run on the default platform is measured, plus e3nn-jax when it is
importable, over lmax, channel count and batch (or node) count, forward and backward. Each row
carries the paper's throughput beside the bandwidth of a jitted copy measured in the same run (and
the datasheet figure for known accelerators).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
import numpy as np

from e3j_core.dependencies import install_hint

from . import backends as _backends
from ._bench import (
    convolution_bytes,
    copy_bandwidth,
    datasheet_bandwidth,
    default_copy_bytes,
    tensor_product_bytes,
    time_call,
)


@dataclass(frozen=True)
class Case:
    op: str  # "tensor_product" | "convolution"
    direction: str  # "fwd" | "bwd"
    lmax: int
    channels: int
    size: int  # batch (tensor product) or nodes (convolution)
    degree: int  # neighbours per node (convolution)


def cases(ops, directions, lmaxes, channels, sizes, degree, elements=None):
    """Every measurement of a sweep, in order.

    ``elements`` (one value, or one per lmax) fixes the product of size and channel count instead of
    ``sizes``, as the paper's Table 1 does (N·C = 2^22 at lmax 2, 2^21 at lmax 3): each channel count
    ``c`` is measured at size ``elements // c``.
    """
    if elements is not None:
        per_lmax = _elements_by_lmax(elements, lmaxes)
        for lmax, total in per_lmax.items():
            small = [c for c in channels if total // c < 1]
            if small:
                raise ValueError(f"--elements: {total} at lmax {lmax} is smaller than the channel count(s) {small}")
    for op in ops:
        for direction in directions:
            for lmax in lmaxes:
                for c in channels:
                    for n in sizes if elements is None else [per_lmax[lmax] // c]:
                        yield Case(op, direction, lmax, c, n, degree)


def _elements_by_lmax(elements: list[int], lmaxes: list[int]) -> dict[int, int]:
    """``--elements`` (one value, or one per lmax) as ``{lmax: size x channels}``."""
    if len(elements) not in (1, len(lmaxes)):
        raise ValueError(f"--elements: expected one value or one per --lmax value ({len(lmaxes)}), got {elements}")
    return dict(zip(lmaxes, elements * len(lmaxes) if len(elements) == 1 else elements))


def _irreps(lmax):
    from e3j_core import Irreps

    return Irreps.spherical_harmonics(lmax)


def _graph(nodes, degree, seed=0):
    rng = np.random.default_rng(seed)
    receivers = np.repeat(np.arange(nodes), degree)
    senders = (receivers + rng.integers(1, max(nodes, 2), size=receivers.shape)) % max(nodes, 1)
    perm = rng.permutation(receivers.size)
    return senders[perm].astype(np.int32), receivers[perm].astype(np.int32)


def build(case: Case, impl: str, dtype=jnp.float32, *, abstract: bool = False):
    """``(jitted fn, args, bytes)`` for one measurement; ``impl`` is a backend name or ``"e3nn"``.

    With ``abstract=True`` the float operands are ``ShapeDtypeStruct``s (for compile-only memory
    analysis at sizes that need not fit in memory).
    """
    from .convolution import Convolution
    from .graph import Graph
    from .tensor_product import TensorProduct

    irreps = _irreps(case.lmax)
    key = jax.random.key(case.lmax * 1000 + case.channels)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    itemsize = jnp.dtype(dtype).itemsize
    backward = case.direction == "bwd"
    if case.op == "tensor_product":
        op = TensorProduct(irreps, irreps, filter=irreps)
        B, C = case.size, case.channels
        shapes = [(B, irreps.dim, C), (B, irreps.dim), (B, op.irreps_out.dim, C)]
        if abstract:
            x, y, dz = (jax.ShapeDtypeStruct(shape, dtype) for shape in shapes)
        else:
            x, y, dz = (jax.random.normal(k, shape, dtype) for k, shape in zip((k1, k2, k3), shapes))
        nbytes = tensor_product_bytes(op.coo, B, C, y_channels=False, itemsize=itemsize, backward=backward)
        if impl == "e3nn":
            f = _e3nn_tensor_product(str(irreps))
        else:
            f = lambda x, y, op=op, impl=impl: op(x, y, backend=impl)  # noqa: E731
        if backward:
            return jax.jit(lambda x, y, dz, f=f: jax.vjp(f, x, y)[1](dz)), (x, y, dz), nbytes
        return jax.jit(f), (x, y), nbytes
    op = Convolution(irreps, irreps, filter=irreps)
    N, C = case.size, case.channels
    snd, rcv = _graph(N, case.degree)
    E = snd.size
    graph = Graph.from_edges(snd, rcv, N)
    shapes = [(N, irreps.dim, C), (E, irreps.dim), (E, op.num_paths, C), (N, op.irreps_out.dim, C)]
    if abstract:
        x, y, s, dm = (jax.ShapeDtypeStruct(shape, dtype) for shape in shapes)
    else:
        x, y, s, dm = (jax.random.normal(k, shape, dtype) for k, shape in zip((k1, k2, k3, k4), shapes))
    nbytes = convolution_bytes(op.coo, N, E, C, y_channels=False, itemsize=itemsize, backward=backward)
    if impl == "e3nn":
        f = _e3nn_convolution(str(irreps), op.coo.i3, snd, rcv, N)
    else:
        f = lambda x, y, s, op=op, g=graph, impl=impl: op(x, y, s, g, backend=impl)  # noqa: E731
    if backward:
        return jax.jit(lambda x, y, s, dm, f=f: jax.vjp(f, x, y, s)[1](dm)), (x, y, s, dm), nbytes
    return jax.jit(f), (x, y, s), nbytes


def _e3nn_tensor_product(irreps: str):
    """e3nn-jax's tensor product of ``irreps ⊗ irreps → irreps``, channel by channel: ``x [B, D, C]``,
    ``y [B, D]`` → ``[B, D_out, C]``."""
    import e3nn_jax as e3nn

    def f(x, y):
        def one(a, b):  # one channel: e3nn's tensor product of the irreps features
            return e3nn.tensor_product(
                e3nn.IrrepsArray(irreps, a), e3nn.IrrepsArray(irreps, b), filter_ir_out=irreps
            ).array

        return jax.vmap(one, in_axes=(-1, None), out_axes=-1)(x, y)

    return f


def _e3nn_convolution(irreps: str, i3, senders, receivers, nodes):
    """The gather → e3nn-jax tensor product → weights → scatter-sum of the convolution, unfused."""
    i3 = jnp.asarray(i3)
    snd, rcv = jnp.asarray(senders), jnp.asarray(receivers)
    tp = _e3nn_tensor_product(irreps)

    def f(x, y, s):
        msg = tp(x[snd], y) * s[:, i3, :]
        return jax.ops.segment_sum(msg, rcv, nodes)

    return f


def peak_bytes(impl: str, lmax: int, channels: int, nodes: int, degree: int) -> tuple[int, int]:
    """``(XLA peak, I/O bytes)`` of the convolution's jitted backward pass (VJP), compile only.

    Peak is arguments + outputs + temporaries of XLA's buffer assignment; I/O is the paper's
    backward count: primals, the output cotangent and the input cotangents.
    """
    fn, args, nbytes = build(Case("convolution", "bwd", lmax, channels, nodes, degree), impl, abstract=True)
    mem = fn.lower(*args).compile().memory_analysis()
    peak = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes - mem.alias_size_in_bytes
    return int(peak), int(nbytes)


def max_nodes(impl: str, lmax: int, channels: int, degree: int, budget: int, *, start: int = 1024) -> int:
    """The largest node count (to ~3 %) whose convolution backward pass fits in ``budget`` bytes."""
    lo, hi = 0, start
    while peak_bytes(impl, lmax, channels, hi, degree)[0] <= budget:
        lo, hi = hi, hi * 2
        if hi > 2**31 // max(degree, 1):
            return lo
    while hi - lo > max(1, lo // 32):
        mid = (lo + hi) // 2
        if peak_bytes(impl, lmax, channels, mid, degree)[0] <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def device_memory(device) -> int:
    """Bytes of memory of ``device`` (accelerator memory, or the host's RAM for a CPU)."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _memory_nodes(args, lmax: int, channels: int) -> int:
    if args.elements is None:
        return args.sizes[0]
    return _elements_by_lmax(args.elements, args.lmax)[lmax] // channels


def memory_rows(args, impls) -> list[dict]:
    budget = device_memory(jax.devices()[0]) if args.memory_budget is None else args.memory_budget
    rows = []
    for lmax in args.lmax:
        for c in args.channels:
            for impl in impls:
                row = {"op": "convolution_memory", "impl": impl, "lmax": lmax, "channels": c, "degree": args.degree}
                try:
                    nodes = _memory_nodes(args, lmax, c)
                    peak, io = peak_bytes(impl, lmax, c, nodes, args.degree)
                    row.update(nodes=nodes, peak_bytes=peak, io_bytes=io, peak_over_io=peak / io)
                    row.update(budget_bytes=budget, max_nodes=max_nodes(impl, lmax, c, args.degree, budget))
                except Exception as err:
                    row.update(error=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
                rows.append(row)
    return rows


def implementations(include_e3nn: bool = True) -> list[str]:
    """Loadable backends for the default platform (reference included), then ``"e3nn"`` if importable.

    Backends used only by name (``auto=False``: interpreters of accelerator kernels) are left out;
    ``--backends`` can still name them.
    """
    platform_ = _backends.device_platform(jax.devices()[0])
    names = []
    for b in _backends.available_backends():
        if b.auto and b.incompatibility() is None and platform_ in b.platforms:
            try:
                _backends.kernels_of(b)
            except Exception:  # a backend that cannot load is reported by `e3j info`, not measured
                continue
            names.append(b.name)
    if include_e3nn:
        try:
            import e3nn_jax  # noqa: F401

            names.append("e3nn")
        except ImportError:
            pass
    return names


def _progress(i, n, label, stream=sys.stderr):
    width = 30
    done = int(width * i / max(n, 1))
    stream.write(f"\r[{'#' * done}{'.' * (width - done)}] {i}/{n} {label[:60]:60s}")
    if i == n:
        stream.write("\n")
    stream.flush()


def run(args) -> dict:
    """Measure the sweep; with ``args.json`` the file is rewritten after every row (``"partial": true``
    until the end), so a sweep cut short by a time limit keeps what it measured."""
    impls = args.backends or implementations(include_e3nn=not args.no_e3nn)
    todo = list(cases(args.ops, args.directions, args.lmax, args.channels, args.sizes, args.degree, args.elements))
    device = jax.devices()[0]
    kind = getattr(device, "device_kind", device.platform)
    copy_bytes = default_copy_bytes(device) if args.copy_bytes is None else args.copy_bytes
    copy_s, copy_bw = copy_bandwidth(copy_bytes, runs=args.runs)
    rows = []
    result = {
        "command": "python -m e3j " + " ".join(sys.argv[1:] if args.argv is None else args.argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": {"platform": device.platform, "kind": kind, "host": platform.machine(), "cores": os.cpu_count()},
        "versions": {"jax": jax.__version__, **_versions(impls)},
        "copy": {"bytes": copy_bytes, "seconds": copy_s, "GBps": copy_bw / 1e9},
        "datasheet_GBps": (datasheet_bandwidth(kind) or 0) / 1e9 or None,
        "method": f"mean of the fastest 20% of {args.runs} runs, gc disabled; bytes of inputs + outputs "
        "(backward: primals, output cotangents, input cotangents)",
        "rows": rows,
    }
    total = len(todo) * len(impls)
    compiled = Precompiled([(case, impl) for case in todo for impl in impls], args.jobs)
    try:
        step = 0
        for case in todo:
            for impl in impls:
                step += 1
                if not args.no_progress:
                    label = f"{case.op} {case.direction} l={case.lmax} C={case.channels} n={case.size}"
                    _progress(step - 1, total, f"{label} {impl}")
                row = {**asdict(case), "impl": impl}
                try:
                    fn, fargs, nbytes = build(case, impl)
                    exe = compiled.get((case, impl), fn)
                    with compiled.timing():
                        seconds = time_call(exe, *fargs, runs=args.runs)
                    row.update(
                        seconds=seconds,
                        bytes=nbytes,
                        GBps=nbytes / seconds / 1e9,
                        fraction_of_copy=nbytes / seconds / copy_bw,
                    )
                except Exception as err:  # e.g. out of memory for e3nn's materialized messages
                    row.update(error=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
                rows.append(row)
                if args.json:
                    _write_json({**result, "partial": True}, args.json)
    finally:
        compiled.close()
    if not args.no_progress:
        _progress(total, total, "done")
    if args.memory:
        rows += memory_rows(args, impls)
    return result


def _lower(key: tuple[Case, str]):
    """The lowered program of ``key`` on abstract operands (Python: tracing, Pallas' kernel lowering)."""
    fn, shapes, _ = build(*key, abstract=True)
    return fn.lower(*shapes)


class _Quiet:
    """Keeps Python-heavy work of other threads out of a timing.

    Lowering a Pallas kernel is Python that holds the GIL for seconds (Mosaic GPU's lmax-3 kernels: tens
    of seconds). A timed call gives the GIL up while it waits for the device and gets it back one switch
    interval (``sys.getswitchinterval()``, 5 ms) after a lowering thread took it: a 0.4-ms kernel timed
    as ~5.4 ms on the H200. Lowerings run one at a time (they share the GIL anyway; one at a time, the
    first kernels are ready first) and wait while a timing is announced or running; a timing waits for
    the lowering under way. Compilation proper (XLA, Triton, ptxas) releases the GIL and runs on.
    """

    def __init__(self):
        import threading

        self._cond = threading.Condition()
        self._timing = 0
        self._lowering = 0

    @contextlib.contextmanager
    def lowering(self):
        with self._cond:
            self._cond.wait_for(lambda: self._timing == 0 and self._lowering == 0)
            self._lowering += 1
        try:
            yield
        finally:
            with self._cond:
                self._lowering -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def timing(self):
        with self._cond:
            self._timing += 1
            self._cond.wait_for(lambda: self._lowering == 0)
        try:
            yield
        finally:
            with self._cond:
                self._timing -= 1
                self._cond.notify_all()


class Precompiled:
    """Executables of a sweep compiling on ``jobs`` threads, in measurement order.

    XLA's compilation (Triton's and the CUDA toolchain's included) releases the GIL, so a many-core
    host compiles the kernels in parallel while the first ones are already being timed, instead of
    compiling one before each measurement; a sweep cut short by a time limit still has its first
    rows. Operands are abstract: nothing is allocated on the device. ``jobs <= 1`` compiles nothing.

    Lowering (Python, GIL-bound) never overlaps a timing: time inside :meth:`timing`.
    """

    def __init__(self, keys: list[tuple[Case, str]], jobs: int, *, lower=_lower):
        from concurrent.futures import ThreadPoolExecutor

        self._quiet = _Quiet()
        self._lower = lower
        self._pool = ThreadPoolExecutor(jobs) if jobs > 1 else None
        self._futures = {key: self._pool.submit(self._compile, key) for key in keys} if self._pool else {}

    def _compile(self, key: tuple[Case, str]):
        try:
            with self._quiet.lowering():
                lowered = self._lower(key)
            return lowered.compile()
        except Exception:  # e.g. e3nn's messages beyond memory: met again, and reported, when measured
            return None

    def timing(self):
        """Context in which no worker thread lowers (holds the GIL): wrap each ``time_call`` in it."""
        return self._quiet.timing()

    def get(self, key: tuple[Case, str], default):
        """The compiled executable of ``key`` (waiting for it), or ``default`` if it did not compile."""
        future = self._futures.pop(key, None)  # measured once: the executable is not kept
        exe = future.result() if future is not None else None
        return default if exe is None else exe

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _write_json(result: dict, path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)


def _versions(impls):
    out = {}
    for b in _backends.available_backends():
        if b.name in impls:
            out[b.name] = b.version
    if "e3nn" in impls:
        import e3nn_jax

        out["e3nn_jax"] = e3nn_jax.__version__
    return out


def table(result: dict) -> str:
    """A Markdown table (the paper's Table 1 style: GB/s per op, direction and implementation)."""
    rows = result["rows"]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    head = "| op | dir | lmax | C | size | " + " | ".join(f"{i} GB/s" for i in impls) + " |"
    lines = [head, "|" + " --- |" * (5 + len(impls))]
    rows = [r for r in rows if r["op"] != "convolution_memory"]
    keys = list(dict.fromkeys((r["op"], r["direction"], r["lmax"], r["channels"], r["size"]) for r in rows))
    for k in keys:
        cells = []
        for i in impls:
            r = next(
                (
                    r
                    for r in rows
                    if (r["op"], r["direction"], r["lmax"], r["channels"], r["size"]) == k and r["impl"] == i
                ),
                None,
            )
            cells.append("error" if r is None or "error" in r else f"{r['GBps']:.2f}")
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {k[4]} | " + " | ".join(cells) + " |")
    memory = memory_table(result)
    if memory:
        lines += ["", memory]
    summary = table1(result)
    if summary:
        lines += ["", summary]
    copy = result["copy"]["GBps"]
    lines.append("")
    lines.append(
        f"Device: {result['device']['kind']}; jitted copy in the same run: {copy:.2f} GB/s"
        + (f"; datasheet {result['datasheet_GBps']:.0f} GB/s" if result["datasheet_GBps"] else "")
    )
    if result.get("partial"):
        lines.append(f"Partial results: the sweep stopped after {len(result['rows'])} measurements.")
    return "\n".join(lines)


def memory_table(result: dict) -> str:
    """The convolution backward's memory rows of a sweep as a Markdown table ("" without them)."""
    memory = [r for r in result["rows"] if r["op"] == "convolution_memory"]
    if not memory:
        return ""
    lines = [
        "| convolution backward memory | lmax | C | degree | nodes | XLA peak GB | peak / I/O | max nodes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in memory:
        if "error" in r:
            lines.append(f"| {r['impl']} | {r['lmax']} | {r['channels']} | {r['degree']} | error | | | |")
            continue
        lines.append(
            f"| {r['impl']} | {r['lmax']} | {r['channels']} | {r['degree']} | {r['nodes']} | "
            f"{r['peak_bytes'] / 1e9:.3f} | {r['peak_over_io']:.2f} | {r['max_nodes']} |"
        )
    budget = memory[0].get("budget_bytes")
    if budget:
        lines.append(f"max nodes: largest node count whose backward pass fits in {budget / 1e9:.1f} GB")
    return "\n".join(lines)


def table1(result: dict) -> str:
    """The paper's Table 1 view: maximal convolution throughput (GB/s) by channel count.

    One row per implementation, direction and lmax, one column per channel count; each cell is the
    best throughput over the measured node counts ("-" when none succeeded). Empty without
    convolution rows.
    """
    rows = [r for r in result["rows"] if r["op"] == "convolution" and "direction" in r]
    if not rows:
        return ""
    channels = sorted({r["channels"] for r in rows})
    head = "| max convolution GB/s | dir | lmax | " + " | ".join(f"C={c}" for c in channels) + " |"
    lines = [head, "|" + " --- |" * (3 + len(channels))]
    for impl, direction, lmax in dict.fromkeys((r["impl"], r["direction"], r["lmax"]) for r in rows):
        cells = []
        for c in channels:
            ok = [
                r["GBps"]
                for r in rows
                if (r["impl"], r["direction"], r["lmax"], r["channels"]) == (impl, direction, lmax, c)
                and "error" not in r
            ]
            cells.append(f"{max(ok):.2f}" if ok else "-")
        lines.append(f"| {impl} | {direction} | {lmax} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _check_args(args) -> None:
    """``SystemExit`` naming the first argument a sweep could not use, before anything is measured
    (a zero count measured nothing and reported a throughput; a bad path failed after the sweep)."""
    if args.elements is not None and args.sizes is not None:
        raise SystemExit("e3j bench: give --sizes or --elements, not both")
    least = {"--channels": 1, "--sizes": 1, "--elements": 1, "--lmax": 0}
    for flag, low in least.items():
        values = getattr(args, flag[2:])
        bad = [v for v in values or () if v < low]
        if bad:
            raise SystemExit(f"e3j bench: {flag} must be >= {low}, got {bad[0]}")
    for flag in ("--copy-bytes", "--memory-budget", "--degree", "--runs", "--jobs"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and value < 1:
            raise SystemExit(f"e3j bench: {flag} must be >= 1, got {value}")
    for flag in ("--json", "--markdown", "--plot"):
        path = getattr(args, flag[2:])
        if path is not None:
            folder = os.path.dirname(os.path.abspath(path))
            # an existing writable file (/dev/stdout) will do, else a writable folder for a new one
            writable = os.access(path, os.W_OK) if os.path.exists(path) else os.access(folder, os.W_OK)
            if os.path.isdir(path) or not os.path.isdir(folder) or not writable:
                raise SystemExit(f"e3j bench: {flag} {path}: not a writable file or a new file in a writable folder")


def _check_implementations(names) -> None:
    """``SystemExit`` for a ``--backends`` name that cannot be measured at all: not installed, or
    ``e3nn`` without e3nn-jax (each was a traceback, or an error row per case)."""
    installed = [b.name for b in _backends.available_backends()]
    for name in names or ():
        if name == "e3nn":
            try:
                import e3nn_jax  # noqa: F401
            except ImportError:
                how = install_hint("e3j", "e3nn", "e3nn-jax")
                raise SystemExit(f"e3j bench: --backends e3nn needs e3nn-jax: {how}") from None
        elif name not in installed:
            raise SystemExit(
                f"e3j bench: --backends {name}: not an installed backend (installed: {', '.join(installed)}, or e3nn)"
            )


def main(args) -> int:
    _check_args(args)
    _check_implementations(args.backends)
    if args.quick:
        args.lmax = args.lmax or [1, 2]
        args.channels = args.channels or [16]
        args.sizes = args.sizes or [256]
        args.degree = min(args.degree, 8)
        args.runs = min(args.runs, 10)
        args.copy_bytes = min(2**22 if args.copy_bytes is None else args.copy_bytes, 2**22)
    args.lmax = args.lmax or [1, 2, 3]
    args.channels = args.channels or [32, 64, 128]
    args.sizes = args.sizes or [4096]
    if not args.replot:
        try:  # --elements smaller than a channel count, or not one per --lmax
            list(cases(args.ops, args.directions, args.lmax, args.channels, args.sizes, args.degree, args.elements))
        except ValueError as err:
            raise SystemExit(f"e3j bench: {err}") from None
    if args.plot:
        from ._plot import require_matplotlib

        try:
            require_matplotlib()  # before the sweep, not after it
        except RuntimeError as err:
            raise SystemExit(f"e3j bench: --plot: {err}") from None
    if args.replot:  # render a committed results file again, measuring nothing
        with open(args.replot) as fh:
            result = json.load(fh)
    else:
        result = run(args)
    text = table(result)
    print(text)
    if args.json:
        _write_json(result, args.json)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(text + "\n")
    if args.plot:
        from ._plot import plot

        plot(result, args.plot)
    failed = [r for r in result["rows"] if "error" in r and r["impl"] != "e3nn"]
    return 1 if failed else 0


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="throughput sweeps of the tensor product and the convolution")
    p.add_argument(
        "--ops", nargs="+", default=["tensor_product", "convolution"], choices=["tensor_product", "convolution"]
    )
    p.add_argument("--directions", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    p.add_argument("--lmax", nargs="+", type=int, default=None)
    p.add_argument("--channels", nargs="+", type=int, default=None)
    p.add_argument("--sizes", nargs="+", type=int, default=None, help="batch (TP) or node (convolution) counts")
    p.add_argument(
        "--elements",
        nargs="+",
        type=int,
        default=None,
        help="instead of --sizes: size x channels held fixed (one value, or one per --lmax value), as in the "
        "paper's Table 1",
    )
    p.add_argument("--degree", type=int, default=45, help="neighbours per node in the convolution graph")
    p.add_argument("--runs", type=int, default=100)
    p.add_argument(
        "--copy-bytes",
        type=int,
        default=None,
        help="size of the baseline copy's source (default: 1 GiB on an accelerator, 64 MiB on a CPU)",
    )
    p.add_argument("--backends", nargs="+", default=None, help="implementations (backend names or 'e3nn')")
    p.add_argument("--no-e3nn", action="store_true")
    p.add_argument("--quick", action="store_true", help="small sizes and few runs: a smoke test")
    p.add_argument("--json", default=None, help="write the results as JSON here")
    p.add_argument("--markdown", default=None, help="write the Markdown table here")
    p.add_argument("--plot", default=None, help="write a PNG figure here (needs e3j[bench]: matplotlib)")
    p.add_argument("--replot", default=None, help="measure nothing: table and figure of this results JSON")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="compile every measurement's executable first, on this many threads (many-core hosts)",
    )
    p.add_argument(
        "--memory",
        action="store_true",
        help="also report the convolution backward's XLA peak memory and the largest node count that fits",
    )
    p.add_argument("--memory-budget", type=int, default=None, help="bytes (default: the device's memory)")
