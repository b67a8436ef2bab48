"""``e3nn.tensor_product`` on e3j's kernels, ``IrrepsArray`` in and out."""

from __future__ import annotations

import math
from functools import lru_cache

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp

from e3j_core import Irrep, Irreps, MulIrrep
from e3j_core.coo import normalize_filter

from .._checks import promoted_real_dtype
from .._mul_ir_pruning import pruned
from ..mul_ir import MulIrTensorProduct
from ._operands import REAL, check_irrep_normalization
from .layout import to_e3nn_irreps

__all__ = ["tensor_product"]


def tensor_product(
    input1: e3nn.IrrepsArray,
    input2: e3nn.IrrepsArray,
    *,
    filter_ir_out=None,
    irrep_normalization: str | None = None,
    regroup_output: bool = True,
    grouping: str = "multiplicity",
    backend: str | None = None,
) -> e3nn.IrrepsArray | e3nn.Irreps:
    """Equal to ``e3nn.tensor_product(input1, input2, filter_ir_out=..., ...)``: same irreps, same layout.

    This is :class:`e3j.MulIrTensorProduct`: ``input1``'s blocks are grouped by multiplicity, each
    group one e3j tensor product with that many channels (``grouping="gcd"``: one product with the
    gcd as channels); ``input2`` is broadcast over them. Leading shapes broadcast as in e3nn-jax.
    The outputs are put in e3nn's flat layout and order by static runs (one split per group, then a
    concatenation); when ``input2`` has a
    multiplicity above 1, e3nn numbers those copies inside the channels and the output is gathered
    with a static index instead. Given two irreps without arrays (strings, ``Irreps``), it returns
    the output's irreps, as e3nn-jax does. ``zero_flags``, e3nn's static marks of blocks known to be
    zero, are read as e3nn-jax reads them: a marked input block counts as zero whatever its data,
    the products that read one are skipped (the product runs over the other blocks), and an
    output block is marked where every product into it has a marked input, so code that
    reads them (``.remove_zero_chunks()``, ``.chunks``) sees the same array.

    >>> import jax.numpy as jnp
    >>> x = e3nn.IrrepsArray("4x0e + 4x1o", jnp.ones((2, 16)))
    >>> y = e3nn.IrrepsArray("0e + 1o", jnp.ones((2, 4)))
    >>> z = tensor_product(x, y, filter_ir_out="0e + 1o")
    >>> z.irreps, bool(jnp.allclose(z.array, e3nn.tensor_product(x, y, filter_ir_out="0e + 1o").array))
    (8x0e+8x1o, True)
    >>> tensor_product("2x1e + 2e", "2e", filter_ir_out="0e + 1e + 2e")
    1x0e+3x1e+3x2e
    """
    for name, value in (("input1", input1), ("input2", input2)):
        if value is None:
            raise TypeError(f"{name} must be an e3nn.IrrepsArray (or an array of scalars), got None")
    filter_ir_out = normalize_filter(filter_ir_out, "filter_ir_out")  # any irreps form, e3j's included
    e3nn_filter = None if filter_ir_out is None else [e3nn.Irrep(ir.l, ir.p) for ir in filter_ir_out]
    if _is_irreps(input1) and _is_irreps(input2):  # as e3nn-jax: irreps in, the output's irreps out
        return e3nn.tensor_product(to_e3nn_irreps(Irreps(input1)), to_e3nn_irreps(Irreps(input2)),
                                   filter_ir_out=e3nn_filter, regroup_output=regroup_output)  # fmt: skip
    operands = (("input1", input1, "input2", type(input2)), ("input2", input2, "input1", type(input1)))
    for name, value, other, kind in operands:
        if _is_irreps(value):  # e3j's Irrep, a tuple, would otherwise be read as an array of data
            raise TypeError(
                f"{name} is irreps ({value!r}) but {other} is {kind.__name__}: give two IrrepsArrays "
                "(or arrays of scalars), or two irreps for the output's irreps"
            )
    input1, input2 = e3nn.as_irreps_array(input1), e3nn.as_irreps_array(input2)
    # as e3nn-jax's tensor product: its inputs' weak types dropped (integers give the default float)
    dtype = promoted_real_dtype({"input1": input1.array.dtype, "input2": input2.array.dtype}, REAL)
    irrep_normalization = check_irrep_normalization(irrep_normalization)
    irreps_x, irreps_y = Irreps(input1.irreps), Irreps(input2.irreps)
    try:
        leading = jnp.broadcast_shapes(input1.shape[:-1], input2.shape[:-1])
    except ValueError:
        raise ValueError(
            "input1 and input2 must have leading shapes that broadcast, "
            f"got {input1.shape[:-1]} and {input2.shape[:-1]}"
        ) from None
    expected = e3nn.tensor_product(input1.irreps, input2.irreps, filter_ir_out=e3nn_filter,
                                   regroup_output=regroup_output)  # fmt: skip
    flags = None
    if any(input1.zero_flags) or any(input2.zero_flags):
        flags = _zero_flags(input1.irreps, input1.zero_flags, input2.irreps, input2.zero_flags,
                            None if e3nn_filter is None else tuple(e3nn_filter), regroup_output)  # fmt: skip
    if expected.dim == 0 or irreps_x.dim == 0 or irreps_y.dim == 0:
        return e3nn.IrrepsArray(expected, jnp.zeros((*leading, expected.dim), dtype), zero_flags=flags)
    maps = None
    if flags is not None:
        # e3nn-jax skips every product that reads a marked block: so does this call
        maps = pruned(irreps_x, irreps_y, filter_ir_out, None, irrep_normalization, regroup_output,
                      tuple(input1.zero_flags), tuple(input2.zero_flags))  # fmt: skip
        if maps is None:
            return e3nn.IrrepsArray(expected, jnp.zeros((*leading, expected.dim), dtype), zero_flags=flags)
        irreps_x, irreps_y = maps.irreps_x, maps.irreps_y
    tp = MulIrTensorProduct(
        irreps_x,
        irreps_y,
        filter_ir_out,
        normalization=irrep_normalization,
        regroup_output=regroup_output,
        grouping=grouping,
    )
    batch = math.prod(leading)
    x, y = input1.array, input2.array
    if maps is not None:  # the blocks left are unmarked (without maps, no block is)
        x, y = maps.x(x), maps.y(y)
    x = jnp.broadcast_to(x.astype(dtype), (*leading, irreps_x.dim)).reshape(batch, irreps_x.dim)
    y = jnp.broadcast_to(y.astype(dtype), (*leading, irreps_y.dim)).reshape(batch, irreps_y.dim)
    out = tp(x, y, backend=backend)
    if maps is None:
        return e3nn.IrrepsArray(to_e3nn_irreps(tp.irreps_out), out.reshape(*leading, tp.irreps_out.dim))
    return e3nn.IrrepsArray(expected, maps.place(out).reshape(*leading, expected.dim), zero_flags=flags)


@lru_cache(maxsize=256)
def _zero_flags(irreps1, flags1, irreps2, flags2, filter_ir_out, regroup_output) -> tuple[bool, ...]:
    """The output's ``zero_flags`` as ``e3nn.tensor_product`` sets them for inputs so marked: its
    own rule (a block is zero where every product into it has a marked input, merged as it sorts
    and regroups), read from it traced on abstract operands, so no rule of e3nn's is written twice
    and no data is touched."""
    found = []

    def product(a, b):
        out = e3nn.tensor_product(e3nn.IrrepsArray(irreps1, a, zero_flags=flags1),
                                  e3nn.IrrepsArray(irreps2, b, zero_flags=flags2),
                                  filter_ir_out=filter_ir_out, regroup_output=regroup_output)  # fmt: skip
        found.append(out.zero_flags)
        return out.array

    jax.eval_shape(product, *(jax.ShapeDtypeStruct((i.dim,), jnp.float32) for i in (irreps1, irreps2)))
    return tuple(found[0])


def _is_irreps(value) -> bool:
    """Irreps without an array (a string, e3nn's or e3j's ``Irreps`` or ``Irrep``), as e3nn-jax's overload
    reads them; e3j's ``Irrep`` and ``MulIrrep`` are tuples, which ``e3nn.as_irreps_array`` would read
    as arrays."""
    return isinstance(value, (str, e3nn.Irreps, e3nn.Irrep, e3nn.MulIrrep, Irreps, Irrep, MulIrrep))
