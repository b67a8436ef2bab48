import math

import e3nn_jax as e3nn
import numpy as np
import pytest

from e3j_core import (
    Irreps,
    spherical_harmonic_polynomials,
    spherical_harmonic_recurrence,
    spherical_harmonics,
    wigner_D,
)
from e3j_core.spherical_harmonics import legendre_pole, legendre_step
from e3j_core.wigner import angles_to_matrix

LMAX = 11


def rel_err(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))) / np.max(np.abs(b)))


def e3nn_sh_all(v, normalize, normalization):
    """e3nn-jax's harmonics for l = 0..LMAX in one call, split per degree."""
    irreps = e3nn.Irreps.spherical_harmonics(LMAX)
    out = np.asarray(e3nn.spherical_harmonics(irreps, v, normalize, normalization=normalization).array)
    return [out[..., l * l : (l + 1) ** 2] for l in range(LMAX + 1)]


@pytest.fixture(scope="module")
def vectors():
    rng = np.random.default_rng(0)
    return rng.normal(size=(300, 3)) * rng.uniform(0.3, 2.0, size=(300, 1))


@pytest.mark.parametrize("normalization", ["component", "norm", "integral"])
@pytest.mark.parametrize("normalize", [True, False])
def test_matches_e3nn_float64(vectors, normalization, normalize):
    ref = e3nn_sh_all(vectors, normalize, normalization)
    for l in range(LMAX + 1):
        ours = spherical_harmonics(l, vectors, normalize, normalization)
        assert ours.dtype == np.float64
        assert rel_err(ours, ref[l]) <= 1e-12, l


@pytest.mark.parametrize("normalization", ["component", "norm", "integral"])
def test_matches_e3nn_float32(vectors, normalization):
    v32 = vectors.astype(np.float32)
    ref = e3nn_sh_all(v32.astype(np.float64), True, normalization)  # float64 oracle, same inputs
    for l in range(LMAX + 1):
        ours = spherical_harmonics(l, v32, True, normalization)
        assert ours.dtype == np.float32
        assert rel_err(ours, ref[l]) <= 1e-6, l


def test_irreps_argument_concatenates(vectors):
    full = spherical_harmonics("0e + 1o + 2e + 3o", vectors, True)
    parts = [spherical_harmonics(l, vectors, True) for l in range(4)]
    np.testing.assert_array_equal(full, np.concatenate(parts, axis=-1))
    ref = np.asarray(e3nn.spherical_harmonics("0e + 1o + 2e + 3o", vectors, True).array)
    assert rel_err(full, ref) <= 1e-12
    assert spherical_harmonics([2, 2], vectors, True).shape == (300, 10)
    pseudo = spherical_harmonics("0e + 1e + 2e", vectors, True)  # pseudovector input
    assert pseudo.shape == (300, 9)


def test_normalize_of_a_nan_vector_is_nan():
    """A NaN component makes every l >= 1 row NaN, as in e3nn-jax (it once took the zero vector's
    branch: finite zeros); the zero vector keeps Y_0 and zeros."""
    out = spherical_harmonics([0, 1, 2], np.array([[np.nan, 1.0, 2.0], [0.0, 0.0, 0.0]]), True)
    assert np.all(np.isnan(out[0, 1:]))
    np.testing.assert_array_equal(out[1], np.r_[1.0, np.zeros(8)])


def test_normalize_of_huge_and_tiny_vectors():
    """|v|² overflows above ~1e154 and underflows below ~1e-154 in float64: such vectors once read
    as the zero vector (zeros); their direction is what normalize=True must give."""
    u = np.array([[1.0, 2.0, -2.0], [0.5, -1.0, 3.0]])
    want = spherical_harmonics([0, 1, 2, 3], u, True)
    for scale in (1e155, 1e300, 1e-160, 1e-170, 1e-300):
        np.testing.assert_allclose(spherical_harmonics([0, 1, 2, 3], u * scale, True), want, rtol=1e-13, atol=1e-15)


def test_normalizations_relate():
    rng = np.random.default_rng(1)
    u = rng.normal(size=(50, 3))
    u /= np.linalg.norm(u, axis=-1, keepdims=True)
    for l in range(LMAX + 1):
        comp = spherical_harmonics(l, u, False, "component")
        np.testing.assert_allclose(np.sum(comp**2, -1), 2 * l + 1, rtol=1e-12)
        np.testing.assert_allclose(np.sum(spherical_harmonics(l, u, False, "norm") ** 2, -1), 1, rtol=1e-12)
        np.testing.assert_allclose(
            spherical_harmonics(l, u, False, "integral"), comp / np.sqrt(4 * np.pi), rtol=1e-12, atol=1e-14
        )


def test_integral_normalization_by_quadrature():
    # Gauss-Legendre in cos(theta) x uniform in phi integrates degree <= 2*11 polynomials exactly
    t, w = np.polynomial.legendre.leggauss(16)
    phi = np.linspace(0, 2 * np.pi, 32, endpoint=False)
    T, P = np.meshgrid(t, phi, indexing="ij")
    s = np.sqrt(1 - T**2)
    pts = np.stack([s * np.cos(P), T, s * np.sin(P)], -1).reshape(-1, 3)
    weights = (w[:, None] * np.full_like(P, 2 * np.pi / 32)).reshape(-1)
    Y = spherical_harmonics(list(range(LMAX + 1)), pts, False, "integral")
    gram = np.einsum("n,ni,nj->ij", weights, Y, Y)
    np.testing.assert_allclose(gram, np.eye(gram.shape[0]), atol=1e-12)


def test_harmonic_laplacian_is_zero():
    for l in range(LMAX + 2):
        sh = spherical_harmonic_polynomials(l)
        lap: dict = {}
        for k, (a, b, c) in enumerate(sh.exponents.tolist()):
            for axis, e in enumerate((a, b, c)):
                if e >= 2:
                    new = [a, b, c]
                    new[axis] -= 2
                    lap.setdefault(tuple(new), np.zeros(sh.dim))
                    lap[tuple(new)] += e * (e - 1) * sh.coefficients[:, k]
        scale = np.abs(sh.coefficients).max()
        for coef in lap.values():
            assert np.abs(coef).max() <= 1e-13 * scale * (l + 1) ** 2
        assert all(a + b + c == l for a, b, c in sh.exponents.tolist())


def test_polynomial_form_shapes_and_cache():
    sh = spherical_harmonic_polynomials([0, 1, 2], "norm")
    assert sh.coefficients.shape == (9, sh.exponents.shape[0])
    assert sh.exponents.shape[1] == 3 and sh.exponents.dtype == np.int64
    assert sh is spherical_harmonic_polynomials((0, 1, 2), "norm")
    assert not sh.coefficients.flags.writeable
    # l=2 needs only the 6 quadratic monomials, l=1 the 3 linear ones, l=0 the constant
    assert sh.exponents.shape[0] == 10


def recurrence_by_its_docstring(rec, v):
    """The rows of ``rec`` at ``v [n, 3]``, evaluated as the class docstring states them (float64)."""
    big_x, big_y, big_z = v[:, 2], v[:, 0], v[:, 1]
    r2 = np.sum(v * v, axis=1)
    trig = [(big_x + 1j * big_y) ** m for m in range(int(rec.m.max(initial=0)) + 1)]
    out = []
    for l, m, cosine, factor in zip(rec.degrees, rec.m, rec.cosine, rec.factors):
        q = [np.ones_like(big_z), (2 * m + 1) * big_z]  # Q_m^m, Q_{m+1}^m
        for k in range(m + 2, l + 1):
            q.append((2 * k - 1) * big_z * q[-1] - (k + m - 1) * (k - m - 1) * r2 * q[-2])
        out.append(factor * q[l - m] * (trig[m].real if cosine else trig[m].imag))
    return np.stack(out, axis=1)


@pytest.mark.parametrize("normalization", ["component", "norm", "integral"])
def test_recurrence_form_equals_the_polynomials(vectors, normalization):
    """Same rows as the monomial form up to l = 11 and at l = 20 (built with an exact check)."""
    ls = [*range(LMAX + 1), 20, 3]
    rec = spherical_harmonic_recurrence(ls, normalization)
    assert rec.ls == tuple(ls) and rec.factors.shape == (sum(2 * l + 1 for l in ls),)
    got = recurrence_by_its_docstring(rec, vectors)
    ref = spherical_harmonic_polynomials(ls, normalization)(vectors)
    start = 0
    for l in ls:
        block = slice(start, start + 2 * l + 1)
        assert rel_err(got[:, block], ref[:, block]) <= 1e-13, l
        start += 2 * l + 1


@pytest.mark.parametrize("normalization", ["component", "norm", "integral"])
def test_coefficients_are_rounded_once(normalization):
    """Each coefficient of both forms is its exact value (an integer ratio over the square root of
    a rational, exact in e3j-core; the values themselves are e3nn-jax's, tested above) rounded to
    float64 once, here from mpmath at 50 digits. A float64 square root of the rounded rational was
    one ulp off for 468 of the 19,954 coefficients of degrees <= 20."""
    from fractions import Fraction

    import mpmath

    from e3j_core.spherical_harmonics import _legendre_rows, integer_harmonics

    ls = list(range(21))
    polys = spherical_harmonic_polynomials(ls, normalization)
    rec = spherical_harmonic_recurrence(ls, normalization)
    row = 0
    with mpmath.workdps(50):

        def exact(c, q, l):
            radicand = Fraction(c * c) / (q * (2 * l + 1 if normalization == "norm" else 1))
            value = mpmath.sqrt(mpmath.mpf(radicand.numerator) / radicand.denominator)
            if normalization == "integral":
                value /= mpmath.sqrt(4 * mpmath.pi)
            return float(mpmath.sign(c) * value)

        for l in ls:
            for ratio, (p, q) in zip(_legendre_rows(l), integer_harmonics(l)):
                got = {tuple(e): c for e, c in zip(polys.exponents.tolist(), polys.coefficients[row]) if c != 0}
                assert got == {e: exact(c, q, l) for e, c in p.items()}, (l, row)
                assert rec.factors[row] == exact(ratio, q, l), (l, row)
                row += 1


def test_legendre_step_is_the_docstring_recurrence():
    assert [legendre_step(l, m) for l, m in [(1, 0), (2, 1), (2, 0), (5, 2), (11, 0)]] == [
        (1, 0), (3, 0), (3, 1), (9, 12), (21, 100)
    ]  # fmt: skip
    for l, m in [(0, 0), (2, 2), (1, -1)]:
        with pytest.raises(ValueError, match=rf"legendre_step needs l > m >= 0, got l={l}, m={m}"):
            legendre_step(l, m)


def test_recurrence_rows_and_cache():
    rec = spherical_harmonic_recurrence("0e + 2e", "norm")
    assert rec is spherical_harmonic_recurrence([0, 2], "norm")
    assert rec.degrees.tolist() == [0, 2, 2, 2, 2, 2]
    assert rec.m.tolist() == [0, 2, 1, 0, 1, 2]  # |m| for m = -l .. l
    assert rec.cosine.tolist() == [True, False, False, True, True, True]
    assert not rec.factors.flags.writeable and rec.factors.dtype == np.float64
    with pytest.raises(ValueError, match="normalization"):
        spherical_harmonic_recurrence([1], "unit")


def test_equivariance(vectors):
    rng = np.random.default_rng(2)
    vectors = vectors[:40]
    R = angles_to_matrix(*rng.uniform(0, 2 * np.pi, size=(3, vectors.shape[0])))
    for l in range(LMAX + 1):
        lhs = spherical_harmonics(l, np.einsum("nij,nj->ni", R, vectors), True)
        rhs = np.einsum("nij,nj->ni", wigner_D(l, R), spherical_harmonics(l, vectors, True))
        assert rel_err(lhs, rhs) <= 1e-11, l
    # parity: Y_l(-v) = (-1)^l Y_l(v)
    for l in range(LMAX + 1):
        np.testing.assert_allclose(
            spherical_harmonics(l, -vectors, True),
            (-1) ** l * spherical_harmonics(l, vectors, True),
            atol=1e-12,
        )


def test_zero_vector_with_normalize():
    out = spherical_harmonics("0e + 1o + 2e", np.zeros((2, 3)), True)
    np.testing.assert_array_equal(out[:, 0], 1.0)
    np.testing.assert_array_equal(out[:, 1:], 0.0)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: spherical_harmonics(-1, np.ones(3), True), "l must be an int >= 0"),
        (lambda: spherical_harmonics(1, np.ones(3), True, "unit"), "normalization must be one of"),
        (lambda: spherical_harmonics(1, np.ones((4, 2)), True), r"shape \[\.\.\., 3\]"),
        (
            lambda: spherical_harmonics("1o + 1e", np.ones(3), True),
            "ls: irreps 1x1o\\+1x1e have odd degrees of both parities",
        ),
        (
            lambda: spherical_harmonics("2o", np.ones(3), True),
            r"irreps 1x2o have an even degree with odd parity \(2o\)",
        ),
        (lambda: spherical_harmonics([1, 2.5], np.ones(3), True), "each l"),
        (lambda: spherical_harmonic_polynomials("1q"), "ls: expected an int, a list of ints or Irreps, got '1q'"),
        (lambda: spherical_harmonic_polynomials(None), "ls: expected an int, a list of ints or Irreps, got None"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_complex_vectors_are_refused():
    # casting to float64 would drop the imaginary part (numpy only warns)
    with pytest.raises(TypeError, match="vectors must be a real"):
        spherical_harmonics(1, np.array([1j, 1.0, 0.0]), False)


def test_complex_vectors_are_refused_by_the_polynomials_too():
    with pytest.raises(TypeError, match="vectors must be real"):
        spherical_harmonic_polynomials(1)(np.array([1 + 5j, 0.0, 0.0]))


def test_normalize_must_be_a_bool():
    with pytest.raises(TypeError, match="normalize must be a bool, got 'no'"):
        spherical_harmonics(1, np.ones(3), "no")


def test_irreps_type_accepted():
    assert spherical_harmonic_polynomials(Irreps("2x1o")).ls == (1, 1)


def test_legendre_pole_is_the_largest_value_on_the_sphere():
    """``legendre_pole(l, m)``, by which the evaluators scale ``Q_l^m``, is ``Q_l^m(Z = r = 1)`` and
    its largest magnitude for ``|Z| <= r = 1`` (a Gegenbauer polynomial's bound)."""
    z = np.linspace(-1.0, 1.0, 2001)
    for l in range(12):
        for m in range(l + 1):
            q = [np.ones_like(z), (2 * m + 1) * z]  # the docstring's recurrence at r = 1
            for k in range(m + 2, l + 1):
                a, b = legendre_step(k, m)
                q.append(a * z * q[-1] - b * q[-2])
            values = q[l - m]
            assert legendre_pole(l, m) == values[-1], (l, m)
            assert np.abs(values).max() <= legendre_pole(l, m), (l, m)
    assert legendre_pole(40, 0) == math.factorial(40)  # exact, past float32's range
    with pytest.raises(ValueError, match=r"legendre_pole needs l >= m >= 0, got l=1, m=2"):
        legendre_pole(1, 2)


def test_a_non_finite_component_reaches_only_the_rows_that_read_it():
    """The monomials were summed as one dense product, where 0 * NaN is NaN: one NaN component made
    every harmonic NaN, Y_0 included. Each row now reads its own monomials: a row is NaN exactly
    when it depends on the NaN component, and is its finite value otherwise."""
    ls = [0, 1, 2, 3]
    with np.errstate(invalid="ignore"):
        got = spherical_harmonics(ls, np.array([[1.0, np.nan, 2.0], [np.inf, 0.0, 0.0]]), normalize=False)
    a, b = (spherical_harmonics(ls, np.array([[1.0, y, 2.0]]), normalize=False)[0] for y in (0.3, -1.7))
    depends = ~np.isclose(a, b, rtol=1e-12, atol=1e-12)
    assert depends.any() and not depends.all()
    np.testing.assert_array_equal(np.isnan(got[0]), depends)
    np.testing.assert_allclose(got[0, ~depends], a[~depends], rtol=1e-12)
    assert got[1, 0] == 1.0  # Y_0 of an infinite vector
