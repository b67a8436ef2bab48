"""Pallas GPU (Triton) fused message-passing convolution, forward and backward, deterministic.

``m_b = Σ_{a→b} s_ab · (x_a ⊗ y_ab)`` with ``x [N, Dx, C]``, ``y [E, Dy]`` or ``[E, Dy, C]``,
``s [E, P, C]`` (one scalar per path and channel), ``m [N, Dout, C]``.

Forward (paper Algorithm 2): one program per (receiver, channel block) walks the receiver's CSR
interval of the graph's receiver-sorted ``order``, gathers the sender row ``x_a``, evaluates the
tensor product, factors the edge scalar ``s_ab[i3(i0)]`` out of each output row's record sum, and
accumulates in registers; the receiver's row is written once. Padding edges are outside every
interval: they cost nothing. No atomics, so the result is bitwise reproducible.

Backward (Algorithm 3, made deterministic): one program per (sender, channel block) walks the
sender's interval of ``sender_order`` — the convolution on the transposed graph — so ``dx_a`` is
accumulated in registers and written once, without atomics. Along the way each edge's ``dy_ab``
and ``ds_ab`` are written (every edge has exactly one sender, so these writes never collide).
Extra programs zero ``dy``/``ds`` of the padding edges, a run of them each
(``_blocks.clearing_programs``). The cotangent of a broadcast ``y`` is a sum over channels: per
channel block in the kernel, then over blocks.

Tables up to :data:`~e3j_pallas_gpu._records.UNROLL_RECORDS` records are unrolled at trace time
(:func:`convolution_kernel`, :func:`convolution_bwd_kernel`); larger ones are walked
(:func:`convolution_walk_kernel`, :func:`convolution_bwd_walk_kernel`): loops over output rows, edges
and each row's records, on the trilinear table and its transposes (``ds`` rows are paths: ``i3``).

The kernels read the weights (and write their cotangent) as a 2-D ``[E, W]`` array in which path
``p``'s ``C`` weights are the columns ``cols[p] .. cols[p] + C - 1``: ``s [E, P, C]`` reshaped
(``cols[p] = p·C``), or e3nn's ``[E, num_weights]`` as it is. The grouped kernels
(:func:`grouped_convolution`, :func:`grouped_convolution_bwd`) run the groups of a mixed-multiplicity
plan so, one launch per group: each reads its paths' weight columns in place and writes their
cotangent into one shared ``[E, num_weights]`` buffer (aliased from launch to launch), so the weights,
the largest operand, are never copied into the groups' layout. The node-sized operands stay in
e3nn's layouts too: each group reads its rows of the flat ``x`` (and in the backward of ``dm``) where
they are and stores its output rows (``dx``) where e3nn's ``[N, Dout_flat]`` (``[N, Dx_flat]``) has
them, channel ``c`` of a block's row ``m`` at column ``block + c · dim + m`` (strided loads and
stores), the outputs one buffer aliased from launch to launch: around the launches XLA moves nothing
but the sum of ``dy`` over the groups.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from e3j_core import CooTable, TensorProductCoo

from ._blocks import channel_block, clearing_programs, clearing_range, num_warps, result_type
from ._records import records, unrolls, walk_row

__all__ = [
    "convolution",
    "convolution_bwd",
    "convolution_bwd_kernel",
    "convolution_bwd_walk_kernel",
    "convolution_kernel",
    "convolution_walk_kernel",
    "grouped_convolution",
    "grouped_convolution_bwd",
]


# -- kernels ------------------------------------------------------------------------------------


def _lanes(cb: int):
    """This program's channels (program ids are read at the kernel's top level: the interpreter
    substitutes them there only)."""
    return pl.ds(pl.program_id(1) * cb, cb)


def _window(lanes, col):
    """Path columns ``col ..`` of a 2-D weight row, this program's channels of them."""
    return pl.ds(col + lanes.start, lanes.size)


def _flat(node, place, lanes):
    """The index of channels ``lanes`` of one feature row in e3nn's flat ``[N, width]`` layout: row
    ``place = (column, stride)`` has channel ``c`` at column ``column + c · stride`` of ``node``'s row."""
    col, stride = place
    return node, pl.ds(col + lanes.start * stride, lanes.size, stride=stride)


def _node_row(x_ref, a, lanes, x_cols):
    """Row ``i`` of node ``a`` of a node-sized operand (the features ``x``, or the output cotangent
    ``dm`` in the backward): ``[N, D, C]``, or e3nn's flat ``[N, width]`` read in place at
    ``x_cols[i]``."""
    if x_cols is None:
        return lambda i: x_ref[a, i, lanes]
    return lambda i: x_ref[_flat(a, x_cols[i], lanes)]


def _y_row(y_ref, e, lanes, y_channels: bool):
    if y_channels:
        return lambda i: y_ref[e, i, lanes]
    return lambda i: y_ref[e, i]


def convolution_kernel(
    offsets_ref, order_ref, senders_ref, x_ref, y_ref, s_ref, m_ref,
    *, table: CooTable, i3: tuple, cols: tuple, y_channels: bool, out_cols: tuple | None = None, cb: int = 0,
    x_cols: tuple | None = None,
) -> None:  # fmt: skip
    """Receiver ``program_id(0)``'s message row ``m_ref [Dout, cb]``, records unrolled.

    ``offsets_ref``/``order_ref`` are the graph's ``receiver_offsets``/``order``; ``x_ref``, ``y_ref``
    and ``s_ref [E, W]`` are whole arrays, gathered by row; ``i3[i0]`` is the path of output row
    ``i0``, whose weights start at column ``cols[i3[i0]]`` of ``s_ref``. With ``out_cols`` (one
    ``(column, stride)`` per output row) ``m_ref`` is the whole flat output ``[N, W_out]`` and
    channel ``c`` of row ``i0`` goes to column ``column + c · stride`` of the receiver's row: e3nn's
    copy-major blocks, written in place (``cb``: the program's channels). With ``x_cols`` (the same
    per input row) ``x_ref`` is e3nn's flat ``[N, Dx_flat]``, read in place.
    """
    b = pl.program_id(0)
    cb = m_ref.shape[-1] if out_cols is None else cb
    lanes = _lanes(cb)

    def edge(k, acc):
        e = order_ref[k]
        a = senders_ref[e]
        x_row = functools.cache(_node_row(x_ref, a, lanes, x_cols))
        y_row = functools.cache(_y_row(y_ref, e, lanes, y_channels))
        s_row = functools.cache(lambda p: s_ref[e, _window(lanes, cols[p])])
        acc = list(acc)

        def on_row(i0, z):  # accumulated as soon as the row is done: one message row live at a time
            acc[i0] = acc[i0] + s_row(i3[i0]) * z

        table.contract(x_row, y_row, on_row=on_row)
        return tuple(acc)

    zero = jnp.zeros((cb,), m_ref.dtype)
    dim_out = m_ref.shape[0] if out_cols is None else len(out_cols)
    acc = jax.lax.fori_loop(offsets_ref[b], offsets_ref[b + 1], edge, (zero,) * dim_out)
    for i0, v in enumerate(acc):
        if out_cols is None:
            m_ref[i0, :] = v
        else:
            m_ref[_flat(b, out_cols[i0], lanes)] = v


def convolution_walk_kernel(
    offsets_ref, order_ref, senders_ref, table_refs, row_cols_ref, x_ref, y_ref, s_ref, m_ref, *, y_channels: bool
) -> None:
    """:func:`convolution_kernel` walking the records ``table_refs`` of ``coo.table``, output row by
    output row: ``m[i0] = Σ_edges s[e, i3[i0]] · Σ_r c · x[a, i1] · y[e, i2]``, the weights of output
    row ``i0`` starting at column ``row_cols_ref[i0]`` (``cols[i3[i0]]``, ``int32 [Dout]``)."""
    b = pl.program_id(0)
    cb = m_ref.shape[-1]
    lanes = _lanes(cb)
    zero = jnp.zeros((cb,), m_ref.dtype)

    def row(i0, carry):
        def edge(k, acc):
            e = order_ref[k]
            a = senders_ref[e]
            z = walk_row(i0, table_refs, (lambda i: x_ref[a, i, lanes], _y_row(y_ref, e, lanes, y_channels)), zero)
            return acc + s_ref[e, _window(lanes, row_cols_ref[i0])] * z

        m_ref[i0, :] = jax.lax.fori_loop(offsets_ref[b], offsets_ref[b + 1], edge, zero)
        return carry

    jax.lax.fori_loop(0, m_ref.shape[0], row, 0)


def _clear_padding_edges(
    order_ref, num_valid_ref, dy_ref, ds_ref, program, c, lanes, *, cols: tuple, y_channels: bool
) -> None:
    """Zero the ``dy``/``ds`` rows of clearing program ``program``'s share of the padding edges
    (``sender_order[num_valid:]``, :func:`clearing_range`) in channel block ``c`` (``ds``: the paths'
    columns ``cols``, this program's channels)."""
    num_edges = order_ref.shape[0]
    lo, hi = clearing_range(num_valid_ref[0], num_edges, program, clearing_programs(num_edges))
    zero = jnp.zeros((lanes.size,), (dy_ref if dy_ref is not None else ds_ref).dtype)

    # loops, not unrolled stores: the program must not grow with the table (registers, compile time)
    def clear(k, carry):
        e = order_ref[k]

        def dy_row(i, carry):
            if y_channels:
                dy_ref[e, i, lanes] = zero
            else:
                dy_ref[c, e, i] = jnp.zeros((), dy_ref.dtype)
            return carry

        if dy_ref is not None:
            jax.lax.fori_loop(0, dy_ref.shape[1] if y_channels else dy_ref.shape[2], dy_row, 0)
        if ds_ref is not None:  # one store per path: the program grows with the paths, not the records
            for col in cols:
                ds_ref[e, _window(lanes, col)] = zero
        return carry

    jax.lax.fori_loop(lo, hi, clear, 0)


def _store_dy(dy_ref, e, i, v, c, lanes, y_channels: bool) -> None:
    if y_channels:
        dy_ref[e, i, lanes] = v
    else:  # channel block c's partial sum
        dy_ref[c, e, i] = jnp.sum(v)


def convolution_bwd_kernel(
    offsets_ref,
    order_ref,
    receivers_ref,
    num_valid_ref,
    x_ref,
    y_ref,
    s_ref,
    dm_ref,
    dx_ref,
    dy_ref,
    ds_ref,
    *,
    table: CooTable,
    i3: tuple,
    cols: tuple,
    cb: int,
    y_channels: bool,
    x_cols: tuple | None = None,
    dm_cols: tuple | None = None,
) -> None:
    """Sender ``program_id(0)``'s ``dx`` row and its edges' ``dy``/``ds`` rows, records unrolled.

    ``offsets_ref``/``order_ref`` are the graph's ``sender_offsets``/``sender_order``; an operand ref
    may be ``None`` when no requested cotangent reads it, an output ref is when it is not requested. ``dx_ref``
    is the sender's ``[Dx, cb]`` block; ``dy_ref`` (``[E, Dy, C]``, or ``[C / cb, E, Dy]`` partial sums
    for a broadcast ``y``), ``s_ref`` and ``ds_ref`` (``[E, W]``, path ``p`` at columns ``cols[p] ..``)
    are whole; only the paths' columns of ``ds_ref`` are written. Programs ``N ..`` clear the padding
    edges (:func:`clearing_programs`).
    With ``x_cols`` and ``dm_cols`` (see :func:`convolution_kernel`) ``x_ref``, ``dm_ref`` and ``dx_ref``
    are e3nn's flat ``[N, Dx_flat]``/``[N, Dout_flat]``, read in place, and the sender's ``dx`` is
    stored into its columns of ``dx_ref`` (the whole array).
    """
    a, c = pl.program_id(0), pl.program_id(1)
    num_nodes = dm_ref.shape[0]
    lanes = _lanes(cb)
    zero = jnp.zeros((cb,), dm_ref.dtype)
    want_x, want_y, want_s = dx_ref is not None, dy_ref is not None, ds_ref is not None
    # ds is written path by path as the output rows go by: core lists paths in output order
    empty_paths = sorted(set(range(len(cols))) - {i3[i0] for i0 in table.i0.tolist()})

    def edge(k, dx_acc):
        e = order_ref[k]
        b = receivers_ref[e]
        x_row = functools.cache(_node_row(x_ref, a, lanes, x_cols)) if x_ref is not None else None
        y_row = functools.cache(_y_row(y_ref, e, lanes, y_channels)) if y_ref is not None else None
        s_row = functools.cache(lambda p: s_ref[e, _window(lanes, cols[p])]) if s_ref is not None else None
        dm_row = functools.cache(_node_row(dm_ref, b, lanes, dm_cols))  # ds reads the rows again
        # contract_vjp reads each output row's cotangent once
        gs = (lambda i0: dm_row(i0) * s_row(i3[i0])) if (want_x or want_y) else None
        ds = {"path": None, "sum": None}

        def flush():
            if ds["path"] is not None:
                ds_ref[e, _window(lanes, cols[ds["path"]])] = ds["sum"]

        def on_row(i0, z):  # rows arrive in output order, so path by path
            if i3[i0] != ds["path"]:
                flush()
                ds["path"], ds["sum"] = i3[i0], zero
            ds["sum"] = ds["sum"] + z * dm_row(i0)

        # one pass over the records by output row: each dm row is live for its row only
        dx, dy = table.contract_vjp(
            x_row,
            y_row,
            gs,
            grads=tuple(g for g, want in (("a", want_x), ("b", want_y)) if want),
            on_row=on_row if want_s else None,
        )
        if want_s:
            flush()
            for p in empty_paths:
                ds_ref[e, _window(lanes, cols[p])] = zero
        if want_y:
            for i in range(table.dims[2]):
                _store_dy(dy_ref, e, i, dy.get(i, zero), c, lanes, y_channels)
        if want_x:
            dx_acc = tuple(dx_acc[i] + dx[i] if i in dx else dx_acc[i] for i in range(table.dims[1]))
        return dx_acc

    @pl.when(a < num_nodes)
    def _():
        dx = jax.lax.fori_loop(offsets_ref[a], offsets_ref[a + 1], edge, (zero,) * table.dims[1])
        if want_x:
            for i, v in enumerate(dx):
                if x_cols is None:
                    dx_ref[i, :] = v
                else:
                    dx_ref[_flat(a, x_cols[i], lanes)] = v

    if want_y or want_s:

        @pl.when(a >= num_nodes)
        def _():
            _clear_padding_edges(
                order_ref, num_valid_ref, dy_ref, ds_ref, a - num_nodes, c, lanes, cols=cols, y_channels=y_channels
            )


def convolution_bwd_walk_kernel(
    offsets_ref,
    order_ref,
    receivers_ref,
    num_valid_ref,
    dx_table_refs,
    dy_table_refs,
    ds_table_refs,
    cols_ref,
    x_ref,
    y_ref,
    s_ref,
    dm_ref,
    dx_ref,
    dy_ref,
    ds_ref,
    *,
    cols: tuple,
    cb: int,
    y_channels: bool,
) -> None:
    """:func:`convolution_bwd_kernel` walking the records of the trilinear table's transposes; path
    ``p``'s weight columns start at ``cols_ref[p]`` (``int32 [P]``, the static ``cols``).

    ``dx[i1] = Σ_edges Σ_r c · y[e, i2] · s[e, i3] · dm[b, i0]`` (``coo.trilinear.transpose(1)``,
    records ``(i1, i2, i3, i0)``), ``dy[e, i2] = Σ_r c · x[a, i1] · s[e, i3] · dm[b, i0]``
    (``transpose(2)``) and ``ds[e, p] = Σ_r c · x[a, i1] · y[e, i2] · dm[b, i0]`` (``transpose(3)``:
    a path without records gets zero); a table's refs are ``None`` when its cotangent is not asked for.
    """
    a, c = pl.program_id(0), pl.program_id(1)
    num_nodes = dm_ref.shape[0]
    lanes = _lanes(cb)
    zero = jnp.zeros((cb,), dm_ref.dtype)

    def rows(e, b):
        return {
            "x": lambda i: x_ref[a, i, lanes],
            "y": _y_row(y_ref, e, lanes, y_channels) if y_ref is not None else None,
            "s": lambda p: s_ref[e, _window(lanes, cols_ref[p])],
            "dm": lambda i: dm_ref[b, i, lanes],
        }

    def edge_at(k):
        e = order_ref[k]
        return e, receivers_ref[e]

    @pl.when(a < num_nodes)
    def _():
        if dx_ref is not None:

            def dx_row(i1, carry):
                def edge(k, acc):
                    r = rows(*edge_at(k))
                    return acc + walk_row(i1, dx_table_refs, (r["y"], r["s"], r["dm"]), zero)

                dx_ref[i1, :] = jax.lax.fori_loop(offsets_ref[a], offsets_ref[a + 1], edge, zero)
                return carry

            jax.lax.fori_loop(0, dx_ref.shape[0], dx_row, 0)

        if dy_ref is not None or ds_ref is not None:

            def edge(k, carry):
                e, b = edge_at(k)
                r = rows(e, b)
                if dy_ref is not None:

                    def dy_row(i2, carry):
                        v = walk_row(i2, dy_table_refs, (r["x"], r["s"], r["dm"]), zero)
                        _store_dy(dy_ref, e, i2, v, c, lanes, y_channels)
                        return carry

                    jax.lax.fori_loop(0, dy_ref.shape[1 if y_channels else 2], dy_row, 0)
                if ds_ref is not None:

                    def ds_row(p, carry):
                        v = walk_row(p, ds_table_refs, (r["x"], r["y"], r["dm"]), zero)
                        ds_ref[e, _window(lanes, cols_ref[p])] = v
                        return carry

                    jax.lax.fori_loop(0, len(cols), ds_row, 0)
                return carry

            jax.lax.fori_loop(offsets_ref[a], offsets_ref[a + 1], edge, 0)

    if dy_ref is not None or ds_ref is not None:

        @pl.when(a >= num_nodes)
        def _():
            _clear_padding_edges(
                order_ref, num_valid_ref, dy_ref, ds_ref, a - num_nodes, c, lanes, cols=cols, y_channels=y_channels
            )


# -- calls --------------------------------------------------------------------------------------


def _whole(a) -> pl.BlockSpec | None:
    """The whole array as one block (rows gathered by index inside the kernel); ``None`` for ``None``."""
    if a is None:
        return None
    zeros = (0,) * len(a.shape)
    return pl.BlockSpec(a.shape, lambda *_: zeros)


def _params(cb: int):
    return plt.CompilerParams(num_warps=num_warps(cb), num_stages=1)


def _path_columns(num_paths: int, channels: int) -> tuple[int, ...]:
    """The weight columns of ``s [E, P, C]`` viewed as ``[E, P·C]``: path ``p`` starts at ``p·C``."""
    return tuple(range(0, num_paths * channels, channels))


def convolution(
    coo: TensorProductCoo, x: jax.Array, y: jax.Array, s: jax.Array, graph, *, y_channels: bool, interpret: bool = False
) -> jax.Array:
    """Fused forward convolution (see the module docstring)."""
    channels = x.shape[-1]
    s2 = s.reshape(s.shape[0], coo.num_paths * channels)  # free: row-major
    return _forward(coo, x, y, s2, _path_columns(coo.num_paths, channels), graph, y_channels, interpret)


def _forward(
    coo: TensorProductCoo, x, y, s2, cols: tuple, graph, y_channels: bool, interpret: bool,
    out: tuple | None = None, m_into=None, flat_x: tuple | None = None,
) -> jax.Array:  # fmt: skip
    """``m [N, Dout, C]`` from ``x [N, Dx, C]``, ``y`` and the 2-D weights ``s2 [E, W]`` (columns ``cols``).

    With ``out = (width, out_cols)`` (unrolled tables only; see :func:`convolution_kernel`) ``m`` is
    ``[N, width]`` with only this table's columns written: into ``m_into`` (aliased, its other
    columns kept) when given, else into a fresh buffer whose other columns are undefined. With
    ``flat_x = (channels, x_cols)`` (with ``out`` only) ``x`` is e3nn's flat ``[N, Dx_flat]``, read in place.
    """
    num_nodes = x.shape[0]
    channels = x.shape[-1] if flat_x is None else flat_x[0]
    cb = channel_block(channels)
    args = [graph.receiver_offsets, graph.order, graph.senders]
    if unrolls(coo.table):
        kernel = functools.partial(
            convolution_kernel, table=coo.table, i3=tuple(coo.i3.tolist()), cols=cols, y_channels=y_channels,
            out_cols=None if out is None else out[1], cb=cb, x_cols=None if flat_x is None else flat_x[1],
        )  # fmt: skip
    elif out is None:
        kernel = functools.partial(convolution_walk_kernel, y_channels=y_channels)
        args += [records(coo.table, x.dtype), jnp.asarray(np.asarray(cols, np.int32)[coo.i3])]
    else:
        raise ValueError("out: the in-place output needs an unrolled table")
    args += [x, y, s2]
    if out is None:
        out_shape = result_type((num_nodes, coo.dim_out, channels), x.dtype, *args, m_into)
        out_spec = pl.BlockSpec((None, coo.dim_out, cb), lambda b, c: (b, 0, c))
    else:
        out_shape = result_type((num_nodes, out[0]), x.dtype, *args, m_into)
        out_spec = _whole(out_shape)
    aliases = {}
    if m_into is not None:
        # the kernel never reads it: its buffer becomes m's, the other groups' columns kept
        aliases = {len(args): 0}
        kernel = _skipping_arg(kernel, len(args))
        args.append(m_into)
    return pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(num_nodes, channels // cb),
        in_specs=jax.tree.map(_whole, args),
        out_specs=out_spec,
        input_output_aliases=aliases,
        compiler_params=_params(cb),
        interpret=interpret,
        name="e3j_convolution",
    )(*args)


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
    interpret: bool = False,
) -> dict[str, jax.Array]:
    """Cotangents of the convolution for ``outs ⊆ {x, y, s}`` in one sender-ordered sweep.

    ``x`` is read only when ``y`` or ``s`` is requested, ``y`` when ``x`` or ``s`` is, ``s`` when
    ``x`` or ``y`` is (unneeded operands are ``None``).
    """
    num_edges, channels = graph.senders.shape[0], dm.shape[-1]
    width = coo.num_paths * channels
    s2 = s.reshape(num_edges, width) if s is not None else None
    cols = _path_columns(coo.num_paths, channels)
    res = _backward(coo, x, y, s2, dm, graph, cols, width, None, outs, y_channels, interpret)
    if "s" in res:
        res["s"] = res["s"].reshape(num_edges, coo.num_paths, channels)
    return res


def _backward(
    coo: TensorProductCoo, x, y, s2, dm, graph, cols: tuple, width: int, ds_into, outs, y_channels: bool,
    interpret: bool, flat: tuple | None = None, dx_into=None,
) -> dict[str, jax.Array]:  # fmt: skip
    """:func:`convolution_bwd` on 2-D weights ``s2 [E, width]`` (columns ``cols``); ``ds`` is
    ``[E, width]`` with only the paths' columns written: into ``ds_into`` (aliased, its other columns
    kept) when given, else into a fresh buffer whose other columns are undefined.

    With ``flat = (channels, x_cols, dm_cols, Dx_flat)`` (unrolled tables only) ``x`` and ``dm`` are
    e3nn's flat ``[N, Dx_flat]``/``[N, Dout_flat]``, read in place, and ``dx`` is ``[N, Dx_flat]`` with
    this table's columns written, into ``dx_into`` as ``ds`` into ``ds_into``."""
    num_nodes = dm.shape[0]
    channels = dm.shape[-1] if flat is None else flat[0]
    num_edges = graph.senders.shape[0]
    dtype = dm.dtype
    want = {o: o in outs for o in ("x", "y", "s")}
    cb = channel_block(channels)
    nc = channels // cb
    shapes = {
        "x": (num_nodes, coo.dim_x, channels) if flat is None else (num_nodes, flat[3]),
        "y": (num_edges, coo.dim_y, channels) if y_channels else (nc, num_edges, coo.dim_y),
        "s": (num_edges, width),
    }
    operands = (graph.sender_offsets, graph.sender_order, graph.receivers, graph.num_valid, x, y, s2, dm)
    out_shape = tuple(result_type(shapes[o], dtype, *operands, dx_into, ds_into) if want[o] else None for o in shapes)
    if flat is None:
        dx_spec = pl.BlockSpec((None, coo.dim_x, cb), lambda a, c: (jnp.minimum(a, num_nodes - 1), 0, c))
    else:
        dx_spec = _whole(out_shape[0])
    out_specs = (dx_spec if want["x"] else None, _whole(out_shape[1]), _whole(out_shape[2]))
    args = [graph.sender_offsets, graph.sender_order, graph.receivers, graph.num_valid.reshape(1)]
    if unrolls(coo.table):
        kernel = functools.partial(
            convolution_bwd_kernel, table=coo.table, i3=tuple(coo.i3.tolist()), cols=cols, cb=cb, y_channels=y_channels,
            x_cols=None if flat is None else flat[1], dm_cols=None if flat is None else flat[2],
        )  # fmt: skip
    elif flat is not None:
        raise ValueError("flat: reading e3nn's layouts in place needs an unrolled table")
    else:
        kernel = functools.partial(convolution_bwd_walk_kernel, cols=cols, cb=cb, y_channels=y_channels)
        args += [records(coo.trilinear.transpose(k), dtype) if want[o] else None for k, o in enumerate("xys", 1)]
        args.append(jnp.asarray(cols, jnp.int32))
    args += [x, y, s2, dm]
    aliases = {}
    # the kernel never reads them: their buffers become dx's and ds's, the other groups' columns kept
    for into, name, index in ((dx_into, "x", 0), (ds_into, "s", want["x"] + want["y"])):
        if into is not None and want[name]:
            aliases[len(jax.tree.leaves(args))] = index
            kernel = _skipping_arg(kernel, len(args))
            args.append(into)
    dx, dy, ds = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        # programs N .. clear the padding edges' dy / ds rows
        grid=(num_nodes + (clearing_programs(num_edges) if (want["y"] or want["s"]) else 0), nc),
        in_specs=jax.tree.map(_whole, args),
        out_specs=out_specs,
        input_output_aliases=aliases,
        compiler_params=_params(cb),
        interpret=interpret,
        name="e3j_convolution_bwd",
    )(*args)
    res = {"x": dx, "y": dy, "s": ds}
    if want["y"] and not y_channels:
        res["y"] = functools.reduce(jnp.add, list(dy))
    return {o: res[o] for o in outs}


# Twin of e3j_pallas_tpu.convolution._skipping_arg, on purpose: kernel packages never import each other.
def _skipping_arg(kernel, position: int):
    """``kernel`` taking one more ref, at ``position``, that it does not read (an aliased input)."""

    def run(*refs):
        return kernel(*refs[:position], *refs[position + 1 :])

    return run


# -- mixed multiplicities: the groups of an e3nn plan, weights read in place ---------------------
# (the loop over the groups is the plan's: forward_by_group / backward_by_group)


def grouped_convolution(plan, x: jax.Array, y: jax.Array, s: jax.Array, graph, *, interpret: bool = False) -> jax.Array:
    """Every group of ``plan`` (an ``e3j`` mixed-multiplicity plan whose weights are in place):
    ``x [N, Dx_flat]``, ``y [E, Dy]``, ``s [E, num_weights]`` (e3nn's order) → ``m [N, Dout_flat]``.

    One launch per group, each reading its paths' columns of ``s`` and its rows of ``x`` where they
    are (channel ``c`` of row ``m`` of an irrep block at column ``block + c · dim + m``: a strided
    load) and writing its output blocks where e3nn's ``[N, Dout_flat]`` has them, one buffer aliased
    from launch to launch; where a table is walked, or a path's copies are not consecutive
    (``plan.out_blocks`` is ``None``), ``x`` is split into the groups' ``[N, Dx_g, C_g]`` and their
    outputs joined around the launches.
    """
    places = _places(plan)
    if places is None:

        def launch(g, xg):
            return _forward(g.coo, xg, y, s, tuple(g.weight_columns.tolist()), graph, False, interpret)

        return plan.forward_by_group(x, launch)
    m = None
    for g, (x_cols, out_cols) in zip(plan.groups, places):
        cols = tuple(g.weight_columns.tolist())
        out, flat_x = (plan.irreps_out.dim, out_cols), (g.channels, x_cols)
        m = _forward(g.coo, x, y, s, cols, graph, False, interpret, out=out, m_into=m, flat_x=flat_x)
    return m


def _row_places(columns: np.ndarray) -> tuple[tuple[int, int], ...] | None:
    """``(first column, stride)`` per row of an ``int [D, C]`` column map, or ``None`` where some row's
    channels are not evenly spaced."""
    places = []
    for row in np.asarray(columns):
        stride = int(row[1] - row[0]) if row.size > 1 else 1
        if stride < 1 or not np.array_equal(row, row[0] + stride * np.arange(row.size)):
            return None
        places.append((int(row[0]), stride))
    return tuple(places)


def _places(plan) -> list[tuple[tuple, tuple]] | None:
    """Per group, ``(x_cols, out_cols)`` for the kernels' in-place reads and writes of e3nn's flat
    layouts: each row's ``(first column, stride)`` in the flat ``x`` (:attr:`Group.x_columns`) and in
    the flat output (the block's ``dim``: ``plan.out_blocks``); ``None`` where the groups cannot read
    and write in place (no ``out_blocks``, a table walked rather than unrolled, or channels of an ``x``
    row not evenly spaced, or a column of ``x`` no group reads, whose ``dx`` no launch would write)."""
    if plan.out_blocks is None or not all(unrolls(g.coo.table) for g in plan.groups) or not plan.covers_x():
        return None
    x_places = [_row_places(g.x_columns) for g in plan.groups]
    if any(p is None for p in x_places):
        return None
    rows = [[None] * g.coo.dim_out for g in plan.groups]
    for col, k, row, dim in plan.out_blocks:
        for m in range(dim):
            rows[k][row + m] = (int(col) + m, int(dim))
    assert all(r is not None for rs in rows for r in rs), "an output row of a group has no block"
    return [(xp, tuple(rs)) for xp, rs in zip(x_places, rows)]


def grouped_convolution_bwd(
    plan, x, y, s, dm, graph, *, outs: tuple[str, ...], interpret: bool = False
) -> dict[str, jax.Array]:
    """Cotangents of :func:`grouped_convolution` for ``outs ⊆ {x, y, s}``, in its layouts.

    ``ds [E, num_weights]`` is one buffer that each group's launch writes its columns of, in place
    (every column belongs to exactly one group's path, so together they write all of it); where the
    forward reads ``x`` in place, the launches read ``x`` and ``dm`` in place too and write ``dx [N,
    Dx_flat]`` the same way.
    """
    places = _places(plan)
    if places is None:

        def launch(g, xg, dmg, ds):
            cols = tuple(g.weight_columns.tolist())
            return _backward(g.coo, xg, y, s, dmg, graph, cols, plan.num_weights, ds, outs, False, interpret)

        return plan.backward_by_group(x, dm, outs, launch)
    by_group = dict(zip((id(g) for g in plan.groups), places))

    def launch_flat(g, x, dm, ds, dx):
        cols = tuple(g.weight_columns.tolist())
        x_cols, out_cols = by_group[id(g)]
        flat = (g.channels, x_cols, out_cols, plan.irreps_x.dim)
        return _backward(
            g.coo, x, y, s, dm, graph, cols, plan.num_weights, ds, outs, False, interpret, flat=flat, dx_into=dx
        )

    return plan.backward_by_group(x, dm, outs, launch_flat, flat=True)
