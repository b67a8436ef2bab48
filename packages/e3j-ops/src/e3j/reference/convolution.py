"""Reference (pure JAX) message-passing convolution kernels with bounded memory.

Edges are visited in receiver-sorted order (the graph's CSR order) in fixed-size chunks inside a
``fori_loop`` whose trip count is the number of *valid* edges, so padding edges cost nothing. Per
chunk the sender rows and edge operands are gathered, the messages ``s · (x ⊗ y)`` computed with the
reference tensor product, and summed into the receivers (sorted indices). Only one chunk of messages
``[chunk, D_out, C]`` ever exists, never the whole ``[E, D_out, C]`` array: on a CPU a chunk holds
about 2 MiB of messages (:func:`chunk_size`), and a trip's intermediates are a few such chunks, so
they stay in a core's L2 cache; on an accelerator (the fallback where no kernel backend serves a
call) it holds 256 MiB, so that the loop's trips stay few. Beyond the operands and results, memory
is ``O(chunk)`` floats plus four ``O(E)`` index arrays (the edges' receiver-order ids, senders,
receivers, validity).

The backward sweep computes the requested cotangents in one pass over the same chunks (paper
Eq. 16): ``dx`` scatter-added by sender, ``dy`` and ``ds`` written per edge (``ds`` sums each
path's rows of ``g · (x ⊗ y)``, row by row).

The grouped kernels run every group of a mixed-multiplicity plan in the same sweep: one chunk of
edges serves all groups, each reading its weights from e3nn's ``[E, num_weights]`` in place (the
chunk's rows, or each path's window) and writing its part of their cotangent there. A
uniform-channel convolution is the sweep of one group. Where the weights come from is the sweep's
*weights source*: an array (``[E, P, C]``, or e3nn's columns), or the radial network's last layer
``h @ k``, whose chunks of weights are computed inside the sweep (the factored kernels).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from e3j_core import TensorProductCoo

from .._vma import varying_like
from .tensor_product import _EXACT, apply_table

__all__ = [
    "chunk_size",
    "convolution",
    "convolution_bwd",
    "convolution_factored",
    "convolution_factored_bwd",
    "grouped_convolution",
    "grouped_convolution_bwd",
    "grouped_convolution_factored",
    "grouped_convolution_factored_bwd",
]

#: bytes of messages in one chunk on a CPU (measured) and on an accelerator (not measured)
_CHUNK_BYTES = 2 * 2**20
_ACCELERATOR_CHUNK_BYTES = 256 * 2**20


def chunk_size(num_edges: int, row_elements: int, itemsize: int, platform: str = "cpu") -> int:
    """Edges per chunk so that one chunk of messages takes about 2 MiB on a CPU, 256 MiB elsewhere.

    Each trip streams several chunk-sized intermediates (gathered rows, products, cotangents) through
    XLA's fusions; at 2 MiB they stay in a CPU core's L2 cache, where 16 MiB chunks spilled to memory
    and the backward sweep took ~1.75x more CPU time (``benchmarks/reference_convolution.py``). On a
    GPU or TPU every trip is a few kernel launches and a loop condition read back by the host, so
    2 MiB chunks would make a sweep of 3·10^7 edges at lmax 3, C = 128 one of 365,854 trips; at
    256 MiB it is one of ~2,900, whose intermediates (~1 GiB) any accelerator holds. The accelerator
    size is a rule of thumb: no GPU or TPU has timed it.

    >>> chunk_size(10**6, 16 * 128, 4), chunk_size(10**6, 16 * 128, 4, "cuda")
    (256, 32768)
    """
    budget = _CHUNK_BYTES if platform == "cpu" else _ACCELERATOR_CHUNK_BYTES
    return int(max(8, min(max(num_edges, 1), budget // max(1, row_elements * itemsize))))


class _Chunks:
    """The graph's edges in receiver order, cut into ``chunk``-edge pieces for a ``fori_loop``.

    The per-edge indices (edge id, sender, receiver, validity) are gathered once, padded to a whole
    number of chunks (``O(E)`` int32s), and each trip reads its piece with a contiguous slice: the
    row gathers inside the loop then read precomputed indices instead of recomputing
    ``senders[order[k]]`` for every element they move.
    """

    def __init__(self, graph, chunk: int):
        num_edges = graph.num_edges
        self.chunk = chunk
        self.trips = (graph.num_valid + chunk - 1) // chunk
        k = jnp.arange(-(-num_edges // chunk) * chunk, dtype=jnp.int32)
        self.valid = k < graph.num_valid
        self.edge = graph.order[jnp.minimum(k, num_edges - 1)]
        self.sender = graph.senders[self.edge]
        self.receiver = graph.receivers[self.edge]

    def __call__(self, i):
        """``(edge ids, senders, receivers, valid)`` of chunk ``i``, each ``[chunk]``."""
        arrays = (self.edge, self.sender, self.receiver, self.valid)
        return jax.lax.optimization_barrier(
            tuple(jax.lax.dynamic_slice_in_dim(a, i * self.chunk, self.chunk) for a in arrays)
        )


def convolution(coo: TensorProductCoo, x, y, s, graph, *, y_channels: bool, platform: str = "cpu") -> jnp.ndarray:
    """``m_b = Σ_{a→b} s_ab · (x_a ⊗ y_ab)``: ``[N, Dx, C], [E, Dy(, C)], [E, P, C]`` → ``[N, Dout, C]``.

    Operands as the kernel contract (:mod:`e3j.contract`) gives them: one dtype, a non-empty graph.
    ``platform``: the one lowered for, which sizes the chunks (:func:`chunk_size`); every kernel
    here takes it.
    """
    (group,) = groups = _uniform(coo, x.shape[-1])
    weights = _PathWeights(group, s, graph.num_edges)
    return _grouped_sweep(groups, [x], y, weights, graph, y_channels=y_channels, platform=platform)[0]


def convolution_bwd(
    coo: TensorProductCoo, x, y, s, dm, graph, *, outs: tuple[str, ...], y_channels: bool, platform: str = "cpu"
) -> dict:
    """Cotangents of the convolution for ``outs ⊆ {x, y, s}`` in one sweep (paper Eq. 16).

    Operands as the kernel contract (:mod:`e3j.contract`) gives them: the ones ``outs`` does not
    read are ``None``.
    """
    (group,) = groups = _uniform(coo, dm.shape[-1])
    weights = _PathWeights(group, s, graph.num_edges)
    sweep = _grouped_bwd_sweep(groups, [x], y, [dm], graph, outs, weights, y_channels=y_channels, platform=platform)
    return _uniform_cotangents(sweep)


def convolution_factored(
    coo: TensorProductCoo, x, y, h, k, graph, *, y_channels: bool, platform: str = "cpu"
) -> jnp.ndarray:
    """:func:`convolution` with the edge scalars given as ``s = (h @ k)`` (``h [E, H]``, ``k [H, P,
    C]``: the radial network's last hidden layer and last linear layer), computed chunk by chunk
    inside the sweep: ``[N, Dx, C], [E, Dy(, C)], [E, H], [H, P, C]`` → ``[N, Dout, C]``. The
    ``[E, P, C]`` edge scalars are never written to memory."""
    (group,) = groups = _uniform(coo, x.shape[-1])
    weights = _FactoredWeights.uniform(group, h, k, graph.num_edges)
    return _grouped_sweep(groups, [x], y, weights, graph, y_channels=y_channels, platform=platform)[0]


def convolution_factored_bwd(
    coo: TensorProductCoo, x, y, h, k, dm, graph, *, outs: tuple[str, ...], y_channels: bool, platform: str = "cpu"
) -> dict:
    """Cotangents of :func:`convolution_factored` for ``outs ⊆ {x, y, h, k}`` in one sweep: ``dh [E,
    H]`` per chunk (``ds @ k^T``) and ``dk [H, P, C]`` summed over the chunks (``h^T ds``), from each
    chunk's cotangent of the edge scalars, which is never written whole."""
    (group,) = groups = _uniform(coo, dm.shape[-1])
    weights = _FactoredWeights.uniform(group, h, k, graph.num_edges)
    sweep = _grouped_bwd_sweep(groups, [x], y, [dm], graph, outs, weights, y_channels=y_channels, platform=platform)
    return _uniform_cotangents(sweep)


class _Group(NamedTuple):
    """What a sweep reads of a group (duck-typed like :class:`e3j._mul_ir_plan.Group`)."""

    coo: TensorProductCoo
    channels: int


def _uniform(coo: TensorProductCoo, channels: int) -> list[_Group]:
    """A uniform-channel convolution: one group."""
    return [_Group(coo, int(channels))]


def _uniform_cotangents(res: dict) -> dict:
    if "x" in res:
        (res["x"],) = res["x"]
    return res


def _sum_paths(coo: TensorProductCoo, a):
    """``[K, Dout, C]`` -> ``[K, P, C]``: the sum over each path's output rows.

    Row slices added one at a time: XLA fuses the sums into the loop that computes ``a``. A reshape
    and a reduction per run of equal-dimension paths instead ran as a separate reduction, and the
    ``ds`` sweep took 1.3x as long (``benchmarks/reference_convolution.py``).
    """
    parts = []
    for sl in coo.path_slices:
        total = a[:, sl.start]
        for row in range(sl.start + 1, sl.stop):
            total = total + a[:, row]
        parts.append(total)
    return jnp.stack(parts, axis=1)


def _window_starts(group) -> jnp.ndarray:
    """``[Dout_g, 1]``: the first weight column of each output row's path (``weight_columns[i3]``)."""
    return jnp.asarray(np.asarray(group.weight_columns)[np.asarray(group.coo.i3)][:, None].astype(np.int32))


# [K, C_g] windows of a chunk's weight rows [K, num_weights], one per output row, stacked on axis 1
_WINDOWS = jax.lax.GatherDimensionNumbers(offset_dims=(0, 2), collapsed_slice_dims=(), start_index_map=(1,))


def _path_weights(w, group) -> jnp.ndarray:
    """``[K, num_weights] -> [K, Dout_g, C_g]``: each output row's path weights, read in place.

    Row ``r`` of group ``group`` takes columns ``weight_columns[i3[r]] .. + C_g`` of ``w``: one
    gather of ``[K, C_g]`` windows, the counterpart of :func:`convolution`'s ``s[:, i3, :]``.
    Slicing the paths' column runs and concatenating them instead, the forward cost ~20 % over the
    groups' own kernels against ~5 % (paired calls, XLA's CPU).
    """
    return jax.lax.gather(
        w, _window_starts(group), _WINDOWS, slice_sizes=(w.shape[0], group.channels), mode="promise_in_bounds"
    )


# [K, P_g] windows of C_g columns in e3nn's [E, num_weights], at (edge, path's first column):
# each path's weights read, and their cotangents added
_PATH_READS = jax.lax.GatherDimensionNumbers(offset_dims=(2,), collapsed_slice_dims=(0,), start_index_map=(0, 1))
_PATH_WINDOWS = jax.lax.ScatterDimensionNumbers(
    update_window_dims=(2,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0, 1)
)


def _path_starts(edges, group) -> jnp.ndarray:
    """``[K, P_g, 2]``: each edge's row and each path's first weight column."""
    cols = jnp.asarray(np.asarray(group.weight_columns, np.int32))
    return jnp.stack(jnp.broadcast_arrays(edges[:, None], cols[None, :]), axis=-1)


def _gather_paths(s, edges, group) -> jnp.ndarray:
    """``[K, P_g, C_g]``: each path's weights of the chunk's edges, read from e3nn's ``s [E,
    num_weights]`` (the transpose of :func:`_add_paths`).

    The backward's reading: one gather of ``[K, P_g]`` windows per group, expanded to the output rows
    afterwards. Through the shared rows of :func:`_weight_rows` and :func:`_path_weights` the whole
    backward took ~5 % longer (paired calls, 1,000 and 3,000 nodes, XLA's CPU); the forward, whose
    products read the weights once, was ~12 % slower this way."""
    return jax.lax.gather(
        s, _path_starts(edges, group), _PATH_READS, slice_sizes=(1, group.channels), mode="promise_in_bounds"
    )


def _add_paths(ds, edges, a, group) -> jnp.ndarray:
    """``ds [E, num_weights]`` plus each path's ``a [K, P_g, C_g]`` at its edge's row and its columns
    (``weight_columns[p] .. + C_g``, e3nn's weight order); ``edges`` out of range are dropped.

    One scatter of ``[K, P_g]`` windows per group. Assembling the chunk's ``[K, num_weights]`` rows
    first (dynamic-update-slices, which XLA ran on one thread, or a concatenation in column order)
    and scattering them once, the ``ds``-only sweep took 15–20 % longer at 1,000 nodes and the
    whole backward ~7 %; at 3,000 nodes the two measured within noise of each other (either ahead
    by ~5 % in different runs). Scattering each output row's window (the transpose of
    :func:`_path_weights`) cost the value and gradient 34 % over the groups' own kernels."""
    return jax.lax.scatter_add(ds, _path_starts(edges, group), a, _PATH_WINDOWS, mode="drop")


def _weight_rows(s, e):
    # the chunk's weight rows, gathered once for every group: fused into each group's products
    # instead, they were gathered once per group (forward 10-12 % over the groups' own kernels
    # against 4-5 %, paired calls)
    return jax.lax.optimization_barrier(s[e])


class _PathWeights:
    """A uniform-channel sweep's edge scalars ``s [E, P, C]`` (one group); their cotangent ``"s"``."""

    cotangents = ("s",)

    def __init__(self, group, s, num_edges: int):
        self.group, self.s, self.num_edges = group, s, num_edges
        self.operands = (s,)

    def rows(self, e) -> list:
        return [self.s[e][:, jnp.asarray(self.group.coo.i3), :]]

    def chunk(self, e, valid, e_write) -> dict:
        return {"e": e, "e_write": e_write}

    def paths(self, chunk: dict, k: int):
        return self.s[chunk["e"]]

    def zeros(self, outs, dtype) -> dict:
        g = self.group
        return {"s": jnp.zeros((self.num_edges, g.coo.num_paths, g.channels), dtype)} if "s" in outs else {}

    def add(self, acc: dict, chunk: dict, k: int, ds) -> None:
        acc["s"] = acc["s"].at[chunk["e_write"]].add(ds, mode="drop")

    def flush(self, acc: dict, chunk: dict) -> None:
        pass

    def finish(self, acc: dict, dtype) -> dict:
        return acc


class _ArrayWeights:
    """A grouped sweep's weights given as e3nn's ``s [E, num_weights]``, read in place; their
    cotangent ``"s"`` is written there."""

    cotangents = ("s",)
    # the output joined by one gather of its columns: by rows of its transpose (see _flat_sweep) the
    # forward ran 11 % slower at 1,000 nodes (paired calls, XLA's CPU)
    join_by_rows = False

    def __init__(self, plan, s, num_edges: int):
        self.plan, self.s, self.num_edges = plan, s, num_edges
        self.operands = (s,)  # the arrays a loop carry must vary like (see varying_like)

    def rows(self, e) -> list:
        """The forward's reading: each group's weights of the chunk's edges ``e``, one per output
        row, ``[K, Dout_g, C_g]``."""
        we = _weight_rows(self.s, e)
        return [_path_weights(we, g) for g in self.plan.groups]

    def chunk(self, e, valid, e_write) -> dict:
        """What one chunk of the backward shares between its groups."""
        return {"e": e, "e_write": e_write}

    def paths(self, chunk: dict, k: int):
        """The backward's reading: group ``k``'s ``[K, P_g, C_g]`` weights of the chunk."""
        return _gather_paths(self.s, chunk["e"], self.plan.groups[k])

    def zeros(self, outs, dtype) -> dict:
        return {"s": jnp.zeros((self.num_edges, self.plan.num_weights), dtype)} if "s" in outs else {}

    def add(self, acc: dict, chunk: dict, k: int, ds) -> None:
        """Group ``k``'s path sums ``ds [K, P_g, C_g]`` (the weights' cotangent) into ``acc``."""
        acc["s"] = _add_paths(acc["s"], chunk["e_write"], ds, self.plan.groups[k])

    def flush(self, acc: dict, chunk: dict) -> None:
        pass

    def finish(self, acc: dict, dtype) -> dict:
        return acc


class _FactoredWeights:
    """A sweep's weights given as the product ``h [E, H] @ k``, computed chunk by chunk from each
    group's ``[H, P_g · C_g]`` columns of ``k`` (path-major): the per-edge weights never exist.
    Cotangents ``"h"`` (``[E, H]``: each chunk's ``ds @ k_g^T``) and ``"k"`` (the chunks' ``h^T ds``
    summed per group, ``[H, P_g, C_g]``, joined into ``k``'s layout by ``join``).

    :meth:`of_plan`: a mixed-multiplicity plan's ``k [H, num_weights]`` in e3nn's columns;
    :meth:`uniform`: a uniform-channel convolution's ``k [H, P, C]``."""

    cotangents = ("h", "k")
    # the output joined by rows of its transpose (see _flat_sweep): the forward ran 5-10 % faster
    # than with one gather of the columns, at 1,000 and 3,000 nodes (paired calls, XLA's CPU)
    join_by_rows = True

    def __init__(self, groups, h, ks, join, num_edges: int, hidden: int):
        self.groups, self.h, self.ks, self.join = groups, h, ks, join
        self.num_edges, self.hidden = num_edges, hidden
        self.operands = (h, ks)

    @classmethod
    def of_plan(cls, plan, h, k, num_edges: int, hidden: int):
        # each group's columns of the kernel in its path-major order (H * num_weights numbers, once
        # per call)
        ks = None if k is None else [g.weights(k) for g in plan.groups]
        return cls(plan.groups, h, ks, plan.join_weights, num_edges, hidden)

    @classmethod
    def uniform(cls, group, h, k, num_edges: int):
        hidden = h.shape[1] if h is not None else k.shape[0]
        ks = None if k is None else [k.reshape(hidden, group.coo.num_paths * group.channels)]
        return cls([group], h, ks, lambda dks: dks[0], num_edges, hidden)

    def _product(self, h_rows, k: int):
        g = self.groups[k]
        product = jnp.matmul(h_rows, self.ks[k], precision=_EXACT)
        return product.reshape(h_rows.shape[0], g.coo.num_paths, g.channels)

    def rows(self, e) -> list:
        h_rows = self.h[e]
        return [self._product(h_rows, k)[:, jnp.asarray(g.coo.i3), :] for k, g in enumerate(self.groups)]

    def chunk(self, e, valid, e_write) -> dict:
        # padding slots' rows zeroed: the kernel's cotangent h^T ds reads every row of the chunk,
        # and 0 * a non-finite padding row is NaN
        h_rows = None if self.h is None else jnp.where(valid[:, None], self.h[e], 0)
        return {"h": h_rows, "e_write": e_write, "valid": valid, "dh": None}

    def paths(self, chunk: dict, k: int):
        return self._product(chunk["h"], k)

    def zeros(self, outs, dtype) -> dict:
        acc = {}
        if "h" in outs:
            acc["h"] = jnp.zeros((self.num_edges, self.hidden), dtype)
        if "k" in outs:
            # dk sums every edge's term, one chunk per trip: in bfloat16 the running sum stopped
            # growing (99 % of a 1e6-edge sum of positive terms lost), so it is kept in float32 at
            # least (what one XLA dot over all edges accumulates in) and cast back by finish()
            acc_dtype = jnp.promote_types(dtype, jnp.float32)
            acc["k"] = [jnp.zeros((self.hidden, g.coo.num_paths * g.channels), acc_dtype) for g in self.groups]
        return acc

    def add(self, acc: dict, chunk: dict, k: int, ds) -> None:
        ds = ds.reshape(ds.shape[0], -1)
        if "h" in acc:
            dh = jnp.matmul(ds, self.ks[k].T, precision=_EXACT)
            chunk["dh"] = dh if chunk["dh"] is None else chunk["dh"] + dh
        if "k" in acc:
            # a padding slot's ds is zero times its edge's operands, which may be non-finite
            ds = jnp.where(chunk["valid"][:, None], ds, 0)
            dk = jnp.matmul(chunk["h"].T, ds, precision=_EXACT, preferred_element_type=acc["k"][k].dtype)
            acc["k"][k] = acc["k"][k] + dk

    def flush(self, acc: dict, chunk: dict) -> None:
        if "h" in acc:
            acc["h"] = acc["h"].at[chunk["e_write"]].add(chunk["dh"], mode="drop")

    def finish(self, acc: dict, dtype) -> dict:
        if "k" in acc:
            acc["k"] = self.join(
                [
                    d.astype(dtype).reshape(self.hidden, g.coo.num_paths, g.channels)
                    for g, d in zip(self.groups, acc["k"])
                ]
            )
        return acc


def _grouped_sweep(groups, xs, y, weights, graph, *, y_channels: bool = False, platform: str = "cpu") -> list:
    """The forward of every group (a plan's ``groups``) in one sweep over the edges, on operands in
    the groups' layouts (``xs[g]: [N, Dx_g, C_g]``, ``weights`` read per chunk; ``y [E, Dy]``, or
    ``[E, Dy, C]`` for one group with ``y_channels``): each group's ``[N, Dout_g, C_g]``."""
    num_nodes, num_edges, dtype = xs[0].shape[0], graph.num_edges, xs[0].dtype
    # chunks sized by the widest group's messages: every group's intermediates of a trip stay small
    chunk = chunk_size(num_edges, max(g.coo.dim_out * g.channels for g in groups), dtype.itemsize, platform)
    chunks = _Chunks(graph, chunk)
    outs = [jnp.zeros((num_nodes, g.coo.dim_out, g.channels), dtype) for g in groups]

    def body(i, outs):
        e, snd, rcv, valid = chunks(i)
        ye, ws = y[e], weights.rows(e)
        receivers = jnp.where(valid, rcv, num_nodes)
        new = []
        for g, xg, wg, out in zip(groups, xs, ws, outs):
            z = apply_table(g.coo.table, xg[snd], ye, a_channels=True, b_channels=y_channels, out_channels=True)
            msg = jnp.where(valid[:, None, None], z * wg, 0)
            new.append(out.at[receivers].add(msg, indices_are_sorted=True, mode="drop"))
        return new

    return jax.lax.fori_loop(0, chunks.trips, body, varying_like(outs, xs, y, weights.operands, graph))


def _grouped_bwd_sweep(
    groups, xs, y, gs, graph, outs, weights, *, y_channels: bool = False, platform: str = "cpu"
) -> dict:
    """The cotangents ``outs`` of :func:`_grouped_sweep` in one sweep, on operands in the groups'
    layouts (``gs[g]: [N, Dout_g, C_g]``; ``"x"``: one ``[N, Dx_g, C_g]`` per group); the weights'
    (``weights.cotangents``) as ``weights`` writes them."""
    num_nodes, num_edges, dtype = gs[0].shape[0], graph.num_edges, gs[0].dtype
    res = weights.zeros(outs, dtype)
    if "x" in outs:
        res["x"] = [jnp.zeros((num_nodes, g.coo.dim_x, g.channels), dtype) for g in groups]
    if "y" in outs:
        res["y"] = jnp.zeros((num_edges, groups[0].coo.dim_y, *((groups[0].channels,) if y_channels else ())), dtype)
    wants_ds = any(o in outs for o in weights.cotangents)
    chunk = chunk_size(num_edges, max(g.coo.dim_out * g.channels for g in groups), dtype.itemsize, platform)
    chunks = _Chunks(graph, chunk)

    def body(i, acc):
        e, snd, rcv, valid = chunks(i)
        e_write = jnp.where(valid, e, num_edges)
        ye = y[e] if y is not None else None
        acc = {k: list(v) if isinstance(v, list) else v for k, v in acc.items()}
        wc = weights.chunk(e, valid, e_write)
        dy = None
        for k, g in enumerate(groups):
            gk = jnp.where(valid[:, None, None], gs[k][rcv], 0)
            xk = xs[k][snd] if xs[k] is not None else None
            if "x" in outs or "y" in outs:
                gw = gk * weights.paths(wc, k)[:, jnp.asarray(g.coo.i3), :]
                if "x" in outs:
                    dx = apply_table(g.coo.vjp_x, ye, gw, a_channels=y_channels, b_channels=True, out_channels=True)
                    # invalid slots go to row num_nodes (dropped): 0 * non-finite padding s or y is NaN
                    acc["x"][k] = acc["x"][k].at[jnp.where(valid, snd, num_nodes)].add(dx, mode="drop")
                if "y" in outs:
                    d = apply_table(g.coo.vjp_y, xk, gw, a_channels=True, b_channels=True, out_channels=y_channels)
                    dy = d if dy is None else dy + d
            if wants_ds:
                z = apply_table(g.coo.table, xk, ye, a_channels=True, b_channels=y_channels, out_channels=True)
                weights.add(acc, wc, k, _sum_paths(g.coo, z * gk))
        weights.flush(acc, wc)
        if "y" in outs:
            acc["y"] = acc["y"].at[e_write].add(dy, mode="drop")
        return acc

    res = jax.lax.fori_loop(0, chunks.trips, body, varying_like(res, xs, y, gs, weights.operands, graph))
    return weights.finish(res, dtype)


def _flat_sweep(plan, x, y, weights, graph, platform: str) -> jnp.ndarray:
    """:func:`_grouped_sweep` on e3nn's flat ``x [N, Dx_flat]``, returning e3nn's ``[N, Dout_flat]``."""
    outs = _grouped_sweep(plan.groups, plan.split_x(x), y, weights, graph, platform=platform)
    num_nodes = x.shape[0]
    if weights.join_by_rows:
        # e3nn's columns as whole rows of the transposed outputs: each group's [N, Dout_g * C_g]
        # transposed, the rows gathered in e3nn's order (contiguous N-element rows), the result
        # transposed back
        rows = jnp.concatenate([o.reshape(num_nodes, -1).T for o in outs], axis=0)
        return rows.at[plan.out_order].get(mode="promise_in_bounds").T
    # one gather of the columns: ~1.5x faster than join_out's transposed slices concatenated (XLA's
    # CPU, 1,000-3,000 nodes), whose advantage, a cheap transpose, a kernel does not need
    flat = jnp.concatenate([o.reshape(num_nodes, -1) for o in outs], axis=1)
    return flat.at[:, plan.out_order].get(mode="promise_in_bounds")


def _flat_bwd_sweep(plan, x, y, dm, graph, outs, weights, platform: str) -> dict:
    """:func:`_grouped_bwd_sweep` on e3nn's flat ``x`` and ``dm``, ``dx`` in e3nn's layout."""
    xs = plan.split_x(x) if x is not None else [None] * len(plan.groups)
    res = _grouped_bwd_sweep(plan.groups, xs, y, plan.split_out(dm), graph, outs, weights, platform=platform)
    if "x" in res:
        res["x"] = plan.join_x(res["x"])
    return res


def grouped_convolution(plan, x, y, s, graph, *, platform: str = "cpu") -> jnp.ndarray:
    """All groups of ``plan`` in one sweep: ``[N, Dx_flat], [E, Dy], [E, num_weights]`` → ``[N, Dout_flat]``.

    e3nn's flat layouts (:mod:`e3j._primitives.grouped_convolution`); operands as the kernel
    contract gives them.
    """
    return _flat_sweep(plan, x, y, _ArrayWeights(plan, s, graph.num_edges), graph, platform)


def grouped_convolution_bwd(plan, x, y, s, dm, graph, *, outs: tuple[str, ...], platform: str = "cpu") -> dict:
    """Cotangents of :func:`grouped_convolution` for ``outs ⊆ {x, y, s}`` in one sweep, in its layouts."""
    return _flat_bwd_sweep(plan, x, y, dm, graph, outs, _ArrayWeights(plan, s, graph.num_edges), platform)


def grouped_convolution_factored(plan, x, y, h, k, graph, *, platform: str = "cpu") -> jnp.ndarray:
    """:func:`grouped_convolution` with the weights ``h [E, H] @ k [H, num_weights]`` (the radial
    network's last layer, ``k``'s columns in e3nn's weight order) computed chunk by chunk from each
    group's columns of ``k``, inside the sweep: ``[N, Dx_flat], [E, Dy], [E, H], [H, num_weights]`` →
    ``[N, Dout_flat]``. The per-edge weights are never written to memory."""
    weights = _FactoredWeights.of_plan(plan, h, k, graph.num_edges, h.shape[1])
    return _flat_sweep(plan, x, y, weights, graph, platform)


def grouped_convolution_factored_bwd(
    plan, x, y, h, k, dm, graph, *, outs: tuple[str, ...], platform: str = "cpu"
) -> dict:
    """Cotangents of :func:`grouped_convolution_factored` for ``outs ⊆ {x, y, h, k}`` in one sweep
    (``h`` and ``k``'s from each chunk's weight cotangents, which are never written whole)."""
    hidden = h.shape[1] if h is not None else k.shape[0]
    weights = _FactoredWeights.of_plan(plan, h, k, graph.num_edges, hidden)
    return _flat_bwd_sweep(plan, x, y, dm, graph, outs, weights, platform)
