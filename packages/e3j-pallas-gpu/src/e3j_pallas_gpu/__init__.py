"""Pallas GPU (Triton) kernels for e3j.

Importing this package is cheap: the kernels live in :mod:`e3j_pallas_gpu.tensor_product` and
:mod:`e3j_pallas_gpu.convolution` and are imported by the backend's ``load()`` (entry points
``pallas_gpu`` for CUDA and ``pallas_gpu_interpret``, the same kernels in Pallas's interpreter on the
CPU, for tests). Select it with ``e3j.use_backend("pallas_gpu")`` or let e3j pick it on a GPU.
"""

from ._version import __version__

__all__ = ["__version__"]
