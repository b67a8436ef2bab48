"""Run the docstring examples of every kernel package module as tests."""

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ["e3j_pallas_gpu", "e3j_pallas_tpu", "e3j_cuda"]
MODULES = [
    name
    for pkg in PACKAGES
    for name in [pkg, *(m.name for m in pkgutil.iter_modules(importlib.import_module(pkg).__path__, pkg + "."))]
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"


def test_vmem_examples_ran():
    result = doctest.testmod(importlib.import_module("e3j_pallas_tpu.vmem"))
    assert result.attempted >= 3
