"""Deterministic CUDA kernels for e3j, bound through the XLA FFI (and their host build).

Importing this package is cheap: the compiled modules (``_host``, ``_cuda``) are imported and their
FFI targets registered by the backend's ``load()`` (:mod:`e3j_cuda._ffi`); the kernel functions live
in :mod:`e3j_cuda.kernels`.
"""

from ._version import __version__

__all__ = ["__version__"]
