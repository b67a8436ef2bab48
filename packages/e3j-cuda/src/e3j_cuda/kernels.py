"""The kernel functions of the ``cuda``, ``cuda_host`` and ``cuda_simt`` backends: ``jax.ffi.ffi_call`` wrappers.

Operands arrive as e3j's kernel contract (``e3j.contract``) gives them: one dtype, non-empty, the
operands ``outs`` does not read as ``None``. The COO tables travel as operands: e3j-core's packed
records (as raw bytes) and a CSR row pointer over their output index; both are small numpy constants
built once per table and dtype. ``None`` operands and unwanted results are 0-size placeholders,
skipped by the handlers. ``target`` is the name prefix of the FFI targets to call (``"e3j"``;
``"e3j_host"``/``"e3j_simt"`` for the CPU builds).

Layouts are e3j's: ``x [B|N, Dx, C]``, ``y [B|E, Dy]`` or ``[B|E, Dy, C]``, ``s [E, P, C]``. The
convolution handlers read the weights (and write their cotangent) as a 2-D ``[E, W]`` array in which
path ``p``'s ``C`` weights are the columns ``s_cols[p] .. s_cols[p] + C - 1`` (an int32 operand):
``s [E, P, C]`` reshaped (``s_cols[p] = p·C``), or e3nn's ``[E, num_weights]`` as it is. So the
grouped kernels (:func:`grouped_convolution`, :func:`grouped_convolution_bwd`) run a
mixed-multiplicity plan as one launch per group on e3nn's weights in place: each group's backward
writes its columns of one ``[E, num_weights]`` cotangent, aliased from launch to launch
(``input_output_aliases``), and only the node-sized features and outputs are split and joined.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from e3j_core import CooTable, TensorProductCoo

__all__ = [
    "convolution",
    "convolution_bwd",
    "grouped_convolution",
    "grouped_convolution_bwd",
    "tensor_product",
    "tensor_product_bwd",
]


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


#: CUDA's limit on a grid's x dimension: the kernels launch one thread block per row of a tensor
#: product and per node of a convolution, whose backward adds blocks that clear padding edges (at
#: most MAX_CLEARING_BLOCKS: csrc/ffi_cuda.cu's kMaxClearingBlocks)
MAX_GRID_X, MAX_CLEARING_BLOCKS = 2**31 - 1, 1024


def _check_grid(blocks: int, what: str) -> None:
    # the handlers cast the count to the grid's unsigned int: past 2**32 it would wrap, silently. A
    # symbolic batch (jax.export) is checked by no one before the call: the handler sees its value
    if isinstance(blocks, (int, np.integer)) and blocks > MAX_GRID_X:
        raise ValueError(
            f"e3j_cuda: {what} need {blocks} thread blocks, over CUDA's grid limit of 2**31 - 1 = "
            f"{MAX_GRID_X}; split the batch, or run it on another backend (e.g. backend='pallas_gpu')"
        )


def _shape(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def tensor_product(
    coo: TensorProductCoo, x: jax.Array, y: jax.Array, *, y_channels: bool, target: str = "e3j"
) -> jax.Array:
    """``z = x ⊗ y``: ``[B, Dx, C]``, ``[B, Dy(, C)]`` → ``[B, Dout, C]``."""
    dtype = x.dtype
    batch, _, channels = x.shape
    _check_grid(batch, f"a tensor product of {batch} rows")
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
    _check_grid(batch, f"a tensor product of {batch} rows")
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


def _path_columns(num_paths: int, channels: int) -> np.ndarray:
    """The weight columns of ``s [E, P, C]`` viewed as ``[E, P·C]``: path ``p`` starts at ``p·C``."""
    return np.arange(0, num_paths * channels, channels, dtype=np.int32)


def convolution(coo: TensorProductCoo, x, y, s, graph, *, y_channels: bool, target: str = "e3j") -> jax.Array:
    """``m_b = Σ_{a→b} s_ab · (x_a ⊗ y_ab)`` by a CSR loop over each receiver's edges."""
    channels = x.shape[-1]
    s2 = s.reshape(s.shape[0], coo.num_paths * channels)  # free: row-major
    return _forward(coo, x, y, s2, _path_columns(coo.num_paths, channels), graph, y_channels, target)


def _forward(coo: TensorProductCoo, x, y, s2, cols: np.ndarray, graph, y_channels: bool, target: str) -> jax.Array:
    """``m [N, Dout, C]`` from ``x [N, Dx, C]``, ``y`` and the 2-D weights ``s2 [E, W]`` (columns ``cols``)."""
    dtype = x.dtype
    num_nodes, _, channels = x.shape
    _check_grid(num_nodes, f"a convolution over {num_nodes} nodes")
    call = jax.ffi.ffi_call(f"{target}_conv_fwd", _shape((num_nodes, coo.dim_out, channels), dtype))
    return call(
        *_table(coo.table, dtype),
        _i3(coo),
        jnp.asarray(cols, jnp.int32),
        graph.receiver_offsets,
        graph.order,
        graph.senders,
        x,
        y,
        s2,
        index_bytes=_index_bytes(coo),
        y_channels=bool(y_channels),
    )


def convolution_bwd(
    coo: TensorProductCoo, x, y, s, dm, graph, *, outs, y_channels: bool, target: str = "e3j"
) -> dict[str, jax.Array]:
    """Cotangents for ``outs ⊆ {x, y, s}`` in one sender-ordered sweep (``dx`` without atomics)."""
    num_edges, channels = graph.senders.shape[0], dm.shape[-1]
    width = coo.num_paths * channels
    s2 = s.reshape(num_edges, width) if s is not None else None
    cols = _path_columns(coo.num_paths, channels)
    res = _backward(coo, x, y, s2, dm, graph, cols, width, None, outs, y_channels, target)
    if "s" in res:
        res["s"] = res["s"].reshape(num_edges, coo.num_paths, channels)
    return res


def _backward(
    coo: TensorProductCoo, x, y, s2, dm, graph, cols: np.ndarray, width: int, ds_into, outs, y_channels: bool,
    target: str,
) -> dict[str, jax.Array]:  # fmt: skip
    """:func:`convolution_bwd` on 2-D weights ``s2 [E, width]`` (columns ``cols``); ``ds`` is
    ``[E, width]`` with only the paths' columns written: into ``ds_into`` (aliased, its other columns
    kept) when given, else into a fresh buffer whose other columns are undefined."""
    want = {o: o in outs for o in ("x", "y", "s")}
    dtype = dm.dtype
    num_nodes, _, channels = dm.shape
    num_edges = graph.senders.shape[0]
    _check_grid(num_nodes + MAX_CLEARING_BLOCKS, f"a convolution's backward over {num_nodes} nodes (and its clearing)")
    shapes = {
        "x": (num_nodes, coo.dim_x, channels),
        "y": (num_edges, coo.dim_y, channels) if y_channels else (num_edges, coo.dim_y),
        "s": (num_edges, width),
    }
    operands = [
        *_table(coo.table, dtype),
        *_table(coo.vjp_x, dtype),
        *_table(coo.vjp_y, dtype),
        _i3(coo),
        jnp.asarray(cols, jnp.int32),
        graph.sender_offsets,
        graph.sender_order,
        graph.receivers,
        graph.num_valid.reshape(1),
        _operand(x, dtype),
        _operand(y, dtype),
        _operand(s2, dtype),
        dm,
        _operand(ds_into if want["s"] else None, dtype),
    ]
    # the handler never reads ds_into: its buffer becomes ds's, the other groups' columns kept
    aliases = {len(operands) - 1: 2} if want["s"] and ds_into is not None else None
    call = jax.ffi.ffi_call(
        f"{target}_conv_bwd",
        tuple(_shape(shapes[o] if want[o] else (0,), dtype) for o in ("x", "y", "s")),
        input_output_aliases=aliases,
    )
    results = call(
        *operands,
        index_bytes=_index_bytes(coo),
        y_channels=bool(y_channels),
        want_x=want["x"],
        want_y=want["y"],
        want_s=want["s"],
    )
    return {o: r for o, r in zip(("x", "y", "s"), results, strict=True) if want[o]}


# -- mixed multiplicities: the groups of an e3nn plan, weights read in place ---------------------
# (the loop over the groups is the plan's: forward_by_group / backward_by_group)


def grouped_convolution(plan, x: jax.Array, y: jax.Array, s: jax.Array, graph, *, target: str = "e3j") -> jax.Array:
    """Every group of ``plan`` (an ``e3j`` mixed-multiplicity plan):
    ``x [N, Dx_flat]``, ``y [E, Dy]``, ``s [E, num_weights]`` (e3nn's order) → ``m [N, Dout_flat]``.

    One launch per group, each reading its paths' columns of ``s`` where they are; the node features
    are split into the groups' ``[N, Dx_g, C_g]`` and the outputs joined into e3nn's layout around them.
    """

    def launch(g, xg):
        return _forward(g.coo, xg, y, s, np.asarray(g.weight_columns, np.int32), graph, False, target)

    return plan.forward_by_group(x, launch)


def grouped_convolution_bwd(
    plan, x, y, s, dm, graph, *, outs: tuple[str, ...], target: str = "e3j"
) -> dict[str, jax.Array]:
    """Cotangents of :func:`grouped_convolution` for ``outs ⊆ {x, y, s}``, in its layouts.

    ``ds [E, num_weights]`` is one buffer that each group's launch writes its columns of, in place
    (every column belongs to exactly one group's path, so together they write all of it).
    """

    def launch(g, xg, dmg, ds):
        cols = np.asarray(g.weight_columns, np.int32)
        return _backward(g.coo, xg, y, s, dmg, graph, cols, plan.num_weights, ds, outs, False, target)

    return plan.backward_by_group(x, dm, outs, launch)
