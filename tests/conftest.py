"""Shared test configuration.

Four host devices (for the shard_map tests) must be requested before JAX initializes its backends;
float64 is switched on for the whole suite: tests that exercise float32 say so with explicit dtypes,
and the float64 oracles (e3nn-jax in float64) need it.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import jax
import pytest
from installed import require_backend

jax.config.update("jax_enable_x64", True)


@pytest.fixture
def fused_on_cpu_only(monkeypatch):
    """What an op given ``e3j.FactoredWeights`` asks of backend selection, answered as for an install
    without plugins: the reference (factored kernels) on the CPU, a backend without factored kernels
    on the other platforms (the ``test`` plugin standing in for e3j's GPU and TPU backends)."""
    import e3j
    import e3j._factored_route as route

    require_backend("test")

    def selected(req, requested):
        return e3j.backends.get_backend("reference" if req.platform == "cpu" else "test")

    monkeypatch.setattr(route, "selected", selected)
