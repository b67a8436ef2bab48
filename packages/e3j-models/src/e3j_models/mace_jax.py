"""mace-jax's symmetric contraction with its own parameters, computed as e3j's power expansion.

ACEsuit's mace-jax (its e3nn-jax versions) writes MACE's product basis as a contraction with
e3nn-jax's reduced symmetric tensor-product bases ``U_ν`` (one per correlation order ``ν``, from
``e3nn.reduced_symmetric_tensor_product_basis``), with one weight per basis vector, species and
channel: parameters ``w{ν}_{ir}`` of shape ``[num_species, mul_ν(ir), C]``. Per channel ``c`` and
atom of species ``s``,

    out_ir[c] = Σ_ν Σ_k w{ν}_{ir}[s, k, c] · mul_ν(ir)^(-g/2) · U_ν[j1 … jν, k, :] x_j1[c] … x_jν[c]

(``g`` the gradient normalization, 0 for "element", 1 for "path"). Each ``U_ν`` spans the
equivariant polynomials of degree ``ν`` in ``x``, as the copies of ``ir`` in e3j's power expansion
``B_ν`` do (:class:`e3j_models.SymmetricContraction`): so every basis vector is a fixed combination
of those copies, found once here by least squares in float64 (and checked to be exact), and the
weights are mapped through it on every call (a product of ``[copies, mul]`` with ``[species, mul,
C]``, small) before e3j's products run. Same parameters, same values to rounding, e3j's speed.

e3nn-jax is needed to build the bases (``e3j-models[e3nn]``); the computation is e3j's.

>>> import jax, jax.numpy as jnp
>>> sc = MaceJaxSymmetricContraction("0e + 1o", correlation=2, keep_irrep_out="0e + 1o", num_species=3, channels=4)
>>> sorted(sc.parameter_shapes.items())
[('w1_0e', (3, 1, 4)), ('w1_1o', (3, 1, 4)), ('w2_0e', (3, 2, 4)), ('w2_1o', (3, 1, 4))]
>>> params = {k: jnp.ones(s) for k, s in sc.parameter_shapes.items()}
>>> sc(params, jnp.ones((5, 4, 4)), jnp.zeros(5, jnp.int32)).shape  # [N, C, D] as mace-jax's input
(5, 4, 4)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cached_property

import jax
import jax.numpy as jnp
import numpy as np

from e3j import Irrep, Irreps
from e3j._checks import is_irreps_array
from e3j_core import as_irreps, tensor_product_coo

from ._checks import check_int, check_positive_int, index_array
from .ops import E3jOps
from .symmetric_contraction import SymmetricContractionSpec

__all__ = ["MaceJaxSymmetricContraction"]

# least-squares residuals above this (relative, float64) mean the power expansion does not span
# a basis vector: never expected (both span the degree-ν equivariant polynomials), refused if seen
_EXACT = 1e-9


def _keep_irreps(keep_irrep_out) -> tuple[Irrep, ...]:
    """mace-jax's ``keep_irrep_out``: irreps of multiplicity 1 (``"0e + 1o"``, ``"1x0e + 1x1o"``) or
    a collection of irreps (a set of ``e3nn.Irrep``, as its modules pass it), sorted."""
    items = [keep_irrep_out] if isinstance(keep_irrep_out, str) else list(keep_irrep_out)
    found = set()
    try:
        for item in items:
            irreps = [(1, item)] if isinstance(item, Irrep) else Irreps(str(item))
            if any(mul != 1 for mul, _ in irreps):
                raise ValueError("a multiplicity other than 1")
            found |= {ir for _, ir in irreps}
    except Exception as err:
        raise ValueError(
            f"keep_irrep_out must be irreps of multiplicity 1, as mace-jax takes it, got {keep_irrep_out!r}"
        ) from err
    return tuple(sorted(found))


class MaceJaxSymmetricContraction:
    """mace-jax's ``SymmetricContraction(correlation, keep_irrep_out, num_species,
    gradient_normalization)`` (its default ``symmetric_tensor_product_basis=True``,
    ``off_diagonal=False``) on features of ``irreps_in`` with ``channels`` channels.

    :attr:`parameter_shapes` (and :meth:`init_stddev`) are mace-jax's parameters; calling the
    object with them, ``x [..., C, D_in]`` (mace-jax's ``mul_to_axis`` layout; an
    ``e3nn.IrrepsArray`` or an array) and the species ``index [...]`` gives mace-jax's output:
    ``[..., C, D_out]``, the output irreps sorted (an ``IrrepsArray`` when ``x`` is one).

    In mace-jax's Haiku module, the body of ``__call__`` becomes::

        sc = MaceJaxSymmetricContraction(input.irreps, self.correlation, self.keep_irrep_out,
                                         self.num_species, input.shape[-2], self.gradient_normalization)
        params = {name: hk.get_parameter(name, shape, jnp.float32,
                                         hk.initializers.RandomNormal(sc.init_stddev(name)))
                  for name, shape in sc.parameter_shapes.items()}
        return sc(params, input, index)
    """

    def __init__(
        self,
        irreps_in,
        correlation: int,
        keep_irrep_out,
        num_species: int,
        channels: int,
        gradient_normalization: str | float | None = None,
        *,
        backend: str | None = None,
    ) -> None:
        irreps_in = as_irreps(irreps_in, "irreps_in")
        self.correlation = check_int("correlation", correlation, 1)
        self.num_species = check_positive_int("num_species", num_species)
        self.channels = check_positive_int("channels", channels)
        if gradient_normalization is None:  # as mace-jax: e3nn-jax's configuration ("path" unless set)
            gradient_normalization = _e3nn().config("gradient_normalization")
        if isinstance(gradient_normalization, str):
            if gradient_normalization not in ("element", "path"):
                raise ValueError(
                    f"gradient_normalization must be 'element', 'path' or a number, got {gradient_normalization!r}"
                )
            gradient_normalization = {"element": 0.0, "path": 1.0}[gradient_normalization]
        self.gradient_normalization = float(gradient_normalization)
        self.irreps_in = irreps_in
        self.keep_irrep_out = _keep_irreps(keep_irrep_out)
        self.backend = backend
        self._maps  # noqa: B018  (the bases and the maps, built and checked here: errors at construction)

    @cached_property
    def _bases(self) -> dict[tuple[int, Irrep], np.ndarray]:
        """``{(ν, ir): U [D_in]*ν + [mul, ir.dim]}``: e3nn-jax's bases, as mace-jax computes them."""
        e3nn = _e3nn()
        irreps = e3nn.Irreps(str(self.irreps_in))
        keep = {e3nn.Irrep(str(ir)) for ir in self.keep_irrep_out}
        out = {}
        for order in range(1, self.correlation + 1):
            U = e3nn.reduced_symmetric_tensor_product_basis(irreps, order, keep_ir=keep)
            for (mul, ir), u in zip(U.irreps, U.chunks):
                if mul:
                    out[order, Irrep(str(ir))] = np.asarray(u, np.float64)
        return out

    @property
    def parameter_shapes(self) -> dict[str, tuple[int, int, int]]:
        """mace-jax's parameters: ``{"w{ν}_{ir}": (num_species, mul_ν(ir), channels)}``."""
        return {f"w{o}_{ir}": (self.num_species, u.shape[-2], self.channels) for (o, ir), u in self._bases.items()}

    def init_stddev(self, name: str) -> float:
        """mace-jax's initializer's standard deviation for parameter ``name``."""
        mul = self.parameter_shapes[name][1]
        return (mul**-0.5) ** (1.0 - self.gradient_normalization)

    @cached_property
    def spec(self) -> SymmetricContractionSpec:
        """The power expansion that computes it (output irreps: those mace-jax's bases produce, sorted)."""
        produced = sorted({ir for _, ir in self._bases})
        if not produced:
            raise ValueError(f"no irrep of keep_irrep_out={self.keep_irrep_out} is reachable from {self.irreps_in}")
        return SymmetricContractionSpec(self.irreps_in, Irreps([(1, ir) for ir in produced]), self.correlation)

    @cached_property
    def _maps(self) -> dict[Irrep, list[tuple[str, int, np.ndarray]]]:
        """For each output irrep, ``(parameter name, first copy, M [copies of ir in B_ν, mul_ν(ir)])``
        per order ``ν``: basis vector ``k`` of ``U_ν`` is ``Σ_copy M[copy, k] · copy`` (the power
        expansion's ``1/sqrt(n_ir)`` folded in)."""
        spec = self.spec
        terms = [spec.irreps_in, *spec.power_irreps]
        rng = np.random.default_rng(0)
        dim = spec.irreps_in.dim
        out: dict[Irrep, list] = {ir: [] for ir, _ in spec.copies_per_irrep()}
        total = dict(spec.copies_per_irrep())
        for (order, ir), u in self._bases.items():
            if order > len(terms) or terms[order - 1].count(ir) == 0:
                raise ValueError(f"mace-jax's basis of order {order} has {ir}, which e3j's power expansion lacks")
            irreps_k = terms[order - 1]
            mul = u.shape[-2]
            copies = irreps_k.count(ir)
            samples = max(4, 2 * copies // ir.dim + 4)
            x = rng.standard_normal((samples, dim))
            power = x
            for k in range(2, order + 1):
                prev = spec.irreps_in if k == 2 else spec.power_irreps[k - 3]
                power = tensor_product_coo(prev, spec.irreps_in, spec.power_filter(k)).table(power, x)
            blocks = [
                power[:, off : off + m * i.dim].reshape(samples, m, i.dim)
                for (m, i), off in zip(irreps_k, np.cumsum([0] + [m * i.dim for m, i in irreps_k]))
                if i == ir and m
            ]
            basis = np.concatenate(blocks, axis=1)  # [S, copies, ir.dim]
            target = _contract(u, x, order)  # [S, mul, ir.dim]
            a = basis.transpose(0, 2, 1).reshape(-1, copies)
            b = target.transpose(0, 2, 1).reshape(-1, mul)
            m, *_ = np.linalg.lstsq(a, b, rcond=None)
            residual = np.linalg.norm(a @ m - b) / max(np.linalg.norm(b), 1e-300)
            if residual > _EXACT:
                raise ValueError(
                    f"mace-jax's basis w{order}_{ir} is not a combination of e3j's power expansion "
                    f"(relative residual {residual:.1e})"
                )
            first = sum(t.count(ir) for t in terms[: order - 1])
            out[ir].append((f"w{order}_{ir}", first, m * math.sqrt(total[ir])))
        return out

    def weights(self, params: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """mace-jax's parameters as :class:`e3j_models.SymmetricContraction`'s (``{ir: [species,
        copies, C]}``), gradient normalization applied."""
        shapes = self.parameter_shapes
        if set(params) != set(shapes):
            raise ValueError(f"params must hold exactly {sorted(shapes)}, got {sorted(params)}")
        for name, shape in shapes.items():
            if tuple(jnp.shape(params[name])) != shape:
                raise ValueError(f"params[{name!r}] must have shape {shape}, got {tuple(jnp.shape(params[name]))}")
        out = {}
        for ir, n in self.spec.copies_per_irrep():
            w = jnp.zeros((self.num_species, n, self.channels), jnp.result_type(*params.values()))
            for name, first, m in self._maps[ir]:
                mul = m.shape[1]
                p = params[name] * (mul**-0.5) ** self.gradient_normalization
                w = w.at[:, first : first + m.shape[0]].add(jnp.einsum("qk,skc->sqc", jnp.asarray(m, p.dtype), p))
            out[str(ir)] = w
        return out

    def __call__(self, params: Mapping[str, jax.Array], x, index) -> jax.Array:
        """mace-jax's output for features ``x [..., C, D_in]`` and species ``index [...]``."""
        wrap = is_irreps_array(x)
        if wrap:
            if str(as_irreps(str(x.irreps), "x.irreps")) != str(self.irreps_in):
                raise ValueError(f"x has irreps {x.irreps}, expected {self.irreps_in}")
            x = x.array
        x = jnp.asarray(x)
        want = f"[..., C={self.channels}, D={self.irreps_in.dim}]"
        if x.ndim < 2 or x.shape[-2:] != (self.channels, self.irreps_in.dim):
            raise ValueError(f"x must be {want}, got {x.shape}")
        lead = x.shape[:-2]
        index = jnp.broadcast_to(jnp.asarray(index), lead) if jnp.ndim(index) < len(lead) else index
        index = index_array("index", index, lead, f"{list(lead)} like x's leading axes")
        flat = x.reshape(-1, *x.shape[-2:]).transpose(0, 2, 1)  # [N, D, C]
        weights = {k: v.astype(x.dtype) for k, v in self.weights(params).items()}
        out = E3jOps(self.backend).symmetric_contraction(self.spec, weights, flat, index.reshape(-1))
        out = out.transpose(0, 2, 1).reshape(*lead, self.channels, -1)
        if wrap:
            return _e3nn().IrrepsArray(str(self.spec.irreps_result), out)
        return out


def _contract(u: np.ndarray, x: np.ndarray, order: int) -> np.ndarray:
    """``U [D]*order + [mul, dim]`` contracted with ``x [S, D]`` on each input axis: ``[S, mul, dim]``."""
    t = np.einsum("j...,sj->s...", u, x)
    for _ in range(order - 1):
        t = np.einsum("sj...,sj->s...", t, x)
    return t


def _e3nn():
    try:
        import e3nn_jax
    except ImportError as err:
        from ._optional import missing

        raise missing("e3nn_jax", "MaceJaxSymmetricContraction (e3nn-jax's bases)", "e3nn") from err
    return e3nn_jax
