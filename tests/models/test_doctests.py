"""Run the docstring examples of every e3j_models module as tests."""

import doctest
import importlib
import pkgutil

import pytest

import e3j_models

MODULES = sorted(m.name for m in pkgutil.walk_packages(e3j_models.__path__, "e3j_models."))


@pytest.mark.parametrize("name", ["e3j_models", *MODULES])
def test_doctests(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"
    if name != "e3j_models.models":  # a package of modules: each has its own examples
        assert result.attempted > 0 or not module.__doc__ or ">>>" not in (module.__doc__ or "")
