import e3nn_jax as e3nn
import numpy as np
import pytest

from e3j_core import (
    Irrep,
    Irreps,
    angles_to_matrix,
    matrix_to_log_coordinates,
    so3_generators,
    wigner_D,
    wigner_D_from_angles,
    wigner_D_from_log_coordinates,
)


@pytest.fixture(scope="module")
def angles():
    return np.random.default_rng(0).uniform(0, 2 * np.pi, size=(3, 20))


def test_rotation_matrices_match_e3nn(angles):
    np.testing.assert_allclose(angles_to_matrix(*angles), np.asarray(e3nn.angles_to_matrix(*angles)), atol=1e-14)


@pytest.mark.parametrize("l", range(9))
def test_matches_e3nn(angles, l):
    R = angles_to_matrix(*angles)
    ref = np.asarray(e3nn.Irrep(l, 1).D_from_matrix(R))
    np.testing.assert_allclose(wigner_D(l, R), ref, atol=1e-12)
    ref_angles = np.asarray(e3nn.Irrep(l, 1).D_from_angles(*angles))
    np.testing.assert_allclose(wigner_D_from_angles(l, *angles), ref_angles, atol=1e-12)


def test_irreps_with_reflections_match_e3nn(angles):
    R = angles_to_matrix(*angles[:, :4])
    for sign in (1, -1):
        for text in ["0e", "0o", "1o", "1e", "2e", "2o", "3o"]:
            ours = Irrep(text).D_from_matrix(sign * R)
            ref = np.asarray(e3nn.Irrep(text).D_from_matrix(sign * R))
            np.testing.assert_allclose(ours, ref, atol=1e-12)
    D = Irreps("2x0e + 1o + 2o").D_from_matrix(-R)
    assert D.shape == (4, 10, 10)
    np.testing.assert_allclose(D[:, 2:5, 2:5], -R, atol=1e-12)  # a vector (1o) transforms by -R itself
    np.testing.assert_allclose(D[:, 5:, 5:], -wigner_D(2, R), atol=1e-12)
    np.testing.assert_array_equal(D[:, 0, 1], 0.0)


def test_representation_properties(angles):
    R = angles_to_matrix(*angles)
    R1, R2 = R[:10], R[10:]
    for l in range(7):
        D1, D2, D12 = wigner_D(l, R1), wigner_D(l, R2), wigner_D(l, R1 @ R2)
        np.testing.assert_allclose(D1 @ D2, D12, atol=1e-12)
        np.testing.assert_allclose(
            D1 @ np.swapaxes(D1, -1, -2), np.broadcast_to(np.eye(2 * l + 1), D1.shape), atol=1e-12
        )
        np.testing.assert_allclose(np.linalg.det(D1), 1.0, atol=1e-10)
    np.testing.assert_allclose(wigner_D(1, R), R, atol=1e-13)
    np.testing.assert_allclose(wigner_D(0, R), 1.0)


def test_generators():
    for l in range(6):
        J = so3_generators(l)
        np.testing.assert_allclose(J, -np.swapaxes(J, -1, -2), atol=1e-15)
        # [J_x, J_y] = J_z and cyclic
        for a, b, c in [(0, 1, 2), (1, 2, 0), (2, 0, 1)]:
            np.testing.assert_allclose(J[a] @ J[b] - J[b] @ J[a], J[c], atol=1e-12)
        # Casimir: Σ J_k² = -l(l+1)
        np.testing.assert_allclose(sum(J[k] @ J[k] for k in range(3)), -l * (l + 1) * np.eye(2 * l + 1), atol=1e-11)
    np.testing.assert_allclose(so3_generators(1)[2], [[0, -1, 0], [1, 0, 0], [0, 0, 0]], atol=1e-15)


def test_log_coordinates_roundtrip():
    rng = np.random.default_rng(3)
    axis = rng.normal(size=(50, 3))
    axis /= np.linalg.norm(axis, axis=-1, keepdims=True)
    angle = rng.uniform(0, np.pi, size=(50, 1))
    angle[:3] = [[0.0], [np.pi], [np.pi - 1e-9]]
    log = axis * angle
    R = wigner_D_from_log_coordinates(1, log)
    back = matrix_to_log_coordinates(R)
    np.testing.assert_allclose(wigner_D_from_log_coordinates(1, back), R, atol=1e-12)
    np.testing.assert_allclose(back[3:], log[3:], atol=1e-10)
    assert np.allclose(np.abs(back[1]), np.abs(log[1]), atol=1e-10)  # angle pi: axis sign free


def test_non_finite_angles_give_nan_for_their_own_matrices():
    # as e3nn-jax; eigh once failed for the whole batch ("Eigenvalues did not converge")
    alpha = np.array([0.1, 0.2, np.nan, 0.4])
    for D in (wigner_D_from_angles(2, alpha, 0.3, 0.5), Irrep("2e").D_from_angles(alpha, 0.3, 0.5)):
        assert np.isnan(D[2]).all() and np.isfinite(D[[0, 1, 3]]).all()
        np.testing.assert_allclose(D[[0, 1, 3]], wigner_D_from_angles(2, alpha[[0, 1, 3]], 0.3, 0.5), atol=1e-15)
    D = wigner_D_from_log_coordinates(1, [[0.1, 0.0, 0.0], [np.inf, 0.0, 0.0]])
    assert np.isfinite(D[0]).all() and np.isnan(D[1]).all()


def test_bad_input():
    with pytest.raises(ValueError, match=r"shape \[\.\.\., 3, 3\]"):
        wigner_D(1, np.eye(2))
    with pytest.raises(ValueError, match="orthogonal"):
        wigner_D(1, 2 * np.eye(3))
    with pytest.raises(ValueError, match="det R = \\+1"):
        wigner_D(1, -np.eye(3))
    with pytest.raises(ValueError, match="l must be"):
        wigner_D(-1, np.eye(3))
