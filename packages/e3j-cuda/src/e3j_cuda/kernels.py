"""The kernel functions of the ``cuda``, ``cuda_host`` and ``cuda_simt`` backends: ``jax.ffi.ffi_call`` wrappers.

Operands arrive as e3j's kernel contract (``e3j.contract``) gives them: one dtype, non-empty, the
operands ``outs`` does not read as ``None``. The COO tables travel as operands: e3j-core's packed
records (as raw bytes) and a CSR row pointer over their output index; both are small numpy constants
built once per table and dtype. ``None`` operands and unwanted results are 0-size placeholders,
skipped by the handlers. ``target`` is the name prefix of the FFI targets to call (``"e3j"``;
``"e3j_host"``/``"e3j_simt"`` for the CPU builds).

Layouts are e3j's: ``x [B|N, Dx, C]``, ``y [B|E, Dy]`` or ``[B|E, Dy, C]``, ``s [E, P, C]``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from e3j_core import CooTable, TensorProductCoo

__all__ = ["convolution", "convolution_bwd", "tensor_product", "tensor_product_bwd"]


@functools.lru_cache(maxsize=512)
def _table_arrays(table: CooTable, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    records = np.frombuffer(table.packed(np.dtype(dtype)).tobytes(), np.uint8)
    rowptr = np.searchsorted(table.i0, np.arange(table.dims[0] + 1), side="left").astype(np.int32)
    return records, rowptr


def _table(table: CooTable, dtype) -> list[jax.Array]:
    records, rowptr = _table_arrays(table, jnp.dtype(dtype).name)
    return [jnp.asarray(records), jnp.asarray(rowptr)]


def _index_bytes(coo: TensorProductCoo) -> np.int64:
    return np.int64(coo.table.index_dtype.itemsize)


def _operand(a: jax.Array | None, dtype) -> jax.Array:
    """``a``, or the 0-size placeholder the handlers skip when the contract gives ``None``."""
    return jnp.zeros((0,), dtype) if a is None else a


def _shape(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def tensor_product(
    coo: TensorProductCoo, x: jax.Array, y: jax.Array, *, y_channels: bool, target: str = "e3j"
) -> jax.Array:
    """``z = x ⊗ y``: ``[B, Dx, C]``, ``[B, Dy(, C)]`` → ``[B, Dout, C]``."""
    dtype = x.dtype
    batch, _, channels = x.shape
    call = jax.ffi.ffi_call(f"{target}_tp_fwd", _shape((batch, coo.dim_out, channels), dtype))
    return call(
        *_table(coo.table, dtype),
        x,
        y,
        index_bytes=_index_bytes(coo),
        y_channels=bool(y_channels),
    )


def tensor_product_bwd(
    coo: TensorProductCoo,
    x: jax.Array | None,
    y: jax.Array | None,
    dz: jax.Array,
    *,
    outs,
    y_channels: bool,
    target: str = "e3j",
) -> dict[str, jax.Array]:
    """``dx = vjp_x(y, dz)`` and/or ``dy = vjp_y(x, dz)`` in one pass over ``dz``."""
    want_x, want_y = "x" in outs, "y" in outs
    dtype = dz.dtype
    batch, _, channels = dz.shape
    dy_shape = (batch, coo.dim_y, channels) if y_channels else (batch, coo.dim_y)
    call = jax.ffi.ffi_call(
        f"{target}_tp_bwd",
        (
            _shape((batch, coo.dim_x, channels) if want_x else (0,), dtype),
            _shape(dy_shape if want_y else (0,), dtype),
        ),
    )
    dx, dy = call(
        *_table(coo.vjp_x, dtype),
        *_table(coo.vjp_y, dtype),
        _operand(x, dtype),
        _operand(y, dtype),
        dz,
        index_bytes=_index_bytes(coo),
        y_channels=bool(y_channels),
        want_x=bool(want_x),
        want_y=bool(want_y),
    )
    return {k: v for k, v, want in (("x", dx, want_x), ("y", dy, want_y)) if want}


def _i3(coo: TensorProductCoo) -> jax.Array:
    i3 = np.asarray(coo.i3, np.int32)
    # the convolution backward splits ds's rows at path boundaries: a path's rows must be contiguous
    if np.any(np.diff(i3) < 0):
        raise ValueError("e3j_cuda: the table's paths are not in output order (e3j-core lists them so)")
    return jnp.asarray(i3)


def convolution(coo: TensorProductCoo, x, y, s, graph, *, y_channels: bool, target: str = "e3j") -> jax.Array:
    """``m_b = Σ_{a→b} s_ab · (x_a ⊗ y_ab)`` by a CSR loop over each receiver's edges."""
    dtype = x.dtype
    num_nodes, _, channels = x.shape
    call = jax.ffi.ffi_call(f"{target}_conv_fwd", _shape((num_nodes, coo.dim_out, channels), dtype))
    return call(
        *_table(coo.table, dtype),
        _i3(coo),
        graph.receiver_offsets,
        graph.order,
        graph.senders,
        x,
        y,
        s,
        index_bytes=_index_bytes(coo),
        y_channels=bool(y_channels),
    )


def convolution_bwd(
    coo: TensorProductCoo, x, y, s, dm, graph, *, outs, y_channels: bool, target: str = "e3j"
) -> dict[str, jax.Array]:
    """Cotangents for ``outs ⊆ {x, y, s}`` in one sender-ordered sweep (``dx`` without atomics)."""
    want = {o: o in outs for o in ("x", "y", "s")}
    dtype = dm.dtype
    num_nodes, _, channels = dm.shape
    num_edges = graph.senders.shape[0]
    shapes = {
        "x": (num_nodes, coo.dim_x, channels),
        "y": (num_edges, coo.dim_y, channels) if y_channels else (num_edges, coo.dim_y),
        "s": (num_edges, coo.num_paths, channels),
    }
    call = jax.ffi.ffi_call(
        f"{target}_conv_bwd", tuple(_shape(shapes[o] if want[o] else (0,), dtype) for o in ("x", "y", "s"))
    )
    results = call(
        *_table(coo.table, dtype),
        *_table(coo.vjp_x, dtype),
        *_table(coo.vjp_y, dtype),
        _i3(coo),
        graph.sender_offsets,
        graph.sender_order,
        graph.receivers,
        graph.num_valid.reshape(1),
        _operand(x, dtype),
        _operand(y, dtype),
        _operand(s, dtype),
        dm,
        index_bytes=_index_bytes(coo),
        y_channels=bool(y_channels),
        want_x=want["x"],
        want_y=want["y"],
        want_s=want["s"],
    )
    return {o: r for o, r in zip(("x", "y", "s"), results, strict=True) if want[o]}
