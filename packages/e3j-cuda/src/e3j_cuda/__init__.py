"""Deterministic CUDA kernels for e3j, bound through the XLA FFI (and their host build).

Importing this package is cheap: the compiled modules (``_host``, ``_cuda``) are imported and their
FFI targets registered by the backend's ``load()`` (:mod:`e3j_cuda._ffi`); the kernel functions live
in :mod:`e3j_cuda.kernels`.

Importing it raises ``e3j_core.IncompatibleDependency`` (an ``ImportError``) when the installed JAX
is outside the range the package declares (its ``Requires-Dist``).
"""

from e3j_core.dependencies import check_dependency

from ._version import __version__

# the JAX range this package is built and tested for is its wheel's Requires-Dist (pyproject.toml):
# refuse, with a message saying so, a JAX outside it (installed with --no-deps or upgraded later)
check_dependency("e3j-cuda", "jax")

__all__ = ["__version__"]
