"""e3j: Euclid-equivariant tensor products and message-passing convolutions for JAX.

The public API: irreps and static math re-exported from e3j-core, JAX spherical harmonics, the
differentiable :class:`TensorProduct` and :class:`Convolution` (and :class:`MulIrTensorProduct`,
:class:`MulIrConvolution` for flat features of mixed multiplicities, with :class:`FactoredWeights`),
:class:`Graph`, :class:`Linear`, the multi-device convolution (:func:`partition_graph`,
:class:`PartitionedGraph`, :func:`convolution_sharded`), layout helpers, and backend selection.
Optional subpackages, imported only when asked for: ``e3j.interop`` (drop-ins taking and
returning e3nn-jax's ``IrrepsArray``; extra ``e3nn``) and ``e3j.flax`` (Flax modules with
e3nn-jax's parameters; extra ``flax``).

>>> import e3j, jax.numpy as jnp
>>> tp = e3j.TensorProduct("0e + 1o", "0e + 1o")
>>> tp(jnp.ones((3, 4, 16)), jnp.ones((3, 4))).shape
(3, 16, 16)
"""

from e3j_core import Irrep, Irreps, clebsch_gordan

from ._version import __version__
from .backends import Backend, BackendError, Kernels, available_backends, use_backend
from .convolution import Convolution
from .distributed import PartitionedGraph, convolution_sharded, partition_graph
from .factored import FactoredWeights
from .graph import Graph
from .layout import from_mul_ir, irrep_blocks, mul_ir_irreps, to_mul_ir
from .linear import Linear
from .mul_ir import MulIrConvolution, MulIrTensorProduct
from .spherical_harmonics import spherical_harmonics
from .tensor_product import TensorProduct

__all__ = [
    "Backend",
    "BackendError",
    "Convolution",
    "FactoredWeights",
    "Graph",
    "Irrep",
    "Irreps",
    "Kernels",
    "Linear",
    "MulIrConvolution",
    "MulIrTensorProduct",
    "PartitionedGraph",
    "TensorProduct",
    "__version__",
    "available_backends",
    "clebsch_gordan",
    "convolution_sharded",
    "from_mul_ir",
    "irrep_blocks",
    "mul_ir_irreps",
    "partition_graph",
    "spherical_harmonics",
    "to_mul_ir",
    "use_backend",
]
