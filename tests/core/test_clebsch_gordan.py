import e3nn_jax as e3nn
import numpy as np
import pytest

from e3j_core import change_basis_real_to_complex, clebsch_gordan, su2_clebsch_gordan, wigner_D
from e3j_core.wigner import angles_to_matrix

LMAX = 8
TRIPLES = [
    (l1, l2, l3)
    for l1 in range(LMAX + 1)
    for l2 in range(LMAX + 1)
    for l3 in range(abs(l1 - l2), min(l1 + l2, LMAX) + 1)
]


def test_matches_e3nn_for_every_admissible_triple():
    worst = 0.0
    for l1, l2, l3 in TRIPLES:
        ours = clebsch_gordan(l1, l2, l3)
        ref = np.asarray(e3nn.clebsch_gordan(l1, l2, l3))
        assert ours.shape == ref.shape == (2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1)
        worst = max(worst, float(np.abs(ours - ref).max()))
    assert worst <= 1e-12


def test_textbook_values():
    # <1 1; 1 -1 | 0 0> = 1/sqrt(3), <1 0; 1 0 | 2 0> = sqrt(2/3), <1 1; 1 0 | 1 1> = 1/sqrt(2)
    # (Condon–Shortley tables)
    C = su2_clebsch_gordan(1, 1, 0)
    assert C[2, 0, 0] == pytest.approx(1 / np.sqrt(3), abs=1e-15)
    assert su2_clebsch_gordan(1, 1, 2)[1, 1, 2] == pytest.approx(np.sqrt(2 / 3), abs=1e-15)
    assert su2_clebsch_gordan(1, 1, 1)[2, 1, 2] == pytest.approx(1 / np.sqrt(2), abs=1e-15)
    # <2 2; 1 -1 | 2 1> = -sqrt(1/3) ... sign convention: <3/2..> not needed; <2 2; 1 -1 | 1 1> = sqrt(3/5)
    assert su2_clebsch_gordan(2, 1, 1)[4, 0, 2] == pytest.approx(np.sqrt(3 / 5), abs=1e-15)
    np.testing.assert_array_equal(su2_clebsch_gordan(1, 1, 3), 0.0)


def _exact(value) -> float:
    """A sympy number rounded to float64 once (from 40 digits)."""
    return float(value.evalf(40))


@pytest.mark.parametrize("l1, l2, l3", [(1, 1, 1), (3, 2, 2), (3, 3, 2), (6, 5, 4), (7, 7, 14), (25, 25, 50)])
def test_su2_correctly_rounded_with_exact_zeros(l1, l2, l3):
    """Every complex coefficient is sympy's exact value rounded once; the ones that vanish
    (``m1 + m2 = m3`` but a zero of Racah's sum, e.g. ``<3 -2, 2 1 | 2 -1>``) are exactly 0.0. The
    recurrence with lowering operators left ~1e-60 there."""
    from sympy.physics.wigner import clebsch_gordan as exact_cg

    C = su2_clebsch_gordan(l1, l2, l3)
    for m1 in range(-l1, l1 + 1):
        for m2 in range(-l2, l2 + 1):
            if abs(m1 + m2) <= l3:
                want = _exact(exact_cg(l1, l2, l3, m1, m2, m1 + m2))
                assert C[l1 + m1, l2 + m2, l3 + m1 + m2] == want, (m1, m2)


def _real_columns_exact(l1, l2, l3, columns):
    """Columns ``C[:, :, n]`` of the real coefficients in 50 digits: sympy's exact complex
    coefficients through e3nn's change of basis (written out here, in mpmath), over ``√(2l3+1)``."""
    import mpmath
    from sympy.physics.wigner import clebsch_gordan as exact_cg

    mp = mpmath.mp.clone()
    mp.dps = 50
    s = 1 / mp.sqrt(2)

    def q(l):  # e3nn's change_basis_real_to_complex: [complex l + m, real index]
        Q = {}
        for m in range(-l, 0):
            Q[l + m, l + abs(m)], Q[l + m, l - abs(m)] = s, -1j * s
        Q[l, l] = mp.mpf(1)
        for m in range(1, l + 1):
            Q[l + m, l + m], Q[l + m, l - m] = (-1) ** m * s, 1j * (-1) ** m * s
        return {k: (-1j) ** l * v for k, v in Q.items()}

    Q1, Q2, Q3 = q(l1), q(l2), q(l3)
    out = {n: np.zeros((2 * l1 + 1, 2 * l2 + 1)) for n in columns}
    for n in columns:
        acc = {}
        for (c3, r3), q3 in Q3.items():
            if r3 != n:
                continue
            M = c3 - l3
            for m1 in range(max(-l1, M - l2), min(l1, M + l2) + 1):
                c = exact_cg(l1, l2, l3, m1, M - m1, M)
                if c == 0:
                    continue
                cv = mp.mpf(str(c.evalf(60)))
                for (c1, r1), q1 in Q1.items():
                    if c1 != l1 + m1:
                        continue
                    for (c2, r2), q2 in Q2.items():
                        if c2 == l2 + M - m1:
                            acc[r1, r2] = acc.get((r1, r2), 0) + q1 * q2 * mp.conj(q3) * cv
        for (j, k), v in acc.items():
            assert abs(mp.mpc(v).imag) < mp.mpf(10) ** -40
            if abs(mp.mpc(v).real) > mp.mpf(10) ** -40:  # else a zero, left by 50-digit cancellation
                out[n][j, k] = float(mp.mpc(v).real / mp.sqrt(2 * l3 + 1))
    return out


@pytest.mark.parametrize("l1, l2, l3", [(3, 3, 2), (5, 4, 3), (20, 13, 25), (25, 25, 50)])
def test_real_correctly_rounded_at_any_degree(l1, l2, l3):
    """Real coefficients equal their exact values rounded once, zeros exactly: at (25, 25, 50) the
    corners hold true coefficients of ~3e-16, which a 1e-14 threshold on rounded values dropped."""
    C = clebsch_gordan(l1, l2, l3)
    columns = sorted({0, 1, l3, 2 * l3 - 1, 2 * l3})
    for n, want in _real_columns_exact(l1, l2, l3, columns).items():
        np.testing.assert_array_equal(C[:, :, n], want, err_msg=f"column {n}")
    if (l1, l2, l3) == (25, 25, 50):
        assert 0 < np.abs(C[C != 0]).min() < 1e-15


@pytest.mark.parametrize("l1, l2, l3", [t for t in TRIPLES if max(t) <= 5])
def test_orthonormal_and_equivariant(l1, l2, l3):
    C = clebsch_gordan(l1, l2, l3)
    assert np.linalg.norm(C) == pytest.approx(1.0, abs=1e-14)
    # the 2l3+1 output components are orthogonal maps with equal norms
    np.testing.assert_allclose(np.einsum("ijk,ijn->kn", C, C), np.eye(2 * l3 + 1) / (2 * l3 + 1), atol=1e-14)
    # different l3 of the same (l1, l2) are orthogonal
    for other in range(abs(l1 - l2), l1 + l2 + 1):
        if other != l3:
            assert np.abs(np.einsum("ijk,ijn->kn", C, clebsch_gordan(l1, l2, other))).max() <= 1e-14
    R = angles_to_matrix(*np.random.default_rng(l1 * 100 + l2 * 10 + l3).uniform(0, 6, size=(3, 3)))
    D1, D2, D3 = wigner_D(l1, R), wigner_D(l2, R), wigner_D(l3, R)
    lhs = np.einsum("ijk,bia,bjc->bakc", C, D1, D2)
    rhs = np.einsum("ack,bnk->bacn", C, D3)
    np.testing.assert_allclose(lhs, np.transpose(rhs, (0, 1, 3, 2)), atol=1e-12)


def test_completeness():
    # Σ over l3 of (2l3+1) C C^T = identity on l1 ⊗ l2
    for l1, l2 in [(1, 1), (2, 3), (4, 2)]:
        total = sum(
            (2 * l3 + 1) * np.einsum("ijk,abk->ijab", clebsch_gordan(l1, l2, l3), clebsch_gordan(l1, l2, l3))
            for l3 in range(abs(l1 - l2), l1 + l2 + 1)
        )
        d = (2 * l1 + 1) * (2 * l2 + 1)
        np.testing.assert_allclose(total.reshape(d, d), np.eye(d), atol=1e-13)


def test_cached_result_is_protected():
    a = clebsch_gordan(2, 2, 2)
    a[0, 0, 0] = 99.0
    assert clebsch_gordan(2, 2, 2)[0, 0, 0] != 99.0


@pytest.mark.parametrize(
    "args, match",
    [
        ((1, 1, 3), "triangle"),
        ((-1, 1, 1), "l1 must be an int >= 0"),
        ((1, 1.5, 1), "l2 must be an int"),
        ((0, 2, 1), "triangle"),
    ],
)
def test_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        clebsch_gordan(*args)


def test_bad_degree_names_the_function_called():
    with pytest.raises(ValueError, match=r"^su2_clebsch_gordan: l1 must be an int >= 0, got 0.5$"):
        su2_clebsch_gordan(0.5, 1, 1)
    with pytest.raises(ValueError, match=r"^l must be an int >= 0, got -1$"):
        change_basis_real_to_complex(-1)


@pytest.mark.parametrize("l", [2, 101, 150])
def test_change_basis_entries_exact(l):
    """Every entry of e3nn's change of basis is 0, a unit, or a unit over √2, exactly, with the
    global phase (-i)^l: Python's `(-1j)**l` put 4.4e-15 into the real parts from l = 101."""
    Q = change_basis_real_to_complex(l)
    s = 1 / np.sqrt(2)
    allowed = {0, 1, -1, s, -s}
    assert all(float(v) in allowed for v in np.concatenate([Q.real.ravel(), Q.imag.ravel()]))
    np.testing.assert_allclose(Q @ Q.conj().T, np.eye(2 * l + 1), atol=1e-15)
