"""Pallas GPU (Triton) kernels for e3j.

Importing this package is cheap: the kernels live in :mod:`e3j_pallas_gpu.tensor_product` and
:mod:`e3j_pallas_gpu.convolution` and are imported by the backend's ``load()`` (entry points
``pallas_gpu`` for CUDA and ``pallas_gpu_interpret``, the same kernels in Pallas's interpreter on the
CPU, for tests). Select it with ``e3j.use_backend("pallas_gpu")`` or let e3j pick it on a GPU.

Importing it raises ``e3j_core.IncompatibleDependency`` (an ``ImportError``) when the installed JAX
is outside the range the package declares (its ``Requires-Dist``).
"""

from e3j_core.dependencies import check_dependency

from ._version import __version__

# the JAX range this package is built and tested for is its wheel's Requires-Dist (pyproject.toml):
# refuse, with a message saying so, a JAX outside it (installed with --no-deps or upgraded later)
check_dependency("e3j-pallas-gpu", "jax")

__all__ = ["__version__"]
