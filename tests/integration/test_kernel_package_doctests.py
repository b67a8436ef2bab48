"""Run the docstring examples of every kernel package module as tests."""

import pytest
from doctest_modules import modules_with_examples, run_examples

PACKAGES = ["e3j_pallas_gpu", "e3j_pallas_tpu", "e3j_cuda"]


@pytest.mark.parametrize("name", [n for pkg in PACKAGES for n in modules_with_examples(pkg, recursive=False)])
def test_doctests(name):
    run_examples(name)
