"""The nox sessions' test environment: what they install must import, or the run stops (tests that
``pytest.importorskip`` a module, for environments without it, would otherwise skip)."""

import ast
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _noxfile_constant(name: str):
    """The value of ``noxfile.py``'s module-level ``name`` (read, not imported: nox need not be
    installed here); names inside a literal (``JAX``) come back as ``None``."""
    for node in ast.parse((ROOT / "noxfile.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            if isinstance(node.value, ast.List):
                return [e.value if isinstance(e, ast.Constant) else None for e in node.value.elts]
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py has no {name}")


def test_required_modules_cover_the_test_requirements():
    """Each distribution the sessions install for the tests is named in E3J_TESTS_REQUIRE by one of
    its modules (pytest runs this, and conftest.py imports jax)."""
    modules = set(_noxfile_constant("TEST_MODULES")["E3J_TESTS_REQUIRE"].split(","))
    providers = importlib.metadata.packages_distributions()
    for requirement in filter(None, _noxfile_constant("TEST_REQUIREMENTS")):
        dist = canonicalize_name(Requirement(requirement).name)
        if dist == "pytest":
            continue
        provided = {m for m, dists in providers.items() if dist in {canonicalize_name(d) for d in dists}}
        assert provided & modules, f"{requirement}: none of its modules {sorted(provided)} is in E3J_TESTS_REQUIRE"


def test_a_required_module_that_does_not_import_stops_the_run():
    env = {**os.environ, "E3J_TESTS_REQUIRE": "ase,e3j_no_such_module"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co", "-q", "tests/core/test_irreps.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 4, run.stdout + run.stderr  # pytest's usage error
    assert "e3j_no_such_module (ModuleNotFoundError" in run.stdout + run.stderr
    assert "ase (" not in run.stdout + run.stderr
    env["E3J_TESTS_REQUIRE"] = "ase"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co", "-q", "tests/core/test_irreps.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
