"""Test-only e3j backends, advertised through the ``e3j.backends`` entry-point group.

- ``test``: CPU, priority 100 (beats the reference's 0). Its kernels *are* the reference kernels,
  wrapped only to append the op name to :data:`calls` each time one is traced into a lowering.
- ``incompatible``: reads a COO format e3j-core does not write (priority 1000: it would win if it
  were not rejected).
- ``old_jax``: requires a JAX older than any supported one (priority 1000, likewise).
- ``load_fails``: compatible, but its ``load()`` raises (priority 200, CPU): selection must skip it.
- ``not_a_backend``: an entry point that yields something other than a descriptor.
- ``as_mapping``: a descriptor given as a plain mapping (how kernel packages that must not import
  ``e3j`` register), priority 500 but ``auto=False``: used only when asked for by name; its
  ``load()`` returns a mapping of reference kernels.
- ``bad_mapping``: a mapping with a field :class:`e3j.backends.Backend` does not have.
- ``broken`` (``e3j_test_backend._broken``): the module raises on import.
"""

from __future__ import annotations

import functools

from e3j.backends import Backend, Kernels, get_backend
from e3j_core import COO_FORMAT_VERSION

__version__ = "0.1.0"

#: op names, one per kernel call (``"tensor_product"``, ``"tensor_product_bwd"``, ...)
calls: list[str] = []


def _counted(name: str, fn):
    @functools.wraps(fn)
    def kernel(*args, **kwargs):
        calls.append(name)
        return fn(*args, **kwargs)

    return kernel


def _load() -> Kernels:
    ref = get_backend("reference").load()
    return Kernels(
        **{
            op: _counted(op, getattr(ref, op))
            for op in ("tensor_product", "tensor_product_bwd", "convolution", "convolution_bwd")
        }
    )


def _never_loaded() -> Kernels:
    raise AssertionError("an incompatible backend must never be loaded")


def _load_fails() -> Kernels:
    raise RuntimeError("simulated kernel load failure (missing shared library)")


backend = Backend(
    name="test",
    version=__version__,
    platforms=("cpu",),
    load=_load,
    priority=100,
    dtypes=("float32", "float64"),
    deterministic=True,
    jax_requirement=">=0.11.1",
)

incompatible = Backend(
    name="incompatible",
    version=__version__,
    platforms=("cpu", "cuda", "tpu"),
    load=_never_loaded,
    priority=1000,
    coo_format_version=COO_FORMAT_VERSION + 1000,
)

old_jax = Backend(
    name="old_jax",
    version=__version__,
    platforms=("cpu", "cuda", "tpu"),
    load=_never_loaded,
    priority=1000,
    jax_requirement=">=0.4,<0.5",
)

load_fails = Backend(
    name="load_fails",
    version=__version__,
    platforms=("cpu",),
    load=_load_fails,
    priority=200,
)


def not_a_backend() -> str:
    return "not a Backend"


def _load_mapping() -> dict:
    ref = get_backend("reference").load()
    return {op: getattr(ref, op) for op in ("tensor_product", "tensor_product_bwd", "convolution", "convolution_bwd")}


as_mapping = {
    "name": "as_mapping",
    "version": __version__,
    "platforms": ["cpu"],
    "load": _load_mapping,
    "priority": 500,
    "auto": False,
}

bad_mapping = {"name": "bad_mapping", "version": __version__, "platforms": ("cpu",), "load": _load_mapping, "speed": 11}
