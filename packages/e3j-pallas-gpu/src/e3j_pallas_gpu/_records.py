"""Unroll or walk: how a kernel of this package evaluates a COO table, and the record walk itself.

Small tables are unrolled into the program at trace time (``CooTable.contract``): no coefficient or
index is read at run time. The program grows with the number of records (about l^5), and so do
Triton's compile time and register pressure: at lmax 3 (353 records) the unrolled convolution
kernels already sit at the 255-register limit on sm_90a (float64 spills) and the backward takes
65 s to compile (``benchmarks/results/sm90a-pallas-gpu-resources.json``). Larger tables are
*walked*, as the CUDA kernels do: the records are kernel operands — a CSR row pointer over the
output rows, the other slots' indices and the coefficients — and a loop over each output row's
records gathers operand rows by index. The walked program does not grow with the table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from e3j_core import CooTable

from .backend import UNROLL_RECORDS


def unrolls(table: CooTable) -> bool:
    """Whether the kernels unroll ``table`` (else they walk its records)."""
    return table.num_records <= UNROLL_RECORDS


def records(table: CooTable, dtype) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(row_offsets int32 [rows + 1], indices int32 [arity, N], coefficients dtype [N])`` of ``table``.

    ``indices[k]`` is slot ``k + 1`` (slot 0, the output row, is implied by ``row_offsets``).

    >>> from e3j_core import tensor_product_coo
    >>> table = tensor_product_coo("1o", "1o", filter="0e + 1e").table  # 4 output rows, 9 records
    >>> unrolls(table), [a.shape for a in records(table, "float32")]
    (True, [(5,), (2, 9), (9,)])
    """
    return (
        jnp.asarray(table.row_offsets),
        jnp.asarray(np.ascontiguousarray(table.indices[1:])),
        jnp.asarray(table.coefficients, dtype),
    )


def walk_row(row, recs: Sequence[Any], operands: Sequence[Callable[[Any], Any]], zero):
    """``Σ_r c_r · Π_k operands[k](i_{k+1,r})`` over the records of output row ``row`` (a traced int).

    ``recs`` are the refs of :func:`records`; ``operands[k](i)`` loads row ``i`` of operand ``k``.
    Records are added in table order, so the result is the same on every run.
    """
    offsets_ref, indices_ref, coefficients_ref = recs

    def record(r, acc):
        term = coefficients_ref[r]
        for k, load in enumerate(operands):
            term = term * load(indices_ref[k, r])
        return acc + term

    return jax.lax.fori_loop(offsets_ref[row], offsets_ref[row + 1], record, zero)
