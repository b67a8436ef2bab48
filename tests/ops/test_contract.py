"""The kernel contract (e3j.contract): what a kernel receives, and what e3j checks it returns."""

from __future__ import annotations

import e3j_test_backend
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from installed import require_backend

import e3j
from e3j import contract
from e3j.contract import Kernels

IRREPS = "0e + 1o"


def test_needed_operands_per_output():
    assert contract.needed("tensor_product", ("z",)) == ("x", "y")
    assert contract.needed("tensor_product", ("x",)) == ("y",)
    assert contract.needed("tensor_product", ("y",)) == ("x",)
    assert contract.needed("tensor_product", ("x", "y")) == ("x", "y")
    assert contract.needed("convolution", ("m",)) == ("x", "y", "s")
    assert contract.needed("convolution", ("x",)) == ("y", "s")
    assert contract.needed("convolution", ("y",)) == ("x", "s")
    assert contract.needed("convolution", ("s",)) == ("x", "y")
    assert contract.needed("convolution", ("y", "s")) == ("x", "y", "s")
    with pytest.raises(ValueError, match="no output slot"):
        contract.needed("convolution", ("z",))


class Recorder:
    """Kernels that record what they receive and return arrays of the documented shapes: zeros, but
    the tensor product's forward ``arange`` (a result that only the kernel made)."""

    def __init__(self, wrong_shape: bool = False):
        self.received: list[dict] = []
        self.wrong_shape = wrong_shape

    def _note(self, kernel, outs, **operands):
        self.received.append(
            {
                "kernel": kernel,
                "outs": outs,
                "given": tuple(k for k, v in operands.items() if v is not None),
                "dtypes": {v.dtype for v in operands.values() if v is not None},
            }
        )

    def kernels(self, coo) -> Kernels:
        def tp(coo_, x, y, *, y_channels):
            self._note("tensor_product", None, x=x, y=y)
            shape = (x.shape[0], coo.dim_out + self.wrong_shape, x.shape[2])
            return jnp.arange(np.prod(shape), dtype=x.dtype).reshape(shape)

        def tp_bwd(coo_, x, y, dz, *, outs, y_channels):
            self._note("tensor_product_bwd", outs, x=x, y=y, dz=dz)
            shapes = {"x": (dz.shape[0], coo.dim_x, dz.shape[2]), "y": (dz.shape[0], coo.dim_y)}
            return {o: jnp.zeros(shapes[o], dz.dtype) for o in outs}

        def conv(coo_, x, y, s, graph, *, y_channels):
            self._note("convolution", None, x=x, y=y, s=s)
            return jnp.zeros((x.shape[0], coo.dim_out, x.shape[2]), x.dtype)

        def conv_bwd(coo_, x, y, s, dm, graph, *, outs, y_channels):
            self._note("convolution_bwd", outs, x=x, y=y, s=s, dm=dm)
            e = graph.num_edges
            shapes = {
                "x": (dm.shape[0], coo.dim_x, dm.shape[2]),
                "y": (e, coo.dim_y),
                "s": (e, coo.num_paths, dm.shape[2]),
            }
            return {o: jnp.zeros(shapes[o], jnp.float32) for o in outs}  # float32: wrong for float64 calls

        return Kernels(tp, tp_bwd, conv, conv_bwd)


def _conv_setup(num_edges=3, dtype=jnp.float64):
    conv = e3j.Convolution(IRREPS, IRREPS, filter=IRREPS)
    graph = e3j.Graph.from_edges(np.arange(num_edges) % 2, (np.arange(num_edges) + 1) % 2, num_nodes=2)
    x = jnp.ones((2, conv.coo.dim_x, 4), dtype)
    y = jnp.ones((num_edges, conv.coo.dim_y), dtype)
    s = jnp.ones((num_edges, conv.num_paths, 4), dtype)
    return conv, graph, x, y, s


def _result_type(shapes, dtype):
    return lambda slot: jax.ShapeDtypeStruct(shapes[slot], dtype)


def test_backward_kernel_receives_only_the_operands_it_reads_in_one_dtype():
    tp = e3j.TensorProduct(IRREPS, IRREPS, filter=IRREPS)
    rec = Recorder()
    x = jnp.ones((3, 4, 2), jnp.float64)
    y = jnp.ones((3, 4), jnp.float32)  # the contract casts to the op's dtype
    dz = jnp.ones((3, tp.coo.dim_out, 2), jnp.float64)
    shapes = {"x": x.shape, "y": (3, 4), "z": dz.shape}
    out = contract.run(
        "tensor_product",
        rec.kernels(tp.coo),
        "recorder",
        tp.coo,
        {"x": x, "y": y, "z": dz},
        None,
        ("x",),
        y_channels=False,
        result_type=_result_type(shapes, jnp.float64),
    )
    assert set(out) == {"x"}
    (call,) = rec.received
    assert call["kernel"] == "tensor_product_bwd" and call["outs"] == ("x",)
    assert call["given"] == ("y", "dz")  # x is not read by dx
    assert call["dtypes"] == {jnp.dtype(jnp.float64)}


def test_forward_and_backward_outputs_are_one_forward_and_one_fused_backward_call():
    conv, graph, x, y, s = _conv_setup()
    rec = Recorder()
    dm = jnp.ones((2, conv.coo.dim_out, 4))
    shapes = {"m": dm.shape, "x": x.shape, "y": y.shape, "s": s.shape}
    with pytest.raises(TypeError, match=r"backend 'recorder': convolution_bwd returned x as float32"):
        contract.run(
            "convolution",
            rec.kernels(conv.coo),
            "recorder",
            conv.coo,
            {"x": x, "y": y, "s": s, "m": dm},
            graph,
            ("s", "m", "x"),
            y_channels=False,
            result_type=_result_type(shapes, jnp.float64),
        )
    assert [c["kernel"] for c in rec.received] == ["convolution", "convolution_bwd"]
    assert rec.received[1]["outs"] == ("x", "s")  # slot order, forward output split off
    assert rec.received[1]["given"] == ("x", "y", "s", "dm")


def test_forward_output_is_the_kernel_array():
    tp = e3j.TensorProduct(IRREPS, IRREPS, filter=IRREPS)
    x, y = jnp.ones((3, 4, 2)), jnp.ones((3, 4))
    out = contract.run(
        "tensor_product",
        Recorder().kernels(tp.coo),
        "recorder",
        tp.coo,
        {"x": x, "y": y},
        None,
        ("z",),
        y_channels=False,
        result_type=_result_type({"z": (3, tp.coo.dim_out, 2)}, x.dtype),
    )
    assert list(out) == ["z"] and isinstance(out["z"], jax.Array) and out["z"].shape == (3, tp.coo.dim_out, 2)
    np.testing.assert_array_equal(out["z"], np.arange(3 * tp.coo.dim_out * 2).reshape(3, tp.coo.dim_out, 2))


def test_a_kernel_returning_a_wrong_shape_is_named():
    tp = e3j.TensorProduct(IRREPS, IRREPS, filter=IRREPS)
    x, y = jnp.ones((3, 4, 2)), jnp.ones((3, 4))
    with pytest.raises(TypeError, match=r"backend 'bad': tensor_product returned z as float\w+\[3, 9, 2\], expected"):
        contract.run(
            "tensor_product",
            Recorder(wrong_shape=True).kernels(tp.coo),
            "bad",
            tp.coo,
            {"x": x, "y": y},
            None,
            ("z",),
            y_channels=False,
            result_type=_result_type({"z": (3, tp.coo.dim_out, 2)}, x.dtype),
        )


def test_grouped_kernels_get_the_plan_and_only_what_they_read():
    """The grouped kernels take a plan and no ``y_channels``; ``run`` splits the forward from the
    fused backward and passes only the operands each reads, as for the uniform ops."""
    _, graph, *_ = _conv_setup()
    conv = e3j.MulIrConvolution("4x0e + 2x1o", "0e + 1o", filter="0e + 1o")
    plan = conv.plan
    received = []

    def fwd(plan_, x, y, s, graph_):
        received.append(("fwd", plan_ is plan, x is None, y is None, s is None))
        return jnp.zeros((graph_.num_nodes, plan.irreps_out.dim), x.dtype)

    def bwd(plan_, x, y, s, dm, graph_, *, outs):
        received.append(("bwd", outs, x is None, y is None, s is None))
        return {"s": jnp.zeros((graph_.num_edges, plan.num_weights), dm.dtype)}

    kernels = Kernels(grouped_convolution=fwd, grouped_convolution_bwd=bwd)
    e, n = graph.num_edges, graph.num_nodes
    shapes = {"m": (n, plan.irreps_out.dim), "s": (e, plan.num_weights)}
    operands = {
        "x": jnp.ones((n, plan.irreps_x.dim)),
        "y": jnp.ones((e, plan.groups[0].coo.dim_y)),
        "s": jnp.ones((e, plan.num_weights)),
        "m": jnp.ones(shapes["m"]),
    }
    out = contract.run(
        "grouped_convolution", kernels, "rec", plan, operands, graph, ("m", "s"),
        result_type=_result_type(shapes, jnp.float32),
    )  # fmt: skip
    assert sorted(out) == ["m", "s"]
    assert received == [("fwd", True, False, False, False), ("bwd", ("s",), False, False, True)]
    with pytest.raises(ValueError, match="y_channels is given for grouped_convolution exactly when"):
        contract.run(
            "grouped_convolution", kernels, "rec", plan, operands, graph, ("m",), y_channels=False,
            result_type=_result_type(shapes, jnp.float32),
        )  # fmt: skip
    with pytest.raises(ValueError, match="y_channels is given for convolution exactly when"):
        contract.run(
            "convolution", kernels, "rec", plan, operands, graph, ("m",),
            result_type=_result_type(shapes, jnp.float32),
        )  # fmt: skip


def test_empty_graph_never_reaches_a_kernel():
    conv, graph, x, y, s = _conv_setup(num_edges=0)
    e3j_test_backend.calls.clear()

    def loss(x, s):
        return jnp.sum(conv(x, y, s, graph, backend="test") ** 2)

    value, (dx, ds) = jax.value_and_grad(loss, argnums=(0, 1))(x, s)
    assert float(value) == 0.0 and dx.shape == x.shape and ds.shape == (0, conv.num_paths, 4)
    assert not np.any(np.asarray(dx))
    assert e3j_test_backend.calls == []


@pytest.mark.parametrize(
    "backend", ["test", "pallas_gpu_interpret", "pallas_tpu_interpret", "pallas_mosaic_interpret", "cuda_host"]
)
def test_zero_channels_never_reach_a_kernel(backend):
    # C = 0: zeros of the right shapes, as the reference gives; the kernels' tilings divide by C
    require_backend(backend)
    conv, graph, x, y, s = _conv_setup(dtype=jnp.float32)
    x, s = x[..., :0], s[..., :0]
    tp = e3j.TensorProduct(IRREPS, IRREPS, filter=IRREPS)
    e3j_test_backend.calls.clear()
    assert conv(x, y, s, graph, backend=backend).shape == (2, conv.coo.dim_out, 0)
    assert tp(x, y[:2], backend=backend).shape == (2, tp.coo.dim_out, 0)

    def loss(x, y, s):
        return jnp.sum(conv(x, y, s, graph, backend=backend)) + jnp.sum(tp(x, y[:2], backend=backend))

    dx, dy, ds = jax.grad(loss, argnums=(0, 1, 2))(x, y, s)
    assert (dx.shape, ds.shape) == (x.shape, s.shape) and dy.shape == y.shape and not np.any(np.asarray(dy))
    assert e3j_test_backend.calls == []


def test_public_op_reaches_the_kernel_through_the_contract():
    conv, graph, x, y, s = _conv_setup()
    e3j_test_backend.calls.clear()
    dx = jax.grad(lambda x: jnp.sum(conv(x, y, s, graph, backend="test") ** 2))(x)
    want = jax.grad(lambda x: jnp.sum(conv(x, y, s, graph, backend="reference") ** 2))(x)
    np.testing.assert_allclose(dx, want, rtol=1e-12)
    assert e3j_test_backend.calls == ["convolution", "convolution_bwd"]


def test_eager_calls_keep_a_bounded_number_of_programs():
    # one compiled program per static setting of an eager (un-jitted) call, least recently used
    # dropped past EAGER_PROGRAMS: unbounded, a loop over many irreps exhausted the memory maps
    from e3j._primitives import multilinear
    from e3j._primitives.convolution import CONVOLUTION

    info = multilinear._jitted.cache_info()
    assert info.maxsize == multilinear.EAGER_PROGRAMS
    # past the bound the least recently used goes (a jax.jit is made, not compiled, until called)
    prim = CONVOLUTION.M
    first = multilinear._jitted(prim, (("setting", -1),))
    for i in range(multilinear.EAGER_PROGRAMS):
        multilinear._jitted(prim, (("setting", i),))
    assert multilinear._jitted.cache_info().currsize == multilinear.EAGER_PROGRAMS
    assert multilinear._jitted(prim, (("setting", -1),)) is not first  # dropped, made again
    conv, graph, x, y, s = _conv_setup()
    conv(x, y, s, graph, backend="reference")
    size = multilinear._jitted.cache_info().currsize
    conv(x, y, s, graph, backend="reference")  # the same setting: no new program
    assert 0 < multilinear._jitted.cache_info().currsize == size <= multilinear.EAGER_PROGRAMS
