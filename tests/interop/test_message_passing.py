"""``e3j.interop.message_passing`` against the e3nn-jax code it replaces (float64, values and gradients).

The oracle is the gather -> concatenate(filter, tensor_product).regroup() -> * weights -> scatter_sum
pattern of NequIP and MACE written with e3nn-jax.
"""

from __future__ import annotations

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from installed import require_backend
from jaxpr_paths import paths_bound

import e3j
from e3j import interop

N, E = 7, 23
RNG = np.random.default_rng(0)
SENDERS = RNG.integers(0, N, E)
RECEIVERS = RNG.integers(0, N, E)


def e3nn_pattern(x, y, w, filter_ir_out, self_connection):
    m = x[SENDERS]
    tp = e3nn.tensor_product(m, y, filter_ir_out=filter_ir_out)
    m = tp if self_connection is None else e3nn.concatenate([m.filter(self_connection), tp]).regroup()
    return e3nn.scatter_sum(m * w, dst=RECEIVERS, output_size=N)


def operands(irreps_x, irreps_y, num_weights, seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    irreps_x, irreps_y = e3nn.Irreps(irreps_x), e3nn.Irreps(irreps_y)
    x = e3nn.IrrepsArray(irreps_x, jax.random.normal(k[0], (N, irreps_x.dim), jnp.float64))
    y = e3nn.IrrepsArray(irreps_y, jax.random.normal(k[1], (E, irreps_y.dim), jnp.float64))
    return x, y, jax.random.normal(k[2], (E, num_weights), jnp.float64)


CASES = [
    # NequIP / MACE: spherical harmonics 1..3, self connection = the target irreps
    ("4x0e + 4x1o + 4x2e", "1o + 2e + 3o", "0e + 1o + 2e", "0e + 1o + 2e", True),
    ("8x0e + 4x1o + 2x2e", "1o + 2e", "0e + 1o + 2e", "0e + 1o + 2e", True),  # mixed multiplicities
    ("2x1o + 2x0e", "0e + 1o + 2e", "0e + 1o", None, True),  # unsorted x, no self connection
    ("2x0e + 2x1o", "1o + 2e", None, "1o", True),  # self connection of some irreps only
    ("2x0e + 2x1o", "2x0e + 1o", "0e + 1o", "0e", False),  # y multiplicity 2: copies interleaved
]


@pytest.mark.parametrize("irreps_x, irreps_y, filter_, self_connection, folded", CASES)
def test_equals_e3nn_pattern(irreps_x, irreps_y, filter_, self_connection, folded):
    mp = interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=self_connection)
    x, y, w = operands(irreps_x, irreps_y, mp.num_weights)
    ref = jax.jit(lambda x, y, w: e3nn_pattern(x, y, w, filter_, self_connection))(x, y, w)
    out = jax.jit(lambda x, y, w: mp(x, y, w, SENDERS, RECEIVERS))(x, y, w)
    assert out.irreps == ref.irreps == mp.irreps_out and mp.num_weights == ref.irreps.num_irreps
    np.testing.assert_allclose(out.array, ref.array, rtol=1e-12, atol=1e-12)
    # spherical-harmonics-like edge attributes: e3nn's order is folded into the tables and slices
    if folded:
        assert not mp.plan.gathers


@pytest.mark.parametrize("empty", ["", [], ()])
def test_an_empty_self_connection_is_none(empty):
    # e3nn's concatenate([m.filter([]), tp]).regroup() is tp regrouped: no constant 0e edge column
    # (one no path read), and a filter leaving no path names the caller's irreps, not [1, y]'s
    irreps_x, irreps_y, filter_ = "2x1o + 2x0e", "0e + 1o + 2e", "0e + 1o"
    mp = interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=empty)
    assert (
        not mp.plan.constant_row and mp.num_weights == interop.MessagePassing(irreps_x, irreps_y, filter_).num_weights
    )
    x, y, w = operands(irreps_x, irreps_y, mp.num_weights, seed=7)
    ref = e3nn_pattern(x, y, w, filter_, empty)
    out = mp(x, y, w, SENDERS, RECEIVERS)
    assert out.irreps == ref.irreps
    np.testing.assert_allclose(out.array, ref.array, rtol=1e-12, atol=1e-12)
    conv = e3j.MulIrConvolution("2x0e + 1o", "0e + 1o", "0e", self_connection=empty)
    assert not conv.plan.constant_row
    # one plan: equal ops, so a static jit argument built either way compiles once
    assert conv == e3j.MulIrConvolution("2x0e + 1o", "0e + 1o", "0e")
    with pytest.raises(ValueError, match=r"filter 3e leaves no path in 2x0e\+1x1o ⊗ 1x0e\+1x1o "):
        e3j.MulIrConvolution("2x0e + 1o", "0e + 1o", "3e", self_connection=empty)


@pytest.mark.parametrize(
    "keep, kept",
    [
        (lambda mul_ir: mul_ir.ir.l < 2, "0e + 1o"),
        (lambda mul_ir: mul_ir.ir.p == -1, "1o"),
        (lambda mul_ir: mul_ir.ir == e3nn.Irrep("3o"), ""),  # no block: tp regrouped, as for []
    ],
)
def test_self_connection_as_a_callable(keep, kept):
    """e3nn's ``m.filter(keep)`` takes a ``MulIrrep -> bool``; so does the drop-in, as the irreps it keeps."""
    irreps_x, irreps_y, filter_ = "4x0e + 2x1o + 2x0e + 2x2e", "0e + 1o + 2e", "0e + 1o + 2e"
    mp = interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=keep)
    assert mp.plan == interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=kept).plan
    x, y, w = operands(irreps_x, irreps_y, mp.num_weights, seed=8)
    ref = e3nn_pattern(x, y, w, filter_, keep)
    out = mp(x, y, w, SENDERS, RECEIVERS)
    assert out.irreps == ref.irreps
    np.testing.assert_allclose(out.array, ref.array, rtol=1e-12, atol=1e-12)
    out = interop.message_passing(x, y, w, SENDERS, RECEIVERS, filter_ir_out=filter_, self_connection=keep)
    np.testing.assert_allclose(out.array, ref.array, rtol=1e-12, atol=1e-12)


def test_self_connection_callable_that_splits_an_irrep_is_refused():
    def keep(mul_ir):
        return mul_ir.mul > 3

    with pytest.raises(ValueError, match=r"self_connection \(a callable\) keeps some blocks of 0e in irreps_node"):
        interop.MessagePassing("4x0e + 2x1o + 2x0e", "0e + 1o", "0e + 1o", self_connection=keep)
    # asked about the call's blocks too, which e3nn's filter reads: 6x0e is kept, 2x0e + 4x0e splits,
    # 3x0e + 3x0e is dropped
    mp = interop.MessagePassing("6x0e + 2x1o", "0e + 1o", "0e + 1o", self_connection=keep)
    x, y, w = operands("6x0e + 2x1o", "0e + 1o", mp.num_weights)
    with pytest.raises(ValueError, match=r"keeps some blocks of 0e"):
        mp(e3nn.IrrepsArray("2x0e + 4x0e + 2x1o", x.array), y, w, SENDERS, RECEIVERS)
    with pytest.raises(ValueError, match=r"keeps other irreps of node_feats' blocks 3x0e\+3x0e\+2x1o than of"):
        mp(e3nn.IrrepsArray("3x0e + 3x0e + 2x1o", x.array), y, w, SENDERS, RECEIVERS)
    np.testing.assert_allclose(
        mp(x, y, w, SENDERS, RECEIVERS).array, e3nn_pattern(x, y, w, "0e + 1o", keep).array, rtol=1e-12, atol=1e-12
    )


def test_irreps_array_weights_as_e3nn_multiplies_them():
    """``e3nn.flax.MultiLayerPerceptron`` returns ``IrrepsArray("Wx0e")`` for an IrrepsArray input, and
    e3nn's ``m * w`` takes it; the drop-in takes it too, values and gradients equal."""
    irreps_x, irreps_y, filter_ = "8x0e + 4x1o + 2x2e", "0e + 1o + 2e", "0e + 1o + 2e"
    mp = interop.MessagePassing(irreps_x, irreps_y, filter_)
    x, y, w = operands(irreps_x, irreps_y, mp.num_weights, seed=4)

    def loss(f):
        return lambda x, w: jnp.sum(f(x, e3nn.IrrepsArray(f"{mp.num_weights}x0e", w)).array ** 2)

    ref = loss(lambda x, w: e3nn_pattern(x, y, w, filter_, None))
    got = loss(lambda x, w: mp(x, y, w, SENDERS, RECEIVERS))
    np.testing.assert_allclose(got(x, w), ref(x, w), rtol=1e-12)
    for g, r in zip(jax.grad(got, (0, 1))(x, w), jax.grad(ref, (0, 1))(x, w)):
        np.testing.assert_allclose(getattr(g, "array", g), getattr(r, "array", r), rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize(
    "shape, irreps_array",
    [("W", False), ("1W", False), ("E1", False), ("11", False), ("1", False), ("scalar", False)]
    + [("W", True), ("1W", True)],
)
def test_weights_e3nn_broadcasts_are_taken(shape, irreps_array):
    """e3nn's ``m * w`` broadcasts ``w`` of ``[W]`` / ``[1, W]`` (per copy, every edge; also as an
    ``IrrepsArray("Wx0e")``) and ``[E, 1]`` / ``[1, 1]`` / ``[1]`` / a scalar (every copy): the
    drop-in takes them, values and gradients equal."""
    irreps_x, irreps_y, filter_, keep = "8x0e + 4x1o + 2x2e", "0e + 1o + 2e", "0e + 1o + 2e", "0e + 1o"
    mp = interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=keep)
    x, y, _ = operands(irreps_x, irreps_y, mp.num_weights, seed=5)
    shapes = {"W": (mp.num_weights,), "1W": (1, mp.num_weights), "E1": (E, 1), "11": (1, 1), "1": (1,), "scalar": ()}
    w = jax.random.normal(jax.random.key(6), shapes[shape], jnp.float64)
    cot = jax.random.normal(jax.random.key(9), (N, mp.irreps_out.dim), jnp.float64)

    def wrap(w):
        return e3nn.IrrepsArray(f"{mp.num_weights}x0e", w) if irreps_array else w

    def loss(f):
        return lambda x, w: jnp.sum(f(e3nn.IrrepsArray(irreps_x, x), wrap(w)).array * cot)

    ref = jax.jit(jax.value_and_grad(loss(lambda x, w: e3nn_pattern(x, y, w, filter_, keep)), (0, 1)))
    got = jax.jit(jax.value_and_grad(loss(lambda x, w: mp(x, y, w, SENDERS, RECEIVERS)), (0, 1)))
    (v_got, g_got), (v_ref, g_ref) = got(x.array, w), ref(x.array, w)
    np.testing.assert_allclose(v_got, v_ref, rtol=1e-12)
    for g, r in zip(g_got, g_ref):
        assert g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-12)
    # a Python number too, as e3nn's ``m * 0.5``
    if shape == "scalar":
        out = mp(x, y, 0.5, SENDERS, RECEIVERS)
        np.testing.assert_allclose(out.array, e3nn_pattern(x, y, 0.5, filter_, keep).array, rtol=1e-12)


def test_weights_e3nn_would_not_broadcast_are_refused():
    mp = interop.MessagePassing("2x0e + 2x1o", "1o + 2e", "0e + 1o", self_connection="0e + 1o")
    x, y, _ = operands("2x0e + 2x1o", "1o + 2e", mp.num_weights)
    for bad in (jnp.ones((E,)), jnp.ones((E, 3)), jnp.ones((1, E, mp.num_weights))):
        with pytest.raises(ValueError, match=r"weights must be \[E=23, num_weights=10\]"):
            mp(x, y, bad, SENDERS, RECEIVERS)
    with pytest.raises(ValueError, match=r"weights has 2 rows and edge_attrs 23"):
        mp(x, y, jnp.ones((2, mp.num_weights)), SENDERS, RECEIVERS)
    # e3nn's m * w refuses an IrrepsArray whose irreps are not one per copy of the messages
    for shape in ((E, 1), (1, 1), (1,)):
        with pytest.raises(ValueError, match=r"weights given as an IrrepsArray must be scalars \(10x0e\), got 1x0e"):
            mp(x, y, e3nn.IrrepsArray("0e", jnp.ones(shape)), SENDERS, RECEIVERS)
    with pytest.raises(TypeError, match=r"weights must be a float array or number, got True"):
        mp(x, y, True, SENDERS, RECEIVERS)


@pytest.mark.parametrize("normalization", ["norm", "none"])
@pytest.mark.parametrize("explicit", [False, True])
def test_self_connection_under_other_normalizations_as_e3nn(normalization, explicit):
    """NequIP's pattern under ``irrep_normalization="norm"`` or ``"none"``, given or e3nn's
    configured default (which ``m * w`` also reads: under ``"none"`` it scales each copy by
    ``1/sqrt(2l+1)``): the self connection's copies are ``x`` unscaled, as e3nn's ``filter`` is."""
    irreps_x, irreps_y, filter_ = "4x0e + 2x1o + 2x2e", "1o + 2e", "0e + 1o + 2e"

    def pattern(x, y, w):
        m = x[SENDERS]
        tp = e3nn.tensor_product(m, y, filter_ir_out=filter_, irrep_normalization=normalization)
        m = e3nn.concatenate([m.filter(filter_), tp]).regroup()
        return e3nn.scatter_sum(m * w, dst=RECEIVERS, output_size=N)

    def both(x, y, w):  # e3nn's and ours: values, and the gradient of a weighted sum
        cot = jax.random.normal(jax.random.key(6), (N, mp.irreps_out.dim), jnp.float64)
        return [
            (f(x, y, w).array, jax.grad(lambda *a, f=f: jnp.sum(f(*a).array * cot), argnums=(0, 1, 2))(x, y, w))
            for f in (pattern, lambda *a: mp(*a, SENDERS, RECEIVERS))
        ]

    if explicit:  # the argument, global setting left at its default: no rescale in e3nn's m * w
        mp = interop.MessagePassing(
            irreps_x, irreps_y, filter_, self_connection=filter_, irrep_normalization=normalization
        )
        x, y, w = operands(irreps_x, irreps_y, mp.num_weights, seed=4)
        (ref, ref_grad), (out, out_grad) = both(x, y, w)
    else:
        before = e3nn.config("irrep_normalization")
        e3nn.config("irrep_normalization", normalization)
        try:
            mp = interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=filter_)
            x, y, w = operands(irreps_x, irreps_y, mp.num_weights, seed=4)
            (ref, ref_grad), (out, out_grad) = both(x, y, w)
        finally:
            e3nn.config("irrep_normalization", before)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    out_grad, ref_grad = jax.tree.leaves(out_grad), jax.tree.leaves(ref_grad)  # IrrepsArray cotangents
    assert len(out_grad) == len(ref_grad) == 3
    for g, r in zip(out_grad, ref_grad):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)
    # and it is not the component result: the normalization reached the product
    component = interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=filter_)
    assert not np.allclose(component(x, y, w, SENDERS, RECEIVERS).array, ref)


@pytest.mark.parametrize("explicit", [False, True])
def test_global_none_normalization_as_e3nn(explicit):
    """Under ``e3nn.config("irrep_normalization", "none")`` e3nn's ``m * w`` scales each copy by
    1/sqrt(2l+1) (its elementwise 0e ⊗ l product); the argument alone does not, so both ways are checked."""
    irreps_x, irreps_y, filter_ = "8x0e + 4x1o + 2x2e", "0e + 1o + 2e", "0e + 1o + 2e"
    x, y, _ = operands(irreps_x, irreps_y, 1)
    if explicit:  # the argument, global setting left at its default: no rescale in e3nn's m * w
        mp = interop.MessagePassing(irreps_x, irreps_y, filter_, irrep_normalization="none")
        w = jax.random.normal(jax.random.key(5), (E, mp.num_weights), jnp.float64)
        m = e3nn.tensor_product(x[SENDERS], y, filter_ir_out=filter_, irrep_normalization="none")
        ref = e3nn.scatter_sum(m * w, dst=RECEIVERS, output_size=N)
        out = mp(x, y, w, SENDERS, RECEIVERS)
    else:
        before = e3nn.config("irrep_normalization")
        e3nn.config("irrep_normalization", "none")
        try:
            mp = interop.MessagePassing(irreps_x, irreps_y, filter_)
            w = jax.random.normal(jax.random.key(5), (E, mp.num_weights), jnp.float64)
            ref = e3nn_pattern(x, y, w, filter_, None)
            out = mp(x, y, w, SENDERS, RECEIVERS)
        finally:
            e3nn.config("irrep_normalization", before)
    assert out.irreps == ref.irreps
    np.testing.assert_allclose(out.array, ref.array, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", ["[E, W]", "[W]", "IrrepsArray", "[E, 1]", "[1]", "0-d", "float"])
def test_global_none_normalization_scales_only_elementwise_weights(form):
    """e3nn's ``m * w`` is its elementwise product (scaled by 1/sqrt(2l+1) under a global "none") only
    for weights with one per copy or an IrrepsArray; ``[E, 1]``, ``[1]`` and scalars multiply plainly.
    The drop-in scaled every form."""
    irreps_x, irreps_y, filter_ = "3x0e + 2x1o", "0e + 1o + 2e", "0e + 1o + 2e"
    x, y, _ = operands(irreps_x, irreps_y, 1, seed=21)
    before = e3nn.config("irrep_normalization")
    e3nn.config("irrep_normalization", "none")
    try:
        mp = interop.MessagePassing(irreps_x, irreps_y, filter_)
        rng = np.random.default_rng(3)
        w = {
            "[E, W]": jnp.asarray(rng.normal(size=(E, mp.num_weights))),
            "[W]": jnp.asarray(rng.normal(size=(mp.num_weights,))),
            "IrrepsArray": e3nn.IrrepsArray(f"{mp.num_weights}x0e", jnp.asarray(rng.normal(size=(E, mp.num_weights)))),
            "[E, 1]": jnp.asarray(rng.normal(size=(E, 1))),
            "[1]": jnp.asarray([0.7]),
            "0-d": jnp.asarray(0.7),
            "float": 0.7,
        }[form]
        m = e3nn.tensor_product(x[SENDERS], y, filter_ir_out=filter_)
        ref = e3nn.scatter_sum(m * w, dst=RECEIVERS, output_size=N)
        out = mp(x, y, w, SENDERS, RECEIVERS)
    finally:
        e3nn.config("irrep_normalization", before)
    assert out.irreps == ref.irreps
    assert float(jnp.max(jnp.abs(ref.array[:, 3:]))) > 0.1  # l > 0 rows present: a test that can fail
    np.testing.assert_allclose(out.array, ref.array, rtol=1e-12, atol=1e-12)


def test_weights_split_into_blocks_split_the_output_as_e3nn():
    """Weights as an ``IrrepsArray`` of scalars in several blocks: e3nn's ``m * w`` splits the
    output's irreps alike (``10x0e + 6x0e + ...`` where the messages have ``16x0e``); so does the
    drop-in, with the same values."""
    irreps_x, irreps_y, filter_ = "4x0e + 2x1o + 2x2e", "0e + 1o + 2e", "0e + 1o + 2e"
    mp = interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=filter_)
    x, y, w = operands(irreps_x, irreps_y, mp.num_weights, seed=15)
    for w_irreps in (
        f"{mp.num_weights}x0e",
        f"10x0e + {mp.num_weights - 10}x0e",
        f"3x0e + 20x0e + {mp.num_weights - 23}x0e",
    ):
        weights = e3nn.IrrepsArray(w_irreps, w)
        ref, out = e3nn_pattern(x, y, weights, filter_, filter_), mp(x, y, weights, SENDERS, RECEIVERS)
        assert out.irreps == ref.irreps
        np.testing.assert_allclose(out.array, ref.array, rtol=1e-12, atol=1e-12)
    assert len(out.irreps) > len(mp.irreps_out)  # the last split the output


@pytest.mark.parametrize("setting", ["none", "norm"])
def test_config_read_at_each_call(setting):
    """With ``irrep_normalization=None`` e3nn-jax reads ``e3nn.config`` when the pattern runs: a
    drop-in built before the setting changed follows it (the product's normalization and ``m * w``'s
    scale both), and one given the argument keeps it for the product."""
    irreps_x, irreps_y, filter_ = "4x0e + 2x1o + 2x2e", "0e + 1o + 2e", "0e + 1o + 2e"
    mp = interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=filter_)
    fixed = interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=filter_,
                                   irrep_normalization="component")  # fmt: skip
    x, y, w = operands(irreps_x, irreps_y, mp.num_weights, seed=14)
    before = e3nn.config("irrep_normalization")
    e3nn.config("irrep_normalization", setting)
    try:
        ref = e3nn_pattern(x, y, w, filter_, filter_).array
        out = mp(x, y, w, SENDERS, RECEIVERS).array
        m = x[SENDERS]
        m = e3nn.concatenate(
            [m.filter(filter_), e3nn.tensor_product(m, y, filter_ir_out=filter_, irrep_normalization="component")]
        ).regroup()
        ref_fixed = e3nn.scatter_sum(m * w, dst=RECEIVERS, output_size=N).array
        out_fixed = fixed(x, y, w, SENDERS, RECEIVERS).array
    finally:
        e3nn.config("irrep_normalization", before)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out_fixed, ref_fixed, rtol=1e-12, atol=1e-12)
    assert not np.allclose(ref, ref_fixed)  # the setting mattered


@pytest.mark.parametrize("backend", ["reference", "cuda_host", "pallas_gpu_interpret"])
def test_gradients_equal_e3nn_on_cpu_backends(backend):
    require_backend(backend)
    irreps_x, irreps_y, filter_, keep, _ = CASES[1]
    mp = interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=keep)
    x, y, w = operands(irreps_x, irreps_y, mp.num_weights, seed=1)
    cot = jax.random.normal(jax.random.key(9), (N, mp.irreps_out.dim), jnp.float64)
    graph = e3j.Graph.from_edges(SENDERS, RECEIVERS, N)

    def ours(a, b, c):
        out = mp(e3nn.IrrepsArray(x.irreps, a), e3nn.IrrepsArray(y.irreps, b), c, graph=graph, backend=backend)
        return jnp.sum(out.array * cot)

    def ref(a, b, c):
        return jnp.sum(
            e3nn_pattern(e3nn.IrrepsArray(x.irreps, a), e3nn.IrrepsArray(y.irreps, b), c, filter_, keep).array * cot
        )

    args = (x.array, y.array, w)
    got = jax.jit(jax.value_and_grad(ours, argnums=(0, 1, 2)))(*args)
    want = jax.jit(jax.value_and_grad(ref, argnums=(0, 1, 2)))(*args)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    for g, r in zip(got[1], want[1]):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


def test_function_form_and_bad_input():
    x, y, w = operands("2x0e + 2x1o", "1o + 2e", 10)
    out = jax.jit(
        lambda x, y, w: interop.message_passing(
            x, y, w, SENDERS, RECEIVERS, filter_ir_out="0e + 1o", self_connection="0e + 1o"
        )
    )(x, y, w)
    ref = jax.jit(lambda x, y, w: e3nn_pattern(x, y, w, "0e + 1o", "0e + 1o"))(x, y, w)
    np.testing.assert_allclose(out.array, ref.array, rtol=1e-12, atol=1e-12)
    mp = interop.MessagePassing("2x0e + 2x1o", "1o + 2e", "0e + 1o", self_connection="0e + 1o")
    with pytest.raises(ValueError, match=r"weights must be \[E=23, num_weights=10\]"):
        mp(x, y, w[:, :5], SENDERS, RECEIVERS)
    with pytest.raises(ValueError, match="node_feats must be an IrrepsArray"):
        mp(e3nn.IrrepsArray("4x0e", jnp.ones((N, 4))), y, w, SENDERS, RECEIVERS)
    with pytest.raises(ValueError, match="edge_attrs must have irreps"):
        mp(x, e3nn.IrrepsArray("0e", jnp.ones((E, 1))), w, SENDERS, RECEIVERS)
    with pytest.raises(ValueError, match="senders and receivers, or graph"):
        mp(x, y, w)
    with pytest.raises(TypeError, match=r"graph must be an e3j.Graph \(e3j.Graph.from_edges.*got tuple"):
        mp(x, y, w, graph=(SENDERS, RECEIVERS))


@pytest.mark.parametrize("grouping", ["multiplicity", "gcd"])
def test_flax_module_takes_the_function_forms_options(grouping):
    from e3j.flax import MessagePassing as FlaxMessagePassing

    x, y, w = operands("8x0e + 4x1o + 2x2e", "1o + 2e", 48)
    ref = e3nn_pattern(x, y, w, "0e + 1o + 2e", "0e + 1o + 2e")
    module = FlaxMessagePassing(filter_ir_out="0e + 1o + 2e", self_connection="0e + 1o + 2e", grouping=grouping)
    graph = e3j.Graph.from_edges(SENDERS, RECEIVERS, N)
    out, params = module.init_with_output(jax.random.key(0), x, y, w, graph=graph, backend="reference")
    assert params == {}
    assert out.irreps == ref.irreps
    # known before the call, from the irreps alone (e3nn's count: one weight per copy of the messages)
    assert module.num_weights(x.irreps, y.irreps) == 48 == ref.irreps.num_irreps
    assert module.irreps_out(x.irreps, y.irreps) == ref.irreps
    np.testing.assert_allclose(out.array, ref.array, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="grouping"):
        FlaxMessagePassing(filter_ir_out="0e", grouping="bad").init(jax.random.key(0), x, y, w, SENDERS, RECEIVERS)


MARKED = [  # marks of x's blocks, of y's blocks, self connection
    ((False, True, True), (False, False, False, False), None),  # scalars embedded into vectors
    ((False, True, True), (False, False, False, False), "0e + 1o + 2e"),
    ((True, False, True), (False, True, False, False), "0e + 1o + 2e"),  # marks in both operands
    ((False, False, False), (False, True, True, False), None),  # edge attributes only
    ((True, True, True), (False, False, False, False), "0e + 1o + 2e"),  # nothing left: zeros
    ((False, True, False), (True, True, True, True), "0e + 1o + 2e"),  # the self connection alone
    ((False, True, True), (True, True, True, False), None),  # 0e x 3o -> 3o only, filtered out: zeros
]


@pytest.mark.parametrize("zero_x, zero_y, self_connection", MARKED)
@pytest.mark.parametrize("factored", [False, True])
def test_marked_blocks_are_skipped_as_e3nn_skips_them(zero_x, zero_y, self_connection, factored):
    """e3nn-jax skips every product that reads a block marked zero (e.g. node features from a
    ``Linear`` with ``force_irreps_out=True`` on scalars): the drop-in runs only the others
    (fewer paths bound), with e3nn's values and gradients (float64), array or factored weights."""
    irreps_x, irreps_y, filter_ = "4x0e + 2x1o + 2x2e", "0e + 1o + 2e + 3o", "0e + 1o + 2e"
    mp = interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=self_connection)
    x, y, _ = operands(irreps_x, irreps_y, mp.num_weights, seed=11)
    hidden = jax.random.normal(jax.random.key(3), (E, 5), jnp.float64)
    kernel = jax.random.normal(jax.random.key(4), (5, mp.num_weights), jnp.float64)

    def marked(a, irreps, marks):  # inside each trace: the marks are static
        a = e3nn.IrrepsArray(irreps, a)
        chunks = [None if z else c for c, z in zip(a.chunks, marks)]
        return e3nn.from_chunks(a.irreps, chunks, a.shape[:-1], a.dtype)

    def loss(f):
        def run(a, b, h, k):
            weights = e3j.FactoredWeights(h, k) if factored else h @ k
            return jnp.sum(jnp.sin(f(marked(a, irreps_x, zero_x), marked(b, irreps_y, zero_y), weights).array))

        return run

    ref = loss(lambda a, b, c: e3nn_pattern(a, b, c.materialize() if factored else c, filter_, self_connection))
    got = loss(lambda a, b, c: mp(a, b, c, SENDERS, RECEIVERS))
    args = (x.array, y.array, hidden, kernel)
    np.testing.assert_allclose(jax.jit(got)(*args), jax.jit(ref)(*args), rtol=1e-12, atol=1e-12)
    for g, r in zip(jax.jit(jax.grad(got, (0, 1, 2, 3)))(*args), jax.jit(jax.grad(ref, (0, 1, 2, 3)))(*args)):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)
    full = paths_bound(lambda a, b, h, k: mp(x, y, h @ k, SENDERS, RECEIVERS).array, *args)
    run = paths_bound(lambda a, b, h, k: mp(marked(a, irreps_x, zero_x), marked(b, irreps_y, zero_y), h @ k,
                                           SENDERS, RECEIVERS).array, *args)  # fmt: skip
    assert full > 0 and (run < full) == (any(zero_x) or any(zero_y))
    if zero_x == (False, True, True) and not any(zero_y) and self_connection is None:
        assert (run, full) == (3, 13)  # 0e x {0e, 1o, 2e} -> {0e, 1o, 2e}, the other 10 of e3nn's 13 skipped
    if all(zero_x) or (zero_y == (True, True, True, False) and self_connection is None):
        assert run == 0


# the CPU-runnable backends (as tests/interop/test_porting.py runs them)
BACKENDS = ["reference", "cuda_host", "pallas_gpu_interpret"]
SLOW_BACKENDS = ["cuda_simt", "pallas_tpu_interpret", "pallas_mosaic_interpret"]


@pytest.mark.parametrize("backend", BACKENDS + [pytest.param(b, marks=pytest.mark.slow) for b in SLOW_BACKENDS])
def test_marked_blocks_are_skipped_on_every_backend(backend):
    """The product over the unmarked blocks reads its weights' columns of e3nn's array in place on
    every backend's kernels; the columns it skips get a zero gradient (kernels that write only their
    own columns of the weights' cotangent leave the others unwritten: they are zeroed)."""
    require_backend(backend)
    irreps_x, irreps_y, filter_ = "4x0e + 2x1o + 2x2e", "0e + 1o + 2e + 3o", "0e + 1o + 2e"
    mp = interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=filter_)
    x, y, w = operands(irreps_x, irreps_y, mp.num_weights, seed=12)
    tol = 1e-12 if "float64" in e3j.backends.get_backend(backend).dtypes else 1e-5
    args = tuple(a.astype(jnp.float64 if tol == 1e-12 else jnp.float32) for a in (x.array, y.array, w))

    def marked(a, irreps, marks):
        a = e3nn.IrrepsArray(irreps, a)
        chunks = [None if z else c for c, z in zip(a.chunks, marks)]
        return e3nn.from_chunks(a.irreps, chunks, a.shape[:-1], a.dtype)

    def loss(f):
        def run(a, b, c):
            return jnp.sum(jnp.sin(f(marked(a, irreps_x, (False, True, False)),
                                     marked(b, irreps_y, (False, True, False, False)), c).array))  # fmt: skip

        return run

    ref = loss(lambda a, b, c: e3nn_pattern(a, b, c, filter_, filter_))
    got = loss(lambda a, b, c: mp(a, b, c, SENDERS, RECEIVERS))
    with e3j.use_backend(backend):
        value, grads = jax.jit(jax.value_and_grad(got, (0, 1, 2)))(*args)
    ref_value, ref_grads = jax.value_and_grad(ref, (0, 1, 2))(x.array, y.array, w)
    np.testing.assert_allclose(value, ref_value, rtol=tol)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol * float(jnp.abs(r).max()))
    unread = np.asarray(ref_grads[2] == 0).all(axis=0)
    assert unread.any() and not unread.all() and (np.asarray(grads[2])[:, unread] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_blocks_no_product_reads_stay_out(backend):
    """Blocks of the node features and edge attributes whose every product the filter drops
    (``4e`` and ``6o`` under ``0e + 1o``) are never read by e3nn-jax: NaN there leaves its values
    and gradients finite, and the drop-in's equal them on every CPU-runnable backend."""
    require_backend(backend)
    irreps_x, irreps_y, filter_ = "4x0e + 2x1o + 2x4e", "0e + 1o + 6o", "0e + 1o"
    mp = interop.MessagePassing(irreps_x, irreps_y, filter_)
    x, y, w = operands(irreps_x, irreps_y, mp.num_weights, seed=13)
    args = (x.array.at[:, 10:].set(jnp.nan), y.array.at[:, 4:].set(jnp.nan), w)

    def loss(f):
        def run(a, b, c):
            return jnp.sum(jnp.sin(f(e3nn.IrrepsArray(irreps_x, a), e3nn.IrrepsArray(irreps_y, b), c).array))

        return run

    ref = jax.value_and_grad(loss(lambda a, b, c: e3nn_pattern(a, b, c, filter_, None)), (0, 1, 2))(*args)
    with e3j.use_backend(backend):
        got = jax.jit(jax.value_and_grad(loss(lambda a, b, c: mp(a, b, c, SENDERS, RECEIVERS)), (0, 1, 2)))(*args)
    assert np.isfinite(ref[0]) and all(np.isfinite(r).all() for r in ref[1])
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-12)
    for g, r in zip(got[1], ref[1]):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)


def test_inputs_marked_zero_give_e3nns_values_and_marks():
    """Node features whose blocks are marked zero (e3nn's ``zero_flags``, e.g. from
    ``e3nn.from_chunks`` with ``None``): e3nn skips those products, e3j computes zeros; the values
    and the output's marks (none: e3nn's ``scatter_sum`` drops them) are e3nn's."""
    irreps_x, irreps_y, filter_ = "4x0e + 2x1o + 2x2e", "1o + 2e", "0e + 1o + 2e"
    mp = interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=filter_)
    x, y, w = operands(irreps_x, irreps_y, mp.num_weights, seed=7)

    def marked(a):  # inside each trace: the marks are static, dropped at jit's boundary
        a = e3nn.IrrepsArray(irreps_x, a)
        return e3nn.from_chunks(a.irreps, [a.chunks[0], None, None], a.shape[:-1])

    ref = jax.jit(lambda a, b, c: e3nn_pattern(marked(a), b, c, filter_, filter_).array)(x.array, y, w)
    out = jax.jit(lambda a, b, c: mp(marked(a), b, c, SENDERS, RECEIVERS).array)(x.array, y, w)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    assert not np.allclose(ref, e3nn_pattern(x, y, w, filter_, filter_).array)  # the marks mattered
    ref, out = e3nn_pattern(marked(x.array), y, w, filter_, filter_), mp(marked(x.array), y, w, SENDERS, RECEIVERS)
    assert out.zero_flags == ref.zero_flags
    # a marked block is zero whatever its data holds (e3nn never reads it): NaN in each operand's
    nan_x = e3nn.IrrepsArray(irreps_x, x.array.at[:, 4:].set(jnp.nan), zero_flags=(False, True, True))
    nan_y = e3nn.IrrepsArray(irreps_y, y.array.at[:, 3:].set(jnp.nan), zero_flags=(False, True))
    w_irreps = f"{mp.num_weights - 3}x0e + 3x0e"
    nan_w = e3nn.IrrepsArray(w_irreps, w.at[:, -3:].set(jnp.nan), zero_flags=(False, True))
    ref = e3nn_pattern(nan_x, nan_y, nan_w, filter_, filter_).array
    out = mp(nan_x, nan_y, nan_w, SENDERS, RECEIVERS).array
    assert np.isfinite(ref).all()
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("self_connection", [None, "0e + 1o + 2e"])
def test_node_feats_chunked_otherwise_are_e3nns(self_connection):
    """Node features and edge attributes whose irreps split a block of the op's (``2x0e + 2x0e`` for
    ``4x0e``: the same flat layout; e3nn's pattern gives the same result for either chunking) are
    accepted, with marks on one chunk read on the op's blocks: e3nn-jax's values and gradients."""
    irreps_x, irreps_y, filter_ = "4x0e + 2x1o + 1x2e", "0e + 1e + 1o + 2e", "0e + 1o + 2e"
    mp = interop.MessagePassing(irreps_x, irreps_y, filter_, self_connection=self_connection)
    x, y, w = operands(irreps_x, irreps_y, mp.num_weights, seed=5)
    chunked_x, chunked_y = "2x0e + 2x0e + 1o + 1o + 2e", "0e + 1e + 1o + 2e"

    def as_chunked(a, irreps, marked=()):
        a = e3nn.IrrepsArray(irreps, a)
        return e3nn.from_chunks(a.irreps, [None if i in marked else c for i, c in enumerate(a.chunks)], a.shape[:-1])

    for marked in [(), (3,), (0, 1)]:  # none, one of two 1o chunks (block not marked), both 0e chunks

        def loss(f, marked=marked):
            return lambda a, b, c: jnp.sum(
                jnp.sin(f(as_chunked(a, chunked_x, marked), as_chunked(b, chunked_y), c).array)
            )

        got = loss(lambda a, b, c: mp(a, b, c, SENDERS, RECEIVERS))
        ref = loss(lambda a, b, c: e3nn_pattern(a, b, c, filter_, self_connection))
        args = (x.array, y.array, w)
        np.testing.assert_allclose(got(*args), ref(*args), rtol=1e-12)
        for g, r in zip(jax.grad(got, (0, 1, 2))(*args), jax.grad(ref, (0, 1, 2))(*args)):
            np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="node_feats must be an IrrepsArray"):  # another flat layout
        mp(e3nn.IrrepsArray("2x1o + 4x0e + 1x2e", x.array), y, w, SENDERS, RECEIVERS)
