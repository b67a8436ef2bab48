"""The ``e3j.backends`` descriptors of this package (plain mappings: no ``e3j`` import needed)."""

from __future__ import annotations

import functools
from typing import Any

from ._version import __version__

__all__ = ["backend", "interpret_backend"]

#: The COO table format these kernels read (e3j-core's ``COO_FORMAT_VERSION`` they were written for).
COO_FORMAT = 2
#: The JAX range this package is tested with (Pallas's Triton lowering is not a stable API).
JAX_REQUIREMENT = ">=0.11.1,<0.13"
#: Tables with at most this many COO records are unrolled into the kernels, larger ones walked
#: (lmax 3 filtered: 353 records, unrolled; lmax 4: 1158, walked). Why here: see ``_records``.
UNROLL_RECORDS = 400


def _load(interpret: bool) -> dict[str, Any]:
    from . import convolution, tensor_product

    def bind(fn):
        return functools.partial(fn, interpret=interpret)

    modules = {"tensor_product": tensor_product, "convolution": convolution}
    return {f"{op}{kind}": bind(getattr(modules[op], op + kind)) for op in modules for kind in ("", "_bwd")}


_COMMON: dict[str, Any] = {
    "version": __version__,
    "ops": ("tensor_product", "convolution"),
    "dtypes": ("float32", "float64"),
    # no l limit: tables above the unroll limit are walked (see _records)
    "notes": (
        f"tables of <= {UNROLL_RECORDS} COO records (lmax 3 filtered: 353) are unrolled into the kernels; "
        "larger ones are walked record by record (any l)",
    ),
    "deterministic": True,
    "jax_requirement": JAX_REQUIREMENT,
    "coo_format_version": COO_FORMAT,
}

#: Triton-lowered Pallas kernels on NVIDIA GPUs.
backend: dict[str, Any] = {
    **_COMMON,
    "name": "pallas_gpu",
    "platforms": ("cuda",),
    "priority": 20,
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
