"""NequIP on e3j: ``num_layers`` gated interaction blocks with a linear self-connection.

Layer ``t``: ``x = gate(Interaction(x) + Linear_skip(x))`` with the convolution filtered to the node
irreps and both terms producing the node irreps plus their gates; then a SiLU MLP readout of the
``0e`` features (``readout_hidden`` wide) gives the node energies (plus ``atomic_energies``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from e3j import Irreps

from ..batch import GraphBatch
from ..config import NequIPConfig
from ..embedding import SpeciesEmbedding
from ..gate import gate, gate_irreps_in
from ..interaction import Interaction, edge_features
from ..linear import EquivariantLinear
from ..ops import get_ops

__all__ = ["NequIP"]


class NequIP(nn.Module):
    """``(positions [N, 3], cell [G, 3, 3], batch)`` -> node energies ``[N]``."""

    config: NequIPConfig
    backend: str | None = None
    factored_radial: bool = True  # see Interaction

    @nn.compact
    def __call__(self, positions: jax.Array, cell: jax.Array, batch: GraphBatch) -> jax.Array:
        cfg, ops = self.config, get_ops(self.backend)
        c = cfg.num_channels
        sh, radial = edge_features(ops, cfg, positions, cell, batch)
        x = SpeciesEmbedding(len(cfg.atomic_numbers), c, name="embedding")(batch.species).astype(positions.dtype)
        irreps_x = "0e"
        node = str(cfg.irreps_node)
        node_in = str(gate_irreps_in(node))
        filter = str(Irreps([(1, ir) for _, ir in cfg.irreps_node]))
        for t in range(cfg.num_layers):
            m = Interaction(
                irreps_x, str(cfg.irreps_sh), filter, node_in, c, tuple(cfg.radial_mlp), cfg.avg_num_neighbors,
                self.backend, self.factored_radial, name=f"interaction_{t}",
            )(x, sh, radial, batch.graph)  # fmt: skip
            skip = EquivariantLinear(irreps_x, node_in, c, self.backend, name=f"skip_{t}")(x)
            x = gate(m + skip, node)
            irreps_x = node
        e = EquivariantLinear(node, "0e", cfg.readout_hidden, self.backend, name="readout_0")(x)
        e = EquivariantLinear("0e", "0e", 1, self.backend, name="readout_1")(jax.nn.silu(e))
        energies = e[:, 0, 0]
        if cfg.atomic_energies is not None:
            energies = energies + jnp.asarray(cfg.atomic_energies, positions.dtype)[batch.species]
        return energies
