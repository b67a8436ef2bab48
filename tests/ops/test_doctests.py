"""Run the docstring examples of every e3j module as tests."""

import doctest
import importlib
import pkgutil

import pytest

import e3j

MODULES = sorted(m.name for m in pkgutil.walk_packages(e3j.__path__, "e3j.") if m.name not in ("e3j.__main__",))


@pytest.mark.parametrize("name", ["e3j", *MODULES])
def test_doctests(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"
