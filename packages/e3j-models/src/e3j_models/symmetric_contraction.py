"""MACE's symmetric contraction (product basis) as a power expansion plus a species-wise projection.

As the paper's MACE benchmarks do (its Appendix C.1): the node features ``A`` (irreps ``irreps_in``,
``C`` channels) are raised to powers channel by channel with tensor products,
``B_1 = A``, ``B_k = B_{k-1} ⊗ A`` (each filtered to the irreps that can still reach the output within
the remaining products), and for every output irrep the copies of it in ``B_1 … B_ν`` (``ν`` the
correlation, in that order, each ``B_k`` in its row order) are mixed per channel with weights that
depend on the atom's species:

    out[n, ir, :, c] = Σ_k w_ir[species[n], k, c] · B[n, copy k of ir, :, c] / sqrt(n_ir)

No channel mixing happens here (MAP mode). :class:`SymmetricContractionSpec` holds the static
shapes; the computation is the ``symmetric_contraction`` method of the model's ops
(:mod:`e3j_models.ops`), so a fused kernel can replace it without touching models or parameters.

>>> spec = SymmetricContractionSpec("0e + 1o + 2e", "0e + 1o", correlation=2)
>>> spec.copies_per_irrep()
((0e, 4), (1o, 5))
>>> spec.weight_shapes(num_species=3, channels=8)
{'0e': (3, 4, 8), '1o': (3, 5, 8)}
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import flax.linen as nn
import jax
import jax.numpy as jnp

from e3j import Irrep, Irreps
from e3j_core import as_irreps, tensor_product_coo

from ._checks import check_int, check_positive_int, check_rank, index_array

__all__ = ["SymmetricContraction", "SymmetricContractionSpec"]


@dataclass(frozen=True)
class SymmetricContractionSpec:
    """Static description: ``irreps_in`` (``A``), ``irreps_out`` (each irrep once), ``correlation`` (>= 1).

    >>> SymmetricContractionSpec("1o", "1o", 4).copies_per_irrep()  # B_1 and B_3 (B_2 = 0e + 1e + 2e)
    ((1o, 4),)
    """

    irreps_in: Irreps
    irreps_out: Irreps
    correlation: int

    def __init__(self, irreps_in, irreps_out, correlation: int) -> None:
        irreps_in, irreps_out = as_irreps(irreps_in, "irreps_in"), as_irreps(irreps_out, "irreps_out")
        correlation = check_int("correlation", correlation, 1)
        if any(mul != 1 for mul, _ in irreps_out) or len({ir for _, ir in irreps_out}) != len(irreps_out):
            raise ValueError(f"irreps_out must hold each irrep once (channels carry multiplicity), got {irreps_out}")
        object.__setattr__(self, "irreps_in", irreps_in)
        object.__setattr__(self, "irreps_out", irreps_out)
        object.__setattr__(self, "correlation", correlation)
        if not self.copies_per_irrep():
            raise ValueError(f"no output irrep of {irreps_out} is reachable from {irreps_in}")

    def _reachable(self, steps: int) -> frozenset[Irrep]:
        """Irreps from which at most ``steps`` more products with ``A`` can reach an output irrep
        (the outputs themselves included: zero products). Within, not exactly: ``B_k`` feeds every
        later power, and an ``A`` without ``0e`` (``1o``) reaches other irreps in an even and an
        odd number of products."""
        exact = frozenset(ir for _, ir in self.irreps_out)
        within = exact
        ins = {ir for mul, ir in self.irreps_in if mul}
        lmax_in = max((ir.l for ir in ins), default=0)
        for m in range(1, steps + 1):
            bound = self.irreps_out.lmax + m * lmax_in
            exact = frozenset(
                Irrep(l, p)
                for l in range(bound + 1)
                for p in (1, -1)
                if any(o in exact for a in ins for o in Irrep(l, p) * a)
            )
            within |= exact
        return within

    def power_filter(self, k: int) -> Irreps:
        """The output filter of the product forming ``B_k`` (``k >= 2``)."""
        return Irreps([(1, ir) for ir in sorted(self._reachable(self.correlation - k))])

    @cached_property
    def power_irreps(self) -> tuple[Irreps, ...]:
        """The irreps of ``B_2 … B_K`` (the tensor products' output layouts), ``K`` =
        :attr:`last_power`: the powers stop at the first whose filter keeps nothing of the product
        (``1o ⊗ 1o`` holds no ``1o``), as every later one would be empty too."""
        out, prev = [], self.irreps_in
        ins = {ir for mul, ir in self.irreps_in if mul}
        for k in range(2, self.correlation + 1):
            keep = self.power_filter(k)
            if not any(o in {ir for _, ir in keep} for mul, a in prev if mul for b in ins for o in a * b):
                break
            prev = tensor_product_coo(prev, self.irreps_in, keep).irreps_out
            out.append(prev)
        return tuple(out)

    @property
    def last_power(self) -> int:
        """The highest power formed (``correlation``, or less where the products reach no output)."""
        return 1 + len(self.power_irreps)

    def copies_per_irrep(self) -> tuple[tuple[Irrep, int], ...]:
        """For each output irrep (in ``irreps_out`` order) the number of its copies in ``B_1 … B_ν``."""
        terms = [self.irreps_in, *self.power_irreps]
        counts = ((ir, sum(irreps.count(ir) for irreps in terms)) for _, ir in self.irreps_out)
        return tuple((ir, n) for ir, n in counts if n > 0)

    @property
    def irreps_result(self) -> Irreps:
        """The irreps of the result: the reachable output irreps, in ``irreps_out`` order."""
        return Irreps([(1, ir) for ir, _ in self.copies_per_irrep()])

    def weight_shapes(self, num_species: int, channels: int) -> dict[str, tuple[int, int, int]]:
        """``{str(ir): (num_species, copies of ir in the product basis, channels)}``."""
        return {str(ir): (num_species, n, channels) for ir, n in self.copies_per_irrep()}


class SymmetricContraction(nn.Module):
    """Flax module: ``x [N, D_in, C]``, ``species [N]`` (ints in ``[0, num_species)``) → ``[N, D_result, C]``.

    Parameters: one ``[num_species, n_ir, C]`` array per output irrep, named by the irrep.
    """

    irreps_in: str
    irreps_out: str
    correlation: int
    num_species: int
    backend: str | None = None

    @nn.compact
    def __call__(self, x: jax.Array, species: jax.Array) -> jax.Array:
        from .ops import get_ops

        spec = SymmetricContractionSpec(self.irreps_in, self.irreps_out, self.correlation)
        check_positive_int("num_species", self.num_species)
        check_rank("x", x, (3,), f"[N, D={spec.irreps_in.dim}, C]")
        species = index_array("species", species, (jnp.shape(x)[0],), f"[N={jnp.shape(x)[0]}] like x")
        shapes = spec.weight_shapes(self.num_species, int(x.shape[-1]))
        weights = {
            name: self.param(name, nn.initializers.normal(1.0), shape, jnp.float32) for name, shape in shapes.items()
        }
        return get_ops(self.backend).symmetric_contraction(spec, weights, x, species)
