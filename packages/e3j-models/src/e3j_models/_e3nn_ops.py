"""The e3nn-jax twin of :class:`e3j_models.ops.E3jOps` (``backend="e3nn"``; needs the ``e3nn`` extra).

Every equivariant operation here is e3nn-jax's own: ``e3nn.spherical_harmonics``,
``e3nn.tensor_product`` on ``IrrepsArray``s, ``e3nn.scatter_sum`` and ``e3nn.FunctionalLinear``; no
e3j operation is called. Inside, features live as e3nn's ``[B, C, D]`` ``IrrepsArray`` (channels as
an axis, as mace-jax does); they are transposed to and from e3j's ``[B, D, C]`` once per operation, on
node-sized arrays only (edge-sized arrays never change layout).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from e3j import FactoredWeights, Irreps

from .ops import linear_channels_out

try:
    import e3nn_jax as e3nn
except ImportError as err:  # pragma: no cover - exercised only without the extra
    from e3j_core.dependencies import install_hint

    raise ImportError(f"backend='e3nn' needs e3nn-jax: {install_hint('e3j-models', 'e3nn', 'e3nn-jax')}") from err


def _irreps(irreps) -> e3nn.Irreps:
    return e3nn.Irreps(str(Irreps(irreps)))


def _filter(filter):
    return None if filter is None else [e3nn.Irrep(str(ir)) for _, ir in Irreps(filter)]


def _to_e3nn(x, irreps) -> e3nn.IrrepsArray:
    """e3j ``[B, D, C]`` -> e3nn ``IrrepsArray [B, C, D]``."""
    return e3nn.IrrepsArray(_irreps(irreps), jnp.swapaxes(x, -1, -2))


def _from_e3nn(a: e3nn.IrrepsArray):
    return jnp.swapaxes(a.array, -1, -2)


def _single_blocks(irreps: e3nn.Irreps, name: str) -> None:
    if len({ir for _, ir in irreps}) != len(irreps):
        raise NotImplementedError(f"the e3nn twin's linear needs each irrep once in {name}, got {irreps}")


class E3nnOps:
    """e3nn-jax implementation of :class:`e3j_models.ops.Ops` (the twin and the baseline)."""

    name = "e3nn"
    backend = "e3nn"

    def spherical_harmonics(self, irreps, vectors):
        return e3nn.spherical_harmonics(_irreps(irreps), vectors, normalize=True, normalization="component").array

    def convolution(self, irreps_x, irreps_y, filter, x, y, s, graph):
        num_nodes = x.shape[0]
        xa = _to_e3nn(x, irreps_x)[graph.senders]  # [E, C, Dx]: gathered after the node-sized transpose
        ya = e3nn.IrrepsArray(_irreps(irreps_y), y[:, None, :] if y.ndim == 2 else jnp.swapaxes(y, -1, -2))
        msg = e3nn.tensor_product(xa, ya, filter_ir_out=_filter(filter))  # [E, C, Dout]
        # a path is one 2l+1 block of the (sorted, merged) output: copies numbered in row order
        path_of_row = np.concatenate(
            [np.repeat(np.arange(mul), ir.dim) + first for first, (mul, ir) in zip(_firsts(msg.irreps), msg.irreps)]
        )
        num_paths = sum(mul for mul, _ in msg.irreps)
        if isinstance(s, FactoredWeights):  # e3nn-jax's way: the radial MLP's output multiplied out
            if s.shape[1] % num_paths:
                raise ValueError(f"s must be [E, num_paths={num_paths} × C] weights for this product, got {s.shape}")
            s = s.materialize().reshape(s.shape[0], num_paths, s.shape[1] // num_paths)
        if s.shape[1] != num_paths:
            raise ValueError(f"s must be [E, num_paths={num_paths}, C] for this product, got {s.shape}")
        weight = jnp.swapaxes(s, 1, 2)[:, :, path_of_row] * graph.edge_mask[:, None, None].astype(s.dtype)
        msg = e3nn.IrrepsArray(msg.irreps, msg.array * weight)
        out = e3nn.scatter_sum(msg, dst=graph.receivers, output_size=num_nodes)
        return _from_e3nn(out)

    def tensor_product(self, irreps_x, irreps_y, filter, x, y):
        ya = e3nn.IrrepsArray(_irreps(irreps_y), y[:, None, :]) if y.ndim == 2 else _to_e3nn(y, irreps_y)
        return _from_e3nn(e3nn.tensor_product(_to_e3nn(x, irreps_x), ya, filter_ir_out=_filter(filter)))

    def linear(self, irreps_in, irreps_out, weights, x):
        channels_in = x.shape[-1]
        channels_out = linear_channels_out(weights)
        ein, eout = _irreps(irreps_in), _irreps(irreps_out)
        _single_blocks(ein, "irreps_in")
        _single_blocks(eout, "irreps_out")
        flat = _to_e3nn(x, irreps_in).axis_to_mul()  # [B, C·D], multiplicity index c·mul + u
        flat_out = e3nn.Irreps([(mul * channels_out, ir) for mul, ir in eout])
        lin = e3nn.FunctionalLinear(flat.irreps, flat_out, path_normalization="element", gradient_normalization="path")
        ws = []
        for ins in lin.instructions:
            ir = flat.irreps[ins.i_in].ir
            w = weights[str(ir)].astype(x.dtype)  # [mul_in, mul_out, C_in, C_out]
            mi, mo = w.shape[0], w.shape[1]
            ws.append(jnp.transpose(w, (2, 0, 3, 1)).reshape(channels_in * mi, channels_out * mo))
        out = jax.vmap(lin, in_axes=(None, 0))(ws, flat)
        return _from_e3nn(out.mul_to_axis(channels_out))

    def symmetric_contraction(self, spec, weights, x, species):
        a = _to_e3nn(x, spec.irreps_in)
        targets = _filter(spec.irreps_out)
        b, terms = a, [a.filter(keep=targets)]
        for k in range(2, spec.last_power + 1):
            b = e3nn.tensor_product(b, a, filter_ir_out=_filter(spec.power_filter(k)))
            terms.append(b.filter(keep=targets))
        cat = e3nn.concatenate(terms, axis=-1).regroup()  # stable sort: copies in B_1, B_2, ... order
        chunks = dict(zip([ir for _, ir in cat.irreps], cat.chunks))
        muls = dict((ir, mul) for mul, ir in cat.irreps)
        out_irreps, out_chunks = [], []
        for ir, _ in spec.copies_per_irrep():
            eir = e3nn.Irrep(str(ir))
            w = weights[str(ir)].astype(x.dtype)[species]  # [N, n, C]
            block = jnp.einsum("ncud,nuc->ncd", chunks[eir], w) / math.sqrt(muls[eir])
            out_irreps.append((1, eir))
            out_chunks.append(block[:, :, None, :])
        out = e3nn.from_chunks(e3nn.Irreps(out_irreps), out_chunks, x.shape[:1] + x.shape[2:], x.dtype)
        return _from_e3nn(out)


def _firsts(irreps: e3nn.Irreps) -> list[int]:
    firsts, n = [], 0
    for mul, _ in irreps:
        firsts.append(n)
        n += mul
    return firsts
