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
