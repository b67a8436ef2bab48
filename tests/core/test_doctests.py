"""Run the docstring examples of every e3j-core module as tests."""

import doctest
import importlib
import pkgutil

import pytest

import e3j_core

MODULES = sorted(m.name for m in pkgutil.iter_modules(e3j_core.__path__, "e3j_core."))


@pytest.mark.parametrize("name", ["e3j_core", *MODULES])
def test_doctests(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"
