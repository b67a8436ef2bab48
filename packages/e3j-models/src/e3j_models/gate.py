"""Gated nonlinearity on e3j-layout features ``[N, D, C]``.

For output irreps ``irreps_out`` (each block ``C`` channels) the input holds the same irreps plus one
``0e`` gate per copy of a non-scalar irrep, merged into the ``0e`` block after the ``0e`` scalars
(:func:`gate_irreps_in`). Scalars go through an activation (``silu`` for ``0e``, ``tanh`` for ``0o``:
odd, so parity is kept), gates through ``sigmoid``, and every non-scalar copy is multiplied by its
gate channel by channel. Rotations act on non-scalars only through the ``2l+1`` rows, which the
(rotation-invariant) gates scale uniformly, so the result is equivariant.

>>> import jax.numpy as jnp
>>> gate_irreps_in("0e + 1o")
2x0e+1x1o
>>> gate(jnp.ones((2, 5, 4)), "0e + 1o").shape
(2, 4, 4)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from e3j import Irrep, Irreps
from e3j_core import as_irreps

from ._checks import check_array

__all__ = ["gate", "gate_irreps_in"]

_SCALAR_E, _SCALAR_O = Irrep("0e"), Irrep("0o")


def _gated_count(irreps: Irreps) -> int:
    return sum(mul for mul, ir in irreps if ir.l > 0)


def gate_irreps_in(irreps_out) -> Irreps:
    """The irreps :func:`gate` takes to produce ``irreps_out`` (sorted, merged)."""
    irreps_out = as_irreps(irreps_out, "irreps_out").regroup()
    gates = _gated_count(irreps_out)
    return (Irreps([(gates, _SCALAR_E)]) + irreps_out).regroup() if gates else irreps_out


def gate(x: jax.Array, irreps_out) -> jax.Array:
    """``x [N, D_in, C]`` (irreps :func:`gate_irreps_in`) -> ``[N, D_out, C]`` (``irreps_out``, regrouped)."""
    irreps_out = as_irreps(irreps_out, "irreps_out").regroup()
    irreps_in = gate_irreps_in(irreps_out)
    check_array("x", x)
    if jnp.ndim(x) != 3 or x.shape[1] != irreps_in.dim:
        raise ValueError(f"x must be [N, {irreps_in.dim}, C] for gate input irreps {irreps_in}, got {x.shape}")
    n_even = irreps_out.count(_SCALAR_E)
    gates_at = n_even  # the gates follow the 0e scalars inside the 0e block
    blocks, start, gate_index = [], 0, 0
    for mul, ir in irreps_in:
        size = mul * ir.dim
        block = x[:, start : start + size, :]
        start += size
        if ir == _SCALAR_E:
            blocks.append(jax.nn.silu(block[:, :n_even, :]))
            gates = jax.nn.sigmoid(block[:, gates_at:, :])
        elif ir == _SCALAR_O:
            blocks.append(jnp.tanh(block))
        else:
            g = gates[:, gate_index : gate_index + mul, :]  # one gate per copy
            gate_index += mul
            copies = block.reshape(x.shape[0], mul, ir.dim, x.shape[2]) * g[:, :, None, :]
            blocks.append(copies.reshape(x.shape[0], size, x.shape[2]))
    return jnp.concatenate(blocks, axis=1)
