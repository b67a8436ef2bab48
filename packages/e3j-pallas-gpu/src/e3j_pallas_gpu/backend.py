"""The ``e3j.backends`` descriptors of this package (plain mappings: no ``e3j`` import needed)."""

from __future__ import annotations

import functools
from typing import Any

from e3j_core.dependencies import declared_range

from ._version import __version__

__all__ = ["backend", "interpret_backend"]

#: The JAX range this package is tested with (Pallas's Triton lowering is not a stable API).
#: Read from the installed metadata (pyproject.toml's dependencies); "" when run from a source tree.
JAX_REQUIREMENT = str(declared_range("e3j-pallas-gpu", "jax") or "")
#: Unrolled programs grow as l^5 in the number of records; beyond this the compile time is not worth it.
MAX_L = 4


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
    "max_l": MAX_L,
    "deterministic": True,
    "jax_requirement": JAX_REQUIREMENT,
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
