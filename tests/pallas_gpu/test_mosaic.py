"""e3j-pallas-gpu's Mosaic GPU kernels in Mosaic's GPU interpreter on the CPU, with race detection.

Values are checked against the reference backend (float64) on shared conformance cases (small sizes:
the interpreter runs every warpgroup and TMA transfer in Python); the race detector must find no
unordered access to shared or global memory. The descriptor's device check is tested on abstract
devices. Lowering for ``cuda`` needs JAX's CUDA plugin: see test_mosaic_lowering.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from e3j_pallas_gpu import _blocks, _mosaic, mosaic_convolution, mosaic_tensor_product
from e3j_pallas_gpu import backend as descriptors
from e3j_pallas_gpu._mosaic import Lanes
from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call as gpu_interpret
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.sharding import AbstractDevice, AbstractMesh
from kernel_cases import (
    ALL_OUTS,
    CONV_CASES,
    GROUPED,
    GROUPED_ALIGNED,
    GROUPED_HYBRID,
    GROUPED_MOSAIC_FIRST,
    GROUPED_PART_ALIGNED,
    ODD_CHANNEL_CASES,
    Case,
    assert_close,
    check_convolution,
    check_grouped_convolution,
    check_padding_rows,
    check_tensor_product,
    conv_operands,
    grouped_operands,
    tp_operands,
)

import e3j
from e3j.backends import Backend, Kernels, OpRequest
from e3j.reference import convolution as ref_conv

#: Shared memory and outputs start as NaN (a value read before it is written, or an output row never
#: stored, shows as NaN), and the race detector is on.
RACES = plgpu.InterpretGPUParams(detect_races=True, uninitialized_memory="nan")


@pytest.fixture(autouse=True)
def strict_tma_stores(monkeypatch):
    """A TMA store that reaches out of its array fails, instead of being clipped to it.

    The interpreter clips a store's window to the array axis by axis, but Mosaic lowers a store whose
    gmem window is contiguous (a block of whole rows: every C < 128) to a linear bulk copy
    (``cp.async.bulk``) bounded only by the end of the whole array: its rows past an axis's end land in
    the next node's or edge's rows. Padding rows stored that way gave wrong ``dy`` and ``ds`` on the
    first H200 run while the interpreter passed; here such a store raises.
    """
    monkeypatch.setattr(gpu_callbacks.AsyncCopySmemToGmemTask, "clips_out_of_bounds_destination", False)


def _linear_window(rng: tuple, shape: tuple[int, ...]) -> tuple[int, int, bool]:
    """Flat offset and size of a store's gmem window, and whether Mosaic sees it as contiguous.

    Mosaic's test (``check_contiguous_slice`` in ``mosaic/gpu/launch_context.py``): from the last axis
    inwards, every window axis longer than 1 has the stride of the window axes after it; axis lengths
    are not compared with the array's, so a window longer than its axis still counts as contiguous.
    """
    start = [r if isinstance(r, int) else r.start for r in rng]
    size = [1 if isinstance(r, int) else r.stop - r.start for r in rng]
    strides = [int(np.prod(shape[i + 1 :])) for i in range(len(shape))]
    expected, contiguous = 1, True
    for d, stride in zip(reversed(size), reversed(strides), strict=True):
        contiguous &= d == 1 or stride == expected
        expected *= d
    return sum(a * st for a, st in zip(start, strides, strict=True)), int(np.prod(size)), contiguous


@pytest.fixture
def linear_tma_stores(monkeypatch):
    """TMA stores as Mosaic lowers them on the GPU: a contiguous window is one linear bulk copy.

    Pallas's ``copy_smem_to_gmem`` lowers with ``OOBFillMode.UNDEFINED``, and Mosaic then emits
    ``cp.async.bulk.global.shared::cta`` for a contiguous window, its size clamped only at the end of
    the whole array: rows past an axis's end land in the next rows. Other windows are stored as the
    interpreter does (strictly, see :func:`strict_tma_stores`).
    """
    task = gpu_callbacks.AsyncCopySmemToGmemTask
    interpreted = task.__call__

    def linear(self, tma_thread_id):
        memory = gpu_callbacks._get_shared_memory()
        shape = tuple(memory.buffer_shape_and_dtype(self.dst_allocation_key).shape)
        offset, count, contiguous = _linear_window(self.dst_access.range, shape)
        steps = [r.step for r in self.dst_access.range if isinstance(r, slice)]
        if not contiguous or self.dst_access.permutation is not None or any(st not in (None, 1) for st in steps):
            return interpreted(self, tma_thread_id)
        self.pre_read(tma_thread_id, memory)
        val, _, _ = memory.get_buffer_content(
            self.src_allocation_key, self.src_access, self.thread, logging_info=self.logging_info
        )
        self.post_read(tma_thread_id, memory)
        flat, width = np.asarray(val).reshape(-1), shape[-1]
        p, end = offset, min(offset + count, int(np.prod(shape)))
        while p < end:  # one store per run along the last axis
            *lead, col = (int(i) for i in np.unravel_index(p, shape))
            n = min(width - col, end - p)
            access = type(self.dst_access)((*lead, slice(col, col + n, 1)))
            memory.store_buffer_content(
                self.dst_allocation_key, access, flat[p - offset : p - offset + n], self.thread,
                logging_info=self.logging_info,
            )  # fmt: skip
            p += n
        self.post_write(tma_thread_id, memory)

    monkeypatch.setattr(task, "__call__", linear)


@pytest.fixture(scope="module")
def kernels():
    """The interpreter backend's kernels, run with the race detector on."""

    def bound(module, name):
        return functools.partial(getattr(module, name), interpret=RACES)

    return Kernels(
        tensor_product=bound(mosaic_tensor_product, "tensor_product"),
        tensor_product_bwd=bound(mosaic_tensor_product, "tensor_product_bwd"),
        convolution=bound(mosaic_convolution, "convolution"),
        convolution_bwd=bound(mosaic_convolution, "convolution_bwd"),
        grouped_convolution=bound(mosaic_convolution, "grouped_convolution"),
        grouped_convolution_bwd=bound(mosaic_convolution, "grouped_convolution_bwd"),
    )


@pytest.fixture
def no_races_if_any():
    """Fails the test if the interpreter's race detector saw a data race in a Mosaic kernel it ran
    (a grouped call whose groups are all on the Triton kernels runs none: the test says whether)."""
    gpu_interpret.reset_gpu_interpret_mode_state()
    yield
    if gpu_callbacks._races is not None:
        assert not gpu_interpret.get_races().races_found, "the GPU interpreter's race detector found a data race"


@pytest.fixture
def no_races(no_races_if_any):
    """As :func:`no_races_if_any`, for a test that runs Mosaic kernels: the race detector must have run."""
    yield
    assert gpu_callbacks._races is not None, "no Mosaic kernel ran under the race detector"


# broadcast and per-channel y; 16 channels (tiles of 8 batch rows, 3 rows padded to 8), 130 (padded to two
# 128-lane blocks, the second with 2 live lanes), 3 (padded to 4 lanes: tiles of 32 batch rows); lmax 1 and 2
# (the interpreter runs every warpgroup in Python: ~5-20 s a case)
@pytest.mark.parametrize("case", [Case(1, 16, 3, False), Case(2, 130, 2, True), Case(1, 3, 2, True)], ids=str)
def test_tensor_product_matches_reference(kernels, no_races, case):
    check_tensor_product(kernels, case)


# hard_graph: isolated node, high-valency receiver (its tile's other rows run out of edges early: they
# stage zeros and store nothing), padding edges, unsorted edges. 16 channels: 8 nodes per warpgroup; 256:
# one node per warpgroup, two blocks of 128 channels, broadcast y read as scalars.
@pytest.mark.parametrize("case", [Case(1, 16, 5, False), Case(2, 16, 4, True), Case(1, 256, 3, False)], ids=str)
def test_convolution_matches_reference(kernels, no_races, case):
    check_convolution(kernels, case)


@pytest.mark.parametrize(
    "case", [Case(1, 128, 3, False), pytest.param(Case(1, 8, 3, False), marks=pytest.mark.slow)], ids=str
)
def test_convolution_bwd_one_cotangent(no_races, case):
    """``dy`` alone and ``ds`` alone (the conformance check asks for them beside others), on one-node
    tiles (broadcast y read as scalars) and 16-node tiles (y broadcast in XLA)."""
    coo, graph, x, y, s, dm = conv_operands(case)
    f64 = [jnp.asarray(a, jnp.float64) for a in (x, y, s, dm)]
    want = ref_conv.convolution_bwd(coo, *f64, graph, outs=("x", "y", "s"), y_channels=False)
    for outs, operands in ((("y",), (x, None, s)), (("s",), (x, y, None))):
        got = mosaic_convolution.convolution_bwd(
            coo, *operands, dm, graph, outs=outs, y_channels=False, interpret=RACES
        )
        assert set(got) == set(outs)
        assert_close(got[outs[0]], want[outs[0]], "float32", f"d{outs[0]} alone")


# every tile shape of the convolution: C = 1 (padded to 4 lanes: 32 nodes per warpgroup) to 64 (2 nodes),
# 128 (one node per warpgroup), lmax 3 at 16 channels; more nodes than one tile holds
@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    [Case(1, c, n, yc) for c, n, yc in [(1, 6, True), (8, 20, False), (32, 9, True), (64, 5, False), (128, 4, True)]]
    + [Case(3, 16, 4, False)],
    ids=str,
)  # fmt: skip
def test_convolution_channel_sweep(kernels, no_races, case):
    check_convolution(kernels, case)


# the shared conformance cases other backends run (float32: the Mosaic kernels refuse float64)
@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CONV_CASES + ODD_CHANNEL_CASES if c.dtype == "float32"], ids=str)
def test_shared_convolution_cases(kernels, no_races, case):
    check_convolution(kernels, case)


def test_kernels_with_row_groups_on_cuda_x(kernels, no_races, monkeypatch):
    """Above 65,535 row groups (CUDA's grid y limit) the kernels launch with rows on x, lanes on y:
    here for every grid, so both orders run (two 128-lane blocks: the order matters)."""
    monkeypatch.setattr(_mosaic, "MAX_GRID_YZ", 1)
    assert mosaic_convolution.launch_grid(2, 3, ("node", "lanes")) == {"grid": (3, 2), "grid_names": ("lanes", "node")}
    check_convolution(kernels, Case(1, 256, 3, False))
    check_tensor_product(kernels, Case(1, 256, 2, True))


# hard_graph(5): 20 edge slots, 3 of them padding: 4 programs clear a row each but the last (5 slots
# per program), or 2 programs 2 rows and 1 (10 slots); 16 channels (8-row tiles), broadcast and
# per-channel y (dy's rows by TMA, or as scalars per channel block)
@pytest.mark.parametrize(("slots", "y_channels"), [(5, False), (10, True)])
def test_padding_edges_cleared_by_several_programs(kernels, no_races, monkeypatch, slots, y_channels):
    monkeypatch.setattr(_blocks, "EDGES_PER_CLEARING_PROGRAM", slots)
    case = Case(1, 16, 5, y_channels)
    assert _blocks.clearing_programs(conv_operands(case)[1].num_edges) == 20 // slots
    check_padding_rows(kernels, case)


@pytest.mark.parametrize(
    ("channels", "expected"),
    [(1, (4, 32, 4)), (3, (4, 32, 4)), (8, (8, 16, 8)), (20, (32, 4, 32)), (64, (64, 2, 64)), (128, (128, 1, 128)),
     (300, (128, 1, 384))],
)  # fmt: skip
def test_lanes_serve_small_channel_counts_without_padding_to_128(channels, expected):
    lanes = Lanes.of(channels)
    assert (lanes.width, lanes.rows, lanes.channels) == expected
    assert lanes.width * lanes.rows == 128
    # each row's [D, width] block spans a multiple of 128 bytes (TMA transfer size and smem alignment)
    for d in (1, 3, 4, 9, 16):
        assert lanes.block_rows(d) >= d and lanes.block_rows(d) * lanes.width * 4 % 128 == 0
    with pytest.raises(ValueError, match="channels must be positive, got 0"):
        Lanes.of(0)


def test_race_detector_sees_the_race_the_kernels_avoid():
    """Without ``commit_smem`` before the next TMA, the interpreter reports the race (the check can fail)."""
    rows, lanes = 3, 128

    def racy(x_gmem, z_gmem, x_smem, barrier):
        def step(k, acc):
            plgpu.copy_gmem_to_smem(x_gmem.at[k], x_smem, barrier)  # may overwrite rows still being read
            plgpu.barrier_wait(barrier)
            return acc + x_smem[0, :]

        zero = plgpu.layout_cast(jnp.zeros((lanes,), jnp.float32), plgpu.Layout.WG_STRIDED((lanes,), vec_size=1))
        z_gmem[...] = jax.lax.fori_loop(0, rows, step, zero)

    gpu_interpret.reset_gpu_interpret_mode_state()
    kernel = plgpu.kernel(
        racy,
        out_type=jax.ShapeDtypeStruct((lanes,), jnp.float32),
        scratch_types=[plgpu.SMEM((2, lanes), jnp.float32), plgpu.Barrier()],
        interpret=RACES,
    )
    try:
        # JAX 0.11 records the race (races_found); from 0.12 the detector raises at the first race
        # (InterpretGPUParams.on_race defaults to "raise"), so the kernels' tests fail there directly
        try:
            jax.block_until_ready(kernel(jnp.ones((rows, 2, lanes), jnp.float32)))
        except Exception as error:  # the interpreter wraps it in a JaxRuntimeError
            assert "RACE DETECTED" in str(error), error
        else:
            assert gpu_interpret.get_races().races_found
    finally:
        gpu_interpret.reset_gpu_interpret_mode_state()


# The H200's failing float32 cases (tests/gpu, first run): with the stores of D' > D rows the kernels had
# (width < 32), dx and m were right and dy/ds wrong, here as there (the padding rows land, as NaN, in the
# next edge's rows). C = 3: 32 nodes of 4 lanes; C = 16 at lmax 3: 23 paths moved as 24 rows.
@pytest.mark.parametrize(
    "case",
    [
        Case(1, 3, 6, True),
        pytest.param(Case(2, 1, 5, False), marks=pytest.mark.slow),
        pytest.param(Case(3, 16, 8, True), marks=pytest.mark.slow),
        pytest.param(Case(6, 4, 3, True, table="l6"), marks=pytest.mark.slow),
    ],
    ids=str,
)
def test_convolution_under_linear_tma_stores(kernels, no_races, linear_tma_stores, case):
    check_convolution(kernels, case)


def test_which_groups_read_e3nn_weights_in_place():
    """The TMA reads a group's weights where e3nn puts them only when its multiplicity fills whole
    tiles of at least 16 lanes and its windows start 16-byte aligned; otherwise the group gets its
    own copy."""

    def in_place(op):
        return [mosaic_convolution.reads_in_place(g, op.plan.num_weights) for g in op.plan.groups]

    assert in_place(GROUPED_ALIGNED) == [True, True]
    assert in_place(GROUPED_PART_ALIGNED) == [True, False, False]  # 16 channels at column 98; 2 channels
    assert not any(in_place(GROUPED))  # multiplicities 4, 2 and 1: tiles narrower than 16 lanes
    twelve = e3j.MulIrConvolution("12x0e + 16x1o", "0e + 1o", "0e + 1o")
    assert twelve.plan.groups[0].channels == 12 and in_place(twelve) == [False, True]  # 12 -> 16 lanes
    narrow = e3j.MulIrConvolution("16x0e + 4x1o", "0e + 1o", "0e + 1o")
    assert in_place(narrow) == [True, False]  # 4 lanes: aligned, but each path's row would be 8 block rows


#: A Mosaic group that cannot read e3nn's weights in place (130 channels: padded lanes), which gets
#: its own copy, beside a group on the Triton kernels (2 channels)
GROUPED_HYBRID_COPIED = e3j.MulIrConvolution("2x0e + 130x1o", "0e + 1o", "0e + 1o")


# Each group's weights read from e3nn's [E, num_weights] by one TMA copy per path and row, and the
# cotangent's columns written path by path into one buffer threaded through the launches. Stores as
# the GPU makes them (linear bulk copies): a window too wide would overwrite the next path's columns.
@pytest.mark.parametrize(
    "op, outs_sets",
    [
        pytest.param(GROUPED_HYBRID, (("x", "y", "s"), ("s",)), id="triton-then-mosaic"),
        pytest.param(GROUPED_MOSAIC_FIRST, (("x", "y", "s"), ("y",)), id="mosaic-then-triton"),
        pytest.param(GROUPED_ALIGNED, (("x", "y", "s"),), id="triton-only"),
        pytest.param(GROUPED_HYBRID, ALL_OUTS, id="hybrid-all-outs", marks=pytest.mark.slow),
        pytest.param(GROUPED_PART_ALIGNED, ALL_OUTS, id="triton-only-all-outs", marks=pytest.mark.slow),
        pytest.param(GROUPED_HYBRID_COPIED, (("x", "y", "s"),), id="copied", marks=pytest.mark.slow),
    ],
)
def test_grouped_convolution_matches_reference(kernels, no_races_if_any, linear_tma_stores, op, outs_sets):
    check_grouped_convolution(kernels, "float32", outs_sets, op=op)
    # Mosaic's interpreter ran (its race detector's state exists) exactly when a group is Mosaic's
    on_mosaic = [not mosaic_convolution.on_triton(g) for g in op.plan.groups]
    assert (gpu_callbacks._races is not None) == any(on_mosaic)


def _eqns(jaxpr):
    """Every equation of ``jaxpr`` and of its sub-jaxprs (``run_state``'s, the kernels' bodies)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _eqns(sub)


@pytest.mark.parametrize(
    "op",
    [GROUPED_ALIGNED, GROUPED_PART_ALIGNED, GROUPED_HYBRID, GROUPED_MOSAIC_FIRST],
    ids=["triton-only", "triton-only-part-aligned", "triton-then-mosaic", "mosaic-then-triton"],
)
def test_grouped_backward_writes_no_zeros_first(op):
    """The groups that read e3nn's weights in place write every edge's row of their columns of the
    weights' cotangent, so the first such launch writes a fresh buffer: no ``[E, num_weights]`` of
    zeros is written first (the largest array; XLA cannot drop it once a launch aliases the buffer).
    With part-aligned groups the buffer still needs no zeros: the other groups' columns are copied in."""
    plan, graph, x, y, s, dm = grouped_operands("float32", op=op)
    bwd = functools.partial(mosaic_convolution.grouped_convolution_bwd, plan, graph=graph, outs=("x", "y", "s"))
    jaxpr = jax.make_jaxpr(lambda x, y, s, dm: bwd(x, y, s, dm))(x, y, s, dm).jaxpr
    filled = [e for e in _eqns(jaxpr) if e.primitive.name == "broadcast_in_dim" and e.outvars[0].aval.shape == s.shape]
    assert not filled, filled
    # a later Mosaic launch threads the buffer as a state ref; a Triton launch aliases it itself
    assert sum(e.primitive.name == "run_state" for e in _eqns(jaxpr)) == sum(
        mosaic_convolution.reads_in_place(g, plan.num_weights) and not mosaic_convolution.on_triton(g)
        for g in plan.groups[1:]
    )


def _expanded_y(jaxpr, num_edges: int, dim_y: int) -> list:
    """The broadcasts of a ``y [E, Dy]`` over channels: ``[E, Dy, C]`` arrays."""
    return [
        e
        for e in _eqns(jaxpr)
        if e.primitive.name == "broadcast_in_dim"
        and e.outvars[0].aval.shape[:2] == (num_edges, dim_y)
        and len(e.outvars[0].aval.shape) == 3
    ]


def test_grouped_groups_of_several_rows_run_on_triton_and_expand_no_y(monkeypatch):
    """In a plan whose groups the grouped Mosaic kernels run, a group of at most 64 channels (tiles of
    several rows, which would read the broadcast ``y`` expanded to ``[E, Dy, C_g]``) runs the Triton
    kernels, forward and backward, and a 128-channel group Mosaic's; no ``y`` is expanded. The uniform
    Mosaic convolution at 16 channels (named) still expands it: the check sees an expansion."""
    from e3j_pallas_gpu import convolution as triton

    plan, graph, x, y, s, dm = grouped_operands("float32", op=GROUPED_HYBRID)
    ran = []
    for module, kernel in ((triton, "triton"), (mosaic_convolution, "mosaic")):
        for name in ("_forward", "_backward"):
            real = getattr(module, name)

            def recorded(coo, *args, real=real, kernel=kernel, name=name, **kw):
                ran.append((kernel, name, coo.dim_x))
                return real(coo, *args, **kw)

            monkeypatch.setattr(module, name, recorded)
    fwd = functools.partial(mosaic_convolution.grouped_convolution, plan, graph=graph)
    bwd = functools.partial(mosaic_convolution.grouped_convolution_bwd, plan, graph=graph, outs=("x", "y", "s"))
    num_edges, dim_y = y.shape
    for jaxpr in (jax.make_jaxpr(fwd)(x, y, s).jaxpr, jax.make_jaxpr(bwd)(x, y, s, dm).jaxpr):
        assert not _expanded_y(jaxpr, num_edges, dim_y)
    small, wide = plan.groups
    assert (small.channels, wide.channels) == (16, 128)
    assert sorted(ran) == sorted(
        [(k, n, g.coo.dim_x) for k, g in (("triton", small), ("mosaic", wide)) for n in ("_forward", "_backward")]
    )
    coo = small.coo
    uniform = functools.partial(mosaic_convolution.convolution, coo, y_channels=False)
    x16, s16 = jnp.ones((x.shape[0], coo.dim_x, 16), x.dtype), jnp.ones((num_edges, coo.num_paths, 16), x.dtype)
    assert _expanded_y(jax.make_jaxpr(uniform)(x16, y, s16, graph).jaxpr, num_edges, dim_y)


def test_strict_stores_see_a_store_past_an_axis():
    """A ``[32, 4]`` block stored into a ``[16, 4]`` row fails under :func:`strict_tma_stores` (the check can fail)."""

    def spill(start_gmem, z_gmem, z_smem):
        z_smem[...] = plgpu.layout_cast(jnp.zeros((32, 4), jnp.float32), plgpu.Layout.WG_STRIDED((32, 4), vec_size=1))
        plgpu.commit_smem()
        # rows 16-31 are past the axis; the start is read at run time, as the kernels' stores index rows
        # (JAX >= 0.12 refuses a window past its axis with a static start when the slice is built)
        plgpu.copy_smem_to_gmem(z_smem, z_gmem.at[0, pl.ds(start_gmem[0], 32), :])
        plgpu.wait_smem_to_gmem(0)

    gpu_interpret.reset_gpu_interpret_mode_state()
    kernel = plgpu.kernel(
        spill,
        out_type=jax.ShapeDtypeStruct((2, 16, 4), jnp.float32),
        scratch_types=[plgpu.SMEM((32, 4), jnp.float32)],
        interpret=RACES,
    )
    try:
        with pytest.raises(Exception, match="Out-of-bounds store"):
            jax.block_until_ready(kernel(jnp.zeros((1,), jnp.int32)))
    finally:
        gpu_interpret.reset_gpu_interpret_mode_state()


def test_float64_is_refused_with_a_clear_error():
    coo, x, y, _ = tp_operands(Case(1, 16, 2, False, dtype="float64"))
    with pytest.raises(TypeError, match="tensor_product: the Mosaic GPU kernels support float32, got float64"):
        mosaic_tensor_product.tensor_product(coo, x, y, y_channels=False, interpret=True)
    coo, graph, x, y, s, dm = conv_operands(Case(1, 16, 4, False, dtype="float64"))
    with pytest.raises(TypeError, match=r"convolution_bwd: .* float64"):
        mosaic_convolution.convolution_bwd(coo, x, y, s, dm, graph, outs=("x",), y_channels=False, interpret=True)
    # groups of <= 64 channels alone run the Triton kernels, which take float64: refused all the same
    small = e3j.MulIrConvolution("4x0e + 2x1o", "0e + 1o", "0e + 1o")
    plan, graph, x, y, s, dm = grouped_operands("float64", op=small)
    assert all(mosaic_convolution.on_triton(g) for g in plan.groups)
    with pytest.raises(TypeError, match=r"grouped_convolution: the Mosaic GPU kernels support float32, got float64"):
        mosaic_convolution.grouped_convolution(plan, x, y, s, graph, interpret=True)
    with pytest.raises(TypeError, match=r"grouped_convolution_bwd: .* got float64"):
        mosaic_convolution.grouped_convolution_bwd(plan, x, y, s, dm, graph, outs=("s",), interpret=True)


def test_bad_interpret_argument():
    coo, x, y, _ = tp_operands(Case(1, 16, 2, False))
    with pytest.raises(TypeError, match=r"interpret must be a bool or plgpu\.InterpretGPUParams"):
        mosaic_tensor_product.tensor_product(coo, x, y, y_channels=False, interpret="yes")


# -- descriptors and device selection ----------------------------------------------------------


def _abstract(kind: str) -> AbstractMesh:
    return AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(device_kind=kind, num_cores=None, platform="cuda"))


REQ = OpRequest("convolution", "cuda", "float32", 64, 3)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("NVIDIA H200", None),
        ("NVIDIA H100 80GB HBM3", None),
        ("NVIDIA B200", None),
        ("NVIDIA A100-SXM4-80GB", "needs compute capability >= 9.0, abstract device 'NVIDIA A100-SXM4-80GB' has 8.0"),
        ("Tesla V100-SXM2-16GB", "has 7.0"),
        ("Some GPU", "cannot tell the compute capability"),
    ],
)
def test_mosaic_needs_hopper(monkeypatch, kind, expected):
    monkeypatch.setattr(descriptors, "_mosaic_bindings_installed", lambda: True)
    backend = Backend.from_mapping(descriptors.mosaic_backend)
    with jax.sharding.use_abstract_mesh(_abstract(kind)):
        reason = backend.unsupported(REQ)
    if expected is None:
        assert reason is None
    else:
        assert expected in reason


def test_mosaic_needs_the_bindings(monkeypatch):
    monkeypatch.setattr(descriptors, "_mosaic_bindings_installed", lambda: False)
    backend = Backend.from_mapping(descriptors.mosaic_backend)
    with jax.sharding.use_abstract_mesh(_abstract("NVIDIA H200")):
        assert "Mosaic GPU bindings are not installed" in backend.unsupported(REQ)


def test_mosaic_descriptors():
    gpu = Backend.from_mapping(descriptors.mosaic_backend)
    interp = Backend.from_mapping(descriptors.mosaic_interpret_backend)
    triton = Backend.from_mapping(descriptors.backend)
    assert gpu.platforms == ("cuda",) and gpu.auto and gpu.deterministic and gpu.priority > triton.priority
    assert interp.platforms == ("cpu",) and not interp.auto
    assert gpu.dtypes == ("float32",)  # float64 goes to the Triton kernels
    assert "float64" in gpu.unsupported(OpRequest("convolution", "cuda", "float64", 64, 3))


def test_registered_and_loadable_by_name():
    """The entry points are installed and the interpreter backend's kernels run (called directly:
    Mosaic's GPU interpreter runs on ordered io_callbacks, which e3j's primitives do not thread)."""
    names = {b.name for b in e3j.backends.available_backends()}
    assert {"pallas_mosaic", "pallas_mosaic_interpret"} <= names, (
        f"the Mosaic backends are not registered ({sorted(names)}): reinstall e3j-pallas-gpu"
    )
    kernels = e3j.backends.kernels_of(e3j.backends.get_backend("pallas_mosaic_interpret"))
    coo, graph, x, y, s, _ = conv_operands(Case(1, 16, 4, False))
    got = kernels.convolution(coo, *(jnp.asarray(a, jnp.float32) for a in (x, y, s)), graph, y_channels=False)
    want = ref_conv.convolution(coo, *(jnp.asarray(a, jnp.float64) for a in (x, y, s)), graph, y_channels=False)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(want))))


def test_info_says_why_mosaic_is_not_used(monkeypatch):
    """``python -m e3j info`` lists the Mosaic backend as passed over on a GPU older than Hopper, and why."""
    from e3j.__main__ import _passed_over

    monkeypatch.setattr(descriptors, "_mosaic_bindings_installed", lambda: True)
    names = {b.name for b in e3j.backends.available_backends()}
    assert "pallas_mosaic" in names, f"Mosaic backends not registered ({sorted(names)}): reinstall e3j-pallas-gpu"
    with jax.sharding.use_abstract_mesh(_abstract("NVIDIA A100-SXM4-80GB")):
        passed = dict(_passed_over(REQ, "pallas_gpu"))
    assert "compute capability >= 9.0" in passed["pallas_mosaic"]
    with jax.sharding.use_abstract_mesh(_abstract("NVIDIA H200")):
        # on Hopper, a convolution below 128 channels goes to the Triton kernels (faster there)
        assert "below 128 channels pallas_gpu runs" in dict(_passed_over(REQ, "pallas_gpu"))["pallas_mosaic"]
        wide = OpRequest("convolution", "cuda", "float32", 128, 3)
        assert "pallas_mosaic" not in dict(_passed_over(wide, "pallas_gpu"))


def test_mosaic_yields_small_convolutions_and_tensor_products_to_triton(monkeypatch):
    # measured on an H200 (the descriptor's comment): Triton's convolutions 1.3-2.5x faster at 16-64
    # channels, Mosaic's 1.2x faster at 128; Triton's tensor product faster at 128
    monkeypatch.setattr(descriptors, "_mosaic_bindings_installed", lambda: True)
    gpu = Backend.from_mapping(descriptors.mosaic_backend)
    assert gpu.yields == (("convolution", 128, "pallas_gpu"), ("tensor_product", 129, "pallas_gpu"))
    with jax.sharding.use_abstract_mesh(_abstract("NVIDIA H200")):
        for op, c in (("convolution", 16), ("convolution", 127), ("tensor_product", 16), ("tensor_product", 128)):
            req = OpRequest(op, "cuda", "float32", c, 3)
            assert gpu.unsupported(req) is None and gpu.yielded_to(req).name == "pallas_gpu"
            assert f"pallas_gpu runs {op}" in gpu.passed_over(req)
        for op, c in (("convolution", 128), ("convolution", 256), ("tensor_product", 256)):
            assert gpu.passed_over(OpRequest(op, "cuda", "float32", c, 3)) is None
    assert Backend.from_mapping(descriptors.backend).yields == ()


@pytest.mark.parametrize("module", [mosaic_tensor_product, mosaic_convolution, _mosaic], ids=lambda m: m.__name__)
def test_doctests(module):
    import doctest

    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_public_ops_run_on_the_interpreter_backend():
    """Through e3j's primitives (whose lowerings carry no effects): the interpreter runs behind a callback."""
    conv = e3j.Convolution("0e + 1o", "0e + 1o", filter="0e + 1o")
    graph = e3j.Graph.from_edges(np.array([0, 1, 2]), np.array([1, 2, 0]), num_nodes=3)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(3, 4, 8)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
    s = jnp.asarray(rng.normal(size=(3, conv.num_paths, 8)), jnp.float32)

    def loss(x, backend):
        return jnp.sum(conv(x, y, s, graph, backend=backend) ** 2)

    got = jax.value_and_grad(loss)(x, "pallas_mosaic_interpret")
    want = jax.value_and_grad(loss)(x, "reference")
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
