"""The ``e3j.backends`` descriptors of this package (plain mappings: no ``e3j`` import needed)."""

from __future__ import annotations

import functools
import threading
from typing import Any

from e3j_core.dependencies import declared_range

from ._version import __version__

__all__ = ["backend", "interpret_backend"]

#: The JAX range this package is tested with (Pallas TPU's API is not stable across releases).
#: Read from the installed metadata (pyproject.toml's dependencies); "" when run from a source tree.
JAX_REQUIREMENT = str(declared_range("e3j-pallas-tpu", "jax") or "")
#: Tables with at most this many COO records are unrolled into the kernels, larger ones walked from
#: SMEM (lmax 3 filtered: 353 records, unrolled; lmax 4: 1158, walked). Why here: see ``_records``.
UNROLL_RECORDS = 400
#: The kernels ``load()`` returns, declared in the descriptors: e3j routes an op's trace on them
#: without importing the kernels (and with them Pallas, whose JAX options would change every jit
#: cache key mid-program). grouped_convolution: mixed multiplicities, each group's launch reading
#: its windows of e3nn's weights.
KERNELS = tuple(op + kind for op in ("tensor_product", "convolution", "grouped_convolution") for kind in ("", "_bwd"))


# held while an interpreted program runs (see _hosted)
_INTERPRETER = threading.Lock()


# Twin of e3j_pallas_gpu.backend._behind_callback, on purpose: kernel packages depend on e3j-core and
# jax only, never on e3j or on each other (docs/design.md).
def _hosted(kernel):
    """Run an interpreted kernel as its own jitted program behind a ``pure_callback``.

    The TPU interpreter threads ordered I/O effects through its program; e3j lowers kernels inside
    its primitives' (effect-free) lowerings, which cannot carry them. Outside a primitive the
    interpreted kernel runs as usual. The interpreter keeps process-wide state (its simulated
    memory) that the devices of a ``shard_map``, calling back at once, would share: one program
    runs at a time.
    """
    import jax

    def run(coo, *args, **options):
        fn = jax.jit(lambda *a: kernel(coo, *a, **options))

        def one_at_a_time(*a):
            with _INTERPRETER:
                return jax.block_until_ready(fn(*a))

        return jax.pure_callback(one_at_a_time, jax.eval_shape(fn, *args), *args)

    return run


def _load(interpret: bool) -> dict[str, Any]:
    from . import convolution, tensor_product

    if interpret:
        from jax.experimental.pallas import tpu as pltpu

        def bind(fn):
            return _hosted(functools.partial(fn, interpret=pltpu.InterpretParams()))

    else:

        def bind(fn):
            return functools.partial(fn, interpret=None)

    modules = {"tensor_product": tensor_product, "convolution": convolution, "grouped_convolution": convolution}
    return {k: bind(getattr(modules[k.removesuffix("_bwd")], k)) for k in KERNELS}


_COMMON: dict[str, Any] = {
    "version": __version__,
    "ops": ("tensor_product", "convolution"),
    "kernels": KERNELS,
    # Mosaic has no float64 vector unit
    "dtypes": ("float32",),
    # no l limit: tables above the unroll limit are walked (see _records)
    "notes": (
        f"tables of <= {UNROLL_RECORDS} COO records (lmax 3 filtered: 353) are unrolled into the kernels; "
        "larger ones are walked record by record from SMEM (any l)",
    ),
    "deterministic": True,
    "jax_requirement": JAX_REQUIREMENT,
}

#: Mosaic-compiled Pallas kernels on TPUs.
backend: dict[str, Any] = {
    **_COMMON,
    "name": "pallas_tpu",
    "platforms": ("tpu",),
    "priority": 20,
    "load": functools.partial(_load, False),
}

#: The same kernels in Pallas's TPU interpreter on the CPU: for tests, only used when asked for by name.
interpret_backend: dict[str, Any] = {
    **_COMMON,
    "name": "pallas_tpu_interpret",
    "platforms": ("cpu",),
    "priority": 0,
    "auto": False,
    "load": functools.partial(_load, True),
}
