"""Run the docstring examples of every e3j_models module as tests."""

import pytest
from doctest_modules import modules_with_examples, run_examples


@pytest.mark.parametrize("name", modules_with_examples("e3j_models", recursive=True))
def test_doctests(name):
    run_examples(name)
