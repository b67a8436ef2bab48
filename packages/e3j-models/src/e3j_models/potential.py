"""A model as an interatomic potential: energies, forces ``-∂E/∂r`` and stress ``(1/V) ∂E/∂ε``.

:class:`Potential` binds a config to its Flax module and a backend (``None`` or an e3j backend name:
e3j; ``"e3nn"``: the e3nn-jax twin). The parameter tree does not depend on the backend, so one
``params`` evaluates on both. Forces are the gradient of the total energy with respect to positions;
stress is the gradient with respect to a homogeneous deformation ``F = 1 + ε`` applied to positions
and cell (per structure), divided by the cell volume (ASE's sign convention); structures without a
cell (zero volume) get NaN stress, and one with a cell of nonzero volume, periodic in some
directions or in none (a slab, a molecule in a box), gets the stress over that volume, vacuum
included (ASE's calculators' rule).

>>> import jax, numpy as np
>>> from e3j_models import Potential, make_batch, nequip
>>> pot = Potential(nequip((1, 8), num_layers=1, num_channels=2, node_irreps="0e + 1o", l_max=1))
>>> batch = make_batch(np.array([[0.0, 0, 0], [0.9, 0.3, 0]]), [1, 0], [0, 1], [1, 0])
>>> params = pot.init(jax.random.key(0), batch)
>>> out = jax.jit(pot)(params, batch)
>>> out["energy"].shape, out["forces"].shape
((1,), (2, 3))
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

import e3j.backends

from ._checks import check_bool, check_host_index, check_model_dtype
from .batch import GraphBatch
from .config import MACEConfig, NequIPConfig, check_config
from .models import MACE, NequIP
from .ops import get_ops

__all__ = ["Potential"]


class Potential:
    """``Potential(config, backend=None, *, factored_radial=True)``; ``pot(params, batch, forces=True,
    stress=False)`` -> dict.

    The dict has ``energy [G]`` and, as asked, ``forces [N, 3]`` (zero on padding nodes) and
    ``stress [G, 3, 3]``. The methods are pure functions of ``params`` and ``batch``: wrap them in
    ``jax.jit`` (the batch's shapes are the compile key; ``forces`` and ``stress`` are static:
    ``jax.jit(pot, static_argnames=("forces", "stress"))``). Called eagerly, the species of real
    nodes are checked against the model's elements; under ``jit`` they cannot be read.

    ``factored_radial`` (an execution choice, not part of the model: the same values and parameters)
    gives each convolution its radial MLP's last layer as factors (:class:`e3j.FactoredWeights`),
    which the reference backend computes inside its sweep: ~4× less XLA temporary memory, the edge
    scalars recomputed in every sweep that reads them. Backends without such kernels (e3j's GPU and
    TPU backends) get them multiplied out before the convolution, as with ``False``, which does so
    everywhere (measured both ways in docs/models.md).
    """

    def __init__(
        self, config: MACEConfig | NequIPConfig, backend: str | None = None, *, factored_radial: bool = True
    ) -> None:
        factored_radial = check_bool("factored_radial", factored_radial)
        model = MACE if isinstance(check_config(config), MACEConfig) else NequIP
        self.module = model(config, backend, factored_radial)
        if backend == "e3nn":
            get_ops(backend)  # e3nn-jax installed (an optional extra), now, not at the first call
        elif backend is not None:
            if not isinstance(backend, str):
                raise TypeError(f"backend must be None, 'e3nn' or an e3j backend name, got {backend!r}")
            try:  # now, not at the first call; installed is enough (a GPU backend may be lowered on a CPU)
                e3j.backends.get_backend(backend)
            except e3j.backends.BackendError as err:
                raise ValueError(f"backend must be None, 'e3nn' or an installed e3j backend: {err}") from None
        self.config, self.backend, self.factored_radial = config, backend, factored_radial

    # equal potentials compute the same function: jit's static-argument cache then reuses one
    # compilation for them (evaluate, fit) instead of keeping one per instance alive
    def _key(self) -> tuple:
        return (self.config, self.backend, self.factored_radial)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Potential) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash((Potential, *self._key()))

    def with_backend(self, backend: str | None) -> Potential:
        """The same potential (config, radial form; parameters unchanged) on another backend."""
        return Potential(self.config, backend, factored_radial=self.factored_radial)

    def _bare(self) -> Potential:
        """This potential without its config's ``atomic_energies``, for callers that add them on the
        host in float64 (:func:`_reference_energy`): in float32 a reference energy of ~1e4 eV per
        atom keeps ~1e-3 eV, and the sum over a few hundred atoms ~0.1–1 eV."""
        config = dataclasses.replace(self.config, atomic_energies=None)
        return Potential(config, self.backend, factored_radial=self.factored_radial)

    def batch(self, structures, **kwargs) -> GraphBatch:
        """:func:`~e3j_models.batch_structures` with this model's ``atomic_numbers`` and ``cutoff``
        (a batch built with another element order or a shorter cutoff gives wrong energies, and a
        batch cannot tell); ``kwargs`` are its padding and dtype options."""
        from .neighbours import batch_structures

        return batch_structures(structures, self.config.atomic_numbers, self.config.cutoff, **kwargs)

    def check_params(self, params) -> None:
        """``ValueError`` unless ``params`` has the tree and shapes :meth:`init` gives for this config
        (parameters of another config fail inside Flax with errors that name neither)."""
        if not isinstance(params, Mapping):
            raise TypeError(f"params must be the dict Potential.init returns, got {type(params).__name__}")
        expected = _parameter_shapes(self.config)
        got = _shapes(params)
        missing, extra = sorted(expected.keys() - got.keys()), sorted(got.keys() - expected.keys())
        wrong = [(k, got[k], expected[k]) for k in sorted(expected.keys() & got.keys()) if got[k] != expected[k]]
        if missing or extra or wrong:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
            if extra:
                parts.append(f"unexpected {', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}")
            if wrong:
                k, g, e = wrong[0]
                more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
                parts.append(f"{k} has shape {g}, expected {e}{more}")
            raise ValueError(
                f"params do not fit this {self.config.kind} config (made for another config?): " + "; ".join(parts)
            )

    def init(self, key: jax.Array, batch: GraphBatch, dtype: DTypeLike | None = None) -> dict[str, Any]:
        """Random parameters, floating leaves in ``dtype`` (default: the positions' dtype).

        The values are drawn in float32 and cast, so one key gives the same model in float32 and
        float64 (a float64 run then starts from the float32 run's parameters exactly)."""
        _check_batch(batch)
        dtype = batch.positions.dtype if dtype is None else dtype
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(f"dtype must be a floating dtype (the parameters'), got {jnp.dtype(dtype)}")
        if jnp.dtype(dtype) == jnp.float64:
            check_model_dtype(dtype)  # without x64 the cast below would give float32 parameters
        params = jax.jit(self.module.init)(key, batch.positions, batch.cell, batch)
        return jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, params)

    def node_energies(self, params: Mapping[str, Any], batch: GraphBatch) -> jax.Array:
        """``[N]``, zero on padding nodes."""
        _check_call(params, batch)
        self.check_params(params)
        _check_species(batch, len(self.config.atomic_numbers))
        return self._node_energies(params, batch.positions, batch.cell, batch)

    def energy(self, params: Mapping[str, Any], batch: GraphBatch) -> jax.Array:
        """``[G]`` total energy of each structure."""
        return _per_graph(self.node_energies(params, batch), batch)

    def _node_energies(self, params, positions, cell, batch) -> jax.Array:
        return jnp.where(batch.node_mask, self.module.apply(params, positions, cell, batch), 0)

    def _energy_of(self, params, positions, strain, batch):
        deform = jnp.eye(3, dtype=positions.dtype) + strain  # [G, 3, 3]
        positions = jnp.einsum("ni,nji->nj", positions, deform[batch.node_graph])
        cell = jnp.einsum("gki,gji->gkj", batch.cell, deform)
        per_graph = _per_graph(self._node_energies(params, positions, cell, batch), batch)
        return jnp.sum(per_graph), per_graph

    def __call__(
        self, params: Mapping[str, Any], batch: GraphBatch, *, forces: bool = True, stress: bool = False
    ) -> dict[str, jax.Array]:
        _check_call(params, batch)
        self.check_params(params)
        _check_species(batch, len(self.config.atomic_numbers))
        for name, flag in (("forces", forces), ("stress", stress)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(
                    f"{name} must be a bool (static under jit: jax.jit(pot, static_argnames=('forces', "
                    f"'stress'))), got {type(flag).__name__}"
                )
        strain = jnp.zeros((batch.num_graphs, 3, 3), batch.positions.dtype)
        forces, stress = bool(forces), bool(stress)
        if not (forces or stress):
            return {"energy": self._energy_of(params, batch.positions, strain, batch)[1]}
        grads, energy = jax.grad(self._energy_of, argnums=(1, 2), has_aux=True)(params, batch.positions, strain, batch)
        out = {"energy": energy}
        if forces:
            out["forces"] = jnp.where(batch.node_mask[:, None], -grads[0], 0)
        if stress:
            volume = jnp.abs(jnp.linalg.det(batch.cell))[:, None, None]
            periodic = volume > 0
            # divide by a safe volume: 1/0 in the branch where() drops would still make its gradient NaN
            out["stress"] = jnp.where(periodic, grads[1] / jnp.where(periodic, volume, 1), jnp.nan)
        return out


def _per_graph(node_values: jax.Array, batch: GraphBatch) -> jax.Array:
    """``[N] -> [G]``: each structure's sum (padding nodes must hold 0)."""
    return jax.ops.segment_sum(node_values, batch.node_graph, batch.num_graphs)


def _reference_energy(
    elements: Sequence[int], atomic_energies: Sequence[float] | None, atomic_numbers: Sequence[int]
) -> float:
    """A structure's sum of ``atomic_energies`` (one per element of ``elements``, a config's
    ``atomic_numbers``; None: 0) over its atoms' ``atomic_numbers``, in float64: what the host adds
    to a bare model's energy (the Calculator) or takes out of an energy label (``fit``'s batches).

    >>> _reference_energy((1, 8), (-13.5, -2042.0), [8, 1, 1])
    -2069.0
    """
    if atomic_energies is None:
        return 0.0
    e0 = dict(zip(elements, atomic_energies, strict=True))
    return sum(e0[int(z)] for z in atomic_numbers)


def _check_batch(batch: object) -> None:
    if not isinstance(batch, GraphBatch):
        raise TypeError(f"batch must be an e3j_models.GraphBatch (see make_batch), got {type(batch).__name__}")


def _check_species(batch: GraphBatch, num_species: int) -> None:
    # concrete species (an eager call) must index the model's elements; traced ones cannot be read
    # and, like any out-of-range index in JAX, are clamped (a negative one wraps around)
    check_host_index("batch.species", batch.species, 0, num_species, "the model's atomic_numbers", batch.node_mask)


def _check_call(params: object, batch: object) -> None:
    """The batch's type and the dtype its positions share with the parameters (static: free under jit)."""
    _check_batch(batch)
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be the dict Potential.init returns, got {type(params).__name__}")
    # positions wider than params promote (f64 positions, f32 params compute in f64); the reverse
    # reached e3j's ops as mixed operands and failed there, naming none of these arguments
    # dtypes read off the leaves (jnp.result_type per leaf cost ~7 us each, eagerly)
    dtypes = {getattr(a, "dtype", None) for a in jax.tree.leaves(params)} - {None}
    positions = jnp.result_type(batch.positions)
    wider = sorted(str(d) for d in dtypes if jnp.issubdtype(d, jnp.floating) and d.itemsize > positions.itemsize)
    if wider:
        raise TypeError(
            f"batch.positions are {positions} but params are {', '.join(wider)}: cast the positions up or the "
            "params down (Potential.init(..., dtype=...))"
        )


@functools.lru_cache(maxsize=64)
def _parameter_shapes(config: MACEConfig | NequIPConfig) -> dict[str, tuple[int, ...]]:
    """``{path: shape}`` of the parameters ``Potential(config).init`` gives (traced once per config:
    the shapes do not depend on the batch)."""
    from .batch import make_batch

    pot = Potential(config)
    batch = make_batch(np.zeros((1, 3)), [0], [], [])
    tree = jax.eval_shape(pot.module.init, jax.random.key(0), batch.positions, batch.cell, batch)
    return _shapes(tree)


def _shapes(tree) -> dict[str, tuple[int, ...]]:
    """``{"params/interaction_0/linear_up/0e": shape, ...}``: paths named as :func:`save` names them."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    name = lambda k: str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))  # noqa: E731
    return {"/".join(name(k) for k in path): tuple(np.shape(leaf)) for path, leaf in flat}
