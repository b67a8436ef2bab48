"""Development sessions. `python3 -m nox -s tests` is the one command CI runs.

Every session makes its own virtual environment with a Python >= 3.12 (JAX >= 0.11 needs it) and
installs the packages from this checkout, never from an index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES = [
    "packages/e3j-core",
    "packages/e3j-ops",
    "packages/e3j-pallas-gpu",
    "packages/e3j-pallas-tpu",
    "packages/e3j-cuda",
]
JAX = "jax==0.11.2"  # the primary JAX (the GPU machine image's)
TEST_REQUIREMENTS = ["pytest>=8", "hypothesis>=6.100", "e3nn-jax==0.21.0", "matplotlib>=3.8", JAX]
# the other ends of the range the kernel packages declare (jax>=0.11.1,<0.13): `nox -s tests_jax`
JAX_RANGE = ["0.11.1", "0.12.0.1"]

nox.options.sessions = ["tests"]
nox.options.error_on_missing_interpreters = True


def _version_of(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
        return int(out[0]), int(out[1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _find_python() -> str:
    """An interpreter >= 3.12: $E3J_PYTHON, this one, python3.1x on PATH, or a pyenv version."""
    # 3.12 first: it is the GPU machine image's Python, so CPU runs match device runs
    candidates = [os.environ.get("E3J_PYTHON", "")]
    candidates.append(sys.executable)
    candidates += [shutil.which(f"python3.{minor}") or "" for minor in (12, 13, 14)]
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip()
        versions = sorted(
            Path(root, "versions").glob("3.1[2-9]*"),
            key=lambda p: [int(x) if x.isdigit() else 0 for x in p.name.split(".")],
        )
        candidates += [str(v / "bin" / "python3") for v in versions]
    for python in candidates:
        if python and (version := _version_of(python)) and version >= (3, 12):
            return python
    raise RuntimeError("no Python >= 3.12 found: install one or point E3J_PYTHON at it")


PYTHON = _find_python()


def _install_packages(session: nox.Session) -> None:
    session.install(*(str(ROOT / p) for p in PACKAGES))


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite on CPU (the README's test command)."""
    session.install(*TEST_REQUIREMENTS)
    _install_packages(session)
    # a test-only backend plugin (reference kernels under another name; see tests/ops/test_backends.py)
    session.install(str(ROOT / "tests/plugins/e3j-test-backend"))
    session.run("python", "-m", "pytest", *(session.posargs or ["tests", "-m", "not gpu and not slow"]))


@nox.session(python=PYTHON)
def slow(session: nox.Session) -> None:
    """The heavier CPU checks the tests session leaves out (marker ``slow``: a few minutes)."""
    session.install(*TEST_REQUIREMENTS)
    _install_packages(session)
    session.run("python", "-m", "pytest", *(session.posargs or ["tests", "-m", "slow and not gpu"]))


@nox.session(python=PYTHON)
@nox.parametrize("jax", JAX_RANGE)
def tests_jax(session: nox.Session, jax: str) -> None:
    """The test suite on the oldest and newest JAX of the supported range (not run by CI: ~15 min each).

    e3j-cuda builds in isolation against its pinned oldest jaxlib's FFI headers, as a release wheel
    does, and so runs here on a newer jaxlib too.
    """
    session.install(*(r for r in TEST_REQUIREMENTS if r != JAX), f"jax=={jax}", f"jaxlib=={jax}")
    _install_packages(session)
    session.install(str(ROOT / "tests/plugins/e3j-test-backend"))
    session.run("python", "-c", "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__)")
    session.run("python", "-m", "pytest", *(session.posargs or ["tests", "-m", "not gpu"]))


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The README's main command: backend info, then a quick benchmark against e3nn-jax here."""
    session.install(JAX, "e3nn-jax==0.21.0")
    _install_packages(session)
    session.run("python", "-m", "e3j", "info")
    session.run(
        "python", "-m", "e3j", "bench", "--lmax", "2", "3", "--channels", "32", "--sizes", "2048",
        "--degree", "16", "--runs", "10", *session.posargs,
    )  # fmt: skip


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """The reference backend against e3nn-jax at the paper's CPU sizes (slow: ~15 minutes on 2 cores)."""
    session.install(JAX, "e3nn-jax==0.21.0")
    _install_packages(session)
    session.run("python", "benchmarks/reference_vs_e3nn.py", *(session.posargs or ["--runs", "10"]))


@nox.session(python=PYTHON)
def gpu_compile(session: nox.Session) -> None:
    """Registers, spills and compile time of the Pallas GPU kernels for sm_90a, without a GPU (~5 min).

    Triton 3.6.0 (the GPU machine image's) compiles the Triton IR that Pallas emits; ptxas reports.
    """
    session.install(JAX, "triton==3.6.0")
    _install_packages(session)
    out = ROOT / "benchmarks" / "results" / "sm90a-pallas-gpu-resources.json"
    session.run("python", "benchmarks/triton_resources.py", *(session.posargs or ["--out", str(out)]))


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """Build an sdist and a wheel of every package into dist/."""
    session.install("build>=1.2")
    for p in PACKAGES:
        session.run("python", "-m", "build", "--outdir", str(ROOT / "dist"), str(ROOT / p))
