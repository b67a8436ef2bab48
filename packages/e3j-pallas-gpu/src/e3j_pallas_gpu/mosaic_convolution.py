"""Mosaic GPU fused message-passing convolution (Hopper and newer), forward and backward, deterministic.

``m_b = Σ_{a→b} s_ab · (x_a ⊗ y_ab)`` with ``x [N, Dx, C]``, ``y [E, Dy]`` or ``[E, Dy, C]``,
``s [E, P, C]`` (one scalar per path and channel), ``m [N, Dout, C]``; float32 (Mosaic GPU's TMA
has no float64).

A program — one warpgroup, 128 threads — holds ``[rows, width]`` register tiles (:class:`Lanes`): one
node × a block of 128 channels when ``C >= 128``, or ``rows = 128 / width`` nodes × ``width``
channels when ``C < 128`` (``width`` = ``C`` rounded up to a power of two ≥ 4): a ``C = 16``
program serves 8 nodes, with no lane padded to 128.

Forward (paper Algorithm 2, Appendix E.3): the program's nodes are receivers; each tile row walks its
receiver's CSR interval of the graph's receiver-sorted ``order``, all rows in step (a row whose
interval is shorter stages zeros: the TMA fills out-of-bounds rows with zeros). For each step the
TMA gathers each row's sender features ``x_a`` and edge scalars ``s_ab`` (and a per-channel
``y_ab``) into shared memory — double-buffered: the next step's rows are in flight while the current
step computes. The Clebsch–Gordan records are unrolled at trace time, the edge scalar ``s_ab[i3(i0)]``
is factored out of each output row's record sum, and the messages accumulate in registers; each
receiver's row is written once. Padding edges are outside every interval: they cost nothing. No
atomics, so the result is bitwise reproducible.

Backward (Algorithm 3, made deterministic as the Triton kernels are): the program's nodes are senders,
walking their intervals of ``sender_order`` — the convolution on the transposed graph — so ``dx_a``
accumulates in registers and is written once, without atomics; each edge's ``dy_ab`` and ``ds_ab``
are written along the way by the TMA (an edge has one sender: no two programs write the same row;
a row past its sender's interval stores nothing). Extra programs clear ``dy``/``ds`` of the
padding edges, a run of them each (``_blocks.clearing_programs``).

A broadcast ``y`` is read as scalars on one-row tiles (its cotangent reduced over the lanes in
registers, then over channel blocks); on several-row tiles it is broadcast over the channels in XLA
first (Mosaic's strided layout has no per-row broadcast) and its cotangent, formed per channel, is
summed over the channels in XLA.

Mixed multiplicities (:func:`grouped_convolution`): one launch per group on e3nn's ``[E,
num_weights]`` weights, each path's ``C`` weights read where e3nn puts them (one TMA window per
path and row) and their cotangent written there, where :func:`reads_in_place` allows. Groups of
several-row tiles run the Triton kernels instead (:func:`on_triton`): no ``y`` expanded.

>>> import numpy as np
>>> import e3j
>>> from e3j_core import tensor_product_coo
>>> coo = tensor_product_coo("0e + 1o", "0e + 1o", filter="0e + 1o")
>>> g = e3j.Graph.from_edges(np.array([0, 1]), np.array([1, 0]), 2)
>>> x, y = np.ones((2, 4, 16), np.float32), np.ones((2, 4), np.float32)
>>> s = np.ones((2, coo.num_paths, 16), np.float32)
>>> convolution(coo, x, y, s, g, y_channels=False, interpret=True).shape == (2, coo.dim_out, 16)
True
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from e3j_core import TensorProductCoo

from . import convolution as triton
from ._blocks import clearing_programs, clearing_range
from ._mosaic import Lanes, check_dtype, interpret_params, launch_grid, pad_channels, zeros

__all__ = [
    "convolution",
    "convolution_bwd",
    "grouped_convolution",
    "grouped_convolution_bwd",
    "on_triton",
    "reads_in_place",
]


def _rows(ref):
    """Feature row ``i`` of a ``[rows, D, width]`` shared-memory block, as a ``[rows, width]`` value."""
    return functools.cache(lambda i: ref[:, i, :])


def _load_block(gmem, index, cols, block):
    """TMA load ``(gmem window, smem window)`` of ``gmem[index, :D, cols]`` into a ``[D', width]`` block.

    Exactly the operand's ``D`` feature rows move, into the block's first ``D`` rows (their start
    stays 128-byte aligned; :meth:`Lanes.block_rows`); the ``D' - D`` padding rows are never read. A
    ``D'``-row window would reach past the ``D`` axis, which JAX >= 0.12 refuses when the slice is
    built. ``index`` may be out of bounds (an edge past the last): the TMA loads zeros for it.
    """
    return gmem.at[index, :, cols], block.at[pl.ds(0, gmem.shape[1])]


class _Walk:
    """The edges of the program's ``rows`` nodes, one per row and step, in CSR order.

    Row ``r`` serves node ``g · rows + r`` (out of bounds past the last node: an empty interval). At
    step ``t`` its edge is ``order[offsets[node] + t]`` when inside its interval, else ``num_edges``
    (out of bounds: the TMA loads zeros for it).
    """

    def __init__(self, offsets_gmem, order_gmem, other_gmem, group, rows: int, num_nodes: int, num_edges: int):
        self.order, self.other, self.num_nodes, self.num_edges = order_gmem, other_gmem, num_nodes, num_edges
        self.nodes = [group * rows + r for r in range(rows)]
        bounds = [
            (offsets_gmem[jnp.minimum(n, num_nodes)], offsets_gmem[jnp.minimum(n + 1, num_nodes)]) for n in self.nodes
        ]
        self.starts = [b[0] for b in bounds]
        self.ends = [b[1] for b in bounds]
        self.steps = functools.reduce(jnp.maximum, [e - s for s, e in bounds])

    def edge(self, r: int, t):
        """``(edge, other endpoint, valid)`` of row ``r`` at step ``t``, out of bounds past its interval."""
        k = self.starts[r] + t
        valid = k < self.ends[r]
        e = self.order[jnp.minimum(k, self.num_edges - 1)]
        other = self.other[jnp.minimum(e, self.num_edges - 1)]
        return jnp.where(valid, e, self.num_edges), jnp.where(valid, other, self.num_nodes), valid


def _path_windows(gmem, index, columns, lane0, block, lanes: Lanes):
    """TMA loads ``(gmem window, smem row)`` of each path's ``width`` weights of row ``index`` of e3nn's
    ``[E, num_weights]`` (path ``p``: columns ``columns[p] + lane0 ..``) into row ``p · unit`` of a
    ``[P · unit, width]`` block: one row per path, each starting 128-byte aligned as the TMA needs."""
    unit = lanes.block_rows(1)
    return [(gmem.at[index, pl.ds(col + lane0, lanes.width)], block.at[p * unit]) for p, col in enumerate(columns)]


def _path_rows(ref, columns, lanes: Lanes):
    """Path ``p``'s weights in a ``[rows, P', width]`` block as a ``[rows, width]`` value: row ``p``, or
    row ``p · unit`` when the weights were loaded path by path (``columns`` given)."""
    if columns is None:
        return _rows(ref)
    unit = lanes.block_rows(1)
    return functools.cache(lambda p: ref[:, p * unit, :])


def _stage(copies, barrier) -> None:
    """Issues TMA copies ``(gmem_slice, smem)`` tracked by one barrier (whose arrival count is their number)."""
    for src, dst in copies:
        plgpu.copy_gmem_to_smem(src, dst, barrier)


def _store_block(block, gmem, index, cols, inside=None) -> None:
    """TMA store of one tile row's ``[D', width]`` shared-memory block to ``gmem[index, :D, cols]``.

    Exactly the operand's ``D`` feature rows are stored, never the ``D' - D`` padding rows: Mosaic
    lowers a store whose gmem window is contiguous (every ``C < 128``: the block spans whole rows) to a
    linear bulk copy (``cp.async.bulk``), bounded by the end of the whole array, not by each axis, so
    a ``D'``-row window would write its padding rows over the first rows of node or edge
    ``index + 1`` (wrong ``dy``/``ds`` on the first H200 run). ``inside`` (a traced bool): whether
    ``index`` names a row of ``gmem``; no store otherwise (no store relies on being clipped). The
    caller makes the warpgroup's writes visible first (``commit_smem``) and waits for the store.
    """

    def store():
        plgpu.copy_smem_to_gmem(block.at[pl.ds(0, gmem.shape[1])], gmem.at[index, :, cols])

    if inside is None:
        store()
    else:
        pl.when(inside)(store)


def convolution_kernel(
    offsets_gmem,
    order_gmem,
    senders_gmem,
    x_gmem,
    y_gmem,
    s_gmem,
    m_gmem,
    *,
    x_smem,
    y_smem,
    s_smem,
    m_smem,
    barriers,
    table,
    i3,
    y_scalars,
    lanes,
    s_columns=None,
):
    """``rows`` receivers × ``width`` channels of the forward; ``y_smem`` is ``None`` for scalar ``y``.

    ``s_columns``: ``None`` for ``s [E, P, C]``; else ``s`` is e3nn's ``[E, num_weights]`` and path
    ``p`` reads its ``C`` columns from ``s_columns[p]`` in place, one TMA copy per path and row."""
    g, c = jax.lax.axis_index("node"), jax.lax.axis_index("lanes")
    cols = pl.ds(c * lanes.width, lanes.width)
    num_nodes, num_edges = x_gmem.shape[0], s_gmem.shape[0]
    walk = _Walk(offsets_gmem, order_gmem, senders_gmem, g, lanes.rows, num_nodes, num_edges)
    dtype = m_smem.dtype
    operands = [(x_gmem, x_smem, "a")] + ([(s_gmem, s_smem, "e")] if s_columns is None else [])
    if not y_scalars:
        operands.append((y_gmem, y_smem, "e"))

    def stage(t, slot):
        copies = []
        for r in range(lanes.rows):
            e, a, _ = walk.edge(r, t)
            for src, dst, key in operands:
                row = a if key == "a" else e
                copies.append(_load_block(src, row, cols, dst.at[slot, r]))
            if s_columns is not None:
                copies += _path_windows(s_gmem, e, s_columns, c * lanes.width, s_smem.at[slot, r], lanes)
        _stage(copies, barriers.at[slot])

    @pl.when(walk.steps > 0)
    def _():
        stage(0, 0)

    def step(t, acc):
        slot = t % 2

        @pl.when(t + 1 < walk.steps)
        def _():  # the next step's rows fly while this one computes
            plgpu.commit_smem()  # every thread has read the other slot (step t - 1) before the TMA overwrites it
            stage(t + 1, 1 - slot)

        plgpu.barrier_wait(barriers.at[slot])
        s_row = _path_rows(s_smem.at[slot], s_columns, lanes)
        if y_scalars:  # one row: its edge is valid at every step
            e = walk.edge(0, t)[0]
            y_row = functools.cache(lambda i: y_gmem[e, i])
        else:
            y_row = _rows(y_smem.at[slot])
        acc = list(acc)

        def on_row(i0, z):  # accumulated as soon as the row is done: one message row live at a time
            acc[i0] = acc[i0] + s_row(i3[i0]) * z

        table.contract(_rows(x_smem.at[slot]), y_row, on_row=on_row)
        return tuple(acc)

    tile = (lanes.rows, lanes.width)
    acc = jax.lax.fori_loop(0, walk.steps, step, (zeros(dtype, tile),) * len(i3))
    for i0, v in enumerate(acc):
        m_smem[:, i0, :] = v.astype(dtype)
    plgpu.commit_smem()  # the warpgroup's writes are visible to the TMA
    for r, n in enumerate(walk.nodes):
        _store_block(m_smem.at[r], m_gmem, n, cols, n < num_nodes)
    plgpu.wait_smem_to_gmem(0)


def _smem(lanes: Lanes, d: int, dtype, slots: int | None = None):
    shape = (lanes.rows, lanes.block_rows(d), lanes.width)
    return plgpu.SMEM(shape if slots is None else (slots, *shape), dtype)


def _y_operand(y: jax.Array, lanes: Lanes, y_channels: bool, channels: int) -> tuple[jax.Array, bool]:
    """``y`` as the kernels read it, and whether it is read as scalars (a broadcast y on one-row tiles)."""
    if y_channels:
        return pad_channels(y, lanes.channels), False
    if lanes.rows == 1:
        return y, True
    return pad_channels(jnp.broadcast_to(y[..., None], (*y.shape, channels)), lanes.channels), False


def convolution(
    coo: TensorProductCoo, x: jax.Array, y: jax.Array, s: jax.Array, graph, *, y_channels: bool, interpret=False
) -> jax.Array:
    """Fused forward convolution (see the module docstring); ``interpret`` runs Mosaic's GPU interpreter."""
    return _forward(coo, x, y, s, graph, y_channels=y_channels, s_columns=None, interpret=interpret)


def _forward(coo, x, y, s, graph, *, y_channels: bool, s_columns, interpret) -> jax.Array:
    """:func:`convolution`, or with ``s_columns`` (see :func:`convolution_kernel`) reading ``s [E,
    num_weights]`` in place."""
    num_nodes, _, channels = x.shape
    dtype = check_dtype(jnp.result_type(x, y, s), "convolution")
    lanes = Lanes.of(channels)
    y_op, y_scalars = _y_operand(y, lanes, y_channels, channels)
    s_rows, s_copies = (coo.num_paths, 1) if s_columns is None else (coo.num_paths * lanes.block_rows(1), coo.num_paths)
    scratch = {
        "x_smem": _smem(lanes, coo.dim_x, dtype, 2),
        "s_smem": _smem(lanes, s_rows, dtype, 2),
        "m_smem": _smem(lanes, coo.dim_out, dtype),
        "y_smem": None if y_scalars else _smem(lanes, coo.dim_y, dtype, 2),
        # one barrier per slot: every row's copies of the step arrive on it
        "barriers": plgpu.Barrier(num_arrivals=lanes.rows * (1 + s_copies + (0 if y_scalars else 1)), num_barriers=2),
    }
    body = functools.partial(
        convolution_kernel,
        table=coo.table,
        i3=coo.i3.tolist(),
        y_scalars=y_scalars,
        lanes=lanes,
        s_columns=s_columns,
        **{k: None for k, v in scratch.items() if v is None},
    )
    m = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((num_nodes, coo.dim_out, lanes.channels), dtype),
        **launch_grid(-(-num_nodes // lanes.rows), lanes.blocks, ("node", "lanes")),
        scratch_types={k: v for k, v in scratch.items() if v is not None},
        interpret=interpret_params(interpret),
        kernel_name="e3j_mosaic_convolution",
    )(
        graph.receiver_offsets,
        graph.order,
        graph.senders,
        pad_channels(x, lanes.channels),
        y_op,
        s if s_columns is not None else pad_channels(s, lanes.channels),
    )
    return m[..., :channels] if lanes.channels != channels else m


def convolution_bwd_kernel(
    offsets_gmem,
    order_gmem,
    receivers_gmem,
    num_valid_gmem,
    *refs,
    x_smem,
    y_smem,
    s_smem,
    dm_smem,
    dx_smem,
    dy_smem,
    ds_smem,
    barriers,
    x_barrier,
    table,
    i3,
    empty_paths,
    dims,
    y_scalars,
    outs,
    lanes,
    s_columns=None,
    ds_into=False,
):
    """``rows`` senders × ``width`` channels of the backward; programs past the senders' clear the
    padding edges' rows, a run each (:func:`~e3j_pallas_gpu._blocks.clearing_range`).

    ``refs`` are the needed operands among ``x, y, s`` (in that order), ``dm``, then the cotangents
    named in ``outs``; unneeded scratch refs are ``None``. With ``s_columns`` (see
    :func:`convolution_kernel`) ``s`` is e3nn's ``[E, num_weights]``, read in place, and ``ds`` has
    that layout too: each path's ``ds`` is written into its own columns, of every edge (padding edges'
    zeros too), the other columns left as they are. With ``ds_into`` that buffer comes after ``dm``
    (a mutable ref the caller threads from group to group), else it is the ``ds`` output.
    """
    want_x, want_y, want_s = ("x" in outs), ("y" in outs), ("s" in outs)
    need = {"x": want_y or want_s, "y": want_x or want_s, "s": want_x or want_y}
    refs = list(refs)
    gmem = {n: refs.pop(0) for n in ("x", "y", "s") if need[n]}
    gmem["dm"] = refs.pop(0)
    if want_s and ds_into:
        gmem["ds"] = refs.pop(0)
    gmem.update({f"d{o}": refs.pop(0) for o in outs if f"d{o}" not in gmem})
    unit = lanes.block_rows(1) if s_columns is not None else 1  # path p's row in the s/ds blocks: p · unit
    g, c = jax.lax.axis_index("node"), jax.lax.axis_index("lanes")
    cols = pl.ds(c * lanes.width, lanes.width)
    dtype = dm_smem.dtype
    dim_x, dim_y = dims
    num_nodes, num_edges = gmem["dm"].shape[0], order_gmem.shape[0]
    num_groups = -(-num_nodes // lanes.rows)
    tile = (lanes.rows, lanes.width)
    staged = [("dm", dm_smem, "b")]
    if need["s"] and s_columns is None:
        staged.append(("s", s_smem, "e"))
    if need["y"] and not y_scalars:
        staged.append(("y", y_smem, "e"))
    stored = [(n, ref) for n, ref in (("dy", dy_smem), ("ds", ds_smem)) if ref is not None]

    def store_edge(name, block, e):
        """Edge ``e``'s row of cotangent ``name`` from its ``[D', width]`` block: one store, or with
        ``s_columns`` one per path of ``ds`` into its columns of e3nn's layout."""
        if name == "ds" and s_columns is not None:
            for p, col in enumerate(s_columns):
                plgpu.copy_smem_to_gmem(block.at[p * unit], gmem["ds"].at[e, pl.ds(col + c * lanes.width, lanes.width)])
        else:
            _store_block(block, gmem[name], e, cols)

    @pl.when(g < num_groups)
    def _():
        walk = _Walk(offsets_gmem, order_gmem, receivers_gmem, g, lanes.rows, num_nodes, num_edges)
        if need["x"]:
            x_gmem = gmem["x"]
            _stage(
                [_load_block(x_gmem, n, cols, x_smem.at[r]) for r, n in enumerate(walk.nodes)],
                x_barrier,
            )
            plgpu.barrier_wait(x_barrier)
        x_row = _rows(x_smem) if need["x"] else None

        def stage(t, slot):
            copies = []
            for r in range(lanes.rows):
                e, b, _ = walk.edge(r, t)
                for name, dst, key in staged:
                    src = gmem[name]
                    copies.append(_load_block(src, b if key == "b" else e, cols, dst.at[slot, r]))
                if need["s"] and s_columns is not None:
                    copies += _path_windows(gmem["s"], e, s_columns, c * lanes.width, s_smem.at[slot, r], lanes)
            _stage(copies, barriers.at[slot])

        def store_edge_row(r, e, _, valid):
            @pl.when(valid)  # a row past its interval stores nothing (no two rows write one edge)
            def _():
                for n, ref in stored:
                    store_edge(n, ref.at[r], e)

        @pl.when(walk.steps > 0)
        def _():
            stage(0, 0)

        def step(t, dx_acc):
            slot = t % 2

            @pl.when(t + 1 < walk.steps)
            def _():  # the next step's rows fly while this one computes
                plgpu.commit_smem()  # every thread has read the other slot (step t - 1) before the TMA overwrites it
                stage(t + 1, 1 - slot)

            plgpu.barrier_wait(barriers.at[slot])
            dm_row = _rows(dm_smem.at[slot])
            s_row = _path_rows(s_smem.at[slot], s_columns, lanes) if need["s"] else None
            e0 = walk.edge(0, t)[0] if y_scalars else None  # one row: its edge is valid at every step
            y_row = None
            if need["y"]:
                y_row = functools.cache(lambda i: gmem["y"][e0, i]) if y_scalars else _rows(y_smem.at[slot])
            if stored:  # the previous step's TMA stores have read the output blocks
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            ds = {"path": None, "sum": None}

            def write_ds():
                if ds["path"] is not None:
                    ds_smem[:, ds["path"] * unit, :] = ds["sum"].astype(dtype)

            def on_row(i0, z):  # rows arrive in output order, so path by path
                if i3[i0] != ds["path"]:
                    write_ds()
                    ds["path"], ds["sum"] = i3[i0], None
                term = z * dm_row(i0)
                ds["sum"] = term if ds["sum"] is None else ds["sum"] + term

            # one pass over the records by output row: each dm row is live for its row only
            dx, dy = table.contract_vjp(
                x_row,
                y_row,
                (lambda i0: dm_row(i0) * s_row(i3[i0])) if (want_x or want_y) else None,
                grads=tuple(g for g, want in (("a", want_x), ("b", want_y)) if want),
                on_row=on_row if want_s else None,
            )
            if want_s:
                write_ds()
                for p in empty_paths:
                    ds_smem[:, p * unit, :] = zeros(dtype, tile)
            if want_y and y_scalars:  # summed over the block's lanes in registers
                for i in range(dim_y):
                    gmem["dy"][c, e0, i] = jnp.sum(dy[i]).astype(dtype) if i in dy else jnp.zeros((), dtype)
            elif want_y:
                for i in range(dim_y):
                    dy_smem[:, i, :] = dy[i].astype(dtype) if i in dy else zeros(dtype, tile)
            if stored:
                plgpu.commit_smem()  # the warpgroup's writes are visible to the TMA
                for r in range(lanes.rows):
                    store_edge_row(r, *walk.edge(r, t))
            if want_x:
                dx_acc = tuple(dx_acc[i] + dx[i] if i in dx else dx_acc[i] for i in range(dim_x))
            return dx_acc

        dx = jax.lax.fori_loop(0, walk.steps, step, (zeros(dtype, tile),) * (dim_x if want_x else 0))
        if want_x:
            for i, v in enumerate(dx):
                dx_smem[:, i, :] = v.astype(dtype)
            plgpu.commit_smem()  # the warpgroup's writes are visible to the TMA
            for r, n in enumerate(walk.nodes):
                _store_block(dx_smem.at[r], gmem["dx"], n, cols, n < num_nodes)
        plgpu.wait_smem_to_gmem(0)

    if want_y or want_s:

        @pl.when(g >= num_groups)
        def _():
            for _, ref in stored:
                for i in range(ref.shape[1]):
                    ref[:, i, :] = zeros(dtype, tile)
            plgpu.commit_smem()  # the zeroed blocks are visible to the TMA

            def clear(k, carry):
                e = order_gmem[k]
                if want_y and y_scalars:
                    for i in range(dim_y):
                        gmem["dy"][c, e, i] = jnp.zeros((), dtype)
                for n, ref in stored:
                    store_edge(n, ref.at[0], e)
                return carry

            programs = clearing_programs(num_edges)
            lo, hi = clearing_range(num_valid_gmem[0], num_edges, g - num_groups, programs)
            jax.lax.fori_loop(lo, hi, clear, 0)
            plgpu.wait_smem_to_gmem(0)


def convolution_bwd(
    coo: TensorProductCoo,
    x: jax.Array | None,
    y: jax.Array | None,
    s: jax.Array | None,
    dm: jax.Array,
    graph,
    *,
    outs: tuple[str, ...],
    y_channels: bool,
    interpret=False,
) -> dict[str, jax.Array]:
    """Cotangents of the convolution for ``outs ⊆ {x, y, s}`` in one sender-ordered sweep.

    ``x`` is read only when ``y`` or ``s`` is requested, ``y`` when ``x`` or ``s`` is, ``s`` when
    ``x`` or ``y`` is (unneeded operands may be ``None``).
    """
    return _backward(coo, x, y, s, dm, graph, outs=outs, y_channels=y_channels, interpret=interpret)


def _backward(
    coo, x, y, s, dm, graph, *, outs, y_channels: bool, interpret, s_columns=None, ds=None, num_weights=None
) -> dict:
    """:func:`convolution_bwd`, or with ``s_columns`` (see :func:`convolution_kernel`) reading ``s [E,
    num_weights]`` in place and writing ``ds`` in that layout: into ``ds``, a mutable ref (no ``"s"``
    in the result then), or with ``ds=None`` into a fresh ``"s" [E, num_weights]`` whose columns
    outside this table's paths are unwritten (undefined)."""
    outs = tuple(o for o in ("x", "y", "s") if o in outs)
    num_nodes, _, channels = dm.shape
    num_edges = graph.senders.shape[0]
    dtype = check_dtype(jnp.result_type(*[a for a in (x, y, s, dm) if a is not None]), "convolution_bwd")
    lanes = Lanes.of(channels)
    cp, nc = lanes.channels, lanes.blocks
    want_x, want_y, want_s = ("x" in outs), ("y" in outs), ("s" in outs)
    need = {"x": want_y or want_s, "y": want_x or want_s, "s": want_x or want_y}
    i3 = coo.i3.tolist()
    # ds is written path by path as the output rows go by: core lists paths in output order
    assert i3 == sorted(i3), "TensorProductCoo paths are not in output order"
    empty_paths = sorted(set(range(coo.num_paths)) - {i3[i0] for i0 in coo.table.i0.tolist()})
    y_scalars = not y_channels and lanes.rows == 1
    operands = {
        "x": pad_channels(x, cp),
        "y": _y_operand(y, lanes, y_channels, channels)[0] if need["y"] else None,
        "s": pad_channels(s, cp) if s_columns is None else s,
    }
    s_rows = coo.num_paths if s_columns is None else coo.num_paths * lanes.block_rows(1)
    shapes = {
        "x": (num_nodes, coo.dim_x, cp),
        "y": (nc, num_edges, coo.dim_y) if y_scalars else (num_edges, coo.dim_y, cp),
        "s": (num_edges, coo.num_paths, cp),
    }
    ds_into = want_s and s_columns is not None and ds is not None
    if want_s and s_columns is not None and not ds_into:
        if num_weights is None:
            raise ValueError("num_weights: the width of the fresh [E, num_weights] ds is needed with s_columns")
        shapes["s"] = (num_edges, num_weights)
    returned = tuple(o for o in outs if not (o == "s" and ds_into))
    scratch = {
        "x_smem": _smem(lanes, coo.dim_x, dtype) if need["x"] else None,
        "y_smem": _smem(lanes, coo.dim_y, dtype, 2) if need["y"] and not y_scalars else None,
        "s_smem": _smem(lanes, s_rows, dtype, 2) if need["s"] else None,
        "dm_smem": _smem(lanes, coo.dim_out, dtype, 2),
        "dx_smem": _smem(lanes, coo.dim_x, dtype) if want_x else None,
        "dy_smem": _smem(lanes, coo.dim_y, dtype) if want_y and not y_scalars else None,
        "ds_smem": _smem(lanes, s_rows, dtype) if want_s else None,
    }
    s_copies = (1 if s_columns is None else coo.num_paths) if need["s"] else 0
    staged = 1 + s_copies + (need["y"] and not y_scalars)
    # one barrier per slot of the edge operands (every row's copies of a step arrive on it), one for x
    scratch["barriers"] = plgpu.Barrier(num_arrivals=lanes.rows * staged, num_barriers=2)
    scratch["x_barrier"] = plgpu.Barrier(num_arrivals=lanes.rows) if need["x"] else None
    body = functools.partial(
        convolution_bwd_kernel,
        table=coo.table,
        i3=i3,
        empty_paths=empty_paths,
        dims=(coo.dim_x, coo.dim_y),
        y_scalars=y_scalars,
        outs=outs,
        lanes=lanes,
        s_columns=s_columns,
        ds_into=ds_into,
        **{k: None for k, v in scratch.items() if v is None},
    )
    groups = -(-num_nodes // lanes.rows)
    results = plgpu.kernel(
        body,
        out_type=tuple(jax.ShapeDtypeStruct(shapes[o], dtype) for o in returned),
        # the groups' programs, then those clearing the padding edges' dy / ds rows
        **launch_grid(groups + (clearing_programs(num_edges) if (want_y or want_s) else 0), nc, ("node", "lanes")),
        scratch_types={k: v for k, v in scratch.items() if v is not None},
        interpret=interpret_params(interpret),
        kernel_name="e3j_mosaic_convolution_bwd",
    )(
        graph.sender_offsets,
        graph.sender_order,
        graph.receivers,
        graph.num_valid.reshape(1),
        *(operands[n] for n in ("x", "y", "s") if need[n]),
        pad_channels(dm, cp),
        *((ds,) if ds_into else ()),
    )
    res = dict(zip(returned, results, strict=True))
    if want_y and y_scalars:
        res["y"] = functools.reduce(jnp.add, list(res["y"]))
    elif want_y and not y_channels:  # several-row tiles: formed per channel, summed over channels here
        res["y"] = jnp.sum(res["y"][..., :channels], axis=-1)
    return {
        o: (v[..., :channels] if v.ndim == 3 and v.shape[-1] == cp and cp != channels else v) for o, v in res.items()
    }


# the TMA moves 16-byte-aligned windows of rows whose stride is a multiple of 16 bytes
_TMA_ALIGN_BYTES = 16
# each path's window gets its own 128-byte-aligned row of the s (and ds) block: below 16 lanes that
# row is 4-8 block rows, and the blocks of an lmax-3 table (~20 paths) would outgrow shared memory
_MIN_IN_PLACE_WIDTH = 16


def reads_in_place(group, num_weights: int, itemsize: int = 4) -> bool:
    """Whether ``group``'s paths can read their weights (and write their cotangents) where e3nn puts
    them: ``C`` fills whole tiles of at least 16 lanes (a power of two ``>= 16`` or a multiple of
    128: no padded lane, which would read and write the next path's columns) and every window
    starts, as the rows do, 16-byte aligned (the paths' first columns and ``num_weights`` multiples
    of 4 floats)."""
    align = _TMA_ALIGN_BYTES // itemsize
    lanes = Lanes.of(group.channels)
    return (
        lanes.channels == group.channels
        and lanes.width >= _MIN_IN_PLACE_WIDTH
        and num_weights % align == 0
        and all(int(col) % align == 0 for col in group.weight_columns)
    )


def _first_columns(group) -> tuple[int, ...]:
    """Each path's first column on e3nn's weight axis (static: where its TMA windows start)."""
    return tuple(int(c) for c in group.weight_columns)


def _columns(group) -> np.ndarray:
    """``group``'s columns of e3nn's weight axis in its ``[P, C]`` order (``[P · C]``)."""
    return (np.asarray(group.weight_columns)[:, None] + np.arange(group.channels)).reshape(-1)


def on_triton(group) -> bool:
    """Whether the grouped kernels run ``group`` on the Triton kernels (:mod:`.convolution`, same
    launch protocol, e3nn's weights read and their cotangent written in place there too): a group
    whose tiles hold several rows (``C <= 64``). There Mosaic would read the broadcast ``y``
    expanded over the channels, an ``[E, Dy, C_g]`` array in memory (and a per-channel ``dy`` as
    large: 13.4 GiB at 5·10^6 edges for the 64 and 16 channels of ``256x0e + 64x1o + 16x2e`` ⊗
    l ≤ 2, against 0.17 GiB for ``y``), and the Triton convolutions ran 1.3–2.5x faster at 16, 32
    and 64 channels on an H200 (``pallas_mosaic``'s ``yields``). A plan runs on these kernels when
    its widest groups (most weight columns) are Mosaic's: those groups stay on Mosaic."""
    return Lanes.of(group.channels).rows > 1


def _triton_interpret(interpret) -> bool:
    """The Triton kernels' ``interpret`` for Mosaic's (``False``, or the GPU interpreter's params)."""
    return interpret is not False and interpret is not None


def grouped_convolution(plan, x: jax.Array, y: jax.Array, s: jax.Array, graph, *, interpret=False) -> jax.Array:
    """Every group of ``plan`` (an ``e3j`` mixed-multiplicity plan whose weights are in place):
    ``x [N, Dx_flat]``, ``y [E, Dy]``, ``s [E, num_weights]`` (e3nn's order) → ``m [N, Dout_flat]``.

    One launch per group. A group :func:`on_triton` runs the Triton kernel, reading its columns of
    ``s`` in place. A group that :func:`reads_in_place` loads each path's window of ``s`` where it
    is; another gets its ``[E, P_g, C_g]`` copy. The node features are split into the groups'
    ``[N, Dx_g, C_g]`` and the outputs joined into e3nn's layout around the launches.
    """
    # refused whatever the groups' sizes: a plan of small groups alone runs no Mosaic launch
    check_dtype(jnp.result_type(x, y, s), "grouped_convolution")

    def launch(g, xg):
        if on_triton(g):
            cols = tuple(g.weight_columns.tolist())
            return triton._forward(g.coo, xg, y, s, cols, graph, False, _triton_interpret(interpret))
        if reads_in_place(g, plan.num_weights, jnp.dtype(s.dtype).itemsize):
            return _forward(g.coo, xg, y, s, graph, y_channels=False, s_columns=_first_columns(g), interpret=interpret)
        sg = g.split_weights(s)
        return _forward(g.coo, xg, y, sg, graph, y_channels=False, s_columns=None, interpret=interpret)

    return plan.forward_by_group(x, launch)


def grouped_convolution_bwd(plan, x, y, s, dm, graph, *, outs: tuple[str, ...], interpret=False) -> dict:
    """Cotangents of :func:`grouped_convolution` for ``outs ⊆ {x, y, s}``, in its layouts.

    ``ds [E, num_weights]`` is one buffer the groups write in turn (``plan.backward_by_group``): a
    group that :func:`reads_in_place` writes its columns there, every edge's (padding edges' zeros
    too): the first launch into a fresh buffer (no zeros written first), a later one into the buffer
    threaded through it as a state ref (``pl.run_state``: an operand the launch aliases to its
    output); another group's ``[E, P_g, C_g]`` cotangent is copied into its columns; a group
    :func:`on_triton` writes its columns as the Triton kernel does (every edge's, into a fresh buffer
    when first, else into the one given, aliased). Every column belongs to exactly one path; the
    frame zeroes those no path reads.
    """
    num_edges = graph.senders.shape[0]
    dtype = check_dtype(jnp.result_type(*[a for a in (x, y, s, dm) if a is not None]), "grouped_convolution_bwd")
    itemsize = dtype.itemsize

    def launch(g, xg, dmg, ds):
        if on_triton(g):  # its columns of ds written in place, into ds when given (aliased)
            cols = tuple(g.weight_columns.tolist())
            args = (cols, plan.num_weights, ds, outs, False, _triton_interpret(interpret))
            return triton._backward(g.coo, xg, y, s, dmg, graph, *args)
        kw = dict(outs=outs, y_channels=False, interpret=interpret)
        if not reads_in_place(g, plan.num_weights, itemsize):
            r = _backward(g.coo, xg, y, g.split_weights(s) if s is not None else None, dmg, graph, **kw)
            if "s" in r:
                into = jnp.zeros((num_edges, plan.num_weights), dtype) if ds is None else ds
                r["s"] = into.at[:, _columns(g)].set(r["s"].reshape(num_edges, -1), unique_indices=True)
            return r
        cols = _first_columns(g)
        if ds is None:  # the first launch, or no ds wanted: a fresh buffer (or none)
            return _backward(g.coo, xg, y, s, dmg, graph, s_columns=cols, num_weights=plan.num_weights, **kw)
        # the other cotangents leave the state's scope through refs of their own (their initial zeros
        # are overwritten whole: dead, removed by XLA)
        shapes = {"x": (dmg.shape[0], g.coo.dim_x, g.channels), "y": (num_edges, g.coo.dim_y)}

        def body(refs):
            ds_ref, result_refs = refs
            for o, v in _backward(g.coo, xg, y, s, dmg, graph, s_columns=cols, ds=ds_ref, **kw).items():
                result_refs[o][...] = v

        ds, results = pl.run_state(body)((ds, {o: jnp.zeros(shapes[o], dtype) for o in outs if o != "s"}))
        return {**results, "s": ds}

    return plan.backward_by_group(x, dm, outs, launch)
