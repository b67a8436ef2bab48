"""The README's benchmark tables are rendered from the committed results files."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tables():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "benchmarks" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_tables_match_results_files():
    tables = _tables()
    readme = (ROOT / "README.md").read_text()
    assert tables.blocks(readme), "README has no generated benchmark block"
    assert tables.updated(readme) == readme, "README is stale: run python benchmarks/readme_tables.py --write"


def test_readme_quickstart_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m nox -s tests" in readme and "python3 -m nox -s tests" in ci
