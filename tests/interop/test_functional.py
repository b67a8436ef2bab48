"""``e3j.interop.FunctionalMessagePassing`` against e3nn-jax's legacy ``FunctionalTensorProduct`` (float64).

The oracle is the original NequIP convolution written with e3nn-jax:
``scatter_sum(vmap(tp.left_right)(w, x[senders], y), dst=receivers, output_size=N)``.
"""

from __future__ import annotations

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from e3nn_jax.legacy import FunctionalTensorProduct
from installed import require_backend
from jaxpr_paths import paths_bound

import e3j
from e3j import interop

N, E = 6, 17
RNG = np.random.default_rng(3)
SENDERS = RNG.integers(0, N, E)
RECEIVERS = RNG.integers(0, N, E)

# NequIP-like, mixed multiplicities (4 and 2 channels): three instructions into one output slot
# (2x1o <- 1o x 0e, 1o x 2e and 1o x 0e again: a repeated path runs in a convolution of its own),
# output slots not sorted, one slot no instruction reaches (3x0o), instructions with their own
# path_weight
IRREPS_X, IRREPS_Y = "4x0e + 2x1o", "0e + 1o + 2e"
IRREPS_OUT = "2x1o + 4x0e + 3x0o + 2x1e + 2x2o + 2x0e + 4x1o"
INSTRUCTIONS = [
    (0, 0, 1, "uvu", True),
    (1, 1, 5, "uvu", True, 0.5),
    (1, 0, 0, "uvu", True),
    (1, 2, 0, "uvu", True, 2.0),
    (1, 1, 3, "uvu", True),
    (0, 1, 6, "uvu", True),
    (1, 2, 4, "uvu", True),
    (1, 0, 0, "uvu", True),
]


def e3nn_pattern(tp, x, y, w):
    m = jax.vmap(tp.left_right)(w, x[SENDERS], y)
    return e3nn.scatter_sum(m, dst=RECEIVERS, output_size=N)


def operands(tp, num_weights, seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    x = e3nn.IrrepsArray(tp.irreps_in1, jax.random.normal(k[0], (N, tp.irreps_in1.dim), jnp.float64))
    y = e3nn.IrrepsArray(tp.irreps_in2, jax.random.normal(k[1], (E, tp.irreps_in2.dim), jnp.float64))
    return x, y, jax.random.normal(k[2], (E, num_weights), jnp.float64)


def nequip_tp(irreps_x, irreps_y, filter_ir_out, **kwargs) -> FunctionalTensorProduct:
    """NequIP's instruction set: one ``uvu`` instruction per allowed output irrep, each its own slot."""
    irreps_x, irreps_y, allowed = e3nn.Irreps(irreps_x), e3nn.Irreps(irreps_y), e3nn.Irreps(filter_ir_out)
    instr, irreps_out = [], []
    for i1, (mul, ir1) in enumerate(irreps_x):
        for i2, (_, ir2) in enumerate(irreps_y):
            for ir in ir1 * ir2:
                if ir in allowed:
                    instr.append((i1, i2, len(irreps_out), "uvu", True))
                    irreps_out.append((mul, ir))
    return FunctionalTensorProduct(irreps_x, irreps_y, irreps_out, instr, **kwargs)


def check_value_and_grad(tp, backend, seed):
    fmp = interop.FunctionalMessagePassing(tp)
    x, y, w = operands(tp, fmp.num_weights, seed)
    cot = jax.random.normal(jax.random.key(seed + 7), (N, tp.irreps_out.dim), jnp.float64)
    graph = e3j.Graph.from_edges(SENDERS, RECEIVERS, N)

    def ours(a, b, c):
        out = fmp(e3nn.IrrepsArray(x.irreps, a), e3nn.IrrepsArray(y.irreps, b), c, graph=graph, backend=backend)
        assert out.irreps == tp.irreps_out
        return jnp.sum(out.array * cot)

    def ref(a, b, c):
        return jnp.sum(e3nn_pattern(tp, e3nn.IrrepsArray(x.irreps, a), e3nn.IrrepsArray(y.irreps, b), c).array * cot)

    args = (x.array, y.array, w)
    out = jax.jit(lambda a, c: fmp(e3nn.IrrepsArray(x.irreps, a), y, c, SENDERS, RECEIVERS).array)(*args[::2])
    want_out = jax.jit(lambda a, c: e3nn_pattern(tp, e3nn.IrrepsArray(x.irreps, a), y, c).array)(*args[::2])
    assert out.shape == (N, tp.irreps_out.dim) and float(jnp.abs(want_out).max()) > 0.1
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    got = jax.jit(jax.value_and_grad(ours, argnums=(0, 1, 2)))(*args)
    want = jax.jit(jax.value_and_grad(ref, argnums=(0, 1, 2)))(*args)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    for g, r in zip(got[1], want[1]):
        assert float(jnp.abs(r).max()) > 0.1
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)
    return fmp, out


@pytest.mark.parametrize("path_normalization", ["element", "path"])
def test_equals_e3nn_functional_tensor_product(path_normalization):
    tp = FunctionalTensorProduct(IRREPS_X, IRREPS_Y, IRREPS_OUT, INSTRUCTIONS, path_normalization=path_normalization)
    fmp, out = check_value_and_grad(tp, "reference", seed=0)
    # the slot no instruction reaches is zeros; mixed multiplicities: 4 and 2 channels, the repeated
    # path in a convolution of its own
    assert tp.irreps_out.slices()[2] == slice(10, 13) and not np.asarray(out[:, 10:13]).any()
    assert sorted((op.channels, op.conv.num_paths) for op in fmp.ops) == [(2, 1), (2, 5), (4, 2)]


# e3nn-jax's default normalizations (path weights != 1: the static multiply), and
# gradient_normalization="element" (every path weight 1: no multiply)
@pytest.mark.parametrize(
    "backend, kwargs", [("cuda_host", {}), ("pallas_gpu_interpret", {"gradient_normalization": "element"})]
)
def test_equals_e3nn_on_a_kernel_backend(backend, kwargs):
    require_backend(backend)
    tp = nequip_tp("8x0e + 8x1o", "0e + 1o + 2e", "0e + 1o + 1e + 2e", **kwargs)
    fmp, _ = check_value_and_grad(tp, backend, seed=1)
    scales = np.concatenate([op.scale.ravel() for op in fmp.ops])
    assert (scales == 1).all() if kwargs else not (scales == 1).all()


@pytest.mark.parametrize("kwargs", [{}, {"gradient_normalization": "element"}])
def test_one_primitive_reads_operands_in_place(kwargs):
    """NequIP's instructions at two channel counts run as one grouped primitive that reads the node
    features, edge attributes and e3nn's flat weights as given (no copy into the ops' layouts) and
    writes e3nn's output (no slots to assemble): the path weights are a factor on output columns,
    and with every path weight 1 the primitive's output is the result."""
    tp = nequip_tp("8x0e + 4x1o", "0e + 1o + 2e", "0e + 1o + 1e + 2e", **kwargs)
    fmp = interop.FunctionalMessagePassing(tp)
    x, y, w = operands(tp, fmp.num_weights)
    graph = e3j.Graph.from_edges(SENDERS, RECEIVERS, N)
    jaxpr = jax.make_jaxpr(lambda a, b, c: fmp(e3nn.IrrepsArray(x.irreps, a), b, c, graph=graph).array)(
        x.array, y.array, w
    ).jaxpr
    (conv,) = [e for e in jaxpr.eqns if e.primitive.name == "e3j_grouped_convolution"]
    assert conv.invars[:3] == jaxpr.invars
    assert {e.primitive.name for e in jaxpr.eqns} <= {"e3j_grouped_convolution", "broadcast_in_dim", "mul"}
    assert len(conv.params["spec"].plan.groups) == 2
    if kwargs:
        assert jaxpr.outvars == conv.outvars


@pytest.mark.parametrize("backend", ["cuda_host", "pallas_gpu_interpret"])
def test_marked_blocks_on_a_kernel_backend(backend):
    """Skipped instructions on a kernel backend: its kernels read the kept columns of e3nn's weights
    in place; the columns no kept path reads get a zero gradient (kernels write their own columns)."""
    require_backend(backend)
    tp = nequip_tp("4x0e + 2x1o + 2x2e", "0e + 1o + 2e", "0e + 1o + 2e")
    fmp = interop.FunctionalMessagePassing(tp)
    x, y, w = operands(tp, fmp.num_weights, seed=4)
    tol = 1e-12 if "float64" in e3j.backends.get_backend(backend).dtypes else 1e-5
    dtype = jnp.float64 if tol == 1e-12 else jnp.float32
    zero_x, zero_y = (False, True, False), (False, False, True)

    def loss(f):
        def run(a, b, c):
            return jnp.sum(jnp.sin(f(marked(a, tp.irreps_in1, zero_x), marked(b, tp.irreps_in2, zero_y), c).array))

        return run

    got = loss(lambda a, b, c: fmp(a, b, c, SENDERS, RECEIVERS))
    ref = loss(lambda a, b, c: e3nn_pattern(tp, a, b, c))
    with e3j.use_backend(backend):
        value, grads = jax.jit(jax.value_and_grad(got, (0, 1, 2)))(*(a.astype(dtype) for a in (x.array, y.array, w)))
    ref_value, ref_grads = jax.value_and_grad(ref, (0, 1, 2))(x.array, y.array, w)
    np.testing.assert_allclose(value, ref_value, rtol=tol)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol * float(jnp.abs(r).max()))
    kept = [not zero_x[i.i_in1] and not zero_y[i.i_in2] for i in tp.instructions]
    unread = np.concatenate([np.full(tp.irreps_in1[i.i_in1].mul, not k) for i, k in zip(tp.instructions, kept)])
    assert unread.any() and not unread.all() and (np.asarray(grads[2])[:, unread] == 0).all()


MARKED = [  # marks of x's blocks, of y's blocks
    ((False, True), (False, False, False)),  # x's vectors (scalars embedded by a Linear)
    ((True, False), (False, False, False)),
    ((False, False), (False, True, False)),  # an edge attribute's block
    ((False, True), (True, False, True)),  # both: one instruction left
    ((True, True), (False, False, False)),  # nothing left: zeros
]


def marked(a, irreps, marks):  # inside each trace: the marks are static
    a = e3nn.IrrepsArray(irreps, a)
    return e3nn.from_chunks(a.irreps, [None if z else c for c, z in zip(a.chunks, marks)], a.shape[:-1], a.dtype)


@pytest.mark.parametrize("zero_x, zero_y", MARKED)
@pytest.mark.parametrize("factored", [False, True])
def test_marked_blocks_are_skipped(zero_x, zero_y, factored):
    """e3nn-jax's pattern computes the products of blocks marked zero (``jax.vmap`` drops the marks:
    ``IrrepsArray``'s pytree keeps the array alone) and gets zeros; the drop-in skips the
    instructions that read a marked block (fewer paths bound), with the pattern's values and
    gradients (float64), array or factored weights, the skipped weights' gradient exactly zero.
    What only those instructions read is never read: non-finite values there stay out (e3nn-jax's
    zeros times NaN are NaN)."""
    tp = FunctionalTensorProduct(IRREPS_X, IRREPS_Y, IRREPS_OUT, INSTRUCTIONS)
    fmp = interop.FunctionalMessagePassing(tp)
    x, y, w = operands(tp, fmp.num_weights, seed=5)
    args = (x.array, y.array, w)
    hidden = jax.random.normal(jax.random.key(9), (E, 4), jnp.float64)

    def loss(f):
        def run(a, b, c):
            return jnp.sum(jnp.sin(f(marked(a, tp.irreps_in1, zero_x), marked(b, tp.irreps_in2, zero_y), c).array))

        return run

    ref = loss(lambda a, b, c: e3nn_pattern(tp, a, b, c))
    got = loss(lambda a, b, c: fmp(a, b, c, SENDERS, RECEIVERS))
    if factored:  # c is the kernel [4, num_weights] of FactoredWeights(hidden, c)
        args = (x.array, y.array, w[:4])
        ref = loss(lambda a, b, c: e3nn_pattern(tp, a, b, hidden @ c))
        got = loss(lambda a, b, c: fmp(a, b, e3j.FactoredWeights(hidden, c), SENDERS, RECEIVERS))
    value, grads = jax.jit(jax.value_and_grad(got, (0, 1, 2)))(*args)
    ref_value, ref_grads = jax.jit(jax.value_and_grad(ref, (0, 1, 2)))(*args)
    np.testing.assert_allclose(value, ref_value, rtol=1e-12, atol=1e-12)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)
    kept = [not zero_x[i1] and not zero_y[i2] for i1, i2, *_ in INSTRUCTIONS]
    unread = np.concatenate([np.full(tp.irreps_in1[i1].mul, not k) for (i1, *_), k in zip(INSTRUCTIONS, kept)])
    assert (np.asarray(grads[2])[:, unread] == 0).all()

    run = paths_bound(got, *args)
    full = paths_bound(lambda: fmp(x, y, w, SENDERS, RECEIVERS).array)
    assert full == len(INSTRUCTIONS) and run == sum(kept) < full

    if factored:
        return
    # NaN in y's blocks and in the weights that only skipped instructions read
    read_y = {i2 for (_, i2, *_), k in zip(INSTRUCTIONS, kept) if k}
    nan_y = np.concatenate([np.full(m * ir.dim, i not in read_y) for i, (m, ir) in enumerate(tp.irreps_in2)])
    nan_args = (x.array, jnp.where(nan_y, jnp.nan, y.array), jnp.where(unread, jnp.nan, w))
    zero_args = (x.array, jnp.where(nan_y, 0.0, y.array), jnp.where(unread, 0.0, w))
    assert not np.isfinite(jax.jit(ref)(*nan_args))
    np.testing.assert_allclose(jax.jit(got)(*nan_args), jax.jit(ref)(*zero_args), rtol=1e-12, atol=1e-12)


def test_edge_attribute_block_no_instruction_reads():
    """A block of ``irreps_in2`` that no instruction reads is never read (e3nn-jax's ``left_right``
    takes only its instructions' chunks): NaN there leaves the result as e3nn's."""
    tp = FunctionalTensorProduct(IRREPS_X, IRREPS_Y + " + 3o", IRREPS_OUT, INSTRUCTIONS)
    fmp = interop.FunctionalMessagePassing(tp)
    x, y, w = operands(tp, fmp.num_weights, seed=8)
    y_nan = y.array.at[:, 9:].set(jnp.nan)
    got = fmp(x, y_nan, w, SENDERS, RECEIVERS).array
    want = e3nn_pattern(tp, x, e3nn.IrrepsArray(tp.irreps_in2, y_nan), w).array
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_zero_multiplicity_read_by_an_instruction():
    """A ``0x`` block of ``irreps_in1`` that instructions read: e3nn-jax's ``left_right`` crashes on it
    (a reshape of a ``(2, 1)`` weight block into ``(0, 3)``); the drop-in computes the product, equal
    to e3nn-jax's on the same product without the empty blocks (they add nothing to the fan-ins)."""
    out = "0x1o + 2x0e + 3x1e + 0x2e"
    tp = FunctionalTensorProduct(
        "0x0e + 2x1o + 3x1e + 0x1o",
        "0e + 1o",
        out,
        [(0, 1, 0, "uvu", True), (1, 1, 1, "uvu", True), (2, 0, 2, "uvu", True), (3, 1, 3, "uvu", True)],
    )
    same = FunctionalTensorProduct("2x1o + 3x1e", "0e + 1o", out, [(0, 1, 1, "uvu", True), (1, 0, 2, "uvu", True)])
    fmp = interop.FunctionalMessagePassing(tp)
    assert fmp.num_weights == 5
    x, y, w = operands(tp, fmp.num_weights, seed=4)
    with pytest.raises(TypeError, match="reshape"):
        e3nn_pattern(tp, x, y, w)
    cot = jax.random.normal(jax.random.key(5), (N, tp.irreps_out.dim), jnp.float64)

    def ours(a, b, c):
        return jnp.sum(
            fmp(e3nn.IrrepsArray(tp.irreps_in1, a), e3nn.IrrepsArray(y.irreps, b), c, SENDERS, RECEIVERS).array * cot
        )

    def theirs(a, b, c):
        return jnp.sum(
            e3nn_pattern(same, e3nn.IrrepsArray(same.irreps_in1, a), e3nn.IrrepsArray(y.irreps, b), c).array * cot
        )

    got = fmp(x, y, w, SENDERS, RECEIVERS)
    assert got.irreps == tp.irreps_out
    np.testing.assert_allclose(
        got.array, e3nn_pattern(same, e3nn.IrrepsArray(same.irreps_in1, x.array), y, w).array, rtol=1e-12, atol=1e-12
    )
    for g, r in zip(jax.grad(ours, (0, 1, 2))(x.array, y.array, w), jax.grad(theirs, (0, 1, 2))(x.array, y.array, w)):
        assert float(jnp.abs(r).max()) > 0.1
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


def test_marks_on_differently_chunked_node_features():
    """Node features whose irreps split a block of ``tp.irreps_in1`` (as ``rechunk`` allows): the
    block is skipped only where all of its parts are marked, as e3nn's ``rechunk`` merges the marks."""
    tp = FunctionalTensorProduct(IRREPS_X, IRREPS_Y, IRREPS_OUT, INSTRUCTIONS)
    fmp = interop.FunctionalMessagePassing(tp)
    x, y, w = operands(tp, fmp.num_weights, seed=6)
    split = "2x0e + 2x0e + 2x1o"
    for marks, paths in [((True, False, False), 8), ((True, True, False), 6), ((False, False, True), 2)]:

        def run(f, a, c, marks=marks):
            return f(marked(a, split, marks), y, c).array

        got = jax.jit(lambda a, c: run(lambda *o: fmp(*o, SENDERS, RECEIVERS), a, c))(x.array, w)
        want = jax.jit(lambda a, c: run(lambda *o: e3nn_pattern(tp, *o), a, c))(x.array, w)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        assert paths_bound(lambda a, c: run(lambda *o: fmp(*o, SENDERS, RECEIVERS), a, c), x.array, w) == paths


def test_bad_input():
    def tp_of(irreps_in2, instructions, irreps_out="2x0e + 2x1o"):
        return FunctionalTensorProduct("2x0e + 2x1o", irreps_in2, irreps_out, instructions)

    with pytest.raises(ValueError, match=r"instruction 1 \(0, 0, 1, 'uvw', True\): only 'uvu'"):
        interop.FunctionalMessagePassing(tp_of("0e", [(0, 0, 0, "uvu", True), (0, 0, 1, "uvw", True)], "2x0e + 2x0e"))
    with pytest.raises(ValueError, match=r"instruction 0 \(0, 0, 0, 'uvu', False\): only 'uvu' instructions with"):
        interop.FunctionalMessagePassing(tp_of("0e", [(0, 0, 0, "uvu", False)]))
    with pytest.raises(ValueError, match=r"instruction 0 .*irreps_in2\[0\] must have multiplicity 1, got 2"):
        interop.FunctionalMessagePassing(tp_of("2x0e", [(0, 0, 0, "uvu", True)]))
    with pytest.raises(ValueError, match=r"instruction 0 .*irreps_out\[0\].mul == irreps_in1\[0\].mul, got 3 and 2"):
        interop.FunctionalMessagePassing(tp_of("0e", [(0, 0, 0, "uvu", True)], "3x0e"))
    with pytest.raises(TypeError, match=r"tp must be an e3nn_jax\.legacy\.FunctionalTensorProduct"):
        interop.FunctionalMessagePassing("2x0e")

    tp = tp_of("0e + 1o", [(0, 0, 0, "uvu", True), (1, 1, 0, "uvu", True), (0, 1, 1, "uvu", True)])
    fmp = interop.FunctionalMessagePassing(tp)
    x = e3nn.IrrepsArray("2x0e + 2x1o", jnp.ones((N, 8)))
    y, w = jnp.ones((E, 4)), jnp.ones((E, fmp.num_weights))
    assert fmp.num_weights == 6
    with pytest.raises(ValueError, match=r"weights must be \[E=17, num_weights=6\]"):
        fmp(x, y, w[:, :5], SENDERS, RECEIVERS)
    with pytest.raises(ValueError, match=r"node_feats must be an IrrepsArray \[N, 2x0e\+2x1o\]"):
        fmp(e3nn.IrrepsArray("8x0e", jnp.ones((N, 8))), y, w, SENDERS, RECEIVERS)
    with pytest.raises(TypeError, match=r"node_feats must be an e3nn\.IrrepsArray"):
        fmp(jnp.ones((N, 8)), y, w, SENDERS, RECEIVERS)
    with pytest.raises(ValueError, match="edge_attrs must have irreps 1x0e\\+1x1o"):
        fmp(x, e3nn.IrrepsArray("4x0e", y), w, SENDERS, RECEIVERS)
    with pytest.raises(ValueError, match=r"edge_attrs must be \[E, 4\]"):
        fmp(x, y[:, :3], w, SENDERS, RECEIVERS)
    with pytest.raises(ValueError, match="senders and receivers, or graph"):
        fmp(x, y, w)
    with pytest.raises(ValueError, match="graph has 5 nodes"):
        fmp(x, y, w, graph=e3j.Graph.from_edges(SENDERS % 5, RECEIVERS % 5, 5))
