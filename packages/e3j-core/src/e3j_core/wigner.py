"""Real-basis Wigner D matrices, from the angular-momentum generators of the spherical harmonics.

``D^l(R)`` is the ``[2l+1, 2l+1]`` matrix with ``Y_l(R v) = D^l(R) Y_l(v)`` for the spherical
harmonics of :mod:`e3j_core.spherical_harmonics` (so ``D^1(R) = R``, e3nn's convention). The
generators ``J_k = dD^l/dt`` along the rotations ``exp(t G_k)`` about the ``x``, ``y``, ``z`` axes are
computed exactly from the integer harmonic polynomials; ``D^l(R) = expm(Σ ω_k J_k)`` where ``ω`` is
the rotation vector (axis × angle) of ``R``.

Euler angles follow e3nn-jax: ``R = Y(α) X(β) Y(γ)`` (``Y`` rotates about the y axis, ``X`` about x).

>>> import numpy as np
>>> R = angles_to_matrix(0.3, -1.1, 2.0)
>>> np.allclose(wigner_D(1, R), R)
True
>>> np.allclose(wigner_D(2, R) @ wigner_D(2, R.T), np.eye(5))
True
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from . import _polynomials as poly
from ._checks import check_degree
from .spherical_harmonics import integer_harmonics

__all__ = [
    "angles_to_matrix",
    "matrix_to_log_coordinates",
    "matrix_x",
    "matrix_y",
    "matrix_z",
    "so3_generators",
    "wigner_D",
    "wigner_D_from_angles",
    "wigner_D_from_log_coordinates",
]

# Infinitesimal rotations about x, y, z: exp(t G_k) is the rotation by t about axis k.
_G = (
    [[0, 0, 0], [0, 0, -1], [0, 1, 0]],
    [[0, 0, 1], [0, 0, 0], [-1, 0, 0]],
    [[0, -1, 0], [1, 0, 0], [0, 0, 0]],
)


@cache
def _generators(l: int) -> np.ndarray:
    harmonics = integer_harmonics(l)
    d = 2 * l + 1
    J = np.zeros((3, d, d))
    polys = [p for p, _ in harmonics]
    norms = [q for _, q in harmonics]
    for k in range(3):
        moved = [poly.directional_derivative(p, _G[k]) for p in polys]
        inner = poly.sphere_inner_matrix(moved, polys) if l > 0 else [[0]]
        for i in range(d):
            for j in range(d):
                r = inner[i][j]
                if r:
                    J[k, i, j] = math.copysign(math.sqrt(r * r / (norms[i] * norms[j])), r)
    J.setflags(write=False)
    return J


def so3_generators(l: int) -> np.ndarray:
    """``float64 [3, 2l+1, 2l+1]``: antisymmetric ``J_x, J_y, J_z`` with ``D(exp(t G_k)) = expm(t J_k)``."""
    return _generators(check_degree(l)).copy()


def _expm_antisymmetric(A: np.ndarray) -> np.ndarray:
    # iA is Hermitian, so expm(A) = V exp(-i w) V^† from one batched eigh: accurate to ~1 ulp·|A|.
    # A non-finite angle gives NaN for its own matrix (as e3nn-jax), not a failed eigh for the batch
    finite = np.isfinite(A).all(axis=(-2, -1))[..., None, None]
    w, V = np.linalg.eigh(1j * np.where(finite, A, 0))
    D = np.real((V * np.exp(-1j * w)[..., None, :]) @ np.conj(np.swapaxes(V, -1, -2)))
    return np.where(finite, D, np.nan)


def wigner_D_from_log_coordinates(l: int, log: np.ndarray) -> np.ndarray:
    """``D^l`` of the rotation with rotation vector ``log [..., 3]`` (axis × angle)."""
    J = _generators(check_degree(l))
    log = np.asarray(log, dtype=np.float64)
    if log.ndim == 0 or log.shape[-1] != 3:
        raise ValueError(f"log must have shape [..., 3], got {log.shape}")
    return _expm_antisymmetric(np.einsum("...k,kij->...ij", log, J))


def _as_rotation(R: np.ndarray, name: str = "R") -> np.ndarray:
    R = np.asarray(R, dtype=np.float64)
    if R.ndim < 2 or R.shape[-2:] != (3, 3):
        raise ValueError(f"{name} must have shape [..., 3, 3], got {R.shape}")
    eye = np.broadcast_to(np.eye(3), R.shape)
    if not np.allclose(R @ np.swapaxes(R, -1, -2), eye, atol=1e-6):
        raise ValueError(f"{name} must be orthogonal (R Rᵀ = 1)")
    return R


def matrix_to_log_coordinates(R: np.ndarray) -> np.ndarray:
    """Rotation vector ``[..., 3]`` (axis × angle, angle in [0, π]) of rotation matrices ``R``."""
    R = _as_rotation(R)
    if np.any(np.linalg.det(R) < 0):
        raise ValueError("R must be a proper rotation (det R = +1)")
    # Shepperd's method: take the quaternion branch with the largest pivot, so no division by ~0.
    tr = np.trace(R, axis1=-2, axis2=-1)
    d0, d1, d2 = R[..., 0, 0], R[..., 1, 1], R[..., 2, 2]
    pivots = np.stack([1 + tr, 1 + d0 - d1 - d2, 1 - d0 + d1 - d2, 1 - d0 - d1 + d2], axis=-1)
    branch = np.argmax(pivots, axis=-1)
    s = np.sqrt(np.maximum(np.take_along_axis(pivots, branch[..., None], -1)[..., 0], 1e-300)) * 2
    a = R[..., 2, 1] - R[..., 1, 2]
    b = R[..., 0, 2] - R[..., 2, 0]
    c = R[..., 1, 0] - R[..., 0, 1]
    e = R[..., 0, 1] + R[..., 1, 0]
    f = R[..., 0, 2] + R[..., 2, 0]
    g = R[..., 1, 2] + R[..., 2, 1]
    q = np.select(
        [branch[..., None] == k for k in range(4)],
        [
            np.stack([s / 4, a / s, b / s, c / s], -1),
            np.stack([a / s, s / 4, e / s, f / s], -1),
            np.stack([b / s, e / s, s / 4, g / s], -1),
            np.stack([c / s, f / s, g / s, s / 4], -1),
        ],
    )
    q = np.where(q[..., :1] < 0, -q, q)
    v = q[..., 1:]
    sin_half = np.linalg.norm(v, axis=-1)
    angle = 2 * np.arctan2(sin_half, q[..., 0])
    scale = np.divide(angle, sin_half, out=np.zeros_like(angle), where=sin_half > 0)
    return v * scale[..., None]


def wigner_D(l: int, R: np.ndarray) -> np.ndarray:
    """``D^l(R)`` ``[..., 2l+1, 2l+1]`` for proper rotation matrices ``R [..., 3, 3]``."""
    return wigner_D_from_log_coordinates(l, matrix_to_log_coordinates(R))


def _angles(name: str, a: object) -> np.ndarray:
    """Real angles as float64; ``np.asarray(None, float64)`` would be a silent NaN."""
    array = np.asarray(a)
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{name} must be real numbers (radians), got {a!r}")
    return array.astype(np.float64)


def _axis_rotation(axis: int, angle: np.ndarray) -> np.ndarray:
    angle = _angles("angle", angle)
    c, s = np.cos(angle), np.sin(angle)
    out = np.zeros(angle.shape + (3, 3))
    i, j = [(1, 2), (2, 0), (0, 1)][axis]
    out[..., axis, axis] = 1
    out[..., i, i] = c
    out[..., j, j] = c
    out[..., i, j] = -s
    out[..., j, i] = s
    return out


def matrix_x(angle: np.ndarray) -> np.ndarray:
    """Rotation by ``angle`` about the x axis, ``[..., 3, 3]``."""
    return _axis_rotation(0, angle)


def matrix_y(angle: np.ndarray) -> np.ndarray:
    """Rotation by ``angle`` about the y axis, ``[..., 3, 3]``."""
    return _axis_rotation(1, angle)


def matrix_z(angle: np.ndarray) -> np.ndarray:
    """Rotation by ``angle`` about the z axis, ``[..., 3, 3]``."""
    return _axis_rotation(2, angle)


def angles_to_matrix(alpha: np.ndarray, beta: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """``Y(α) X(β) Y(γ)`` (e3nn-jax's Euler convention), ``[..., 3, 3]``."""
    alpha, beta, gamma = np.broadcast_arrays(_angles("alpha", alpha), _angles("beta", beta), _angles("gamma", gamma))
    return matrix_y(alpha) @ matrix_x(beta) @ matrix_y(gamma)


def wigner_D_from_angles(l: int, alpha: np.ndarray, beta: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """``D^l(Y(α) X(β) Y(γ)) = expm(α J_y) expm(β J_x) expm(γ J_y)``."""
    J = _generators(check_degree(l))
    alpha, beta, gamma = np.broadcast_arrays(_angles("alpha", alpha), _angles("beta", beta), _angles("gamma", gamma))
    return (
        _expm_antisymmetric(alpha[..., None, None] * J[1])
        @ _expm_antisymmetric(beta[..., None, None] * J[0])
        @ _expm_antisymmetric(gamma[..., None, None] * J[1])
    )


def irreps_D_from_matrix(ls_and_parities: tuple[tuple[int, int, int], ...], R: np.ndarray) -> np.ndarray:
    """Block-diagonal ``D`` of O(3) for blocks ``(mul, l, p)``; ``R`` may include reflections.

    For ``det R = -1`` the rotation ``-R`` is used and each block is multiplied by its parity.
    """
    R = _as_rotation(R)
    det = np.sign(np.linalg.det(R))
    rotation = det[..., None, None] * R
    log = matrix_to_log_coordinates(rotation)
    dim = sum(mul * (2 * l + 1) for mul, l, _ in ls_and_parities)
    out = np.zeros(R.shape[:-2] + (dim, dim))
    start = 0
    cache: dict[int, np.ndarray] = {}
    for mul, l, p in ls_and_parities:
        if l not in cache:
            cache[l] = wigner_D_from_log_coordinates(l, log)
        block = cache[l] * np.where(det < 0, p, 1)[..., None, None]
        for _ in range(mul):
            out[..., start : start + 2 * l + 1, start : start + 2 * l + 1] = block
            start += 2 * l + 1
    return out
