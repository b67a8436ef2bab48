"""Running :class:`e3j.Convolution` (or :class:`e3j.MulIrConvolution`) on several devices with
``jax.shard_map``.

Receivers are partitioned: device ``d`` of ``D`` owns the contiguous node block
``[d·n, (d+1)·n)`` with ``n = ceil(N / D)`` (the last block is padded with nodes that have no edges)
and every edge pointing into that block. Node features are sharded the same way. Inside the
``shard_map`` each device

1. all-gathers the node features (``jax.lax.all_gather(..., tiled=True)``; any node may send),
2. gathers its *local nodes*: its own ``n`` nodes, then its *halo*, the distinct remote senders of its
   edges (padded to a common ``halo_capacity``),
3. runs the ordinary single-device ``conv(x_local, y_local, s_local, graph_local)`` on the local
   graph (``n + halo_capacity`` nodes, ``edge_capacity`` edges, padding edges masked out), and
4. keeps the first ``n`` output rows, its own receivers.

The partition is computed once on the host with numpy by :func:`partition_graph` (shapes depend on
the graph), and :func:`convolution_sharded` runs it; it is differentiable in ``x``, ``y`` and ``s``
(the all-gather transposes to a reduce-scatter) and can be jitted.

Memory per device: the gathered features ``N_pad·Dx·C``, the local features and output
``(n + halo_capacity)·(Dx + Dout)·C`` (never ``N·Dout·C``: halo nodes have no incoming edges but
only they, not all ``N`` nodes, get output rows), and the edge operands. Given in the caller's edge
order (the default), ``y`` and ``s`` are gathered into per-device blocks by ``partitioned.edge_ids``
before the ``shard_map``: a gather of the whole arrays, which on an Explicit mesh axis each device
holds whole (and their cotangents; on an Auto axis XLA decides, and has returned ``ds``
replicated). Given as device blocks (``edge_layout="blocks"``), each device holds its
``edge_capacity·(Dy + P·C)`` and its block of their cotangents only.

>>> import numpy as np, jax, jax.numpy as jnp, e3j
>>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
>>> conv = e3j.Convolution("0e + 1o", "0e + 1o", filter="0e + 1o")
>>> pg = partition_graph(np.array([0, 1, 2]), np.array([1, 2, 0]), num_nodes=3, num_devices=1)
>>> x, y, s = jnp.ones((3, 4, 2)), jnp.ones((3, 4)), jnp.ones((3, conv.num_paths, 2))
>>> m = convolution_sharded(conv, x, y, s, pg, mesh, "d")
>>> m.shape, bool(jnp.allclose(m, conv(x, y, s, e3j.Graph.from_edges(np.array([0, 1, 2]), np.array([1, 2, 0]), 3))))
((3, 8, 2), True)
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax import shard_map
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from ._checks import STATIC, check_edges_in_range, check_index_count, check_int, check_rank, edge_arrays
from .backends import current_backend_request, programs_per_request
from .convolution import Convolution
from .factored import FactoredWeights
from .graph import Graph
from .mul_ir import MulIrConvolution

__all__ = ["PartitionedGraph", "convolution_sharded", "partition_graph"]


@dataclasses.dataclass(frozen=True)
class PartitionedGraph:
    """A graph split by receiver blocks over ``num_devices`` devices (a pytree; sizes are static).

    Array attributes carry a leading device axis ``[num_devices, ...]``:
        graph: an :class:`e3j.Graph` per device (fields stacked) on the device's
            ``nodes_per_device + halo_capacity`` local nodes and ``edge_capacity`` edges.
        node_ids: ``int32 [D, nodes_per_device + halo_capacity]``: the (padded) global node of each
            local node; own nodes first, then the halo; halo padding points at node 0.
        edge_ids: ``int32 [D, edge_capacity]``: the caller's edge id of each local edge; padding
            edges point at edge 0 and are masked (``graph.edge_mask``).

    Static attributes: ``num_nodes`` (``N``), ``num_edges`` (``E``, the caller's edge count),
    ``num_devices``, ``nodes_per_device`` (``ceil(N / D)``), ``edge_capacity``, ``halo_capacity``.
    """

    graph: Graph
    node_ids: jax.Array
    edge_ids: jax.Array
    num_nodes: int = dataclasses.field(metadata=dict(static=True))
    num_edges: int = dataclasses.field(metadata=dict(static=True))
    num_devices: int = dataclasses.field(metadata=dict(static=True))
    nodes_per_device: int = dataclasses.field(metadata=dict(static=True))
    edge_capacity: int = dataclasses.field(metadata=dict(static=True))
    halo_capacity: int = dataclasses.field(metadata=dict(static=True))

    @property
    def num_nodes_padded(self) -> int:
        """``num_devices · nodes_per_device``: the node axis of the sharded features, padded."""
        return self.num_devices * self.nodes_per_device

    @property
    def num_local_nodes(self) -> int:
        """Rows of a device's local features: its own nodes, then its halo of senders it gathers."""
        return self.nodes_per_device + self.halo_capacity

    def edge_blocks(self, a):
        """``[E, ...]`` in the caller's edge order -> ``[D·edge_capacity, ...]`` device blocks (the
        layout :func:`convolution_sharded` takes with ``edge_layout="blocks"``), padding rows zero.
        For :class:`e3j.FactoredWeights`, the blocks of ``hidden`` (the kernel and bias are per layer,
        not per edge).

        A gather of the whole ``a``: to keep per-device memory at one block, compute edge features
        in the blocks' order instead, from ``edge_ids`` (each local edge's caller id)."""
        if isinstance(a, FactoredWeights):
            return FactoredWeights(self.edge_blocks(a.hidden), a.kernel, a.bias)
        a = jnp.asarray(a)  # a numpy operand indexed by traced ids (the graph a jit argument)
        if a.ndim == 0 or a.shape[0] != self.num_edges:
            # the gather clamps out-of-range ids: a short array would repeat its rows, silently
            raise ValueError(
                f"edge_blocks: a must have one row per edge of the partitioned graph, [{self.num_edges}, ...], "
                f"got shape {a.shape}"
            )
        ids = self.edge_ids.reshape(-1)
        mask = self.graph.edge_mask.reshape((-1,) + (1,) * (a.ndim - 1))
        if a.shape[0] == 0:
            return jnp.zeros((ids.shape[0], *a.shape[1:]), a.dtype)
        return jnp.where(mask, a[ids], 0)


jax.tree_util.register_dataclass(
    PartitionedGraph,
    data_fields=["graph", "node_ids", "edge_ids"],
    meta_fields=["num_nodes", "num_edges", "num_devices", "nodes_per_device", "edge_capacity", "halo_capacity"],
)
# by name for jax.export (its static fields are ints)
jax.export.register_pytree_node_serialization(
    PartitionedGraph,
    serialized_name="e3j.PartitionedGraph",
    serialize_auxdata=lambda aux: json.dumps([int(v) for v in aux]).encode(),
    deserialize_auxdata=lambda data: tuple(json.loads(data)),
)


def partition_graph(
    senders,
    receivers,
    num_nodes: int,
    num_devices: int,
    edge_mask=None,
    *,
    edge_capacity: int | None = None,
    halo_capacity: int | None = None,
) -> PartitionedGraph:
    """Split a graph by receiver blocks for :func:`convolution_sharded` (host numpy, not jittable).

    Args:
        senders, receivers: integer ``[E]`` node indices (numpy or concrete arrays).
        num_nodes: ``N``; need not be divisible by ``num_devices`` (the last block is padded).
        num_devices: ``D``, the size of the mesh axis the convolution will be sharded over.
        edge_mask: optional ``bool [E]``; False marks padding edges, which are dropped.
        edge_capacity: edges per device, at least 1 (default: the largest block's count, or 1); pass a
            fixed value to keep shapes, hence compilations, stable across graphs. Must fit every block.
            The caller's edge count ``E`` is static too (it sizes ``edge_blocks``' input): pad the
            edge list to one length across graphs as well (``edge_mask``).
        halo_capacity: remote senders per device (default: the largest halo); likewise.

    Raises ``ValueError`` for out-of-range non-padding edges or too-small capacities, and
    ``TypeError`` for traced input (the partition's shapes depend on the data).
    """
    num_nodes = check_int("num_nodes", num_nodes, 0, STATIC)
    num_devices = check_int("num_devices", num_devices, 1, STATIC)
    # node and edge ids (global: node_ids, edge_ids) are int32, as are the blocks' graphs
    check_index_count("num_nodes", -(-num_nodes // num_devices) * num_devices, "nodes (padded to the devices' blocks)")
    if any(isinstance(a, jax.core.Tracer) for a in (senders, receivers, edge_mask)):
        raise TypeError("partition_graph runs on the host: pass concrete (numpy) arrays, not traced values")
    senders, receivers, mask = edge_arrays(np, senders, receivers, edge_mask)
    num_edges = senders.shape[0]
    check_edges_in_range(senders, receivers, mask, num_nodes)
    # any integer dtype, as Graph.from_edges: the arithmetic below (-1 marks, node offsets) in int64
    senders, receivers = senders.astype(np.int64), receivers.astype(np.int64)

    n = -(-num_nodes // num_devices)  # nodes per device
    device = np.where(mask, receivers // max(n, 1), -1)
    edges = [np.flatnonzero(device == d) for d in range(num_devices)]
    halos = []
    for d, e in enumerate(edges):
        snd = senders[e]
        halos.append(np.unique(snd[(snd < d * n) | (snd >= (d + 1) * n)]))

    def capacity(name, given, needed, least):
        if given is None:
            return max(needed, least)
        given = check_int(name, given, least, STATIC)
        if given < needed:
            raise ValueError(f"{name}={given} is too small: a device needs {needed}")
        return given

    # at least one edge slot per device: with none (no valid edges anywhere), XLA's CPU compiler
    # crashed (SIGSEGV) compiling the jitted gradient through the sharded call on 2+ devices
    e_cap = capacity("edge_capacity", edge_capacity, max(len(e) for e in edges), 1)
    h_cap = capacity("halo_capacity", halo_capacity, max(len(h) for h in halos), 0)

    graphs, node_ids, edge_ids = [], [], []
    for d, (e, halo) in enumerate(zip(edges, halos)):
        k = len(e)
        snd, rcv = senders[e], receivers[e]
        own = (snd >= d * n) & (snd < (d + 1) * n)
        local_snd = np.where(own, snd - d * n, n + np.searchsorted(halo, snd))
        pad = e_cap - k
        graphs.append(
            Graph.from_edges(
                np.concatenate([local_snd, np.zeros(pad, np.int64)]),
                np.concatenate([rcv - d * n, np.zeros(pad, np.int64)]),
                num_nodes=n + h_cap,
                edge_mask=np.concatenate([np.ones(k, bool), np.zeros(pad, bool)]),
            )
        )
        node_ids.append(np.concatenate([np.arange(d * n, (d + 1) * n), halo, np.zeros(h_cap - len(halo), np.int64)]))
        edge_ids.append(np.concatenate([e, np.zeros(pad, np.int64)]))
    graph = Graph(*(jnp.asarray(np.stack([np.asarray(g[i]) for g in graphs])) for i in range(len(Graph._fields))))
    return PartitionedGraph(
        graph=graph,
        node_ids=jnp.asarray(np.stack(node_ids).astype(np.int32)),
        edge_ids=jnp.asarray(np.stack(edge_ids).astype(np.int32)),
        num_nodes=num_nodes,
        num_edges=num_edges,
        num_devices=num_devices,
        nodes_per_device=n,
        edge_capacity=e_cap,
        halo_capacity=h_cap,
    )


def convolution_sharded(
    conv: Convolution | MulIrConvolution,
    x: jax.Array,
    y: jax.Array,
    s: jax.Array | FactoredWeights,
    partitioned: PartitionedGraph,
    mesh: Mesh,
    axis_name: str,
    *,
    backend: str | None = None,
    edge_layout: str = "caller",
) -> jax.Array:
    """``conv(x, y, s, graph)`` computed with receivers sharded over ``mesh`` axis ``axis_name``.

    Args:
        conv: an :class:`e3j.Convolution`, or an :class:`e3j.MulIrConvolution` (mixed
            multiplicities, flat features; an ``e3j.interop.MessagePassing``'s ``.convolution``).
        x: ``[N, Dx, C]`` node features; y: ``[E, Dy]`` or ``[E, Dy, C]``; s: ``[E, P, C]``, or
            :class:`e3j.FactoredWeights` of ``[E, P·C]`` (each device its rows of ``hidden``, the
            kernel and bias whole), in the caller's node and edge order (the order given to
            :func:`partition_graph`). For a ``MulIrConvolution``, its operands: ``x [N,
            irreps_x.dim]``, ``y [E, irreps_y.dim]``, ``s [E, num_weights]`` or factored weights.
        partitioned: :func:`partition_graph` of the graph, with ``num_devices`` equal to the size of
            the mesh axis.
        mesh, axis_name: the device mesh and the axis to shard receivers over (other mesh axes, if
            any, replicate the computation). Inside a ``jax.shard_map`` of the caller's over other
            axes of the mesh (one graph per index of those axes, say), ``mesh`` may be the
            ``jax.sharding.Mesh`` or ``jax.sharding.get_abstract_mesh()``; ``axis_name`` must not be
            one of the axes that ``shard_map`` maps.
        edge_layout: ``"caller"``: ``y`` and ``s`` in the caller's edge order, gathered into device
            blocks here (a gather of the whole arrays: on an Explicit axis each device holds them
            whole, and so their cotangents); ``"blocks"``: already in the device blocks,
            ``[D·edge_capacity, ...]`` (:meth:`PartitionedGraph.edge_blocks`, or edge features
            computed in that order from ``partitioned.edge_ids``), sharded over ``axis_name``:
            each device then holds one block of edge operands and cotangents, which scales.

    Returns ``[N, Dout, C]`` (``[N, irreps_out.dim]`` for a ``MulIrConvolution``), sharded by
    node blocks over ``axis_name`` (before slicing off the padding nodes; on an Explicit axis,
    replicated when ``N`` does not split evenly), equal to the single-device convolution up to
    summation order. Meshes of Auto and Explicit axes (as ``jax.make_mesh`` makes them) both
    work. The call is compiled as one program, called eagerly too; an eager ``jax.grad`` through
    it on an Explicit axis runs inside ``jax.set_mesh(mesh)``, as JAX requires of eager
    computations on arrays of an Explicit mesh.
    """
    pg = partitioned
    if not isinstance(conv, (Convolution, MulIrConvolution)):
        raise TypeError(f"conv must be an e3j.Convolution or e3j.MulIrConvolution, got {type(conv).__name__}")
    mul_ir = isinstance(conv, MulIrConvolution)
    if not isinstance(pg, PartitionedGraph):
        raise TypeError(f"partitioned must come from e3j.partition_graph, got {type(pg).__name__}")
    if not isinstance(mesh, (Mesh, AbstractMesh)):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh (or, inside shard_map, jax.sharding.get_abstract_mesh()), "
            f"got {type(mesh).__name__}"
        )
    if isinstance(mesh, AbstractMesh):
        # an abstract mesh names no devices: the program runs on the context's (set_mesh, shard_map,
        # use_abstract_mesh); outside one it failed in XLA ("No registered implementation ...")
        current = jax.sharding.get_abstract_mesh()
        if current.empty or dict(current.shape) != dict(mesh.shape):
            context = "none" if current.empty else dict(current.shape)
            raise ValueError(
                f"mesh: an AbstractMesh {dict(mesh.shape)} runs on the devices of the mesh in context (jax.set_mesh, "
                f"shard_map), and that is {context}; pass the jax.sharding.Mesh, or call inside its context"
            )
    if not isinstance(axis_name, str) or axis_name not in mesh.shape:
        raise ValueError(f"axis_name must name one axis of the mesh, {tuple(mesh.shape)}; got {axis_name!r}")
    context = jax.sharding.get_abstract_mesh()
    if context.manual_axes:  # inside a shard_map of the caller's
        if axis_name in context.manual_axes:
            raise ValueError(
                f"axis_name {axis_name!r} is already mapped by the shard_map this call is inside (its axes "
                f"{tuple(context.manual_axes)}): call convolution_sharded outside it, or shard over another axis"
            )
        if dict(context.shape) != dict(mesh.shape):
            raise ValueError(f"mesh {dict(mesh.shape)} is not the mesh of the shard_map this call is inside, "
                             f"{dict(context.shape)}")  # fmt: skip
        mesh = context  # shard_map inside shard_map takes the context's mesh, whose mapped axes are Manual
    if mesh.shape[axis_name] != pg.num_devices:
        raise ValueError(
            f"the graph was partitioned for {pg.num_devices} devices but mesh axis {axis_name!r} "
            f"has {mesh.shape[axis_name]}"
        )
    factored = isinstance(s, FactoredWeights)
    if mul_ir:
        check_rank("x", x, (2,), f"[N, {conv.irreps_x.dim}] for {conv.irreps_x}")
        check_rank("y", y, (2,), f"[E, {conv.irreps_y.dim}] for {conv.irreps_y}")
        if not factored:
            check_rank("s", s, (2,), f"[E, num_weights={conv.num_weights}]")
    else:
        check_rank("x", x, (3,), f"[N, Dx={conv.coo.dim_x}, C]")
        check_rank("y", y, (2, 3), f"[E, Dy={conv.coo.dim_y}] or [E, Dy, C]")
        if not factored:
            check_rank("s", s, (3,), f"[E, num_paths={conv.num_paths}, C]")
    if x.shape[0] != pg.num_nodes:
        raise ValueError(f"x has {x.shape[0]} nodes but the graph was partitioned with num_nodes={pg.num_nodes}")
    if edge_layout not in ("caller", "blocks"):
        raise ValueError(f'edge_layout must be "caller" or "blocks", got {edge_layout!r}')
    blocks = edge_layout == "blocks"
    num_edges = pg.num_devices * pg.edge_capacity if blocks else pg.num_edges
    for name, a in (("y", y), ("s.hidden" if factored else "s", s.hidden if factored else s)):
        rows = jnp.shape(a)[0] if jnp.ndim(a) else None
        if rows != num_edges:
            if blocks:
                raise ValueError(f"{name} has {rows} rows but edge_layout='blocks' takes D·edge_capacity = {num_edges}")
            raise ValueError(f"{name} has {rows} edges but the partitioned graph has {num_edges}")
    # the caller's shapes, here: inside the sharded function conv would name each device's blocks
    if mul_ir:
        conv._check_operands(x, y, s, pg.num_nodes, num_edges, w_name="s")
    elif factored:
        conv._check_factored(x, y, s, pg.num_nodes, num_edges)
    else:
        conv._check_operands(x, y, s, pg.num_nodes, num_edges)
    if pg.num_nodes == 0:  # nothing to gather (XLA refuses a zero-length all_gather)
        current_backend_request(backend)  # a bad name is an error here too
        out = (0, conv.irreps_out.dim) if mul_ir else (0, conv.coo.dim_out, x.shape[2])
        return jnp.zeros(out, x.dtype)

    # compiled as one program, eager calls too: eager jax.grad on an Explicit axis ran the
    # transposes of the reshards and of the padding one by one, and JAX refused the slice of a
    # sharded cotangent they gave. The backend request (an argument, use_backend, E3J_BACKEND) is
    # read here and keys the program, as a fresh jit of the call would see it
    program = _sharded(conv, mesh, axis_name, current_backend_request(backend), blocks)
    with jax.disable_jit(False):  # under disable_jit, the same reshards run one by one
        return program(x, y, s, pg)


@programs_per_request(maxsize=64)
def _sharded(conv: Convolution | MulIrConvolution, mesh, axis_name: str, backend: str | None, blocks: bool):
    """:func:`convolution_sharded`'s program after its checks, jitted (one per setting and value of
    ``E3J_BACKEND``)."""

    @jax.jit
    def program(x, y, s, pg):
        n, n_pad = pg.nodes_per_device, pg.num_nodes_padded
        explicit = mesh.axis_types[mesh.axis_names.index(axis_name)] == AxisType.Explicit
        factored = isinstance(s, FactoredWeights)
        if explicit and not blocks:
            # on an Explicit axis (jax.make_mesh's default) the gathers into device blocks need their
            # operands' layout resolved: edge operands sharded in the caller's order are gathered whole
            y, s = jax.tree.map(lambda a: jax.sharding.reshard(a, NamedSharding(mesh, PartitionSpec())), (y, s))
        x_pad = jnp.pad(x, ((0, n_pad - pg.num_nodes),) + ((0, 0),) * (x.ndim - 1))
        y_blocks, s_blocks = (y, s) if blocks else (pg.edge_blocks(y), pg.edge_blocks(s))

        def local(x_block, y_block, s_block, graph_block, node_ids_block):
            x_all = jax.lax.all_gather(x_block, axis_name, tiled=True)  # [N_pad, Dx, C] or [N_pad, Dx]
            x_local = x_all[node_ids_block[0]]  # own nodes, then halo
            graph = jax.tree.map(lambda a: a[0], graph_block)
            m = conv(x_local, y_block, s_block, graph, backend=backend)
            return m[:n]

        spec = PartitionSpec(axis_name)
        # factored weights: each device its block of hidden, the kernel and bias whole (their
        # cotangents summed over the devices)
        whole = PartitionSpec()
        s_spec = FactoredWeights(spec, whole, None if s.bias is None else whole) if factored else spec
        specs = (spec, spec, s_spec, spec, spec)
        operands = (x_pad, y_blocks, s_blocks, pg.graph, pg.node_ids)
        if explicit:
            # and shard_map takes its inputs only as laid out as its in_specs say; the padded and
            # gathered blocks come out replicated
            operands = jax.tree.map(
                lambda p, a: jax.tree.map(lambda a: jax.sharding.reshard(a, NamedSharding(mesh, p)), a),
                specs,
                operands,
                is_leaf=lambda p: isinstance(p, PartitionSpec),
            )
        if mesh.manual_axes:  # inside a shard_map of the caller's (see _local_backward)
            m = _local_backward(local, mesh, specs, spec)(*operands)
        else:
            m = shard_map(local, mesh=mesh, in_specs=specs, out_specs=spec)(*operands)
        if n_pad == pg.num_nodes:
            return m
        if explicit:  # N rows do not split evenly over the axis: an Explicit layout must say so
            m = jax.sharding.reshard(m, NamedSharding(mesh, PartitionSpec()))
        return m[: pg.num_nodes]

    return program


def _local_backward(local, mesh, in_specs, out_spec):
    """``shard_map(local, ...)`` whose derivative is a second ``shard_map`` that differentiates
    ``local`` on each device: no residual crosses the mapped body's boundary.

    Inside a ``shard_map`` over other mesh axes, JAX 0.11 lowered the residuals that its
    linearization of a nested ``shard_map`` passes out with shardings Shardy refuses (a manual axis
    after a free one; or, with the axes in the other order, local shapes that do not match). The
    backward gathers the node features again; the forward convolution inside it, whose value the
    pullback does not read, is dead code there (the compiled gradient with the host kernels holds
    one forward kernel call). Integer operands (the graph) get no cotangent.
    """
    forward = shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_spec)

    def pullback(operands, cotangent):  # on each device
        leaves, tree = jax.tree.flatten(operands)
        inexact = [jnp.issubdtype(a.dtype, jnp.inexact) for a in leaves]

        def of_inexact(*values):
            it = iter(values)
            return local(*jax.tree.unflatten(tree, [next(it) if f else a for a, f in zip(leaves, inexact)]))

        _, vjp = jax.vjp(of_inexact, *(a for a, f in zip(leaves, inexact) if f))
        grads = iter(vjp(cotangent))
        return jax.tree.unflatten(tree, [next(grads) if f else None for f in inexact])

    backward = shard_map(pullback, mesh=mesh, in_specs=(in_specs, out_spec), out_specs=in_specs)

    @jax.custom_vjp
    def mapped(*operands):
        return forward(*operands)

    mapped.defvjp(lambda *operands: (forward(*operands), operands), lambda res, ct: tuple(backward(res, ct)))
    return mapped
