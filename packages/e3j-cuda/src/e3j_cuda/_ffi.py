"""Loading a compiled target: compatibility checks, then XLA FFI registration (once per target)."""

from __future__ import annotations

import functools
import importlib
import re
from pathlib import Path

__all__ = ["IncompatibleBuild", "load_target", "runtime_ffi_api_version"]


class IncompatibleBuild(ImportError):
    """The compiled module was built against an XLA FFI / JAX this installation cannot serve."""


def runtime_ffi_api_version() -> tuple[int, int]:
    """The XLA FFI API version of the installed jaxlib (read from the headers it ships)."""
    import jax

    header = Path(jax.ffi.include_dir()) / "xla" / "ffi" / "api" / "c_api.h"
    text = header.read_text()
    major = re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text)
    minor = re.search(r"#define XLA_FFI_API_MINOR (\d+)", text)
    if not (major and minor):
        raise IncompatibleBuild(f"cannot read the XLA FFI API version from {header}")
    return int(major.group(1)), int(minor.group(1))


def check_compatible(built_api: tuple[int, int], built_jax: str, runtime_api: tuple[int, int], jax_version: str):
    """Raise :class:`IncompatibleBuild` unless a module built with ``built_*`` can run here."""
    if built_api[0] != runtime_api[0] or built_api[1] > runtime_api[1]:
        raise IncompatibleBuild(
            f"e3j-cuda was compiled against XLA FFI API {built_api[0]}.{built_api[1]} (jax {built_jax}), "
            f"but the installed jaxlib {jax_version} provides FFI API {runtime_api[0]}.{runtime_api[1]}; "
            "install a jax/jaxlib at least as new as the one e3j-cuda was built with, or rebuild e3j-cuda"
        )
    from packaging.version import Version

    if Version(jax_version).release < Version(built_jax).release:
        raise IncompatibleBuild(
            f"e3j-cuda was compiled against jax {built_jax}, newer than the installed jax {jax_version}; "
            "upgrade jax or rebuild e3j-cuda against this one"
        )


def check_coo_format(built: int) -> None:
    """Raise :class:`IncompatibleBuild` unless the kernels read the COO format e3j-core writes."""
    from e3j_core import COO_FORMAT_VERSION

    if built != COO_FORMAT_VERSION:
        raise IncompatibleBuild(
            f"e3j-cuda's kernels read COO format {built}, but the installed e3j-core writes format "
            f"{COO_FORMAT_VERSION}; install the e3j-cuda release made for this e3j-core"
        )


@functools.cache
def load_target(module_name: str) -> str:
    """Import ``e3j_cuda.<module_name>``, check it, register its handlers; returns their name prefix."""
    import jax

    try:
        module = importlib.import_module(f"e3j_cuda.{module_name}")
    except ModuleNotFoundError as err:
        hint = (
            " (the CUDA kernels are compiled only where nvcc was found at install time)"
            if module_name == "_cuda"
            else ""
        )
        raise ImportError(
            f"e3j-cuda has no compiled {module_name} target{hint}; reinstall it with nvcc on PATH "
            "(or E3J_CUDA=ON to make a missing CUDA compiler an error)"
        ) from err
    check_compatible(tuple(module.FFI_API_VERSION), module.BUILT_WITH_JAX, runtime_ffi_api_version(), jax.__version__)
    check_coo_format(module.COO_FORMAT_VERSION)
    for name, capsule in module.handlers().items():
        jax.ffi.register_ffi_target(name, capsule, platform=module.PLATFORM, api_version=1)
    return module.FFI_PREFIX
