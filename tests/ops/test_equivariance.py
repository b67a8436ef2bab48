"""O(3) equivariance (rotations and parity) of tensor products, convolutions and a toy force field.

Every check uses ``e3j_core.Irreps.D_from_matrix(R)`` for ``R`` in O(3) (proper rotations, an
improper rotation, the inversion, a mirror) and ``e3j.spherical_harmonics`` for edge attributes.
The sanity tests at the end break equivariance on purpose and check that the same comparisons fail.
"""

from __future__ import annotations

from functools import cache, partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import e3j
from e3j_core import Irreps

TOL = 1e-10  # float64 throughout


def random_rotation(seed) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


MATRICES = {
    "rotation": random_rotation(0),
    "improper": -random_rotation(1),  # det -1: a rotation times the inversion
    "inversion": -np.eye(3),
    "mirror": np.diag([1.0, 1.0, -1.0]),
}
for _name, _R in MATRICES.items():
    assert np.allclose(_R @ _R.T, np.eye(3), atol=1e-14)
    assert np.isclose(np.linalg.det(_R), 1.0 if _name == "rotation" else -1.0)


def D(irreps, R) -> np.ndarray:
    return np.asarray(Irreps(irreps).D_from_matrix(R))


def act(irreps, R, a, axis=1) -> np.ndarray:
    """Apply ``D(R)`` of ``irreps`` to the irreps axis of ``a``."""
    return np.moveaxis(np.tensordot(D(irreps, R), np.asarray(a), axes=([1], [axis])), 0, axis)


def rel_err(a, ref) -> float:
    a, ref = np.asarray(a), np.asarray(ref)
    assert a.shape == ref.shape
    scale = np.max(np.abs(ref))
    assert scale > 0
    return float(np.max(np.abs(a - ref)) / scale)


SH = "0e + 1o + 2e"


@pytest.mark.parametrize("R", list(MATRICES))
def test_spherical_harmonics_transform_with_D(R):
    R = MATRICES[R]
    v = np.random.default_rng(2).normal(size=(5, 3))
    y = e3j.spherical_harmonics(SH, v, normalize=True)
    y_rot = e3j.spherical_harmonics(SH, v @ R.T, normalize=True)
    assert rel_err(y_rot, act(SH, R, y)) <= 1e-13


# -- tensor product ------------------------------------------------------------------------------

TP_X, TP_Y = "0e + 0o + 1o + 1e", "0e + 1o"


@cache
def get_tp():
    return e3j.TensorProduct(TP_X, TP_Y)


def tp_outputs_before_and_after(tp, R):
    """``tp(x, Y(v))`` and ``tp(D(R) x, Y(R v))`` for random ``x``, ``v`` (``y`` = spherical harmonics)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, tp.irreps_x.dim, 3))
    v = rng.normal(size=(4, 3))
    f = jax.jit(tp.__call__)
    z = f(x, e3j.spherical_harmonics(TP_Y, v, normalize=True))
    z_rot = f(act(TP_X, R, x), e3j.spherical_harmonics(TP_Y, v @ R.T, normalize=True))
    return z, z_rot


@pytest.mark.parametrize("R", list(MATRICES))
def test_tensor_product_equivariance_sh_y(R):
    R = MATRICES[R]
    tp = get_tp()
    z, z_rot = tp_outputs_before_and_after(tp, R)
    assert rel_err(z_rot, act(tp.irreps_out, R, z)) <= TOL
    assert "0o" in str(tp.irreps_out) and "1e" in str(tp.irreps_out)  # pseudo-outputs are covered


@pytest.mark.parametrize("R", list(MATRICES))
def test_tensor_product_equivariance_channelwise_y(R):
    R = MATRICES[R]
    tp = get_tp()
    rng = np.random.default_rng(4)
    x = rng.normal(size=(4, tp.irreps_x.dim, 3))
    y = rng.normal(size=(4, tp.irreps_y.dim, 3))  # generic (not spherical-harmonic) y per channel
    f = jax.jit(tp.__call__)
    z = f(x, y)
    z_rot = f(act(TP_X, R, x), act(TP_Y, R, y))
    assert rel_err(z_rot, act(tp.irreps_out, R, z)) <= TOL


# -- convolution ---------------------------------------------------------------------------------

CONV_X = "0e + 1o + 2e"


@cache
def get_conv():
    return e3j.Convolution(CONV_X, SH, filter="0e + 1o")


def radius_graph(pos: np.ndarray, cutoff: float):
    """All ordered pairs ``i != j`` closer than ``cutoff`` (host numpy)."""
    d = np.linalg.norm(pos[:, None, :] - pos[None, :, :], axis=-1)
    senders, receivers = np.nonzero((d < cutoff) & ~np.eye(len(pos), dtype=bool))
    return senders.astype(np.int32), receivers.astype(np.int32)


@pytest.mark.parametrize("R", list(MATRICES))
def test_convolution_equivariance(R):
    R = MATRICES[R]
    conv = get_conv()
    rng = np.random.default_rng(5)
    n, c = 7, 3
    pos = rng.uniform(-1.5, 1.5, size=(n, 3))
    senders, receivers = radius_graph(pos, 2.0)
    graph = e3j.Graph.from_edges(senders, receivers, n)
    x = rng.normal(size=(n, conv.irreps_x.dim, c))
    s = rng.normal(size=(len(senders), conv.num_paths, c))  # invariant edge scalars

    @jax.jit
    def f(x, pos):
        y = e3j.spherical_harmonics(SH, pos[receivers] - pos[senders], normalize=True)
        return conv(x, y, s, graph)

    m = f(x, pos)
    m_rot = f(act(CONV_X, R, x), pos @ R.T)
    assert rel_err(m_rot, act(conv.irreps_out, R, m)) <= TOL


# -- a two-layer force field ---------------------------------------------------------------------

N_ATOMS, CH, CUTOFF, N_RBF = 10, 4, 2.2, 6
L1_OUT = "0e + 1o + 2e"


@cache
def model():
    """Weights and layers of the toy model (fixed seeds)."""
    conv1 = e3j.Convolution("0e", SH, filter=L1_OUT)
    conv2 = e3j.Convolution(L1_OUT, SH, filter="0e + 1o")
    lin = e3j.Linear(L1_OUT, L1_OUT, channels_in=CH, channels_out=CH)
    rng = np.random.default_rng(42)  # numpy: model() may first run while tracing
    params = {
        "embed": rng.normal(size=(N_ATOMS, 1, CH)),  # per-atom "species" scalars
        "w1": rng.normal(size=(N_RBF, conv1.num_paths, CH)),
        "w2": rng.normal(size=(N_RBF, conv2.num_paths, CH)),
        "lin": {k: rng.normal(size=shape) for k, shape in lin.weight_shapes().items()},
    }
    return conv1, conv2, lin, params


def radial(r, w):
    """Smooth radial weights ``[E, P, C]``: Gaussian basis times a cutoff envelope, then mixed."""
    centers = jnp.linspace(0.0, CUTOFF, N_RBF)
    basis = jnp.exp(-4.0 * (r[:, None] - centers) ** 2) * ((1 - (r / CUTOFF) ** 2) ** 2)[:, None]
    return jnp.einsum("ek,kpc->epc", basis, w)


def energy(pos, senders, receivers, broken=None):
    """``E(pos)``; ``broken`` adds a deliberate symmetry violation ("shift" or "chiral")."""
    conv1, conv2, lin, params = model()
    graph = e3j.Graph.from_edges(senders, receivers, N_ATOMS)
    vec = pos[receivers] - pos[senders]
    r = jnp.sqrt(jnp.sum(vec**2, axis=-1))
    sh_in = vec + jnp.array([0.3, 0.0, 0.0]) if broken == "shift" else vec  # not a vector any more
    y = e3j.spherical_harmonics(SH, sh_in, normalize=True)
    h = conv1(params["embed"], y, radial(r, params["w1"]), graph)  # [N, 9, C]
    h = lin(params["lin"], h)
    h = h.at[:, 0].set(jax.nn.silu(h[:, 0]))  # a nonlinearity on the scalars only
    out = conv2(h, y, radial(r, params["w2"]), graph)  # [N, 1 + 3, C]
    scalar_rows = [p.out_start for p in conv2.paths if str(p.ir_out) == "0e"]  # 3 paths: 0⊗0, 1⊗1, 2⊗2
    e = jnp.sum(out[:, jnp.asarray(scalar_rows), :])
    if broken == "chiral":  # a pseudo-scalar: invariant under rotations, odd under parity
        e = e + 0.1 * jnp.sum(jnp.linalg.det(h[:, 1:4, :3]))
    return e


@partial(jax.jit, static_argnames="broken")
def energy_and_forces(pos, senders, receivers, broken=None):
    e, g = jax.value_and_grad(energy)(pos, senders, receivers, broken)
    return e, -g


def positions(seed=6):
    rng = np.random.default_rng(seed)
    while True:  # a connected-enough cloud with no pair within 1e-3 of the cutoff
        pos = rng.uniform(-1.6, 1.6, size=(N_ATOMS, 3))
        d = np.linalg.norm(pos[:, None] - pos[None], axis=-1)[np.triu_indices(N_ATOMS, 1)]
        if d.min() > 0.5 and np.abs(d - CUTOFF).min() > 1e-3:
            return pos


def equivariance_errors(R, broken=None):
    pos = positions()
    senders, receivers = radius_graph(pos, CUTOFF)
    pos_rot = pos @ R.T
    s_rot, r_rot = radius_graph(pos_rot, CUTOFF)
    np.testing.assert_array_equal(s_rot, senders)  # the edge set is a geometric invariant
    np.testing.assert_array_equal(r_rot, receivers)
    assert 2 * len(senders) > 3 * N_ATOMS  # a genuine graph, not a few isolated pairs
    e, f = energy_and_forces(pos, senders, receivers, broken)
    e_rot, f_rot = energy_and_forces(pos_rot, senders, receivers, broken)
    assert np.max(np.abs(f)) > 1e-3  # non-trivial forces
    e_err = abs(float(e_rot) - float(e)) / max(abs(float(e)), 1.0)
    return e_err, rel_err(f_rot, np.asarray(f) @ R.T)


@pytest.mark.parametrize("R", list(MATRICES))
def test_energy_invariance_and_force_equivariance(R):
    e_err, f_err = equivariance_errors(MATRICES[R])
    assert e_err <= TOL
    assert f_err <= TOL


def test_forces_are_minus_energy_gradient():
    """The forces compared above are the real ones: central finite differences agree."""
    pos = positions()
    senders, receivers = radius_graph(pos, CUTOFF)
    _, f = energy_and_forces(pos, senders, receivers)
    h = 1e-5
    for atom, axis in ((0, 0), (3, 1), (7, 2)):
        dp = np.zeros_like(pos)
        dp[atom, axis] = h
        e_plus, _ = energy_and_forces(pos + dp, senders, receivers)
        e_minus, _ = energy_and_forces(pos - dp, senders, receivers)
        fd = -(float(e_plus) - float(e_minus)) / (2 * h)
        assert abs(fd - float(f[atom, axis])) <= 1e-6 * max(1.0, abs(fd))


# -- the checks can fail ---------------------------------------------------------------------------


@pytest.mark.parametrize("R", ["rotation", "improper"])
def test_broken_rotation_equivariance_is_detected(R):
    e_err, f_err = equivariance_errors(MATRICES[R], broken="shift")
    assert e_err > 1e-4 and f_err > 1e-4, (e_err, f_err)


def test_broken_parity_is_detected_only_by_improper_matrices():
    """A pseudo-scalar term is invisible to rotations and caught by every det -1 matrix."""
    e_err, f_err = equivariance_errors(MATRICES["rotation"], broken="chiral")
    assert e_err <= TOL and f_err <= TOL
    for name in ("improper", "inversion", "mirror"):
        e_err, f_err = equivariance_errors(MATRICES[name], broken="chiral")
        assert e_err > 1e-4 and f_err > 1e-4, (name, e_err, f_err)


@pytest.mark.parametrize("R", ["rotation", "improper"])
def test_wrong_representation_is_detected(R):
    """Transforming the output with a wrong D (parity or l swapped) fails the comparison."""
    R = MATRICES[R]
    tp = get_tp()
    z, z_rot = tp_outputs_before_and_after(tp, R)
    wrong = str(tp.irreps_out).replace("1o", "1t").replace("1e", "1o").replace("1t", "1e")  # swap parities
    assert Irreps(wrong).dim == tp.irreps_out.dim
    # a proper rotation ignores parity, so there the swap must go unnoticed; any det -1 matrix catches it
    err = rel_err(z_rot, act(wrong, R, z))
    if np.linalg.det(R) > 0:
        assert err <= TOL
    else:
        assert err > 1e-2
    # an irreps string with the right dimension but wrong l is caught by any matrix
    assert rel_err(z_rot, act(Irreps(f"{tp.irreps_out.dim}x0e"), R, z)) > 1e-2
