"""Argument validation shared by the public ops (private)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from e3j_core._checks import check_bool, check_int, is_int

__all__ = [
    "STATIC",
    "check_array",
    "check_bool",
    "check_host_index",
    "check_index_count",
    "check_int",
    "check_positive_int",
    "check_rank",
    "check_same_dtype",
    "check_truth",
    "edge_arrays",
    "float_dtype",
    "is_irreps_array",
    "not_an_array",
    "promoted_real_dtype",
    "static_size",
]

#: e3j's graphs, kernels and sweeps index nodes and edges (and a graph's CSR offsets) with int32
MAX_INDEX_COUNT = 2**31 - 1

# the note check_int adds for counts that fix shapes (a node count, a device count)
STATIC = " (static, not traced)"


def not_an_array(a) -> bool:
    """``None`` or a container/string that jnp would read as an array (or refuse unnamed)."""
    return a is None or isinstance(a, (list, tuple, str, bytes, dict))


def is_irreps_array(a) -> bool:
    """An e3nn-jax ``IrrepsArray``, told by its attributes: e3j imports e3nn-jax only in its interop
    module."""
    return hasattr(a, "irreps") and hasattr(a, "array")


def check_array(name: str, a) -> None:
    """An array (jax, numpy, a scalar), not ``None``, a nested list or an e3nn ``IrrepsArray``.

    jnp would read ``None`` as a float or a rank-0 array and a list as an array (deprecated), and
    its errors would not name the argument. An ``IrrepsArray`` has a shape, so shape checks would
    pass it and JAX would refuse it later without naming the argument.
    """
    if not_an_array(a):
        raise TypeError(f"{name} must be an array, got {type(a).__name__}")
    if is_irreps_array(a):
        raise TypeError(
            f"{name} must be a plain array, got an e3nn IrrepsArray ({a.irreps}): its .array is e3nn's "
            "flat mul_ir layout [..., dim], which the MulIr ops take as it is; ops on e3j's [..., D, C] "
            "take e3j.from_mul_ir(a.array, irreps, C); e3j.interop's drop-ins take IrrepsArrays"
        )


def float_dtype(name: str, a) -> jnp.dtype:
    check_array(name, a)
    try:
        dtype = jnp.result_type(a)
    except TypeError as err:  # e.g. a nested list: name the argument
        raise TypeError(f"{name} must be an array, got {type(a).__name__}") from err
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {dtype}")
    return dtype


def promoted_real_dtype(operands: dict, what: str = "a real array") -> jnp.dtype:
    """The floating dtype JAX's arithmetic gives ``operands`` (``{name: array or dtype}``), as
    e3nn-jax computes: ``jnp.result_type``, with JAX's default float where every operand is an
    integer or boolean. A complex or non-numeric operand is a ``TypeError`` saying it must be
    ``what``."""
    for name, a in operands.items():
        try:
            dtype = jnp.result_type(a)
        except TypeError as err:  # e.g. a nested list: name the argument
            raise TypeError(f"{name} must be an array, got {type(a).__name__}") from err
        real = jnp.issubdtype(dtype, jnp.number) and not jnp.issubdtype(dtype, jnp.complexfloating)
        if not (real or dtype == jnp.bool_):  # never drop an imaginary part
            raise TypeError(f"{name} must be {what}, got dtype {dtype}")
    # the operands themselves, not their dtypes: a weakly typed one (a Python number, an array made
    # from one) takes the others' dtype, as in JAX's arithmetic (float32 stays float32 under x64)
    dtype = jnp.result_type(*operands.values())
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.result_type(dtype, float)


def check_positive_int(name: str, value: object, what: str = "") -> int:
    """A static count (channels, layers, species) > 0 as a Python int (numpy integers taken)."""
    return check_int(name, value, 1, what)


def check_rank(name: str, a, ranks: tuple[int, ...], layout: str) -> None:
    check_array(name, a)
    if jnp.ndim(a) not in ranks:
        raise ValueError(f"{name} must have shape {layout}, got shape {jnp.shape(a)}")


def check_truth(name: str, value: object) -> bool:
    """A flag as e3nn-jax reads it (``if value:``) where that reading is unambiguous: a bool, an int
    ``0`` or ``1``, or a concrete 0-d bool or integer array holding one (``jnp.array(True)``). Else a
    ``TypeError`` naming ``name``: a string (``"no"`` is true to e3nn-jax), ``None``, another number
    or array, or a traced value (no truth at trace time)."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"{name} must be a static bool, got a traced {value.aval}")
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    is_flag_array = isinstance(value, (np.ndarray, jax.Array)) and value.shape == () and value.dtype.kind in "biu"
    if (is_int(value) or is_flag_array) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name} must be a bool (or 0 / 1), got {value!r}")


def check_host_index(name: str, index, low: int, high: int, meaning: str, mask=None) -> None:
    """A concrete integer ``index`` (its entries where ``mask``, if given) must lie in ``[low, high)``:
    JAX's indexing clamps one outside (a negative one wraps first), silently. Traced values cannot be
    read (inside ``jit``) and are left to that indexing. ``meaning`` says what the range is."""
    if isinstance(index, jax.core.Tracer) or isinstance(mask, jax.core.Tracer):
        return
    values = np.asarray(index)
    if mask is not None:
        values = values[np.asarray(mask)]
    bad = (values < low) | (values >= high)
    if bad.any():
        raise ValueError(f"{name} must be in [{low}, {high}) ({meaning}), got {int(values[bad].flat[0])}")


def check_edges_in_range(senders: np.ndarray, receivers: np.ndarray, mask: np.ndarray, num_nodes: int) -> None:
    """Every non-padding edge's sender and receiver (host arrays) must be a node id in
    ``[0, num_nodes)``; the error names the first such edge, which end, and how many are out."""
    in_range = (senders >= 0) & (senders < num_nodes) & (receivers >= 0) & (receivers < num_nodes)
    bad = np.flatnonzero(mask & ~in_range)
    if bad.size:
        e = int(bad[0])
        which = "senders" if not 0 <= senders[e] < num_nodes else "receivers"
        value = int((senders if which == "senders" else receivers)[e])
        raise ValueError(
            f"{which}[{e}] = {value} is out of range for num_nodes={num_nodes} "
            f"({bad.size} non-padding edge(s) out of range)"
        )


def check_index_count(name: str, count: int, what: str) -> None:
    """``count`` nodes or edges must be indexable with int32 (a larger count wrapped silently)."""
    if count > MAX_INDEX_COUNT:
        raise ValueError(
            f"{name}: {count} {what} exceed the int32 indices of e3j's graphs and kernels (at most "
            f"2**31 - 1 = {MAX_INDEX_COUNT}); split the graph"
        )


def static_size(size, what: str, per: str = "padded size (e.g. a padding bucket)") -> int:
    """An axis length as an int; a symbolic one (``jax.export`` shape polymorphism) refused, naming
    ``what`` and what to export one function per, where JAX's error would name neither."""
    if isinstance(size, (bool, np.bool_, float, str, bytes, np.ndarray, type(None))):
        raise TypeError(f"{what} must be an int, got {size!r}")
    if not isinstance(size, (int, np.integer)):
        raise ValueError(
            f"{what} has the symbolic size {size}: e3j's kernels and sweeps need static node, edge and "
            f"channel counts. Export one function per {per} instead of a shape-polymorphic one"
        )
    return int(size)


def check_same_dtype(**arrays) -> jnp.dtype:
    dtypes = {name: float_dtype(name, a) for name, a in arrays.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{n}: {d}" for n, d in dtypes.items())
        raise TypeError(f"operands must share one floating dtype, got {listed}")
    return next(iter(dtypes.values()))


def edge_arrays(xp, senders, receivers, edge_mask):
    """``senders``, ``receivers`` (integer ``[E]``) and ``edge_mask`` (bool ``[E]``, all True for
    ``None``) as ``xp`` arrays, checked: a wrong dtype is a ``TypeError``, a wrong shape a
    ``ValueError``, each naming its argument. Empty lists are taken (``np.asarray([])`` is float64)."""
    arrays = {}
    for name, a, dtype in (("senders", senders, xp.int32), ("receivers", receivers, xp.int32),
                           ("edge_mask", edge_mask, bool)):  # fmt: skip
        if a is None:
            if name == "edge_mask":
                continue
            raise TypeError(f"{name} must be an integer array [E], got None")
        a = xp.asarray(a)
        arrays[name] = a.astype(dtype) if a.size == 0 and a.ndim == 1 else a
    senders, receivers = arrays["senders"], arrays["receivers"]
    for name, a in (("senders", senders), ("receivers", receivers)):
        if a.ndim != 1:
            raise ValueError(f"{name} must be 1-D [E], got shape {a.shape}")
        if not jnp.issubdtype(a.dtype, jnp.integer):
            raise TypeError(f"{name} must have an integer dtype, got {a.dtype}")
    if senders.shape != receivers.shape:
        raise ValueError(f"senders {senders.shape} and receivers {receivers.shape} must have one shape")
    num_edges = senders.shape[0]
    if isinstance(num_edges, (int, np.integer)):  # a symbolic size is refused by the callers
        check_index_count("senders", num_edges, "edges")
    if "edge_mask" not in arrays:
        return senders, receivers, xp.ones((num_edges,), bool)
    mask = arrays["edge_mask"]
    if mask.dtype != bool:
        raise TypeError(f"edge_mask must be bool [{num_edges}], got dtype {mask.dtype}")
    if mask.shape != (num_edges,):
        raise ValueError(f"edge_mask must be bool [{num_edges}], got shape {mask.shape}")
    return senders, receivers, mask
