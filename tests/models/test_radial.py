"""Radial basis (e3j_models.radial) against the direct formula in float64 numpy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from e3j_models import bessel_basis, polynomial_envelope, radial_embedding

CUTOFF, P = 4.0, 6


def _direct(r: np.ndarray, n: int) -> np.ndarray:
    """float64: sqrt(2/rc) sin(k π r / rc) / r · envelope(r), k = 1 … n (the module docstring's formula)."""
    k = np.arange(1, n + 1)
    bessel = math.sqrt(2 / CUTOFF) * np.sin(k * math.pi * r[:, None] / CUTOFF) / r[:, None]
    x = r / CUTOFF
    env = 1 - (P + 1) * (P + 2) / 2 * x**P + P * (P + 2) * x ** (P + 1) - P * (P + 1) / 2 * x ** (P + 2)
    return bessel * np.where(x < 1, env, 0)[:, None]


def _direct_grad(r: np.ndarray, n: int, ct: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central finite differences of ``Σ ct · direct(r)`` per element (float64)."""
    return np.sum(ct * (_direct(r + h, n) - _direct(r - h, n)), axis=1) / (2 * h)


@pytest.mark.parametrize("num_basis", [1, 8, 16])
def test_radial_embedding_matches_direct_formula_float32(num_basis):
    rng = np.random.default_rng(num_basis)
    r = rng.uniform(0.3, 4.5, 512)  # some beyond the cutoff
    mask = rng.uniform(size=r.size) < 0.9
    ct = rng.normal(size=(r.size, num_basis))
    want = np.where(mask[:, None], _direct(r, num_basis), 0)
    want_grad = np.where(mask, _direct_grad(r, num_basis, ct), 0)

    def f(r_):
        return radial_embedding(r_, num_basis, CUTOFF, P, jnp.asarray(mask))

    out, vjp = jax.vjp(f, jnp.asarray(r, jnp.float32))
    (grad,) = vjp(jnp.asarray(ct, jnp.float32))
    scale = np.max(np.abs(want))
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=0, atol=2e-6 * scale)
    gscale = np.max(np.abs(want_grad))
    np.testing.assert_allclose(np.asarray(grad, np.float64), want_grad, rtol=0, atol=2e-5 * gscale)
    assert np.all(np.asarray(out)[~mask] == 0) and np.all(np.asarray(grad)[~mask] == 0)


def test_bessel_basis_matches_direct_sines_float64():
    r = np.linspace(0.1, 6.0, 300)
    k = np.arange(1, 13)
    want = math.sqrt(2 / CUTOFF) * np.sin(k * math.pi * r[:, None] / CUTOFF) / r[:, None]
    with jax.enable_x64(True):
        got = np.asarray(bessel_basis(jnp.asarray(r, jnp.float64), 12, CUTOFF))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)


def test_radial_embedding_masked_rows_have_zero_gradient_at_zero_length():
    r = jnp.array([0.0, 1.0, 2.0], jnp.float32)
    grad = jax.grad(lambda r_: jnp.sum(radial_embedding(r_, 8, CUTOFF, P)))(r)
    assert np.isfinite(np.asarray(grad)).all() and float(grad[0]) == 0.0


@pytest.mark.parametrize("p", [1, 2, 6, 8])
def test_envelope_is_twice_differentiable_at_the_cutoff(p):
    """Value, first and second derivatives reach 0 at the cutoff from below (so forces and their
    derivatives are continuous there); the third jumps, whatever ``p`` (``(p+1)p(p+2)``·… ≠ 0)."""
    with jax.enable_x64(True):
        env = lambda r: polynomial_envelope(r, CUTOFF, p)  # noqa: E731
        derivatives = [env]
        for _ in range(3):
            derivatives.append(jax.grad(derivatives[-1]))
        below = jnp.float64(CUTOFF * (1 - 1e-9))
        values = [float(d(below)) for d in derivatives]
        assert all(abs(v) < 1e-6 for v in values[:3]), values
        # the third derivative at the cutoff: -p(p+1)(p+2) / rc^3
        np.testing.assert_allclose(values[3], -p * (p + 1) * (p + 2) / CUTOFF**3, rtol=1e-5)
        assert [float(d(jnp.float64(CUTOFF * 1.5))) for d in derivatives] == [0.0] * 4
