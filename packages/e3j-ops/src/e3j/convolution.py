"""The fused message-passing convolution ``m_b = Σ_{a→b} s_ab · (x_a ⊗ y_ab)``."""

from __future__ import annotations

import jax

from ._checks import check_rank, check_same_dtype
from ._coo_op import CooOp
from ._factored_route import convolution_fusing, factored_or_array
from ._primitives.convolution import CONVOLUTION, CONVOLUTION_FACTORED, ConvSpec, FactoredConvSpec
from .backends import current_backend_request
from .factored import FactoredWeights, check_weights
from .graph import Graph, check_graph

__all__ = ["Convolution"]


class Convolution(CooOp):
    """Equivariant message passing: ``m_b = Σ_{a→b} s_ab[p] · (x_a ⊗ y_ab)[path p]``.

    ``conv = Convolution(irreps_x, irreps_y, filter)``; ``conv(x, y, s, graph)`` with node features
    ``x: [N, Dx, C]``, edge features ``y: [E, Dy]`` (e.g. spherical harmonics, broadcast over
    channels) or ``[E, Dy, C]``, edge scalars ``s: [E, conv.num_paths, C]`` and an
    :class:`e3j.Graph` returns ``[N, Dout, C]``. For every path ``p``, rows ``conv.path_slices[p]``
    of the result equal ``Σ_{a→b} s_ab[p] · TensorProduct(irreps_x, irreps_y, filter)(x_a, y_ab)``
    on the same rows. Padding edges (``edge_mask`` False) contribute nothing and cost nothing.
    Messages are never materialized as an ``[E, Dout, C]`` array.

    ``s`` may also be :class:`e3j.FactoredWeights` ``(hidden [E, H], kernel [H, num_paths · C], bias
    [num_paths · C] or None)``: the edge scalars as the radial network's last linear layer, ``s =
    (hidden @ kernel + bias).reshape(E, num_paths, C)`` (path-major columns, as a ``Dense(num_paths
    · C)`` output reshaped). The reference backend then computes each chunk of edges' scalars inside
    its sweep, so the ``[E, num_paths, C]`` array is never written, nor kept for the backward
    (``hidden`` is). Where the backend has no such kernels (e3j's GPU and TPU backends, a plugin
    without them) the scalars are multiplied out before the array's primitive,
    computed once and kept for the backward as a ``Dense`` output would be (both forms are bound
    behind :func:`jax.lax.platform_dependent` when the platforms differ; lowering keeps one). Same
    values and derivatives (with respect to ``hidden``, ``kernel`` and ``bias`` too) as the array.

    >>> import numpy as np, jax.numpy as jnp
    >>> conv = Convolution("0e + 1o", "0e + 1o", filter="0e + 1o")
    >>> g = Graph.from_edges(np.array([0, 1]), np.array([1, 0]), num_nodes=2)
    >>> m = conv(jnp.ones((2, 4, 8)), jnp.ones((2, 4)), jnp.ones((2, conv.num_paths, 8)), g)
    >>> m.shape, conv.num_paths
    ((2, 8, 8), 4)
    >>> w = FactoredWeights(jnp.ones((2, 16)), jnp.ones((16, conv.num_paths * 8)) / 16)
    >>> bool(jnp.allclose(conv(jnp.ones((2, 4, 8)), jnp.ones((2, 4)), w, g), m))
    True
    """

    def __call__(
        self,
        x: jax.Array,
        y: jax.Array,
        s: jax.Array | FactoredWeights,
        graph: Graph,
        *,
        backend: str | None = None,
    ) -> jax.Array:
        coo = self.coo
        check_graph(graph)
        check_rank("x", x, (3,), f"[N, Dx={coo.dim_x}, C]")
        check_rank("y", y, (2, 3), f"[E, Dy={coo.dim_y}] or [E, Dy, C]")
        if isinstance(s, FactoredWeights):
            return self._factored(x, y, s, graph, backend)
        check_rank("s", s, (3,), f"[E, num_paths={coo.num_paths}, C]")
        self._check_operands(x, y, s, graph.num_nodes, graph.num_edges)
        leaves, tree = jax.tree.flatten(graph)
        spec = ConvSpec(coo, y_channels=y.ndim == 3, graph_tree=tree)
        out = CONVOLUTION.bind_M(spec, {"x": x, "y": y, "s": s}, leaves, ("m",), current_backend_request(backend))
        return out["m"]

    def _check_operands(self, x, y, s, n: int, e: int) -> None:
        """Shapes and dtypes of array operands (ranks checked) for a graph of ``n`` nodes and ``e`` edges."""
        coo = self.coo
        check_same_dtype(x=x, y=y, s=s)
        self._check_xy(x, y, n, e)
        if s.shape[:2] != (e, coo.num_paths):
            raise ValueError(f"s must be [E={e}, num_paths={coo.num_paths}, C], got {s.shape}")
        if s.shape[2] != x.shape[2]:
            raise ValueError(f"x has {x.shape[2]} channels but s has {s.shape[2]}")

    def _check_xy(self, x, y, n: int, e: int) -> None:
        coo = self.coo
        if x.shape[:2] != (n, coo.dim_x):
            raise ValueError(
                f"x must be [N={n}, Dx={coo.dim_x}, C] for irreps_x {coo.irreps_x} and this graph, got {x.shape}"
            )
        if y.shape[:2] != (e, coo.dim_y):
            raise ValueError(
                f"y must be [E={e}, Dy={coo.dim_y}(, C)] for irreps_y {coo.irreps_y} and this graph, got {y.shape}"
            )
        if y.ndim == 3 and y.shape[2] != x.shape[2]:
            raise ValueError(f"x has {x.shape[2]} channels but y has {y.shape[2]}")

    def _check_factored(self, x, y, w: FactoredWeights, n: int, e: int) -> None:
        """:meth:`_check_operands` for weights given as :class:`FactoredWeights`."""
        coo, channels = self.coo, x.shape[2]
        check_weights("s", w, e, coo.num_paths * channels, f"num_paths={coo.num_paths} × C={channels}")
        check_same_dtype(x=x, y=y, **w.named_parts("s"))
        self._check_xy(x, y, n, e)

    def _factored(self, x, y, w: FactoredWeights, graph: Graph, backend: str | None) -> jax.Array:
        coo, channels = self.coo, x.shape[2]
        self._check_factored(x, y, w, graph.num_nodes, graph.num_edges)
        leaves, tree = jax.tree.flatten(graph)
        request = current_backend_request(backend)

        y_channels = y.ndim == 3

        def factored(x, y, hidden, kernel, leaves):
            spec = FactoredConvSpec(coo, y_channels=y_channels, graph_tree=tree)
            operands = {"x": x, "y": y, "h": hidden, "k": kernel.reshape(kernel.shape[0], coo.num_paths, channels)}
            return CONVOLUTION_FACTORED.bind_M(spec, operands, leaves, ("m",), request)["m"]

        def array(x, y, s, leaves):
            spec = ConvSpec(coo, y_channels=y_channels, graph_tree=tree)
            s = s.reshape(s.shape[0], coo.num_paths, channels)
            return CONVOLUTION.bind_M(spec, {"x": x, "y": y, "s": s}, leaves, ("m",), request)["m"]

        fusing = convolution_fusing(coo, x.dtype, channels, request)
        return factored_or_array(fusing, factored, array, x, y, w, tree, leaves)
