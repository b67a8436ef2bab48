"""Message passing around :class:`e3j.Convolution`: radial MLP, linear up, convolution, linear down.

:class:`RadialMLP` maps the radial embedding ``[E, n_basis]`` to the convolution's edge scalars
``s [E, num_paths, C]`` (one weight per path and channel; SiLU hidden layers, no biases so that
zero embeddings, e.g. padding edges, give zero weights). :class:`Interaction` computes

    h = Linear_up(x);  m_b = Σ_{a→b} s_ab · (h_a ⊗ Y(r_ab)) / avg_num_neighbors;  out = Linear_down(m)

with ``Y`` the spherical harmonics of the edge vectors (``irreps_sh``) and the product filtered to
``filter``. Features are e3j's ``[N, D, C]``; all equivariant work goes through the model's ops.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from e3j import Graph, Irreps
from e3j_core import as_irreps, tensor_product_coo
from e3j_core.coo import normalize_filter

from ._checks import check_rank
from .batch import GraphBatch, edge_vectors
from .linear import EquivariantLinear
from .ops import Ops, get_ops
from .radial import radial_embedding

__all__ = ["Interaction", "RadialMLP", "edge_features"]


class RadialMLP(nn.Module):
    """``[E, n_basis] -> [E, num_paths, channels]`` with SiLU hidden layers ``hidden`` (no biases)."""

    hidden: Sequence[int]
    num_paths: int
    channels: int

    @nn.compact
    def __call__(self, radial: jax.Array) -> jax.Array:
        check_rank("radial", radial, (2,), "[E, num_basis]")
        h = radial
        for width in self.hidden:
            h = jax.nn.silu(nn.Dense(width, use_bias=False)(h))
        h = nn.Dense(self.num_paths * self.channels, use_bias=False)(h)
        return h.reshape(radial.shape[0], self.num_paths, self.channels)


class Interaction(nn.Module):
    """``x [N, D_in, C]``, ``sh [E, D_sh]``, ``radial [E, n]``, ``graph`` -> ``[N, D_out, C]``.

    Attributes: ``irreps_in``, ``irreps_sh``, ``filter`` (the convolution's output irreps),
    ``irreps_out``, ``channels``, ``radial_hidden``, ``avg_num_neighbors``, ``backend``.
    """

    irreps_in: str
    irreps_sh: str
    filter: str
    irreps_out: str
    channels: int
    radial_hidden: Sequence[int] = (64, 64, 64)
    avg_num_neighbors: float = 1.0
    backend: str | None = None

    @nn.compact
    def __call__(self, x: jax.Array, sh: jax.Array, radial: jax.Array, graph: Graph) -> jax.Array:
        irreps_in, irreps_sh = as_irreps(self.irreps_in, "irreps_in"), as_irreps(self.irreps_sh, "irreps_sh")
        filter = Irreps(normalize_filter(self.filter, "filter"))  # any irreps form; multiplicities ignored
        coo = tensor_product_coo(irreps_in, irreps_sh, filter)
        check_rank("radial", radial, (2,), "[E, num_basis]")
        if isinstance(graph, Graph) and jnp.shape(radial)[0] != graph.num_edges:
            raise ValueError(f"radial must be [E={graph.num_edges}, num_basis] (one row per edge), got {radial.shape}")
        h = EquivariantLinear(self.irreps_in, self.irreps_in, self.channels, self.backend, name="linear_up")(x)
        s = RadialMLP(tuple(self.radial_hidden), coo.num_paths, self.channels, name="radial")(radial)
        m = get_ops(self.backend).convolution(irreps_in, irreps_sh, filter, h, sh, s.astype(h.dtype), graph)
        m = m / self.avg_num_neighbors
        return EquivariantLinear(str(coo.irreps_out), self.irreps_out, self.channels, self.backend, name="linear_down")(
            m
        )


def edge_features(
    ops: Ops, cfg, positions: jax.Array, cell: jax.Array, batch: GraphBatch
) -> tuple[jax.Array, jax.Array]:
    """Spherical harmonics ``[E, D_sh]`` (``cfg.irreps_sh``) and radial embedding ``[E, cfg.num_rbf]`` of the edges."""
    vectors = edge_vectors(positions, cell, batch)
    r2 = jnp.sum(vectors * vectors, axis=-1)
    r = jnp.sqrt(jnp.where(r2 > 0, r2, 1.0))
    sh = ops.spherical_harmonics(cfg.irreps_sh, vectors)
    radial = radial_embedding(r, cfg.num_rbf, cfg.cutoff, cfg.envelope_p, batch.graph.edge_mask & (r2 > 0))
    return sh, radial
