"""Sharded convolution (``e3j.partition_graph`` + ``e3j.convolution_sharded``) on 4 host devices.

The oracle is the single-device ``conv(x, y, s, graph)``: values and gradients must agree to 1e-12
in float64, with a node count not divisible by the device count, padding edges, and jit.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from installed import require_backend
from jax.sharding import PartitionSpec as P

import e3j

NDEV = 4
TOL = 1e-12


@pytest.fixture(scope="module")
def mesh():
    assert len(jax.devices()) >= NDEV, "tests/conftest.py must request 4 host devices"
    return jax.sharding.Mesh(np.array(jax.devices()[:NDEV]), ("d",))


@pytest.fixture(scope="module")
def conv():
    return e3j.Convolution("0e + 1o", "0e + 1o", filter="0e + 1o + 1e")


def random_problem(conv, *, num_nodes=23, num_edges=80, channels=3, y_channels=False, seed=0):
    rng = np.random.default_rng(seed)
    senders = rng.integers(0, num_nodes, num_edges)
    receivers = rng.integers(0, num_nodes, num_edges)
    # skew: many edges into the last (partial) block, some into node 0
    receivers[:10] = num_nodes - 1
    mask = rng.random(num_edges) > 0.2
    senders[~mask] = num_nodes + 5  # padding edges may hold any index
    x = jnp.asarray(rng.normal(size=(num_nodes, conv.coo.dim_x, channels)))
    y_shape = (num_edges, conv.coo.dim_y) + ((channels,) if y_channels else ())
    y = jnp.asarray(rng.normal(size=y_shape))
    s = jnp.asarray(rng.normal(size=(num_edges, conv.num_paths, channels)))
    return senders, receivers, mask, x, y, s


def loss(m):
    return jnp.sum(jnp.sin(m) * jnp.arange(m.size).reshape(m.shape) / m.size)


def max_err(a, b):
    return float(jnp.max(jnp.abs(a - b))) if a.size else 0.0


@pytest.mark.parametrize("y_channels", [False, True])
def test_values_and_gradients_match_single_device(mesh, conv, y_channels):
    senders, receivers, mask, x, y, s = random_problem(conv, y_channels=y_channels)
    graph = e3j.Graph.from_edges(senders, receivers, 23, edge_mask=mask)
    pg = e3j.partition_graph(senders, receivers, 23, NDEV, edge_mask=mask)
    assert pg.num_nodes_padded == 24 and pg.nodes_per_device == 6

    def single(x, y, s):
        return conv(x, y, s, graph)

    def sharded(x, y, s):
        return e3j.convolution_sharded(conv, x, y, s, pg, mesh, "d")

    ref = single(x, y, s)
    out = jax.jit(sharded)(x, y, s)
    assert out.shape == ref.shape == (23, conv.irreps_out.dim, 3)
    assert float(jnp.max(jnp.abs(ref))) > 0.1  # non-trivial
    assert max_err(out, ref) <= TOL

    g_ref = jax.grad(lambda *a: loss(single(*a)), argnums=(0, 1, 2))(x, y, s)
    g_out = jax.jit(jax.grad(lambda *a: loss(sharded(*a)), argnums=(0, 1, 2)))(x, y, s)
    for name, a, b in zip("xys", g_out, g_ref):
        assert a.shape == b.shape, name
        assert float(jnp.max(jnp.abs(b))) > 0.01, name
        assert max_err(a, b) <= TOL, name
    # padding edges get zero cotangents
    assert float(jnp.max(jnp.abs(g_out[1][~mask]))) == 0.0
    assert float(jnp.max(jnp.abs(g_out[2][~mask]))) == 0.0


def test_partitioned_graph_is_a_jit_argument_and_capacities_are_respected(mesh, conv):
    senders, receivers, mask, x, y, s = random_problem(conv, num_nodes=24, seed=1)  # divisible
    graph = e3j.Graph.from_edges(senders, receivers, 24, edge_mask=mask)
    pg = e3j.partition_graph(senders, receivers, 24, NDEV, edge_mask=mask, edge_capacity=40, halo_capacity=20)
    assert (pg.edge_capacity, pg.halo_capacity, pg.nodes_per_device) == (40, 20, 6)
    assert pg.graph.senders.shape == (NDEV, 40) and pg.node_ids.shape == (NDEV, 26)

    @jax.jit
    def f(x, y, s, pg):
        return e3j.convolution_sharded(conv, x, y, s, pg, mesh, "d")

    out = f(x, y, s, pg)
    assert max_err(out, conv(x, y, s, graph)) <= TOL
    assert out.sharding.spec == jax.sharding.PartitionSpec("d")  # divisible: stays node-sharded


def test_explicit_mesh_axes(conv):
    """jax.make_mesh's axes are Explicit by default: shard_map refused the padded and gathered
    blocks, which come out replicated, for every call on such a mesh."""
    from jax.sharding import AxisType

    explicit = jax.make_mesh((NDEV,), ("d",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:NDEV])
    senders, receivers, mask, x, y, s = random_problem(conv, seed=4)
    graph = e3j.Graph.from_edges(senders, receivers, 23, edge_mask=mask)
    pg = e3j.partition_graph(senders, receivers, 23, NDEV, edge_mask=mask)

    def sharded(x, y, s):
        return e3j.convolution_sharded(conv, x, y, s, pg, explicit, "d")

    ref = conv(x, y, s, graph)
    assert max_err(sharded(x, y, s), ref) <= TOL
    assert max_err(jax.jit(sharded)(x, y, s), ref) <= TOL
    g_ref = jax.grad(lambda *a: loss(conv(*a, graph)), argnums=(0, 1, 2))(x, y, s)
    g_out = jax.jit(jax.grad(lambda *a: loss(sharded(*a)), argnums=(0, 1, 2)))(x, y, s)
    for name, a, b in zip("xys", g_out, g_ref):
        assert max_err(a, b) <= TOL, name
    # eager: JAX refused the slice of a sharded cotangent that the transposes of the padding and the
    # reshards gave when they ran one by one
    with jax.set_mesh(explicit):
        g_eager = jax.grad(lambda *a: loss(sharded(*a)), argnums=(0, 1, 2))(x, y, s)
    for name, a, b in zip("xys", g_eager, g_ref):
        assert max_err(a, b) <= TOL, name
    # operands already sharded over the axis (80 edges, 23 nodes: the nodes padded to 24)
    from jax.sharding import NamedSharding

    x24 = jnp.pad(x, ((0, 1), (0, 0), (0, 0)))
    y_d, s_d, x_d = (jax.sharding.reshard(a, NamedSharding(explicit, P("d"))) for a in (y, s, x24))
    assert max_err(jax.jit(sharded)(x, y_d, s_d), ref) <= TOL
    pg24 = e3j.partition_graph(senders, receivers, 24, NDEV, edge_mask=mask)
    out24 = jax.jit(lambda x, y, s: e3j.convolution_sharded(conv, x, y, s, pg24, explicit, "d"))(x_d, y_d, s_d)
    assert max_err(jnp.asarray(np.asarray(out24)[:23]), ref) <= TOL  # slicing a sharded axis needs a layout


@pytest.mark.parametrize("layout", ["caller", "blocks"])
@pytest.mark.parametrize("explicit", [False, True], ids=["auto", "explicit"])
def test_factored_weights_match_single_device(conv, explicit, layout):
    """FactoredWeights (each device its rows of hidden, the kernel and bias whole) give the
    single-device factored call's values and gradients; padding edges' rows of hidden may hold NaN
    (the kernel's cotangent reads every row). The call refused them and suggested materializing
    them, whose kernel gradient read the NaN."""
    from jax.sharding import AxisType, NamedSharding

    kind = AxisType.Explicit if explicit else AxisType.Auto
    mesh = jax.make_mesh((NDEV,), ("d",), axis_types=(kind,), devices=jax.devices()[:NDEV])
    senders, receivers, mask, x, y, _ = random_problem(conv, seed=11)
    graph = e3j.Graph.from_edges(senders, receivers, 23, edge_mask=mask)
    pg = e3j.partition_graph(senders, receivers, 23, NDEV, edge_mask=mask)
    rng = np.random.default_rng(12)
    hidden = jnp.asarray(rng.normal(size=(80, 5))).at[~mask].set(jnp.nan)
    kernel = jnp.asarray(rng.normal(size=(5, conv.num_paths * 3)))
    bias = jnp.asarray(rng.normal(size=(conv.num_paths * 3,)))

    def single(x, h, k, b):
        return loss(conv(x, y, e3j.FactoredWeights(h, k, b), graph))

    def sharded(x, h, k, b):
        w = e3j.FactoredWeights(h, k, b)
        if layout == "blocks":
            w = pg.edge_blocks(w)  # the blocks of hidden; the kernel and bias as they are
            assert w.kernel is k and w.bias is b
            w = e3j.FactoredWeights(jax.device_put(w.hidden, NamedSharding(mesh, P("d"))), w.kernel, w.bias)
            y_ = jax.device_put(pg.edge_blocks(y), NamedSharding(mesh, P("d")))
        else:
            y_ = y
        return loss(e3j.convolution_sharded(conv, x, y_, w, pg, mesh, "d", edge_layout=layout))

    for b in (None, bias):
        assert abs(jax.jit(sharded)(x, hidden, kernel, b) - single(x, hidden, kernel, b)) <= TOL
        argnums = (0, 1, 2) if b is None else (0, 1, 2, 3)
        want = jax.grad(single, argnums)(x, hidden, kernel, b)
        with jax.set_mesh(mesh):
            got = jax.jit(jax.grad(sharded, argnums))(x, hidden, kernel, b)
        for name, g, w in zip(("x", "hidden", "kernel", "bias"), got, want):
            g, w = jnp.where(jnp.isnan(w), 0, g), jnp.where(jnp.isnan(w), 0, w)  # hidden's padding rows
            assert max_err(g, w) <= TOL and bool(jnp.all(jnp.isfinite(g))), name
    with pytest.raises(ValueError, match=r"s.hidden has 79 edges but the partitioned graph has 80"):
        e3j.convolution_sharded(conv, x, y, e3j.FactoredWeights(hidden[:79], kernel), pg, mesh, "d")
    with pytest.raises(ValueError, match=r"s: FactoredWeights.kernel must be \[H=5, num_weights=15\]"):
        e3j.convolution_sharded(conv, x, y, e3j.FactoredWeights(hidden, kernel[:, :4]), pg, mesh, "d")


@pytest.mark.parametrize("explicit", [False, True], ids=["auto", "explicit"])
def test_edge_operands_given_as_device_blocks(conv, explicit):
    """edge_layout="blocks": y and s already in the devices' blocks, sharded over the axis; the
    values equal the caller-order call's, and the cotangents come back as sharded blocks (the
    caller-order call gathers the whole edge arrays, which an Explicit axis replicates)."""
    from jax.sharding import AxisType, NamedSharding

    kind = AxisType.Explicit if explicit else AxisType.Auto
    mesh = jax.make_mesh((NDEV,), ("d",), axis_types=(kind,), devices=jax.devices()[:NDEV])
    senders, receivers, mask, x, y, s = random_problem(conv, seed=7)
    graph = e3j.Graph.from_edges(senders, receivers, 23, edge_mask=mask)
    pg = e3j.partition_graph(senders, receivers, 23, NDEV, edge_mask=mask)
    y_b, s_b = (jax.device_put(pg.edge_blocks(a), NamedSharding(mesh, P("d"))) for a in (y, s))
    assert y_b.shape[0] == NDEV * pg.edge_capacity

    def sharded(x, y, s):
        return e3j.convolution_sharded(conv, x, y, s, pg, mesh, "d", edge_layout="blocks")

    ref = conv(x, y, s, graph)
    assert max_err(jax.jit(sharded)(x, y_b, s_b), ref) <= TOL
    gx, gy, gs = jax.jit(jax.grad(lambda *a: loss(sharded(*a)), argnums=(0, 1, 2)))(x, y_b, s_b)
    g_ref = jax.grad(lambda *a: loss(conv(*a, graph)), argnums=(0, 1, 2))(x, y, s)
    assert max_err(gx, g_ref[0]) <= TOL
    for name, got, want in (("y", gy, g_ref[1]), ("s", gs, g_ref[2])):
        assert max_err(got, pg.edge_blocks(want)) <= TOL, name
        assert got.sharding.spec[0] == "d", (name, got.sharding)  # one block per device
    with pytest.raises(ValueError, match=r"s has 80 rows but edge_layout='blocks' takes D·edge_capacity"):
        e3j.convolution_sharded(conv, x, y_b, s, pg, mesh, "d", edge_layout="blocks")
    with pytest.raises(ValueError, match="edge_layout must be"):
        e3j.convolution_sharded(conv, x, y, s, pg, mesh, "d", edge_layout="sorted")


def test_device_blocks_keep_edge_memory_per_device(conv):
    """Compiled only, 80,000 edges on an Explicit axis: with the edge operands given as blocks a
    device's temporary memory is less than the whole s (its block and cotangent, and the sweep's
    node-sized and chunk-sized buffers); given in the caller's order, the gather makes it hold
    more than the whole s (a scale audit: 3.8 GiB of
    temporaries per device at 4e5 edges where s was 1.1 GiB)."""
    from jax.sharding import AxisType, NamedSharding

    mesh = jax.make_mesh((NDEV,), ("d",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:NDEV])
    n, e, c = 2_000, 80_000, 16
    rng = np.random.default_rng(0)
    pg = e3j.partition_graph(rng.integers(0, n, e), rng.integers(0, n, e), n, NDEV)
    sharded = NamedSharding(mesh, P("d"))
    x = jax.ShapeDtypeStruct((n, conv.coo.dim_x, c), jnp.float32, sharding=sharded)
    s_bytes = e * conv.num_paths * c * 4
    temps = {}
    for layout, rows in (("caller", e), ("blocks", NDEV * pg.edge_capacity)):
        y = jax.ShapeDtypeStruct((rows, conv.coo.dim_y), jnp.float32, sharding=sharded)
        s = jax.ShapeDtypeStruct((rows, conv.num_paths, c), jnp.float32, sharding=sharded)

        def f(x, y, s, layout=layout):
            m = e3j.convolution_sharded(conv, x, y, s, pg, mesh, "d", edge_layout=layout, backend="reference")
            return jnp.sum(m)

        compiled = jax.jit(jax.grad(f, argnums=(0, 1, 2))).lower(x, y, s).compile()
        temps[layout] = compiled.memory_analysis().temp_size_in_bytes
    assert temps["blocks"] < s_bytes < temps["caller"], (temps, s_bytes)
    assert temps["blocks"] < temps["caller"] / 4, temps


@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.uint64, np.int8, np.int16])
def test_any_integer_index_dtype(mesh, conv, dtype):
    """The index dtypes Graph.from_edges takes: unsigned ones overflowed on partition_graph's -1
    marks, and int8 on node offsets beyond its range (NumPy 2's promotion)."""
    senders, receivers, mask, *_ = random_problem(conv, seed=5)
    senders[~mask] = 0
    want = e3j.partition_graph(senders, receivers, 23, NDEV, edge_mask=mask)
    got = e3j.partition_graph(senders.astype(dtype), receivers.astype(dtype), 23, NDEV, edge_mask=mask)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(a, b)
    # node offsets past int8's range: 300 nodes on one device
    small = np.array([0, 100, 5], np.int8), np.array([100, 0, 127], np.int8)
    pg = e3j.partition_graph(*small, 300, 1)
    assert pg.num_nodes_padded == 300 and int(pg.graph.edge_mask.sum()) == 3


def test_numpy_operands_with_a_traced_partition(mesh, conv):
    """y and s as NumPy arrays (precomputed on the host) with the partitioned graph a jit argument:
    indexing NumPy by the traced edge ids raised TracerArrayConversionError."""
    senders, receivers, mask, x, y, s = random_problem(conv, seed=6)
    graph = e3j.Graph.from_edges(senders, receivers, 23, edge_mask=mask)
    pg = e3j.partition_graph(senders, receivers, 23, NDEV, edge_mask=mask)
    y_np, s_np = np.asarray(y), np.asarray(s)
    out = jax.jit(lambda pg: e3j.convolution_sharded(conv, x, y_np, s_np, pg, mesh, "d"))(pg)
    assert max_err(out, conv(x, y, s, graph)) <= TOL


def test_other_mesh_axes_replicate(conv):
    mesh2 = jax.sharding.Mesh(np.array(jax.devices()[:NDEV]).reshape(2, 2), ("d", "r"))
    senders, receivers, mask, x, y, s = random_problem(conv, num_nodes=9, num_edges=30, seed=2)
    graph = e3j.Graph.from_edges(senders, receivers, 9, edge_mask=mask)
    pg = e3j.partition_graph(senders, receivers, 9, 2, edge_mask=mask)
    out = e3j.convolution_sharded(conv, x, y, s, pg, mesh2, "d")
    assert max_err(out, conv(x, y, s, graph)) <= TOL


@pytest.mark.parametrize(
    ("backend", "weights", "layout"),
    [("reference", "array", "caller"), ("reference", "factored", "blocks"), ("cuda_host", "array", "blocks"),
     ("test", "factored", "caller")],
)  # fmt: skip
def test_mixed_multiplicities_match_single_device(mesh, backend, weights, layout):
    """An ``e3j.MulIrConvolution`` (flat features, mixed multiplicities, a self connection, e3nn's
    weight layout) sharded: values and gradients equal its single-device call, padding edges
    included (their rows of ``w`` or ``hidden`` get zero cotangents)."""
    require_backend(backend)
    op = e3j.MulIrConvolution("4x0e + 2x1o + 1x2e", "0e + 1o + 2e", "0e + 1o", self_connection="0e")
    rng = np.random.default_rng(31)
    n, e = 23, 80
    senders, receivers = rng.integers(0, n, e), rng.integers(0, n, e)
    mask = rng.random(e) > 0.2
    graph = e3j.Graph.from_edges(senders, receivers, n, edge_mask=mask)
    pg = e3j.partition_graph(senders, receivers, n, NDEV, edge_mask=mask)
    factored = weights == "factored"
    x = jnp.asarray(rng.normal(size=(n, op.irreps_x.dim)))
    y = jnp.asarray(rng.normal(size=(e, op.irreps_y.dim)))
    h = jnp.asarray(rng.normal(size=(e, 5 if factored else op.num_weights)))
    k = jnp.asarray(rng.normal(size=(5, op.num_weights)))

    def single(x, y, h, k):
        w = e3j.FactoredWeights(h, k) if factored else h
        return loss(op(x, y, w, graph))

    def sharded(x, y, h, k):
        w = e3j.FactoredWeights(h, k) if factored else h
        if layout == "blocks":
            y, w = pg.edge_blocks(y), pg.edge_blocks(w)
        return loss(e3j.convolution_sharded(op, x, y, w, pg, mesh, "d", backend=backend, edge_layout=layout))

    argnums = (0, 1, 2, 3) if factored else (0, 1, 2)
    want = jax.value_and_grad(single, argnums)(x, y, h, k)
    got = jax.jit(jax.value_and_grad(sharded, argnums))(x, y, h, k)
    for name, a, b in zip(("value", "x", "y", "w", "kernel"), jax.tree.leaves(got), jax.tree.leaves(want)):
        assert float(jnp.max(jnp.abs(b))) > 0.01, name
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=TOL, err_msg=name)
    assert float(jnp.max(jnp.abs(got[1][2][~mask]))) == 0.0  # padding edges' rows
    m = e3j.convolution_sharded(op, x, y, h if not factored else e3j.FactoredWeights(h, k), pg, mesh, "d")
    assert m.shape == (n, op.irreps_out.dim)


def test_interop_message_passing_sharded_through_its_convolution(mesh):
    """``e3j.interop.MessagePassing``'s ``.convolution`` sharded, on the drop-in's arrays, gives the
    drop-in's output (the usage docs' route for a ported model)."""
    e3nn = pytest.importorskip("e3nn_jax")
    from e3j.interop import MessagePassing

    mp = MessagePassing("8x0e + 4x1o", "0e + 1o + 2e", "0e + 1o + 2e", self_connection="0e + 1o")
    rng = np.random.default_rng(41)
    n, e = 15, 60
    senders, receivers = rng.integers(0, n, e), rng.integers(0, n, e)
    x = e3nn.IrrepsArray("8x0e + 4x1o", jnp.asarray(rng.normal(size=(n, 20))))
    y = e3nn.spherical_harmonics("0e + 1o + 2e", jnp.asarray(rng.normal(size=(e, 3))), normalize=True)
    w = jnp.asarray(rng.normal(size=(e, mp.num_weights)))
    want = mp(x, y, w, senders, receivers)
    pg = e3j.partition_graph(senders, receivers, n, NDEV)
    got = e3j.convolution_sharded(mp.convolution, x.array, y.array, w, pg, mesh, "d")
    assert float(jnp.max(jnp.abs(want.array))) > 0.1
    np.testing.assert_allclose(got, want.array, rtol=1e-11, atol=TOL)


def test_mixed_multiplicities_errors(mesh):
    op = e3j.MulIrConvolution("4x0e + 2x1o", "0e + 1o", "0e + 1o")
    pg = e3j.partition_graph(np.array([0, 1, 2]), np.array([1, 2, 0]), 3, NDEV)
    x, y, w = jnp.zeros((3, op.irreps_x.dim)), jnp.zeros((3, op.irreps_y.dim)), jnp.zeros((3, op.num_weights))
    with pytest.raises(ValueError, match=r"x must have shape \[N, 10\] for 4x0e\+2x1o, got shape \(3, 10, 1\)"):
        e3j.convolution_sharded(op, x[..., None], y, w, pg, mesh, "d")
    with pytest.raises(
        ValueError,
        match=rf"s must have shape \[E, num_weights={op.num_weights}\], got shape \(3, {op.num_weights}, 1\)",
    ):
        e3j.convolution_sharded(op, x, y, w[..., None], pg, mesh, "d")
    with pytest.raises(ValueError, match=r"s has 2 edges but the partitioned graph has 3"):
        e3j.convolution_sharded(op, x, y, w[:2], pg, mesh, "d")
    with pytest.raises(ValueError, match=r"x must be \[N=3, 10\] for 4x0e\+2x1o and this graph, got \(3, 9\)"):
        e3j.convolution_sharded(op, x[:, :9], y, w, pg, mesh, "d")
    with pytest.raises(ValueError, match=r"^s must be"):
        e3j.convolution_sharded(op, x, y, w[:, :3], pg, mesh, "d")
    with pytest.raises(TypeError, match=r"conv must be an e3j.Convolution or e3j.MulIrConvolution, got TensorProduct"):
        e3j.convolution_sharded(e3j.TensorProduct("0e", "0e"), x, y, w, pg, mesh, "d")
    empty = e3j.partition_graph(np.zeros(0, int), np.zeros(0, int), 0, NDEV)
    m = e3j.convolution_sharded(op, x[:0], y[:0], w[:0], empty, mesh, "d")
    assert m.shape == (0, op.irreps_out.dim) and m.dtype == x.dtype


NESTED_CASES = [
    ("reference", "auto", "abstract", "array", "caller"),
    ("reference", "explicit", "concrete", "factored", "blocks"),
    ("test", "auto", "concrete", "array", "blocks"),
    ("cuda_host", "explicit", "abstract", "factored", "caller"),
]


@pytest.mark.parametrize(("backend", "axes", "mesh_as", "weights", "layout"), NESTED_CASES)
def test_inside_a_shard_map_over_another_axis(conv, backend, axes, mesh_as, weights, layout):
    """A caller's ``shard_map`` over axis ``r`` (one graph per index) around ``convolution_sharded``
    over ``d``: values and gradients equal each graph's single-device convolution. The gradient
    failed to lower (JAX passed the nested ``shard_map``'s residuals out with shardings Shardy
    refused); the concrete ``Mesh`` was refused inside the ``shard_map``. The Pallas interpreters
    are not run here: behind their host callbacks, two collective groups at once hung XLA's CPU
    rendezvous (the interpreters are CPU stand-ins; the compiled kernels run no callback)."""
    require_backend(backend)
    from jax.sharding import AxisType, NamedSharding

    kind = AxisType.Explicit if axes == "explicit" else AxisType.Auto
    mesh = jax.make_mesh((2, 2), ("r", "d"), axis_types=(kind, kind), devices=jax.devices()[:NDEV])
    factored = weights == "factored"
    n, e, c = 9, 30, 4
    rng = np.random.default_rng(21)
    edges = [(rng.integers(0, n, e), rng.integers(0, n, e)) for _ in range(2)]
    graphs = [e3j.Graph.from_edges(snd, rcv, n) for snd, rcv in edges]
    # one partition per graph, stacked along r: equal capacities give equal shapes
    pgs = [e3j.partition_graph(snd, rcv, n, 2, edge_capacity=e, halo_capacity=n) for snd, rcv in edges]
    pg = jax.tree.map(lambda *a: jnp.stack(a), *pgs)
    x = jnp.asarray(rng.normal(size=(2, n, conv.coo.dim_x, c)))
    y = jnp.asarray(rng.normal(size=(2, e, conv.coo.dim_y)))
    w = jnp.asarray(rng.normal(size=(2, e, 3 if factored else conv.num_paths * c)))
    kernel = jnp.asarray(rng.normal(size=(3, conv.num_paths * c)))

    def weights_of(w, kernel):
        return e3j.FactoredWeights(w, kernel) if factored else w.reshape(w.shape[0], conv.num_paths, c)

    def body(x, y, w, kernel, pg):
        pg = jax.tree.map(lambda a: a[0], pg)
        s = weights_of(w[0], kernel)
        y = y[0]
        if layout == "blocks":  # within the r block: d is not mapped here
            y, s = pg.edge_blocks(y), pg.edge_blocks(s)
        where = mesh if mesh_as == "concrete" else jax.sharding.get_abstract_mesh()
        m = e3j.convolution_sharded(conv, x[0], y, s, pg, where, "d", backend=backend, edge_layout=layout)
        return jax.lax.psum(loss(m), "r")

    mapped = jax.shard_map(
        body, mesh=mesh, in_specs=(P("r"), P("r"), P("r"), P(), P("r")), out_specs=P(), axis_names={"r"}
    )
    operands = [jax.device_put(a, NamedSharding(mesh, P("r"))) for a in (x, y, w)]
    with jax.set_mesh(mesh):
        got = jax.jit(jax.value_and_grad(mapped, argnums=(0, 1, 2, 3)))(*operands, kernel, pg)

    def single(x, y, w, kernel):
        return sum(loss(conv(x[i], y[i], weights_of(w[i], kernel), graphs[i], backend="reference")) for i in range(2))

    want = jax.value_and_grad(single, argnums=(0, 1, 2, 3))(x, y, w, kernel)
    for name, a, b in zip(("value", "x", "y", "w", "kernel"), jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert float(jnp.max(jnp.abs(b))) > 0.01 or (name == "kernel" and not factored), name
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=TOL, err_msg=name)


def test_axis_mapped_by_the_enclosing_shard_map_is_refused(conv):
    mesh = jax.make_mesh((2, 2), ("r", "d"), axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=jax.devices()[:NDEV])
    senders, receivers, _, x, y, s = random_problem(conv, num_nodes=9, num_edges=30, seed=4)
    pg = e3j.partition_graph(senders % 9, receivers, 9, 2)

    def body(x, axis):
        return e3j.convolution_sharded(conv, x, y, s, pg, jax.sharding.get_abstract_mesh(), axis)

    for mapped, axis in (({"d"}, "d"), ({"r", "d"}, "r")):
        f = jax.shard_map(functools.partial(body, axis=axis), mesh=mesh, in_specs=P(), out_specs=P(), axis_names=mapped)
        with pytest.raises(ValueError, match=rf"axis_name '{axis}' is already mapped by the shard_map this call is in"):
            f(x)
    other = jax.make_mesh(
        (2, 2), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=jax.devices()[:NDEV]
    )
    with pytest.raises(ValueError, match=r"mesh \{'a': 2, 'b': 2\} is not the mesh of the shard_map this call is in"):
        jax.shard_map(
            lambda x: e3j.convolution_sharded(conv, x, y, s, pg, other, "b"),
            mesh=mesh, in_specs=P(), out_specs=P(), axis_names={"r"},
        )(x)  # fmt: skip


def test_partition_structure():
    rng = np.random.default_rng(3)
    n_nodes, n_edges = 11, 50
    senders = rng.integers(0, n_nodes, n_edges)
    receivers = rng.integers(0, n_nodes, n_edges)
    mask = rng.random(n_edges) > 0.3
    pg = e3j.partition_graph(senders, receivers, n_nodes, NDEV, edge_mask=mask)
    n = pg.nodes_per_device
    assert n == 3 and pg.num_nodes_padded == 12 and pg.num_edges == n_edges
    seen = []
    for d in range(NDEV):
        g = jax.tree.map(lambda a, d=d: np.asarray(a[d]), pg.graph)
        node_ids, edge_ids = np.asarray(pg.node_ids[d]), np.asarray(pg.edge_ids[d])
        assert g.receiver_offsets.shape == (pg.num_local_nodes + 1,)
        valid = g.edge_mask
        assert int(g.num_valid) == valid.sum()
        e = edge_ids[valid]
        seen.extend(e.tolist())
        # local receivers are the device's own block; local senders map back to the global senders
        assert np.all(g.receivers[valid] < n)
        np.testing.assert_array_equal(g.receivers[valid] + d * n, receivers[e])
        np.testing.assert_array_equal(node_ids[g.senders[valid]], senders[e])
        np.testing.assert_array_equal(node_ids[:n], np.arange(d * n, (d + 1) * n))
        halo = node_ids[n : n + len(set(senders[e]) - set(range(d * n, (d + 1) * n)))]
        assert np.all((halo < d * n) | (halo >= (d + 1) * n))
        # no edge points into the halo
        assert np.all(g.receiver_offsets[n:] == g.receiver_offsets[n])
    assert sorted(seen) == np.flatnonzero(mask).tolist()  # every valid edge exactly once


def test_more_devices_than_nodes(mesh, conv):
    senders, receivers = np.array([0, 1, 2, 2]), np.array([1, 2, 0, 2])
    pg = e3j.partition_graph(senders, receivers, 3, NDEV)
    assert pg.nodes_per_device == 1 and pg.num_nodes_padded == 4
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(3, conv.coo.dim_x, 2)))
    y = jnp.asarray(rng.normal(size=(4, conv.coo.dim_y)))
    s = jnp.asarray(rng.normal(size=(4, conv.num_paths, 2)))
    out = e3j.convolution_sharded(conv, x, y, s, pg, mesh, "d")
    assert max_err(out, conv(x, y, s, e3j.Graph.from_edges(senders, receivers, 3))) <= TOL


@pytest.mark.parametrize("num_edges", [0, 3])
def test_no_valid_edges(mesh, conv, num_edges):
    # every edge padding (or none at all): one edge slot per device is kept, since with none XLA's
    # CPU compiler crashed on the jitted gradient (a segfault of the whole process)
    senders, receivers = np.arange(num_edges), (np.arange(num_edges) + 1) % 5
    mask = np.zeros(num_edges, bool)
    pg = e3j.partition_graph(senders, receivers, 5, NDEV, edge_mask=mask)
    assert pg.edge_capacity == 1
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(5, conv.coo.dim_x, 2)))
    y = jnp.full((num_edges, conv.coo.dim_y), jnp.nan)  # padding edges may hold anything
    s = jnp.asarray(rng.normal(size=(num_edges, conv.num_paths, 2)))

    def f(x, y, s):
        return loss(e3j.convolution_sharded(conv, x, y, s, pg, mesh, "d") + 1.0)

    value, grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(x, y, s)
    assert float(value) == pytest.approx(float(loss(jnp.ones((5, conv.irreps_out.dim, 2)))))
    for name, g, a in zip("xys", grads, (x, y, s)):
        assert g.shape == a.shape and not bool(jnp.any(g != 0)), name


def test_errors(mesh, conv):
    senders, receivers = np.array([0, 1, 2]), np.array([1, 2, 0])
    with pytest.raises(ValueError, match="receivers\\[1\\] = 7 is out of range"):
        e3j.partition_graph(senders, np.array([1, 7, 0]), 3, NDEV)
    # out-of-range padding edges are fine
    e3j.partition_graph(senders, np.array([1, 7, 0]), 3, NDEV, edge_mask=np.array([True, False, True]))
    with pytest.raises(ValueError, match=r"num_devices must be an int > 0 \(static, not traced\), got 0"):
        e3j.partition_graph(senders, receivers, 3, 0)
    with pytest.raises(ValueError, match="edge_capacity=1 is too small: a device needs 2"):
        e3j.partition_graph(np.array([0, 1, 2]), np.array([0, 0, 2]), 3, 2, edge_capacity=1)
    with pytest.raises(ValueError, match=r"edge_capacity must be an int > 0 \(static, not traced\), got 0"):
        e3j.partition_graph(senders, receivers, 3, NDEV, edge_mask=np.zeros(3, bool), edge_capacity=0)
    with pytest.raises(ValueError, match="halo_capacity=0 is too small"):
        e3j.partition_graph(senders, receivers, 3, NDEV, halo_capacity=0)
    with pytest.raises(TypeError, match="edge_mask must be bool"):
        e3j.partition_graph(senders, receivers, 3, NDEV, edge_mask=np.array([1, 0, 1]))
    with pytest.raises(TypeError, match="senders must have an integer dtype"):
        e3j.partition_graph(senders.astype(float), receivers, 3, NDEV)
    with pytest.raises(TypeError, match="runs on the host"):
        jax.jit(lambda s, r: e3j.partition_graph(s, r, 3, NDEV))(senders, receivers)
    # global node and edge ids are int32 (a larger id wrapped and gathered another edge's rows);
    # a zero-stride view allocates nothing
    many = np.broadcast_to(np.int32(0), (2**31,))
    with pytest.raises(ValueError, match=r"senders: 2147483648 edges exceed the int32 indices"):
        e3j.partition_graph(many, many, 3, NDEV)
    with pytest.raises(ValueError, match=r"num_nodes: 2147483648 nodes \(padded to the devices' blocks\) exceed"):
        e3j.partition_graph(senders, receivers, 2**31 - 3, NDEV)

    pg = e3j.partition_graph(senders, receivers, 3, NDEV)
    x = jnp.zeros((3, conv.coo.dim_x, 2))
    y = jnp.zeros((3, conv.coo.dim_y))
    s = jnp.zeros((3, conv.num_paths, 2))
    with pytest.raises(ValueError, match="partitioned for 4 devices but mesh axis 'd' has 2"):
        mesh2 = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("d",))
        e3j.convolution_sharded(conv, x, y, s, pg, mesh2, "d")
    with pytest.raises(ValueError, match=r"axis_name must name one axis of the mesh, \('d',\); got 'q'"):
        e3j.convolution_sharded(conv, x, y, s, pg, mesh, "q")
    for bad in (["d"], ("d",)):  # a TypeError (unhashable) and a message that read as a contradiction
        with pytest.raises(ValueError, match=r"axis_name must name one axis of the mesh"):
            e3j.convolution_sharded(conv, x, y, s, pg, mesh, bad)
    for bad in (None, jax.devices()[:NDEV]):  # AttributeErrors
        with pytest.raises(TypeError, match=r"mesh must be a jax.sharding.Mesh"):
            e3j.convolution_sharded(conv, x, y, s, pg, bad, "d")
    with pytest.raises(ValueError, match="x has 4 nodes but the graph was partitioned with num_nodes=3"):
        e3j.convolution_sharded(conv, jnp.zeros((4, conv.coo.dim_x, 2)), y, s, pg, mesh, "d")
    with pytest.raises(ValueError, match="s has 2 edges but the partitioned graph has 3"):
        e3j.convolution_sharded(conv, x, y, s[:2], pg, mesh, "d")
    with pytest.raises(TypeError, match=r"must come from e3j\.partition_graph"):
        e3j.convolution_sharded(conv, x, y, s, e3j.Graph.from_edges(senders, receivers, 3), mesh, "d")
    # the caller's shapes are named, not one device's blocks (its nodes and halo, edge_capacity)
    with pytest.raises(ValueError, match=r"x must be \[N=3, Dx=4, C\] .* got \(3, 3, 2\)"):
        e3j.convolution_sharded(conv, x[:, :3], y, s, pg, mesh, "d")
    with pytest.raises(ValueError, match=r"y must be \[E=3, Dy=4\(, C\)\] .* got \(3, 3\)"):
        e3j.convolution_sharded(conv, x, y[:, :3], s, pg, mesh, "d")
    with pytest.raises(ValueError, match=rf"s must be \[E=3, num_paths={conv.num_paths}, C\], got \(3, 2, 2\)"):
        e3j.convolution_sharded(conv, x, y, s[:, :2], pg, mesh, "d")
    with pytest.raises(ValueError, match="x has 2 channels but s has 1"):
        e3j.convolution_sharded(conv, x, y, s[..., :1], pg, mesh, "d")
    # the gather clamps its ids: a short array would come back as blocks repeating its rows
    for bad in (y[:2], jnp.zeros((4, 4)), jnp.zeros(())):
        with pytest.raises(ValueError, match=r"edge_blocks: a must have one row per edge .*\[3, \.\.\.\], got shape"):
            pg.edge_blocks(bad)


def test_abstract_mesh_runs_in_its_context_only(mesh, conv):
    # outside a mesh context an AbstractMesh names no devices: XLA failed ("No registered
    # implementation for untyped custom call to xla.sdy.GlobalToLocalShape")
    senders, receivers, mask, x, y, s = random_problem(conv, seed=13)
    graph = e3j.Graph.from_edges(senders, receivers, 23, edge_mask=mask)
    pg = e3j.partition_graph(senders, receivers, 23, NDEV, edge_mask=mask)
    with jax.set_mesh(mesh):
        out = e3j.convolution_sharded(conv, x, y, s, pg, mesh.abstract_mesh, "d")
    assert max_err(out, conv(x, y, s, graph)) <= TOL
    with pytest.raises(ValueError, match=r"mesh: an AbstractMesh \{'d': 4\} runs on .* and that is none; pass"):
        e3j.convolution_sharded(conv, x, y, s, pg, mesh.abstract_mesh, "d")
    other = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("d",))
    with jax.set_mesh(other), pytest.raises(ValueError, match=r"and that is \{'d': 2\}"):
        e3j.convolution_sharded(conv, x, y, s, pg, mesh.abstract_mesh, "d")


def test_no_nodes(mesh, conv):
    # an empty graph is valid for e3j.Convolution; sharded, XLA refused a zero-length all_gather
    pg = e3j.partition_graph(np.zeros(0, int), np.zeros(0, int), 0, NDEV)
    x, y = jnp.zeros((0, conv.coo.dim_x, 2)), jnp.zeros((0, conv.coo.dim_y))
    s = jnp.zeros((0, conv.num_paths, 2))
    m = e3j.convolution_sharded(conv, x, y, s, pg, mesh, "d")
    assert m.shape == (0, conv.irreps_out.dim, 2) and m.dtype == x.dtype
    grads = jax.grad(lambda x, s: jnp.sum(e3j.convolution_sharded(conv, x, y, s, pg, mesh, "d")), (0, 1))(x, s)
    assert [g.shape for g in grads] == [x.shape, s.shape]
    with pytest.raises(e3j.BackendError, match="unknown e3j backend 'typo'"):
        e3j.convolution_sharded(conv, x, y, s, pg, mesh, "d", backend="typo")


def test_tensor_product_under_shard_map_with_vma_checks():
    """Primitive results carry their operands' varying manual axes, so check_vma=True works."""
    from jax import shard_map
    from jax.sharding import Mesh, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    tp = e3j.TensorProduct("0e + 1o", "0e + 1o")
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(8, 4, 3)))
    y = jnp.asarray(rng.normal(size=(8, 4)))
    spec = PartitionSpec("d")
    f = shard_map(lambda x, y: tp(x, y), mesh=mesh, in_specs=(spec, spec), out_specs=spec, check_vma=True)
    np.testing.assert_allclose(jax.jit(f)(x, y), tp(x, y), atol=1e-14)
    g = jax.grad(lambda x, y: jnp.sum(f(x, y) ** 2), argnums=(0, 1))(x, y)
    g_ref = jax.grad(lambda x, y: jnp.sum(tp(x, y) ** 2), argnums=(0, 1))(x, y)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, atol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "test"])
@pytest.mark.parametrize("factored", [False, True], ids=["array", "factored"])
def test_mixed_multiplicities_under_shard_map(mesh, backend, factored):
    """``e3j.MulIrConvolution`` inside ``shard_map`` (``check_vma`` on), one graph per device: node
    features, edge attributes and per-edge weights (or ``FactoredWeights``' hidden rows) sharded,
    the kernel replicated. Values and gradients, the kernel's summed over the devices, equal a loop
    over the devices' problems without ``shard_map``."""
    require_backend(backend)
    op = e3j.MulIrConvolution("4x0e + 2x1o", "0e + 1o", "0e + 1o")
    rng = np.random.default_rng(3)
    n, e = 5, 9
    graph = e3j.Graph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)
    xs = jnp.asarray(rng.normal(size=(NDEV, n, op.irreps_x.dim)))
    ys = jnp.asarray(rng.normal(size=(NDEV, e, op.irreps_y.dim)))
    hs = jnp.asarray(rng.normal(size=(NDEV, e, 3 if factored else op.num_weights)))
    k = jnp.asarray(rng.normal(size=(3, op.num_weights)))

    def one(x, y, h, kk):
        w = e3j.FactoredWeights(h, kk) if factored else h + 0 * jnp.sum(kk)
        return loss(op(x, y, w, graph, backend=backend))

    def body(x, y, h, kk):
        return jax.lax.psum(one(x[0], y[0], h[0], kk), "d")

    sharded = jax.shard_map(body, mesh=mesh, in_specs=(P("d"),) * 3 + (P(),), out_specs=P())
    got = jax.jit(jax.value_and_grad(sharded, argnums=(0, 1, 2, 3)))(xs, ys, hs, k)

    def looped(x, y, h, kk):
        return sum(one(x[i], y[i], h[i], kk) for i in range(NDEV))

    want = jax.value_and_grad(looped, argnums=(0, 1, 2, 3))(xs, ys, hs, k)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert float(jnp.abs(b).max()) > 0 or not factored
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)


KERNEL_BACKENDS = ["pallas_gpu_interpret", "pallas_tpu_interpret", "pallas_mosaic_interpret", "cuda_host"]


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_kernel_backends_under_shard_map(mesh, conv, backend):
    """The kernels inside ``shard_map`` with its default ``check_vma=True``: ``pallas_call``
    refused result types that did not say which mesh axes they vary over, so every Pallas backend
    failed in ``convolution_sharded`` and in an op inside a user's ``shard_map``. float32 (the
    Pallas TPU and Mosaic kernels take no float64); against the reference on one device."""
    require_backend(backend)
    senders, receivers, mask, x, y, s = random_problem(conv, channels=4, seed=2)
    x, y, s = (a.astype(jnp.float32) for a in (x, y, s))
    graph = e3j.Graph.from_edges(senders, receivers, 23, edge_mask=mask)
    pg = e3j.partition_graph(senders, receivers, 23, NDEV, edge_mask=mask)

    def single(x, y, s):
        return loss(conv(x, y, s, graph, backend="reference"))

    def sharded(x, y, s):
        return loss(e3j.convolution_sharded(conv, x, y, s, pg, mesh, "d", backend=backend))

    want = jax.value_and_grad(single, argnums=(0, 1, 2))(x, y, s)
    got = jax.jit(jax.value_and_grad(sharded, argnums=(0, 1, 2)))(x, y, s)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

    tp = e3j.TensorProduct("0e + 1o", "0e + 1o")
    xs, ys = x[:8], y[:8]
    f = jax.shard_map(lambda x, y: tp(x, y, backend=backend), mesh=mesh, in_specs=(P("d"), P("d")), out_specs=P("d"))
    np.testing.assert_allclose(jax.jit(f)(xs, ys), tp(xs, ys, backend="reference"), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("backend", "platform", "kind"), [("pallas_gpu", "cuda", "NVIDIA H200"), ("pallas_tpu", "tpu", "TPU v5 lite")]
)
def test_compiled_pallas_kernels_lower_under_shard_map(conv, backend, platform, kind):
    """The compiled Triton and TPU kernels (value and gradient, forward and backward kernels)
    lower inside ``shard_map`` with ``check_vma=True`` for their platforms: their results carry
    the operands' varying mesh axes."""
    require_backend(backend)
    from jax.sharding import AbstractDevice, AbstractMesh, NamedSharding

    cores = None if platform == "cuda" else 1
    mesh = AbstractMesh(
        (2,), ("d",), abstract_device=AbstractDevice(device_kind=kind, num_cores=cores, platform=platform)
    )
    senders, receivers, _, x, y, s = random_problem(conv, num_nodes=6, num_edges=10, channels=8)
    graph = e3j.Graph.from_edges(senders % 6, receivers, 6)

    def body(x, y, s):
        return jax.lax.psum(loss(conv(x[0], y[0], s[0], graph, backend=backend)), "d")

    f = jax.value_and_grad(jax.shard_map(body, mesh=mesh, in_specs=(P("d"),) * 3, out_specs=P()), argnums=(0, 1, 2))
    shapes = [jax.ShapeDtypeStruct((2, *a.shape), jnp.float32, sharding=NamedSharding(mesh, P("d"))) for a in (x, y, s)]
    with jax.sharding.use_abstract_mesh(mesh):
        text = jax.jit(f).trace(*shapes).lower(lowering_platforms=(platform,)).as_text()
    call = "__gpu$xla.gpu.triton" if platform == "cuda" else "tpu_custom_call"
    assert text.count(call) >= 2, f"expected the forward and backward kernels, found {text.count(call)} {call}"


@pytest.mark.parametrize(
    ("backend", "platform", "kind"), [("pallas_gpu", "cuda", "NVIDIA H200"), ("pallas_tpu", "tpu", "TPU v5 lite")]
)
def test_compiled_pallas_kernels_lower_inside_a_shard_map_over_another_axis(conv, backend, platform, kind):
    """``convolution_sharded`` over ``d`` inside a caller's ``shard_map`` over ``r``, value and
    gradient, lowers for the compiled kernels' platforms (the nested backward's own ``shard_map``)."""
    require_backend(backend)
    from jax.sharding import AbstractDevice, AbstractMesh, AxisType, NamedSharding

    cores = None if platform == "cuda" else 1
    device = AbstractDevice(device_kind=kind, num_cores=cores, platform=platform)
    mesh = AbstractMesh((2, 2), ("r", "d"), axis_types=(AxisType.Auto,) * 2, abstract_device=device)
    senders, receivers, _, x, y, s = random_problem(conv, num_nodes=6, num_edges=10, channels=8)
    pg = e3j.partition_graph(senders % 6, receivers, 6, 2)

    def body(x, y, s):
        m = e3j.convolution_sharded(conv, x[0], y[0], s[0], pg, jax.sharding.get_abstract_mesh(), "d", backend=backend)
        return jax.lax.psum(loss(m), "r")

    mapped = jax.shard_map(body, mesh=mesh, in_specs=(P("r"),) * 3, out_specs=P(), axis_names={"r"})
    f = jax.value_and_grad(mapped, argnums=(0, 1, 2))
    shapes = [jax.ShapeDtypeStruct((2, *a.shape), jnp.float32, sharding=NamedSharding(mesh, P("r"))) for a in (x, y, s)]
    with jax.sharding.use_abstract_mesh(mesh):
        text = jax.jit(f).trace(*shapes).lower(lowering_platforms=(platform,)).as_text()
    call = "__gpu$xla.gpu.triton" if platform == "cuda" else "tpu_custom_call"
    assert text.count(call) >= 2, f"expected the forward and backward kernels, found {text.count(call)} {call}"


def test_eager_calls_follow_the_backend_request(mesh, conv, monkeypatch):
    """convolution_sharded compiles one program per setting: an eager call made after
    ``use_backend`` or ``E3J_BACKEND`` changed runs on the backend requested then (the ``test``
    plugin counts its kernels as they are lowered), as a fresh jit of the call would, and a call
    back in an earlier setting reuses that setting's program (a hit of the program cache: a
    stale ``test`` program would lower nothing either, so the plugin's count alone cannot tell)."""
    require_backend("test")
    import e3j_test_backend

    from e3j.distributed import _sharded

    senders, receivers, mask, x, y, s = random_problem(conv, seed=11)
    pg = e3j.partition_graph(senders, receivers, 23, NDEV, edge_mask=mask)
    ref = conv(x, y, s, e3j.Graph.from_edges(senders, receivers, 23, edge_mask=mask))
    _sharded.cache_clear()

    def run():
        """(kernels the test plugin lowered, whether the call compiled a program of its own)."""
        e3j_test_backend.calls.clear()
        misses = _sharded.cache_info().misses
        assert max_err(e3j.convolution_sharded(conv, x, y, s, pg, mesh, "d"), ref) <= TOL
        return list(e3j_test_backend.calls), _sharded.cache_info().misses > misses

    monkeypatch.setenv("E3J_BACKEND", "reference")
    assert run() == ([], True)
    with e3j.use_backend("test"):
        assert run() == (["convolution"], True)
    assert run() == ([], False)  # the first program, the reference's
    monkeypatch.setenv("E3J_BACKEND", "test")
    assert run() == (["convolution"], True)
    monkeypatch.setenv("E3J_BACKEND", "reference")
    assert run() == ([], False)
    with e3j.use_backend("test"):
        assert run() == ([], False)  # the use_backend program, lowered once
