"""Pallas GPU (Triton) fused message-passing convolution, forward and backward, deterministic.

``m_b = Σ_{a→b} s_ab · (x_a ⊗ y_ab)`` with ``x [N, Dx, C]``, ``y [E, Dy]`` or ``[E, Dy, C]``,
``s [E, P, C]`` (one scalar per path and channel), ``m [N, Dout, C]``.

Forward (paper Algorithm 2): one program per (receiver, channel block) walks the receiver's CSR
interval of the graph's receiver-sorted ``order``, gathers the sender row ``x_a``, evaluates the
tensor product with the Clebsch–Gordan records unrolled at trace time, factors the edge scalar
``s_ab[i3(i0)]`` out of each output row's record sum, and accumulates in registers; the receiver's
row is written once. Padding edges are outside every interval: they cost nothing. No atomics, so
the result is bitwise reproducible.

Backward (Algorithm 3, made deterministic): one program per (sender, channel block) walks the
sender's interval of ``sender_order`` — the convolution on the transposed graph — so ``dx_a`` is
accumulated in registers and written once, without atomics. Along the way each edge's ``dy_ab``
and ``ds_ab`` are written (every edge has exactly one sender, so these writes never collide). An
extra program zeroes ``dy``/``ds`` of the padding edges. The cotangent of a broadcast ``y`` is a
sum over channels: per channel block in the kernel, then over blocks.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from e3j_core import TensorProductCoo

from ._blocks import channel_block, num_warps

__all__ = ["convolution", "convolution_bwd"]


def _whole(a: jax.Array) -> pl.BlockSpec:
    """The whole array as one block (rows gathered by index inside the kernel)."""
    return pl.BlockSpec(a.shape, lambda *_: (0,) * a.ndim)


def convolution(
    coo: TensorProductCoo, x: jax.Array, y: jax.Array, s: jax.Array, graph, *, y_channels: bool, interpret: bool = False
) -> jax.Array:
    """Fused forward convolution (see the module docstring)."""
    num_nodes, _, channels = x.shape
    dtype = jnp.result_type(x, y, s)
    if num_nodes == 0 or y.shape[0] == 0:
        return jnp.zeros((num_nodes, coo.dim_out, channels), dtype)
    cb = channel_block(channels)
    i3 = coo.i3.tolist()
    table = coo.table

    def kernel(offsets_ref, order_ref, senders_ref, x_ref, y_ref, s_ref, m_ref):
        b, c = pl.program_id(0), pl.program_id(1)
        lanes = pl.ds(c * cb, cb)

        def edge(k, acc):
            e = order_ref[k]
            a = senders_ref[e]
            x_row = functools.cache(lambda i: x_ref[a, i, lanes])
            if y_channels:
                y_row = functools.cache(lambda i: y_ref[e, i, lanes])
            else:
                y_row = functools.cache(lambda i: y_ref[e, i])
            s_row = functools.cache(lambda p: s_ref[e, p, lanes])
            acc = list(acc)

            def on_row(i0, z):  # accumulated as soon as the row is done: one message row live at a time
                acc[i0] = acc[i0] + s_row(i3[i0]) * z

            table.contract(x_row, y_row, on_row=on_row)
            return tuple(acc)

        zero = jnp.zeros((cb,), dtype)
        acc = jax.lax.fori_loop(offsets_ref[b], offsets_ref[b + 1], edge, (zero,) * coo.dim_out)
        for i0 in range(coo.dim_out):
            m_ref[i0, :] = acc[i0].astype(m_ref.dtype)

    args = (graph.receiver_offsets, graph.order, graph.senders, x.astype(dtype), y.astype(dtype), s.astype(dtype))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_nodes, coo.dim_out, channels), dtype),
        grid=(num_nodes, channels // cb),
        in_specs=[_whole(a) for a in args],
        out_specs=pl.BlockSpec((None, coo.dim_out, cb), lambda b, c: (b, 0, c)),
        compiler_params=plt.CompilerParams(num_warps=num_warps(cb), num_stages=1),
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
    ``x`` or ``y`` is (unneeded operands may be ``None``).
    """
    outs = tuple(o for o in ("x", "y", "s") if o in outs)
    num_nodes, _, channels = dm.shape
    num_edges = graph.senders.shape[0]
    dtype = jnp.result_type(*[a for a in (x, y, s, dm) if a is not None])
    want_x, want_y, want_s = ("x" in outs), ("y" in outs), ("s" in outs)
    cb = channel_block(channels)
    nc = channels // cb
    shapes = {
        "x": (num_nodes, coo.dim_x, channels),
        "y": (num_edges, coo.dim_y, channels) if y_channels else (nc, num_edges, coo.dim_y),
        "s": (num_edges, coo.num_paths, channels),
    }
    if not outs:
        return {}
    if num_nodes == 0 or num_edges == 0:
        return {o: jnp.zeros(shapes[o] if o != "y" or y_channels else (num_edges, coo.dim_y), dtype) for o in outs}
    need_x, need_y, need_s = want_y or want_s, want_x or want_s, want_x or want_y
    i3 = coo.i3.tolist()
    # ds is written path by path as the output rows go by: core lists paths in output order
    assert i3 == sorted(i3), "TensorProductCoo paths are not in output order"
    empty_paths = sorted(set(range(coo.num_paths)) - {i3[i0] for i0 in coo.table.i0.tolist()})

    operands = {"x": x, "y": y, "s": s}
    names = [n for n, need in (("x", need_x), ("y", need_y), ("s", need_s)) if need]
    args = [graph.sender_offsets, graph.sender_order, graph.receivers, graph.num_valid.reshape(1)]
    args += [operands[n].astype(dtype) for n in names] + [dm.astype(dtype)]
    out_shape = [jax.ShapeDtypeStruct(shapes[o], dtype) for o in outs]
    out_specs = [
        pl.BlockSpec((None, coo.dim_x, cb), lambda a, c: (jnp.minimum(a, num_nodes - 1), 0, c))
        if o == "x"
        else _whole(jax.ShapeDtypeStruct(shapes[o], dtype))
        for o in outs
    ]

    def kernel(offsets_ref, order_ref, receivers_ref, num_valid_ref, *refs):
        refs = dict(zip([*names, "dm", *(f"d{o}" for o in outs)], refs, strict=True))
        a, c = pl.program_id(0), pl.program_id(1)
        lanes = pl.ds(c * cb, cb)
        zero = jnp.zeros((cb,), dtype)

        def rows(e, b):
            r = {}
            if need_x:
                r["x"] = functools.cache(lambda i: refs["x"][a, i, lanes])
            if need_y:
                r["y"] = functools.cache(
                    (lambda i: refs["y"][e, i, lanes]) if y_channels else (lambda i: refs["y"][e, i])
                )
            if need_s:
                r["s"] = functools.cache(lambda p: refs["s"][e, p, lanes])
            r["dm"] = functools.cache(lambda i: refs["dm"][b, i, lanes])
            return r

        def edge(k, dx_acc):
            e = order_ref[k]
            b = receivers_ref[e]
            r = rows(e, b)
            # contract_vjp reads each output row's cotangent once; dm rows are cached (ds reads them too)
            gs = (lambda i0: r["dm"](i0) * r["s"](i3[i0])) if (want_x or want_y) else None
            ds = {"path": None, "sum": None}

            def flush():
                if ds["path"] is not None:
                    refs["ds"][e, ds["path"], lanes] = ds["sum"].astype(dtype)

            def on_row(i0, z):  # rows arrive in output order, so path by path
                if i3[i0] != ds["path"]:
                    flush()
                    ds["path"], ds["sum"] = i3[i0], zero
                ds["sum"] = ds["sum"] + z * r["dm"](i0)

            # one pass over the records by output row: each dm row is live for its row only
            dx, dy = coo.table.contract_vjp(
                r.get("x"),
                r.get("y"),
                gs,
                grads=tuple(g for g, want in (("a", want_x), ("b", want_y)) if want),
                on_row=on_row if want_s else None,
            )
            if want_s:
                flush()
                for p in empty_paths:
                    refs["ds"][e, p, lanes] = zero
            if want_x:
                dx_acc = tuple(dx_acc[i] + dx[i] if i in dx else dx_acc[i] for i in range(coo.dim_x))
            if want_y:
                for i in range(coo.dim_y):
                    v = dy.get(i, zero)
                    if y_channels:
                        refs["dy"][e, i, lanes] = v.astype(dtype)
                    else:
                        refs["dy"][c, e, i] = jnp.sum(v).astype(dtype)
            return dx_acc

        @pl.when(a < num_nodes)
        def _():
            dx = jax.lax.fori_loop(offsets_ref[a], offsets_ref[a + 1], edge, (zero,) * coo.dim_x)
            if want_x:
                for i in range(coo.dim_x):
                    refs["dx"][i, :] = dx[i].astype(dtype)

        if want_y or want_s:  # the last program clears the padding edges' rows

            @pl.when(a == num_nodes)
            def _():
                def clear(k, carry):
                    e = order_ref[k]
                    for i in range(coo.dim_y) if want_y else ():
                        if y_channels:
                            refs["dy"][e, i, lanes] = zero
                        else:
                            refs["dy"][c, e, i] = jnp.zeros((), dtype)
                    for p in range(coo.num_paths) if want_s else ():
                        refs["ds"][e, p, lanes] = zero
                    return carry

                jax.lax.fori_loop(num_valid_ref[0], num_edges, clear, 0)

    results = pl.pallas_call(
        kernel,
        out_shape=tuple(out_shape),
        grid=(num_nodes + (1 if (want_y or want_s) else 0), nc),
        in_specs=[_whole(a) for a in args],
        out_specs=tuple(out_specs),
        compiler_params=plt.CompilerParams(num_warps=num_warps(cb), num_stages=1),
        interpret=interpret,
        name="e3j_convolution_bwd",
    )(*args)
    res = dict(zip(outs, results, strict=True))
    if want_y and not y_channels:
        res["y"] = functools.reduce(jnp.add, list(res["y"]))
    return res
