"""Mosaic GPU fused message-passing convolution (Hopper and newer), forward and backward, deterministic.

``m_b = Σ_{a→b} s_ab · (x_a ⊗ y_ab)`` with ``x [N, Dx, C]``, ``y [E, Dy]`` or ``[E, Dy, C]``,
``s [E, P, C]`` (one scalar per path and channel), ``m [N, Dout, C]``; float32 (Mosaic GPU's TMA
has no float64). Channel counts that are not a multiple of 128 are zero-padded.

Forward (paper Algorithm 2, Appendix E.3): one program — one warpgroup — per (receiver, block of
128 channels) walks the receiver's CSR interval of the graph's receiver-sorted ``order``. For each
edge the TMA stages the gathered sender row ``x_a`` and the edge's ``s_ab`` (and a per-channel
``y_ab``) in shared memory; the Clebsch–Gordan records are unrolled at trace time, the edge scalar
``s_ab[i3(i0)]`` is factored out of each output row's record sum, and the message accumulates in
registers (one channel per thread). The receiver's row is written once. Padding edges are outside
every interval: they cost nothing. No atomics, so the result is bitwise reproducible.

Backward (Algorithm 3, made deterministic as the Triton kernels are): one program per (sender,
channel block) walks the sender's interval of ``sender_order`` — the convolution on the transposed
graph — so ``dx_a`` accumulates in registers and is written once, without atomics; each edge's
``dy_ab`` and ``ds_ab`` are written along the way (an edge has one sender: no two programs write
the same row). One more program clears ``dy``/``ds`` of the padding edges. The cotangent of a
broadcast ``y`` is reduced over the program's lanes in registers, then over channel blocks.

>>> import numpy as np
>>> import e3j
>>> from e3j_core import tensor_product_coo
>>> coo = tensor_product_coo("0e + 1o", "0e + 1o", filter="0e + 1o")
>>> g = e3j.Graph.from_edges(np.array([0, 1]), np.array([1, 0]), 2)
>>> x, y = np.ones((2, 4, 128), np.float32), np.ones((2, 4), np.float32)
>>> s = np.ones((2, coo.num_paths, 128), np.float32)
>>> convolution(coo, x, y, s, g, y_channels=False, interpret=True).shape == (2, coo.dim_out, 128)
True
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from e3j_core import TensorProductCoo

from ._mosaic import LANES, check_dtype, flush, interpret_params, pad_channels, padded_channels, stage, zeros

__all__ = ["convolution", "convolution_bwd"]


def _rows(ref):
    return functools.cache(lambda i: ref[i, :])


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
    y_channels,
):
    """One receiver × ``LANES`` channels of the forward (``y_smem`` is ``None`` for a broadcast y)."""
    b, c = jax.lax.axis_index("node"), jax.lax.axis_index("lanes")
    lanes = pl.ds(c * LANES, LANES)
    dtype = m_smem.dtype

    def edge(k, acc):
        e = order_gmem[k]
        a = senders_gmem[e]
        plgpu.commit_smem()  # every thread has read the previous edge's rows before the TMA overwrites them
        staged = [(x_gmem.at[a, :, lanes], x_smem, barriers.at[0]), (s_gmem.at[e, :, lanes], s_smem, barriers.at[1])]
        if y_channels:
            staged.append((y_gmem.at[e, :, lanes], y_smem, barriers.at[2]))
        stage(staged)
        s_row = _rows(s_smem)
        y_row = _rows(y_smem) if y_channels else functools.cache(lambda i: y_gmem[e, i])
        acc = list(acc)

        def on_row(i0, z):  # accumulated as soon as the row is done: one message row live at a time
            acc[i0] = acc[i0] + s_row(i3[i0]) * z

        table.contract(_rows(x_smem), y_row, on_row=on_row)
        return tuple(acc)

    acc = jax.lax.fori_loop(offsets_gmem[b], offsets_gmem[b + 1], edge, (zeros(dtype),) * len(i3))
    for i0, v in enumerate(acc):
        m_smem[i0, :] = v.astype(dtype)
    flush([(m_smem, m_gmem.at[b, :, lanes])])


def convolution(
    coo: TensorProductCoo, x: jax.Array, y: jax.Array, s: jax.Array, graph, *, y_channels: bool, interpret=False
) -> jax.Array:
    """Fused forward convolution (see the module docstring); ``interpret`` runs Mosaic's GPU interpreter."""
    num_nodes, _, channels = x.shape
    dtype = check_dtype(jnp.result_type(x, y, s), "convolution")
    cp = padded_channels(channels)
    scratch = {
        "x_smem": plgpu.SMEM((coo.dim_x, LANES), dtype),
        "s_smem": plgpu.SMEM((coo.num_paths, LANES), dtype),
        "m_smem": plgpu.SMEM((coo.dim_out, LANES), dtype),
        "barriers": plgpu.Barrier(num_barriers=3),
    }
    defaults = {}
    if y_channels:
        scratch["y_smem"] = plgpu.SMEM((coo.dim_y, LANES), dtype)
    else:
        defaults["y_smem"] = None
    body = functools.partial(convolution_kernel, table=coo.table, i3=coo.i3.tolist(), y_channels=y_channels, **defaults)
    m = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((num_nodes, coo.dim_out, cp), dtype),
        grid=(num_nodes, cp // LANES),
        grid_names=("node", "lanes"),
        scratch_types=scratch,
        interpret=interpret_params(interpret),
        kernel_name="e3j_mosaic_convolution",
    )(
        graph.receiver_offsets,
        graph.order,
        graph.senders,
        pad_channels(x, cp),
        pad_channels(y, cp) if y_channels else y,
        pad_channels(s, cp),
    )
    return m[..., :channels] if cp != channels else m


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
    barriers,
    table,
    i3,
    empty_paths,
    dims,
    y_channels,
    outs,
    num_nodes,
    num_edges,
):
    """One sender × ``LANES`` channels of the backward; the program ``node == num_nodes`` clears padding.

    ``refs`` are the needed operands among ``x, y, s`` (in that order), ``dm``, then the cotangents
    named in ``outs``; unneeded scratch refs are ``None``.
    """
    want_x, want_y, want_s = ("x" in outs), ("y" in outs), ("s" in outs)
    need = {"x": want_y or want_s, "y": want_x or want_s, "s": want_x or want_y}
    refs = list(refs)
    gmem = {n: refs.pop(0) for n in ("x", "y", "s") if need[n]}
    gmem["dm"] = refs.pop(0)
    gmem.update({f"d{o}": refs.pop(0) for o in outs})
    a, c = jax.lax.axis_index("node"), jax.lax.axis_index("lanes")
    lanes = pl.ds(c * LANES, LANES)
    dtype = dm_smem.dtype
    dim_x, dim_y, num_paths = dims

    def store_dy(e, i, v):
        if y_channels:
            gmem["dy"][e, i, lanes] = v.astype(dtype)
        else:  # summed over the block's lanes in registers
            gmem["dy"][c, e, i] = jnp.sum(v).astype(dtype)

    @pl.when(a < num_nodes)
    def _():
        if need["x"]:
            stage([(gmem["x"].at[a, :, lanes], x_smem, barriers.at[0])])
        x_row = _rows(x_smem) if need["x"] else None

        def edge(k, dx_acc):
            e = order_gmem[k]
            b = receivers_gmem[e]
            plgpu.commit_smem()  # every thread has read the previous edge's rows before the TMA overwrites them
            staged = [(gmem["dm"].at[b, :, lanes], dm_smem, barriers.at[1])]
            if need["s"]:
                staged.append((gmem["s"].at[e, :, lanes], s_smem, barriers.at[2]))
            if need["y"] and y_channels:
                staged.append((gmem["y"].at[e, :, lanes], y_smem, barriers.at[3]))
            stage(staged)
            dm_row = _rows(dm_smem)
            s_row = _rows(s_smem) if need["s"] else None
            if need["y"]:
                y_row = _rows(y_smem) if y_channels else functools.cache(lambda i: gmem["y"][e, i])
            else:
                y_row = None
            ds = {"path": None, "sum": None}

            def write_ds():
                if ds["path"] is not None:
                    gmem["ds"][e, ds["path"], lanes] = ds["sum"].astype(dtype)

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
                    gmem["ds"][e, p, lanes] = zeros(dtype)
            if want_y:
                for i in range(dim_y):
                    store_dy(e, i, dy[i] if i in dy else zeros(dtype))
            if want_x:
                dx_acc = tuple(dx_acc[i] + dx[i] if i in dx else dx_acc[i] for i in range(dim_x))
            return dx_acc

        dx = jax.lax.fori_loop(offsets_gmem[a], offsets_gmem[a + 1], edge, (zeros(dtype),) * (dim_x if want_x else 0))
        for i, v in enumerate(dx):
            gmem["dx"][a, i, lanes] = v.astype(dtype)

    if want_y or want_s:

        @pl.when(a == num_nodes)
        def _():
            def clear(k, carry):
                e = order_gmem[k]
                for i in range(dim_y) if want_y else ():
                    if y_channels:
                        gmem["dy"][e, i, lanes] = zeros(dtype)
                    else:
                        gmem["dy"][c, e, i] = jnp.zeros((), dtype)
                for p in range(num_paths) if want_s else ():
                    gmem["ds"][e, p, lanes] = zeros(dtype)
                return carry

            jax.lax.fori_loop(num_valid_gmem[0], num_edges, clear, 0)


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
    outs = tuple(o for o in ("x", "y", "s") if o in outs)
    num_nodes, _, channels = dm.shape
    num_edges = graph.senders.shape[0]
    dtype = check_dtype(jnp.result_type(*[a for a in (x, y, s, dm) if a is not None]), "convolution_bwd")
    cp = padded_channels(channels)
    nc = cp // LANES
    want_x, want_y, want_s = ("x" in outs), ("y" in outs), ("s" in outs)
    need = {"x": want_y or want_s, "y": want_x or want_s, "s": want_x or want_y}
    i3 = coo.i3.tolist()
    # ds is written path by path as the output rows go by: core lists paths in output order
    assert i3 == sorted(i3), "TensorProductCoo paths are not in output order"
    empty_paths = sorted(set(range(coo.num_paths)) - {i3[i0] for i0 in coo.table.i0.tolist()})
    operands = {"x": pad_channels(x, cp), "y": pad_channels(y, cp) if y_channels else y, "s": pad_channels(s, cp)}
    shapes = {
        "x": (num_nodes, coo.dim_x, cp),
        "y": (num_edges, coo.dim_y, cp) if y_channels else (nc, num_edges, coo.dim_y),
        "s": (num_edges, coo.num_paths, cp),
    }
    smem = {
        "x_smem": (need["x"], coo.dim_x),
        "y_smem": (need["y"] and y_channels, coo.dim_y),
        "s_smem": (need["s"], coo.num_paths),
        "dm_smem": (True, coo.dim_out),
    }
    scratch = {k: plgpu.SMEM((rows, LANES), dtype) for k, (needed, rows) in smem.items() if needed}
    scratch["barriers"] = plgpu.Barrier(num_barriers=4)
    body = functools.partial(
        convolution_bwd_kernel,
        table=coo.table,
        i3=i3,
        empty_paths=empty_paths,
        dims=(coo.dim_x, coo.dim_y, coo.num_paths),
        y_channels=y_channels,
        outs=outs,
        num_nodes=num_nodes,
        num_edges=num_edges,
        **{k: None for k, (needed, _) in smem.items() if not needed},
    )
    results = plgpu.kernel(
        body,
        out_type=tuple(jax.ShapeDtypeStruct(shapes[o], dtype) for o in outs),
        grid=(num_nodes + (1 if (want_y or want_s) else 0), nc),
        grid_names=("node", "lanes"),
        scratch_types=scratch,
        interpret=interpret_params(interpret),
        kernel_name="e3j_mosaic_convolution_bwd",
    )(
        graph.sender_offsets,
        graph.sender_order,
        graph.receivers,
        graph.num_valid.reshape(1),
        *(operands[n] for n in ("x", "y", "s") if need[n]),
        pad_channels(dm, cp),
    )
    res = dict(zip(outs, results, strict=True))
    if want_y and not y_channels:
        res["y"] = functools.reduce(jnp.add, list(res["y"]))
    return {o: (v[..., :channels] if v.shape[-1] == cp and cp != channels else v) for o, v in res.items()}
