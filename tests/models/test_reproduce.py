"""From-scratch reproduction of the committed NequIP checkpoint (marker ``models_slow``: 1-11 min on 2 cores).

Generates the EMT Cu–Ni data (``data --num 160 --seed 0``), trains the NequIP preset with the
documented command and checks the two claims of docs/e2e.md: the validation force MAE is within 2× of
the committed checkpoint's, and the smoothed training loss (each epoch's: ``epoch_losses``) decreases
monotonically. Measured here on 2026-12-06 (2 cores, quiet): 53 s of training through the CLI,
validation force MAE 0.0267 eV/Å (committed 0.0234), 25 epoch losses all decreasing.

    nox -s models_slow -- tests/models/test_reproduce.py -m models_slow
"""

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ase")
pytest.importorskip("optax")

from e3j_models.__main__ import main
from e3j_models.train import epoch_losses

CHECKPOINT = Path(__file__).resolve().parents[2] / "packages" / "e3j-models" / "checkpoints" / "cuni_nequip"
#: the recipe of docs/e2e.md ("Reproducing from scratch"); lr 5e-3 rather than the checkpoint's 1e-2,
#: whose epoch-mean loss jumps once
RECIPE = (
    "--preset nequip --layers 2 --l-max 1 --steps 900 --batch-size 4 --lr 5e-3 --eval-every 100 "
    "--cutoff 4.0 --radial-hidden 16 --channels 8"
).split()


@pytest.mark.models_slow
def test_training_from_scratch_reproduces_the_committed_checkpoint(tmp_path):
    data = tmp_path / "cuni.extxyz"
    main(["data", "--num", "160", "--seed", "0", "--out", str(data)])
    main(["train", "--data", str(data), *RECIPE, "--out", str(tmp_path / "run")])
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    committed = json.loads((CHECKPOINT / "metrics.json").read_text())["checkpoint_validation"]["force_mae"]
    reached = metrics["checkpoint_validation"]["force_mae"]
    assert reached <= 2 * committed, f"validation force MAE {reached:.4f} eV/Å > 2 × committed {committed:.4f}"
    epochs = epoch_losses(json.loads((tmp_path / "run" / "history.json").read_text()))
    assert len(epochs) >= 20
    assert np.all(np.diff(epochs) < 0), f"epoch-mean training loss not monotone: {np.round(epochs, 5)}"
