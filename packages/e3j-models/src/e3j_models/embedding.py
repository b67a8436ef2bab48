"""Species embedding: a learned ``[num_species, C]`` table, as ``0e`` features ``[N, 1, C]``.

>>> import jax, jax.numpy as jnp
>>> emb = SpeciesEmbedding(num_species=3, channels=4)
>>> params = emb.init(jax.random.key(0), jnp.array([0, 2]))
>>> emb.apply(params, jnp.array([0, 2])).shape
(2, 1, 4)
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from ._checks import check_positive_int, check_rank, index_array

__all__ = ["SpeciesEmbedding"]


class SpeciesEmbedding(nn.Module):
    """``species [N]`` (ints in ``[0, num_species)``) -> ``[N, 1, channels]`` (irreps ``0e``)."""

    num_species: int
    channels: int

    @nn.compact
    def __call__(self, species: jax.Array) -> jax.Array:
        check_positive_int("num_species", self.num_species)
        check_positive_int("channels", self.channels)
        species = index_array("species", species)
        check_rank("species", species, (1,), "[N]")
        table = self.param("table", nn.initializers.normal(1.0), (self.num_species, self.channels), jnp.float32)
        return table[species][:, None, :]
