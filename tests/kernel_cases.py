"""Conformance cases shared by the kernel backends' tests (Pallas GPU, Pallas TPU, CUDA).

Every kernel backend must agree with the reference backend on the same cases: tensor products and
convolutions for lmax 1–3 and channel counts 16–512, broadcast and per-channel ``y``, and graphs
with isolated nodes, a high-valency node, padding edges and unsorted edges. Expected values come
from the reference kernels evaluated in float64 on the same (float32-representable) inputs.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import e3j
from e3j.reference import convolution as ref_conv
from e3j.reference import tensor_product as ref_tp
from e3j_core import tensor_product_coo

IRREPS = {1: "0e + 1o", 2: "0e + 1o + 2e", 3: "0e + 1o + 2e + 3o"}

# Tables with degrees up to 6 in inputs and outputs, both above the Pallas kernels' unroll limit (their
# records are walked): ``name: (irreps_x, irreps_y, filter)``. Their reference results are checked
# against e3nn-jax (forward and VJP) before any backend is compared with them.
HIGH_L = {
    # issue 18's: outputs up to l = 5; 1297 records, 320 output rows, 58 paths
    "l5": ("2x0e + 1x0o + 2x1e + 2x2o + 1x3e + 2x3o", "1x1o + 1x2o", None),
    # l = 6 in both inputs and the output; 407 records
    "l6": ("1o + 6e", "1o + 6e", "0e + 1e + 6e + 6o"),
}


@dataclass(frozen=True)
class Case:
    lmax: int
    channels: int
    rows: int  # batch (TP) or nodes (convolution)
    y_channels: bool
    dtype: str = "float32"
    mul: int = 1
    table: str | None = None  # a key of HIGH_L (then lmax is only a label)

    @property
    def coo(self):
        if self.table is not None:
            irreps_x, irreps_y, filter = HIGH_L[self.table]
            return tensor_product_coo(irreps_x, irreps_y, filter=filter)
        ir = IRREPS[self.lmax]
        x = " + ".join(f"{self.mul}x{t.strip()}" for t in ir.split("+")) if self.mul > 1 else ir
        return tensor_product_coo(x, ir, filter=ir)

    def __str__(self) -> str:
        y = "yC" if self.y_channels else "y"
        name = self.table or f"l{self.lmax}"
        return f"{name}-C{self.channels}-R{self.rows}-{y}-{self.dtype}" + (f"-mul{self.mul}" if self.mul > 1 else "")


TP_CASES = [
    Case(1, 16, 37, False),
    Case(1, 512, 3, True),
    Case(2, 32, 9, True, mul=2),
    Case(2, 64, 5, False, dtype="float64"),
    Case(3, 128, 6, False),
    Case(3, 16, 11, True),
]

# Channel counts that are not multiples of 4 (the CUDA kernels' float2 and scalar lanes), that leave a
# block's last lanes idle (300 = 256 + 44), or whose largest power-of-two factor is small (Pallas GPU
# channel blocks of 1, 2 and 4): tensor product and convolution, forward and backward.
ODD_CHANNEL_CASES = [
    Case(2, 1, 5, False),
    Case(1, 3, 6, True),
    Case(2, 6, 4, True, dtype="float64"),
    Case(2, 20, 5, False),
    Case(2, 300, 3, True),
    Case(1, 300, 4, False),
]

# HIGH_L's tables, tensor product and convolution, on few channels and tiny graphs (interpreters are slow:
# the Pallas interpreters run the second one only in the slow session)
HIGH_L_CASES = [
    Case(6, 4, 3, True, table="l6"),
    Case(5, 2, 3, False, dtype="float64", table="l5"),
]

CONV_CASES = [
    Case(1, 16, 12, False),
    Case(2, 64, 9, True, mul=2),
    Case(2, 32, 10, False, dtype="float64"),
    Case(3, 256, 7, False),
    Case(3, 16, 8, True),
]


def interpreted_conv_cases(cases: list[Case]) -> list:
    """``cases`` as a kernel interpreter's tests parametrize them: the lmax-3 convolutions (256
    channels in two lane blocks; 16 channels with ``y`` per channel), 40-90 s each in an interpreter,
    run in the slow session. The tests session keeps lmax 3 in the tensor products, the convolution's
    unrolled tables at lmax 1-2 (per-channel ``y`` at lmax 2) and its walked tables at l = 6."""
    return [pytest.param(c, marks=pytest.mark.slow) if c.lmax == 3 and c.table is None else c for c in cases]


@dataclass(frozen=True)
class LaunchCase:
    """A table and size where a kernel's launch configuration must adapt (shared memory runs short)."""

    kind: str  # "lmax3", "lmax3-unfiltered", "mul8" or "y-lmax21"
    channels: int
    dtype: str
    y_channels: bool

    @property
    def coo(self):
        if self.kind == "lmax3":  # 99 output rows
            return tensor_product_coo(IRREPS[3], IRREPS[3], filter=IRREPS[3])
        if self.kind == "lmax3-unfiltered":  # 256 output rows: int32 records
            return tensor_product_coo(IRREPS[3], IRREPS[3])
        if self.kind == "mul8":  # x of 128 rows to stage
            return tensor_product_coo(" + ".join(f"8x{ir.strip()}" for ir in IRREPS[3].split("+")), IRREPS[3])
        assert self.kind == "y-lmax21", self.kind  # a broadcast y of 484 rows, reduced over lanes
        return tensor_product_coo("0e + 1o", " + ".join(f"1x{lv}{'eo'[lv % 2]}" for lv in range(22)))

    def __str__(self) -> str:
        return f"{self.kind}-C{self.channels}-{'yC' if self.y_channels else 'y'}-{self.dtype}"


# The paper's channel counts up to 1024 at lmax 3, float64, many staged rows, a long broadcast y:
# each must launch within the device's limits (sm_90's in the CUDA emulation) and agree with the reference.
LAUNCH_CASES = [
    LaunchCase("lmax3", 1024, "float32", False),
    LaunchCase("lmax3", 1024, "float64", True),
    LaunchCase("lmax3-unfiltered", 512, "float64", False),
    LaunchCase("mul8", 256, "float64", True),
    LaunchCase("y-lmax21", 256, "float64", False),
]


def _rand(rng, shape, dtype):
    # float32-representable values, so the float64 reference sees exactly the kernel's inputs
    return np.asarray(rng.normal(size=shape).astype(np.float32), dtype)


def tp_operands(case: Case, seed: int = 0):
    coo, rng = case.coo, np.random.default_rng(seed)
    b, c = case.rows, case.channels
    x = _rand(rng, (b, coo.dim_x, c), case.dtype)
    y = _rand(rng, (b, coo.dim_y, c) if case.y_channels else (b, coo.dim_y), case.dtype)
    dz = _rand(rng, (b, coo.dim_out, c), case.dtype)
    return coo, x, y, dz


def hard_graph(num_nodes: int, seed: int = 0, *, degree: int = 4) -> e3j.Graph:
    """A directed, unsorted graph with a high-valency receiver, isolated nodes and padding edges.

    Node ``num_nodes - 1`` is isolated (no edge in or out); node 1 receives from every node but the
    isolated one; edges are shuffled; one in seven is padding (masked, indices pointing anywhere).
    Receivers' edge runs are long and uneven, so they straddle any tile boundary.
    """
    rng = np.random.default_rng(seed)
    n = num_nodes - 1  # the last node stays isolated
    snd = list(rng.integers(0, n, degree * n))
    rcv = list(rng.integers(0, n, degree * n))
    snd += list(range(n))
    rcv += [1] * n
    perm = rng.permutation(len(snd))
    snd, rcv = np.array(snd)[perm], np.array(rcv)[perm]
    mask = np.arange(len(snd)) % 7 != 3
    snd = np.where(mask, snd, num_nodes + 5)  # padding edges may hold any index
    return e3j.Graph.from_edges(snd, rcv, num_nodes, edge_mask=mask)


def conv_operands(case: Case, seed: int = 0):
    coo, rng = case.coo, np.random.default_rng(seed)
    graph = hard_graph(case.rows, seed)
    n, e, c = case.rows, graph.num_edges, case.channels
    x = _rand(rng, (n, coo.dim_x, c), case.dtype)
    y = _rand(rng, (e, coo.dim_y, c) if case.y_channels else (e, coo.dim_y), case.dtype)
    s = _rand(rng, (e, coo.num_paths, c), case.dtype)
    dm = _rand(rng, (n, coo.dim_out, c), case.dtype)
    return coo, graph, x, y, s, dm


#: Mixed multiplicities (groups of 4, 2 and 1 channels) with a self connection: the grouped kernels' case.
GROUPED = e3j.MulIrConvolution("4x0e + 2x1o + 1x2e + 2x1e", "0e + 1o + 2e", "0e + 1o + 2e", self_connection="0e + 1o")
#: Every group's weight windows 16-byte aligned and a power-of-two multiplicity >= 16: what Mosaic
#: GPU's TMA reads (and writes) in place (``mosaic_convolution.reads_in_place``); GROUPED has none.
GROUPED_ALIGNED = e3j.MulIrConvolution("16x0e + 32x1o", "0e + 1o", "0e + 1o + 2e")
#: One group aligned (32 channels), the others not (16 channels at an unaligned column, 2 channels).
GROUPED_PART_ALIGNED = e3j.MulIrConvolution("32x0e + 16x1o + 2x2e + 2x2o", "0e + 1o", "0e + 1o + 1e")
#: A group of several-row Mosaic tiles (16 channels), which Mosaic's grouped kernels run on the
#: Triton kernels (``mosaic_convolution.on_triton``), then one of one-row tiles (128 channels) read in place.
GROUPED_HYBRID = e3j.MulIrConvolution("16x0e + 128x1o", "0e + 1o", "0e + 1o")
#: The same two kinds of group, Mosaic's first: the Triton launch writes into its buffer.
GROUPED_MOSAIC_FIRST = e3j.MulIrConvolution("128x0e + 16x1o", "0e + 1o", "0e + 1o")


def grouped_operands(dtype, seed: int = 0, num_nodes: int = 7, op: e3j.MulIrConvolution = GROUPED):
    """``(plan, graph, x, y, s, dm)`` of ``op`` in e3nn's flat layouts, on :func:`hard_graph`."""
    plan, rng = op.plan, np.random.default_rng(seed)
    graph = hard_graph(num_nodes, seed)
    n, e = num_nodes, graph.num_edges
    x = _rand(rng, (n, plan.irreps_x.dim), dtype)
    y = _rand(rng, (e, plan.groups[0].coo.dim_y), dtype)
    s = _rand(rng, (e, plan.num_weights), dtype)
    dm = _rand(rng, (n, plan.irreps_out.dim), dtype)
    return plan, graph, x, y, s, dm


ALL_OUTS = (("x", "y", "s"), ("x",), ("y",), ("s",))


def check_grouped_convolution(kernels: e3j.Kernels, dtype, outs_sets=ALL_OUTS, op=GROUPED) -> None:
    """A backend's grouped kernels against the reference's (float64), for each set of cotangents:
    e3nn's weights read in place, and every column of their cotangent written, padding edges' zero."""
    ref = e3j.backends.kernels_of(e3j.backends.get_backend("reference"))
    plan, graph, x, y, s, dm = grouped_operands(dtype, op=op)
    want = ref.grouped_convolution(plan, *_f64(x, y, s), graph)
    assert_close(kernels.grouped_convolution(plan, x, y, s, graph), want, dtype, "grouped m")
    padding = ~np.asarray(graph.edge_mask)
    assert padding.any()
    for outs in outs_sets:
        reads = e3j.contract.needed("convolution", outs)
        ops = [a if k in reads else None for k, a in zip("xys", (x, y, s))]
        got = kernels.grouped_convolution_bwd(plan, *ops, dm, graph, outs=outs)
        want = ref.grouped_convolution_bwd(plan, *_f64(*ops, dm), graph, outs=outs)
        assert sorted(got) == sorted(outs), (sorted(got), outs)
        for o in outs:
            assert_close(got[o], want[o], dtype, f"grouped d{o} of {outs}")
            if o != "x":
                assert not np.any(np.asarray(got[o])[padding]), f"grouped d{o}: padding edges' rows"


def check_grouped_lowering(
    lower,
    backend: str,
    call: str,
    op=GROUPED,
    aliases: int | None = None,
    factored: bool = False,
    launches: dict[str, int] | None = None,
) -> None:
    """The value and gradient of ``op`` on ``backend``, lowered by ``lower(fn, *args) -> text``: a
    forward and a backward launch (custom call ``call``) per group (``launches``: the count of each
    custom call instead, where groups run on different kernels), the weights' cotangent aliased
    from one launch to the next (``aliases`` of them: by default every launch but the first), and no
    group's ``[E, P_g, C_g]`` copy of the weights in the program. With ``factored``, the weights are
    ``e3j.FactoredWeights(h, k)`` (gradients with respect to both): the same launches, on the
    weights multiplied out once, before the call (a backend without factored kernels: the array's
    route, the weights kept for the backward)."""
    plan, graph, x, y, s, _ = grouped_operands("float32", op=op)
    if plan.constant_row:
        y = y[:, 1:]  # the op prepends the self connection's constant column itself
    if factored:
        h, k = s[:, :3], s[:3]  # [E, 3] and [3, num_weights]

        def loss(x, y, h, k, g):
            return jnp.sum(jnp.sin(op(x, y, e3j.FactoredWeights(h, k), g, backend=backend)))

        text = lower(jax.grad(loss, argnums=(0, 1, 2, 3)), x, y, h, k, graph)
        products = [line for line in text.splitlines() if "dot_general" in line]
        assert sum(f"-> tensor<{s.shape[0]}x{plan.num_weights}xf32>" in line for line in products) == 1, products
    else:

        def loss(x, y, s, g):
            return jnp.sum(jnp.sin(op(x, y, s, g, backend=backend)))

        text = lower(jax.grad(loss, argnums=(0, 1, 2)), x, y, s, graph)
    for name, count in (launches or {call: 2 * len(plan.groups)}).items():
        assert text.count(name) == count, (name, text.count(name), count)
    assert sum(text.count(name) for name in (launches or {call: 0})) == 2 * len(plan.groups) >= 4
    assert text.count("output_operand_aliases") == (len(plan.groups) - 1 if aliases is None else aliases)
    for g in plan.groups:
        assert f"tensor<{s.shape[0]}x{g.coo.num_paths}x{g.channels}xf32>" not in text


def _f64(*arrays):
    return [None if a is None else jnp.asarray(a, jnp.float64) for a in arrays]


def assert_close(got, want, dtype, what: str) -> None:
    """Normwise relative error ≤ 1e-5 (float32) or 1e-12 (float64), and the same shape."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == np.dtype(dtype), f"{what}: dtype {got.dtype} != {dtype}"
    tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-12
    scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-30)
    err = float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0))
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:g} x max|want| = {tol * scale:.3g}"


def _e3nn_tensor_product(coo, x, y, y_channels: bool):
    """``x ⊗ y`` by e3nn-jax on e3j's ``[B, D, C]`` layouts (channel by channel), float64."""
    import e3nn_jax as e3nn

    filter = None if coo.filter is None else [str(ir) for ir in coo.filter]

    def one_channel(x, y):
        z = e3nn.tensor_product(
            e3nn.IrrepsArray(str(coo.irreps_x), x), e3nn.IrrepsArray(str(coo.irreps_y), y), filter_ir_out=filter
        )
        assert str(z.irreps) == str(coo.irreps_out), (z.irreps, coo.irreps_out)
        return z.array

    return jax.vmap(one_channel, in_axes=(-1, -1 if y_channels else None), out_axes=-1)(x, y)


def _e3nn_convolution(coo, graph, x, y, s, y_channels: bool):
    """``m_b = Σ_{a→b} s_ab[i3] · (x_a ⊗ y_ab)`` with e3nn-jax's tensor product, float64."""
    mask = np.asarray(graph.edge_mask)
    senders = np.where(mask, np.asarray(graph.senders), 0)
    z = _e3nn_tensor_product(coo, x[senders], y, y_channels) * s[:, np.asarray(coo.i3), :]
    z = jnp.where(mask[:, None, None], z, 0)
    return jax.ops.segment_sum(z, np.asarray(graph.receivers), num_segments=x.shape[0])


def _assert_matches_e3nn(fn, args, cotangent, want_out, want_grads, what: str) -> None:
    """The reference's output and VJP (``want_*``) equal e3nn-jax's (``fn``) on ``args`` (float64)."""

    def out_and_vjp(args, cotangent):
        out, vjp = jax.vjp(fn, *args)
        return out, vjp(cotangent)

    with jax.enable_x64(True):
        out, grads = jax.jit(out_and_vjp)(_f64(*args), jnp.asarray(cotangent, jnp.float64))
    assert_close(want_out, out, "float64", f"reference {what} vs e3nn-jax")
    for name, g in zip("xys", grads):  # args are (x, y[, s])
        assert_close(want_grads[name], g, "float64", f"reference {what} d{name} vs e3nn-jax")


@contextlib.contextmanager
def _reference_formulation(case: Case) -> Iterator[None]:
    """HIGH_L's tables through the reference's gathered formulation: unrolled, they take tens of seconds
    to compile here (tests/ops/test_reference_kernels.py checks that both formulations agree)."""
    saved = ref_tp._UNROLL_LIMIT
    if case.table is not None:
        ref_tp._UNROLL_LIMIT = 0
    try:
        yield
    finally:
        ref_tp._UNROLL_LIMIT = saved


@functools.cache
def _tp_reference(case: Case):
    """The float64 reference's ``z`` and ``{dx, dy}`` on ``tp_operands(case)`` (one evaluation per case
    and process: every backend checked against the same case shares it); for HIGH_L's tables, checked
    against e3nn-jax first."""
    coo, x, y, dz = tp_operands(case)
    yc = case.y_channels
    with _reference_formulation(case):
        z = np.asarray(jax.jit(functools.partial(ref_tp.tensor_product, coo, y_channels=yc))(*_f64(x, y)))
        grads = jax.jit(functools.partial(ref_tp.tensor_product_bwd, coo, outs=("x", "y"), y_channels=yc))(
            *_f64(x, y, dz)
        )
    grads = {k: np.asarray(v) for k, v in grads.items()}
    if case.table is not None:
        fn = functools.partial(_e3nn_tensor_product, coo, y_channels=yc)
        _assert_matches_e3nn(fn, (x, y), dz, z, grads, "tensor product")
    return z, grads


@functools.cache
def _conv_reference(case: Case):
    """The float64 reference's ``m`` and ``{dx, dy, ds}`` on ``conv_operands(case)`` (shared, and checked
    against e3nn-jax, as above)."""
    coo, graph, x, y, s, dm = conv_operands(case)
    yc = case.y_channels
    with _reference_formulation(case):
        m = np.asarray(jax.jit(functools.partial(ref_conv.convolution, coo, y_channels=yc))(*_f64(x, y, s), graph))
        bwd = functools.partial(ref_conv.convolution_bwd, coo, outs=("x", "y", "s"), y_channels=yc)
        grads = jax.jit(bwd)(*_f64(x, y, s, dm), graph)
    grads = {k: np.asarray(v) for k, v in grads.items()}
    if case.table is not None:
        fn = functools.partial(_e3nn_convolution, coo, graph, y_channels=yc)
        _assert_matches_e3nn(fn, (x, y, s), dm, m, grads, "convolution")
    return m, grads


def check_tensor_product(kernels: e3j.Kernels, case: Case) -> None:
    coo, x, y, dz = tp_operands(case)
    yc = case.y_channels
    z = jax.jit(functools.partial(kernels.tensor_product, coo, y_channels=yc))(x, y)
    want_z, want = _tp_reference(case)
    assert_close(z, want_z, case.dtype, "z")
    for outs in (("x", "y"), ("x",), ("y",)):
        xs, ys = (x if "y" in outs else None), (y if "x" in outs else None)
        got = jax.jit(lambda x, y, dz, o=outs: kernels.tensor_product_bwd(coo, x, y, dz, outs=o, y_channels=yc))(
            xs, ys, dz
        )
        assert set(got) == set(outs)
        for o in outs:
            assert_close(got[o], want[o], case.dtype, f"d{o} (outs={outs})")


def check_convolution(kernels: e3j.Kernels, case: Case) -> None:
    coo, graph, x, y, s, dm = conv_operands(case)
    yc = case.y_channels
    m = jax.jit(lambda x, y, s, g: kernels.convolution(coo, x, y, s, g, y_channels=yc))(x, y, s, graph)
    want_m, want = _conv_reference(case)
    assert_close(m, want_m, case.dtype, "m")
    for outs in (("x", "y", "s"), ("x",), ("y", "s")):
        ops = {
            "x": x if ("y" in outs or "s" in outs) else None,
            "y": y if ("x" in outs or "s" in outs) else None,
            "s": s if ("x" in outs or "y" in outs) else None,
        }
        got = jax.jit(
            lambda x, y, s, dm, g, o=outs: kernels.convolution_bwd(coo, x, y, s, dm, g, outs=o, y_channels=yc)
        )(ops["x"], ops["y"], ops["s"], dm, graph)
        assert set(got) == set(outs)
        for o in outs:
            assert_close(got[o], want[o], case.dtype, f"d{o} (outs={outs})")


def check_padding_rows(kernels: e3j.Kernels, case: Case, graph: e3j.Graph | None = None) -> None:
    """``dy`` and ``ds`` (the cotangents written per edge) against the float64 reference on ``graph``
    (default :func:`hard_graph`), the padding edges' rows exactly zero: for backends whose launches
    clear those rows in programs of their own (the interpreters fill unwritten outputs with NaN)."""
    coo, default_graph, x, _, _, dm = conv_operands(case)
    graph = default_graph if graph is None else graph
    rng, e, c = np.random.default_rng(5), graph.num_edges, case.channels
    y = _rand(rng, (e, coo.dim_y, c) if case.y_channels else (e, coo.dim_y), case.dtype)
    s = _rand(rng, (e, coo.num_paths, c), case.dtype)
    padding = ~np.asarray(graph.edge_mask)
    assert padding.sum() > 1
    outs, yc = ("y", "s"), case.y_channels
    got = jax.jit(lambda x, y, s, dm, g: kernels.convolution_bwd(coo, x, y, s, dm, g, outs=outs, y_channels=yc))(
        x, y, s, dm, graph
    )
    want = ref_conv.convolution_bwd(coo, *_f64(x, y, s, dm), graph, outs=outs, y_channels=yc)
    for o in outs:
        assert_close(got[o], want[o], case.dtype, f"d{o}")
        assert not np.any(np.asarray(got[o])[padding]), f"d{o}: padding edges' rows"


def check_launch_case(kernels: e3j.Kernels, case: LaunchCase) -> None:
    """Tensor product and convolution, forward and backward, of ``case`` on two nodes / batch rows
    (one padding edge) against the float64 reference."""
    coo, rng = case.coo, np.random.default_rng(11)
    n, c, yc = 2, case.channels, case.y_channels
    x = _rand(rng, (n, coo.dim_x, c), case.dtype)
    y = _rand(rng, (n, coo.dim_y, c) if yc else (n, coo.dim_y), case.dtype)
    dz = _rand(rng, (n, coo.dim_out, c), case.dtype)
    z = kernels.tensor_product(coo, x, y, y_channels=yc)
    assert_close(z, ref_tp.tensor_product(coo, *_f64(x, y), y_channels=yc), case.dtype, "z")
    got = kernels.tensor_product_bwd(coo, x, y, dz, outs=("x", "y"), y_channels=yc)
    want = ref_tp.tensor_product_bwd(coo, *_f64(x, y, dz), outs=("x", "y"), y_channels=yc)
    for o in "xy":
        assert_close(got[o], want[o], case.dtype, f"d{o}")
    senders, receivers = np.array([0, 1, 1, 0], np.int32), np.array([1, 0, 1, 0], np.int32)
    graph = e3j.Graph.from_edges(senders, receivers, n, edge_mask=np.array([True, True, True, False]))
    e = graph.num_edges
    y = _rand(rng, (e, coo.dim_y, c) if yc else (e, coo.dim_y), case.dtype)
    s = _rand(rng, (e, coo.num_paths, c), case.dtype)
    m = kernels.convolution(coo, x, y, s, graph, y_channels=yc)
    assert_close(m, ref_conv.convolution(coo, *_f64(x, y, s), graph, y_channels=yc), case.dtype, "m")
    got = kernels.convolution_bwd(coo, x, y, s, dz, graph, outs=("x", "y", "s"), y_channels=yc)
    want = ref_conv.convolution_bwd(coo, *_f64(x, y, s, dz), graph, outs=("x", "y", "s"), y_channels=yc)
    for o in "xys":
        assert_close(got[o], want[o], case.dtype, f"conv d{o}")


def check_deterministic(kernels: e3j.Kernels, case: Case) -> None:
    """Repeated runs of the compiled kernels give bitwise-identical results."""
    coo, graph, x, y, s, dm = conv_operands(case, seed=1)
    yc = case.y_channels
    fwd = jax.jit(lambda x, y, s, g: kernels.convolution(coo, x, y, s, g, y_channels=yc))
    bwd = jax.jit(
        lambda x, y, s, dm, g: kernels.convolution_bwd(coo, x, y, s, dm, g, outs=("x", "y", "s"), y_channels=yc)
    )
    runs = [(fwd(x, y, s, graph), bwd(x, y, s, dm, graph)) for _ in range(3)]
    (m0, d0), *rest = runs
    for m1, d1 in rest:
        np.testing.assert_array_equal(m0, m1)
        for o in d0:
            np.testing.assert_array_equal(d0[o], d1[o])


def check_gradients_through_primitives(backend: str, tp_case: Case, conv_case: Case) -> None:
    """First and second derivatives through the e3j ops with ``backend`` equal the reference's."""
    coo, x, y, _ = tp_operands(tp_case, seed=2)
    tp = e3j.TensorProduct(coo.irreps_x, coo.irreps_y, coo.irreps_out)
    w = np.random.default_rng(3).normal(size=(x.shape[0], coo.dim_out, x.shape[-1]))

    def tp_loss(x, y, b):
        return jnp.sum(jnp.sin(tp(x, y, backend=b)) * w)

    with _reference_formulation(tp_case):
        _compare_derivatives(tp_loss, (x, y), backend, tp_case.dtype, "tensor product")

    coo, graph, x, y, s, _ = conv_operands(conv_case, seed=2)
    conv = e3j.Convolution(coo.irreps_x, coo.irreps_y, coo.irreps_out)
    w = np.random.default_rng(4).normal(size=(x.shape[0], coo.dim_out, x.shape[-1]))

    def conv_loss(x, y, s, b):
        return jnp.sum(jnp.sin(conv(x, y, s, graph, backend=b)) * w)

    with _reference_formulation(conv_case):
        _compare_derivatives(conv_loss, (x, y, s), backend, conv_case.dtype, "convolution")


def _compare_derivatives(loss, args, backend, dtype, what):
    n = len(args)

    # the gradient and the gradient of its squared norm from one program: the second-order program
    # computes the first-order gradient anyway, and in the interpreters each kernel call is costly
    def derivatives(b):
        def inner(*a):
            g = jax.grad(loss, argnums=tuple(range(n)))(*a, b)
            return sum(jnp.sum(gi**2) for gi in g), g

        grad_of_grad, grad = jax.grad(inner, argnums=tuple(range(n)), has_aux=True)(*args)
        return {"grad": grad, "grad of grad": grad_of_grad}

    got = jax.jit(derivatives, static_argnums=0)(backend)
    want = jax.jit(derivatives, static_argnums=0)("reference")
    for name in ("grad", "grad of grad"):
        for k, (g, r) in enumerate(zip(got[name], want[name], strict=True)):
            assert_close(g, np.asarray(r, np.float64), dtype, f"{what} {name} wrt argument {k}")
