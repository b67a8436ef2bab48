"""Command line: ``python -m e3j info`` and ``python -m e3j bench`` (or ``e3j ...``).

``info`` prints the installed versions, the JAX devices, every installed backend (and the entry
points that failed to load), and which backend each op would use on each local platform.
``bench`` measures every usable backend (and e3nn-jax when installed); see ``e3j bench --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator, Sequence

__all__ = ["main"]

# the example op that ``info`` asks every backend about
INFO_DTYPE = "float32"
INFO_CHANNELS = 64
INFO_LMAX = 3


def _dist_version(name: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _info(args: argparse.Namespace) -> int:
    import os
    import platform as _platform

    import jax

    import e3j_core

    from . import __version__, backends

    out = sys.stdout
    w = out.write

    w(f"e3j        {__version__}\n")
    w(f"e3j-core   {e3j_core.__version__}\n")
    w(f"jax        {jax.__version__}\n")
    w(f"jaxlib     {_dist_version('jaxlib')}\n")
    w(f"python     {_platform.python_version()} ({sys.executable})\n")
    w(f"COO format {e3j_core.COO_FORMAT_VERSION}\n")

    try:
        devices = jax.devices()
        default_platform = jax.default_backend()
    except RuntimeError as err:  # no usable JAX backend at all
        devices, default_platform = [], f"unavailable ({err})"
    w(f"\nJAX default platform: {default_platform}\n")
    w(f"JAX devices ({len(devices)}):\n")
    for d in devices:
        w(f"  {d.platform}:{d.id}  {getattr(d, 'device_kind', '')}\n")
    platforms = sorted({backends.device_platform(d) for d in devices}) or ["cpu"]

    w("\nBackends:\n")
    for b in backends.available_backends():
        d = backends.describe(b)
        w(f"  {b.name} {b.version}\n")
        w(f"    platforms:     {', '.join(b.platforms)}\n")
        w(f"    priority:      {b.priority}{'' if b.auto else ' (used only when asked for by name)'}\n")
        w(f"    ops:           {', '.join(b.ops)}\n")
        w(f"    dtypes:        {', '.join(b.dtypes)}\n")
        limits = [f"channels multiple of {b.channel_multiple}"] if b.channel_multiple != 1 else []
        if b.max_channels is not None:
            limits.append(f"channels <= {b.max_channels}")
        if b.max_l is not None:
            limits.append(f"l <= {b.max_l}")
        w(f"    limits:        {', '.join(limits) or 'none'}\n")
        for op, channels, other in b.yields:
            w(f"    yields:        {op} below {channels} channels to {other} when it can run it\n")
        w(f"    deterministic: {'yes' if b.deterministic else 'no'}\n")
        w(f"    jax:           {b.jax_requirement or 'any'}\n")
        coo = b.coo_format_version
        w(f"    COO format:    {coo if coo is not None else 'through e3j-core API'}\n")
        for note in b.notes:
            w(f"    note:          {note}\n")
        compatible = d["compatible"]
        w(f"    compatible:    {compatible if compatible == 'yes' else 'no: ' + compatible}\n")
    errors = backends.discovery_errors()
    if errors:
        w("\nBackends that failed to load:\n")
        for entry_point, error in errors:
            w(f"  {entry_point}: {error}\n")

    env = os.environ.get(backends.ENV_VAR, "").strip()
    w(f"\n{backends.ENV_VAR}: {env or '(unset)'}\n")
    w(f"Selected backend ({INFO_DTYPE}, {INFO_CHANNELS} channels, lmax {INFO_LMAX}):\n")
    status = 0
    for op in backends.OPS:
        for platform in platforms:
            req = backends.OpRequest(op, platform, INFO_DTYPE, INFO_CHANNELS, INFO_LMAX)
            notes: list[str] = []
            try:
                with _quiet(notes):
                    chosen = backends.select_backend(req, None).name
            except backends.BackendError as err:
                chosen, status = f"error: {err}", 1
            w(f"  {op:<15} {platform:<5} {chosen}\n")
            for note in notes:
                w(f"      note: {note}\n")
            for skipped, reason in _passed_over(req, chosen):
                w(f"      {skipped} not used: {reason}\n")
    out.flush()
    return status


def _passed_over(req, chosen: str) -> list[tuple[str, str]]:
    """``(name, reason)`` of the automatic backends for ``req``'s platform that outrank ``chosen``
    and were not used: they cannot run ``req`` (e.g. Mosaic GPU kernels on a GPU older than Hopper),
    they fail to load (a kernel package whose shared library is missing: loaded here, as selection
    tried to), or ``E3J_BACKEND`` chose ``chosen``."""
    import os

    from . import backends

    env = os.environ.get(backends.ENV_VAR, "").strip()

    try:
        floor = backends.get_backend(chosen).priority
    except backends.BackendError:
        floor = -1
    passed = []
    for b in backends.available_backends():
        if b.auto and b.name != chosen and req.platform in b.platforms and b.priority > floor:
            reason = b.unsupported(req) or b.passed_over(req)
            if not reason and env == chosen:
                reason = f"{backends.ENV_VAR}={env} chose {chosen}"
            elif not reason:
                try:
                    backends._check_loadable(b)
                except backends.BackendError as err:
                    reason = str(err)
            if reason:
                passed.append((b.name, reason))
    return passed


@contextlib.contextmanager
def _quiet(notes: list[str]) -> Iterator[None]:
    """Collect ``select_backend``'s warnings into ``notes``, and keep them out of its once-only record."""
    from . import backends

    warned = set(backends._warned)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        notes.extend(str(c.message) for c in caught)
    finally:
        backends._warned.intersection_update(warned)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="e3j", description="e3j: Euclid-equivariant ops for JAX.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    info = sub.add_parser("info", help="versions, devices, installed backends and the backend each op uses")
    info.set_defaults(func=_info)
    from . import _sweep

    _sweep.add_parser(sub)
    sub.choices["bench"].set_defaults(func=_sweep.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (argparse exits with 2 on bad arguments)."""
    args = _parser().parse_args(argv)
    args.argv = None if argv is None else list(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
