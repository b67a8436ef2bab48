"""Shared test configuration.

Four host devices (for the shard_map tests) must be requested before JAX initializes its backends;
float64 is switched on for the whole suite: tests that exercise float32 say so with explicit dtypes,
and the float64 oracles (e3nn-jax in float64) need it.
"""

import importlib
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import jax
import pytest
from installed import require_backend

jax.config.update("jax_enable_x64", True)


def pytest_sessionstart(session):
    """Every module named in ``E3J_TESTS_REQUIRE`` (comma-separated; the nox sessions name what they
    install) must import: tests that ``pytest.importorskip`` one, for environments without it, would
    otherwise skip where an install broke."""
    missing = []
    for name in filter(None, os.environ.get("E3J_TESTS_REQUIRE", "").split(",")):
        try:
            importlib.import_module(name.strip())
        except Exception as err:  # any import failure (an extension built for another Python too)
            missing.append(f"{name.strip()} ({type(err).__name__}: {err})")
    if missing:
        raise pytest.UsageError(f"E3J_TESTS_REQUIRE names modules that do not import: {', '.join(missing)}")


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
