"""The e3nn-jax drop-ins on random irreps, against e3nn-jax itself (float64, values and gradients).

Each case is drawn from its own seed: mixed and zero multiplicities, unsorted and repeated irreps,
edge attributes with multiplicities above 1, filters, self connections, normalizations, leading
shapes that broadcast. The tests session runs a few seeds per drop-in; ``nox -s slow`` runs many more.
Values are computed eagerly (the path a notebook takes); gradients under ``jit``, where each
side's hundreds of small operations compile as one program instead of one by one (~4x faster).
Where e3nn-jax refuses a case (it raises), the drop-in must raise too, never return. The one
e3nn-jax crash the drop-ins compute through instead, a zero multiplicity that a legacy instruction
reads, is left out of the draws here and tested in test_functional.py.
"""

from __future__ import annotations

import random

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from e3nn_jax.legacy import FunctionalTensorProduct

from e3j import interop

FAST_SEEDS = range(6)
SLOW_SEEDS = [pytest.param(seed, marks=pytest.mark.slow) for seed in range(6, 36)]
SEEDS = [*FAST_SEEDS, *SLOW_SEEDS]
N, E = 5, 13


def random_irreps(rng: random.Random, max_l: int, max_mul: int, count: int, min_mul: int = 0) -> e3nn.Irreps:
    return e3nn.Irreps(
        "+".join(f"{rng.randint(min_mul, max_mul)}x{rng.randint(0, max_l)}{rng.choice('eo')}" for _ in range(count))
    )


def random_filter(rng: random.Random, max_count: int) -> list[e3nn.Irrep]:
    return [e3nn.Irrep(rng.randint(0, 3), rng.choice((1, -1))) for _ in range(rng.randint(1, max_count))]


def random_array(irreps: e3nn.Irreps, shape: tuple[int, ...], seed: int) -> e3nn.IrrepsArray:
    return e3nn.IrrepsArray(irreps, jax.random.normal(jax.random.key(seed), (*shape, irreps.dim), jnp.float64))


def random_graph(rng: random.Random) -> tuple[np.ndarray, np.ndarray]:
    return np.array([rng.randrange(N) for _ in range(E)]), np.array([rng.randrange(N) for _ in range(E)])


def spherical_harmonics_irreps(rng: random.Random) -> e3nn.Irreps:
    ls = sorted(rng.sample(range(4), rng.randint(1, 3)))
    return e3nn.Irreps([(1, (l, (-1) ** l)) for l in ls])


def assert_close(ours, ref, atol):
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=atol)


@pytest.mark.parametrize("seed", SEEDS)
def test_tensor_product_equals_e3nn(seed):
    rng = random.Random(seed)
    irreps_x = random_irreps(rng, 3, 4, rng.randint(1, 4))
    irreps_y = random_irreps(rng, 3, 2, rng.randint(1, 3))
    kw = dict(
        filter_ir_out=None if rng.random() < 0.4 else random_filter(rng, 3),
        regroup_output=rng.random() < 0.5,
        irrep_normalization=rng.choice([None, "component", "norm"]),
    )
    shape_x, shape_y = rng.choice([((3,), (3,)), ((3,), ()), ((2, 1), (2, 3)), ((), (1,))])
    x, y = random_array(irreps_x, shape_x, seed), random_array(irreps_y, shape_y, 1000 + seed)
    try:
        ref = e3nn.tensor_product(x, y, **kw)
    except Exception as err:  # e3nn-jax refuses: so must the drop-in
        with pytest.raises(type(err)):
            interop.tensor_product(x, y, **kw)
        return
    out = interop.tensor_product(x, y, **kw)
    assert out.irreps == ref.irreps
    if ref.irreps.dim == 0:  # zero multiplicities that leave no output (fast seeds 2 and 4): empty alike
        assert out.shape == ref.shape
        return
    assert float(jnp.abs(ref.array).max()) > 0  # not zeros compared with zeros
    assert_close(out.array, ref.array, 1e-12)
    cot = jax.random.normal(jax.random.key(2000 + seed), ref.shape, jnp.float64)

    def loss(f, a, b):
        return jnp.sum(f(e3nn.IrrepsArray(irreps_x, a), e3nn.IrrepsArray(irreps_y, b), **kw).array * cot)

    grads = jax.jit(jax.grad(lambda a, b: loss(interop.tensor_product, a, b), (0, 1)))(x.array, y.array)
    want = jax.jit(jax.grad(lambda a, b: loss(e3nn.tensor_product, a, b), (0, 1)))(x.array, y.array)
    for g, r in zip(grads, want):
        assert_close(g, r, 1e-11)


def e3nn_message_passing(x, y, w, senders, receivers, filter_ir_out, self_connection):
    m = x[senders]
    tp = e3nn.tensor_product(m, y, filter_ir_out=filter_ir_out)
    m = tp if self_connection is None else e3nn.concatenate([m.filter(self_connection), tp]).regroup()
    return e3nn.scatter_sum(m * w, dst=receivers, output_size=N)


@pytest.mark.parametrize("seed", SEEDS)
def test_message_passing_equals_e3nn(seed):
    rng = random.Random(seed)
    irreps_x = random_irreps(rng, 3, 5, rng.randint(1, 4))
    # mostly spherical harmonics; sometimes any edge irreps (multiplicities 1-2)
    irreps_y = spherical_harmonics_irreps(rng) if rng.random() < 0.7 else random_irreps(rng, 2, 2, 2, min_mul=1)
    filter_ir_out = None if rng.random() < 0.4 else random_filter(rng, 4)
    self_connection = None if rng.random() < 0.5 else random_filter(rng, 3)
    senders, receivers = random_graph(rng)
    x, y = random_array(irreps_x, (N,), seed), random_array(irreps_y, (E,), 1000 + seed)

    def ref_messages_irreps():
        m = random_array(irreps_x, (1,), 0)
        tp = e3nn.tensor_product(m, random_array(irreps_y, (1,), 0), filter_ir_out=filter_ir_out)
        return tp.irreps if self_connection is None else e3nn.concatenate([m.filter(self_connection), tp]).irreps

    try:
        mp = interop.MessagePassing(irreps_x, irreps_y, filter_ir_out, self_connection=self_connection)
    except ValueError as err:
        # refused only where the e3nn-jax pattern has no message to weigh (its `m * w` then fails)
        assert "no path" in str(err) or "no output irrep" in str(err), err
        assert ref_messages_irreps().dim == 0
        return
    w = jax.random.normal(jax.random.key(2000 + seed), (E, mp.num_weights), jnp.float64)
    ref = e3nn_message_passing(x, y, w, senders, receivers, filter_ir_out, self_connection)
    out = mp(x, y, w, senders, receivers)
    assert out.irreps == ref.irreps and mp.num_weights == ref.irreps.num_irreps
    assert_close(out.array, ref.array, 1e-11)
    gcd = interop.MessagePassing(irreps_x, irreps_y, filter_ir_out, self_connection=self_connection, grouping="gcd")
    assert_close(gcd(x, y, w, senders, receivers).array, ref.array, 1e-11)
    cot = jax.random.normal(jax.random.key(3000 + seed), ref.shape, jnp.float64)

    def ours(a, b, c):
        xa, yb = e3nn.IrrepsArray(irreps_x, a), e3nn.IrrepsArray(irreps_y, b)
        return jnp.sum(mp(xa, yb, c, senders, receivers).array * cot)

    def theirs(a, b, c):
        xa, yb = e3nn.IrrepsArray(irreps_x, a), e3nn.IrrepsArray(irreps_y, b)
        return jnp.sum(e3nn_message_passing(xa, yb, c, senders, receivers, filter_ir_out, self_connection).array * cot)

    args = (x.array, y.array, w)
    for g, r in zip(jax.jit(jax.grad(ours, (0, 1, 2)))(*args), jax.jit(jax.grad(theirs, (0, 1, 2)))(*args)):
        assert_close(g, r, 1e-10)


def random_uvu_product(rng: random.Random) -> FunctionalTensorProduct:
    """A ``uvu`` FunctionalTensorProduct: random instructions, some sharing an output slot, one slot unreached."""
    # e3nn-jax's left_right cannot run a zero multiplicity in irreps_in1: none here
    irreps_x = random_irreps(rng, 3, 5, rng.randint(1, 4), min_mul=1)
    irreps_y = e3nn.Irreps([(1, (rng.randint(0, 3), rng.choice((1, -1)))) for _ in range(rng.randint(1, 3))])
    instructions, irreps_out = [], []
    for i1, (mul, ir1) in enumerate(irreps_x):
        for i2, (_, ir2) in enumerate(irreps_y):
            for ir in ir1 * ir2:
                if rng.random() < 0.4:
                    continue
                same = [k for k, (m, r) in enumerate(irreps_out) if (m, r) == (mul, ir)]
                if same and rng.random() < 0.3:
                    instructions.append((i1, i2, rng.choice(same), "uvu", True))
                else:
                    instructions.append((i1, i2, len(irreps_out), "uvu", True, rng.choice([1.0, 0.5])))
                    irreps_out.append((mul, ir))
    if not instructions:  # at least one path
        (mul, ir1), (_, ir2) = irreps_x[0], irreps_y[0]
        instructions.append((0, 0, len(irreps_out), "uvu", True))
        irreps_out.append((mul, next(iter(ir1 * ir2))))
    irreps_out.append((rng.randint(1, 3), e3nn.Irrep("1e")))  # a slot no instruction reaches: zeros
    kw = rng.choice([{}, {"path_normalization": "path"}, {"irrep_normalization": "norm"},
                     {"gradient_normalization": "element"}])  # fmt: skip
    return FunctionalTensorProduct(irreps_x, irreps_y, irreps_out, instructions, **kw)


@pytest.mark.parametrize("seed", SEEDS)
def test_functional_message_passing_equals_e3nn(seed):
    rng = random.Random(seed)
    tp = random_uvu_product(rng)
    senders, receivers = random_graph(rng)
    fmp = interop.FunctionalMessagePassing(tp)
    x = random_array(tp.irreps_in1, (N,), seed)
    y = random_array(tp.irreps_in2, (E,), 1000 + seed)
    w = jax.random.normal(jax.random.key(2000 + seed), (E, fmp.num_weights), jnp.float64)
    cot = jax.random.normal(jax.random.key(3000 + seed), (N, tp.irreps_out.dim), jnp.float64)

    def ref(a, b, c):
        m = jax.vmap(tp.left_right)(c, e3nn.IrrepsArray(tp.irreps_in1, a)[senders], e3nn.IrrepsArray(tp.irreps_in2, b))
        return e3nn.scatter_sum(m, dst=receivers, output_size=N).array

    def ours(a, b, c):
        xa, yb = e3nn.IrrepsArray(tp.irreps_in1, a), e3nn.IrrepsArray(tp.irreps_in2, b)
        out = fmp(xa, yb, c, senders, receivers)
        assert out.irreps == tp.irreps_out
        return out.array

    args = (x.array, y.array, w)
    assert_close(ours(*args), ref(*args), 1e-11)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(ours(*a) * cot), (0, 1, 2)))(*args)
    want = jax.jit(jax.grad(lambda *a: jnp.sum(ref(*a) * cot), (0, 1, 2)))(*args)
    for g, r in zip(grads, want):
        assert_close(g, r, 1e-10)
