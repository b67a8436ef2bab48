"""e3j-pallas-gpu's Mosaic GPU kernels lowered for ``cuda`` on this GPU-less machine.

Mosaic GPU's lowering rules come with JAX's CUDA plugin (``jax[cuda13]``, which installs without a
GPU): ``nox -s mosaic_lowering`` installs it and sets ``E3J_REQUIRE_MOSAIC_LOWERING=1``, which turns
the skip below into a failure. Each kernel configuration must lower to a ``mosaic_gpu_v2`` custom
call for Hopper device kinds, and e3j must pick these kernels there (and the Triton ones on an
Ampere device kind) without the Triton backend's deprecation warning.
"""

import functools
import os
import warnings

import jax
import numpy as np
import pytest
from e3j_pallas_gpu import backend as descriptors
from e3j_pallas_gpu import mosaic_convolution, mosaic_tensor_product
from jax.sharding import AbstractDevice, AbstractMesh
from kernel_cases import (
    GROUPED_ALIGNED,
    GROUPED_HYBRID,
    GROUPED_MOSAIC_FIRST,
    Case,
    check_grouped_lowering,
    conv_operands,
    tp_operands,
)

import e3j

MOSAIC_CALL = "mosaic_gpu_v2"
TRITON_CALL = "__gpu$xla.gpu.triton"
HOPPER = ("NVIDIA H100 80GB HBM3", "NVIDIA H200")

if not descriptors._mosaic_bindings_installed():
    if os.environ.get("E3J_REQUIRE_MOSAIC_LOWERING") == "1":
        raise RuntimeError("E3J_REQUIRE_MOSAIC_LOWERING=1 but JAX's Mosaic GPU bindings are not installed")
    pytest.skip(
        "JAX's Mosaic GPU bindings (jax[cuda13]) are not installed: nox -s mosaic_lowering", allow_module_level=True
    )


@pytest.fixture(autouse=True)
def stores_in_bounds(monkeypatch):
    """Every TMA store Mosaic lowers writes inside its gmem array along every axis.

    Mosaic skips its bounds check for TMA copies (the TMA clips a tiled copy per axis), but it lowers
    a store whose window is contiguous to a linear ``cp.async.bulk`` clamped only at the array's end:
    a window past an axis writes into the next rows (the H200's wrong ``dy``/``ds``, docs/mosaic_gpu.md).
    Here ``utils.parse_indices`` runs with the check on each store's window, and a window longer than
    its axis fails too (a dynamic start is not checked: the kernels guard those stores).
    """
    from jax.experimental.mosaic.gpu import launch_context, utils
    from jaxlib.mlir import ir

    copy = launch_context.LaunchContext.async_copy

    def checked(self, *, src_ref, dst_ref, gmem_slice=(), **kwargs):
        dst = ir.MemRefType(dst_ref.type)
        if dst.memory_space is None:  # a gmem destination: a store
            shape = tuple(dst.shape)
            _, lengths, _ = utils.parse_indices(gmem_slice, shape, check_oob=True)
            assert all(n <= b for n, b in zip(lengths, shape, strict=True)), (
                f"a TMA store's window {lengths} reaches past its array {shape}"
            )
        return copy(self, src_ref=src_ref, dst_ref=dst_ref, gmem_slice=gmem_slice, **kwargs)

    monkeypatch.setattr(launch_context.LaunchContext, "async_copy", checked)


def _lower_cuda(kind: str, fn, *args) -> str:
    mesh = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(device_kind=kind, num_cores=None, platform="cuda"))
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), args)
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()


# lmax 2 (lowering an lmax-3 backward takes minutes): broadcast and per-channel y, 2 channel blocks
CASES = [Case(2, 256, 3, False), Case(2, 64, 3, True)]
# the convolution's tiles of several nodes: 8 nodes of 16 channels (broadcast y, expanded in XLA), and
# 32 nodes of 4 lanes (C = 1 padded to 4; 4-row, 64-byte TMA copies into 8-row, 128-byte aligned blocks)
CONV_CASES = [*CASES, Case(2, 16, 9, False), Case(1, 1, 3, True)]


@pytest.mark.parametrize("kind", HOPPER)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_tensor_product_lowers_to_mosaic_gpu(kind, case):
    coo, x, y, dz = tp_operands(case)
    yc = case.y_channels
    assert MOSAIC_CALL in _lower_cuda(
        kind, functools.partial(mosaic_tensor_product.tensor_product, coo, y_channels=yc), x, y
    )
    for outs in (("x", "y"), ("x",), ("y",)):
        bwd = functools.partial(mosaic_tensor_product.tensor_product_bwd, coo, outs=outs, y_channels=yc)
        assert MOSAIC_CALL in _lower_cuda(kind, bwd, x, y, dz)


@pytest.mark.parametrize("kind", HOPPER)
@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_convolution_lowers_to_mosaic_gpu(kind, case):
    coo, graph, x, y, s, dm = conv_operands(case)
    yc = case.y_channels
    fwd = functools.partial(mosaic_convolution.convolution, coo, y_channels=yc)
    assert MOSAIC_CALL in _lower_cuda(kind, fwd, x, y, s, graph)
    for outs in (("x", "y", "s"), ("x",), ("y", "s"), ("s",)):
        bwd = functools.partial(mosaic_convolution.convolution_bwd, coo, outs=outs, y_channels=yc)
        assert MOSAIC_CALL in _lower_cuda(kind, bwd, x, y, s, dm, graph)


def test_launch_grids_fit_cuda_above_65535_row_groups(monkeypatch):
    """70,000 nodes (batch rows) of 128 channels: one row group each. CUDA's grid y and z stop at
    65,535 and JAX does not check them when lowering: the row groups must go on x."""
    from jax.experimental.mosaic.gpu import core

    grids = []
    lower = core._lower_as_gpu_kernel

    def spy(*args, grid, **kwargs):
        grids.append(tuple(grid))
        return lower(*args, grid=grid, **kwargs)

    monkeypatch.setattr(core, "_lower_as_gpu_kernel", spy)
    n, c = 70_000, 128
    coo = e3j.TensorProduct("0e + 1o", "0e + 1o", filter="0e + 1o").coo
    ring = np.arange(n, dtype=np.int32)
    graph = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), e3j.Graph.from_edges(ring, np.roll(ring, 1), num_nodes=n)
    )
    f32 = functools.partial(jax.ShapeDtypeStruct, dtype=np.float32)
    x, y, dz = f32((n, coo.dim_x, c)), f32((n, coo.dim_y)), f32((n, coo.dim_out, c))
    s = f32((n, coo.num_paths, c))
    h200 = AbstractDevice(device_kind="NVIDIA H200", num_cores=None, platform="cuda")
    tp, conv = mosaic_tensor_product, mosaic_convolution
    calls = [
        (functools.partial(tp.tensor_product, coo, y_channels=False), (x, y)),
        (functools.partial(tp.tensor_product_bwd, coo, outs=("x", "y"), y_channels=False), (x, y, dz)),
        (functools.partial(conv.convolution, coo, y_channels=False), (x, y, s, graph)),
        (functools.partial(conv.convolution_bwd, coo, outs=("x", "y", "s"), y_channels=False), (x, y, s, dz, graph)),
    ]
    with jax.sharding.use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=h200)):
        for fn, args in calls:
            assert MOSAIC_CALL in jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert len(grids) == len(calls)
    for grid in grids:  # CUDA's (x, y, z)
        assert grid[0] >= n and max(grid[1:]) <= 65535, grid


def test_a_store_past_an_axis_fails_to_lower():
    """The check of :func:`stores_in_bounds` sees a ``[32, 4]`` block stored into a ``[16, 4]`` row."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def spill(start_gmem, z_gmem, z_smem):
        z_smem[...] = plgpu.layout_cast(jnp.zeros((32, 4), jnp.float32), plgpu.Layout.WG_STRIDED((32, 4), vec_size=1))
        plgpu.commit_smem()
        # a start read at run time, as the kernels' stores index rows (JAX >= 0.12 refuses this window
        # with a static start when the slice is built, before any lowering)
        plgpu.copy_smem_to_gmem(z_smem, z_gmem.at[0, pl.ds(start_gmem[0], 32), :])
        plgpu.wait_smem_to_gmem(0)

    kernel = plgpu.kernel(
        spill, out_type=jax.ShapeDtypeStruct((2, 16, 4), jnp.float32), scratch_types=[plgpu.SMEM((32, 4), jnp.float32)]
    )
    with pytest.raises(Exception, match=r"out of bounds|reaches past its array"):
        _lower_cuda("NVIDIA H200", kernel, np.zeros((1,), np.int32))


def test_lmax3_forward_lowers_to_mosaic_gpu():
    """The paper's size (lmax 3, 128 channels): both forward kernels."""
    case = Case(3, 128, 2, False)
    coo, x, y, _ = tp_operands(case)
    tp = functools.partial(mosaic_tensor_product.tensor_product, coo, y_channels=False)
    assert MOSAIC_CALL in _lower_cuda("NVIDIA H200", tp, x, y)
    coo, graph, x, y, s, _ = conv_operands(case)
    conv = functools.partial(mosaic_convolution.convolution, coo, y_channels=False)
    assert MOSAIC_CALL in _lower_cuda("NVIDIA H200", conv, x, y, s, graph)


def _lower_e3j_convolution(kind: str, channels: int = 128) -> tuple[str, list[str]]:
    coo, graph, x, y, s, _ = conv_operands(Case(1, channels, 5, False))
    x, y, s = (np.asarray(a, np.float32) for a in (x, y, s))
    conv = e3j.Convolution(coo.irreps_x, coo.irreps_y, coo.irreps_out)

    def loss(x, y, s, g):
        return jax.numpy.sin(conv(x, y, s, g)).sum()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = _lower_cuda(kind, jax.grad(loss, argnums=(0, 1, 2)), x, y, s, graph)
    return text, [str(w.message) for w in caught]


def test_e3j_selects_mosaic_on_hopper_without_the_triton_warning():
    text, messages = _lower_e3j_convolution("NVIDIA H200")
    assert text.count(MOSAIC_CALL) == 2  # the forward and one fused backward
    assert TRITON_CALL not in text
    assert not [m for m in messages if "Triton" in m], messages


def test_e3j_convolution_on_hopper_exports_and_serializes():
    """jax.export guarantees mosaic_gpu_v2 (not Triton's call): a CUDA export of a convolution served
    by Mosaic serializes (docs/usage.md#deploying-with-jaxexport); one served by Triton is refused."""
    pytest.importorskip("flatbuffers")  # jax.export's serialization format
    h200 = AbstractDevice(device_kind="NVIDIA H200", num_cores=None, platform="cuda")
    for channels, serializes in ((128, True), (64, False)):
        coo, graph, x, y, s, _ = conv_operands(Case(1, channels, 5, False))
        x, y, s = (np.asarray(a, np.float32) for a in (x, y, s))
        conv = e3j.Convolution(coo.irreps_x, coo.irreps_y, coo.irreps_out)
        grad = jax.jit(jax.grad(lambda x, y, s, g, conv=conv: jax.numpy.sin(conv(x, y, s, g)).sum()))
        with jax.sharding.use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=h200)):
            if not serializes:  # JAX checks the custom calls when exporting
                with pytest.raises(ValueError, match="custom calls whose targets have no compatibility guarantees"):
                    jax.export.export(grad, platforms=("cuda",))(x, y, s, graph)
                continue
            exported = jax.export.export(grad, platforms=("cuda",))(x, y, s, graph)
        assert exported.mlir_module().count(MOSAIC_CALL) == 2
        assert jax.export.deserialize(exported.serialize()).in_avals == exported.in_avals


def test_e3j_selects_triton_on_hopper_below_128_channels():
    # the Triton convolutions were measured ~2x faster there on an H200 (pallas_mosaic's descriptor)
    text, messages = _lower_e3j_convolution("NVIDIA H200", channels=64)
    assert MOSAIC_CALL not in text
    assert text.count(TRITON_CALL) == 2
    assert not [m for m in messages if "falls back" in m], messages


@pytest.mark.parametrize(("channels", "call"), [(128, TRITON_CALL), (256, MOSAIC_CALL)])
def test_e3j_tensor_product_on_hopper(channels, call):
    # up to 128 channels the Triton tensor product ran faster on an H200 (pallas_mosaic's descriptor)
    coo, x, y, _ = tp_operands(Case(1, channels, 3, False))
    tp = e3j.TensorProduct(coo.irreps_x, coo.irreps_y, coo.irreps_out)
    x, y = (np.asarray(a, np.float32) for a in (x, y))
    text = _lower_cuda("NVIDIA H200", jax.grad(lambda x, y: jax.numpy.sin(tp(x, y)).sum(), argnums=(0, 1)), x, y)
    assert text.count(call) == 2  # the forward and one fused backward
    assert (MOSAIC_CALL if call == TRITON_CALL else TRITON_CALL) not in text


def test_e3j_selects_triton_before_hopper():
    text, _ = _lower_e3j_convolution("NVIDIA A100-SXM4-80GB")
    assert MOSAIC_CALL not in text
    assert text.count(TRITON_CALL) == 2


@pytest.mark.parametrize("factored", [False, True], ids=["array", "factored"])
def test_grouped_convolution_reads_and_writes_e3nn_weights_in_place(factored):
    """Mixed multiplicities whose weight windows the kernels can address, a group of 128 channels on
    Mosaic's kernels and one of 16 on the Triton ones (``mosaic_convolution.on_triton``): each
    group's two launches read e3nn's ``[E, num_weights]`` and the backward launches write their
    columns of the weights' cotangent into one buffer, the first a fresh one, the later one aliased
    (Mosaic's through the state ref threaded through it), with no ``[E, P_g, C_g]`` copy; factored
    weights multiplied out once first. Groups all of at most 64 channels launch Triton kernels only."""
    lower = functools.partial(_lower_cuda, "NVIDIA H200")
    launches = {MOSAIC_CALL: 2, TRITON_CALL: 2}
    for op in (GROUPED_HYBRID, GROUPED_MOSAIC_FIRST):
        check_grouped_lowering(lower, "pallas_mosaic", MOSAIC_CALL, op=op, factored=factored, launches=launches)
    launches = {MOSAIC_CALL: 0, TRITON_CALL: 2 * len(GROUPED_ALIGNED.plan.groups)}
    check_grouped_lowering(
        lower, "pallas_mosaic", MOSAIC_CALL, op=GROUPED_ALIGNED, factored=factored, launches=launches
    )


def _strided_kernel(read_strided: bool):
    """A kernel of one copy-major block row per tile row (channel ``c`` of row ``m`` at ``c · dim + m``):
    with ``read_strided``, it reads each row ``m`` with a strided slice of shared memory and stores it
    contiguous (``out [rows, dim, width]``); otherwise it reads contiguous rows and stores each with a
    strided slice (``out [rows, width · dim]``, copy-major again). Returns ``(kernel factory, x,
    expected output)``."""
    import jax.numpy as jnp
    from e3j_pallas_gpu._mosaic import strided
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    rows, width, dim = 8, 16, 3
    flat = jax.ShapeDtypeStruct((rows, width * dim), jnp.float32)
    split = jax.ShapeDtypeStruct((dim, rows, width), jnp.float32)
    x_type, o_type = (flat, split) if read_strided else (split, flat)

    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, barrier)
        plgpu.barrier_wait(barrier)
        for m in range(dim):
            if read_strided:
                o_smem[m] = strided(2 * x_smem[:, pl.ds(m, width, stride=dim)])
            else:
                o_smem[:, pl.ds(m, width, stride=dim)] = strided(2 * x_smem[m])
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    kernel = functools.partial(
        plgpu.kernel,
        body,
        out_type=o_type,
        scratch_types=[plgpu.SMEM(x_type.shape, jnp.float32), plgpu.SMEM(o_type.shape, jnp.float32)]
        + [plgpu.Barrier(num_arrivals=1)],
    )
    blocks = np.arange(rows * width * dim, dtype=np.float32).reshape(rows, width, dim)  # [row, c, m]
    copy_major, row_major = blocks.reshape(rows, width * dim), blocks.transpose(2, 0, 1)
    x, want = (copy_major, 2 * row_major) if read_strided else (row_major, 2 * copy_major)
    return kernel, x, want


@pytest.mark.parametrize("read_strided", [True, False], ids=["strided reads", "strided writes"])
def test_strided_shared_memory_access_still_does_not_lower(read_strided):
    """Why the grouped kernels split e3nn's node features and join their outputs around the launches:
    reading a row of a copy-major block staged contiguous by the TMA (``x``, ``dm``), or writing one
    (``m``, ``dx``), is a strided slice of shared memory, which Mosaic GPU does not lower (JAX 0.11.2,
    0.12.0.1 and 0.12.1; the interpreter runs it). When this test fails, a JAX upgrade lowers one of
    them: the kernels can then read (or write) e3nn's blocks in place as the Triton ones do
    (docs/mosaic_gpu.md)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    kernel, x, want = _strided_kernel(read_strided)
    # the interpreter runs it: the kernel itself is right
    np.testing.assert_array_equal(np.asarray(kernel(interpret=plgpu.InterpretGPUParams())(x)), want)
    # (with JAX_PALLAS_VERBOSE_ERRORS the error comes wrapped, its message kept)
    with pytest.raises(Exception, match="Strided slices not implemented"):
        _lower_cuda("NVIDIA H200", kernel(), x)


def test_kernels_lower_under_shard_map():
    """The Mosaic kernels lower inside ``shard_map`` with ``check_vma=True`` (``convolution_sharded``'s,
    and a user's map's default; ``pallas_call`` refused the Triton kernels' untyped results there,
    ``plgpu.kernel`` types its own). Value and gradient of a convolution and a tensor product."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = AbstractMesh(
        (2,), ("d",), abstract_device=AbstractDevice(device_kind=HOPPER[1], num_cores=None, platform="cuda")
    )
    conv = e3j.Convolution("0e + 1o", "0e + 1o", filter="0e + 1o")
    tp = e3j.TensorProduct("0e + 1o", "0e + 1o", filter="0e + 1o")
    ring = np.arange(6)
    graph = e3j.Graph.from_edges(ring, np.roll(ring, 1), 6)

    def body(x, y, s):
        m = conv(x[0], y[0], s[0], graph, backend="pallas_mosaic")
        z = tp(x[0], y[0, :6], backend="pallas_mosaic")
        return jax.lax.psum(jax.numpy.sum(m**2) + jax.numpy.sum(z**2), "d")

    f = jax.value_and_grad(jax.shard_map(body, mesh=mesh, in_specs=(P("d"),) * 3, out_specs=P()), argnums=(0, 1, 2))
    sharded = NamedSharding(mesh, P("d"))
    shapes = [
        jax.ShapeDtypeStruct(shape, np.float32, sharding=sharded)
        for shape in ((2, 6, 4, 16), (2, 6, 4), (2, 6, conv.num_paths, 16))
    ]
    with jax.sharding.use_abstract_mesh(mesh):
        text = jax.jit(f).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count(MOSAIC_CALL) >= 4, text.count(MOSAIC_CALL)
