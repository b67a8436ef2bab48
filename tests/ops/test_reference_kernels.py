"""The reference kernels' formulations agree with each other and with core's numpy evaluation."""

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

import e3j
from e3j.reference import tensor_product as ref_tp
from e3j_core import tensor_product_coo


@pytest.fixture(scope="module")
def operands():
    coo = tensor_product_coo("2x0e + 1o + 2e", "0e + 1o + 2e", "0e + 1o + 1e + 2e + 3o")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, coo.dim_x, 5))
    y = rng.normal(size=(7, coo.dim_y, 5))
    dz = rng.normal(size=(7, coo.dim_out, 5))
    return coo, x, y, dz


def numpy_apply(table, a, b, out_channels=True):
    # core's numpy evaluation, one channel at a time (operands [B, D, C])
    out = np.stack([table(a[..., c], b[..., c]) for c in range(a.shape[-1])], -1)
    return out if out_channels else out.sum(-1)


@pytest.mark.parametrize("limit", [0, 10**9], ids=["gathered", "unrolled"])
def test_all_channel_formulations(operands, monkeypatch, limit):
    monkeypatch.setattr(ref_tp, "_UNROLL_LIMIT", limit)
    coo, x, y, dz = operands
    for table, a, b in ((coo.table, x, y), (coo.vjp_x, y, dz), (coo.vjp_y, x, dz)):
        got = jax.jit(
            lambda a, b, t=table: ref_tp.apply_table(t, a, b, a_channels=True, b_channels=True, out_channels=True)
        )(a, b)
        np.testing.assert_allclose(got, numpy_apply(table, a, b), atol=1e-12)
        summed = ref_tp.apply_table(
            table, jnp.asarray(a), jnp.asarray(b), a_channels=True, b_channels=True, out_channels=False
        )
        np.testing.assert_allclose(summed, numpy_apply(table, a, b, out_channels=False), atol=1e-11)


@pytest.mark.parametrize("sparsity", [0, 10**9], ids=["unrolled", "dense"])
def test_broadcast_operand_formulations(operands, monkeypatch, sparsity):
    # the forward with a broadcast y: both formulations (unrolled records, dense per-row matrix)
    monkeypatch.setattr(ref_tp, "_UNROLL_SPARSITY", sparsity)
    coo, x, y, _ = operands
    yb = y[..., 0]
    assert ref_tp._unrolling_pays(coo.table, x.shape[-1], (True, False, True)) == (sparsity == 0)
    got = jax.jit(
        lambda a, b: ref_tp.apply_table(coo.table, a, b, a_channels=True, b_channels=False, out_channels=True)
    )(x, yb)
    np.testing.assert_allclose(got, numpy_apply(coo.table, x, np.repeat(yb[..., None], 5, -1)), atol=1e-12)


@pytest.mark.parametrize(
    "irreps_x, irreps_y, filter, channels, unrolled",
    [
        ("0e + 1o + 2e", "0e + 1o + 2e", "0e + 1o + 2e", 1, True),  # dense: 38x the records' work
        ("4x0e + 2x1o + 1x2e", "0e + 1o + 2e + 3o", "0e + 1o + 2e", 16, True),  # 13x
        ("1o", "0e + 1o + 2e + 3o", "0e + 1o + 2e", 32, False),  # 1.6x
        ("0e + 1o + 2e + 3o + 4e", "0e + 1o + 2e + 3o + 4e", "0e + 1o + 2e + 3o + 4e", 2, True),  # 67x, 1158 records
        ("0e + 1o + 2e + 3o + 4e", "0e + 1o + 2e + 3o + 4e", "0e + 1o + 2e + 3o + 4e", 8, False),  # 17x, 1158
    ],
)
def test_sparse_broadcast_calls_unroll_in_both_directions(irreps_x, irreps_y, filter, channels, unrolled):
    """A call with a broadcast operand (the forward with spherical harmonics, and both cotangents)
    runs the records unrolled where the dense formulation would mostly multiply zeros (few channels,
    many copies), and dense elsewhere: no matrix product in the one, only matrix products in the
    other. Values against core's numpy evaluation."""
    coo = tensor_product_coo(irreps_x, irreps_y, filter)
    rng = np.random.default_rng(3)
    x, dz = rng.normal(size=(3, coo.dim_x, channels)), rng.normal(size=(3, coo.dim_out, channels))
    y = rng.normal(size=(3, coo.dim_y))
    yc = np.repeat(y[..., None], channels, -1)
    cases = [  # (table, a, b, a_channels, b_channels, out_channels, numpy result)
        (coo.table, x, y, True, False, True, numpy_apply(coo.table, x, yc)),
        (coo.vjp_x, y, dz, False, True, True, numpy_apply(coo.vjp_x, yc, dz)),
        (coo.vjp_y, x, dz, True, True, False, numpy_apply(coo.vjp_y, x, dz, out_channels=False)),
    ]
    for table, a, b, ac, bc, oc, want in cases:

        def apply(a, b, t=table, ac=ac, bc=bc, oc=oc):
            return ref_tp.apply_table(t, a, b, a_channels=ac, b_channels=bc, out_channels=oc)

        names = {e.primitive.name for e in jax.make_jaxpr(apply)(a, b).jaxpr.eqns}
        assert ("dot_general" not in names) == unrolled, names
        np.testing.assert_allclose(apply(jnp.asarray(a), jnp.asarray(b)), want, atol=1e-11)


def test_dense_formulation_for_broadcast_operands(operands, monkeypatch):
    monkeypatch.setattr(ref_tp, "_UNROLL_SPARSITY", 10**9)
    coo, x, y, dz = operands
    yb = y[..., 0]
    got = ref_tp.apply_table(
        coo.table, jnp.asarray(x), jnp.asarray(yb), a_channels=True, b_channels=False, out_channels=True
    )
    np.testing.assert_allclose(got, numpy_apply(coo.table, x, np.repeat(yb[..., None], 5, -1)), atol=1e-12)
    got = ref_tp.apply_table(
        coo.vjp_x, jnp.asarray(yb), jnp.asarray(dz), a_channels=False, b_channels=True, out_channels=True
    )
    np.testing.assert_allclose(got, numpy_apply(coo.vjp_x, np.repeat(yb[..., None], 5, -1), dz), atol=1e-12)
    got = ref_tp.apply_table(
        coo.vjp_y, jnp.asarray(x), jnp.asarray(dz), a_channels=True, b_channels=True, out_channels=False
    )
    np.testing.assert_allclose(got, numpy_apply(coo.vjp_y, x, dz, out_channels=False), atol=1e-11)
    with pytest.raises(ValueError, match="needs an operand with channels"):
        ref_tp.apply_table(
            coo.table, jnp.asarray(yb), jnp.asarray(yb), a_channels=False, b_channels=False, out_channels=True
        )


def test_gathered_formulation_with_a_broadcast_operand(operands, monkeypatch):
    """Large tables whose dense per-row matrix is too big (a full lmax-6 product with spherical
    harmonics) take the gathered formulation with one operand broadcast, not thousands of unrolled
    records; here forced on a small table, every mix of channels against core's numpy evaluation."""
    monkeypatch.setattr(ref_tp, "_UNROLL_LIMIT", 0)
    monkeypatch.setattr(ref_tp, "_DENSE_LIMIT", 0)
    coo, x, y, dz = operands
    yb, rep = y[..., 0], lambda v: np.repeat(v[..., None], 5, -1)
    cases = [  # (table, a, b, a_channels, b_channels, out_channels, numpy result)
        (coo.table, x, yb, True, False, True, numpy_apply(coo.table, x, rep(yb))),
        (coo.vjp_x, yb, dz, False, True, True, numpy_apply(coo.vjp_x, rep(yb), dz)),
        (coo.vjp_y, x, dz, True, True, False, numpy_apply(coo.vjp_y, x, dz, out_channels=False)),
        (coo.table, x[..., 0], yb, False, False, False, coo.table(x[..., 0], yb)),
    ]
    for table, a, b, ac, bc, oc, want in cases:

        def apply(a, b, t=table, ac=ac, bc=bc, oc=oc):
            return ref_tp.apply_table(t, a, b, a_channels=ac, b_channels=bc, out_channels=oc)

        np.testing.assert_allclose(jax.jit(apply)(a, b), want, atol=1e-11)
        # one gather-multiply-sum per row, not one equation per record
        assert len(jax.make_jaxpr(apply)(a, b).jaxpr.eqns) < 20 < table.num_records


@pytest.mark.parametrize("form", ["unrolled", "dense", "gathered"])
def test_components_no_record_reads_stay_out(monkeypatch, form):
    """Operand components no record reads (x's 4e and y's 6o, whose products the filter drops) are
    never read, in every formulation and channel mix: NaN there changes nothing (the dense
    formulation multiplied them by its table's zeros), as in e3nn-jax and every kernel."""
    monkeypatch.setattr(ref_tp, "_UNROLL_SPARSITY", 0 if form == "unrolled" else 10**9)
    if form == "gathered":
        monkeypatch.setattr(ref_tp, "_UNROLL_LIMIT", 0)
        monkeypatch.setattr(ref_tp, "_DENSE_LIMIT", 0)
    coo = tensor_product_coo("2x0e + 1o + 4e", "0e + 1o + 6o", "0e + 1o")
    rng = np.random.default_rng(1)
    x, y, dz = (rng.normal(size=(4, d, 3)) for d in (coo.dim_x, coo.dim_y, coo.dim_out))
    unread_x, unread_y = np.arange(coo.dim_x) >= 5, np.arange(coo.dim_y) >= 4  # 4e, 6o
    assert not np.isin(np.flatnonzero(unread_x), coo.table.indices[1]).any()
    assert not np.isin(np.flatnonzero(unread_y), coo.table.indices[2]).any()
    nan_x, zero_x = np.where(unread_x[:, None], np.nan, x), np.where(unread_x[:, None], 0.0, x)
    nan_y, zero_y = np.where(unread_y[:, None], np.nan, y), np.where(unread_y[:, None], 0.0, y)
    rep = lambda v: np.repeat(v[..., None], 3, -1)  # noqa: E731
    cases = [  # (table, a, b, a_channels, b_channels, out_channels, numpy result on the zeroed operands)
        (coo.table, nan_x, nan_y[..., 0], True, False, True, numpy_apply(coo.table, zero_x, rep(zero_y[..., 0]))),
        (coo.table, nan_x, nan_y, True, True, True, numpy_apply(coo.table, zero_x, zero_y)),
        (coo.vjp_x, nan_y[..., 0], dz, False, True, True, numpy_apply(coo.vjp_x, rep(zero_y[..., 0]), dz)),
        (coo.vjp_y, nan_x, dz, True, True, False, numpy_apply(coo.vjp_y, zero_x, dz, out_channels=False)),
    ]
    for table, a, b, ac, bc, oc, want in cases:
        got = ref_tp.apply_table(table, jnp.asarray(a), jnp.asarray(b), a_channels=ac, b_channels=bc, out_channels=oc)
        assert np.isfinite(want).all()
        np.testing.assert_allclose(got, want, atol=1e-11)


def test_large_table_compiles_fast_and_matches_e3nn():
    import time

    import e3nn_jax as e3nn

    irreps = "0e + 1o + 2e + 3o + 4e"
    tp = e3j.TensorProduct(irreps, irreps)  # 3741 records: the gathered formulation
    assert tp.coo.table.num_records > ref_tp._UNROLL_LIMIT
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(4, tp.coo.dim_x, 2)))
    y = jnp.asarray(rng.normal(size=(4, tp.coo.dim_y, 2)))
    t0 = time.perf_counter()
    z = jax.jit(lambda x, y: tp(x, y))(x, y)
    assert time.perf_counter() - t0 < 30  # unrolled, this took about a minute on 2 cores
    ref = np.stack(
        [
            e3nn.tensor_product(e3nn.IrrepsArray(irreps, x[..., c]), e3nn.IrrepsArray(irreps, y[..., c])).array
            for c in range(2)
        ],
        -1,
    )
    np.testing.assert_allclose(z, ref, atol=1e-12)


def test_linear_transpose_of_the_forward_ops():
    """The forward primitive is linear in each operand: jax.linear_transpose uses its transpose rule."""
    rng = np.random.default_rng(2)
    tp = e3j.TensorProduct("0e + 1o + 2e", "0e + 1o", filter="0e + 1o + 2e")
    x = jnp.asarray(rng.normal(size=(3, tp.coo.dim_x, 2)))
    y = jnp.asarray(rng.normal(size=(3, tp.coo.dim_y)))
    dz = jnp.asarray(rng.normal(size=(3, tp.coo.dim_out, 2)))
    (tx,) = jax.linear_transpose(lambda x: tp(x, y), x)(dz)
    (ty,) = jax.linear_transpose(lambda y: tp(x, y), y)(dz)
    vx, vy = jax.vjp(tp, x, y)[1](dz)
    np.testing.assert_allclose(tx, vx, atol=1e-12)
    np.testing.assert_allclose(ty, vy, atol=1e-12)
    # <dz, tp(x, y)> = <transpose(dz), x>
    np.testing.assert_allclose(jnp.vdot(dz, tp(x, y)), jnp.vdot(tx, x), rtol=1e-12)


def _dot_precisions(jaxpr) -> list:
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _dot_precisions(sub)
    return found


def test_reference_products_run_in_full_float32_on_every_device(operands, monkeypatch):
    # On the H200 the reference's products ran in TF32 under JAX's default precision (gradients off by
    # ~5e-3 relative against the kernels); a TPU's default is bfloat16 passes. Every matrix product of the
    # dense formulations (one operand with channels, one without) asks for HIGHEST, and the gradients
    # inherit it; so would any in the spherical harmonics (their recurrences are elementwise).
    monkeypatch.setattr(ref_tp, "_UNROLL_SPARSITY", 10**9)  # the dense formulation for this small table
    coo, x, y, _ = operands
    exact = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
    x32, y32 = jnp.asarray(x, jnp.float32), jnp.asarray(y[..., 0], jnp.float32)

    def tp(x, y):
        return ref_tp.apply_table(coo.table, x, y, a_channels=True, b_channels=False, out_channels=True)

    def loss(x, y):
        return jnp.sum(jnp.sin(tp(x, y)))

    for fn in (tp, jax.grad(loss, argnums=(0, 1))):
        found = _dot_precisions(jax.make_jaxpr(fn)(x32, y32).jaxpr)
        assert found, "expected the dense formulation (matrix products) for this table"
        assert all(p == exact for p in found), found
    vectors = jnp.ones((4, 3), jnp.float32)
    found = _dot_precisions(
        jax.make_jaxpr(lambda v: e3j.spherical_harmonics("0e + 1o + 2e + 3o", v, True))(vectors).jaxpr
    )
    assert all(p == exact for p in found), found
    # the factored convolution's weights h @ k, computed chunk by chunk in the sweep, and their
    # cotangents ds @ k^T and h^T ds
    conv = e3j.Convolution("0e + 1o", "0e + 1o", filter="0e + 1o")
    graph = e3j.Graph.from_edges(np.array([0, 1, 2]), np.array([1, 2, 0]), 3)
    h, kernel = jnp.ones((3, 5), jnp.float32), jnp.ones((5, conv.num_paths * 4), jnp.float32)

    def conv_loss(x, y, h, kernel):
        w = e3j.FactoredWeights(h, kernel)
        return jnp.sum(jnp.sin(conv(x, y, w, graph, backend="reference")))

    xs, ys = jnp.ones((3, 4, 4), jnp.float32), jnp.ones((3, 4), jnp.float32)
    # the op is one primitive in a jaxpr: its products appear once lowered
    text = jax.jit(jax.grad(conv_loss, argnums=(0, 1, 2, 3))).lower(xs, ys, h, kernel).as_text()
    dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    assert sum("x 5xf32>" in d or "<5x" in d for d in dots) >= 3, dots  # h @ k, ds @ k^T, h^T ds
    assert all("precision = [HIGHEST, HIGHEST]" in d for d in dots), dots
