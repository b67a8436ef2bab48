"""e3j_models.MaceJaxSymmetricContraction against mace-jax's formula, written here with e3nn-jax's
bases (mace-jax itself is not a test dependency: its contraction, term by term, is the oracle)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import e3j
from e3j_models import MaceJaxSymmetricContraction

e3nn = pytest.importorskip("e3nn_jax")

CASES = [
    # irreps_in, correlation, keep_irrep_out, gradient normalization
    ("0e + 1o + 2e + 3o", 3, "0e + 1o", "path"),
    ("0e + 1o", 2, {e3nn.Irrep("0e"), e3nn.Irrep("1o")}, "element"),
    ("0e + 1o + 2e", 3, "0e + 1o + 2e", 0.5),
    ("1o", 4, "0e + 1o", None),  # no 0e in: even and odd powers reach different irreps
]


def _mace_jax(irreps_in, correlation, keep, gn, params, x, index):
    """mace-jax's symmetric contraction: Σ_ν Σ_k w[s, k, c] mul^(-gn/2) U_ν[j1..jν, k, :] x_j1 .. x_jν,
    each term contracted in full (not mace-jax's nested evaluation), outputs sorted by irrep."""
    gn = {"element": 0.0, "path": 1.0}.get(gn, gn) if gn is not None else 1.0  # e3nn-jax's default: path
    keep = {e3nn.Irrep(ir) for ir in (keep.split("+") if isinstance(keep, str) else keep)}
    out = {}
    for order in range(1, correlation + 1):
        U = e3nn.reduced_symmetric_tensor_product_basis(e3nn.Irreps(irreps_in), order, keep_ir=keep)
        for (mul, ir), u in zip(U.irreps, U.chunks):
            w = params[f"w{order}_{ir}"][index] * (mul**-0.5) ** gn  # [N, mul, C]
            t = jnp.einsum("j...,ncj->nc...", u, x)
            for _ in range(order - 1):
                t = jnp.einsum("ncj...,ncj->nc...", t, x)
            term = jnp.einsum("nckd,nkc->ncd", t, w)
            out[ir] = out.get(ir, 0) + term
    irreps = sorted(out)
    return e3nn.IrrepsArray("+".join(str(ir) for ir in irreps), jnp.concatenate([out[ir] for ir in irreps], -1))


def _operands(irreps_in, sc, n=6, seed=0):
    keys = jax.random.split(jax.random.key(seed), len(sc.parameter_shapes) + 1)
    params = {
        name: jax.random.normal(k, shape, jnp.float64)
        for k, (name, shape) in zip(keys[1:], sorted(sc.parameter_shapes.items()))
    }
    x = jax.random.normal(keys[0], (n, sc.channels, e3nn.Irreps(irreps_in).dim), jnp.float64)
    index = jnp.arange(n) % sc.num_species
    return params, x, index


@pytest.mark.parametrize("irreps_in, correlation, keep, gn", CASES)
def test_equals_mace_jax_with_its_parameters(irreps_in, correlation, keep, gn):
    sc = MaceJaxSymmetricContraction(irreps_in, correlation, keep, num_species=3, channels=4, gradient_normalization=gn)
    params, x, index = _operands(irreps_in, sc)
    want = _mace_jax(irreps_in, correlation, keep, gn, params, x, index)
    # mace-jax's parameter names and shapes: one per basis (order, irrep), [species, mul, channels]
    assert {k: v.shape for k, v in params.items()} == {
        f"w{o}_{ir}": (3, mul, 4)
        for o in range(1, correlation + 1)
        for mul, ir in e3nn.reduced_symmetric_tensor_product_basis(
            e3nn.Irreps(irreps_in),
            o,
            keep_ir={e3nn.Irrep(i) for i in (keep.split("+") if isinstance(keep, str) else keep)},
        ).irreps
        if mul
    }
    got = sc(params, e3nn.IrrepsArray(irreps_in, x), index)
    assert got.irreps == want.irreps
    np.testing.assert_allclose(got.array, want.array, rtol=1e-12, atol=1e-12 * float(jnp.abs(want.array).max()))
    plain = sc(params, x, index)  # an array in, an array out
    np.testing.assert_array_equal(plain, got.array)


def test_gradients_equal_mace_jax():
    irreps_in, correlation, keep, _ = CASES[0]
    sc = MaceJaxSymmetricContraction(irreps_in, correlation, keep, 2, 3)  # e3nn-jax's default: path
    params, x, index = _operands(irreps_in, sc, n=4, seed=1)
    r = jax.random.normal(jax.random.key(9), (4, 3, 4), jnp.float64)
    got = jax.grad(lambda p, x: jnp.sum(r * sc(p, x, index) ** 2), argnums=(0, 1))(params, x)
    want = jax.grad(
        lambda p, x: jnp.sum(r * _mace_jax(irreps_in, correlation, keep, None, p, x, index).array ** 2), argnums=(0, 1)
    )(params, x)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10 * float(jnp.abs(w).max()))


def test_float32_within_rounding_and_leading_axes():
    irreps_in, correlation, keep, gn = CASES[0]
    sc = MaceJaxSymmetricContraction(irreps_in, correlation, keep, 3, 4)
    params, x, index = _operands(irreps_in, sc, n=6)
    want = _mace_jax(irreps_in, correlation, keep, gn, params, x, index).array
    p32 = {k: v.astype(jnp.float32) for k, v in params.items()}
    got = sc(p32, x.astype(jnp.float32).reshape(2, 3, 4, -1), index.reshape(2, 3))
    assert got.dtype == jnp.float32 and got.shape == (2, 3, 4, want.shape[-1])
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=2e-5, atol=2e-5 * float(jnp.abs(want).max()))


def test_init_stddev_is_mace_jax_s():
    sc = MaceJaxSymmetricContraction("0e + 1o + 2e", 3, "0e + 1o", 2, 4, gradient_normalization="element")
    mul = sc.parameter_shapes["w3_0e"][1]
    assert mul > 1 and sc.init_stddev("w3_0e") == pytest.approx(mul**-0.5)
    path = MaceJaxSymmetricContraction("0e + 1o + 2e", 3, "0e + 1o", 2, 4, gradient_normalization="path")
    assert path.init_stddev("w3_0e") == 1.0


def test_keep_irrep_out_in_every_form_mace_jax_takes():
    """A string of irreps each of multiplicity 1 (written with or without ``1x``), or a set of
    e3nn-jax irreps as mace-jax's modules pass it: the same contraction."""
    forms = ["0e + 1o", "1x0e + 1x1o", "1x1o+0e", {e3nn.Irrep("0e"), e3nn.Irrep("1o")}, e3nn.Irreps("0e + 1o")]
    kept = {MaceJaxSymmetricContraction("0e + 1o", 2, k, 2, 4).keep_irrep_out for k in forms}
    assert kept == {(e3j.Irrep("0e"), e3j.Irrep("1o"))}, kept


def test_bad_input_is_named():
    sc = MaceJaxSymmetricContraction("0e + 1o", 2, "0e + 1o", 2, 4)
    params, x, index = _operands("0e + 1o", sc, n=2)
    with pytest.raises(ValueError, match=r"params must hold exactly \['w1_0e'"):
        sc({k: v for k, v in params.items() if k != "w2_0e"}, x, index)
    with pytest.raises(ValueError, match=r"params\['w1_0e'\] must have shape \(2, 1, 4\)"):
        sc({**params, "w1_0e": params["w1_0e"][:1]}, x, index)
    with pytest.raises(ValueError, match=r"x must be \[..., C=4, D=4\]"):
        sc(params, x[..., :3], index)
    with pytest.raises(ValueError, match="x has irreps 1x0e\\+1x1e, expected"):
        sc(params, e3nn.IrrepsArray("0e + 1e", x), index)
    with pytest.raises(ValueError, match="gradient_normalization must be"):
        MaceJaxSymmetricContraction("0e + 1o", 2, "0e", 2, 4, gradient_normalization="none")
    for bad in ("0e + cat", "2x0e", ["0e", "2x1o"]):
        with pytest.raises(ValueError, match="keep_irrep_out must be irreps of multiplicity 1"):
            MaceJaxSymmetricContraction("0e + 1o", 2, bad, 2, 4)
    with pytest.raises(ValueError, match="no irrep of keep_irrep_out"):
        MaceJaxSymmetricContraction("1o", 1, "0e", 2, 4)
