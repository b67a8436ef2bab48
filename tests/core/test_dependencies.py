"""e3j_core.dependencies: a distribution's declared range for a dependency, read from its metadata, and its check."""

import importlib.metadata
import os
import subprocess
import sys

import pytest
from packaging.specifiers import SpecifierSet

from e3j_core.dependencies import (
    IncompatibleDependency,
    _extra_requirements,
    check_dependency,
    declared_range,
    install_hint,
)


def _fake_distribution(site, name, version, requires=()):
    """A minimal installed distribution (``.dist-info`` with METADATA) under ``site``."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    declared_range.cache_clear()
    _extra_requirements.cache_clear()
    yield tmp_path
    declared_range.cache_clear()
    _extra_requirements.cache_clear()


def test_install_hint_names_the_extras_requirements(site):
    """The requirements one by one, never ``e3j[...]`` (pip may resolve ``e3j`` to an unrelated
    project on PyPI): only the extra's own lines, each with its range and the dependency's extras."""
    _fake_distribution(
        site,
        "e3j-fake-ops",
        "0.1.0",
        [
            "numpy>=1.26",
            'e3nn-jax<0.22,>=0.21; extra == "e3nn"',
            'jax[cuda13]>=0.11.1; extra == "cuda"',
            'e3j-fake-kernels<0.2,>=0.1; extra == "cuda"',
            'ase>=3.25; extra == "train" and python_version >= "3"',
        ],
    )
    assert install_hint("e3j-fake-ops", "e3nn", "e3nn-jax") == "pip install 'e3nn-jax<0.22,>=0.21'"
    assert install_hint("e3j-fake-ops", "cuda", "x") == "pip install 'jax[cuda13]>=0.11.1' 'e3j-fake-kernels<0.2,>=0.1'"
    assert install_hint("e3j-fake-ops", "train", "ase") == "pip install 'ase>=3.25'"
    # an unknown extra, or no installed metadata (a source tree): the fallback
    assert install_hint("e3j-fake-ops", "tpu", "jax[tpu]") == "pip install jax[tpu]"
    assert install_hint("e3j-not-installed", "e3nn", "e3nn-jax") == "pip install e3nn-jax"


def test_install_hints_of_this_projects_extras():
    """The hints e3j and e3j-models give read their pyproject.toml's extras (installed metadata)."""
    assert install_hint("e3j", "e3nn", "?") == "pip install 'e3nn-jax<0.22,>=0.21'"
    assert install_hint("e3j", "flax", "?") == "pip install 'flax>=0.12.7'"
    assert install_hint("e3j-models", "e3nn", "?") == "pip install 'e3nn-jax<0.22,>=0.21'"
    assert install_hint("e3j-models", "ase", "?") == "pip install 'ase>=3.23'"


def test_declared_range_is_the_unconditional_requirement(site):
    _fake_distribution(
        site,
        "e3j-fake-kernels",
        "0.3.0",
        ["e3j-core>=0.1,<0.2", "jax>=0.11.1,<0.13", "JAX!=0.11.3", 'jax[cuda13]>=0.12; extra == "cuda"'],
    )
    # both unconditional lines, spelled either way; the extra's line does not apply to a plain install
    assert declared_range("e3j-fake-kernels", "jax") == SpecifierSet(">=0.11.1,<0.13,!=0.11.3")
    assert declared_range("e3j-fake-kernels", "e3j_core") == SpecifierSet(">=0.1,<0.2")
    assert declared_range("e3j-fake-kernels", "numpy") is None
    assert declared_range("e3j-not-installed", "jax") is None


def test_installed_jax_inside_the_range_passes(site):
    jax_version = importlib.metadata.version("jax")
    _fake_distribution(site, "e3j-fake-kernels", "0.3.0", [f"jax>={jax_version},<{jax_version}.1"])
    check_dependency("e3j-fake-kernels", "jax")
    check_dependency("e3j-not-installed", "jax")  # a source tree declares nothing: nothing to check


def test_installed_jax_outside_the_range_is_refused_with_a_clear_message(site):
    jax_version = importlib.metadata.version("jax")
    _fake_distribution(site, "e3j-fake-kernels", "0.3.0", ["jax>=0.4,<0.5"])
    with pytest.raises(IncompatibleDependency) as err:
        check_dependency("e3j-fake-kernels", "jax")
    assert isinstance(err.value, ImportError)
    message = str(err.value)
    for part in ("e3j-fake-kernels 0.3.0", "jax<0.5,>=0.4", f"jax {jax_version} is installed"):
        assert part in message, message


def test_missing_dependency_is_refused(site):
    _fake_distribution(site, "e3j-fake-kernels", "0.3.0", ["e3j-no-such-dist>=1"])
    with pytest.raises(IncompatibleDependency, match=r"needs e3j-no-such-dist>=1, but e3j-no-such-dist is not"):
        check_dependency("e3j-fake-kernels", "e3j-no-such-dist")


@pytest.mark.parametrize("dist", ["e3j-cuda", "e3j-pallas-gpu", "e3j-pallas-tpu"])
def test_kernel_package_refuses_to_import_under_a_jax_outside_its_range(dist, tmp_path):
    """Import the kernel package in a subprocess that sees a fake newer jax first on its path."""
    spec = declared_range(dist, "jax")
    if spec is None:
        pytest.fail(f"{dist} is not installed with metadata (run the tests session, which installs it)")
    too_new = "99.0.0"
    assert not spec.contains(too_new)
    _fake_distribution(tmp_path, "jax", too_new)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    module = dist.replace("-", "_")
    result = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "IncompatibleDependency" in result.stderr, result.stderr
    assert f"but jax {too_new} is installed" in result.stderr, result.stderr


def test_e3j_info_names_the_kernel_packages_refused_for_their_jax_range(tmp_path):
    """What a user sees: e3j lists each kernel backend under the ones that failed to load, saying why."""
    _fake_distribution(tmp_path, "jax", "99.0.0")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "e3j", "info"], env=env, capture_output=True, text=True)
    failed = result.stdout.partition("Backends that failed to load:")[2]
    for dist in ("e3j-cuda", "e3j-pallas-gpu", "e3j-pallas-tpu"):
        spec = declared_range(dist, "jax")
        assert f"{dist} {importlib.metadata.version(dist)} is built and tested for jax{spec}" in failed, result.stdout
    assert "but jax 99.0.0 is installed" in failed
