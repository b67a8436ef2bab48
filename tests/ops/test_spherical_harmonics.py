"""``e3j.spherical_harmonics`` (the JAX evaluator) against e3nn-jax.

float64 values and Jacobians must match e3nn to 1e-12 relative (per degree, relative to the largest
|Y_l| of the sample) for l <= 11, every normalization, normalize True/False. float32 accuracy is
measured against the float64 e3nn reference on the same (float32-rounded) inputs.
"""

import functools

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import e3j

LMAX = 11
NORMALIZATIONS = ("component", "norm", "integral")


def block(l):
    return slice(l * l, (l + 1) ** 2)


def vectors(n=2000, seed=0, unit=False):
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(n, 3))
    v /= np.linalg.norm(v, axis=-1, keepdims=True)
    if not unit:
        v *= rng.uniform(0.5, 2.0, size=(n, 1))
    # the axes and a near-axis direction, where monomial cancellation would be worst
    eye = np.eye(3)
    return np.concatenate([v, eye, -eye, [[1e-3, 1.0, -2e-3]]])


@functools.cache
def e3nn_reference(normalization, normalize, seed=0):
    """All degrees 0..11 at once (e3nn called once), float64."""
    v = vectors(seed=seed)
    irreps = e3nn.Irreps.spherical_harmonics(LMAX)
    return v, np.asarray(e3nn.spherical_harmonics(irreps, jnp.asarray(v), normalize, normalization).array)


def rel_errors(out, ref):
    """Per degree: max |out - ref| / max |ref| over the sample."""
    return [
        float(np.max(np.abs(out[:, block(l)] - ref[:, block(l)])) / np.max(np.abs(ref[:, block(l)])))
        for l in range(LMAX + 1)
    ]


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_values_match_e3nn_float64(normalization, normalize):
    v, ref = e3nn_reference(normalization, normalize)
    out = np.asarray(e3j.spherical_harmonics(list(range(LMAX + 1)), jnp.asarray(v), normalize, normalization))
    assert out.dtype == np.float64 and out.shape == ref.shape == (len(v), (LMAX + 1) ** 2)
    errs = rel_errors(out, ref)
    assert max(errs) <= 1e-12, errs
    # single degrees (int and irreps forms) are the same blocks: each normalization's tables once (the
    # flag normalize does not choose them; every program here is compiled anew, ~6 s at l = 11). Equal
    # to rounding, not bitwise: XLA fuses each program, and rounds its sums, in its own way
    if normalize:
        for l in (0, 1, 4, LMAX):
            single = np.asarray(e3j.spherical_harmonics(l, jnp.asarray(v), normalize, normalization))
            np.testing.assert_allclose(single, out[:, block(l)], rtol=0, atol=1e-15 * np.abs(single).max())
        irreps = e3j.Irreps.spherical_harmonics(3)
        np.testing.assert_allclose(
            np.asarray(e3j.spherical_harmonics(irreps, jnp.asarray(v), normalize, normalization)),
            out[:, :16],
            rtol=0,
            atol=1e-15,
        )


def test_irreps_forms_match_e3nn():
    """Irreps with multiplicities, any order, pseudovector parity: the matching e3nn blocks."""
    v, ref = e3nn_reference("component", True)
    for irreps in ("2x1o + 0e + 3o", "1e + 2e + 3e", "0e", "2e + 2e"):
        out = np.asarray(e3j.spherical_harmonics(irreps, jnp.asarray(v), True))
        expected = np.concatenate([ref[:, block(ir.l)] for mul, ir in e3j.Irreps(irreps) for _ in range(mul)], axis=-1)
        assert out.shape == expected.shape, irreps
        np.testing.assert_allclose(out, expected, rtol=0, atol=1e-13, err_msg=irreps)
    # default normalization is "component"
    np.testing.assert_array_equal(
        e3j.spherical_harmonics([2, 3], jnp.asarray(v), False),
        e3j.spherical_harmonics([2, 3], jnp.asarray(v), False, "component"),
    )


def test_float32_error_per_degree():
    """float32 evaluation vs the float64 e3nn reference on the same float32 inputs."""
    v = vectors(unit=True).astype(np.float32)  # e3nn compiled for this shape already
    v64 = v.astype(np.float64)
    worst = [0.0] * (LMAX + 1)
    # each normalization with the vectors normalized (the edge vectors' case), and "component" also
    # without: the normalizations differ only by one constant per row (an lmax-11 program compiles
    # in ~6 s on a 2-core CPU)
    for normalization, normalize in [(n, True) for n in NORMALIZATIONS] + [("component", False)]:
        ref = np.asarray(
            e3nn.spherical_harmonics(
                e3nn.Irreps.spherical_harmonics(LMAX), jnp.asarray(v64), normalize, normalization
            ).array
        )
        out = e3j.spherical_harmonics(list(range(LMAX + 1)), jnp.asarray(v), normalize, normalization)
        assert out.dtype == jnp.float32
        errs = rel_errors(np.asarray(out, np.float64), ref)
        worst = [max(a, b) for a, b in zip(worst, errs)]
    print("float32 relative error per l:", " ".join(f"l={l}:{e:.1e}" for l, e in enumerate(worst)))
    assert max(worst[:5]) <= 1e-6, worst  # l <= 4
    assert max(worst) <= 5e-6, worst  # up to l = 11: errors grow ~linearly in l, no catastrophic cancellation


def pointwise_jacobian(f, v):
    """``[n, D, 3]``: ``d f(v)[k] / d v[k]`` of a row-wise ``f``, by forward mode (one ``jvp`` per axis)."""
    cols = [jax.jvp(f, (v,), (jnp.zeros_like(v).at[:, i].set(1.0),))[1] for i in range(3)]
    return jnp.stack(cols, axis=-1)


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_degrees_up_to_one_are_the_recurrences_rows(dtype, normalization):
    """Degrees 0 and 1 alone are built as whole blocks (the constant, the vector times a factor):
    the same numbers as the recurrence's rows of the same degrees in a call that reaches degree 2,
    bit for bit without normalizing (each row one product), and their derivatives."""
    v = jnp.asarray(vectors(n=300, seed=4), dtype)
    for irreps in ("0e + 1o", "1o", "0e", "1o + 0e + 1o"):
        ls = [int(t[0]) for t in irreps.split(" + ")]
        rows = np.concatenate([np.arange(l * l, (l + 1) ** 2) for l in ls])

        def low(v, irreps=irreps):
            return e3j.spherical_harmonics(irreps, v, False, normalization)

        def via_recurrence(v, rows=rows):
            return e3j.spherical_harmonics([0, 1, 2], v, False, normalization)[:, rows]

        np.testing.assert_array_equal(jax.jit(low)(v), jax.jit(via_recurrence)(v))
        grads = [jax.grad(lambda v, f=f: jnp.sum(jnp.sin(f(v))))(v) for f in (low, via_recurrence)]
        np.testing.assert_allclose(*grads, rtol=1e-6 if dtype == jnp.float32 else 1e-15)
        unit = v / jnp.linalg.norm(v, axis=-1, keepdims=True)
        np.testing.assert_array_equal(jax.jit(low)(unit), jax.jit(via_recurrence)(unit))


@pytest.mark.parametrize("normalize", [True, False])
def test_jacobian_matches_e3nn(normalize):
    """e3nn's Jacobian (expensive to compile at l = 11) is taken once, in "component" normalization;
    the other normalizations scale each degree by a constant, read off e3nn's values."""
    v_np, comp = e3nn_reference("component", normalize)
    v = jnp.asarray(v_np)
    ls = list(range(LMAX + 1))
    irreps = e3nn.Irreps.spherical_harmonics(LMAX)
    ref_comp = pointwise_jacobian(lambda x: e3nn.spherical_harmonics(irreps, x, normalize).array, v)
    assert ref_comp.shape == (len(v), (LMAX + 1) ** 2, 3)
    for normalization in NORMALIZATIONS:
        vals = e3nn_reference(normalization, normalize)[1]

        def f(x, normalization=normalization):
            return e3j.spherical_harmonics(ls, x, normalize, normalization)

        jac = jax.vmap(jax.jacfwd(f))(v)
        assert jac.shape == ref_comp.shape
        for l in range(1, LMAX + 1):
            a, b = vals[:, block(l)], comp[:, block(l)]
            factor = float(np.sum(a * b) / np.sum(b * b))
            np.testing.assert_allclose(a, factor * b, rtol=1e-13, atol=1e-13)  # a constant ratio
            ref = factor * ref_comp[:, block(l)]
            scale = float(jnp.max(jnp.abs(ref)))
            assert float(jnp.max(jnp.abs(jac[:, block(l)] - ref))) <= 1e-12 * scale, (normalization, l)
        # reverse mode agrees with forward mode
        w = jnp.linspace(-1, 1, (LMAX + 1) ** 2)
        grad = jax.vmap(jax.grad(lambda x, f=f, w=w: f(x) @ w))(v)
        bound = 1e-13 * jnp.einsum("nij,i->nj", jnp.abs(jac), jnp.abs(w))  # the sum's rounding scale
        assert bool(jnp.all(jnp.abs(grad - jnp.einsum("nij,i->nj", jac, w)) <= bound))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_normalize_at_zero_and_tiny_or_huge_vectors(dtype):
    ls = [0, 1, 2, 3]
    w = jnp.linspace(0.5, 2.0, 16, dtype=dtype)

    @jax.jit
    def f(x):
        return e3j.spherical_harmonics(ls, x, True)

    jac_f = jax.jit(jax.jacfwd(f))
    grad_f = jax.jit(jax.grad(lambda x: f(x) @ w))

    zero = jnp.zeros(3, dtype)
    y0 = f(zero)
    np.testing.assert_array_equal(y0, np.r_[1.0, np.zeros(15)])  # Y_0 and zeros, as in e3nn
    # derivatives at the zero vector: e3nn-jax's (those of the polynomials at the origin), finite
    e3nn_f = functools.partial(e3nn.spherical_harmonics, e3nn.Irreps.spherical_harmonics(3), normalize=True)
    jac_ref = jax.jacfwd(lambda x: e3nn_f(x).array)(zero)
    hess_ref = jax.hessian(lambda x: e3nn_f(x).array @ w)(zero)
    assert float(jnp.max(jnp.abs(jac_ref))) > 1  # sqrt(3) on the l = 1 rows: a test that can fail
    tol = 1e-6 if dtype == jnp.float32 else 1e-13
    for jac in (jac_f(zero), jax.jacrev(f)(zero)):
        np.testing.assert_allclose(jac, jac_ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(grad_f(zero), w @ jac_ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(jax.hessian(lambda x: f(x) @ w)(zero), hess_ref, rtol=tol, atol=tol)

    u = np.array([0.3, -0.5, 0.8])
    u /= np.linalg.norm(u)
    y_ref = np.asarray(e3j.spherical_harmonics(ls, jnp.asarray(u), True))  # float64
    jac_ref = np.asarray(jax.jacfwd(lambda x: e3j.spherical_harmonics(ls, x, True))(jnp.asarray(u)))
    tol = 1e-6 if dtype == jnp.float32 else 1e-13
    # the direction of a vector of any normal size: no underflow/overflow of |x|^2
    for scale in (1e-30, 1e-20, 1e20, 1e30) + ((1e-160, 1e-300, 1e160, 1e300) if dtype == jnp.float64 else ()):
        x = jnp.asarray(u * scale, dtype)
        np.testing.assert_allclose(f(x), y_ref, rtol=0, atol=tol * 3, err_msg=f"scale {scale}")
        # J(s·u) = J(u) / s
        jac = jac_f(x)
        g = grad_f(x)
        assert bool(jnp.all(jnp.isfinite(jac))) and bool(jnp.all(jnp.isfinite(g))), scale
        np.testing.assert_allclose(
            np.asarray(jac, np.float64) * scale, jac_ref, rtol=0, atol=tol * 10, err_msg=f"scale {scale}"
        )
        np.testing.assert_allclose(
            np.asarray(g, np.float64) * scale, jac_ref.T @ np.asarray(w, np.float64), rtol=0, atol=tol * 30
        )
    # up to the largest finite numbers (a division by the largest component flushed its subnormal
    # reciprocal to zero on the CPU and gave NaN); the derivatives ~1/scale are subnormal there
    for scale in (1e38, 4e38) if dtype == jnp.float32 else (1e307, 1.7e308):
        x = jnp.asarray(u * scale, dtype)
        assert bool(jnp.all(jnp.isfinite(x))), scale
        np.testing.assert_allclose(f(x), y_ref, rtol=0, atol=tol * 3, err_msg=f"scale {scale}")
        assert bool(jnp.all(jnp.isfinite(grad_f(x)))), scale


@pytest.mark.parametrize("normalization", ["component", "norm", "integral"])
def test_normalize_propagates_nan_and_inf_as_e3nn(normalization):
    """A vector with a NaN or an infinite component comes out NaN for l >= 1, as in e3nn-jax; a NaN
    once passed unnormalized, as the zero vector does, with finite values and gradients."""
    vectors = jnp.array([[np.nan, 1.0, 2.0], [np.nan, 0, 0], [0, np.inf, 0], [0.3, -0.5, 0.8]])
    ls = [0, 1, 2]
    ref = e3nn.spherical_harmonics(e3nn.Irreps.spherical_harmonics(2), vectors, True, normalization).array
    out = e3j.spherical_harmonics(ls, vectors, True, normalization)
    # NaN where e3nn-jax has NaN; the infinite vector NaN in every l >= 1 row (e3nn-jax keeps the
    # zeros of x / |x| = (0, NaN, 0) where the polynomials vanish with them)
    np.testing.assert_array_equal(np.isnan(out[:2]), np.isnan(ref[:2]))
    assert bool(jnp.all(jnp.isnan(out[:3, 1:]))) and bool(jnp.all(out[:3, 0] == ref[:3, 0]))
    np.testing.assert_allclose(out[3], ref[3], rtol=1e-6, atol=1e-6)
    grad = jax.grad(lambda v: jnp.sum(e3j.spherical_harmonics(ls, v, True, normalization)))(vectors)
    assert bool(jnp.all(jnp.isnan(grad[:2]))) and bool(jnp.all(jnp.isfinite(grad[3])))


def test_jit_vmap_and_batch_shapes():
    v_np, full = e3nn_reference("component", True)
    v = jnp.asarray(v_np[:24]).reshape(3, 4, 2, 3)  # [..., 3] with several batch axes
    ref = e3j.spherical_harmonics("0e + 1o + 2e", v, True)
    assert ref.shape == (3, 4, 2, 9)
    np.testing.assert_allclose(ref.reshape(24, 9), full[:24, :9], rtol=0, atol=1e-14)
    jitted = jax.jit(lambda x: e3j.spherical_harmonics("0e + 1o + 2e", x, True))(v)
    np.testing.assert_allclose(jitted, ref, rtol=0, atol=1e-15)
    mapped = jax.vmap(jax.vmap(lambda x: e3j.spherical_harmonics("0e + 1o + 2e", x, True)))(v.reshape(12, 2, 3))
    np.testing.assert_allclose(mapped.reshape(ref.shape), ref, rtol=0, atol=1e-15)
    single = e3j.spherical_harmonics([0, 1, 2], v[0, 0, 0], True)
    assert single.shape == (9,)
    np.testing.assert_allclose(single, ref[0, 0, 0], rtol=0, atol=1e-15)
    assert e3j.spherical_harmonics(2, jnp.zeros((0, 3)), False).shape == (0, 5)


def test_bad_inputs_raise():
    v = jnp.ones((4, 3))
    with pytest.raises(ValueError, match=r"input must have shape \[\.\.\., 3\], got \(4, 2\)"):
        e3j.spherical_harmonics(1, jnp.ones((4, 2)), True)
    with pytest.raises(ValueError, match=r"input must have shape \[\.\.\., 3\]"):
        e3j.spherical_harmonics(1, jnp.float64(1.0), True)
    with pytest.raises(TypeError, match="input must be a real array, got dtype complex64"):
        e3j.spherical_harmonics(1, jnp.ones((4, 3), jnp.complex64), True)
    with pytest.raises(ValueError, match="algorithm must be None or a tuple of"):
        e3j.spherical_harmonics(1, v, True, algorithm=("fast",))
    with pytest.raises(ValueError, match="normalization must be one of"):
        e3j.spherical_harmonics(1, v, True, "unit")
    with pytest.raises(ValueError, match="l must be an int >= 0, got -1"):
        e3j.spherical_harmonics(-1, v, True)
    with pytest.raises(ValueError, match="each l must be an int >= 0, got -2"):
        e3j.spherical_harmonics([0, -2], v, True)
    with pytest.raises(ValueError, match="degree l must be >= 0"):
        e3j.spherical_harmonics("-1e", v, True)
    for irreps, what in [
        ("1o + 1e", "odd degrees of both parities"),
        ("0o", r"an even degree with odd parity \(0o\)"),
        ("2o + 1o + 0o", r"an even degree with odd parity \(2o, 0o\)"),
        ("0e + 1o + 3e", "odd degrees of both parities"),
    ]:
        with pytest.raises(ValueError, match=f"irreps .* have {what}: spherical harmonics of a vector"):
            e3j.spherical_harmonics(irreps, v, True)
    # a truthy non-bool (a string, None, another number or array) would silently pick one branch
    for normalize in ("no", None, 2, 0.0, jnp.array([True]), jnp.array(0.5), np.int64(-1)):
        with pytest.raises(TypeError, match="normalize must be a bool"):
            e3j.spherical_harmonics(1, v, normalize)
    with pytest.raises(TypeError, match="normalize must be a static bool, got a traced"):
        jax.jit(lambda n: e3j.spherical_harmonics(1, v, n))(True)
    # e3nn-jax's unambiguous flags: numpy bools, 0 / 1, concrete 0-d bool or integer arrays
    for normalize in (np.bool_(False), 0, jnp.array(False), np.int32(0)):
        np.testing.assert_array_equal(e3j.spherical_harmonics(1, v, normalize), e3j.spherical_harmonics(1, v, False))
    for normalize in (1, jnp.array(True), np.array(1)):
        np.testing.assert_array_equal(e3j.spherical_harmonics(1, v, normalize), e3j.spherical_harmonics(1, v, True))


def test_an_eager_call_compiles_one_program():
    """Called outside ``jit``, the evaluator is compiled whole, not one small program per operation
    (degrees up to 11 took 23 s eagerly that way on a 2-core CPU, 2 s as one program)."""
    compiles = []

    def listener(name, secs, **kwargs):
        if name == "/jax/core/compile/backend_compile_duration":
            compiles.append(secs)

    v = jnp.asarray(vectors(n=23), jnp.float32)  # a shape no other test compiles for
    jax.block_until_ready(v)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        out = e3j.spherical_harmonics(list(range(7)), v, True, "norm")
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert out.shape == (len(v), 49)
    assert len(compiles) == 1, len(compiles)
    # the same numbers as the operations traced into a caller's program
    np.testing.assert_allclose(out, jax.jit(lambda a: e3j.spherical_harmonics(list(range(7)), a, True, "norm"))(v),
                               rtol=1e-6, atol=1e-6)  # fmt: skip


@pytest.mark.parametrize("dtype, tol", [(jnp.float8_e4m3fn, 0.2), (jnp.float8_e5m2, 0.4), (jnp.float16, 2e-3)])
def test_normalize_in_narrow_float_dtypes(dtype, tol):
    """float8 operands normalize as wider ones do (the exponent-bit scaling raised KeyError for
    8-bit floats), to their precision: the float32 harmonics of the rounded vectors, rounded once."""
    v = jnp.asarray([[1.0, 2.0, 0.5], [-0.3, 0.1, 0.2], [0.0, 0.0, 0.0]])
    ref = np.asarray(e3j.spherical_harmonics(2, v, True))
    out = e3j.spherical_harmonics(2, v.astype(dtype), True)
    assert out.dtype == dtype
    np.testing.assert_allclose(np.asarray(out, np.float32), ref, rtol=0, atol=tol * np.abs(ref).max())
    want = e3j.spherical_harmonics(2, v.astype(dtype).astype(jnp.float32), True).astype(dtype)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("normalize", [True, False])
def test_float16_high_degrees_stay_finite(normalize):
    """float16's range (65,504) was exceeded inside the recurrences from l = 6-8 for vectors of
    length 1.5-2 (and any length with normalize=True): infinities and NaN where the harmonics are
    below 50. Evaluated in float32 and rounded once, they are float16's rounding of the float32
    values, and so are their gradients (e3nn-jax refuses float16 from l = 9)."""
    rng = np.random.default_rng(5)
    v32 = rng.normal(size=(200, 3)).astype(np.float32)
    v32 *= (rng.uniform(0.5, 2.0, (200, 1)) / np.linalg.norm(v32, axis=1, keepdims=True)).astype(np.float32)
    v16 = jnp.asarray(v32, jnp.float16)
    for l in (6, 8, 11):
        want = e3j.spherical_harmonics(l, v16.astype(jnp.float32), normalize)
        got = e3j.spherical_harmonics(l, v16, normalize)
        assert got.dtype == jnp.float16 and bool(jnp.all(jnp.isfinite(got))), l
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want.astype(jnp.float16)))

        def loss(a, l=l):  # the gradient's scale kept inside float16's range (|Y| reaches ~10^4)
            return 1e-3 * jnp.sum(e3j.spherical_harmonics(l, a, normalize).astype(jnp.float32))

        grad, want_grad = jax.grad(loss)(v16), jax.grad(loss)(v16.astype(jnp.float32))
        assert grad.dtype == jnp.float16 and bool(jnp.all(jnp.isfinite(grad))), l
        np.testing.assert_allclose(np.asarray(grad, np.float32), want_grad, rtol=0, atol=2e-3 * np.abs(want_grad).max())


def test_float32_high_degrees_stay_finite():
    """The Legendre recurrences' unscaled intermediates grow factorially (``Q_l^0 = l!`` at the pole)
    and passed float32's range at l = 33: infinities, and NaN at the pole (inf times 0), where the
    harmonics are below 9. Scaled by powers of two they stay finite, to float32's rounding of
    e3nn-jax's float64 values, and so do their gradients."""
    rng = np.random.default_rng(3)
    v = np.concatenate([rng.normal(size=(40, 3)), [[0.0, 1.0, 0.0], [0.0, -2.0, 0.0]]])  # the poles: inf * 0
    v = v.astype(np.float32).astype(np.float64)  # the oracle's input, exactly float32's
    with jax.enable_x64(True):
        want = np.asarray(e3nn.spherical_harmonics("34e", jnp.asarray(v, jnp.float64), True).array)
    got = e3j.spherical_harmonics("34e", jnp.asarray(v, jnp.float32), True)
    assert got.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(got)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-5 * np.abs(want).max())

    def loss(sh, a):
        return jnp.sum(jnp.sin(sh("34e", a, True)))

    with jax.enable_x64(True):
        want_grad = np.asarray(jax.grad(lambda a: loss(lambda *args: e3nn.spherical_harmonics(*args).array, a))(v[:-2]))
    grad = jax.grad(functools.partial(loss, e3j.spherical_harmonics))(jnp.asarray(v[:-2], jnp.float32))
    assert bool(jnp.all(jnp.isfinite(grad)))
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=0, atol=1e-4 * np.abs(want_grad).max())
