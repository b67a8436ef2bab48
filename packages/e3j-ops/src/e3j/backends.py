"""Backends: descriptors, discovery through entry points, and per-platform selection.

A backend is a set of plain jittable kernel functions taking core's COO tables (see
:class:`Kernels`). A kernel package advertises one with an entry point in the group
``e3j.backends`` whose object is a :class:`Backend` descriptor, or a plain mapping of its fields (so
kernel packages need not import ``e3j``), or a zero-argument callable returning either: cheap to
import, with a ``load()`` that imports the kernels and registers any FFI targets, returning
:class:`Kernels` or a mapping of its fields.

Selection happens when a primitive is lowered, for the platform it is lowered for:

1. an explicit request — the ``backend=`` argument of an op, else the innermost
   :func:`use_backend` context at the time the op was called — must be usable, or lowering raises;
2. else ``E3J_BACKEND`` (read at lowering time), when usable here; when not, a warning says why;
3. else the loaded backend of highest priority that supports the platform, dtype and shapes
   (backends with ``auto=False``, such as interpreters of accelerator kernels, only run by name;
   one that ``yields`` an op below a channel count is passed over there when the backend it names
   (measured faster there) can run the request: see :meth:`Backend.passed_over`);
4. else the reference backend. On an accelerator this fallback warns once, saying why; a request
   the reference cannot run either (e.g. a float8 dtype) raises ``BackendError`` naming each reason.

``python -m e3j info`` prints what is installed and what each op would use.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib.metadata
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache, partial, wraps
from typing import Any

import jax
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from e3j_core import COO_FORMAT_VERSION

from ._checks import static_size
from .contract import OPS, Kernels

__all__ = [
    "Backend",
    "BackendError",
    "Kernels",
    "OpRequest",
    "available_backends",
    "current_backend_request",
    "device_platform",
    "get_backend",
    "select_backend",
    "use_backend",
]

ENTRY_POINT_GROUP = "e3j.backends"
ENV_VAR = "E3J_BACKEND"


def device_platform(device) -> str:
    """The platform name e3j's lowerings and backends use for a JAX ``device``.

    A GPU device reports ``device.platform == "gpu"`` (and ``jax.default_backend()`` says ``"gpu"``),
    while lowerings, and so the backends' ``platforms``, name ``"cuda"`` or ``"rocm"``: this tells
    them apart from the PJRT client's platform version. Other devices keep their platform.

    >>> import jax
    >>> device_platform(jax.devices("cpu")[0])
    'cpu'
    """
    if device.platform != "gpu":
        return device.platform
    version = str(getattr(device.client, "platform_version", "")).lower()
    return "rocm" if "rocm" in version else "cuda"


class BackendError(ValueError):
    """A requested backend is unknown, incompatible or cannot run this op here."""


@dataclass(frozen=True)
class OpRequest:
    """What an op needs from a backend at lowering time."""

    op: str
    platform: str
    dtype: str
    channels: int
    lmax: int

    def __post_init__(self):
        # backends are chosen per channel count (limits, multiples, yields): it must be static
        per = "channel count"
        object.__setattr__(self, "channels", static_size(self.channels, "the channel axis C of an operand", per))


@dataclass(frozen=True)
class Backend:
    """A cheap backend descriptor; ``load()`` imports and returns the :class:`Kernels`.

    Attributes:
        name: unique name used by ``backend=``, :func:`use_backend` and ``E3J_BACKEND``.
        version: the providing package's version.
        platforms: JAX platforms it lowers for (``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``).
        priority: larger wins among usable backends (the reference has 0).
        ops: op names it implements.
        dtypes: supported dtypes, e.g. ``("float32", "float64")``.
        channel_multiple: channel counts must be a multiple of this.
        max_channels, max_l: limits, ``None`` for none.
        deterministic: bitwise run-to-run reproducible.
        jax_requirement: a version range like ``">=0.11.1,<0.13"`` (PEP 440 specifiers).
        coo_format_version: the COO table format its kernels were written for, when they read
            tables in a form of their own (e.g. compiled code reading packed records); ``None``
            for kernels that read tables only through e3j-core's API, whose version bound on
            e3j-core is the compatibility rule.
        load: returns :class:`Kernels`; called at most once.
        check: optional extra ``(OpRequest) -> reason or None``.
        auto: chosen by the automatic policy; ``False`` for backends that must be asked for by name
            (e.g. accelerator kernels run by an interpreter on the CPU, for testing).
        yields: ``(op, channels, backend)`` triples: below ``channels``, the automatic policy takes
            the named ``backend`` for ``op`` (measured faster there) when it can run the request;
            by name, or when the other cannot run it, this one still runs. A mapping
            ``{op: (channels, backend)}`` is accepted too.
        notes: facts about the kernels that ``python -m e3j info`` prints (e.g. where they switch
            algorithm); they do not affect selection.
        kernels: the :class:`Kernels` fields ``load()`` provides, when declared (``None``: not
            declared). An op's trace asks which kernels each platform's backend has (e.g. whether
            it fuses factored weights); declared, it is answered without importing the kernels,
            which on a CPU-only host would import Pallas's GPU and TPU modules mid-program (their
            JAX options join every ``jax.jit`` cache key: each function compiled before is
            compiled again). ``load()`` must then provide exactly these.
    """

    name: str
    version: str
    platforms: tuple[str, ...]
    load: Callable[[], Kernels] = field(repr=False)
    priority: int = 10
    ops: tuple[str, ...] = OPS
    dtypes: tuple[str, ...] = ("float32", "float64")
    channel_multiple: int = 1
    max_channels: int | None = None
    max_l: int | None = None
    deterministic: bool = True
    jax_requirement: str = ""
    coo_format_version: int | None = None
    check: Callable[[OpRequest], str | None] | None = field(default=None, repr=False)
    auto: bool = True
    yields: tuple[tuple[str, int, str], ...] = ()
    notes: tuple[str, ...] = ()
    kernels: tuple[str, ...] | None = None

    @classmethod
    def from_mapping(cls, fields: Mapping[str, Any]) -> Backend:
        """A descriptor from a plain mapping of its fields (unknown keys are an error)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise TypeError(f"unknown backend descriptor field(s) {unknown}; known: {sorted(known)}")
        values = dict(fields)
        for name in ("platforms", "ops", "dtypes", "notes"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)

    def __post_init__(self) -> None:
        given = self.yields
        if isinstance(given, Mapping):
            given = [(op, *v) if isinstance(v, (tuple, list)) else (op, v) for op, v in given.items()]
        triples = tuple(tuple(t) if isinstance(t, (tuple, list)) else (t,) for t in given)
        bad = [
            t
            for t in triples
            if len(t) != 3
            or t[0] not in OPS
            or isinstance(t[1], bool)
            or not isinstance(t[1], int)
            or t[1] < 1
            or not isinstance(t[2], str)
            or t[2] == self.name
        ]
        if bad:
            raise TypeError(
                f"backend {self.name!r}: yields must be (op, channels >= 1, other backend's name) with op in "
                f"{OPS}, got {bad}"
            )
        object.__setattr__(self, "yields", triples)
        if self.kernels is not None:
            declared = tuple(self.kernels)
            known = [f.name for f in dataclasses.fields(Kernels)]
            unknown = sorted(set(declared) - set(known))
            if unknown:
                raise TypeError(f"backend {self.name!r}: kernels names unknown kernel(s) {unknown}; known: {known}")
            # as Kernels takes them: a kernel and its _bwd together
            pair = {k: k.removesuffix("_bwd") if k.endswith("_bwd") else k + "_bwd" for k in declared}
            unpaired = sorted(k for k in declared if pair[k] not in declared)
            if unpaired:
                raise TypeError(f"backend {self.name!r}: kernels declares {unpaired} without its forward or _bwd pair")
            object.__setattr__(self, "kernels", declared)

    def incompatibility(self) -> str | None:
        """Why this backend cannot be used with the installed JAX and e3j-core, or ``None``."""
        if self.coo_format_version is not None and self.coo_format_version != COO_FORMAT_VERSION:
            return (
                f"it reads COO format {self.coo_format_version}, "
                f"but the installed e3j-core writes format {COO_FORMAT_VERSION}"
            )
        if self.jax_requirement and not _version_satisfies(jax.__version__, self.jax_requirement):
            return f"it needs jax{self.jax_requirement}, but jax {jax.__version__} is installed"
        return None

    def unsupported(self, req: OpRequest) -> str | None:
        """Why this backend cannot run ``req``, or ``None`` when it can."""
        reason = self.incompatibility()
        if reason:
            return reason
        if req.platform not in self.platforms:
            return f"it runs on {'/'.join(self.platforms)}, not {req.platform}"
        if req.op not in self.ops:
            return f"it has no {req.op} kernel"
        if req.dtype not in self.dtypes:
            return f"it supports {'/'.join(self.dtypes)}, not {req.dtype}"
        if req.channels % self.channel_multiple:
            return f"it needs a channel count that is a multiple of {self.channel_multiple}, got {req.channels}"
        if self.max_channels is not None and req.channels > self.max_channels:
            return f"it supports at most {self.max_channels} channels, got {req.channels}"
        if self.max_l is not None and req.lmax > self.max_l:
            return f"it supports l <= {self.max_l}, got l = {req.lmax}"
        if self.check is not None:
            return self.check(req)
        return None

    def yielded_to(self, req: OpRequest, *, load: bool = True) -> Backend | None:
        """The backend this one ``yields`` ``req`` to (below a channel count), when that one can run
        it: installed, automatic, supporting it and loadable (and not yielding it back); else ``None``.
        ``load=False``: loadability is not checked (nothing imported)."""
        found = self._yield(req, load)
        return found[0] if found else None

    def passed_over(self, req: OpRequest) -> str | None:
        """Why the automatic policy passes this backend over for ``req`` although it can run it
        (:meth:`yielded_to`), or ``None``. Requests by name ignore this."""
        found = self._yield(req)
        if found is None:
            return None
        target, channels = found
        return f"below {channels} channels {target.name} runs {req.op} (faster there), got {req.channels}"

    def _yield(self, req: OpRequest, load: bool = True) -> tuple[Backend, int] | None:
        for op, channels, other in self.yields:
            if op != req.op or req.channels >= channels:
                continue
            try:
                target = get_backend(other)
                back = any(o == op and req.channels < c and n == self.name for o, c, n in target.yields)
                if target.auto and not back and target.unsupported(req) is None:
                    if load or target.kernels is None:
                        _check_loadable(target)
                    return target, channels
            except BackendError:
                continue
        return None


def _version_satisfies(version: str, requirement: str) -> bool:
    """Whether ``version`` is in the PEP 440 range ``requirement`` (local labels such as ``+cuda`` ignored)."""
    try:
        spec = SpecifierSet(requirement)
    except InvalidSpecifier as err:
        raise ValueError(f"cannot parse version requirement {requirement!r}: {err}") from None
    return spec.contains(Version(version).public, prereleases=True)


def _load_reference() -> Kernels:
    from .reference import convolution, tensor_product

    return Kernels(
        tensor_product=tensor_product.tensor_product,
        tensor_product_bwd=tensor_product.tensor_product_bwd,
        convolution=convolution.convolution,
        convolution_bwd=convolution.convolution_bwd,
        convolution_factored=convolution.convolution_factored,
        convolution_factored_bwd=convolution.convolution_factored_bwd,
        grouped_convolution=convolution.grouped_convolution,
        grouped_convolution_bwd=convolution.grouped_convolution_bwd,
        grouped_convolution_factored=convolution.grouped_convolution_factored,
        grouped_convolution_factored_bwd=convolution.grouped_convolution_factored_bwd,
    )


def _reference() -> Backend:
    from ._version import __version__

    return Backend(
        name="reference",
        version=__version__,
        platforms=("cpu", "cuda", "rocm", "tpu"),
        # pure JAX: any floating dtype, as the fallback runs it (16-bit inputs round like e3nn-jax's)
        dtypes=("bfloat16", "float16", "float32", "float64"),
        load=_load_reference,
        priority=0,
        kernels=tuple(f.name for f in dataclasses.fields(Kernels)),  # every one
        notes=("deterministic on a CPU; its scatter-adds on a GPU or TPU are XLA's, which may sum in any order",),
    )


@cache
def _discovered() -> tuple[tuple[Backend, ...], tuple[tuple[str, str], ...]]:
    """Backends from entry points, and ``(entry point, error)`` for those that failed to load."""
    found, errors = [_reference()], []
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            obj = ep.load()
            backend = obj if isinstance(obj, (Backend, Mapping)) else obj()
            if isinstance(backend, Mapping):
                backend = Backend.from_mapping(backend)
            if not isinstance(backend, Backend):
                raise TypeError(f"expected an e3j.backends.Backend, got {type(backend).__name__}")
        except Exception as err:  # a broken plugin must not break e3j
            errors.append((f"{ep.name} ({ep.value})", f"{type(err).__name__}: {err}"))
            continue
        if any(b.name == backend.name for b in found):
            errors.append((f"{ep.name} ({ep.value})", f"duplicate backend name {backend.name!r}"))
            continue
        found.append(backend)
    return tuple(found), tuple(errors)


def available_backends() -> tuple[Backend, ...]:
    """The reference backend and every backend discovered through ``e3j.backends`` entry points.

    >>> import e3j
    >>> reference = e3j.available_backends()[0]
    >>> reference.name, "cpu" in reference.platforms
    ('reference', True)
    """
    return _discovered()[0]


def get_backend(name: str) -> Backend:
    """The installed backend called ``name`` (:class:`BackendError` listing the installed ones
    otherwise). Installed is not usable: :meth:`Backend.unsupported` says why one cannot run a call.

    >>> get_backend("reference").name
    'reference'
    """
    for b in available_backends():
        if b.name == name:
            return b
    names = ", ".join(b.name for b in available_backends())
    raise BackendError(f"unknown e3j backend {name!r}; installed: {names}")


@cache
def _kernels(name: str) -> Kernels:
    backend = get_backend(name)
    kernels = backend.load()
    if isinstance(kernels, Mapping):
        unknown = sorted(set(kernels) - {f.name for f in dataclasses.fields(Kernels)})
        if unknown:
            raise BackendError(f"backend {name!r}: load() returned unknown kernel name(s) {unknown}")
        kernels = Kernels(**kernels)
    if not isinstance(kernels, Kernels):
        raise BackendError(f"backend {name!r}: load() returned {type(kernels).__name__}, not Kernels")
    if backend.kernels is not None:
        loaded = {f.name for f in dataclasses.fields(Kernels) if getattr(kernels, f.name) is not None}
        if loaded != set(backend.kernels):
            raise BackendError(
                f"backend {name!r}: load() provides {sorted(loaded)}, but its descriptor declares "
                f"kernels={sorted(backend.kernels)}"
            )
    return kernels


def kernels_of(backend: Backend, platform: str = "cpu") -> Kernels:
    """``backend``'s kernels (loaded once) for a lowering on ``platform``. Only the reference's
    differ between platforms: its sweeps' chunks are sized for a CPU's caches or for an
    accelerator (:func:`e3j.reference.convolution.chunk_size`)."""
    if backend.name == "reference" and platform != "cpu":
        return _reference_on(platform)
    return _kernels(backend.name)


@cache
def _reference_on(platform: str) -> Kernels:
    """The reference's kernels with ``platform`` bound into each convolution kernel (every one
    takes it; the tensor product's have no chunks)."""
    cpu = _kernels("reference")
    bound = {
        f.name: partial(getattr(cpu, f.name), platform=platform)
        for f in dataclasses.fields(Kernels)
        if "convolution" in f.name
    }
    return dataclasses.replace(cpu, **bound)


def provides(backend: Backend, kernel: str) -> bool:
    """Whether ``backend`` has ``kernel`` and its ``_bwd`` (:meth:`Kernels.provides`): from its
    descriptor's ``kernels`` when declared (nothing imported), else from its loaded kernels."""
    if backend.kernels is not None:
        return kernel in backend.kernels and kernel + "_bwd" in backend.kernels
    return kernels_of(backend).provides(kernel)


_REQUEST: contextvars.ContextVar[str | None] = contextvars.ContextVar("e3j_backend", default=None)


@contextlib.contextmanager
def use_backend(name: str | None) -> Iterator[None]:
    """Use backend ``name`` for ops called inside the ``with`` block (``None``: automatic).

    The request is recorded when an op is called (traced), and resolved when it is lowered.

    >>> import jax.numpy as jnp, e3j
    >>> tp = e3j.TensorProduct("0e + 1o", "0e + 1o")
    >>> with e3j.use_backend("reference"):
    ...     z = tp(jnp.ones((3, 4, 8)), jnp.ones((3, 4)))  # the same as tp(..., backend="reference")
    >>> z.shape
    (3, 16, 8)
    """
    if name is not None:
        get_backend(name)  # unknown names fail here, not at lowering
    token = _REQUEST.set(name)
    try:
        yield
    finally:
        _REQUEST.reset(token)


def current_backend_request(explicit: str | None = None) -> str | None:
    """The explicit ``backend=`` argument if given, else the innermost :func:`use_backend`."""
    if explicit is not None:
        get_backend(explicit)
        return explicit
    return _REQUEST.get()


def programs_per_request(maxsize: int) -> Callable[[Callable], Callable]:
    """Decorator: an LRU cache of a program builder, keyed on its arguments and on ``E3J_BACKEND``.

    ``E3J_BACKEND`` is read when a program is lowered, so a cached ``jax.jit`` made before it changed
    would keep the old choice; keyed on its value, a call made after the change builds (and lowers)
    again, as a fresh ``jax.jit`` of the call would. The wrapper keeps ``cache_info`` and
    ``cache_clear``.

    >>> @programs_per_request(maxsize=4)
    ... def program(n):
    ...     return jax.jit(lambda x: x * n)
    >>> program(2) is program(2)
    True
    """

    def decorate(build: Callable) -> Callable:
        @lru_cache(maxsize=maxsize)
        def cached(env: str, *args):
            del env  # only a cache key
            return build(*args)

        @wraps(build)
        def program(*args):
            return cached(os.environ.get(ENV_VAR, ""), *args)

        program.cache_info, program.cache_clear = cached.cache_info, cached.cache_clear
        return program

    return decorate


_warned: set[tuple] = set()


def _warn_once(key: tuple, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def select_backend(req: OpRequest, requested: str | None, *, warn: bool = True, load: bool = True) -> Backend:
    """The backend that will run ``req`` (see the module docstring for the policy); ``warn=False``:
    without the warnings (an op deciding ahead of lowering, which gives them); ``load=False``:
    without importing the kernels of candidates that declare them (``Backend.kernels``) to check
    that they load (an op routing its trace on their descriptors, :func:`provides`; lowering
    selects with the check); a candidate that declares none is loaded, as its kernels are known
    only then."""

    def check_loadable(backend: Backend) -> None:
        if load or backend.kernels is None:
            _check_loadable(backend)

    if requested is not None:
        backend = get_backend(requested)
        reason = backend.unsupported(req)
        if reason:
            raise BackendError(f"backend {requested!r} cannot run {req.op} on {req.platform}: {reason}")
        check_loadable(backend)
        return backend
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        try:
            backend = get_backend(env)
            reason = backend.unsupported(req)
            if not reason:
                check_loadable(backend)
                return backend
        except BackendError as err:
            reason = str(err)
        if warn:
            _warn_once(("env", env, req), f"{ENV_VAR}={env} is not used for {req.op} on {req.platform}: {reason}")
    reasons = []
    candidates = sorted(available_backends(), key=lambda b: -b.priority)
    for backend in candidates:
        if backend.name == "reference" or not backend.auto:
            continue
        reason = backend.unsupported(req)
        if reason is None:
            target = backend.yielded_to(req, load=load)
            if target is not None:
                return target
            try:
                check_loadable(backend)
                return backend
            except BackendError as err:
                reason = str(err)
        reasons.append(f"{backend.name}: {reason}")
    reference = get_backend("reference")
    reason = reference.unsupported(req)
    if reason:  # as when asked for by name: what no backend runs is refused, not run anyway
        listed = "; ".join([*reasons, f"reference: {reason}"])
        raise BackendError(f"no backend can run {req.op} on {req.platform}: {listed}")
    if req.platform != "cpu" and warn:
        why = (
            "; ".join(reasons)
            if reasons
            else "no kernel backend is installed (e3j-cuda, e3j-pallas-gpu or e3j-pallas-tpu: docs/install.md)"
        )
        _warn_once(
            ("fallback", req.op, req.platform),
            f"e3j {req.op} on {req.platform} falls back to the pure-JAX reference backend: {why}",
        )
    return reference


def _check_loadable(backend: Backend) -> None:
    try:
        _kernels(backend.name)
    except BackendError:
        raise
    except Exception as err:
        raise BackendError(f"backend {backend.name!r} failed to load: {type(err).__name__}: {err}") from err


def describe(backend: Backend) -> dict:
    """A plain-dict view of a descriptor (for ``python -m e3j info``)."""
    d = {f.name: getattr(backend, f.name) for f in dataclasses.fields(backend) if f.name not in ("load", "check")}
    d["compatible"] = backend.incompatibility() or "yes"
    return d


def discovery_errors() -> tuple[tuple[str, str], ...]:
    """``(entry point, error)`` for each installed backend plugin that failed to load."""
    return _discovered()[1]
