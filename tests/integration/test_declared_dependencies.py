"""What each package imports is what its pyproject.toml declares, and importing a package loads
none of its optional dependencies and starts no JAX backend (no work or device probing at import)."""

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())
# the modules of a package that may import an extra's distribution at module level (the extra's
# error names it when it is missing): {package folder: {distribution: module folder}}
OPTIONAL_MODULES = {"e3j-ops": {"e3nn-jax": "e3j/interop", "flax": "e3j/flax"}}
# importing these loads none of them: e3j-models needs flax, nothing needs the rest to import
OPTIONAL = ("e3nn_jax", "optax", "ase", "matplotlib", "tqdm", "flax")


def _module_level_imports(path: Path) -> set[str]:
    """The top-level names imported by ``path``'s module body (not in functions, nor under ``try``)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__"}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_module_level_imports_are_declared(package):
    """A distribution a module imports is a dependency (an extra's, for the modules of that extra):
    e3j-models imported e3j-core and jax, and the kernel packages numpy, through others' dependencies."""
    project = tomllib.loads((package / "pyproject.toml").read_text())["project"]
    own = canonicalize_name(project["name"])
    declared = {canonicalize_name(Requirement(r).name) for r in project.get("dependencies", [])}
    extras = {
        canonicalize_name(Requirement(r).name)
        for reqs in project.get("optional-dependencies", {}).values()
        for r in reqs
    }
    optional = OPTIONAL_MODULES.get(package.name, {})
    undeclared = []
    sources = sorted((package / "src").rglob("*.py"))
    assert sources, package
    for path in sources:
        module = path.relative_to(package / "src").as_posix()
        for name in _module_level_imports(path):
            dist = canonicalize_name(name.replace("_", "-"))
            if dist == own or dist in declared:
                continue
            if dist in extras and module.startswith(optional.get(dist, "\0")):
                continue
            undeclared.append(f"{module}: {name}")
    assert not undeclared, f"{package.name} imports what it does not declare: {undeclared}"


def test_import_loads_no_optional_dependency_and_starts_no_backend():
    code = (
        "import importlib, sys\n"
        "for name in ('e3j_core', 'e3j', 'e3j_pallas_gpu', 'e3j_pallas_tpu', 'e3j_cuda', 'e3j_models'):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as e:\n"
        "        if e.name != name: raise\n"
        "from jax._src import xla_bridge\n"
        f"optional = {OPTIONAL!r}\n"
        "loaded = [m for m in optional if m in sys.modules and not (m == 'flax' and 'e3j_models' in sys.modules)]\n"
        "print('loaded', loaded, 'backends', sorted(xla_bridge._backends))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "loaded [] backends []", result.stdout
