"""Unroll or walk: how a kernel of this package evaluates a COO table, and the record walk itself.

Small tables are unrolled into the program at trace time (``CooTable.contract``): no coefficient or
index is read at run time. The program grows with the number of records (about l^5), and with it
Mosaic's compile time and the vector registers it spills into VMEM (the paper measures about 9 MiB
of spills at lmax 3, 128 channels, of a TensorCore's 16 MiB). Tables above
:data:`~e3j_pallas_tpu.backend.UNROLL_RECORDS` are *walked*: their records — a CSR row pointer over
the output rows, the other slots' indices and the coefficients — are scalar-prefetched into SMEM, and
a loop over output rows and each row's records gathers operand rows by index. A dynamic index must
fall on an untiled (leading) axis of a VMEM array, so the operand tiles ``[B, D, Cq]`` are first
copied row by row into ``[D, B, Cq]`` buffers and the results copied back: ``O(D)`` statements,
not ``O(records)``, and the walked program does not grow with the table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from e3j_core import CooTable

from .backend import UNROLL_RECORDS

#: Mosaic's SMEM holds 32-bit words; coefficients are float32 (the kernels' only dtype).
COEFFICIENT_DTYPE = np.float32


def unrolls(table: CooTable) -> bool:
    """Whether the kernels unroll ``table`` (else they walk its records)."""
    return table.num_records <= UNROLL_RECORDS


def records(table: CooTable) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(row_offsets int32 [rows + 1], indices int32 [N · arity], coefficients float32 [N])``.

    ``indices[r · arity + k]`` is record ``r``'s slot ``k + 1`` (slot 0, the output row, is implied by
    ``row_offsets``); one-dimensional, as SMEM pads the minor axes of two-dimensional arrays.

    >>> from e3j_core import tensor_product_coo
    >>> table = tensor_product_coo("1o", "1o", filter="0e + 1e").table  # 4 output rows, 9 records
    >>> unrolls(table), [a.shape for a in records(table)], smem_bytes(table)
    (True, [(5,), (18,), (9,)], 128)
    """
    return (
        jnp.asarray(table.row_offsets),
        jnp.asarray(np.ascontiguousarray(table.indices[1:].T).reshape(-1)),
        jnp.asarray(table.coefficients, COEFFICIENT_DTYPE),
    )


def smem_bytes(*tables: CooTable) -> int:
    """SMEM taken by the :func:`records` of ``tables`` (32-bit words)."""
    return 4 * sum(t.dims[0] + 1 + t.num_records * len(t.dims) for t in tables)


def to_rows(block_ref, rows_ref, *, channels: bool = True) -> None:
    """Copy a ``[B, D, Cq]`` (or broadcast ``[B, D]``) tile into ``rows_ref [D, B, Cq]``, row by row."""
    for i in range(rows_ref.shape[0]):
        v = block_ref[:, i, :] if channels else block_ref[:, i][:, None]
        rows_ref[i] = jnp.broadcast_to(v, rows_ref.shape[1:]).astype(rows_ref.dtype)


def from_rows(rows_ref, block_ref, *, reduce_lanes: bool = False, mask=None) -> None:
    """Copy ``rows_ref [D, B, Cq]`` into a ``[B, D, Cq]`` tile (``[B, D]`` summed over lanes), row by row,
    zeroing the batch rows where ``mask [B, 1]`` is false."""
    for i in range(rows_ref.shape[0]):
        v = rows_ref[i]
        if mask is not None:
            v = jnp.where(mask, v, 0)
        if reduce_lanes:
            block_ref[:, i] = jnp.sum(v, axis=1).astype(block_ref.dtype)
        else:
            block_ref[:, i, :] = v.astype(block_ref.dtype)


def walk_rows(table_refs: Sequence, operands: Sequence, out_rows_ref, *, row_scale: Callable | None = None) -> None:
    """``out_rows_ref[i] = row_scale(i) · Σ_r c_r · Π_k operands[k][i_{k+1,r}]`` for every row ``i``.

    ``table_refs`` are the SMEM refs of :func:`records`, ``operands[k]`` a ``[D_k, B, Cq]`` VMEM ref,
    ``out_rows_ref [D_0, B, Cq]``. Records are added in table order: the same result on every run.
    """
    offsets_ref, indices_ref, coefficients_ref = table_refs
    arity = len(operands)
    zero = jnp.zeros(out_rows_ref.shape[1:], out_rows_ref.dtype)

    def row(i, carry):
        def record(r, acc):
            term = coefficients_ref[r]
            for k, op in enumerate(operands):
                term = term * op[indices_ref[r * arity + k]]
            return acc + term

        v = jax.lax.fori_loop(offsets_ref[i], offsets_ref[i + 1], record, zero)
        out_rows_ref[i] = v if row_scale is None else row_scale(i) * v
        return carry

    jax.lax.fori_loop(jnp.int32(0), jnp.int32(out_rows_ref.shape[0]), row, jnp.int32(0))
