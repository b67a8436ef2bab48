"""The pure-Python wheels as users get them: built from this checkout, their metadata checked
(extras, JAX ranges, bounds), installed into a fresh virtual environment, then ``python -m e3j info``
and a CPU tensor product run there (tests/integration/wheel_smoke.py, e3nn-jax as the oracle).

Offline and cheap: pip builds with the test environment's hatchling and installs with ``--no-index``;
the third-party dependencies (jax, e3nn-jax and what they need) are linked from the test environment
into a folder the fresh environment puts on its path. The compiled, auditwheel-repaired e3j-cuda
wheel and the ``e3j[cuda]`` / ``e3j[tpu]`` installs (which download JAX's accelerator plugins) are
``nox -s wheelhouse``'s.
"""

import email.parser
import importlib.metadata
import os
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PURE = {
    "e3j-core": "packages/e3j-core",
    "e3j": "packages/e3j-ops",
    "e3j-pallas-gpu": "packages/e3j-pallas-gpu",
    "e3j-pallas-tpu": "packages/e3j-pallas-tpu",
}
# docs/install.md: what each extra of e3j brings (names with the extras they ask for)
EXTRAS = {
    "cuda": {("e3j-cuda", ()), ("e3j-pallas-gpu", ()), ("jax", ("cuda13",))},
    "gpu": {("e3j-pallas-gpu", ()), ("jax", ("cuda13",))},
    "tpu": {("e3j-pallas-tpu", ()), ("jax", ("tpu",))},
}
# what `python -m e3j info` lists once e3j, e3j-pallas-gpu and e3j-pallas-tpu are installed
PURE_BACKENDS = (
    "reference,pallas_gpu,pallas_gpu_interpret,pallas_mosaic,pallas_mosaic_interpret,pallas_tpu,pallas_tpu_interpret"
)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*cmd, "-w", str(out), *(str(ROOT / p) for p in PURE.values())], check=True)
    built = {}
    for wheel in out.glob("*.whl"):
        built[canonicalize_name(_metadata(wheel)["Name"])] = wheel
    assert set(built) == set(PURE), f"built {sorted(built)}, expected {sorted(PURE)}"
    return built


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(z.read(name).decode())


def _unconditional(req: Requirement) -> bool:
    """Whether ``req`` applies to a plain install on this platform (no extra)."""
    return req.marker is None or req.marker.evaluate({"extra": ""})


def _requires(metadata, extra: str = "") -> list[Requirement]:
    """The requirements that apply to an install with ``extra`` (``""``: a plain install) and not without it."""
    reqs = [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]
    if not extra:
        return [r for r in reqs if _unconditional(r)]
    return [r for r in reqs if r.marker is not None and r.marker.evaluate({"extra": extra})]


def _bounded(req: Requirement) -> tuple[Version, Version]:
    """The ``>=`` floor and ``<`` ceiling of ``req``; fails unless it has both."""
    floors = [Version(s.version) for s in req.specifier if s.operator == ">="]
    ceilings = [Version(s.version) for s in req.specifier if s.operator == "<"]
    assert floors and ceilings, f"{req} needs a >= floor and a < ceiling"
    return max(floors), min(ceilings)


def test_e3j_extras_bring_the_kernel_packages_and_jax_plugins(wheels):
    meta = _metadata(wheels["e3j"])
    assert set(EXTRAS) <= set(meta.get_all("Provides-Extra"))
    for extra, expected in EXTRAS.items():
        reqs = _requires(meta, extra)
        assert {(canonicalize_name(r.name), tuple(sorted(r.extras))) for r in reqs} == expected, extra
        for r in reqs:
            if r.name.startswith("e3j"):
                _bounded(r)
    plain = {canonicalize_name(r.name) for r in _requires(meta)}
    assert {"e3j-core", "jax"} <= plain and not any(n.startswith("e3j-") and n != "e3j-core" for n in plain), plain


@pytest.mark.parametrize("dist", ["e3j-pallas-gpu", "e3j-pallas-tpu"])
def test_kernel_wheels_declare_a_bounded_jax_range(wheels, dist):
    reqs = {canonicalize_name(r.name): r for r in _requires(_metadata(wheels[dist]))}
    assert set(reqs) >= {"jax", "e3j-core"}
    _bounded(reqs["jax"])
    _bounded(reqs["e3j-core"])


def test_cuda_wheel_is_compiled_against_its_oldest_jax():
    """e3j-cuda's build pins jax and jaxlib to the floor of its declared range (its FFI headers are the floor)."""
    project = tomllib.loads((ROOT / "packages/e3j-cuda/pyproject.toml").read_text())
    reqs = {canonicalize_name(r.name): r for r in map(Requirement, project["project"]["dependencies"])}
    floor, _ = _bounded(reqs["jax"])
    _bounded(reqs["e3j-core"])
    build = {canonicalize_name(r.name): r for r in map(Requirement, project["build-system"]["requires"])}
    for name in ("jax", "jaxlib"):
        assert str(build[name].specifier) == f"=={floor}", f"build-system {build[name]}, range floor {floor}"


def test_cuda_modules_use_the_stable_abi():
    """e3j-cuda's compiled modules are built for Python's stable ABI (nanobind's STABLE_ABI, wheel tag
    cp312-abi3): one wheel installs on CPython 3.12 and every newer one (a cp312-cp312 wheel
    was refused by pip on 3.13)."""
    pytest.importorskip("e3j_cuda")
    import importlib.util

    for name in ("_host", "_simt", "_cuda"):
        spec = importlib.util.find_spec(f"e3j_cuda.{name}")
        if name == "_cuda" and spec is None:  # built only where nvcc was found
            continue
        assert spec is not None and spec.origin.endswith(".abi3.so"), (name, spec and spec.origin)
    project = tomllib.loads((ROOT / "packages/e3j-cuda/pyproject.toml").read_text())
    assert project["tool"]["scikit-build"]["wheel"]["py-api"] == "cp312"


def _dependency_closure(roots: list[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``roots`` need (plain installs, this platform), e3j's excluded."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    stack = list(roots)
    while stack:
        name = canonicalize_name(stack.pop())
        if name in seen or name.startswith("e3j"):
            continue
        seen[name] = dist = importlib.metadata.distribution(name)
        stack += [r.name for r in map(Requirement, dist.requires or []) if _unconditional(r)]
    return list(seen.values())


def _link_dependencies(roots: list[str], folder: Path) -> None:
    """Symlink the top-level files of ``roots``' dependency closure into ``folder`` (no copy, no index)."""
    folder.mkdir()
    for dist in _dependency_closure(roots):
        site = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            if (site / top).exists() and not (folder / top).exists():
                (folder / top).symlink_to(site / top)


def test_wheels_install_and_run_in_a_fresh_venv(wheels, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(purelib) != Path(sysconfig.get_paths()["purelib"])
    _link_dependencies(["jax", "e3nn-jax", "packaging"], tmp_path / "deps")
    Path(purelib, "e3j_test_dependencies.pth").write_text(str(tmp_path / "deps") + "\n")

    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index"]
    subprocess.run([*pip, "--find-links", str(wheels["e3j"].parent), *PURE], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        [python, str(ROOT / "tests/integration/wheel_smoke.py"), "--backends", PURE_BACKENDS, "--oracle", "e3nn"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wheel_smoke: ok" in result.stdout
    for name in ("pallas_gpu_interpret", "pallas_mosaic_interpret", "pallas_tpu_interpret", "e3nn-jax"):
        assert name in result.stdout.splitlines()[-1], result.stdout
