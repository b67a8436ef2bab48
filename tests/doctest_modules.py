"""The docstring examples of a package's modules, run as tests: every ``>>>`` in a module's source
must run (doctest's finder skips some places, e.g. a ``cached_property``'s docstring), and a module
without examples is not a test case (it would pass having checked nothing)."""

import doctest
import importlib
import pkgutil
import re

_PROMPT = re.compile(r"^\s*>>>( |$)", re.M)


def _prompts(module) -> int:
    if not module.__file__.endswith(".py"):  # a compiled extension
        return 0
    with open(module.__file__, encoding="utf-8") as f:
        return len(_PROMPT.findall(f.read()))


def modules_with_examples(package: str, *, recursive: bool = True, exclude: tuple[str, ...] = ()) -> list[str]:
    """``package`` and its modules (submodules too when ``recursive``) whose source has a ``>>>``."""
    root = importlib.import_module(package)
    walk = pkgutil.walk_packages if recursive else pkgutil.iter_modules
    names = [package, *sorted(m.name for m in walk(root.__path__, package + "."))]
    return [n for n in names if n not in exclude and _prompts(importlib.import_module(n))]


def run_examples(name: str) -> None:
    """Run module ``name``'s examples: none may fail, and every ``>>>`` of its source must have run.

    Each docstring runs once: a module lists in ``__test__`` the ones doctest's finder does not see,
    and from Python 3.13 on the finder sees some of them too (a ``cached_property``'s)."""
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    seen = set()
    for test in doctest.DocTestFinder().find(module):
        if test.docstring not in seen:  # two docstrings of the same text count once: the check below fails
            seen.add(test.docstring)
            runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"
    prompts = _prompts(module)
    assert result.attempted == prompts, (
        f"{name}: {prompts} '>>>' lines in its source, but {result.attempted} examples ran (one doctest's finder "
        "does not see: list it in the module's __test__)"
    )
