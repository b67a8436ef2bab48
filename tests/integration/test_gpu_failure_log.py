"""tests/gpu/conftest.py's failure log: each failing test's report lands in ``$E3J_FAILURES_FILE`` once.

benchmarks/device.sh runs tests/gpu with pytest-xdist when the image has it; the log must then hold
each failure once (the controller sees every worker's report again). The conftest is copied verbatim
into a throwaway project beside one passing and one failing test, and pytest runs it in a subprocess.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = """
def test_passes():
    assert 1 + 1 == 2


def test_fails():
    assert "marker-of-the-failure" == "something else"
"""

XDIST = importlib.util.find_spec("xdist") is not None


@pytest.mark.parametrize(
    "workers",
    [
        None,
        pytest.param(2, marks=pytest.mark.skipif(not XDIST, reason="pytest-xdist is not installed")),
    ],
)
def test_failures_file_names_each_failing_test_once(tmp_path, workers):
    shutil.copy(ROOT / "tests" / "gpu" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # this project, not the repository's pyproject.toml
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    log = tmp_path / "failures.txt"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_sample.py"]
    if workers:
        cmd += ["-n", str(workers)]
    run = subprocess.run(
        cmd,
        cwd=tmp_path,
        env={**os.environ, "E3J_FAILURES_FILE": str(log)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr  # 1: some test failed
    assert "1 failed, 1 passed" in run.stdout
    text = log.read_text()
    headers = [line for line in text.splitlines() if line.startswith("=== ")]
    assert headers == ["=== test_sample.py::test_fails (call)"], text
    assert text.count("marker-of-the-failure") >= 1 and "test_passes" not in text
