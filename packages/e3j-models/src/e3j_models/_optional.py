"""The optional dependencies of e3j-models' extras, imported where they are used (private).

A missing one is an ``ImportError`` naming what needed it and the extra that installs it, as
``e3j.interop`` and ``e3j.flax`` name theirs.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from types import ModuleType

import e3j
from e3j_core.dependencies import install_hint

# pip resolves e3j-models' "e3j>=0.1,<0.2" to an unrelated project of that name on PyPI when this
# project's e3j is not installed first: named here, before the imports that would fail on it
if not hasattr(e3j, "MulIrConvolution"):
    raise ImportError(
        f"the installed 'e3j' ({getattr(e3j, '__file__', '?')}) is not the e3j that e3j-models needs but "
        "an unrelated package of the same name: install this project's e3j-core and e3j "
        "(pip install ./packages/e3j-core ./packages/e3j-ops from its repository; see docs/install.md)"
    )

__all__ = ["missing", "require"]

# the extra of pyproject.toml's [project.optional-dependencies] that brings each module
_EXTRAS = {"ase": "ase", "optax": "train", "tqdm": "train", "matplotlib": "train"}


def missing(module: str, what: str, extra: str | None = None) -> ImportError:
    """The error for ``module`` not installed: ``what`` needs it, and the extra that brings it
    (``extra``, else the smallest one that has it)."""
    top = module.split(".")[0]
    extra = extra or _EXTRAS.get(top)
    how = install_hint("e3j-models", extra, top) if extra else f"pip install {top}"
    if module != top and importlib.util.find_spec(top) is not None:
        # installed, but too old for the submodule (ase < 3.25 has no ase.md.nose_hoover_chain)
        try:
            version = f" {importlib.metadata.version(top)}"
        except importlib.metadata.PackageNotFoundError:
            version = ""
        upgrade = how.replace("pip install ", "pip install --upgrade ", 1)
        return ImportError(f"{what} needs {module}, which the installed {top}{version} lacks: {upgrade}")
    return ImportError(f"{what} needs {top}: {how}")


def require(module: str, what: str, extra: str | None = None) -> ModuleType:
    """``module`` imported, or an ``ImportError`` saying that ``what`` needs it and which extra brings it.

    >>> require("numpy", "this example").__name__
    'numpy'
    >>> require("tqdm_not_installed", "progress")
    Traceback (most recent call last):
    ...
    ImportError: progress needs tqdm_not_installed: pip install tqdm_not_installed
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise missing(module, what, extra) from err
