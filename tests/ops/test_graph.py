"""Graph.from_edges: CSR orders on host and under jit, padding, index checks, argument validation, pytree."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import e3j
from e3j import Graph

FIELDS = Graph._fields


def reference_csr(index, mask, num_nodes):
    """Stable sort by ``index`` with padding last, and the CSR offsets, with plain numpy loops."""
    valid = [e for e in range(len(index)) if mask[e]]
    order = sorted(valid, key=lambda e: index[e]) + [e for e in range(len(index)) if not mask[e]]
    counts = np.zeros(num_nodes, np.int64)
    for e in valid:
        counts[index[e]] += 1
    return np.array(order, np.int64), np.concatenate([[0], np.cumsum(counts)])


def random_edges(seed, num_nodes, num_edges, padding=0.3):
    rng = np.random.default_rng(seed)
    senders = rng.integers(0, num_nodes, num_edges)
    receivers = rng.integers(0, num_nodes, num_edges)
    mask = rng.random(num_edges) > padding
    # padding edges may carry anything, e.g. the padding node N or garbage
    senders = np.where(mask, senders, rng.integers(-5, num_nodes + 5, num_edges))
    receivers = np.where(mask, receivers, num_nodes)
    return senders, receivers, mask


def assert_graph_equal(a: Graph, b: Graph):
    for name, u, v in zip(FIELDS, a, b):
        assert u.dtype == v.dtype, name
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v), err_msg=name)


def check_against_reference(g: Graph, senders, receivers, mask, num_nodes):
    mask = np.asarray(mask, bool)
    assert g.num_nodes == num_nodes and g.num_edges == len(senders)
    assert int(g.num_valid) == mask.sum()
    np.testing.assert_array_equal(np.asarray(g.edge_mask), mask)
    # padding indices sanitized to 0, valid ones kept
    np.testing.assert_array_equal(np.asarray(g.senders), np.where(mask, senders, 0))
    np.testing.assert_array_equal(np.asarray(g.receivers), np.where(mask, receivers, 0))
    for order, offsets, index in (
        (g.order, g.receiver_offsets, receivers),
        (g.sender_order, g.sender_offsets, senders),
    ):
        ref_order, ref_offsets = reference_csr(np.asarray(index), mask, num_nodes)
        np.testing.assert_array_equal(np.asarray(order), ref_order)
        np.testing.assert_array_equal(np.asarray(offsets), ref_offsets)
    for a in g:
        assert a.dtype == (jnp.bool_ if a is g.edge_mask else jnp.int32)
    # every valid edge into node b is listed in order[offsets[b]:offsets[b+1]]
    order, off = np.asarray(g.order), np.asarray(g.receiver_offsets)
    for b in range(num_nodes):
        block = order[off[b] : off[b + 1]]
        assert all(receivers[e] == b and mask[e] for e in block)
        assert list(block) == sorted(block)  # stable: edge ids ascend within a node


def test_docstring_example():
    g = Graph.from_edges(
        np.array([0, 1, 2, 0]), np.array([1, 0, 1, 2]), num_nodes=3, edge_mask=np.array([True, True, True, False])
    )
    assert g.order.tolist() == [1, 0, 2, 3]
    assert g.receiver_offsets.tolist() == [0, 1, 3, 3]
    assert g.sender_order.tolist() == [0, 1, 2, 3]
    assert g.sender_offsets.tolist() == [0, 1, 2, 3]
    assert g.senders.tolist() == [0, 1, 2, 0] and g.receivers.tolist() == [1, 0, 1, 0]
    assert int(g.num_valid) == 3


@pytest.mark.parametrize(("seed", "num_nodes", "num_edges"), [(0, 5, 17), (1, 1, 6), (2, 9, 40), (3, 4, 1)])
def test_host_matches_numpy_reference(seed, num_nodes, num_edges):
    senders, receivers, mask = random_edges(seed, num_nodes, num_edges)
    g = Graph.from_edges(senders, receivers, num_nodes, mask)
    check_against_reference(g, senders, receivers, mask, num_nodes)


def test_no_mask_means_all_valid():
    senders, receivers, _ = random_edges(4, 6, 20, padding=0.0)
    g = Graph.from_edges(senders, receivers, 6)
    assert int(g.num_valid) == 20 and bool(np.all(np.asarray(g.edge_mask)))
    check_against_reference(g, senders, receivers, np.ones(20, bool), 6)


def test_empty_graph_and_isolated_nodes():
    g = Graph.from_edges(np.zeros(0, np.int32), np.zeros(0, np.int32), 4)
    assert g.num_edges == 0 and g.num_nodes == 4 and int(g.num_valid) == 0
    assert g.receiver_offsets.tolist() == [0, 0, 0, 0, 0]
    g = Graph.from_edges(np.array([3, 3]), np.array([0, 0]), 5)
    assert g.receiver_offsets.tolist() == [0, 2, 2, 2, 2, 2]
    assert g.sender_offsets.tolist() == [0, 0, 0, 0, 2, 2]


@pytest.mark.parametrize(("seed", "num_nodes", "num_edges"), [(5, 5, 17), (6, 8, 33)])
def test_jit_matches_host(seed, num_nodes, num_edges):
    senders, receivers, mask = random_edges(seed, num_nodes, num_edges)
    host = Graph.from_edges(senders, receivers, num_nodes, mask)
    traced = jax.jit(lambda s, r, m: Graph.from_edges(s, r, num_nodes, m))(senders, receivers, mask)
    assert isinstance(traced, Graph)
    assert_graph_equal(host, traced)
    check_against_reference(traced, senders, receivers, mask, num_nodes)
    # a traced mask alone (indices from the host) also takes the traced path
    partly = jax.jit(lambda m: Graph.from_edges(senders, receivers, num_nodes, m))(mask)
    assert_graph_equal(host, partly)


def test_integer_dtypes_are_accepted_and_normalized():
    senders, receivers, mask = random_edges(7, 6, 12)
    base = Graph.from_edges(senders, receivers, 6, mask)
    for dtype in (np.int8, np.int16, np.int32, np.int64, np.uint8):
        s = np.where(mask, senders, 0).astype(dtype)
        r = np.where(mask, receivers, 0).astype(dtype)
        assert_graph_equal(base, Graph.from_edges(s, r, np.int64(6), mask))
        assert_graph_equal(base, Graph.from_edges(list(s), list(r), 6, list(mask)))


# -- out-of-range indices -------------------------------------------------------------------------


def test_out_of_range_sender_on_host_raises():
    with pytest.raises(ValueError, match=r"senders\[2\] = 7 is out of range for num_nodes=4"):
        Graph.from_edges(np.array([0, 1, 7, 9]), np.array([0, 1, 2, 3]), 4)


def test_out_of_range_receiver_on_host_raises():
    with pytest.raises(ValueError, match=r"receivers\[1\] = -1 is out of range for num_nodes=4 \(2 non-padding"):
        Graph.from_edges(np.array([0, 1, 2, 3]), np.array([0, -1, 2, 4]), 4)


def test_out_of_range_padding_is_allowed_on_host():
    mask = np.array([True, False, True, False])
    g = Graph.from_edges(np.array([0, 100, 2, -3]), np.array([1, 4, 3, 4]), 4, mask)
    assert g.senders.tolist() == [0, 0, 2, 0] and g.receivers.tolist() == [1, 0, 3, 0]
    assert int(g.num_valid) == 2


def test_out_of_range_under_jit_is_padding_without_checks():
    senders, receivers = np.array([0, 5, 2, 1, 1]), np.array([1, 2, 0, -2, 2])
    g = jax.jit(lambda s, r: Graph.from_edges(s, r, 3))(senders, receivers)
    assert g.edge_mask.tolist() == [True, False, True, False, True]
    assert int(g.num_valid) == 3
    assert g.senders.tolist() == [0, 0, 2, 0, 1] and g.receivers.tolist() == [1, 0, 0, 0, 2]
    assert g.order.tolist() == [2, 0, 4, 1, 3]  # padding last
    assert g.receiver_offsets.tolist() == [0, 1, 2, 3]


def test_check_indices_under_jit_reports_through_checkify():
    def build(s, r):
        return Graph.from_edges(s, r, 3, check_indices=True)

    checked = checkify.checkify(jax.jit(build))
    err, g = checked(jnp.array([0, 5, 2]), jnp.array([1, 2, 0]))
    assert err.get() is not None and "senders/receivers out of range" in err.get()
    with pytest.raises(checkify.JaxRuntimeError, match="out of range"):
        err.throw()
    assert int(g.num_valid) == 2  # the bad edge is still treated as padding
    err, g = checked(jnp.array([0, 1, 2]), jnp.array([1, 2, 0]))
    assert err.get() is None and int(g.num_valid) == 3
    # padding edges are exempt from the check
    err, _ = jax.jit(checkify.checkify(lambda s, r, m: Graph.from_edges(s, r, 3, m, check_indices=True)))(
        jnp.array([0, 9]), jnp.array([1, 3]), jnp.array([True, False])
    )
    assert err.get() is None


# -- argument validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"senders": np.zeros((2, 2), int)}, ValueError, r"senders must be 1-D \[E\], got shape \(2, 2\)"),
        ({"receivers": np.array(1)}, ValueError, r"receivers must be 1-D \[E\], got shape \(\)"),
        ({"senders": np.array([0.0, 1.0, 0.0])}, TypeError, "senders must have an integer dtype, got float64"),
        ({"receivers": np.array([True, False, True])}, TypeError, "receivers must have an integer dtype, got bool"),
        ({"senders": np.array([0, 1])}, ValueError, r"senders \(2,\) and receivers \(3,\) must have one shape"),
        ({"edge_mask": np.array([1, 0, 1])}, TypeError, r"edge_mask must be bool \[3\], got dtype int64"),
        ({"edge_mask": np.array([True, False])}, ValueError, r"edge_mask must be bool \[3\], got shape \(2,\)"),
        ({"num_nodes": -1}, ValueError, r"num_nodes must be an int >= 0 \(static, not traced\), got -1"),
        ({"num_nodes": 3.0}, ValueError, r"num_nodes must be an int >= 0 \(static, not traced\), got 3.0"),
        ({"num_nodes": True}, ValueError, r"num_nodes must be an int >= 0 \(static, not traced\), got True"),
    ],
)
def test_bad_arguments_raise(kwargs, error, match):
    # inputs.md's rule: the wrong kind of array (dtype) is a TypeError, a wrong shape or count a ValueError
    args = {"senders": np.array([0, 1, 2]), "receivers": np.array([1, 2, 0]), "num_nodes": 3, "edge_mask": None}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        Graph.from_edges(args["senders"], args["receivers"], args["num_nodes"], args["edge_mask"])
    # partition_graph checks its edge arrays and node count by the same rules
    with pytest.raises(error, match=match):
        e3j.partition_graph(args["senders"], args["receivers"], args["num_nodes"], 1, edge_mask=args["edge_mask"])


def test_empty_lists_are_a_graph_without_edges():
    # np.asarray([]) is float64; no edges is valid (inputs.md), as for an empty integer array
    assert Graph.from_edges([], [], 3, edge_mask=[]).num_edges == 0
    g = Graph.from_edges([], [], 3)
    want = Graph.from_edges(np.zeros(0, int), np.zeros(0, int), 3)
    assert g.num_edges == 0
    assert jax.tree.map(lambda a: (a.shape, a.dtype), g) == jax.tree.map(lambda a: (a.shape, a.dtype), want)


def test_bad_arguments_raise_under_jit_too():
    with pytest.raises(TypeError, match="senders must have an integer dtype"):
        jax.jit(lambda s, r: Graph.from_edges(s, r, 3))(jnp.zeros(3), jnp.zeros(3, jnp.int32))
    with pytest.raises(TypeError, match=r"edge_mask must be bool \[3\]"):
        jax.jit(lambda s, r, m: Graph.from_edges(s, r, 3, m))(
            jnp.zeros(3, jnp.int32), jnp.zeros(3, jnp.int32), jnp.ones(3)
        )
    with pytest.raises(ValueError, match=r"num_nodes must be an int >= 0 \(static, not traced\), got \w*Tracer"):
        jax.jit(lambda s, r, n: Graph.from_edges(s, r, n))(jnp.zeros(3, jnp.int32), jnp.zeros(3, jnp.int32), 3)


def test_counts_past_int32_indices_are_refused():
    # e3j's graphs and kernels index nodes and edges with int32: 2**31 edges wrapped to negative
    # orders and offsets, silently. Zero-stride views and abstract shapes: nothing is allocated
    many = np.broadcast_to(np.int32(0), (2**31,))
    match = r"senders: 2147483648 edges exceed the int32 indices of e3j's graphs and kernels \(at most 2\*\*31 - 1"
    with pytest.raises(ValueError, match=match):
        Graph.from_edges(many, many, 3)
    edges = jax.ShapeDtypeStruct((2**31,), jnp.int32)
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(lambda s, r: Graph.from_edges(s, r, 3), edges, edges)
    with pytest.raises(ValueError, match=r"num_nodes: 2147483648 nodes exceed the int32 indices"):
        Graph.from_edges([], [], 2**31)
    fits = jax.ShapeDtypeStruct((2**31 - 1,), jnp.int32)
    assert jax.eval_shape(lambda s, r: Graph.from_edges(s, r, 3), fits, fits).order.shape == (2**31 - 1,)


# -- pytree ---------------------------------------------------------------------------------------


def test_graph_is_a_pytree():
    g = Graph.from_edges(np.array([0, 1, 2, 0]), np.array([1, 0, 1, 2]), 3, np.array([True, True, True, False]))
    leaves, treedef = jax.tree.flatten(g)
    assert len(leaves) == len(FIELDS)
    assert isinstance(jax.tree.unflatten(treedef, leaves), Graph)
    doubled = jax.tree.map(lambda a: a * 2, g)
    assert isinstance(doubled, Graph) and doubled.order.tolist() == [2, 0, 4, 6]
    # through jit as an argument and as a result
    same = jax.jit(lambda g: g)(g)
    assert_graph_equal(g, same)
    assert jax.jit(lambda g: g.receivers[g.order] * g.edge_mask[g.order])(g).tolist() == [0, 1, 1, 0]
    assert jax.jit(lambda g: jnp.zeros(g.num_nodes))(g).shape == (3,)  # num_nodes stays static


def test_graph_argument_to_jitted_convolution():
    conv = e3j.Convolution("0e + 1o", "0e + 1o", filter="0e + 1o")
    senders, receivers, mask = random_edges(8, 4, 10)
    g = Graph.from_edges(senders, receivers, 4, mask)
    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.normal(size=(4, 4, 3)))
    y = jnp.asarray(rng.normal(size=(10, 4)))
    s = jnp.asarray(rng.normal(size=(10, conv.num_paths, 3)))
    eager = conv(x, y, s, g)
    jitted = jax.jit(lambda x, y, s, g: conv(x, y, s, g))(x, y, s, g)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager), rtol=1e-12, atol=1e-12)
    # padding edges contribute nothing: dropping them gives the same messages
    keep = np.flatnonzero(mask)
    dense = Graph.from_edges(senders[keep], receivers[keep], 4)
    np.testing.assert_allclose(np.asarray(conv(x, y[keep], s[keep], dense)), np.asarray(eager), rtol=1e-12, atol=1e-12)
