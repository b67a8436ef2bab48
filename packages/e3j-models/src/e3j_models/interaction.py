"""Message passing around :class:`e3j.Convolution`: radial MLP, linear up, convolution, linear down.

:class:`RadialMLP` maps the radial embedding ``[E, n_basis]`` to the convolution's edge scalars
``s [E, num_paths, C]`` (one weight per path and channel; SiLU hidden layers, no biases so that
zero embeddings, e.g. padding edges, give zero weights); :class:`Interaction` takes them factored,
as the last hidden layer and the last layer's kernel (:class:`e3j.FactoredWeights`), so that the
convolution computes them chunk by chunk and the ``[E, num_paths, C]`` array is never written
(same parameters, same values). :class:`Interaction` computes

    h = Linear_up(x);  m_b = Σ_{a→b} s_ab · (h_a ⊗ Y(r_ab)) / avg_num_neighbors;  out = Linear_down(m)

with ``Y`` the spherical harmonics of the edge vectors (``irreps_sh``) and the product filtered to
``filter``. Features are e3j's ``[N, D, C]``; all equivariant work goes through the model's ops.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from e3j import FactoredWeights, Graph, Irreps
from e3j_core import as_irreps, tensor_product_coo
from e3j_core.coo import normalize_filter

from ._checks import check_bool, check_rank
from .batch import GraphBatch, edge_vectors
from .linear import EquivariantLinear
from .ops import Ops, get_ops
from .radial import radial_embedding

__all__ = ["Interaction", "RadialMLP", "edge_features"]


class RadialMLP(nn.Module):
    """``[E, n_basis] -> [E, num_paths, channels]`` with SiLU hidden layers ``hidden`` (no biases).

    ``factored=True`` returns the same scalars as :class:`e3j.FactoredWeights` ``(hidden [E, H],
    kernel [H, num_paths · channels])``, the last layer not applied (what :class:`e3j.Convolution`
    takes); the parameter tree is the same either way.
    """

    hidden: Sequence[int]
    num_paths: int
    channels: int
    factored: bool = False

    @nn.compact
    def __call__(self, radial: jax.Array) -> jax.Array | FactoredWeights:
        check_rank("radial", radial, (2,), "[E, num_basis]")
        h = radial
        for width in self.hidden:
            h = jax.nn.silu(nn.Dense(width, use_bias=False)(h))
        features = self.num_paths * self.channels
        if self.factored:
            # named as nn.Dense's auto-name would be, with its initializer: the same tree and init
            return FactoredWeights(h, _Kernel(features, name=f"Dense_{len(self.hidden)}")(h))
        h = nn.Dense(features, use_bias=False)(h)
        return h.reshape(radial.shape[0], self.num_paths, self.channels)


class _Kernel(nn.Module):
    """The kernel of an ``nn.Dense(features, use_bias=False)`` (same name, shape, dtype and
    initializer), returned instead of applied."""

    features: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], self.features), jnp.float32)


class Interaction(nn.Module):
    """``x [N, D_in, C]``, ``sh [E, D_sh]``, ``radial [E, n]``, ``graph`` -> ``[N, D_out, C]``.

    Attributes: ``irreps_in``, ``irreps_sh``, ``filter`` (the convolution's output irreps),
    ``irreps_out``, ``channels``, ``radial_hidden``, ``avg_num_neighbors``, ``backend``,
    ``factored_radial`` (default True: the radial MLP's output given to the convolution as its
    factors, see the module doc; False: multiplied out first, the same values and parameters).
    """

    irreps_in: str
    irreps_sh: str
    filter: str
    irreps_out: str
    channels: int
    radial_hidden: Sequence[int] = (64, 64, 64)
    avg_num_neighbors: float = 1.0
    backend: str | None = None
    factored_radial: bool = True

    @nn.compact
    def __call__(self, x: jax.Array, sh: jax.Array, radial: jax.Array, graph: Graph) -> jax.Array:
        irreps_in, irreps_sh = as_irreps(self.irreps_in, "irreps_in"), as_irreps(self.irreps_sh, "irreps_sh")
        filter = Irreps(normalize_filter(self.filter, "filter"))  # any irreps form; multiplicities ignored
        coo = tensor_product_coo(irreps_in, irreps_sh, filter)
        check_rank("radial", radial, (2,), "[E, num_basis]")
        if isinstance(graph, Graph) and jnp.shape(radial)[0] != graph.num_edges:
            raise ValueError(f"radial must be [E={graph.num_edges}, num_basis] (one row per edge), got {radial.shape}")
        h = EquivariantLinear(self.irreps_in, self.irreps_in, self.channels, self.backend, name="linear_up")(x)
        factored = check_bool("factored_radial", self.factored_radial)
        s = RadialMLP(tuple(self.radial_hidden), coo.num_paths, self.channels, factored, name="radial")(radial)
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
