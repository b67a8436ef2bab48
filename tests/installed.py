"""Skips for tests of a backend that may not be installed (a plugin, a kernel package)."""

import pytest


def require_backend(name: str) -> None:
    """Skip the calling test unless ``e3j.available_backends()`` lists backend ``name``. The ``tests``
    nox session installs every backend that runs on a CPU, so in CI this never skips."""
    import e3j

    if name not in {b.name for b in e3j.available_backends()}:
        pytest.skip(f"backend {name} is not installed")
