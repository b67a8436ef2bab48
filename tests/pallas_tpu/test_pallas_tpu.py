"""e3j-pallas-tpu: the Mosaic kernels, run by Pallas's TPU interpreter on the CPU and lowered for TPU.

Values are checked against the reference backend (float64) on the shared conformance cases (in
float32: Mosaic has no float64), with edge tiles small enough that receivers and senders straddle
tile boundaries; one run has the interpreter's race detector on. The same configurations are then
lowered for ``tpu`` and must emit the Mosaic custom call.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from e3j_pallas_tpu import _records, vmem
from e3j_pallas_tpu import convolution as tpu_conv
from e3j_pallas_tpu import tensor_product as tpu_tp
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as tpu_interpreter
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import AbstractDevice, AbstractMesh
from kernel_cases import (
    ALL_OUTS,
    CONV_CASES,
    GROUPED,
    HIGH_L_CASES,
    TP_CASES,
    Case,
    check_convolution,
    check_deterministic,
    check_gradients_through_primitives,
    check_grouped_convolution,
    check_grouped_lowering,
    check_tensor_product,
    conv_operands,
    interpreted_conv_cases,
    tp_operands,
)

import e3j
from e3j.backends import get_backend, kernels_of
from e3j_core import tensor_product_coo

INTERPRET = "pallas_tpu_interpret"
MOSAIC_CALL = "tpu_custom_call"


def _f32(cases):
    return list(dict.fromkeys(dataclasses.replace(c, dtype="float32") for c in cases))


def interpreted(edge_tile=None, **params) -> e3j.Kernels:
    ip = pltpu.InterpretParams(**params)
    return e3j.Kernels(
        tensor_product=functools.partial(tpu_tp.tensor_product, interpret=ip),
        tensor_product_bwd=functools.partial(tpu_tp.tensor_product_bwd, interpret=ip),
        convolution=functools.partial(tpu_conv.convolution, interpret=ip, edge_tile=edge_tile),
        convolution_bwd=functools.partial(tpu_conv.convolution_bwd, interpret=ip, edge_tile=edge_tile),
        grouped_convolution=functools.partial(tpu_conv.grouped_convolution, interpret=ip, edge_tile=edge_tile),
        grouped_convolution_bwd=functools.partial(tpu_conv.grouped_convolution_bwd, interpret=ip, edge_tile=edge_tile),
    )


@pytest.mark.parametrize("case", _f32(TP_CASES), ids=str)
def test_tensor_product_matches_reference(case):
    check_tensor_product(kernels_of(get_backend(INTERPRET)), case)


@pytest.mark.parametrize("case", interpreted_conv_cases(_f32(CONV_CASES)), ids=str)
def test_convolution_matches_reference_across_tile_boundaries(case):
    # 8- and 16-edge tiles: receiver runs (and the high-valency node's) straddle many tiles
    check_convolution(interpreted(edge_tile=8 if case.lmax != 2 else 16), case)


# the issue-18 table (320 output rows) takes minutes in the interpreter: slow session
WALKED = [_f32(HIGH_L_CASES)[0], pytest.param(_f32(HIGH_L_CASES)[1], marks=pytest.mark.slow)]


@pytest.mark.parametrize("case", WALKED, ids=str)
def test_high_degree_tables_walk_records(case):
    assert not _records.unrolls(case.coo.table)  # the record walk from SMEM, not the unrolled program
    check_tensor_product(kernels_of(get_backend(INTERPRET)), case)
    check_convolution(kernels_of(get_backend(INTERPRET)), case)


def test_convolution_with_budget_chosen_tiles():
    check_convolution(kernels_of(get_backend(INTERPRET)), Case(2, 32, 10, True))


def test_no_races_and_bitwise_deterministic():
    tpu_interpreter.reset_tpu_interpret_mode_state()
    check_deterministic(interpreted(edge_tile=8, detect_races=True), Case(1, 16, 9, False))
    assert tpu_interpreter.races is not None, "the race detector did not run"
    assert not tpu_interpreter.races.races_found


def test_uninitialized_memory_never_reaches_outputs():
    # the interpreter fills fresh buffers with NaN: every output row must be written by the kernels
    kernels = interpreted(edge_tile=8, uninitialized_memory="nan")
    coo, graph, x, y, s, dm = conv_operands(Case(1, 16, 12, True))
    m = kernels.convolution(coo, x, y, s, graph, y_channels=True)
    d = kernels.convolution_bwd(coo, x, y, s, dm, graph, outs=("x", "y", "s"), y_channels=True)
    assert np.isfinite(m).all() and all(np.isfinite(v).all() for v in d.values())


def test_gradients_through_primitives():
    check_gradients_through_primitives(INTERPRET, Case(1, 16, 5, True), Case(1, 16, 6, False))


@pytest.mark.slow
def test_walked_records_gradients_through_primitives():
    walked = _f32(HIGH_L_CASES)
    check_gradients_through_primitives(INTERPRET, walked[1], walked[0])


@pytest.mark.slow
def test_walked_records_never_leave_memory_uninitialized():
    kernels = interpreted(edge_tile=8, uninitialized_memory="nan")
    coo, graph, x, y, s, dm = conv_operands(_f32(HIGH_L_CASES)[0])
    m = kernels.convolution(coo, x, y, s, graph, y_channels=True)
    d = kernels.convolution_bwd(coo, x, y, s, dm, graph, outs=("x", "y", "s"), y_channels=True)
    assert np.isfinite(m).all() and all(np.isfinite(v).all() for v in d.values())


# the interpreter runs each DMA as a callback: the walked tables and the other cotangent subsets
# (covered by the uniform kernels' tests) go to the slow session
@pytest.mark.parametrize("walk", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["unrolled", "walked"])
def test_grouped_kernels_match_the_reference(monkeypatch, walk):
    """One launch per group, a DMA per path window of e3nn's weights; the weights' cotangent is one
    buffer every group writes its windows of (fresh buffers are NaN here: a column no group wrote
    would show), 8-edge tiles so that receivers straddle them."""
    if walk:
        monkeypatch.setattr(_records, "UNROLL_RECORDS", 0)
    assert all(_records.unrolls(g.coo.table) != walk for g in GROUPED.plan.groups)
    outs_sets = ALL_OUTS if walk else (("x", "y", "s"), ("s",))
    check_grouped_convolution(interpreted(edge_tile=8, uninitialized_memory="nan"), "float32", outs_sets)


# each grid step copies its tile's edge slots into SMEM (budget 0: every graph), 8-edge tiles so that
# receiver and sender runs straddle them; unrolled and walked tables, and the grouped kernels' aliased
# cotangent buffer (fresh buffers are NaN: a row read from the wrong slot or never written shows)
@pytest.mark.parametrize(
    "case", [Case(1, 16, 9, False), Case(2, 16, 6, True), pytest.param(_f32(HIGH_L_CASES)[0], marks=pytest.mark.slow)],
    ids=str,
)  # fmt: skip
def test_edge_slots_copied_into_smem_per_tile(monkeypatch, case):
    monkeypatch.setattr(tpu_conv, "PREFETCH_SMEM_BYTES", 0)
    check_convolution(interpreted(edge_tile=8, uninitialized_memory="nan"), case)


def test_grouped_kernels_with_edge_slots_copied_per_tile(monkeypatch):
    monkeypatch.setattr(tpu_conv, "PREFETCH_SMEM_BYTES", 0)
    check_grouped_convolution(interpreted(edge_tile=8, uninitialized_memory="nan"), "float32", (("x", "y", "s"),))


def test_large_graphs_keep_their_edge_slots_in_hbm():
    """Past PREFETCH_SMEM_BYTES (here 200,000 edge slots: 2.4 MB of indices, beyond a v5e core's 1 MiB
    of SMEM) the lowered kernels take the slots from HBM and copy a tile's into SMEM; a small graph
    keeps them scalar-prefetched whole."""
    coo, n, c = Case(1, 128, 8, False).coo, 1000, 128
    for num_edges, whole in ((64, True), (200_000, False)):
        rng = np.random.default_rng(0)
        graph = e3j.Graph.from_edges(rng.integers(0, n, num_edges), rng.integers(0, n, num_edges), n)
        x = jax.ShapeDtypeStruct((n, coo.dim_x, c), jnp.float32)
        y = jax.ShapeDtypeStruct((num_edges, coo.dim_y), jnp.float32)
        s = jax.ShapeDtypeStruct((num_edges, coo.num_paths, c), jnp.float32)
        dm = jax.ShapeDtypeStruct((n, coo.dim_out, c), jnp.float32)
        fwd = functools.partial(tpu_conv.convolution, coo, y_channels=False)
        bwd = functools.partial(tpu_conv.convolution_bwd, coo, outs=("x", "y", "s"), y_channels=False)
        for f, args in ((fwd, (x, y, s)), (bwd, (x, y, s, dm))):
            with jax.sharding.use_abstract_mesh(_V5E):
                assert MOSAIC_CALL in jax.jit(f).trace(*args, graph).lower(lowering_platforms=("tpu",)).as_text()
            (call,) = [e for e in jax.make_jaxpr(f)(*args, graph).eqns if e.primitive.name == "pallas_call"]
            prefetched = [v.aval.shape for v in call.invars[: call.params["grid_mapping"].num_index_operands]]
            assert whole == any(shape and shape[0] >= num_edges for shape in prefetched), (num_edges, prefetched)


def test_edge_tile_must_be_a_multiple_of_8():
    coo, graph, x, y, s, _ = conv_operands(Case(1, 16, 5, False))
    with pytest.raises(ValueError, match="edge_tile must be a positive multiple of 8, got 12"):
        tpu_conv.convolution(coo, x, y, s, graph, y_channels=False, edge_tile=12)


def test_descriptors():
    tpu, interp = get_backend("pallas_tpu"), get_backend(INTERPRET)
    assert tpu.platforms == ("tpu",) and tpu.auto and tpu.dtypes == ("float32",)
    assert interp.platforms == ("cpu",) and not interp.auto
    assert tpu.incompatibility() is None
    req = e3j.backends.OpRequest("convolution", "tpu", "float64", 128, 2)
    assert "float64" in tpu.unsupported(req)
    # no degree limit: tables above the unroll limit are walked; the switch is stated in `e3j info`
    for lmax in range(9):
        assert tpu.unsupported(e3j.backends.OpRequest("convolution", "tpu", "float32", 128, lmax)) is None
    assert any(f"<= {_records.UNROLL_RECORDS} COO records" in note for note in tpu.notes)
    sh = [tensor_product_coo(*(["+".join(f"{k}{'eo'[k % 2]}" for k in range(lmax + 1))] * 3)) for lmax in (3, 4)]
    assert _records.unrolls(sh[0].table) and not _records.unrolls(sh[1].table)  # as the note says


# -- VMEM budget (paper Table 4) ---------------------------------------------------------------


def test_buffer_bytes_round_to_vmem_tiles():
    assert vmem.buffer_bytes((16, 3), 4) == 16 * 128 * 4  # lanes round up to 128
    assert vmem.buffer_bytes((3, 256), 4) == 8 * 256 * 4  # sublanes round up to 8
    assert vmem.buffer_bytes((32, 16, 128), 4) == 32 * 16 * 128 * 4
    assert vmem.buffer_bytes((5,), 4) == 8 * 128 * 4
    assert vmem.buffer_bytes((4, 9, 16), 2) == 4 * 16 * 128 * 2  # bf16 packs 16 rows per tile


def test_vmem_budget_lmax3_128_channels_f32():
    coo = tensor_product_coo(*(["0e + 1o + 2e + 3o"] * 3))
    for tile in (
        vmem.convolution_tile(coo, channels=128, itemsize=4, y_channels=False),
        vmem.convolution_bwd_tile(coo, channels=128, itemsize=4, y_channels=False),
        vmem.tensor_product_tile(coo, channels=128, itemsize=4, y_channels=False),
        vmem.tensor_product_tile(coo, channels=128, itemsize=4, y_channels=False, backward=True),
    ):
        assert tile.channels == 128 and tile.edges >= 8
        assert tile.total <= vmem.BUFFER_BUDGET < vmem.VMEM_PER_CORE
    fwd = vmem.convolution_tile(coo, channels=128, itemsize=4, y_channels=False)
    # hand count, in whole (8 sublanes, 128 lanes) tiles: x [B, 16, 128], y [B, 16 -> 128 lanes],
    # s [B, P, 128], messages [B, Dout, 128], accumulator [8, Dout, 128], two [Dout, 128] rows
    b, p, d = fwd.edges, -(-coo.num_paths // 8) * 8, -(-coo.dim_out // 8) * 8
    want = 4 * 128 * (b * 16 + b + b * p + b * d + 8 * d + 2 * d)
    assert fwd.total == want


def test_small_channel_counts_take_whole_lanes():
    coo = tensor_product_coo("0e + 1o", "0e + 1o")
    t16 = vmem.convolution_tile(coo, channels=16, itemsize=4, y_channels=False)
    t128 = vmem.convolution_tile(coo, channels=128, itemsize=4, y_channels=False)
    assert t16.channels == 16 and t16.edges == t128.edges and t16.total == t128.total
    assert vmem.channel_block(256) == 128 and vmem.channel_block(192) == 192


# -- lowering for TPU on this (TPU-less) machine ----------------------------------------------

_V5E = AbstractMesh(
    (1,), ("x",), abstract_device=AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
)


def _lower_tpu(fn, *args) -> str:
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), args)
    with jax.sharding.use_abstract_mesh(_V5E):
        return jax.jit(fn).trace(*shapes).lower(lowering_platforms=("tpu",)).as_text()


@pytest.mark.parametrize("case", _f32(TP_CASES) + WALKED, ids=str)
def test_tensor_product_lowers_for_tpu(case):
    kernels = kernels_of(get_backend("pallas_tpu"))
    coo, x, y, dz = tp_operands(case)
    yc = case.y_channels
    assert MOSAIC_CALL in _lower_tpu(functools.partial(kernels.tensor_product, coo, y_channels=yc), x, y)
    for outs in (("x", "y"), ("x",), ("y",)):
        bwd = functools.partial(kernels.tensor_product_bwd, coo, outs=outs, y_channels=yc)
        assert MOSAIC_CALL in _lower_tpu(bwd, x, y, dz)


@pytest.mark.parametrize("case", _f32(CONV_CASES) + WALKED, ids=str)
def test_convolution_lowers_for_tpu(case):
    kernels = kernels_of(get_backend("pallas_tpu"))
    coo, graph, x, y, s, dm = conv_operands(case)
    yc = case.y_channels
    for tile in (None, 8):
        fwd = functools.partial(kernels.convolution, coo, y_channels=yc, edge_tile=tile)
        assert MOSAIC_CALL in _lower_tpu(lambda x, y, s, g, f=fwd: f(x, y, s, g), x, y, s, graph)
        for outs in (("x", "y", "s"), ("x",), ("y", "s")):
            fn = functools.partial(kernels.convolution_bwd, coo, outs=outs, y_channels=yc, edge_tile=tile)
            assert MOSAIC_CALL in _lower_tpu(lambda x, y, s, dm, g, fn=fn: fn(x, y, s, dm, g), x, y, s, dm, graph)


@pytest.mark.parametrize("factored", [False, True], ids=["array", "factored"])
def test_e3j_ops_select_pallas_tpu_when_lowered_for_tpu(factored):
    # edge scalars given as FactoredWeights: multiplied out inside the call, the same two launches
    coo, graph, x, y, s, _ = conv_operands(Case(2, 128, 8, False))
    conv = e3j.Convolution(coo.irreps_x, coo.irreps_y, coo.irreps_out)
    if factored:
        s = (s[:, 0, :3], s.reshape(s.shape[0], -1)[:3])  # hidden [E, 3], kernel [3, P * C]

    def loss(x, y, s, g):
        return jax.numpy.sin(conv(x, y, e3j.FactoredWeights(*s) if factored else s, g)).sum()

    text = _lower_tpu(jax.grad(loss, argnums=(0, 1, 2)), x, y, s, graph)
    assert text.count(MOSAIC_CALL) == 2  # the forward and one fused backward


@pytest.mark.parametrize("factored", [False, True], ids=["array", "factored"])
def test_grouped_convolution_lowers_for_tpu_without_copying_the_weights(factored):
    check_grouped_lowering(_lower_tpu, "pallas_tpu", MOSAIC_CALL, factored=factored)


def test_e3j_convolution_exports_for_cpu_and_tpu():
    """An exported e3j convolution (value and gradient) serializes for ("cpu", "tpu"): the TPU
    kernels' tpu_custom_call is a target jax.export guarantees (docs/usage.md#deploying-with-jaxexport),
    and the CPU branch of the deserialized module computes what the reference does."""
    pytest.importorskip("flatbuffers")  # jax.export's serialization format
    coo, graph, x, y, s, _ = conv_operands(Case(1, 128, 5, False))
    conv = e3j.Convolution(coo.irreps_x, coo.irreps_y, coo.irreps_out)

    def value_and_grad(x, y, s, g):
        return jax.value_and_grad(lambda x: jnp.sin(conv(x, y, s, g)).sum())(x)

    with jax.sharding.use_abstract_mesh(_V5E):
        exported = jax.export.export(jax.jit(value_and_grad), platforms=("cpu", "tpu"))(x, y, s, graph)
    assert exported.mlir_module().count(MOSAIC_CALL) == 2
    got = jax.export.deserialize(exported.serialize()).call(x, y, s, graph)
    want = jax.jit(value_and_grad)(x, y, s, graph)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
