"""Equivariant linear layer: per-irrep mixing of copies and channels."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import jax
import jax.numpy as jnp

from e3j_core import Irrep, Irreps, as_irreps

from ._checks import check_positive_int, check_rank, float_dtype
from .layout import irrep_blocks

__all__ = ["Linear"]


class Linear:
    """``[B, D_in, C_in] -> [B, D_out, C_out]`` mixing, for each irrep, all its input copies and
    channels into each output copy and channel (the only equivariant linear maps).

    Weights are plain arrays: ``params = lin.init(key)`` gives one
    ``[mul_in(ir), mul_out(ir), C_in, C_out]`` array per output irrep (keyed by its string);
    ``lin(params, x)`` applies them with e3nn's fan-in normalization ``1/sqrt(mul_in · C_in)``.
    Output irreps absent from the input get zeros. The computation runs in ``x``'s dtype: weights
    of another floating dtype are cast to it (float32 weights with float64 features compute in
    float64, float32 master weights with bfloat16 activations in bfloat16), as Flax's ``dtype=``
    does; this is the one op whose operands may differ in dtype (docs/inputs.md).

    >>> import jax, jax.numpy as jnp
    >>> lin = Linear("2x0e + 1o", "0e + 2x1o", channels_in=4, channels_out=3)
    >>> params = lin.init(jax.random.key(0))
    >>> {k: v.shape for k, v in params.items()}
    {'0e': (2, 1, 4, 3), '1o': (1, 2, 4, 3)}
    >>> lin(params, jnp.ones((5, 5, 4))).shape
    (5, 7, 3)
    """

    def __init__(
        self,
        irreps_in: Irreps | str | Iterable,
        irreps_out: Irreps | str | Iterable,
        *,
        channels_in: int,
        channels_out: int,
    ) -> None:
        self.irreps_in = as_irreps(irreps_in, "irreps_in")
        self.irreps_out = as_irreps(irreps_out, "irreps_out")
        self.channels_in = check_positive_int("channels_in", channels_in)
        self.channels_out = check_positive_int("channels_out", channels_out)
        self._copies_in = _copies_by_irrep(self.irreps_in)
        self._copies_out = _copies_by_irrep(self.irreps_out)

    def _key(self) -> tuple:
        return (self.irreps_in, self.irreps_out, self.channels_in, self.channels_out)

    # equal maps for equal arguments (a static `jit` argument built again must not compile again)
    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(("Linear", *self._key()))

    def weight_shapes(self) -> dict[str, tuple[int, int, int, int]]:
        """``{str(ir): (mul_in, mul_out, channels_in, channels_out)}`` for each irrep both sides hold."""
        return {
            str(ir): (self._copies_in[ir], copies, self.channels_in, self.channels_out)
            for ir, copies in self._copies_out.items()
            if ir in self._copies_in
        }

    def init(self, key: jax.Array, dtype=jnp.float32) -> dict[str, jax.Array]:
        """Weights of :meth:`weight_shapes`, standard normal (the normalization is in the call)."""
        shapes = self.weight_shapes()
        keys = jax.random.split(key, max(1, len(shapes)))
        return {name: jax.random.normal(k, shape, dtype) for k, (name, shape) in zip(keys, shapes.items())}

    def __call__(self, params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        check_rank("x", x, (3,), f"[B, D_in={self.irreps_in.dim}, C_in={self.channels_in}]")
        dtype = float_dtype("x", x)
        if x.shape[1:] != (self.irreps_in.dim, self.channels_in):
            raise ValueError(
                f"x must be [B, {self.irreps_in.dim}, {self.channels_in}] for {self.irreps_in}, got {x.shape}"
            )
        expected = self.weight_shapes()
        if not isinstance(params, Mapping):
            raise TypeError(f"params must be a dict of arrays (see Linear.init), got {type(params).__name__}")
        if set(params) != set(expected):
            raise ValueError(f"params must have keys {sorted(expected)}, got {sorted(params)}")
        for name, shape in expected.items():
            float_dtype(f"params['{name}']", params[name])  # weights cast to x's dtype below, never from ints
            if jnp.shape(params[name]) != shape:
                raise ValueError(f"params['{name}'] must have shape {shape}, got {jnp.shape(params[name])}")
        # Rows move by static slices: one split of x into its (mul, ir) blocks and one concatenation of
        # the output blocks. Index arrays (a gather in, a scatter out) made the backward a scatter-add
        # and the forward a scatter, both slow on XLA's CPU; split's transpose is a concatenation.
        batch = x.shape[0]
        parts_in: dict[Irrep, list[jax.Array]] = {}
        for (mul, ir), part in zip(self.irreps_in, irrep_blocks(x, self.irreps_in)):
            if mul:
                parts_in.setdefault(ir, []).append(part)
        blocks = {}
        for ir in self._copies_out:
            if ir not in parts_in:
                continue
            parts = parts_in[ir]
            xin = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)
            scale = 1.0 / math.sqrt(self._copies_in[ir] * self.channels_in)
            blocks[ir] = jnp.einsum("buic,uvcd->bvid", xin, params[str(ir)].astype(dtype)) * scale
        out_parts, used = [], dict.fromkeys(blocks, 0)  # copies of each irrep already placed
        for mul, ir in self.irreps_out:
            if not mul:
                continue
            if ir in blocks:
                block = blocks[ir]
                if mul != block.shape[1]:
                    block = block[:, used[ir] : used[ir] + mul]
                used[ir] += mul
                out_parts.append(block.reshape(batch, mul * ir.dim, self.channels_out))
            else:
                out_parts.append(jnp.zeros((batch, mul * ir.dim, self.channels_out), dtype))
        if not out_parts:
            return jnp.zeros((batch, 0, self.channels_out), dtype)
        return out_parts[0] if len(out_parts) == 1 else jnp.concatenate(out_parts, axis=1)


def _copies_by_irrep(irreps: Irreps) -> dict[Irrep, int]:
    """For each irrep present (multiplicity > 0), its number of copies, in order of first appearance."""
    out: dict[Irrep, int] = {}
    for mul, ir in irreps:
        if mul:
            out[ir] = out.get(ir, 0) + mul
    return out
