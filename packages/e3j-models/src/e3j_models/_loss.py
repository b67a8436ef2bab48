"""The training loss (:func:`loss_fn`; its terms in :mod:`e3j_models.train`'s docstring) and the
validation metrics (:func:`evaluate`, :func:`evaluate_structures`)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._batching import _batches
from ._checks import check_int, check_model_dtype
from ._training_data import _check_training_data, check_labelled_structures
from .batch import GraphBatch, Labels
from .potential import Potential


def loss_fn(
    potential: Potential,
    params,
    batch: GraphBatch,
    labels: Labels,
    weights: tuple[float, float, float] = (1.0, 1.0, 0.0),
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``(loss, parts)`` of one batch (see the module docstring); ``weights = (w_E, w_F, w_S)``."""
    return _loss_of(_loss_sums(potential, params, batch, labels, weights), weights)


def _loss_of(sums: Mapping[str, tuple], weights, xp=jnp) -> tuple[Any, dict[str, Any]]:
    """``(loss, parts)`` from :func:`_loss_sums`' terms (``xp=np``: of ``fit``'s float64 sums over an epoch)."""
    parts = {term: total / xp.maximum(count, 1) for term, (total, count) in sums.items()}
    loss = sum(
        w * parts[term] for w, term in zip(weights, ("energy", "forces", "stress"), strict=True) if term in parts
    )
    return loss, parts


def _loss_sums(potential: Potential, params, batch: GraphBatch, labels: Labels, weights) -> dict[str, tuple]:
    """Each term of :func:`loss_fn` as ``(sum of the weighted squared errors, count)``: structures
    for the energy and stress, force components (3 per atom) for the forces; the term is their
    quotient. Summed over batches, they give the loss of all of them as one batch, whatever the
    batches' membership (``fit``'s epoch losses)."""
    stress = weights[2] > 0
    out = potential(params, batch, forces=True, stress=stress)
    per = _per_structure_weights(labels)
    e_err = ((out["energy"] - labels.energy) / labels.num_atoms) ** 2
    sums = {"energy": (jnp.sum(jnp.where(per[:, 0] > 0, per[:, 0] * e_err, 0)), jnp.sum(per[:, 0] > 0))}
    per_atom = _atom_weights(per, batch)[:, None]
    f_err = jnp.where(per_atom > 0, per_atom * (out["forces"] - labels.forces) ** 2, 0)
    sums["forces"] = (jnp.sum(f_err), 3 * jnp.sum(per_atom > 0))
    if stress:
        # structures without a stress label add 0, and so does their gradient: the predicted stress
        # of a structure without a cell is NaN, which must not reach the square (where()'s gradient
        # still would)
        has = jnp.broadcast_to(labels.has_stress, labels.energy.shape) & (per[:, 2] > 0)
        predicted = jnp.where(has[:, None, None], out["stress"], labels.stress)
        per_structure = jnp.mean((predicted - labels.stress) ** 2, axis=(1, 2))
        sums["stress"] = (jnp.sum(jnp.where(has, per[:, 2] * per_structure, 0)), jnp.sum(has))
    return sums


def _per_structure_weights(labels: Labels) -> jax.Array:
    """``[G, 3]``: the labels' weights, 1 where they give none."""
    if labels.weights is None:
        return jnp.ones((labels.energy.shape[0], 3), labels.energy.dtype)
    return jnp.asarray(labels.weights)


def _atom_weights(per, batch: GraphBatch, xp=jnp):
    """``[N]``: each atom's force weight (its structure's, from ``per [G, 3]``), 0 on padding atoms;
    an atom counts in the force term and the force MAE where it is > 0."""
    return xp.where(xp.asarray(batch.node_mask), per[xp.asarray(batch.node_graph), 1], 0)


@functools.partial(jax.jit, static_argnums=0)
def _energy_and_forces(potential: Potential, params, batch):
    # one jitted function for every call: keyed by the potential (by equality: config, backend,
    # radial form) and the batch's shapes, so fit's validation compiles once, not at every eval_every step
    return potential(params, batch, forces=True)


def evaluate(potential: Potential, params, batches) -> dict[str, float]:
    """Mean absolute errors over ``batches``: ``energy_mae_per_atom`` (eV/atom), ``force_mae`` (eV/Å),
    over the structures (atoms) whose labels' weight is > 0; a metric with none is left out.

    Compiles once per potential and batch shape (repeated calls, as ``fit``'s validation makes,
    reuse it)."""
    e_err, f_err, n_graphs, n_comp = 0.0, 0.0, 0, 0
    for batch, labels in batches:
        out = _energy_and_forces(potential, params, batch)
        per = np.asarray(_per_structure_weights(labels))
        counted = per[:, 0] > 0
        de = np.abs(np.asarray(out["energy"] - labels.energy) / np.asarray(labels.num_atoms))
        e_err += float(np.sum(de[counted]))
        mask = _atom_weights(per, batch, np) > 0
        f_err += float(np.sum(np.abs(np.asarray(out["forces"] - labels.forces))[mask]))
        n_graphs += int(counted.sum())
        n_comp += 3 * int(mask.sum())
    metrics = {}  # a metric without labels is left out (an energy-only validation set has no force MAE)
    if n_graphs:
        metrics["energy_mae_per_atom"] = e_err / n_graphs
    if n_comp:
        metrics["force_mae"] = f_err / n_comp
    return metrics


def _selection_metric(metrics: Mapping[str, float]) -> str:
    """The validation metric that picks the best model: the force MAE, else the energy MAE."""
    return "force_mae" if "force_mae" in metrics else "energy_mae_per_atom"


def evaluate_structures(
    potential: Potential, params: Mapping[str, Any], structures: Sequence, *, batch_size: int = 4, dtype=None
) -> dict[str, float]:
    """Errors of ``potential`` with ``params`` on labelled ``structures`` (a test set, as
    :func:`~e3j_models.data.read_dataset` reads it): ``energy_mae_per_atom`` and
    ``energy_rmse_per_atom`` (eV/atom), ``force_mae`` and ``force_rmse`` (eV/Å, over components),
    ``stress_mae`` and ``stress_rmse`` (eV/Å³, over the components of the structures with a stress
    label on a fully periodic cell; absent without one), and ``structures`` / ``atoms`` counted.
    Energy and force metrics are over the structures that have those labels (absent where none
    has); per-structure weights do not enter.

    The structures are checked as :func:`fit` checks its data (``ValueError`` naming
    ``structures[k]``), stress labels included; energies are compared with the
    reference energies taken out on the host in float64, as :func:`fit` trains. ``dtype``: the
    computation's (default: that of ``params``).
    """
    from e3j.backends import current_backend_request

    from .calculator import _energy_forces_stress  # keyed by the backend request too; needs ASE, as the data does

    check_labelled_structures("structures", structures)
    if not structures:
        raise ValueError("structures is empty: give at least one structure")
    batch_size = check_int("batch_size", batch_size, 1)
    if not isinstance(potential, Potential):
        raise TypeError(f"potential must be an e3j_models.Potential, got {type(potential).__name__}")
    potential.check_params(params)
    floats = [a.dtype for a in jax.tree.leaves(params) if jnp.issubdtype(a.dtype, jnp.floating)]
    dtype = check_model_dtype(dtype if dtype is not None else (floats[0] if floats else None))
    config = potential.config
    graphs, _ = _check_training_data(
        config,
        structures,
        (0.0, 0.0, 0.0),
        dtype=dtype,
        every_element=False,
        parts=("structures", ""),
        reads_stress=True,
        config_weights=False,  # the metrics do not weigh: a weight is not checked either
    )
    bare = potential._bare()  # the reference energies are taken out of the labels on the host instead
    params = _floats_as(params, dtype)
    e_abs = e_sq = f_abs = f_sq = s_abs = s_sq = 0.0
    n_structures = n_atoms = n_energy = n_forces = n_stress = 0
    batches = _batches(
        structures,
        config,
        batch_size,
        None,
        dtype,
        config.atomic_energies,
        graphs=graphs,
        max_shapes=4,
        config_weights=False,
    )
    for batch, labels in batches:
        out = _energy_forces_stress(bare, current_backend_request(), params, batch)
        has = np.asarray(labels.weights) > 0  # which labels each structure has
        de = np.asarray(out["energy"] - labels.energy, np.float64) / np.asarray(labels.num_atoms, np.float64)
        de = de[has[:, 0]]
        real = np.asarray(batch.node_mask)
        labelled = real & has[np.asarray(batch.node_graph), 1]
        df = np.asarray(out["forces"] - labels.forces, np.float64)[labelled]
        ds = np.asarray(out["stress"] - labels.stress, np.float64)[np.asarray(labels.has_stress)]
        e_abs, e_sq = e_abs + np.abs(de).sum(), e_sq + np.square(de).sum()
        f_abs, f_sq = f_abs + np.abs(df).sum(), f_sq + np.square(df).sum()
        s_abs, s_sq = s_abs + np.abs(ds).sum(), s_sq + np.square(ds).sum()
        n_structures, n_atoms = n_structures + has.shape[0], n_atoms + int(real.sum())
        n_energy, n_forces, n_stress = n_energy + de.size, n_forces + df.size, n_stress + ds.size
    metrics = {"structures": n_structures, "atoms": n_atoms}
    if n_energy:
        metrics |= {"energy_mae_per_atom": e_abs / n_energy, "energy_rmse_per_atom": float(np.sqrt(e_sq / n_energy))}
    if n_forces:
        metrics |= {"force_mae": f_abs / n_forces, "force_rmse": float(np.sqrt(f_sq / n_forces))}
    if n_stress:
        metrics |= {"stress_mae": s_abs / n_stress, "stress_rmse": float(np.sqrt(s_sq / n_stress))}
    return {k: v if isinstance(v, int) else float(v) for k, v in metrics.items()}


def _floats_as(params, dtype):
    """``params`` with its floating leaves in ``dtype`` (a loaded model's numpy arrays included)."""
    return jax.tree.map(lambda a: jnp.asarray(a, dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, params)
