"""The version range an installed distribution declares for one of its dependencies, and its check.

A kernel package (e3j-cuda, e3j-pallas-gpu, e3j-pallas-tpu) is built and tested for a range of JAX
versions. That range is written once, in the package's ``pyproject.toml`` (``jax>=0.11.1,<0.13``),
and reaches users as the wheel's ``Requires-Dist``. The package reads it back from its installed
metadata, both to refuse to import under a JAX outside it (pip can be bypassed: ``--no-deps``, a
later ``pip install jax``) and to report it in its backend descriptor. Nothing is hard-coded twice.

Only metadata is read (no import of the dependency, no device probing): cheap enough for import time.
A source tree on ``sys.path`` without installed metadata declares nothing and is not checked.

>>> from e3j_core.dependencies import declared_range
>>> declared_range("e3j-core", "numpy")
<SpecifierSet('>=1.26')>
>>> declared_range("e3j-core", "jax") is None  # e3j-core does not depend on JAX
True
"""

from __future__ import annotations

import functools
import importlib.metadata

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

__all__ = ["IncompatibleDependency", "check_dependency", "declared_range", "install_hint"]


class IncompatibleDependency(ImportError):
    """An installed dependency is missing or outside the range a distribution declares for it."""


@functools.cache
def declared_range(distribution: str, dependency: str) -> SpecifierSet | None:
    """The version range ``distribution`` requires of ``dependency`` (its unconditional ``Requires-Dist``).

    Args:
        distribution: an installed distribution's name, e.g. ``"e3j-pallas-gpu"``.
        dependency: the required distribution's name, e.g. ``"jax"``.

    Returns:
        The intersection of every unconditional requirement on ``dependency`` (requirements that
        apply only to an extra or another platform are ignored); an empty ``SpecifierSet`` when it is
        required without a range; ``None`` when ``distribution`` is not installed (a source tree) or
        does not require ``dependency``.
    """
    try:
        requires = importlib.metadata.requires(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    wanted = canonicalize_name(dependency)
    found: SpecifierSet | None = None
    for line in requires or ():
        req = Requirement(line)
        if canonicalize_name(req.name) != wanted:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        found = req.specifier if found is None else found & req.specifier
    return found


@functools.cache
def _extra_requirements(distribution: str, extra: str) -> tuple[str, ...]:
    """The requirements ``distribution`` declares for its ``[extra]`` only, without their markers."""
    try:
        requires = importlib.metadata.requires(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ()
    out = []
    for line in requires or ():
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}) or not req.marker.evaluate({"extra": extra}):
            continue
        req.marker = None
        out.append(str(req))
    return tuple(out)


def install_hint(distribution: str, extra: str, fallback: str) -> str:
    """``pip install`` of what ``distribution``'s ``[extra]`` brings, each requirement named with its range.

    The requirements are named one by one, not as ``distribution[extra]``: pip may resolve ``e3j``
    to an unrelated project of that name on PyPI (docs/install.md), and the other distributions of
    this project are not on PyPI. Read from the installed metadata, like :func:`declared_range`;
    where there is none (a source tree) or the extra is unknown, ``pip install <fallback>``.

    >>> install_hint("e3j-core", "no-such-extra", "numpy")
    'pip install numpy'
    """
    requirements = _extra_requirements(distribution, extra)
    if not requirements:
        return f"pip install {fallback}"
    return "pip install " + " ".join(f"'{r}'" for r in requirements)


def check_dependency(distribution: str, dependency: str) -> None:
    """Raise :class:`IncompatibleDependency` unless the installed ``dependency`` is in ``distribution``'s range.

    Does nothing when ``distribution`` declares no requirement on ``dependency`` (or is not installed,
    as when run from a source tree). Pre-releases inside the range are accepted.

    Args:
        distribution: the installed distribution that declares the range, e.g. ``"e3j-cuda"``.
        dependency: the distribution whose installed version is checked, e.g. ``"jax"``.

    Raises:
        IncompatibleDependency: ``dependency`` is not installed, or its version is outside the range;
            the message names both distributions, the range and the installed version.
    """
    spec = declared_range(distribution, dependency)
    if spec is None:
        return
    own = importlib.metadata.version(distribution)
    wanted = f"{dependency}{spec}"
    try:
        installed = importlib.metadata.version(dependency)
    except importlib.metadata.PackageNotFoundError:
        raise IncompatibleDependency(
            f"{distribution} {own} needs {wanted}, but {dependency} is not installed: pip install '{wanted}'"
        ) from None
    if not spec.contains(Version(installed), prereleases=True):
        raise IncompatibleDependency(
            f"{distribution} {own} is built and tested for {wanted} (its declared requirement), but "
            f"{dependency} {installed} is installed; install a {dependency} in that range "
            f"(pip install '{wanted}') or a release of {distribution} that supports {dependency} {installed}"
        )
