"""An equivariant linear layer on e3j's ``[..., D, C]`` arrays with ``e3nn_jax.flax.Linear``'s parameters."""

from __future__ import annotations

import math
import numbers

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from e3j_core import Irreps, as_irreps

from .._checks import check_bool, check_positive_int, check_rank, float_dtype, is_irreps_array

__all__ = ["Linear"]

_NORMALIZATION = {"element": 0.0, "path": 1.0}


class Linear(nn.Module):
    """``[..., D_in, C_in] -> [..., D_out, C_out]``, the parameters of ``e3nn.flax.Linear``.

    The arrays are e3j's (irreps ``irreps_in`` with ``C_in`` trailing channels); the parameters
    are those ``e3nn.flax.Linear(mul_ir_irreps(irreps_out, channels_out))`` creates for an input
    of irreps ``mul_ir_irreps(irreps_in, C_in)`` (e3nn's flat layout): one ``"w[i,j] {in},{out}"``
    array ``[mul_in, mul_out]`` per pair of equal irreps of the regrouped input and the simplified
    output, normal with std ``1`` (e3nn's default ``gradient_normalization="path"``), and the output
    scaled by ``1/sqrt(fan_in)`` (``path_normalization="element"``). Copy ``u`` of e3nn's block is
    copy ``u // C``, channel ``u % C`` of e3j's (:func:`e3j.from_mul_ir`), so the same parameters
    give the same function: ``to_mul_ir(Linear(...)(x)) == e3nn.flax.Linear(...)(to_mul_ir(x))``.

    ``channel_axis=True`` reads the same parameters as ``e3nn.flax.Linear(irreps_out,
    channel_out=C_out)`` applied to e3nn's channel-axis features ``[..., C_in, irreps_in]`` (e3j's
    array with its last two axes swapped): e3nn's ``axis_to_mul`` numbers a block's copies
    channel-major, copy ``c · mul + u``, where the flat layout above numbers them ``u · C + c``. The
    two agree when each irrep has one copy per channel; with more, loading an e3nn ``channel_out``
    checkpoint without ``channel_axis=True`` computes a different function.

    With ``num_indexed_weights=S`` every parameter gains a leading ``[S]`` axis and the call takes
    integer indices first, ``lin(index, x)`` with ``index: int [...]`` (e.g. the species of each
    node; broadcast to x's batch shape, so one index serves all), as
    ``e3nn.flax.Linear(..., num_indexed_weights=S)(index, x)``.

    Output irreps: ``irreps_out`` simplified and, unless ``force_irreps_out``, without the irreps
    the input lacks (zeros for them otherwise), as in e3nn-jax (:meth:`output_irreps` gives them).
    ``biases=True`` adds e3nn's ``b[j]`` parameters to the scalar (``0e``) outputs.

    ``path_normalization`` and ``gradient_normalization`` default to e3nn-jax's defaults
    (``"element"`` and ``"path"``); e3nn-jax's ``None`` reads its global ``e3nn.config``, which this
    module does not: pass the values explicitly if a model set them there.

    >>> import jax, jax.numpy as jnp
    >>> lin = Linear("2x0e + 1o", channels_out=4, irreps_in="0e + 1o", num_indexed_weights=3)
    >>> x, species = jnp.ones((5, 4, 8)), jnp.array([0, 1, 2, 0, 1])
    >>> params = lin.init(jax.random.key(0), species, x)
    >>> jax.tree.map(jnp.shape, params["params"])
    {'w[0,0] 8x0e,8x0e': (3, 8, 8), 'w[1,1] 8x1o,4x1o': (3, 8, 4)}
    >>> lin.apply(params, species, x).shape
    (5, 5, 4)
    >>> biased = Linear("2x0e + 1o", channels_out=4, irreps_in="0e + 1o", biases=True)
    >>> jax.tree.map(jnp.shape, biased.init(jax.random.key(0), x)["params"])["b[0] 8x0e"]
    (8,)
    """

    irreps_out: object
    channels_out: int
    irreps_in: object
    num_indexed_weights: int | None = None
    force_irreps_out: bool = False
    path_normalization: str | float = "element"
    gradient_normalization: str | float = "path"
    biases: bool = False
    channel_axis: bool = False

    def output_irreps(self) -> Irreps:
        """The irreps of the output's rows: ``irreps_out`` simplified and, unless ``force_irreps_out``,
        filtered to the irreps of ``irreps_in``. Callable on an unbound module."""
        blocks_in = _blocks(as_irreps(self.irreps_in, "irreps_in"), regroup=True)
        irreps_out = as_irreps(self.irreps_out, "irreps_out").simplify()
        return irreps_out if self.force_irreps_out else irreps_out.filter(keep=[ir for ir, _ in blocks_in])

    @nn.compact
    def __call__(self, index_or_x: jax.Array, x: jax.Array | None = None) -> jax.Array:
        if x is None:
            if self.num_indexed_weights is not None:
                raise ValueError("this Linear has num_indexed_weights: call it as lin(index, x)")
            index, x = None, index_or_x
        else:
            if self.num_indexed_weights is None:
                raise ValueError("lin(index, x) needs num_indexed_weights; call lin(x)")
            index = jnp.asarray(index_or_x)
            if not jnp.issubdtype(index.dtype, jnp.integer):
                raise TypeError(f"index must be an integer array, got dtype {index.dtype}")
        irreps_in = as_irreps(self.irreps_in, "irreps_in")
        hint = " (e3j's layout: an e3nn IrrepsArray [..., irreps] is x.array[..., None], or e3j.from_mul_ir)"
        if is_irreps_array(x):
            raise TypeError(f"x must be an array [..., D_in={irreps_in.dim}, C_in], got an IrrepsArray{hint}")
        check_rank("x", x, tuple(range(2, 10)), f"[..., D_in={irreps_in.dim}, C_in]")
        dtype = float_dtype("x", x)
        if x.shape[-2] != irreps_in.dim:
            raise ValueError(f"x must be [..., {irreps_in.dim}, C_in] for irreps_in {irreps_in}, got {x.shape}{hint}")
        if index is not None and index.shape != x.shape[:-2]:
            try:
                index = jnp.broadcast_to(index, x.shape[:-2])
            except ValueError:
                raise ValueError(
                    f"index must broadcast to x's batch [{', '.join(map(str, x.shape[:-2]))}], got {index.shape}"
                ) from None
        for name in ("biases", "channel_axis", "force_irreps_out"):
            check_bool(name, getattr(self, name))
        c_in, c_out = x.shape[-1], self.channels_out
        check_positive_int("channels_out", c_out)
        if self.num_indexed_weights is not None:
            check_positive_int("num_indexed_weights", self.num_indexed_weights, " or None")
        path_norm = parse_normalization(self.path_normalization, "path_normalization", "element")
        grad_norm = parse_normalization(self.gradient_normalization, "gradient_normalization", "path")

        blocks_in = _blocks(irreps_in, regroup=True)  # (ir, rows of each copy), e3nn's regrouped input
        blocks_out = _blocks(self.output_irreps(), regroup=False)
        flat_in = [(len(rows) * c_in, ir) for ir, rows in blocks_in]
        flat_out = [(len(rows) * c_out, ir) for ir, rows in blocks_out]
        instructions = [(i, j) for i, (_, a) in enumerate(flat_in) for j, (_, b) in enumerate(flat_out) if a == b]

        # parameters first, in e3nn's order (flax draws each from the module's key in creation order)
        params = {}
        for i, j in instructions:
            mine = [k for k, jj in instructions if jj == j]
            fan = flat_in[i][0] ** path_norm * sum(flat_in[k][0] ** (1.0 - path_norm) for k in mine)
            alpha = 1 / fan if fan > 0 else 1.0
            shape = (flat_in[i][0], flat_out[j][0])
            if self.num_indexed_weights is not None:
                shape = (self.num_indexed_weights, *shape)
            name = f"w[{i},{j}] {_mul_ir(flat_in[i])},{_mul_ir(flat_out[j])}"
            init = nn.initializers.normal(stddev=math.sqrt(alpha) ** (1.0 - grad_norm))
            params[i, j] = (self.param(name, init, shape, dtype), math.sqrt(alpha) ** grad_norm)
        # biases after the weights, as e3nn creates them (weight_std 0: zeros)
        biases = {}
        for j, (mul, ir) in enumerate(flat_out):
            if self.biases and ir.l == 0 and ir.p == 1:
                shape = (mul,) if self.num_indexed_weights is None else (self.num_indexed_weights, mul)
                biases[j] = self.param(f"b[{j}] {_mul_ir(flat_out[j])}", nn.initializers.zeros, shape, dtype)

        lead = x.shape[:-2]
        outs = []
        for j, (ir, rows_out) in enumerate(blocks_out):
            mul_out = len(rows_out)
            acc = jnp.zeros((*lead, mul_out, ir.dim, c_out), dtype)
            for i in [i for i, jj in instructions if jj == j]:
                w, path_weight = params[i, j]
                rows_in = blocks_in[i][1]
                xi = x[..., jnp.asarray(rows_in).reshape(-1), :].reshape(*lead, len(rows_in), ir.dim, c_in)
                if index is None:
                    w = _copy_major(w, len(rows_in), c_in, mul_out, c_out, self.channel_axis)
                    y = jnp.einsum("...kdc,kcmo->...mdo", xi, w)
                else:
                    w = _copy_major(w[index], len(rows_in), c_in, mul_out, c_out, self.channel_axis)
                    y = jnp.einsum("...kdc,...kcmo->...mdo", xi, w)
                acc = acc + path_weight * y
            if j in biases:
                b = biases[j] if index is None else biases[j][index]
                b_lead = b.shape[:-1]
                if self.channel_axis:  # [.., C_out · mul_out] channel-major -> [.., mul_out, C_out]
                    b = jnp.swapaxes(b.reshape(*b_lead, c_out, mul_out), -1, -2)
                acc = acc + b.reshape(*b_lead, mul_out, 1, c_out)
            outs.append(acc.reshape(*lead, mul_out * ir.dim, c_out))
        if not outs:
            return jnp.zeros((*lead, 0, c_out), dtype)
        return jnp.concatenate(outs, axis=-2)


def _copy_major(w: jax.Array, m_in: int, c_in: int, m_out: int, c_out: int, channel_major: bool) -> jax.Array:
    """``w [..., m_in · c_in, m_out · c_out]`` as ``[..., m_in, c_in, m_out, c_out]``: rows and columns
    numbered copy-major (``u · C + c``), or channel-major (``c · m + u``, e3nn's ``axis_to_mul``)."""
    lead = w.shape[:-2]
    if not channel_major:
        return w.reshape(*lead, m_in, c_in, m_out, c_out)
    w = w.reshape(*lead, c_in, m_in, c_out, m_out)
    return jnp.swapaxes(jnp.swapaxes(w, -4, -3), -2, -1)


def parse_normalization(value, name: str, default: str) -> numbers.Real:
    """e3nn-jax's ``"element"`` (0), ``"path"`` (1) or a number between (or beyond: e3nn-jax
    interpolates the exponent and so do we); ``None`` is ``default``."""
    if value is None:  # e3nn-jax's None: its configured default, which is ours
        value = default
    if isinstance(value, str):
        if value not in _NORMALIZATION:
            raise ValueError(f"{name} must be 'element', 'path' or a float, got {value!r}")
        return _NORMALIZATION[value]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be 'element', 'path' or a float, got {value!r}")
    return value  # as given: e3nn-jax computes with it (a numpy float32 rounds its scales in float32)


def _mul_ir(mul_ir) -> str:
    return f"{mul_ir[0]}x{mul_ir[1]}"


def _blocks(irreps: Irreps, *, regroup: bool):
    """``[(irrep, [first row of each copy])]``; regrouped as e3nn's ``remove_zero_chunks().regroup()``."""
    starts = [s.start for s in irreps.slices()]
    order = irreps.sort().inv if regroup else range(len(irreps))
    out = []
    for b in order:
        mul, ir = irreps[b]
        if regroup and mul == 0:
            continue
        rows = [list(range(starts[b] + u * ir.dim, starts[b] + (u + 1) * ir.dim)) for u in range(mul)]
        if regroup and out and out[-1][0] == ir:
            out[-1][1].extend(rows)
        else:
            out.append((ir, rows))
    return out
