"""Reference (pure JAX) tensor-product kernels: trace-time unrolled sparse contractions.

Two formulations, chosen per call:

- all operands carry channels: every record of the COO table becomes one multiply-add in the
  traced program; records that share ``(i0, i1)`` factor ``a[i1]`` out of their sum (paper
  Algorithm 5's grouping), and XLA fuses the whole thing into one pass over memory;
- one operand is broadcast over channels (spherical harmonics, or a cotangent summed over
  channels): the broadcast operand is first contracted with the (small, dense) table into a
  per-row ``[D_out, D_in]`` matrix, then one batched matrix product does the channel work. This is
  how the work is memory-bound on CPUs, and it compiles in constant time. Exception: a small table
  whose dense matrices would be mostly zeros for the channels' work (many copies of the ``x``
  irreps, or few channels) is unrolled as above, which is faster there, forward and backward.

Every formulation reads only the operand components some record reads (the dense one slices the
others out with the table): a non-finite value in a component no product uses stays out of the
result, as in e3nn-jax, which never reads a block whose products its filter drops.

Layouts: operands ``[B, D]`` (broadcast over channels) or ``[B, D, C]``; the output has channels
when requested, and is summed over channels otherwise (the cotangent of a broadcast operand).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from e3j_core import CooTable, TensorProductCoo

__all__ = ["apply_table", "tensor_product", "tensor_product_bwd"]


def _row(a: jnp.ndarray, i: int, channels: bool, want_channels: bool) -> jnp.ndarray:
    r = a[:, i]
    return r[:, None] if (want_channels and not channels) else r


def apply_table(
    table: CooTable,
    a: jnp.ndarray,
    b: jnp.ndarray,
    *,
    a_channels: bool,
    b_channels: bool,
    out_channels: bool,
) -> jnp.ndarray:
    """``out[:, i0] = Σ_r c_r a[:, i1_r] b[:, i2_r]`` for a bilinear :class:`CooTable`."""
    if table.arity != 2:
        raise ValueError(f"apply_table needs a bilinear table, got arity {table.arity}")
    if out_channels and not (a_channels or b_channels):
        raise ValueError("an output with channels needs an operand with channels")
    mixed = not (a_channels and b_channels and out_channels)
    channels = a.shape[-1] if a_channels else (b.shape[-1] if b_channels else 1)
    form = (a_channels, b_channels, out_channels)
    dense = math.prod(table.dims) <= _DENSE_LIMIT and not _unrolling_pays(table, channels, form)
    if mixed and (a_channels or b_channels) and dense:
        return _apply_dense(table, a, b, a_channels=a_channels, b_channels=b_channels, out_channels=out_channels)
    if table.num_records > _UNROLL_LIMIT:
        return _apply_gathered(table, a, b, a_channels=a_channels, b_channels=b_channels, out_channels=out_channels)
    any_channels = a_channels or b_channels
    dtype = jnp.result_type(a, b)
    batch = a.shape[0]
    channel_shape = (a.shape[-1],) if a_channels else ((b.shape[-1],) if b_channels else ())
    rows = table.contract(
        lambda i: _row(a, i, a_channels, any_channels), lambda i: _row(b, i, b_channels, any_channels)
    )
    zero = jnp.zeros((batch, *channel_shape), dtype)
    out = jnp.stack([rows.get(i0, zero) for i0 in range(table.dims[0])], axis=1)
    if any_channels and not out_channels:
        out = out.sum(-1)
    return out


# Unrolling costs compile time per record (~2-10 ms on a small CPU); beyond this many records the
# gathered formulation below compiles in constant time.
_UNROLL_LIMIT = 2048
_GATHER_TILE = 16


def _apply_gathered(table: CooTable, a, b, *, a_channels: bool, b_channels: bool, out_channels: bool):
    """All records at once per batch row: gather, multiply, segment-sum over ``i0``.

    Batch rows go through ``lax.map`` in tiles so the ``[tile, records, C]`` products stay small.
    An operand without channels is broadcast over the other's: a large table (full lmax-6
    products, 21,762 records) with spherical harmonics as ``b`` unrolled took minutes to compile.
    """
    dtype = jnp.result_type(a, b)
    i0, i1, i2 = (jnp.asarray(i) for i in table.indices)
    c = jnp.asarray(table.coefficients, dtype)
    d0 = table.dims[0]
    any_channels = a_channels or b_channels

    def row(ab):
        a_r, b_r = ab  # [D1(, C)], [D2(, C)]
        pa, pb = a_r[i1], b_r[i2]
        if any_channels:
            pa = pa if a_channels else pa[:, None]
            pb = pb if b_channels else pb[:, None]
        products = pa * pb * (c[:, None] if any_channels else c)
        out = jax.ops.segment_sum(products, i0, num_segments=d0, indices_are_sorted=True)
        return out if out_channels or not any_channels else out.sum(-1)

    return jax.lax.map(row, (a, b), batch_size=_GATHER_TILE)


# A call with a broadcast operand stays unrolled when the dense formulation would do at least
# _UNROLL_SPARSITY times the records' multiply-adds (its matrices mostly zeros for the channels'
# work), for tables of at most _UNROLL_BROADCAST_LIMIT records, or _UNROLL_LIMIT where the dense
# one would do _UNROLL_SPARSITY_LARGE times their work: unrolling compiles in ~2-10 ms a record on a
# small CPU, which a large gain repays. On a 2-core CPU (benchmarks/reference_broadcast_forms.py,
# float32, 400 and 4,000 rows; the table in docs/reference-cpu.md): at 13x (4x0e + 2x1o + 1x2e ⊗
# 0e..3o, 16 channels) unrolled took 0.4-1.04x the dense time, at 38x and 67x (one or two channels)
# 0.06-0.4x except one forward at 400 rows (1.2x); at 1.6-4.5x (one to three x irreps, 16-64
# channels) the dense one took 0.37-2.35x the unrolled time, under 1 in 20 of 24 rows.
_UNROLL_SPARSITY = 8
_UNROLL_BROADCAST_LIMIT = 512
_UNROLL_SPARSITY_LARGE = 32


def _dense_work(dims: tuple[int, ...], channels: int, form: tuple[bool, bool, bool]) -> int:
    """Multiply-adds per row of :func:`_contract_dense` (``form``: which of ``a``, ``b`` and the
    output have channels)."""
    d0, d1, d2 = dims
    a_channels, b_channels, _ = form
    if a_channels and b_channels:  # the channel sum G [D1, D2], then G with the table
        return d1 * d2 * channels + d0 * d1 * d2
    # the per-row matrix [D0, D_with_channels], then its product with the channels
    return d0 * d1 * d2 + d0 * (d1 if a_channels else d2) * channels


def _unrolling_pays(table: CooTable, channels: int, form: tuple[bool, bool, bool]) -> bool:
    records = table.num_records
    if records > _UNROLL_LIMIT:
        return False
    sparsity = _UNROLL_SPARSITY if records <= _UNROLL_BROADCAST_LIMIT else _UNROLL_SPARSITY_LARGE
    return _dense_work(table.dims, channels, form) >= sparsity * records * channels


# dense tables up to this many entries (lmax 3 with the usual filter: 99 x 16 x 16 = 25,344)
_DENSE_LIMIT = 2**22


def _read(indices: np.ndarray) -> slice | np.ndarray:
    """The components of an operand axis that ``indices`` (a table's records) read: a slice when
    they are contiguous (every one, usually), else their sorted indices."""
    used = np.unique(indices)
    if used.size and used[-1] - used[0] + 1 == used.size:
        return slice(int(used[0]), int(used[-1]) + 1)
    return used if used.size else slice(0, 0)


# The reference is the ground truth: float32 products in full float32 on every device. JAX's default
# precision lets a GPU use TF32 (~1e-3 relative; seen on the H200) and a TPU bfloat16 passes.
_EXACT = jax.lax.Precision.HIGHEST


def _apply_dense(table, a, b, *, a_channels, b_channels, out_channels):
    # components no record reads are sliced out, not multiplied by the dense table's zeros (0 * NaN)
    _, i1, i2 = table.indices
    r1, r2 = _read(i1), _read(i2)
    T = table.dense()[:, r1][:, :, r2]
    a, b = a[:, r1], b[:, r2]
    return _contract_dense(jnp.asarray(T, jnp.result_type(a, b)), a, b, a_channels, b_channels, out_channels)


def _contract_dense(T, a, b, a_channels, b_channels, out_channels):
    """``apply_table`` with the dense table ``T [D0, D1, D2]``."""
    if out_channels and a_channels and not b_channels:
        W = jnp.einsum("bk,ijk->bij", b, T, precision=_EXACT)
        return jnp.einsum("bij,bjc->bic", W, a, precision=_EXACT)
    if out_channels and b_channels and not a_channels:
        W = jnp.einsum("bj,ijk->bik", a, T, precision=_EXACT)
        return jnp.einsum("bik,bkc->bic", W, b, precision=_EXACT)
    if not out_channels and a_channels and b_channels:
        G = jnp.einsum("bjc,bkc->bjk", a, b, precision=_EXACT)
        return jnp.einsum("bjk,ijk->bi", G, T, precision=_EXACT)
    if not out_channels and a_channels != b_channels:
        return _contract_dense(T, a, b, a_channels, b_channels, True).sum(-1)
    raise AssertionError("unreachable")


def tensor_product(coo: TensorProductCoo, x: jnp.ndarray, y: jnp.ndarray, *, y_channels: bool) -> jnp.ndarray:
    """``z = x ⊗ y``: ``x [B, Dx, C]``, ``y [B, Dy(, C)]`` → ``[B, Dout, C]``."""
    return apply_table(coo.table, x, y, a_channels=True, b_channels=y_channels, out_channels=True)


def tensor_product_bwd(
    coo: TensorProductCoo,
    x: jnp.ndarray | None,
    y: jnp.ndarray | None,
    dz: jnp.ndarray,
    *,
    outs: tuple[str, ...],
    y_channels: bool,
) -> dict[str, jnp.ndarray]:
    """Cotangents ``dx = vjp_x(y, dz)`` and/or ``dy = vjp_y(x, dz)`` (paper Eq. 15)."""
    res = {}
    if "x" in outs:
        res["x"] = apply_table(coo.vjp_x, y, dz, a_channels=y_channels, b_channels=True, out_channels=True)
    if "y" in outs:
        res["y"] = apply_table(coo.vjp_y, x, dz, a_channels=True, b_channels=True, out_channels=y_channels)
    return res
