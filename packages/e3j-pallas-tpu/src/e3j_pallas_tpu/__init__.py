"""Pallas TPU (Mosaic) kernels for e3j.

Importing this package is cheap: the kernels live in :mod:`e3j_pallas_tpu.tensor_product` and
:mod:`e3j_pallas_tpu.convolution` (VMEM budgets in :mod:`e3j_pallas_tpu.vmem`) and are imported by
the backend's ``load()`` (entry points ``pallas_tpu`` for TPUs and ``pallas_tpu_interpret``, the
same kernels in Pallas's TPU interpreter on the CPU, for tests).
"""

from ._version import __version__

__all__ = ["__version__"]
