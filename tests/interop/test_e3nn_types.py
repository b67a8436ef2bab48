"""e3nn-jax's irreps types are accepted wherever e3j takes irreps (core never imports e3nn-jax).

Oracle: e3nn-jax itself (its ``Irreps`` parsing and ``spherical_harmonics``), in float64.
"""

from __future__ import annotations

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import e3j


@pytest.mark.parametrize("text", ["2x0e + 1o", "1o + 0e + 3x2e", "0x1e + 1y", ""])
def test_irreps_from_e3nn_irreps_equal_the_string(text):
    ours = e3j.Irreps(e3nn.Irreps(text))
    assert ours == e3j.Irreps(text)
    assert str(ours) == str(e3nn.Irreps(text))


def test_irrep_mul_irrep_and_items_from_e3nn():
    assert e3j.Irrep(e3nn.Irrep("2e")) == e3j.Irrep("2e")
    assert e3j.Irrep(e3nn.MulIrrep(3, e3nn.Irrep("1o"))) == e3j.Irrep("1o")
    # e3nn's Irrep and MulIrrep are tuples: they must not be read as iterables of ints
    assert e3j.Irreps(e3nn.Irrep("1o")) == "1o"
    assert e3j.Irreps(e3nn.MulIrrep(2, e3nn.Irrep("1o"))) == "2x1o"
    assert e3j.Irreps([e3nn.Irrep("1o"), e3nn.MulIrrep(2, e3nn.Irrep("0e"))]) == "1o + 2x0e"
    assert e3j.Irreps([(2, (1, -1))]) == "2x1o"  # plain (mul, (l, p)) pairs still work
    # e3nn-jax refuses a MulIrrep as a filter; e3j reads it as its irrep
    assert e3j.TensorProduct("1o", "1o", filter=e3nn.MulIrrep(2, e3nn.Irrep("1e"))).irreps_out == "1e"
    # (mul, e3nn Irrep) pairs: reading the pair as (l, p) must not run e3nn's Irrep.__eq__ on the int
    # parity test (an AssertionError inside e3nn-jax before)
    assert e3j.Irreps([(2, e3nn.Irrep("0e")), (1, e3nn.Irrep("1o"))]) == "2x0e + 1o"
    assert e3j.TensorProduct("1o", "1o", filter=[(2, e3nn.Irrep("0e"))]).irreps_out == "0e"
    with pytest.raises(ValueError, match="parity"):
        e3j.Irrep((1, e3nn.Irrep("0e")))


@pytest.mark.parametrize(
    "filter_",
    [
        e3nn.Irreps("0e + 1o"),
        e3nn.Irreps("3x1e"),
        e3nn.Irrep("2e"),
        [e3nn.Irrep("0e"), e3nn.Irrep("1e")],
        "0e + 1o",
    ],
    ids=str,
)
def test_filter_accepts_e3nn_types_like_e3nn(filter_):
    tp = e3j.TensorProduct(e3nn.Irreps("0e + 1o + 2e"), e3nn.Irreps("0e + 1o"), filter=filter_)
    x = e3nn.IrrepsArray("0e + 1o + 2e", jnp.arange(9.0)[None])
    y = e3nn.IrrepsArray("0e + 1o", jnp.arange(1.0, 5.0)[None])
    ref = e3nn.tensor_product(x, y, filter_ir_out=filter_)
    assert tp.irreps_out == ref.irreps
    np.testing.assert_allclose(tp(x.array[..., None], y.array)[..., 0], ref.array, rtol=1e-12, atol=1e-14)


def test_ops_and_layout_take_e3nn_irreps():
    irreps = e3nn.Irreps("2x0e + 1o")
    assert e3j.Convolution(irreps, e3nn.Irreps("0e + 1o")).irreps_x == "2x0e + 1o"
    assert e3j.Linear(irreps, e3nn.Irreps("1o"), channels_in=2, channels_out=2).irreps_out == "1o"
    x = jnp.arange(5 * 3.0).reshape(1, 5, 3)
    assert e3j.mul_ir_irreps(irreps, 3) == "6x0e + 3x1o"
    np.testing.assert_array_equal(e3j.from_mul_ir(e3j.to_mul_ir(x, irreps), irreps, 3), x)


def test_bad_duck_typed_irrep_names_the_problem():
    class BadIrrep:  # a foreign irrep with an impossible parity
        l, p = 1, 0

    with pytest.raises(ValueError, match="parity p must be 1 or -1"):
        e3j.Irreps([BadIrrep()])
    with pytest.raises(ValueError, match="filter: cannot interpret"):
        e3j.TensorProduct("1o", "1o", filter=BadIrrep())


VECTORS = np.random.default_rng(0).normal(size=(7, 3))


@pytest.mark.parametrize(
    "irreps_out",
    [
        e3nn.Irreps("0e + 1o + 2e + 3o"),
        e3nn.Irreps("1x0e + 2x2e"),
        e3nn.Irreps("1e + 2e"),
        e3nn.Irreps.spherical_harmonics(4),
        "0e + 1o + 2e",
        e3j.Irreps("1o + 3o"),
        [0, 2, 3],
        range(4),
        2,
    ],
    ids=str,
)
@pytest.mark.parametrize("normalization", [None, "component", "norm", "integral"])
@pytest.mark.parametrize("normalize", [True, False])
def test_spherical_harmonics_accepts_what_e3nn_accepts(irreps_out, normalization, normalize):
    v = jnp.asarray(VECTORS)
    # e3nn-jax takes degrees (int or ints) only with an IrrepsArray input, of a 1o vector here
    e3nn_input = e3nn.IrrepsArray("1o", v) if isinstance(irreps_out, (int, list, range)) else v
    if isinstance(irreps_out, e3j.Irreps):
        ref_irreps = str(irreps_out)
    else:
        ref_irreps = irreps_out
    ref = e3nn.spherical_harmonics(ref_irreps, e3nn_input, normalize, normalization).array
    ours = e3j.spherical_harmonics(irreps_out, v, normalize, normalization)
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)
    # the very input e3nn-jax took, an IrrepsArray where it needed one
    ours = e3j.spherical_harmonics(irreps_out, e3nn_input, normalize, normalization)
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("irreps_out, vector", [([1, 2], "1e"), (3, "1e"), ("0e + 1e + 2e", "1e"), ("1o + 2e", "1o")])
def test_spherical_harmonics_takes_an_irreps_array_of_either_parity(irreps_out, vector):
    v = e3nn.IrrepsArray(vector, jnp.asarray(VECTORS))
    ref = e3nn.spherical_harmonics(irreps_out, v, True).array
    np.testing.assert_allclose(e3j.spherical_harmonics(irreps_out, v, True), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("irreps_out", ["", [], e3nn.Irreps("")], ids=repr)
def test_spherical_harmonics_of_no_irreps_is_empty_like_e3nn(irreps_out):
    from e3j import interop

    v = jnp.asarray(VECTORS)
    ref = e3nn.spherical_harmonics(e3nn.Irreps(""), v, True).array
    assert ref.shape == (len(VECTORS), 0)
    assert e3j.spherical_harmonics(irreps_out, v, True).shape == ref.shape
    assert e3j.spherical_harmonics(irreps_out, v, True).dtype == v.dtype
    assert interop.spherical_harmonics(irreps_out, e3nn.IrrepsArray("1o", v), True).array.shape == ref.shape
    if not isinstance(irreps_out, list):  # irreps, not degrees: a plain vector array is taken too
        # e3nn-jax's empty Irreps, a tuple of no MulIrrep, was read as an empty list of degrees
        assert interop.spherical_harmonics(irreps_out, v, True).array.shape == ref.shape
    grad = jax.grad(lambda a: e3j.spherical_harmonics(irreps_out, a, True).sum())(v)
    np.testing.assert_array_equal(grad, np.zeros_like(VECTORS))


def test_spherical_harmonics_bad_irreps_named():
    with pytest.raises(ValueError, match="incompatible parities"):
        e3j.spherical_harmonics("1o", e3nn.IrrepsArray("1e", jnp.ones(3)), True)
    with pytest.raises(ValueError, match=r"input must be a single vector \(1x1o or 1x1e\), got 2x1o"):
        e3j.spherical_harmonics(2, e3nn.IrrepsArray("2x1o", jnp.ones(6)), True)
    with pytest.raises(ValueError, match="odd degrees of both parities"):
        e3j.spherical_harmonics(e3nn.Irreps("1o + 1e"), jnp.ones(3), True)
    with pytest.raises(ValueError, match="expected an int, a list of ints or Irreps"):
        e3j.spherical_harmonics(["0e", "bad"], jnp.ones(3), True)
    from e3j import interop

    with pytest.raises(TypeError, match=r"normalize must be a bool \(or 0 / 1\), got 'no'"):
        interop.spherical_harmonics("1o", jnp.ones(3), "no")
    ref = e3nn.spherical_harmonics("1o", jnp.ones(3), True).array
    np.testing.assert_allclose(interop.spherical_harmonics("1o", jnp.ones(3), jnp.array(True)).array, ref, rtol=1e-6)


@pytest.mark.parametrize(
    "irreps_out, expected",
    [
        (np.int64(2), "1x2e"),
        ([np.int64(1), 2], "1x1e+1x2e"),
        ((1, 3), "1x1e+1x3e"),  # degrees, as e3nn-jax reads a tuple of ints, not the irrep 1e
        (range(2), "1x0e+1x1e"),
        ("1e + 2e", "1x1e+1x2e"),
        (e3nn.Irrep("1e"), "1x1e"),
        ([e3nn.Irrep("1e"), "2e"], "1x1e+1x2e"),
    ],
    ids=repr,
)
def test_spherical_harmonics_read_degrees_and_irreps_by_one_rule(irreps_out, expected):
    from e3j import interop
    from e3j_core.spherical_harmonics import spherical_harmonic_polynomials

    v = e3nn.IrrepsArray("1e", jnp.asarray(VECTORS))
    ref = e3nn.spherical_harmonics(e3nn.Irreps(expected), v, True).array
    # the core polynomials, the function form with an IrrepsArray and the drop-in all read it alike
    assert spherical_harmonic_polynomials(irreps_out).ls == tuple(ir.l for _, ir in e3nn.Irreps(expected))
    np.testing.assert_allclose(e3j.spherical_harmonics(irreps_out, v, True), ref, rtol=1e-12, atol=1e-12)
    ours = interop.spherical_harmonics(irreps_out, v, True)
    assert ours.irreps == e3nn.Irreps(expected)
    np.testing.assert_allclose(ours.array, ref, rtol=1e-12, atol=1e-12)


def test_spherical_harmonics_bad_degrees_named():
    from e3j import interop

    v = e3nn.IrrepsArray("1o", jnp.ones(3))
    for f in (e3j.spherical_harmonics, lambda ls, x, n: interop.spherical_harmonics(ls, x, n)):
        with pytest.raises(ValueError, match="each l must be an int >= 0, got -1"):
            f((1, -1), v, True)
        with pytest.raises(ValueError, match=r"each l must be an int >= 0, got 1\.5"):
            f([0, 1.5], v, True)
        # NumPy arrays of degrees: one message whatever the input's type (an IrrepsArray's parity
        # check read them as irreps first: "iteration over a 0-d array")
        for bad in (np.array(2), np.arange(3)):
            for x in (v, v.array):
                with pytest.raises(
                    ValueError, match=r"irreps_out: expected an int, a list of ints or Irreps, got array"
                ):
                    f(bad, x, True)


@pytest.mark.parametrize(
    "irreps_out, vector",
    [
        (3, "1o"),
        ([0, 1, 2], "1o"),
        ([1, 2], "1e"),
        (range(3), "1e"),
        ("0e + 1o + 2e", "1o"),
        (e3nn.Irreps("1e + 2e"), "1e"),
    ],
    ids=str,
)
@pytest.mark.parametrize("normalization", [None, "norm"])
def test_interop_spherical_harmonics_equals_e3nn(irreps_out, vector, normalization):
    from e3j import interop

    v = e3nn.IrrepsArray(vector, jnp.asarray(VECTORS))
    ref = e3nn.spherical_harmonics(irreps_out, v, True, normalization)
    ours = interop.spherical_harmonics(irreps_out, v, True, normalization)
    assert ours.irreps == ref.irreps
    np.testing.assert_allclose(ours.array, ref.array, rtol=1e-12, atol=1e-12)
    plain = interop.spherical_harmonics(str(ref.irreps), jnp.asarray(VECTORS), False)
    np.testing.assert_allclose(
        plain.array, e3nn.spherical_harmonics(ref.irreps, jnp.asarray(VECTORS), False).array, rtol=1e-12, atol=1e-12
    )


def test_interop_spherical_harmonics_bad_input():
    from e3j import interop

    with pytest.raises(ValueError, match="incompatible parities"):
        interop.spherical_harmonics("1o", e3nn.IrrepsArray("1e", jnp.ones(3)), True)
    with pytest.raises(ValueError, match="needs input as an IrrepsArray"):
        interop.spherical_harmonics(2, jnp.ones(3), True)
    with pytest.raises(ValueError, match="single vector"):
        interop.spherical_harmonics(2, e3nn.IrrepsArray("2x1o", jnp.ones(6)), True)


def test_inputs_doc_examples_run():
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "inputs.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert blocks, "docs/inputs.md has no python example"
    for block in blocks:
        exec(compile(block, "docs/inputs.md", "exec"), {})


@pytest.mark.parametrize("algorithm", [("recursive", "sparse", "custom_jvp"), ("legendre", "dense")])
def test_interop_spherical_harmonics_takes_e3nn_algorithm(algorithm):
    from e3j import interop

    v = e3nn.IrrepsArray("1o", jax.random.normal(jax.random.key(3), (5, 3), jnp.float64))
    want = e3nn.spherical_harmonics([0, 1, 2, 3], v, True, algorithm=algorithm)
    got = interop.spherical_harmonics([0, 1, 2, 3], v, True, algorithm=algorithm)
    assert got.irreps == want.irreps
    np.testing.assert_allclose(got.array, want.array, rtol=1e-13, atol=1e-14)
    with pytest.raises(TypeError, match="algorithm must be None or a tuple of"):
        interop.spherical_harmonics(1, v, True, algorithm="fast")
    with pytest.raises(ValueError, match="algorithm must be None or a tuple of"):
        interop.spherical_harmonics(1, v, True, algorithm=("fast",))


def test_spherical_harmonics_take_integer_vectors_and_algorithm_as_e3nn():
    from e3j import interop

    ints = jnp.array([[1, 2, 3], [0, -4, 1], [0, 0, 0]], jnp.int32)
    want = e3nn.spherical_harmonics([0, 1, 2, 3], e3nn.IrrepsArray("1o", ints), True, algorithm=("legendre",))
    assert want.dtype == jnp.result_type(float)  # e3nn-jax's arithmetic promotes to the default float
    got = e3j.spherical_harmonics("0e + 1o + 2e + 3o", ints, True, algorithm=("legendre",))
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want.array, rtol=1e-13, atol=1e-14)
    got = interop.spherical_harmonics([0, 1, 2, 3], e3nn.IrrepsArray("1o", ints), True)
    assert got.irreps == want.irreps and got.dtype == want.dtype
    np.testing.assert_allclose(got.array, want.array, rtol=1e-13, atol=1e-14)
    # not a cast of the result: the integers promoted first, as a float input gives
    np.testing.assert_array_equal(
        e3j.spherical_harmonics(2, ints, False), e3j.spherical_harmonics(2, ints * 1.0, False)
    )


def test_message_passing_drop_ins_promote_integer_operands_as_e3nn():
    from e3nn_jax.legacy import FunctionalTensorProduct

    from e3j import interop

    rng = np.random.default_rng(5)
    n, e = 4, 9
    senders, receivers = rng.integers(0, n, e), rng.integers(0, n, e)
    x_int = e3nn.IrrepsArray("2x0e + 1o", jnp.asarray(rng.integers(-3, 4, (n, 5)), jnp.int32))
    y = e3nn.spherical_harmonics("0e + 1o", jnp.asarray(rng.normal(size=(e, 3)), jnp.float32), True)
    mp = interop.MessagePassing(x_int.irreps, y.irreps, "0e + 1o")
    w_int = jnp.asarray(rng.integers(-2, 3, (e, mp.num_weights)), jnp.int32)

    def e3nn_pattern(x, w):
        m = e3nn.tensor_product(x[senders], y, filter_ir_out="0e + 1o") * w
        return e3nn.scatter_sum(m, dst=receivers, output_size=n)

    for x, w in ((x_int, w_int.astype(jnp.float32)), (x_int.astype(jnp.float32), w_int), (x_int, w_int)):
        want = e3nn_pattern(x, w)
        got = mp(x, y, w, senders, receivers)
        assert got.irreps == want.irreps and got.dtype == want.dtype == jnp.float32
        np.testing.assert_allclose(got.array, want.array, rtol=1e-5, atol=1e-5)

    tp = FunctionalTensorProduct("2x0e", "0e", "2x0e", [(0, 0, 0, "uvu", True)])
    fmp = interop.FunctionalMessagePassing(tp)
    x2 = e3nn.IrrepsArray("2x0e", jnp.asarray(rng.normal(size=(n, 2)), jnp.float32))
    y0 = jnp.ones((e, 1), jnp.float32)
    w2 = jnp.asarray(rng.integers(-2, 3, (e, 2)), jnp.int32)
    want = fmp(x2, y0, w2.astype(jnp.float32), senders, receivers)
    got = fmp(x2, y0, w2, senders, receivers)
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(got.array, want.array)


def test_drop_in_result_dtypes_follow_e3nn_arithmetic():
    """e3nn-jax promotes in two steps, the tensor product (its inputs' weak types dropped: a weakly
    typed float64 array is float64 there, integers give the default float) then the product with
    the weights (per-copy weights drop a weak type, a scalar or ``[E, 1]`` keeps it). The drop-ins
    promoted the three at once: integer features with float16 weights gave float16, and weak
    float64 arrays float32 (x64, this suite's setting)."""
    from e3j import interop

    rng = np.random.default_rng(8)
    n, e = 3, 5
    senders, receivers = rng.integers(0, n, e), rng.integers(0, n, e)
    data = rng.integers(-2, 3, (n, 5)).astype(np.float32)
    features = {
        "int32": jnp.asarray(data, jnp.int32),
        "float16": jnp.asarray(data, jnp.float16),
        "float32": jnp.asarray(data, jnp.float32),
        "weak float64": jnp.full((n, 5), 1.5),
    }
    y = e3nn.IrrepsArray("0e + 1o", jnp.asarray(rng.normal(size=(e, 4)), jnp.float32))
    mp = interop.MessagePassing("2x0e + 1o", y.irreps, "0e + 1o")
    w = mp.num_weights
    weights = {
        "number": 2.0,
        "weak [E, 1]": jnp.full((e, 1), 0.5),
        "weak [E, W]": jnp.full((e, w), 0.5),
        "weak [W]": jnp.full((w,), 0.5),
        "float16 [E, W]": jnp.full((e, w), 0.5, jnp.float16),
        "float32 [W]": jnp.full((w,), 0.5, jnp.float32),
    }
    assert features["weak float64"].weak_type and jnp.result_type(features["weak float64"]) == jnp.float64
    for fname, array in features.items():
        x = e3nn.IrrepsArray("2x0e + 1o", array)
        assert interop.tensor_product(x[senders], y).dtype == e3nn.tensor_product(x[senders], y).dtype, fname
        for wname, weight in weights.items():
            m = e3nn.tensor_product(x[senders], y, filter_ir_out="0e + 1o") * weight
            want = e3nn.scatter_sum(m, dst=receivers, output_size=n)
            got = mp(x, y, weight, senders, receivers)
            assert got.dtype == want.dtype, (fname, wname, got.dtype, want.dtype)
            tol = 1e-2 if want.dtype == jnp.float16 else 1e-5
            np.testing.assert_allclose(got.array, want.array, rtol=tol, atol=tol, err_msg=f"{fname}, {wname}")
    # one copy: e3nn reads [E, 1], [1] and [1, 1] per copy (its elementwise product drops a weak type)
    one = interop.MessagePassing("1o", y.irreps, "1o")
    assert one.num_weights == 1
    x1 = e3nn.IrrepsArray("1o", jnp.asarray(data[:, :3], jnp.float32))
    for weight in (jnp.full((e, 1), 0.5), jnp.full((1,), 0.5), jnp.full((1, 1), 0.5), 0.5):
        m = e3nn.tensor_product(x1[senders], y, filter_ir_out="1o") * weight
        want = e3nn.scatter_sum(m, dst=receivers, output_size=n)
        assert one(x1, y, weight, senders, receivers).dtype == want.dtype, jnp.shape(weight)


def test_functional_drop_in_result_dtypes_follow_e3nn_legacy_arithmetic():
    """e3nn's legacy FunctionalTensorProduct promotes weights, x and y at once (its left_right):
    int32 features and edge attributes with float32 weights stay float32 under x64, and all-int32
    operands compute in float32 (it maps an integer dtype to float32; the drop-in gave float64)."""
    from e3nn_jax.legacy import FunctionalTensorProduct

    from e3j import interop

    rng = np.random.default_rng(9)
    n, e = 3, 5
    senders, receivers = rng.integers(0, n, e), rng.integers(0, n, e)
    instructions = [(0, 0, 0, "uvu", True), (1, 1, 0, "uvu", True), (0, 1, 1, "uvu", True)]
    tp = FunctionalTensorProduct("2x0e + 2x1o", "0e + 1o", "2x0e + 2x1o", instructions)
    fmp = interop.FunctionalMessagePassing(tp)
    data = rng.integers(-2, 3, (n, 8))
    features = {"int32": jnp.asarray(data, jnp.int32), "float32": jnp.asarray(data, jnp.float32),
                "weak float64": jnp.full((n, 8), 1.5)}  # fmt: skip
    edges = {"int32": jnp.asarray(rng.integers(-1, 2, (e, 4)), jnp.int32),
             "float16": jnp.asarray(rng.normal(size=(e, 4)), jnp.float16)}  # fmt: skip
    weights = {"float16": jnp.full((e, fmp.num_weights), 0.5, jnp.float16),
               "float32": jnp.full((e, fmp.num_weights), 0.5, jnp.float32),
               "weak float64": jnp.full((e, fmp.num_weights), 0.5),
               "int32": jnp.full((e, fmp.num_weights), 2, jnp.int32)}  # fmt: skip
    compared = 0
    for fname, f in features.items():
        for yname, a in edges.items():
            for wname, w in weights.items():
                x, y = e3nn.IrrepsArray("2x0e + 2x1o", f), e3nn.IrrepsArray("0e + 1o", a)
                try:
                    want = jax.vmap(tp.left_right)(w, x[senders], y)
                except TypeError:  # e3nn-jax's einsum refuses float16 with two integer operands
                    assert (fname, yname, wname) in {("int32", "int32", "float16"), ("int32", "float16", "int32")}
                    continue
                if (fname, yname, wname) == ("int32", "int32", "int32"):
                    assert want.dtype == jnp.float32
                want = e3nn.scatter_sum(want, dst=receivers, output_size=n)
                got = fmp(x, y, w, senders, receivers)
                assert got.dtype == want.dtype, (fname, yname, wname, got.dtype, want.dtype)
                compared += 1
    assert compared == 22


def test_message_passing_keeps_float32_with_weakly_typed_weights():
    """Under x64 (this suite's setting), a Python number as the weights (or an array made from one)
    is weakly typed: e3nn's ``m * 2.0`` stays float32, as ``jnp.result_type`` says. The drop-ins
    built its broadcast form in float64 and computed in float64."""
    from e3j import flax as e3j_flax
    from e3j import interop

    rng = np.random.default_rng(6)
    n, e = 3, 5
    senders, receivers = rng.integers(0, n, e), rng.integers(0, n, e)
    x = e3nn.IrrepsArray("4x0e + 2x1o", jnp.asarray(rng.normal(size=(n, 10)), jnp.float32))
    y = e3nn.IrrepsArray("0e + 1o", jnp.asarray(rng.normal(size=(e, 4)), jnp.float32))
    mp = interop.MessagePassing(x.irreps, y.irreps, "0e + 1o")

    def e3nn_pattern(w):
        m = e3nn.tensor_product(x[senders], y, filter_ir_out="0e + 1o") * w
        return e3nn.scatter_sum(m, dst=receivers, output_size=n)

    for w in (2.0, jnp.asarray(0.5), jnp.full((e, 1), 0.5)):
        assert jnp.result_type(jnp.float32, w) == jnp.float32
        got = mp(x, y, w, senders, receivers)
        assert got.dtype == jnp.float32, type(w)
        np.testing.assert_allclose(got.array, e3nn_pattern(w).array, rtol=1e-5, atol=1e-6)
    out, _ = e3j_flax.MessagePassing(filter_ir_out="0e + 1o").init_with_output(
        jax.random.key(0), x, y, 2.0, senders, receivers
    )
    assert out.dtype == jnp.float32
    # a strongly typed float64 weight still promotes, as in e3nn-jax
    assert mp(x, y, jnp.asarray(2.0, jnp.float64), senders, receivers).dtype == jnp.float64
