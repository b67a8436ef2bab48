"""The ``e3j.backends`` descriptors of this package (plain mappings: no ``e3j`` import needed)."""

from __future__ import annotations

import functools
import threading
from typing import Any

from e3j_core.dependencies import declared_range

from ._version import __version__

__all__ = ["backend", "interpret_backend", "mosaic_backend", "mosaic_interpret_backend"]

#: The JAX range this package is tested with (Pallas's Triton lowering is not a stable API).
#: Read from the installed metadata (pyproject.toml's dependencies); "" when run from a source tree.
JAX_REQUIREMENT = str(declared_range("e3j-pallas-gpu", "jax") or "")
#: Tables with at most this many COO records are unrolled into the kernels, larger ones walked
#: (lmax 3 filtered: 353 records, unrolled; lmax 4: 1158, walked). Why here: see ``_records``.
UNROLL_RECORDS = 400
#: The kernels ``load()`` returns, declared in the descriptors: e3j routes an op's trace on them
#: without importing the kernels (and with them Pallas, whose JAX options would change every jit
#: cache key mid-program). grouped_convolution: mixed multiplicities, each group's launch reading
#: its windows of e3nn's weights.
KERNELS = tuple(op + kind for op in ("tensor_product", "convolution", "grouped_convolution") for kind in ("", "_bwd"))


def _load(interpret: bool) -> dict[str, Any]:
    from . import convolution, tensor_product

    def bind(fn):
        kernel = functools.partial(fn, interpret=interpret)
        if not interpret:
            return kernel
        hosted = _behind_callback(kernel)

        def run(plan, *args, **options):
            # Pallas's Triton interpreter fails shard_map's checks of varying axes (it slices operands
            # that vary with its grid indices, which do not); behind a callback it runs outside the map
            return (hosted if _varies(args) else kernel)(plan, *args, **options)

        return run

    modules = {"tensor_product": tensor_product, "convolution": convolution, "grouped_convolution": convolution}
    return {k: bind(getattr(modules[k.removesuffix("_bwd")], k)) for k in KERNELS}


_COMMON: dict[str, Any] = {
    "version": __version__,
    "ops": ("tensor_product", "convolution"),
    "kernels": KERNELS,
    "dtypes": ("float32", "float64"),
    # no l limit: tables above the unroll limit are walked (see _records)
    "notes": (
        f"tables of <= {UNROLL_RECORDS} COO records (lmax 3 filtered: 353) are unrolled into the kernels; "
        "larger ones are walked record by record (any l)",
    ),
    "deterministic": True,
    "jax_requirement": JAX_REQUIREMENT,
}


def triton_unsupported(req) -> str | None:
    """Why the Triton kernels cannot be lowered for ``req`` (an ``e3j.backends.OpRequest``), or
    ``None``: Pallas's Triton lowering reads the target GPU from a CUDA device or from an abstract
    mesh's device kind, and without either fails inside JAX ("No supported GPU devices found")."""
    if _cuda_capability()[1] == _NO_GPU:
        return (
            f"{_NO_GPU}: Pallas's Triton lowering needs to know the GPU; lowering without one, name it "
            "with jax.sharding.use_abstract_mesh(AbstractMesh(..., abstract_device=AbstractDevice("
            "device_kind='NVIDIA H100 80GB HBM3', platform='cuda', num_cores=None)))"
        )
    return None


#: Triton-lowered Pallas kernels on NVIDIA GPUs.
backend: dict[str, Any] = {
    **_COMMON,
    "name": "pallas_gpu",
    "platforms": ("cuda",),
    "priority": 20,
    "check": triton_unsupported,
    "load": functools.partial(_load, False),
}

#: The same kernels run by Pallas's interpreter on the CPU: for tests, only used when asked for by name.
interpret_backend: dict[str, Any] = {
    **_COMMON,
    "name": "pallas_gpu_interpret",
    "platforms": ("cpu",),
    "priority": 0,
    "auto": False,
    "load": functools.partial(_load, True),
}


# -- Mosaic GPU (Hopper and newer) -----------------------------------------------------------------

#: Mosaic GPU kernels need Hopper (sm_90) or newer: TMA and the warpgroup programming model.
MOSAIC_MIN_COMPUTE_CAPABILITY = (9, 0)
#: Compute capability of the device kinds an abstract mesh may name when lowering without a device
#: (``jax.sharding.AbstractDevice(device_kind=...)``): substrings of NVIDIA's device-kind strings.
_KNOWN_DEVICE_KINDS = (
    ("GB300", (10, 3)),
    ("GB200", (10, 0)),
    ("B300", (10, 3)),
    ("B200", (10, 0)),
    ("B100", (10, 0)),
    ("GH200", (9, 0)),
    ("H200", (9, 0)),
    ("H100", (9, 0)),
    ("H800", (9, 0)),
    ("H20", (9, 0)),
    ("A100", (8, 0)),
    ("A10", (8, 6)),
    ("L40", (8, 9)),
    ("L4", (8, 9)),
    ("V100", (7, 0)),
    ("T4", (7, 5)),
)


def _device_kind_capability(kind: str) -> tuple[int, int] | None:
    for key, cc in _KNOWN_DEVICE_KINDS:
        if key in kind:
            return cc
    return None


_NO_GPU = "no CUDA device and no abstract device kind"


def _cuda_capability() -> tuple[tuple[int, int] | None, str]:
    """The compute capability this lowering targets and where it came from (``None`` if unknown).

    An abstract mesh naming a device kind (lowering without a device) wins; otherwise the smallest
    compute capability of the local CUDA devices. Probed when an op is lowered, never at import.
    """
    import jax

    mesh = jax.sharding.get_abstract_mesh()
    device = getattr(mesh, "abstract_device", None)
    kind = getattr(device, "device_kind", None)
    if kind:
        return _device_kind_capability(kind), f"abstract device {kind!r}"
    try:
        devices = jax.devices("cuda")
    except RuntimeError:
        return None, _NO_GPU
    caps = []
    for d in devices:
        cc = getattr(d, "compute_capability", None)
        if cc is None:
            return None, f"device {d} reports no compute capability"
        major, minor = str(cc).split(".")[:2]
        caps.append((int(major), int(minor)))
    return min(caps), f"{devices[0].device_kind} (sm_{''.join(map(str, min(caps)))})"


def _mosaic_bindings_installed() -> bool:
    """Whether JAX's Mosaic GPU bindings are importable (jaxlib's or the CUDA plugin's)."""
    import importlib.util

    for name in ("jaxlib.mosaic.gpu", "jax_cuda13_plugin", "jax_cuda12_plugin"):
        try:
            if importlib.util.find_spec(f"{name}._mosaic_gpu_ext") is not None:
                return True
        except ImportError:  # the parent package is not installed
            continue
    return False


def mosaic_unsupported(req) -> str | None:
    """Why the Mosaic GPU kernels cannot run ``req`` (an ``e3j.backends.OpRequest``), or ``None``.

    They need JAX's Mosaic GPU bindings (the CUDA plugin) and compute capability >= 9.0; when it
    cannot be told (lowering without a device or a known abstract device kind) they are not used,
    and the Triton kernels (which run on any CUDA GPU) are chosen instead.
    """
    if not _mosaic_bindings_installed():
        return "JAX's Mosaic GPU bindings are not installed (pip install 'jax[cuda13]')"
    cc, source = _cuda_capability()
    if cc is None:
        return f"cannot tell the compute capability ({source}); Mosaic GPU needs sm_90 or newer"
    if cc < MOSAIC_MIN_COMPUTE_CAPABILITY:
        need = ".".join(map(str, MOSAIC_MIN_COMPUTE_CAPABILITY))
        return f"Mosaic GPU needs compute capability >= {need}, {source} has {cc[0]}.{cc[1]}"
    return None


# held while an interpreted program runs (see _behind_callback)
_INTERPRETER = threading.Lock()


# Twin of e3j_pallas_tpu.backend._hosted, on purpose: kernel packages depend on e3j-core and jax only,
# never on e3j or on each other (docs/design.md).
def _behind_callback(kernel):
    """An interpreted kernel as its own jitted program behind a ``pure_callback``: Mosaic's GPU
    interpreter threads ordered I/O effects, which e3j's (effect-free) primitive lowerings cannot
    carry. The interpreters keep process-wide state that the devices of a ``shard_map``, calling
    back at once, would share: one program runs at a time."""
    import jax

    def run(coo, *args, **options):
        fn = jax.jit(lambda *a: kernel(coo, *a, **options))

        def one_at_a_time(*a):
            with _INTERPRETER:
                return jax.block_until_ready(fn(*a))

        return jax.pure_callback(one_at_a_time, jax.eval_shape(fn, *args), *args)

    return run


def _varies(tree) -> bool:
    """Whether a leaf of ``tree`` varies over a manual mesh axis (inside ``jax.shard_map``)."""
    from ._blocks import varying_axes

    return bool(varying_axes(tree))


def _load_mosaic(interpret: bool) -> dict[str, Any]:
    from . import mosaic_convolution, mosaic_tensor_product

    def bind(fn):
        if not interpret:
            return fn
        from jax.experimental.pallas import mosaic_gpu as plgpu

        return _behind_callback(functools.partial(fn, interpret=plgpu.InterpretGPUParams()))

    # grouped_convolution reads e3nn's weights in place where the TMA can (mosaic_convolution.reads_in_place)
    modules = {
        "tensor_product": mosaic_tensor_product,
        "convolution": mosaic_convolution,
        "grouped_convolution": mosaic_convolution,
    }
    return {k: bind(getattr(modules[k.removesuffix("_bwd")], k)) for k in KERNELS}


_MOSAIC: dict[str, Any] = {
    **_COMMON,
    # Mosaic GPU's TMA has no float64 transfers: float64 ops go to the Triton kernels
    "dtypes": ("float32",),
    # the Mosaic kernels always unroll the records: lowering them at lmax 3, 128 channels already
    # takes 2.5-20 s per kernel on this project's CPU (docs/mosaic_gpu.md); higher degrees go to the Triton
    # kernels, which walk the records there
    "max_l": 3,
    "notes": ("records always unrolled; tables above lmax 3 go to pallas_gpu, which walks them",),
}

#: Mosaic GPU kernels (paper Appendix E.3) on Hopper and newer; preferred over the Triton ones there,
#: except for convolutions below 128 channels and tensor products up to 128 (``yields``).
mosaic_backend: dict[str, Any] = {
    **_MOSAIC,
    "name": "pallas_mosaic",
    "platforms": ("cuda",),
    "priority": 30,
    "check": mosaic_unsupported,
    # on an H200 the Triton convolutions ran 1.3-2.5x faster than these at 16, 32 and 64 channels,
    # measured together (2026-12-04: the groups of 64x0e + 32x1o + 16x2e x sh lmax 3, each a convolution
    # of its own C: 0.42 against 0.71 ms forward and 0.97 against 1.22 ms backward at 3,000 nodes; 0.83
    # against 1.68 and 1.43 against 3.51 ms at 10,000) and 1.2x slower at 128 (2026-11-30: 1,453
    # against 1,765 GB/s forward, 702 against 891 backward); between 64 and 128, unmeasured. The Triton
    # tensor product ran faster at 128 channels (lmax 3, 16,384 rows): forward 0.27 against 0.46 ms
    # (2026-12-04, profiler), forward + backward 0.74 against 0.87 ms (backward 0.46 against 0.41 ms,
    # 2026-11-30); below 128 unmeasured, above 128 too
    "yields": {"convolution": (128, "pallas_gpu"), "tensor_product": (129, "pallas_gpu")},
    "load": functools.partial(_load_mosaic, False),
}

#: The Mosaic GPU kernels in Mosaic's GPU interpreter on the CPU: for tests, only used when asked for.
mosaic_interpret_backend: dict[str, Any] = {
    **_MOSAIC,
    "name": "pallas_mosaic_interpret",
    "platforms": ("cpu",),
    "priority": 0,
    "auto": False,
    "load": functools.partial(_load_mosaic, True),
}
