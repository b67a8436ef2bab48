"""benchmarks/npt_check.py's statistics on a synthetic NPT log with known answers."""

import math
import runpy
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = runpy.run_path(str(ROOT / "benchmarks/npt_check.py"))


def _md(seed, n=4000, volume=1000.0, bulk_GPa=100.0, temperature=300.0, pressure=0.05):
    rng = np.random.default_rng(seed)
    kt_v = SCRIPT["KB_EV_PER_K"] * temperature * volume
    sigma = math.sqrt(kt_v / (bulk_GPa / SCRIPT["EV_PER_A3_IN_GPA"]))
    t = np.arange(n) * 0.04
    log = {
        "time_ps": t,
        "volume": volume + sigma * rng.normal(size=n),
        "pressure_GPa": pressure + 0.5 * rng.normal(size=n),
        "temperature": temperature + 20 * rng.normal(size=n),
    }
    return {"command": "synthetic", "timestep_fs": 2.0, "log": {k: v.tolist() for k, v in log.items()}}, sigma


def test_recovers_the_known_fluctuation_and_pressure():
    (md1, sigma), (md2, _) = _md(0), _md(1)
    blocks = [SCRIPT["production_blocks"](md, skip_ps=20.0, blocks=4) for md in (md1, md2)]
    out = SCRIPT["analyse"](blocks, 0.04, 0.0, bulk_GPa=100.0)
    assert out["blocks"] == 8 and out["block_ps"] == pytest.approx((4000 - 500) // 4 * 0.04, abs=0.05)
    assert out["sigma_V_expected_A3"] == pytest.approx(sigma, rel=1e-3)  # the same T and <V> up to noise
    assert abs(out["sigma_V_A3"] - sigma) < 0.05 * sigma
    assert out["bulk_modulus_from_fluctuation_GPa"] == pytest.approx(100.0, rel=0.1)
    assert abs(out["pressure_mean_GPa"] - 0.05) < 4 * out["pressure_block_sem_GPa"] < 0.05


def test_refuses_a_run_without_pressure():
    md, _ = _md(0)
    del md["log"]["pressure_GPa"]
    with pytest.raises(ValueError, match="not an NPT run"):
        SCRIPT["production_blocks"](md, skip_ps=0.0, blocks=4)
