"""Reference (pure JAX) message-passing convolution kernels with bounded memory.

Edges are visited in receiver-sorted order (the graph's CSR order) in fixed-size chunks inside a
``fori_loop`` whose trip count is the number of *valid* edges, so padding edges cost nothing. Per
chunk the sender rows and edge operands are gathered, the messages ``s · (x ⊗ y)`` computed with the
unrolled tensor product, and summed into the receivers (sorted indices). Only one chunk of messages
``[chunk, D_out, C]`` ever exists, never the whole ``[E, D_out, C]`` array.

The backward sweep computes the requested cotangents in one pass over the same chunks (paper
Eq. 16): ``dx`` scatter-added by sender, ``dy`` and ``ds`` written per edge.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from e3j_core import TensorProductCoo

from .tensor_product import apply_table

__all__ = ["chunk_size", "convolution", "convolution_bwd"]

_CHUNK_BYTES = 16 * 2**20


def chunk_size(num_edges: int, row_elements: int, itemsize: int) -> int:
    """Edges per chunk so that one chunk of messages takes about 16 MiB."""
    return int(max(8, min(max(num_edges, 1), _CHUNK_BYTES // max(1, row_elements * itemsize))))


def _path_matrix(coo: TensorProductCoo, dtype) -> jnp.ndarray:
    """``[Dout, P]`` indicator of ``i3(i0) = p``: sums a row-wise product into per-path scalars."""
    m = np.zeros((coo.dim_out, coo.num_paths), dtype=np.float64)
    m[np.arange(coo.dim_out), coo.i3] = 1.0
    return jnp.asarray(m, dtype)


def _varying_axes(a) -> set:
    mat = getattr(jax.typeof(a), "mat", None)  # the aval's manual axis type (None outside shard_map)
    return set(getattr(mat, "varying", None) or ())


def _varying_like(carry, *operands):
    """``carry`` cast to vary over every manual mesh axis any operand varies over.

    Under ``shard_map`` (with its default ``check_vma=True``) a loop carry started from ``zeros`` is
    invariant while the loop body, which reads the sharded operands, returns a varying value; the
    loop then rejects the mismatch. Outside ``shard_map`` there are no such axes and nothing changes.
    """
    axes = set()
    for leaf in jax.tree.leaves(operands):
        axes |= _varying_axes(leaf)

    def cast(a):
        missing = tuple(sorted(axes - _varying_axes(a)))
        return jax.lax.pcast(a, missing, to="varying") if missing else a

    return jax.tree.map(cast, carry)


def _chunk_indices(graph, start, chunk, num_edges):
    k = start + jnp.arange(chunk, dtype=jnp.int32)
    valid = k < graph.num_valid
    e = graph.order[jnp.minimum(k, num_edges - 1)]
    return e, valid


def convolution(coo: TensorProductCoo, x, y, s, graph, *, y_channels: bool) -> jnp.ndarray:
    """``m_b = Σ_{a→b} s_ab · (x_a ⊗ y_ab)``: ``[N, Dx, C], [E, Dy(, C)], [E, P, C]`` → ``[N, Dout, C]``.

    Operands as the kernel contract (:mod:`e3j.contract`) gives them: one dtype, a non-empty graph.
    """
    num_nodes, channels = x.shape[0], x.shape[-1]
    num_edges = graph.num_edges
    dtype = x.dtype
    out = jnp.zeros((num_nodes, coo.dim_out, channels), dtype)
    chunk = chunk_size(num_edges, coo.dim_out * channels, dtype.itemsize)
    i3 = jnp.asarray(coo.i3)

    def body(i, out):
        e, valid = _chunk_indices(graph, i * chunk, chunk, num_edges)
        z = apply_table(coo.table, x[graph.senders[e]], y[e], a_channels=True, b_channels=y_channels, out_channels=True)
        msg = z * s[e][:, i3, :]
        msg = jnp.where(valid[:, None, None], msg, 0)
        # invalid slots go to row num_nodes (dropped), which keeps the indices sorted
        receivers = jnp.where(valid, graph.receivers[e], num_nodes)
        return out.at[receivers].add(msg, indices_are_sorted=True, mode="drop")

    trips = (graph.num_valid + chunk - 1) // chunk
    return jax.lax.fori_loop(0, trips, body, _varying_like(out, x, y, s, graph))


def convolution_bwd(coo: TensorProductCoo, x, y, s, dm, graph, *, outs: tuple[str, ...], y_channels: bool) -> dict:
    """Cotangents of the convolution for ``outs ⊆ {x, y, s}`` in one sweep (paper Eq. 16).

    Operands as the kernel contract (:mod:`e3j.contract`) gives them: the ones ``outs`` does not
    read are ``None``.
    """
    num_nodes, channels = dm.shape[0], dm.shape[-1]
    num_edges = graph.num_edges
    dtype = dm.dtype
    res = {}
    if "x" in outs:
        res["x"] = jnp.zeros((num_nodes, coo.dim_x, channels), dtype)
    if "y" in outs:
        res["y"] = jnp.zeros((num_edges, coo.dim_y, *((channels,) if y_channels else ())), dtype)
    if "s" in outs:
        res["s"] = jnp.zeros((num_edges, coo.num_paths, channels), dtype)
    chunk = chunk_size(num_edges, coo.dim_out * channels, dtype.itemsize)
    i3 = jnp.asarray(coo.i3)
    paths = _path_matrix(coo, dtype)

    def body(i, acc):
        e, valid = _chunk_indices(graph, i * chunk, chunk, num_edges)
        snd = graph.senders[e]
        e_write = jnp.where(valid, e, num_edges)  # out of range: dropped, never a duplicate index
        g = dm[graph.receivers[e]]  # [K, Dout, C]
        g = jnp.where(valid[:, None, None], g, 0)
        acc = dict(acc)
        if "x" in outs or "y" in outs:
            gs = g * s[e][:, i3, :]
            if "x" in outs:
                dx = apply_table(coo.vjp_x, y[e], gs, a_channels=y_channels, b_channels=True, out_channels=True)
                # invalid slots go to row num_nodes (dropped): 0 * non-finite padding s or y is NaN
                acc["x"] = acc["x"].at[jnp.where(valid, snd, num_nodes)].add(dx, mode="drop")
            if "y" in outs:
                dy = apply_table(coo.vjp_y, x[snd], gs, a_channels=True, b_channels=True, out_channels=y_channels)
                acc["y"] = acc["y"].at[e_write].set(dy, mode="drop")
        if "s" in outs:
            z = apply_table(coo.table, x[snd], y[e], a_channels=True, b_channels=y_channels, out_channels=True)
            ds = jnp.einsum("kdc,dp->kpc", z * g, paths)
            acc["s"] = acc["s"].at[e_write].set(ds, mode="drop")
        return acc

    trips = (graph.num_valid + chunk - 1) // chunk
    return jax.lax.fori_loop(0, trips, body, _varying_like(res, x, y, s, dm, graph))
