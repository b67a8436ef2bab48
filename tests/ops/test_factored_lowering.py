"""The factored convolutions' ``L`` calls on a backend without factored kernels, lowered whole.

There (GPU, TPU, plugins: here the ``test`` plugin, the reference's kernels without the factored
ones) an ``L`` call multiplies the weights ``h @ k`` out once, runs one array evaluation per tangent
slot and forms the cotangents of ``h`` and ``k`` from the evaluations' summed weight cotangent
(``multilinear.multiplied_out``). Oracle: the reference backend, whose factored kernels evaluate the
same call one ``M`` at a time (``factored_evaluations``), float64, over every ``L`` call the rules
can form from these slots (tangents, outputs, and the operand slots they leave out), for the
uniform form (``e3j.Convolution``) and the grouped one (``e3j.MulIrConvolution``).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from installed import require_backend

import e3j
from e3j._primitives.convolution import CONVOLUTION_FACTORED, FactoredConvSpec
from e3j._primitives.grouped_convolution import GROUPED_CONVOLUTION_FACTORED, GroupedConvSpec

SLOTS = ("x", "y", "h", "k", "m")
N, E, C, H = 5, 17, 3, 11


def l_calls(outs_choices, tangent_choices) -> list[tuple[tuple, tuple, tuple]]:
    """``(q_slots, t_slots, outs)`` of every well-formed ``L`` call: each output ``j`` and tangent
    ``t != j`` must leave every slot but ``j`` in ``Q`` or ``t``; ``Q`` leaves out at most one slot,
    an output (the slot a transpose is taken for)."""
    calls = []
    for outs in outs_choices:
        for missing in (None, *outs):
            q = tuple(s for s in SLOTS if s != missing)
            for t in tangent_choices:
                ok = all(set(SLOTS) - {j} <= set(q) | {u} for j in outs for u in t if u != j)
                if ok and any(u != j for j in outs for u in t):
                    calls.append((q, t, outs))
    return calls


def subsets(items, sizes):
    return [c for n in sizes for c in itertools.combinations(items, n)]


def representative(calls, per_kind: int, seed: int) -> list:
    """``per_kind`` calls of each kind (which factors the tangents hold, which the outputs, whether
    ``Q`` leaves a slot out: every branch of ``multiplied_out``), drawn with a fixed seed."""
    kinds: dict = {}
    for i in np.random.default_rng(seed).permutation(len(calls)):
        q, t, outs = calls[i]
        kind = (frozenset(t) & {"h", "k"}, frozenset(outs) & {"h", "k"}, len(q) < len(SLOTS))
        kinds.setdefault(kind, []).append(calls[i])
    return [c for _, cs in sorted(kinds.items(), key=str) for c in cs[:per_kind]]


ALL_UNIFORM_CALLS = l_calls(subsets(SLOTS, (1, 2, 3)), subsets(SLOTS, (1, 2, 3)))
# the grouped form: the calls whose outputs or tangents hold a factor
ALL_GROUPED_CALLS = [c for c in l_calls(subsets(SLOTS, (1, 2)), subsets(SLOTS, (1, 2))) if {"h", "k"} & {*c[1], *c[2]}]


def values(shapes: dict, seed: int) -> dict:
    keys = jax.random.split(jax.random.key(seed), len(shapes))
    return {s: jax.random.normal(key, shape, jnp.float64) for key, (s, shape) in zip(keys, shapes.items())}


def run_calls(primitive, spec, shapes, leaves, calls, backend):
    """Every call's outputs, in one jitted program (one compilation for all of them)."""
    Q, T = values(shapes, 0), values(shapes, 1)

    def program(Q, T, leaves):
        out = []
        for q, t, outs in calls:
            res = primitive.bind_L(spec, {s: Q[s] for s in q}, {s: T[s] for s in t}, leaves, outs, backend)
            out.append([res[j] for j in outs])
        return out

    return jax.jit(program)(Q, T, leaves)


def assert_calls_agree(primitive, spec, shapes, leaves, calls):
    ours = run_calls(primitive, spec, shapes, leaves, calls, "test")
    oracle = run_calls(primitive, spec, shapes, leaves, calls, "reference")
    for call, a, b in zip(calls, ours, oracle, strict=True):
        for j, u, v in zip(call[2], a, b, strict=True):
            assert u.shape == v.shape, (call, j)
            np.testing.assert_allclose(u, v, rtol=1e-11, atol=1e-11 * (1 + float(jnp.abs(v).max())), err_msg=str(call))


def uniform_case():
    conv = e3j.Convolution("0e + 1o + 2e", "0e + 1o", "0e + 1o + 2e")
    rng = np.random.default_rng(3)
    graph = e3j.Graph.from_edges(rng.integers(0, N, E), rng.integers(0, N, E), N)
    leaves, tree = jax.tree.flatten(graph)
    coo, P = conv.coo, conv.num_paths
    shapes = {"x": (N, coo.dim_x, C), "y": (E, coo.dim_y), "h": (E, H), "k": (H, P, C), "m": (N, coo.dim_out, C)}
    return FactoredConvSpec(coo, y_channels=False, graph_tree=tree), shapes, leaves


@pytest.mark.parametrize(
    "calls",
    [
        pytest.param(representative(ALL_UNIFORM_CALLS, 2, 0), id="each-kind"),
        pytest.param(ALL_UNIFORM_CALLS, id="all", marks=pytest.mark.slow),
    ],
)
def test_l_calls_of_the_uniform_form_equal_the_factored_kernels(calls):
    require_backend("test")
    spec, shapes, leaves = uniform_case()
    assert len(ALL_UNIFORM_CALLS) == 830 and len(representative(ALL_UNIFORM_CALLS, 2, 0)) > 40
    assert_calls_agree(CONVOLUTION_FACTORED, spec, shapes, leaves, calls)


@pytest.mark.parametrize(
    "calls",
    [
        pytest.param(representative(ALL_GROUPED_CALLS, 1, 1), id="each-kind"),
        pytest.param(ALL_GROUPED_CALLS, id="all", marks=pytest.mark.slow),
    ],
)
def test_l_calls_of_the_grouped_form_equal_the_factored_kernels(calls):
    require_backend("test")
    conv = e3j.MulIrConvolution("4x0e + 2x1o + 1x2e", "0e + 1o", "0e + 1o + 2e")
    rng = np.random.default_rng(4)
    graph = e3j.Graph.from_edges(rng.integers(0, N, E), rng.integers(0, N, E), N)
    leaves, tree = jax.tree.flatten(graph)
    plan = conv.plan
    assert len(plan.groups) == 3 and plan.in_place
    shapes = {
        "x": (N, plan.irreps_x.dim),
        "y": (E, plan.groups[0].coo.dim_y),
        "h": (E, H),
        "k": (H, plan.num_weights),
        "m": (N, plan.irreps_out.dim),
    }
    assert_calls_agree(GROUPED_CONVOLUTION_FACTORED, GroupedConvSpec(plan, graph_tree=tree), shapes, leaves, calls)


def test_a_force_training_call_forms_one_product_of_each_kind():
    """The second-order call of a forces loss differentiated with respect to the parameters
    (``Q = x, y, h, k, m``, tangents ``x, y, h``, outputs ``x, h, k``): one product for the weights,
    one for their tangent, one for ``dh``, two for ``dk`` (``h^T ds + ḣ^T ds_Q``), and three
    backward sweeps, one per tangent slot. One evaluation at a time it took eight products."""
    require_backend("test")
    import e3j_test_backend

    spec, shapes, leaves = uniform_case()
    Q, T = values(shapes, 0), values(shapes, 1)

    def program(Q, T, leaves):
        return CONVOLUTION_FACTORED.bind_L(spec, Q, {s: T[s] for s in ("x", "y", "h")}, leaves, ("x", "h", "k"), "test")

    e3j_test_backend.calls.clear()
    text = jax.jit(program).lower(Q, T, leaves).as_text()
    assert e3j_test_backend.calls == ["convolution_bwd"] * 3
    # the factors' products: an [E, H] or [H, E] operand or result (H is no other axis's size)
    factors = (f"tensor<{E}x{H}xf64>", f"tensor<{H}x{E}xf64>")
    products = [line for line in text.splitlines() if "dot_general" in line and any(f in line for f in factors)]
    assert len(products) == 5, "\n".join(products)
