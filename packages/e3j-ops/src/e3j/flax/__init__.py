"""Flax modules on e3j arrays whose parameters are e3nn-jax's (extra ``e3j[flax]``).

Flax is imported here only. :class:`Linear` creates exactly the parameters of
``e3nn_jax.flax.Linear`` (names, shapes, initialization, meaning), so a checkpoint of an e3nn-jax
model loads unchanged; with ``num_indexed_weights`` it is the species-indexed linear of NequIP's
self-interaction. :class:`MessagePassing` is the fused e3nn message-passing pattern of
:mod:`e3j.interop` as a module. :class:`MultiLayerPerceptron` is e3nn-jax's radial MLP, which can
return its output as :class:`e3j.FactoredWeights` (no per-edge reordering of the weights).

>>> import jax, jax.numpy as jnp
>>> from e3j.flax import Linear
>>> lin = Linear("0e + 1o", channels_out=8, irreps_in="0e + 1o")
>>> params = lin.init(jax.random.key(0), jnp.ones((5, 4, 16)))
>>> jax.tree.map(jnp.shape, params["params"])
{'w[0,0] 16x0e,8x0e': (16, 8), 'w[1,1] 16x1o,8x1o': (16, 8)}
"""

try:
    import flax  # noqa: F401
except ImportError as err:  # pragma: no cover - exercised only without the extra
    from e3j_core.dependencies import install_hint

    raise ImportError(f"e3j.flax needs flax: {install_hint('e3j', 'flax', 'flax')}") from err

from .linear import Linear
from .message_passing import MessagePassing
from .mlp import MultiLayerPerceptron

__all__ = ["Linear", "MessagePassing", "MultiLayerPerceptron"]
