"""MACE on e3j: interaction (convolution), symmetric contraction, gated update, per-layer readout.

Layer ``t`` (``x`` the node features, ``0e`` embeddings at first):

    A  = Interaction(x)                       (irreps_a, e.g. 0e+1o+2e+3o; filter = irreps_a)
    B  = SymmetricContraction(A, species)     (correlation ν, output: hidden irreps, last layer 0e)
    h  = Linear(B) [+ Linear_skip(x) for t > 0]  → hidden irreps (+ gates when node_gating)
    x  = gate(h) when node_gating and t is not the last layer, else h
    E += readout_t(x)   (linear to 0e; the last layer: a SiLU MLP of width readout_hidden)

The node energies add ``atomic_energies[species]`` when the config has them.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from ..batch import GraphBatch
from ..config import MACEConfig
from ..embedding import SpeciesEmbedding
from ..gate import gate, gate_irreps_in
from ..interaction import Interaction, edge_features
from ..linear import EquivariantLinear
from ..ops import get_ops
from ..symmetric_contraction import SymmetricContraction, SymmetricContractionSpec

__all__ = ["MACE"]


class MACE(nn.Module):
    """``(positions [N, 3], cell [G, 3, 3], batch)`` -> node energies ``[N]``."""

    config: MACEConfig
    backend: str | None = None
    factored_radial: bool = True  # see Interaction

    @nn.compact
    def __call__(self, positions: jax.Array, cell: jax.Array, batch: GraphBatch) -> jax.Array:
        cfg, ops = self.config, get_ops(self.backend)
        num_species, c = len(cfg.atomic_numbers), cfg.num_channels
        sh, radial = edge_features(ops, cfg, positions, cell, batch)
        x = SpeciesEmbedding(num_species, c, name="embedding")(batch.species).astype(positions.dtype)
        irreps_x = "0e"
        irreps_a = str(cfg.irreps_a)
        energies = jnp.zeros(positions.shape[0], positions.dtype)
        for t in range(cfg.num_layers):
            last = t == cfg.num_layers - 1
            hidden = "0e" if last else str(cfg.irreps_hidden)
            gated = cfg.node_gating and not last
            a = Interaction(
                irreps_x, str(cfg.irreps_sh), irreps_a, irreps_a, c, tuple(cfg.radial_mlp), cfg.avg_num_neighbors,
                self.backend, self.factored_radial, name=f"interaction_{t}",
            )(x, sh, radial, batch.graph)  # fmt: skip
            spec = SymmetricContractionSpec(irreps_a, hidden, cfg.correlation)
            b = SymmetricContraction(irreps_a, hidden, cfg.correlation, num_species, self.backend, name=f"product_{t}")(
                a, batch.species
            )
            irreps_h = str(gate_irreps_in(hidden)) if gated else hidden
            h = EquivariantLinear(str(spec.irreps_result), irreps_h, c, self.backend, name=f"linear_{t}")(b)
            if t > 0:
                h = h + EquivariantLinear(irreps_x, irreps_h, c, self.backend, name=f"skip_{t}")(x)
            x = gate(h, hidden) if gated else h
            irreps_x = hidden
            if last:
                e = EquivariantLinear("0e", "0e", cfg.readout_hidden, self.backend, name=f"readout_{t}_0")(x)
                e = EquivariantLinear("0e", "0e", 1, self.backend, name=f"readout_{t}_1")(jax.nn.silu(e))
            else:
                e = EquivariantLinear(irreps_x, "0e", 1, self.backend, name=f"readout_{t}")(x)
            energies = energies + e[:, 0, 0]
        if cfg.atomic_energies is not None:
            energies = energies + jnp.asarray(cfg.atomic_energies, positions.dtype)[batch.species]
        return energies
