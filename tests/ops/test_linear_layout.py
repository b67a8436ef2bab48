"""``e3j.Linear`` (equivariance, a manual per-irrep oracle, validation, jit/grad) and the layout
helpers ``to_mul_ir`` / ``from_mul_ir`` / ``mul_ir_irreps`` against e3nn-jax's flat layout."""

import math

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

import e3j
from e3j import Irreps

# repeated irreps in separate chunks, an input irrep unused by the output (1e) and output irreps
# absent from the input (3o, 0o)
IRREPS_IN = "2x0e + 1o + 1e + 0e + 2x2e + 1o"
IRREPS_OUT = "0e + 2x1o + 3o + 2e + 0o + 0e"
C_IN, C_OUT = 3, 2


def random_o3(rng, reflect):
    R = Rotation.random(random_state=rng).as_matrix()
    return -R if reflect else R


def rows_by_irrep(irreps):
    """Independent of e3j.linear: {irrep: [row indices of each copy]}."""
    out, start = {}, 0
    for mul, ir in Irreps(irreps):
        for _ in range(mul):
            out.setdefault(ir, []).append(np.arange(start, start + ir.dim))
            start += ir.dim
    return out


def manual_linear(params, x, irreps_in, irreps_out, c_out):
    """Per output irrep: out[b, copy v, m, d] = Σ_{u,c} x[b, copy u, m, c] W[u, v, c, d] / sqrt(mul_in·C_in)."""
    rin, rout = rows_by_irrep(irreps_in), rows_by_irrep(irreps_out)
    out = jnp.zeros((x.shape[0], Irreps(irreps_out).dim, c_out), x.dtype)
    for ir, copies_out in rout.items():
        if ir not in rin:
            continue
        w = params[str(ir)]
        norm = 1 / math.sqrt(len(rin[ir]) * x.shape[-1])
        for v, rows_v in enumerate(copies_out):
            acc = sum(jnp.einsum("bmc,cd->bmd", x[:, rows_u, :], w[u, v]) for u, rows_u in enumerate(rin[ir]))
            out = out.at[:, rows_v, :].set(acc * norm)
    return out


@pytest.fixture(scope="module")
def lin():
    return e3j.Linear(IRREPS_IN, IRREPS_OUT, channels_in=C_IN, channels_out=C_OUT)


@pytest.fixture(scope="module")
def params(lin):
    return lin.init(jax.random.key(0), jnp.float64)


@pytest.fixture(scope="module")
def x():
    return jnp.asarray(np.random.default_rng(0).normal(size=(5, Irreps(IRREPS_IN).dim, C_IN)))


def test_weight_shapes_and_init(lin, params):
    assert lin.weight_shapes() == {
        "0e": (3, 2, C_IN, C_OUT),
        "1o": (2, 2, C_IN, C_OUT),
        "2e": (2, 1, C_IN, C_OUT),
    }
    assert {k: v.shape for k, v in params.items()} == lin.weight_shapes()
    assert all(v.dtype == jnp.float64 for v in params.values())
    assert all(v.dtype == jnp.float32 for v in lin.init(jax.random.key(1)).values())


def test_matches_manual_einsum_and_absent_irreps_are_zero(lin, params, x):
    out = lin(params, x)
    assert out.shape == (5, Irreps(IRREPS_OUT).dim, C_OUT) and out.dtype == jnp.float64
    ref = manual_linear(params, x, IRREPS_IN, IRREPS_OUT, C_OUT)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-13)
    rout = rows_by_irrep(IRREPS_OUT)
    for ir in ("3o", "0o"):
        rows = np.concatenate(rout[e3j.Irrep(ir)])
        assert float(jnp.max(jnp.abs(out[:, rows]))) == 0.0
    others = np.setdiff1d(np.arange(out.shape[1]), np.concatenate(rout[e3j.Irrep("3o")] + rout[e3j.Irrep("0o")]))
    assert float(jnp.min(jnp.max(jnp.abs(out[:, others]), axis=(0, 2)))) > 0  # every other row is used


def test_fan_in_normalization():
    """Unit-variance weights and inputs give unit-variance outputs (e3nn's normalization)."""
    lin = e3j.Linear("4x1o", "2x1o", channels_in=8, channels_out=8)
    params = lin.init(jax.random.key(2), jnp.float64)
    x = jax.random.normal(jax.random.key(3), (4000, 12, 8), jnp.float64)
    var = float(jnp.var(lin(params, x)))
    assert 0.9 < var < 1.1, var


@pytest.mark.parametrize("reflect", [False, True])
def test_equivariance(lin, params, x, reflect):
    rng = np.random.default_rng(5 + reflect)
    R = random_o3(rng, reflect)
    D_in = jnp.asarray(Irreps(IRREPS_IN).D_from_matrix(R))
    D_out = jnp.asarray(Irreps(IRREPS_OUT).D_from_matrix(R))
    lhs = lin(params, jnp.einsum("ij,bjc->bic", D_in, x))
    rhs = jnp.einsum("ij,bjc->bic", D_out, lin(params, x))
    assert float(jnp.max(jnp.abs(rhs))) > 0.1
    np.testing.assert_allclose(lhs, rhs, rtol=0, atol=1e-12)


def test_jit_and_grad(lin, params, x):
    g = jnp.asarray(np.random.default_rng(6).normal(size=(5, Irreps(IRREPS_OUT).dim, C_OUT)))
    np.testing.assert_allclose(jax.jit(lin.__call__)(params, x), lin(params, x), rtol=0, atol=1e-14)

    def loss(fn):
        return lambda p, x: jnp.sum(fn(p, x) * g)

    got = jax.jit(jax.grad(loss(lin.__call__), argnums=(0, 1)))(params, x)
    ref = jax.grad(loss(lambda p, x: manual_linear(p, x, IRREPS_IN, IRREPS_OUT, C_OUT)), argnums=(0, 1))(params, x)
    assert set(got[0]) == set(params)
    for k in params:
        np.testing.assert_allclose(got[0][k], ref[0][k], rtol=0, atol=1e-12, err_msg=k)
    np.testing.assert_allclose(got[1], ref[1], rtol=0, atol=1e-12)
    # rows of input irreps that no output uses (1e) get zero gradient
    rows_1e = rows_by_irrep(IRREPS_IN)[e3j.Irrep("1e")][0]
    assert float(jnp.max(jnp.abs(got[1][:, rows_1e]))) == 0.0


def test_mixed_dtypes(lin, params, x):
    p32 = {k: v.astype(jnp.float32) for k, v in params.items()}
    out = lin(p32, x)  # weights follow x's dtype
    assert out.dtype == jnp.float64
    np.testing.assert_allclose(out, lin({k: v.astype(jnp.float64) for k, v in p32.items()}, x), rtol=0, atol=0)
    assert lin(p32, x.astype(jnp.float32)).dtype == jnp.float32


def test_validation_errors(lin, params, x):
    with pytest.raises(ValueError, match=r"params must have keys \['0e', '1o', '2e'\], got \['0e', '1o'\]"):
        lin({k: v for k, v in params.items() if k != "2e"}, x)
    with pytest.raises(ValueError, match="params must have keys"):
        lin({**params, "3o": jnp.zeros((1, 1, C_IN, C_OUT))}, x)
    with pytest.raises(ValueError, match=r"params\['1o'\] must have shape \(2, 2, 3, 2\), got \(2, 2, 2, 3\)"):
        lin({**params, "1o": jnp.zeros((2, 2, C_OUT, C_IN))}, x)
    with pytest.raises(ValueError, match=r"x must have shape \[B, D_in=22, C_in=3\]"):
        lin(params, x[0])
    with pytest.raises(ValueError, match=r"x must be \[B, 22, 3\]"):
        lin(params, x[:, :21])
    with pytest.raises(ValueError, match=r"x must be \[B, 22, 3\]"):
        lin(params, x[..., :2])
    with pytest.raises(TypeError, match="x must be a floating-point array"):
        lin(params, x.astype(jnp.int32))
    for bad in (0, -1, True, np.bool_(True), 2.0, np.int64(0), np.ones(2, int)):
        with pytest.raises(ValueError, match="channels_in must be an int > 0"):
            e3j.Linear("0e", "0e", channels_in=bad, channels_out=1)
        with pytest.raises(ValueError, match="channels_out must be an int > 0"):
            e3j.Linear("0e", "0e", channels_in=1, channels_out=bad)


def test_numpy_integer_counts_are_taken(lin, params, x):
    # counts often come from numpy arithmetic (np.prod, an array's size): same layer as Python ints
    lin_np = e3j.Linear(IRREPS_IN, IRREPS_OUT, channels_in=np.int64(C_IN), channels_out=np.int32(C_OUT))
    assert type(lin_np.channels_in) is int and type(lin_np.channels_out) is int
    assert lin_np.weight_shapes() == lin.weight_shapes()
    np.testing.assert_array_equal(lin_np(params, x), lin(params, x))
    assert e3j.layout.mul_ir_irreps("0e + 1o", np.int64(3)) == e3j.layout.mul_ir_irreps("0e + 1o", 3)


# -- layout ----------------------------------------------------------------------------------------


def e3nn_chunks_from_x(x, irreps):
    """e3nn chunks of the flat layout, built directly from [B, D, C]: multiplicity index u·C + c."""
    chunks, start = [], 0
    channels = x.shape[-1]
    for mul, ir in Irreps(irreps):
        blk = x[:, start : start + mul * ir.dim, :].reshape(x.shape[0], mul, ir.dim, channels)
        chunks.append(jnp.transpose(blk, (0, 1, 3, 2)).reshape(x.shape[0], mul * channels, ir.dim))
        start += mul * ir.dim
    return chunks


def test_mul_ir_irreps():
    assert e3nn.Irreps(str(e3j.mul_ir_irreps("0e + 1o", 5))) == e3nn.Irreps("5x0e + 5x1o")
    assert e3j.mul_ir_irreps("2x0e + 1o + 3x2e", 4) == Irreps("8x0e + 4x1o + 12x2e")
    assert e3j.mul_ir_irreps("2x0e + 1o", 4).dim == Irreps("2x0e + 1o").dim * 4


def test_to_mul_ir_matches_e3nn_layout_0e_1o():
    C = 4
    x = jnp.asarray(np.random.default_rng(7).normal(size=(3, 4, C)))
    flat = e3j.to_mul_ir(x, "0e + 1o")
    assert flat.shape == (3, 4 * C)
    irreps = e3nn.Irreps(str(e3j.mul_ir_irreps("0e + 1o", C)))
    ref = e3nn.from_chunks(irreps, [x[:, 0:1, :].transpose(0, 2, 1), x[:, 1:4, :].transpose(0, 2, 1)], (3,))
    np.testing.assert_array_equal(flat, ref.array)
    # explicitly: scalars first (one per channel), then vector channel c at 4 + 3c
    np.testing.assert_array_equal(flat[:, :C], x[:, 0, :])
    for c in range(C):
        np.testing.assert_array_equal(flat[:, C + 3 * c : C + 3 * c + 3], x[:, 1:4, c])


@pytest.mark.parametrize("irreps", ["2x0e + 1o + 3x2e + 0e", "1o", "3x1e + 2x0o"])
def test_layout_round_trips_through_e3nn(irreps):
    C = 3
    x = jnp.asarray(np.random.default_rng(8).normal(size=(2, Irreps(irreps).dim, C)))
    flat = e3j.to_mul_ir(x, irreps)
    arr = e3nn.IrrepsArray(e3nn.Irreps(str(e3j.mul_ir_irreps(irreps, C))), flat)
    for chunk, ref in zip(arr.chunks, e3nn_chunks_from_x(x, irreps)):
        np.testing.assert_array_equal(chunk, ref)  # multiplicity index = copy·C + channel
    rebuilt = e3nn.from_chunks(arr.irreps, e3nn_chunks_from_x(x, irreps), (2,))
    np.testing.assert_array_equal(e3j.from_mul_ir(rebuilt.array, irreps, C), x)
    np.testing.assert_array_equal(e3j.from_mul_ir(flat, irreps, C), x)


def test_layout_commutes_with_rotations():
    """e3j's D on [B, D, C] and e3nn's transform_by_matrix on the flat layout agree."""
    irreps, C = "2x0e + 1o + 2e + 1e + 3o", 2
    rng = np.random.default_rng(9)
    x = jnp.asarray(rng.normal(size=(3, Irreps(irreps).dim, C)))
    for reflect in (False, True):
        R = random_o3(rng, reflect)
        Dx = jnp.einsum("ij,bjc->bic", jnp.asarray(Irreps(irreps).D_from_matrix(R)), x)
        arr = e3nn.IrrepsArray(e3nn.Irreps(str(e3j.mul_ir_irreps(irreps, C))), e3j.to_mul_ir(x, irreps))
        np.testing.assert_allclose(
            e3j.to_mul_ir(Dx, irreps), arr.transform_by_matrix(jnp.asarray(R)).array, rtol=0, atol=1e-12
        )


def test_layout_batch_dims_and_empty():
    x = jnp.asarray(np.random.default_rng(10).normal(size=(2, 3, 8, 2)))
    flat = e3j.to_mul_ir(x, "0e + 2x1o + 0e")
    assert flat.shape == (2, 3, 16)
    np.testing.assert_array_equal(flat[1, 2], e3j.to_mul_ir(x[1, 2][None], "0e + 2x1o + 0e")[0])
    np.testing.assert_array_equal(e3j.from_mul_ir(flat, "0e + 2x1o + 0e", 2), x)
    assert e3j.to_mul_ir(jnp.zeros((4, 0, 3)), "").shape == (4, 0)
    assert e3j.from_mul_ir(jnp.zeros((4, 0)), "", 3).shape == (4, 0, 3)
    # jit and grad pass through
    g = jax.grad(lambda x: jnp.sum(jax.jit(e3j.to_mul_ir, static_argnums=1)(x, "0e + 2x1o + 0e") ** 2))(x)
    np.testing.assert_allclose(g, 2 * x, rtol=0, atol=0)


def test_layout_bad_shapes():
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., D=4, C\] for 1x0e\+1x1o, got \(2, 5, 3\)"):
        e3j.to_mul_ir(jnp.zeros((2, 5, 3)), "0e + 1o")
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., D=4, C\]"):
        e3j.to_mul_ir(jnp.zeros((4,)), "0e + 1o")
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 12\] for 1x0e\+1x1o x 3 channels, got \(2, 13\)"):
        e3j.from_mul_ir(jnp.zeros((2, 13)), "0e + 1o", 3)
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 12\]"):
        e3j.from_mul_ir(jnp.zeros(()), "0e + 1o", 3)


def test_irrep_blocks_are_the_rows_of_each_block():
    irreps = e3j.Irreps("2x0e + 1o + 0x2e + 3x1e")
    x = jnp.arange(4 * irreps.dim * 3.0).reshape(4, irreps.dim, 3)
    blocks = e3j.irrep_blocks(x, irreps)
    assert len(blocks) == 4
    for (mul, ir), sl, block in zip(irreps, irreps.slices(), blocks):
        assert block.shape == (4, mul, ir.dim, 3)
        np.testing.assert_array_equal(block.reshape(4, -1, 3), x[:, sl, :])
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., D=14, C\]"):
        e3j.irrep_blocks(jnp.ones((4, 15, 3)), irreps)
