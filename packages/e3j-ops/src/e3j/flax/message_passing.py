"""The fused e3nn message-passing pattern (:class:`e3j.interop.MessagePassing`) as a Flax module."""

from __future__ import annotations

import flax.linen as nn

__all__ = ["MessagePassing"]


class MessagePassing(nn.Module):
    """``scatter_sum(concatenate([x[s].filter(self_connection), tp(x[s], y)]).regroup() * w)``, fused.

    No parameters of its own (the per-edge weights ``w`` come from the caller's radial network, as
    in NequIP and MACE), so a model that swaps e3nn-jax's pattern for this module keeps its parameter
    tree. Arguments and result are those of :func:`e3j.interop.message_passing` (``IrrepsArray``
    in and out; needs the ``e3nn`` extra): its keyword options are the module's attributes, and
    ``graph=`` and ``backend=`` are arguments of the call.

    >>> import jax, jax.numpy as jnp, numpy as np, e3nn_jax as e3nn
    >>> mp = MessagePassing(filter_ir_out="0e + 1o", self_connection="0e + 1o")
    >>> x = e3nn.IrrepsArray("4x0e + 4x1o", jnp.ones((3, 16)))
    >>> y = e3nn.IrrepsArray("1o + 2e", jnp.ones((2, 8)))
    >>> out, _ = mp.init_with_output(jax.random.key(0), x, y, jnp.ones((2, 20)), np.array([0, 1]), np.array([1, 2]))
    >>> out.irreps
    8x0e+12x1o
    >>> mp.num_weights(x.irreps, y.irreps)  # the radial network's output size, known before the call
    20
    """

    filter_ir_out: object = None
    self_connection: object = None
    irrep_normalization: str | None = None
    grouping: str = "multiplicity"

    def _options(self) -> dict:
        """The keyword options of :func:`e3j.interop.message_passing` that are the module's attributes."""
        return {
            "filter_ir_out": self.filter_ir_out,
            "self_connection": self.self_connection,
            "irrep_normalization": self.irrep_normalization,
            "grouping": self.grouping,
        }

    def _pattern(self, irreps_node, irreps_edge):
        from ..interop import MessagePassing as Pattern

        return Pattern(irreps_node, irreps_edge, **self._options())

    def num_weights(self, irreps_node, irreps_edge) -> int:
        """The per-edge weights' count (one per irrep copy of the messages) for node features of
        ``irreps_node`` and edge attributes of ``irreps_edge``; callable on an unbound module."""
        return self._pattern(irreps_node, irreps_edge).num_weights

    def irreps_out(self, irreps_node, irreps_edge):
        """The result's irreps (e3nn's) for these inputs; callable on an unbound module."""
        return self._pattern(irreps_node, irreps_edge).irreps_out

    @nn.compact
    def __call__(self, node_feats, edge_attrs, weights, senders=None, receivers=None, *, graph=None, backend=None):
        from ..interop import message_passing

        return message_passing(
            node_feats,
            edge_attrs,
            weights,
            senders,
            receivers,
            graph=graph,
            backend=backend,
            **self._options(),
        )
