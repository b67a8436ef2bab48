"""The ``e3j.backends`` descriptors of this package (plain mappings: no ``e3j`` import needed)."""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from e3j_core.dependencies import declared_range

from ._version import __version__

__all__ = ["backend", "host_backend", "simt_backend"]

#: The JAX range this package is tested with; the compiled module also checks its FFI API version.
#: Read from the installed metadata (pyproject.toml's dependencies); "" when run from a source tree.
JAX_REQUIREMENT = str(declared_range("e3j-cuda", "jax") or "")


#: The kernels ``load()`` returns (``kernels.__all__``), declared in the descriptors: e3j routes an
#: op's trace on them without loading the compiled module.
KERNELS = tuple(op + kind for op in ("tensor_product", "convolution", "grouped_convolution") for kind in ("", "_bwd"))


def _load(module: str) -> dict[str, Any]:
    from . import _ffi, kernels

    prefix = _ffi.load_target(module)
    return {name: functools.partial(getattr(kernels, name), target=prefix) for name in KERNELS}


_COMMON: dict[str, Any] = {
    "version": __version__,
    "ops": ("tensor_product", "convolution"),
    "kernels": KERNELS,
    "dtypes": ("float32", "float64"),
    "deterministic": True,
    "jax_requirement": JAX_REQUIREMENT,
}

_NOT_BUILT = (
    "not built: e3j-cuda was installed without nvcc, its CUDA kernels cannot load (reinstall with nvcc on PATH)"
)

#: The CUDA kernels (needs the ``_cuda`` module, built when nvcc was found at install time; a file
#: lookup says whether it was, so that ``python -m e3j info`` tells on any machine).
backend: dict[str, Any] = {
    **_COMMON,
    "name": "cuda",
    "platforms": ("cuda",),
    "priority": 15,
    "load": functools.partial(_load, "_cuda"),
    "notes": () if importlib.util.find_spec(f"{__package__}._cuda") is not None else (_NOT_BUILT,),
}

#: The same algorithm compiled for the host: runs on the CPU, for tests; only used when asked for by name.
host_backend: dict[str, Any] = {
    **_COMMON,
    "name": "cuda_host",
    "platforms": ("cpu",),
    "priority": 0,
    "auto": False,
    "load": functools.partial(_load, "_host"),
}

#: The CUDA kernels themselves, launched on the CPU by an emulation of CUDA's execution model
#: (csrc/simt.h): launch limits, shared memory, barriers. For tests; slow; only used when asked for by name.
simt_backend: dict[str, Any] = {
    **_COMMON,
    "name": "cuda_simt",
    "platforms": ("cpu",),
    "priority": 0,
    "auto": False,
    "load": functools.partial(_load, "_simt"),
}
