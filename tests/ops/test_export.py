"""Deploying with ``jax.export``: e3j's argument types serialize, the round trip keeps every bit.

The exported functions run on the reference backend (the one that exports for every platform, see
docs/usage.md#deploying-with-jaxexport); symbolic node and edge counts are refused by name.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import e3j

pytest.importorskip("flatbuffers")  # jax.export's serialization format

IRREPS = "0e + 1o + 2e"
CONV = e3j.Convolution(IRREPS, IRREPS, filter=IRREPS)
MULIR = e3j.MulIrConvolution("4x0e + 2x1o", IRREPS, IRREPS)


def _graph(num_nodes=6, num_edges=20, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.arange(num_edges) % 5 != 4
    return e3j.Graph.from_edges(
        rng.integers(0, num_nodes, num_edges), rng.integers(0, num_nodes, num_edges), num_nodes, edge_mask=mask
    )


def _rand(*shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _round_trip(f, *args, vjp_order=0):
    exported = export.export(jax.jit(f), platforms=("cpu",))(*args)
    return export.deserialize(exported.serialize(vjp_order=vjp_order))


def _assert_same(got, want):
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for a, b in zip(got_leaves, want_leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_graph_and_factored_weights_arguments_round_trip():
    g = _graph()
    x, y = _rand(6, 9, 4), _rand(20, 9, seed=1)
    s = _rand(20, CONV.num_paths, 4, seed=2)
    w = e3j.FactoredWeights(_rand(20, 3, seed=3), _rand(3, MULIR.num_weights, seed=4), _rand(MULIR.num_weights, seed=5))
    xf = _rand(6, MULIR.irreps_x.dim, seed=6)

    def conv(x, y, s, g):
        return CONV(x, y, s, g, backend="reference")

    def mulir(x, y, w, g):
        return MULIR(x, y, w, g, backend="reference")

    for f, args in ((conv, (x, y, s, g)), (mulir, (xf, y, w, g))):
        restored = _round_trip(f, *args)
        assert restored.in_tree == jax.tree.structure((args, {}))
        _assert_same(restored.call(*args), jax.jit(f)(*args))


def test_exported_gradient_through_factored_weights():
    g, y = _graph(), _rand(20, 9, seed=1)
    w = e3j.FactoredWeights(_rand(20, 3, seed=3), _rand(3, MULIR.num_weights, seed=4))
    x = _rand(6, MULIR.irreps_x.dim, seed=6)

    def energy(x, w):
        return jnp.sum(MULIR(x, y, w, g, backend="reference") ** 2)

    restored = _round_trip(energy, x, w, vjp_order=1)
    got = jax.grad(restored.call, argnums=(0, 1))(x, w)
    want = jax.grad(energy, argnums=(0, 1))(x, w)
    assert isinstance(got[1], e3j.FactoredWeights)
    _assert_same(got, want)


def test_partitioned_graph_argument_round_trips():
    pg = e3j.partition_graph(np.array([0, 1, 2, 3]), np.array([1, 2, 3, 0]), 4, num_devices=1)
    edge_values = jnp.arange(4.0)

    def f(pg):
        return pg.edge_blocks(edge_values)

    restored = _round_trip(f, pg)
    assert restored.in_tree == jax.tree.structure(((pg,), {}))
    _assert_same(restored.call(pg), f(pg))


@pytest.mark.parametrize("symbolic", ["edges", "nodes"])
def test_symbolic_graph_sizes_are_refused_by_name(symbolic):
    g = _graph()
    n, e = export.symbolic_shape("n, e")
    sizes = {"nodes": (n, 20), "edges": (6, e)}[symbolic]
    shapes = {
        "senders": (sizes[1],),
        "receivers": (sizes[1],),
        "edge_mask": (sizes[1],),
        "order": (sizes[1],),
        "receiver_offsets": (sizes[0] + 1,),
        "sender_order": (sizes[1],),
        "sender_offsets": (sizes[0] + 1,),
        "num_valid": (),
    }
    graph_spec = e3j.Graph(**{k: jax.ShapeDtypeStruct(shapes[k], getattr(g, k).dtype) for k in shapes})
    specs = (
        jax.ShapeDtypeStruct((sizes[0], 9, 4), jnp.float32),
        jax.ShapeDtypeStruct((sizes[1], 9), jnp.float32),
        jax.ShapeDtypeStruct((sizes[1], CONV.num_paths, 4), jnp.float32),
    )
    what = {"nodes": r"receiver_offsets \[N \+ 1\]", "edges": r"senders \[E\]"}[symbolic]
    with pytest.raises(ValueError, match=f"graph: {what} has the symbolic size .*one function per padded size"):
        export.export(jax.jit(lambda x, y, s, g: CONV(x, y, s, g, backend="reference")), platforms=("cpu",))(
            *specs, graph_spec
        )


def test_symbolic_batch_of_a_one_channel_product_exports():
    """``MulIrTensorProduct`` runs a group of one channel with its rows as channels from 32 rows on,
    padding the batch to a multiple: a symbolic batch cannot be, and runs as one channel."""
    (b,) = export.symbolic_shape("B")
    tp = e3j.MulIrTensorProduct("0e + 1o", "0e + 1o + 2e", "0e + 1o")
    f = jax.jit(lambda x, y: tp(x, y, backend="reference"))
    x, y = (jax.ShapeDtypeStruct((b, d), jnp.float32) for d in (4, 9))
    exported = export.export(f, platforms=("cpu",))(x, y)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(70, 4)).astype(np.float32), rng.normal(size=(70, 9)).astype(np.float32)
    np.testing.assert_allclose(exported.call(x, y), f(x, y), rtol=1e-6, atol=1e-6)


def test_symbolic_channel_counts_are_refused_by_name():
    """Backends are chosen per channel count: a symbolic C failed in JAX's lowering ("Symbolic
    dimension 'C' used in a context that requires a constant"), naming nothing. A symbolic batch
    is fine."""
    (b, c) = export.symbolic_shape("B, C")
    tp = e3j.TensorProduct("0e + 1o", "0e + 1o + 2e", filter="0e + 1o")
    f = jax.jit(lambda x, y: tp(x, y, backend="reference"))
    y = jax.ShapeDtypeStruct((b, 9), jnp.float32)
    export.export(f, platforms=("cpu",))(jax.ShapeDtypeStruct((b, 4, 8), jnp.float32), y)
    message = r"the channel axis C of an operand has the symbolic size C: .*one function per channel count"
    with pytest.raises(ValueError, match=message):
        export.export(f, platforms=("cpu",))(jax.ShapeDtypeStruct((b, 4, c), jnp.float32), y)
    g = _graph()
    x, y, s = (jax.ShapeDtypeStruct(shape, jnp.float32) for shape in ((6, 9, c), (20, 9), (20, CONV.num_paths, c)))
    hidden, kernel = (
        jax.ShapeDtypeStruct((20, 3), jnp.float32),
        jax.ShapeDtypeStruct((3, CONV.num_paths * c), jnp.float32),
    )
    routes = {  # the array route decides at lowering, the factored one at trace time
        "array": (lambda x, y, s: CONV(x, y, s, g), (x, y, s)),
        "factored": (lambda x, y, h, k: CONV(x, y, e3j.FactoredWeights(h, k), g), (x, y, hidden, kernel)),
    }
    for fn, args in routes.values():
        with pytest.raises(ValueError, match=message):
            export.export(jax.jit(fn), platforms=("cpu",))(*args)


def test_graph_from_symbolic_edges_is_refused_by_name():
    """``Graph.from_edges`` inside an exported function with a symbolic edge count names the graph,
    where the CSR sort would fail with JAX's "requires a constant", naming nothing."""
    (e,) = export.symbolic_shape("e")

    def f(senders, receivers):
        return e3j.Graph.from_edges(senders, receivers, 6).order

    spec = jax.ShapeDtypeStruct((e,), jnp.int32)
    message = r"graph: senders \[E\] has the symbolic size e: .*one function per padded size"
    with pytest.raises(ValueError, match=message):
        export.export(jax.jit(f), platforms=("cpu",))(spec, spec)
