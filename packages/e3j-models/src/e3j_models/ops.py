"""The equivariant operations a model is written against, and their e3j implementation.

A model never calls e3j (or e3nn-jax) directly: it calls an :class:`Ops` strategy, so that one model
definition and one parameter tree run on e3j (any e3j backend, by name) or on the e3nn-jax twin
(``backend="e3nn"``, see :mod:`e3j_models._e3nn_ops`). Features are in e3j's layout ``[B, D, C]``
(``D`` the irreps dimension, trailing channels) at this interface.

Operations (all static irreps are :class:`e3j.Irreps`):

- ``spherical_harmonics(irreps, vectors [E, 3]) -> [E, D]`` (normalized input, ``"component"``).
- ``convolution(irreps_x, irreps_y, filter, x [N, Dx, C], y [E, Dy], s [E, P, C], graph) -> [N, Dout, C]``:
  ``m_b = Σ_{a→b} s_ab[p] · (x_a ⊗ y_ab)[path p]``, padding edges contributing nothing; ``s`` may be
  :class:`e3j.FactoredWeights` ``hidden [E, H] @ kernel [H, P·C]`` (the radial MLP's last layer),
  which e3j computes inside its convolution and the e3nn-jax twin multiplies out.
- ``tensor_product(irreps_x, irreps_y, filter, x [B, Dx, C], y [B, Dy, C]) -> [B, Dout, C]``, channel-wise.
- ``linear(irreps_in, irreps_out, weights, x [B, Din, Cin]) -> [B, Dout, Cout]``: :class:`e3j.Linear`'s
  weights and normalization; ``Cout`` is read from the weights, so ``weights`` must not be empty
  (irreps with no irrep in common: the output is zeros, which the caller builds).
- ``symmetric_contraction(spec, weights, x [N, D, C], species [N]) -> [N, D_out, C]``: MACE's product
  basis (see :mod:`e3j_models.symmetric_contraction`); the one place a fused kernel plugs in.

>>> ops = get_ops(None)
>>> ops.name
'e3j'
>>> get_ops("reference").backend
'reference'
"""

from __future__ import annotations

import math
from functools import cache
from typing import Protocol

import jax
import jax.numpy as jnp

import e3j
from e3j import Irreps

from .symmetric_contraction import SymmetricContractionSpec

__all__ = ["E3jOps", "Ops", "get_ops"]


class Ops(Protocol):
    """What a model needs from an equivariant backend (see the module docstring for shapes)."""

    name: str

    def spherical_harmonics(self, irreps: Irreps, vectors: jax.Array) -> jax.Array: ...

    def convolution(
        self,
        irreps_x: Irreps,
        irreps_y: Irreps,
        filter: Irreps | None,
        x: jax.Array,
        y: jax.Array,
        s: jax.Array | e3j.FactoredWeights,
        graph: e3j.Graph,
    ) -> jax.Array: ...

    def tensor_product(
        self, irreps_x: Irreps, irreps_y: Irreps, filter: Irreps | None, x: jax.Array, y: jax.Array
    ) -> jax.Array: ...

    def linear(
        self, irreps_in: Irreps, irreps_out: Irreps, weights: dict[str, jax.Array], x: jax.Array
    ) -> jax.Array: ...

    def symmetric_contraction(
        self, spec: SymmetricContractionSpec, weights: dict[str, jax.Array], x: jax.Array, species: jax.Array
    ) -> jax.Array: ...


def linear_channels_out(weights: dict[str, jax.Array]) -> int:
    """``Cout`` of :meth:`Ops.linear`'s weights (:class:`e3j.Linear`'s, ``[mul_in, mul_out, Cin, Cout]`` each)."""
    if not weights:
        raise ValueError(
            "linear: weights is empty (irreps_in and irreps_out have no irrep in common), so the output's "
            "channel count cannot be read from it; the output is zeros [B, D_out, C_out]"
        )
    return int(next(iter(weights.values())).shape[-1])


@cache
def _conv(irreps_x: Irreps, irreps_y: Irreps, filter: Irreps | None) -> e3j.Convolution:
    return e3j.Convolution(irreps_x, irreps_y, filter)


@cache
def _tp(irreps_x: Irreps, irreps_y: Irreps, filter: Irreps | None) -> e3j.TensorProduct:
    return e3j.TensorProduct(irreps_x, irreps_y, filter)


@cache
def _linear(irreps_in: Irreps, irreps_out: Irreps, channels_in: int, channels_out: int) -> e3j.Linear:
    return e3j.Linear(irreps_in, irreps_out, channels_in=channels_in, channels_out=channels_out)


class E3jOps:
    """The e3j implementation; ``backend`` names an e3j backend (``None``: e3j's own selection)."""

    name = "e3j"

    def __init__(self, backend: str | None = None) -> None:
        self.backend = backend

    def spherical_harmonics(self, irreps: Irreps, vectors: jax.Array) -> jax.Array:
        return e3j.spherical_harmonics(Irreps(irreps), vectors, normalize=True)

    def convolution(
        self,
        irreps_x: Irreps,
        irreps_y: Irreps,
        filter: Irreps | None,
        x: jax.Array,
        y: jax.Array,
        s: jax.Array | e3j.FactoredWeights,
        graph: e3j.Graph,
    ) -> jax.Array:
        return _conv(Irreps(irreps_x), Irreps(irreps_y), _opt(filter))(x, y, s, graph, backend=self.backend)

    def tensor_product(
        self, irreps_x: Irreps, irreps_y: Irreps, filter: Irreps | None, x: jax.Array, y: jax.Array
    ) -> jax.Array:
        return _tp(Irreps(irreps_x), Irreps(irreps_y), _opt(filter))(x, y, backend=self.backend)

    def linear(self, irreps_in: Irreps, irreps_out: Irreps, weights: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        channels_out = linear_channels_out(weights)
        lin = _linear(Irreps(irreps_in), Irreps(irreps_out), int(x.shape[-1]), int(channels_out))
        return lin(weights, x)

    def symmetric_contraction(
        self, spec: SymmetricContractionSpec, weights: dict[str, jax.Array], x: jax.Array, species: jax.Array
    ) -> jax.Array:
        """Power expansion with e3j tensor products, then the species-wise linear projection."""
        terms = [x]  # B_1 = A
        for k in range(2, spec.last_power + 1):
            prev_irreps = spec.irreps_in if k == 2 else spec.power_irreps[k - 3]
            terms.append(self.tensor_product(prev_irreps, spec.irreps_in, spec.power_filter(k), terms[-1], x))
        # each term split once into its (mul, ir) blocks: a split's backward is one concatenation,
        # where separate row slices cost a pad and an add of the whole term each (XLA's CPU)
        blocks_of: dict = {}  # irrep -> [N, mul, dim, C] blocks, in B_1 … B_ν row order
        for irreps_k, term in zip([spec.irreps_in, *spec.power_irreps], terms):
            for (mul, ir), block in zip(irreps_k, e3j.irrep_blocks(term, irreps_k)):
                if mul:
                    blocks_of.setdefault(ir, []).append(block)
        out_blocks = []
        for ir, n in spec.copies_per_irrep():
            parts = blocks_of[ir]
            stacked = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)  # [N, n, dim, C]
            w = weights[str(ir)].astype(x.dtype)[species]  # [N, n, C]
            out_blocks.append(jnp.einsum("nkdc,nkc->ndc", stacked, w) / math.sqrt(n))
        return jnp.concatenate(out_blocks, axis=1)


def _opt(filter):
    return None if filter is None else Irreps(filter)


@cache
def get_ops(backend: str | None) -> Ops:
    """The :class:`Ops` for ``backend``: ``"e3nn"`` for the e3nn-jax twin, else an e3j backend name or ``None``."""
    if backend == "e3nn":
        from ._e3nn_ops import E3nnOps

        return E3nnOps()
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend must be None, 'e3nn' or an e3j backend name, got {backend!r}")
    return E3jOps(backend)
