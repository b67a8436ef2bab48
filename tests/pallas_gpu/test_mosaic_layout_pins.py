"""Every shared-memory row load of the Mosaic tensor-product kernels is pinned to the strided layout.

Mosaic GPU's layout inference settles the layouts of a kernel whose loads are all pinned
(``plgpu.layout_cast`` to ``WG_STRIDED``) by propagation alone; one unpinned load leaves it a search
that re-reduces the whole constraint system per variable: lowering an lmax-3 tensor product took
3-4x longer (docs/mosaic_gpu.md, "Lowering cost"). This guard needs no clock and no CUDA plugin: it
traces the kernels to a jaxpr on the CPU and checks that each vector ``get`` from a shared-memory ref
feeds only strided ``layout_cast`` equations.
"""

import functools

import jax
import numpy as np
import pytest
from e3j_pallas_gpu import mosaic_tensor_product
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.extend import core as jcore
from kernel_cases import Case, tp_operands

# one-row tiles (broadcast y read as scalars) and 8-row tiles (per-channel y staged in shared memory)
CASES = [Case(2, 128, 2, False), Case(2, 16, 9, True)]


def _subjaxprs(params: dict):
    for value in params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, jcore.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, jcore.Jaxpr):
                yield v


def _is_strided_pin(eqn) -> bool:
    return eqn.primitive.name == "layout_cast" and eqn.params["new_layout"].layout_cls == plgpu.Layout.WG_STRIDED


def _is_smem_row_load(eqn) -> bool:
    if eqn.primitive.name != "get":
        return False
    ref, out = eqn.invars[0].aval, eqn.outvars[0].aval
    return str(ref.memory_space) == "smem" and out.ndim >= 1


def row_loads(jaxpr) -> tuple[int, list[str]]:
    """``(number of shared-memory row loads, the unpinned ones)`` in ``jaxpr`` and all its sub-jaxprs.

    A load is pinned when it has uses and all of them, in its own jaxpr, are strided ``layout_cast``s.
    """
    loads, unpinned = 0, []
    uses: dict = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if isinstance(v, jcore.Var):
                uses.setdefault(v, []).append(eqn)
    outs = {v for v in jaxpr.outvars if isinstance(v, jcore.Var)}
    for eqn in jaxpr.eqns:
        if _is_smem_row_load(eqn):
            loads += 1
            out = eqn.outvars[0]
            consumers = uses.get(out, [])
            if out in outs or not consumers or not all(_is_strided_pin(c) for c in consumers):
                unpinned.append(str(eqn))
        for sub in _subjaxprs(eqn.params):
            n, bad = row_loads(sub)
            loads, unpinned = loads + n, unpinned + bad
    return loads, unpinned


def _shapes(*arrays):
    return [jax.ShapeDtypeStruct(np.shape(a), np.float32) for a in arrays]


def _kernels(case: Case):
    """``(name, closed jaxpr)`` of the forward and of each backward the tensor product lowers."""
    coo, x, y, dz = tp_operands(case)
    yc = case.y_channels
    x, y, dz = _shapes(x, y, dz)
    yield "fwd", jax.make_jaxpr(functools.partial(mosaic_tensor_product.tensor_product, coo, y_channels=yc))(x, y)
    for outs in (("x", "y"), ("x",), ("y",)):
        bwd = functools.partial(mosaic_tensor_product.tensor_product_bwd, coo, outs=outs, y_channels=yc)
        yield f"bwd-{'+'.join(outs)}", jax.make_jaxpr(bwd)(x, y, dz)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_tensor_product_row_loads_are_pinned(case):
    for name, closed in _kernels(case):
        loads, unpinned = row_loads(closed.jaxpr)
        # every operand row the records read is loaded once (lmax 2: 9 rows of x, 9 of dz, ...)
        assert loads >= case.coo.dim_x, f"{name}: only {loads} shared-memory row loads found: the walk is broken"
        assert not unpinned, f"{name}: {len(unpinned)} of {loads} row loads are not pinned, e.g. {unpinned[0]}"


def test_the_guard_sees_an_unpinned_load():
    """A kernel with one pinned and one bare shared-memory row load: the bare one is reported."""
    import jax.numpy as jnp

    def body(o_gmem, a_smem):
        pinned = plgpu.layout_cast(a_smem[0, :], plgpu.Layout.WG_STRIDED((128,), vec_size=1))
        bare = a_smem[1, :]
        o_gmem[...] = pinned + bare

    kernel = plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((128,), jnp.float32), scratch_types=[plgpu.SMEM((2, 128), jnp.float32)]
    )
    loads, unpinned = row_loads(jax.make_jaxpr(kernel)().jaxpr)
    assert loads == 2
    assert len(unpinned) == 1 and "[1" in unpinned[0], unpinned
