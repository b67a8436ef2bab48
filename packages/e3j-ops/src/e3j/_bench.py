"""Measuring helpers shared by the benchmark scripts and ``python -m e3j bench`` (private).

Throughput follows the paper (§3, Appendix D.1): bytes of every input and output array divided by
the time of one call; a backward pass counts its primals, the output cotangents and the input
cotangents. Time is the mean of the fastest 20 % of ``runs`` calls with the garbage collector off.
"""

from __future__ import annotations

import gc
import math
import re
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

__all__ = [
    "copy_bandwidth",
    "default_copy_bytes",
    "device_slug",
    "kernel_backend",
    "nbytes",
    "runnable_backends",
    "throughput",
    "time_call",
]


def nbytes(*trees) -> int:
    """Total bytes of all array leaves (shape × itemsize; works on ShapeDtypeStructs too)."""
    total = 0
    for tree in trees:
        for leaf in jax.tree.leaves(tree):
            total += math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def time_call(fn: Callable, *args, runs: int = 100, fastest: float = 0.2, warmup: int = 2) -> float:
    """Mean seconds of the fastest ``fastest`` fraction of ``runs`` calls of ``fn(*args)``.

    Each call is waited for (``block_until_ready``); the first ``warmup`` calls (compilation) are
    not timed; the garbage collector is disabled while timing.
    """
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    if not 0 < fastest <= 1:
        raise ValueError(f"fastest must be in (0, 1], got {fastest}")
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(runs):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - t0)
    finally:
        if enabled:
            gc.enable()
    keep = max(1, round(runs * fastest))
    return sum(sorted(times)[:keep]) / keep


def interleaved(fns: dict[str, tuple[Callable, tuple]], runs: int, rounds: int) -> dict[str, float]:
    """Seconds per call of each ``name: (f, operands)``: each compiled (called once) first, then the
    best of ``rounds`` rounds, each round timing every function in turn (:func:`time_call` on ``runs
    // rounds`` calls), so that load from other processes falls on all of them alike.

    >>> times = interleaved({"sum": (jnp.sum, (jnp.ones(8),))}, runs=4, rounds=2)
    >>> sorted(times), times["sum"] > 0
    (['sum'], True)
    """
    for f, ops in fns.values():
        jax.block_until_ready(f(*ops))
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, (f, ops) in fns.items():
            t = time_call(f, *ops, runs=max(1, runs // rounds), warmup=0)
            best[name] = min(best.get(name, float("inf")), t)
    return best


def versus_e3nn(ours: Callable, theirs: Callable, operands: tuple, runs: int, rounds: int) -> dict:
    """e3j's function against e3nn-jax's on ``operands``: each one's value and the gradient of
    ``sum(sin(f(*operands)))`` with respect to every operand, jitted and :func:`interleaved`; ms per
    call (``e3j``, ``e3nn``, ``e3j_grad``, ``e3nn_grad``) and e3nn-jax's time over e3j's
    (``e3nn_over_e3j``, ``e3nn_over_e3j_grad``)."""

    def grad(f):
        return jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a))), argnums=tuple(range(len(operands))))

    fns = {"e3j": ours, "e3nn": theirs, "e3j_grad": grad(ours), "e3nn_grad": grad(theirs)}
    best = interleaved({k: (jax.jit(f), operands) for k, f in fns.items()}, runs, rounds)
    return {
        **{k: round(t * 1e3, 3) for k, t in best.items()},
        "e3nn_over_e3j": round(best["e3nn"] / best["e3j"], 2),
        "e3nn_over_e3j_grad": round(best["e3nn_grad"] / best["e3j_grad"], 2),
    }


def throughput(num_bytes: int, seconds: float) -> float:
    """Bytes per second."""
    return num_bytes / seconds


#: Copy source size on accelerators: a 2^28-byte copy reached 2.55 TB/s on an H200 where streaming
#: copies reach ~4.3 TB/s (launch and host overhead are not amortized); 1 GiB read + 1 GiB written is.
ACCELERATOR_COPY_BYTES = 2**30
#: On a CPU: past the last-level cache, yet quick to time.
CPU_COPY_BYTES = 2**26


def default_copy_bytes(device) -> int:
    """Bytes of the copy source that measures ``device``'s streaming bandwidth.

    :data:`ACCELERATOR_COPY_BYTES` (at most an eighth of the device's memory, where it reports one),
    :data:`CPU_COPY_BYTES` on a CPU.

    >>> import jax
    >>> default_copy_bytes(jax.devices("cpu")[0]) == CPU_COPY_BYTES
    True
    """
    if device.platform == "cpu":
        return CPU_COPY_BYTES
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    limit = (stats or {}).get("bytes_limit")
    return min(ACCELERATOR_COPY_BYTES, limit // 8) if limit else ACCELERATOR_COPY_BYTES


def copy_bandwidth(num_bytes: int, *, runs: int = 100, dtype=jnp.float32, device=None) -> tuple[float, float]:
    """``(seconds, bytes/s)`` of a jitted copy of a ``num_bytes`` array (read + write counted).

    The ceiling any memory-bound kernel can reach on this device, measured in the same run; on an
    accelerator ``num_bytes`` should be :func:`default_copy_bytes` or more (smaller copies measure
    launch overhead too).
    """
    if num_bytes < 1:
        raise ValueError(f"num_bytes must be >= 1, got {num_bytes}")
    n = max(1, num_bytes // jnp.dtype(dtype).itemsize)
    src = jax.device_put(jnp.arange(n, dtype=dtype), device)
    # a + 1: XLA cannot elide it, so every element is read once and written once
    copy = jax.jit(lambda a: a + jnp.asarray(1, dtype))
    seconds = time_call(copy, src, runs=runs)
    return seconds, throughput(2 * n * jnp.dtype(dtype).itemsize, seconds)


def provenance(script: str, argv: list[str] | None = None) -> dict:
    """What a results file records of its run: the ``command`` that reruns it (``python script`` and
    ``argv``, by default this process's arguments), the UTC ``date`` and the ``host``
    (:func:`host_info`).

    >>> record = provenance("benchmarks/x.py", ["--nodes", "1000"])
    >>> record["command"], sorted(record)
    ('python benchmarks/x.py --nodes 1000', ['command', 'date', 'host'])
    """
    import datetime
    import shlex
    import sys

    words = sys.argv[1:] if argv is None else list(argv)
    return {
        "command": shlex.join(["python", script, *words]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": host_info(),
    }


def host_info() -> dict:
    """The machine a CPU timing was taken on, for a results file: the CPU's model name (Linux's
    ``/proc/cpuinfo``, else ``platform.processor()``), its core count and the load average when the
    function is called (timings on a shared machine drift with it). Read when called, never at import.

    >>> info = host_info()
    >>> sorted(info), info["cores"] >= 1, isinstance(info["cpu"], str)
    (['cores', 'cpu', 'load_average'], True, True)
    """
    import os
    import platform

    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpu": model or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_average": None if load is None else [round(x, 2) for x in load],
    }


def kernel_backend(op: str, channels: int, lmax: int, dtype: str = "float32", backend: str | None = None) -> str:
    """The backend e3j would run ``op`` on for the default device at these sizes, for a results file
    (the ``test`` plugin of a development environment, not ``reference``, answers on its CPU).

    ``backend``: an explicit request, as an op's ``backend=`` argument (``None``: automatic selection,
    ``E3J_BACKEND`` and ``e3j.use_backend`` included).

    >>> kernel_backend("convolution", 32, 2, backend="reference")
    'reference'
    """
    from . import backends

    platform = backends.device_platform(jax.devices()[0])
    req = backends.OpRequest(op, platform, dtype, channels, lmax)
    return backends.select_backend(req, backends.current_backend_request(backend), warn=False).name


def runnable_backends(platform: str | None = None) -> list[str]:
    """The backends a benchmark of "every backend" runs on ``platform`` (default: the default
    device's): the automatic ones besides the reference, compatible with what is installed and
    loading here (the device scripts' end-to-end step, which call it as :func:`device_slug`).

    >>> runnable_backends("rocm")  # none of e3j's kernel packages runs there
    []
    """
    from . import backends

    if platform is None:
        platform = backends.device_platform(jax.devices()[0])
    names = []
    for b in backends.available_backends():
        if not b.auto or b.name == "reference" or platform not in b.platforms or b.incompatibility():
            continue
        try:
            backends._check_loadable(b)
        except backends.BackendError:
            continue
        names.append(b.name)
    return names


def device_slug(kind: str | None = None) -> str:
    """The slug of a device kind that names results files (``benchmarks/results/<slug>-<suite>.json``).

    Lower case, each run of characters other than ``a-z0-9`` one dash, none at either end. Without
    ``kind``: the ``device_kind`` of ``jax.devices()[0]`` (its platform where it has none; a CPU's is
    ``cpu``). The one rule for benchmarks/*.py and the device scripts, which call
    ``python3 -c "from e3j._bench import device_slug; print(device_slug())"``.

    >>> device_slug("NVIDIA H200")
    'nvidia-h200'
    >>> device_slug("TPU v5 lite")
    'tpu-v5-lite'
    """
    if kind is None:
        device = jax.devices()[0]
        kind = getattr(device, "device_kind", None) or device.platform
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str (a device_kind), got {type(kind).__name__}")
    slug = re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-")
    if not slug:
        raise ValueError(f"kind must contain a letter or digit to name files by, got {kind!r}")
    return slug


# -- byte accounting (the paper's metric) ----------------------------------------------------------

# datasheet memory bandwidth (bytes/s) of known accelerators, matched against device_kind
DATASHEET_BANDWIDTH = {
    "H200": 4.8e12,
    "H100 80GB HBM3": 3.35e12,
    "H100 PCIe": 2.0e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100-SXM4-40GB": 1.555e12,
    "TPU v5 lite": 8.19e11,
    "TPU v6 lite": 1.64e12,
}


def datasheet_bandwidth(device_kind: str) -> float | None:
    for name, bw in DATASHEET_BANDWIDTH.items():
        if name in device_kind:
            return bw
    return None


def tensor_product_bytes(coo, batch: int, channels: int, *, y_channels: bool, itemsize: int, backward: bool) -> int:
    """Bytes moved by one tensor product call, as the paper counts them.

    Forward: ``x``, ``y`` and ``z``. Backward: the primals ``x``, ``y``, the output cotangent ``dz``
    and the input cotangents ``dx``, ``dy``.
    """
    x = batch * coo.dim_x * channels
    y = batch * coo.dim_y * (channels if y_channels else 1)
    z = batch * coo.dim_out * channels
    elements = x + y + z if not backward else 2 * (x + y) + z
    return elements * itemsize


def convolution_bytes(
    coo, nodes: int, edges: int, channels: int, *, y_channels: bool, itemsize: int, backward: bool
) -> int:
    """Bytes of the feature arrays of one convolution call (graph indices not counted).

    Forward: ``x``, ``y``, ``s`` and ``m``. Backward: primals ``x``, ``y``, ``s``, the output
    cotangent ``dm`` and the input cotangents ``dx``, ``dy``, ``ds``.
    """
    x = nodes * coo.dim_x * channels
    y = edges * coo.dim_y * (channels if y_channels else 1)
    s = edges * coo.num_paths * channels
    m = nodes * coo.dim_out * channels
    elements = x + y + s + m if not backward else 2 * (x + y + s) + m
    return elements * itemsize
