"""What ``fit``'s history holds, read back: the per-epoch loss curve, a plot and a JSON file."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ._checks import check_int
from ._optional import require


def epoch_losses(history: dict[str, Any], steps_per_epoch: int | None = None) -> np.ndarray:
    """The smoothed loss curve: the training loss of each complete epoch, ``[num_epochs]``.

    An epoch visits every training structure once, so its loss is free of the spread between easy
    and hard batches that makes the per-step loss (and any moving average shorter than an epoch)
    jump. :func:`fit` records it (``history["epoch_loss"]``) as the loss of the epoch's batches
    taken as one batch (each term's squared errors summed over the epoch, divided by its count of
    structures or force components), which the batches' membership, drawn anew every epoch, does
    not change; a mean of the per-step losses weighs each structure by its batch's size. Without
    that record (histories of earlier versions), or with ``steps_per_epoch`` given, it is the mean
    of the per-step losses of each epoch (``steps_per_epoch`` defaulting to the one :func:`fit`
    records).

    >>> epoch_losses({"train_loss": [4.0, 2.0, 3.0, 1.0, 9.0], "steps_per_epoch": 2}).tolist()
    [3.0, 2.0]
    """
    if steps_per_epoch is None and history.get("epoch_loss") is not None:
        return np.asarray(history["epoch_loss"], np.float64)
    k = history.get("steps_per_epoch") if steps_per_epoch is None else steps_per_epoch
    k = check_int("steps_per_epoch", k, 1, " (history has none recorded?)")
    loss = np.asarray(history["train_loss"], np.float64)
    return loss[: len(loss) // k * k].reshape(-1, k).mean(axis=1)


def plot_history(history: dict[str, list], path: str | os.PathLike) -> None:
    """Loss curve (raw and 20-step moving average, log scale) and validation MAEs to a PNG."""
    require("matplotlib", "plot_history")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    loss = np.asarray(history["train_loss"])
    axes[0].semilogy(history["step"], loss, alpha=0.3, label="train loss")
    w = min(20, len(loss))
    axes[0].semilogy(history["step"][w - 1 :], np.convolve(loss, np.ones(w) / w, "valid"), label=f"{w}-step mean")
    if history.get("steps_per_epoch"):
        k = history["steps_per_epoch"]
        epochs = epoch_losses(history)
        axes[0].semilogy(k * np.arange(1, len(epochs) + 1) - 1, epochs, "o-", ms=3, label="epoch loss")
    axes[0].set_xlabel("step")
    axes[0].legend()
    if history["valid"]:
        steps = history["eval_step"]
        forces = [v.get("force_mae", np.nan) for v in history["valid"]]  # absent without force labels
        axes[1].semilogy(steps, forces, "o-", label="force MAE (eV/Å)")
        axes[1].semilogy(
            steps, [v.get("energy_mae_per_atom", np.nan) for v in history["valid"]], "s-", label="energy MAE (eV/atom)"
        )
        axes[1].set_xlabel("step")
        axes[1].legend()
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=100)
    plt.close(fig)


def write_history(history: dict[str, list], path: str | os.PathLike) -> None:
    """``history`` (as :func:`fit` returns it) to a JSON file."""
    with open(os.fspath(path), "w") as f:
        json.dump(history, f)
