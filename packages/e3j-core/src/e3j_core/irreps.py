"""Irreducible representations of O(3) and direct sums of them, in e3nn's notation.

An :class:`Irrep` is a degree ``l >= 0`` and a parity ``p = ±1``; it is written ``"1o"`` (``l=1``,
odd), ``"2e"`` (``l=2``, even) or ``"3y"`` (parity ``(-1)**l``, the parity of spherical harmonics).
An :class:`Irreps` is a tuple of :class:`MulIrrep` (multiplicity × irrep), written
``"2x0e + 1o"``. Strings, ordering, ``sort``, ``simplify`` and ``regroup`` follow e3nn-jax exactly,
so that tensor-product output layouts agree with ``e3nn_jax.tensor_product``.

>>> Irreps("2x0e + 1o").dim
5
>>> Irreps("1o + 0e + 2e + 0e").regroup()
2x0e+1x1o+1x2e
>>> [str(ir) for ir in Irrep("1o") * Irrep("1o")]
['0e', '1e', '2e']
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple, Union

import numpy as np

from ._checks import check_int, is_int

__all__ = ["IntoIrrep", "IntoIrreps", "Irrep", "Irreps", "MulIrrep", "as_irreps"]

_IRREP_RE = re.compile(r"^([0-9]+)([eoy])$")
_PARITY = {"e": 1, "o": -1}


class Irrep(tuple):
    """An irreducible representation of O(3): degree ``l`` and parity ``p``.

    Accepts ``Irrep("1o")``, ``Irrep(1, -1)``, ``Irrep((1, -1))``, another ``Irrep`` or an
    e3nn-jax ``Irrep`` (any object with integer ``l`` and ``p``; e3nn-jax is never imported).
    Irreps are immutable, hashable and ordered as in e3nn-jax:
    ``0e < 0o < 1o < 1e < 2e < 2o < 3o < 3e ...`` (within one ``l``, the parity of the spherical
    harmonic of that degree comes first).

    An ``Irrep`` is the pair ``(l, p)`` (a ``tuple``, as e3nn's torch ``Irrep`` is), so e3nn-jax's
    constructors read e3j's irreps: ``e3nn_jax.Irreps(e3j.Irreps("2x0e + 1o"))`` and
    ``e3nn_jax.Irrep(e3j.Irrep("1o"))`` work. Where e3nn-jax wants *irreps* (``Irreps(...)``,
    ``IrrepsArray``, its modules), give it ``Irreps(ir)`` or ``str(ir)``, not a bare ``Irrep``: e3nn-jax
    reads any pair there as a list of two degrees (and raises at an odd parity's ``-1``). An ``Irrep``
    equals its pair and its string.

    >>> Irrep("2e").dim
    5
    >>> Irrep("3y")
    3o
    >>> sorted([Irrep("1e"), Irrep("0o"), Irrep("1o"), Irrep("0e")])
    [0e, 0o, 1o, 1e]
    >>> l, p = Irrep("1o")
    >>> (l, p), Irrep("1o") == (1, -1), Irrep("1o") == "1o"
    ((1, -1), True, True)
    >>> Irrep("1o") + "0e"
    1x1o+1x0e
    """

    __slots__ = ()
    # np.int64(3) * Irrep("1o") defers to __rmul__ instead of multiplying the pair as an array
    __array_ufunc__ = None
    # namedtuple-like, so that code rebuilding tuples by type keeps an Irrep an Irrep: Flax's module
    # attributes (``type(t)(*fields)`` for namedtuples, a plain ``tuple`` otherwise) and JAX's pytrees
    _fields = ("l", "p")

    def __new__(cls, l: IntoIrrep, p: int | None = None) -> Irrep:
        if p is None:
            if isinstance(l, Irrep):
                return l if type(l) is cls else tuple.__new__(cls, l)
            elif isinstance(l, MulIrrep):
                l, p = l.ir.l, l.ir.p
            elif isinstance(l, str):
                l, p = _parse_irrep(l)
            elif _is_mul_irrep_like(l):  # e.g. e3nn-jax's MulIrrep (a tuple, so before the pair case)
                l, p = Irrep(l.ir)
            elif _is_irrep_like(l):  # e.g. e3nn-jax's Irrep
                l, p = l.l, l.p
            elif isinstance(l, tuple) and len(l) == 2:
                l, p = l
            else:
                raise ValueError(
                    f"cannot interpret {l!r} as an Irrep: expected a string like '1o', a pair (l, p) or an Irrep"
                )
        if not is_int(l):
            raise ValueError(f"Irrep degree l must be an int, got {l!r}")
        l = int(l)
        if l < 0:
            raise ValueError(f"Irrep degree l must be >= 0, got l={l}")
        # is_int first: `p not in (1, -1)` on an arbitrary object runs its __eq__ (e3nn-jax's Irrep asserts)
        if isinstance(p, bool) or not is_int(p) or p not in (1, -1):
            raise ValueError(f"Irrep parity p must be 1 or -1, got p={p!r}")
        return tuple.__new__(cls, (l, int(p)))

    @property
    def l(self) -> int:  # noqa: E743
        """The degree."""
        return self[0]

    @property
    def p(self) -> int:
        """The parity, ``1`` (even) or ``-1`` (odd)."""
        return self[1]

    @property
    def dim(self) -> int:
        """``2l + 1``."""
        return 2 * self[0] + 1

    def is_scalar(self) -> bool:
        """True for ``0e``."""
        return self[0] == 0 and self[1] == 1

    def D_from_matrix(self, R: np.ndarray) -> np.ndarray:
        """``p^k D^l(R / det R)`` ``[..., 2l+1, 2l+1]`` with ``k = 1`` for reflections, else 0."""
        return Irreps(self).D_from_matrix(R)

    def D_from_angles(self, alpha, beta, gamma, k=0) -> np.ndarray:
        """``p^k D^l(Y(α) X(β) Y(γ))``, e3nn-jax's Euler convention."""
        from .wigner import wigner_D_from_angles

        D = wigner_D_from_angles(self.l, alpha, beta, gamma)
        return D * (self.p ** np.asarray(k))[..., None, None]

    @classmethod
    def iterator(cls, lmax: int | None = None) -> Iterator[Irrep]:
        """All irreps in e3nn order, up to degree ``lmax`` (endless if ``None``)."""
        l = 0
        while lmax is None or l <= lmax:
            yield cls(l, (-1) ** l)
            yield cls(l, -((-1) ** l))
            l += 1

    def __mul__(self, other: IntoIrrep) -> Iterator[Irrep]:
        """The irreps in the tensor product, ``|l1-l2| .. l1+l2`` with parity ``p1 p2``."""
        other = Irrep(other)
        p = self.p * other.p
        for l in range(abs(self.l - other.l), self.l + other.l + 1):
            yield Irrep(l, p)

    def __rmul__(self, mul: int) -> Irreps:
        """``3 * Irrep("1o")`` is ``Irreps("3x1o")``, as in e3nn-jax."""
        if isinstance(mul, bool) or not is_int(mul):
            return NotImplemented
        return Irreps([_mul_irrep(mul, self, f"{mul} * {self}")])

    def __add__(self, other: IntoIrreps) -> Irreps:  # type: ignore[override]
        """The direct sum, an :class:`Irreps` (as in e3nn-jax; not a concatenation of pairs)."""
        return Irreps(self) + Irreps(other)

    def __radd__(self, other: IntoIrreps) -> Irreps:
        return Irreps(other) + Irreps(self)

    def _key(self) -> tuple[int, int]:
        return (self[0], -self[1] * (-1) ** self[0])

    def __lt__(self, other: IntoIrrep) -> bool:
        return self._key() < Irrep(other)._key()

    def __le__(self, other: IntoIrrep) -> bool:
        return self._key() <= Irrep(other)._key()

    def __gt__(self, other: IntoIrrep) -> bool:
        return self._key() > Irrep(other)._key()

    def __ge__(self, other: IntoIrrep) -> bool:
        return self._key() >= Irrep(other)._key()

    def __eq__(self, other: object) -> bool:
        try:
            other = Irrep(other)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:  # tuple's own would compare as tuples
        return not self == other

    def __hash__(self) -> int:
        return tuple.__hash__(self)

    def __repr__(self) -> str:
        return f"{self[0]}{'e' if self[1] == 1 else 'o'}"

    __str__ = __repr__

    def __reduce__(self):
        return (Irrep, tuple(self))


def _parse_irrep(text: str) -> tuple[int, int]:
    token = text.strip()
    if token.startswith("-"):
        raise ValueError(f"invalid irrep '{token}': the degree l must be >= 0")
    match = _IRREP_RE.match(token)
    if match is None:
        raise ValueError(f"invalid irrep '{token}': expected a degree and a parity, like '0e', '1o' or '2y'")
    l = int(match.group(1))
    parity = match.group(2)
    return l, (-1) ** l if parity == "y" else _PARITY[parity]


class MulIrrep(NamedTuple):
    """An irrep with a multiplicity, written ``"3x1o"``; ordered by irrep, then multiplicity (as
    e3nn-jax orders its ``MulIrrep``).

    >>> sorted([MulIrrep(2, Irrep("1o")), MulIrrep(3, Irrep("0e")), MulIrrep(1, Irrep("0e"))])
    [1x0e, 3x0e, 2x1o]
    """

    mul: int
    ir: Irrep

    @property
    def dim(self) -> int:
        """``mul * (2l + 1)``."""
        return self.mul * self.ir.dim

    def _key(self) -> tuple:
        return (self.ir._key(), self.mul)

    # a NamedTuple compares its fields in order (multiplicity first)
    def __lt__(self, other: MulIrrep) -> bool:
        return self._key() < MulIrrep(*other)._key()

    def __le__(self, other: MulIrrep) -> bool:
        return self._key() <= MulIrrep(*other)._key()

    def __gt__(self, other: MulIrrep) -> bool:
        return self._key() > MulIrrep(*other)._key()

    def __ge__(self, other: MulIrrep) -> bool:
        return self._key() >= MulIrrep(*other)._key()

    def __repr__(self) -> str:
        return f"{self.mul}x{self.ir}"

    __str__ = __repr__


IntoIrrep = Union[Irrep, MulIrrep, str, tuple[int, int]]


class _Sorted(NamedTuple):
    irreps: Irreps
    p: tuple[int, ...]
    inv: tuple[int, ...]


class Irreps(tuple):
    """A direct sum of irreps with multiplicities: a tuple of :class:`MulIrrep`.

    Accepts an e3nn string (``"2x0e + 1o"``; ``0x`` multiplicities allowed; the empty string is the
    empty sum), an :class:`Irrep`, a :class:`MulIrrep`, another ``Irreps``, an iterable of
    irreps, ``(mul, irrep)`` pairs or strings, or e3nn-jax's ``Irreps``, ``MulIrrep`` and ``Irrep``
    (recognized by their attributes; e3nn-jax is never imported). The feature layout of an ``Irreps`` is e3nn's: the
    blocks one after another, each block ``mul`` copies of ``2l+1`` components.

    >>> irreps = Irreps("2x0e + 1o + 0x2e")
    >>> irreps, irreps.dim, irreps.num_irreps, irreps.lmax
    (2x0e+1x1o+0x2e, 5, 3, 1)
    >>> irreps.slices()
    [slice(0, 2, None), slice(2, 5, None), slice(5, 5, None)]
    >>> Irreps("2e + 1o + 0e").sort()
    _Sorted(irreps=1x0e+1x1o+1x2e, p=(2, 1, 0), inv=(2, 1, 0))
    """

    # np.int64(2) * Irreps(...) defers to __rmul__ instead of multiplying the pairs as an array
    __array_ufunc__ = None

    def __new__(cls, irreps: IntoIrreps = None) -> Irreps:
        if isinstance(irreps, Irreps):
            return super().__new__(cls, irreps)
        out: list[MulIrrep] = []
        if irreps is None:
            pass
        elif isinstance(irreps, Irrep):
            out.append(MulIrrep(1, irreps))
        elif isinstance(irreps, MulIrrep):
            out.append(_mul_irrep(irreps.mul, irreps.ir, irreps))
        elif isinstance(irreps, str):
            out.extend(_parse_irreps(irreps))
        elif _is_mul_irrep_like(irreps):  # e3nn-jax's Irrep and MulIrrep are tuples: not iterated
            out.append(_mul_irrep(irreps.mul, irreps.ir, irreps))
        elif _is_irrep_like(irreps):
            out.append(MulIrrep(1, Irrep(irreps)))
        elif isinstance(irreps, Iterable):
            for item in irreps:
                out.append(_into_mul_irrep(item))
        else:
            raise ValueError(
                f"cannot interpret {irreps!r} as Irreps: expected a string like '2x0e + 1o' or an iterable of irreps"
            )
        return super().__new__(cls, out)

    # -- sizes -------------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        """Total dimension ``Σ mul (2l+1)``."""
        return sum(mul_ir.dim for mul_ir in self)

    @property
    def num_irreps(self) -> int:
        """Total multiplicity ``Σ mul``."""
        return sum(mul for mul, _ in self)

    @property
    def ls(self) -> list[int]:
        """The degree of every irrep copy, with repetitions (e3nn-jax's ``ls``)."""
        return [ir.l for mul, ir in self for _ in range(mul)]

    @property
    def lmax(self) -> int:
        """The largest degree among copies that exist (``mul > 0``), as in e3nn-jax.

        A ``ValueError`` when there is none.
        """
        ls = [ir.l for mul, ir in self if mul > 0]
        if not ls:
            raise ValueError(f"lmax of Irreps '{self}' is undefined: it holds no irrep")
        return max(ls)

    def slices(self) -> list[slice]:
        """The slice of the flat feature axis occupied by each block."""
        out, start = [], 0
        for mul_ir in self:
            out.append(slice(start, start + mul_ir.dim))
            start += mul_ir.dim
        return out

    def is_scalar(self) -> bool:
        """True when every irrep is ``0e`` and there is one (e3nn-jax: the empty sum is not scalar)."""
        return len(self) > 0 and all(ir.is_scalar() for _, ir in self)

    def count(self, ir: IntoIrrep) -> int:  # type: ignore[override]
        """Total multiplicity of ``ir``."""
        ir = Irrep(ir)
        return sum(mul for mul, irr in self if irr == ir)

    def __contains__(self, ir: object) -> bool:
        try:
            ir = Irrep(ir)  # type: ignore[arg-type]
        except ValueError:
            return False
        return any(irr == ir for _, irr in self)

    # -- rearrangements ------------------------------------------------------------------------
    def sort(self) -> _Sorted:
        """Stable sort of the blocks by irrep.

        Returns ``(irreps, p, inv)`` as e3nn-jax does: ``inv[i]`` is the original index of the
        ``i``-th sorted block and ``p`` is the inverse permutation (original index → sorted index).
        """
        order = sorted(range(len(self)), key=lambda i: (self[i].ir._key(), i))
        inv = tuple(order)
        p = [0] * len(inv)
        for new, old in enumerate(inv):
            p[old] = new
        return _Sorted(Irreps([self[i] for i in inv]), tuple(p), inv)

    def remove_zero_multiplicities(self) -> Irreps:
        """Drop blocks whose multiplicity is zero."""
        return Irreps([mul_ir for mul_ir in self if mul_ir.mul > 0])

    def unify(self) -> Irreps:
        """Merge consecutive blocks of the same irrep (zero multiplicities kept)."""
        out: list[tuple[int, Irrep]] = []
        for mul, ir in self:
            if out and out[-1][1] == ir:
                out[-1] = (out[-1][0] + mul, ir)
            else:
                out.append((mul, ir))
        return Irreps(out)

    def simplify(self) -> Irreps:
        """Remove zero multiplicities, then merge consecutive equal irreps (no sorting)."""
        return self.remove_zero_multiplicities().unify()

    def regroup(self) -> Irreps:
        """Sort, then simplify: ``Irreps("1o + 0e + 1o").regroup() == "0e + 2x1o"``."""
        return self.sort().irreps.simplify()

    def filter(
        self,
        keep: IntoIrreps | Callable[[MulIrrep], bool] | None = None,
        *,
        drop: IntoIrreps | Callable[[MulIrrep], bool] | None = None,
        lmax: int | None = None,
    ) -> Irreps:
        """Keep (or drop) blocks by irrep or predicate, or keep degrees ``<= lmax``.

        >>> Irreps("1e + 2e + 0e").filter(keep="2e + 2x1e")
        1x1e+1x2e
        >>> Irreps("1e + 2e + 0e").filter(lmax=1)
        1x1e+1x0e
        """
        given = [name for name, v in (("keep", keep), ("drop", drop), ("lmax", lmax)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"filter takes one of keep, drop, lmax; got {' and '.join(given)}")
        if keep is not None:
            if callable(keep) and not isinstance(keep, (Irrep, Irreps, str)):
                return Irreps([mul_ir for mul_ir in self if keep(mul_ir)])
            kept = _irrep_set(keep, "keep")
            return Irreps([mul_ir for mul_ir in self if mul_ir.ir in kept])
        if drop is not None:
            if callable(drop) and not isinstance(drop, (Irrep, Irreps, str)):
                return Irreps([mul_ir for mul_ir in self if not drop(mul_ir)])
            dropped = _irrep_set(drop, "drop")
            return Irreps([mul_ir for mul_ir in self if mul_ir.ir not in dropped])
        if lmax is not None:
            lmax = check_int("filter: lmax", lmax, 0)
            return Irreps([mul_ir for mul_ir in self if mul_ir.ir.l <= lmax])
        return self

    def D_from_matrix(self, R: np.ndarray) -> np.ndarray:
        """Block-diagonal representation matrix ``[..., dim, dim]`` of ``R ∈ O(3)`` ``[..., 3, 3]``.

        >>> import numpy as np
        >>> Irreps("0e + 0o + 1o").D_from_matrix(-np.eye(3)).diagonal().tolist()
        [1.0, -1.0, -1.0, -1.0, -1.0]
        """
        from .wigner import irreps_D_from_matrix

        return irreps_D_from_matrix(tuple((mul, ir.l, ir.p) for mul, ir in self), R)

    # -- construction ----------------------------------------------------------------------------
    @staticmethod
    def spherical_harmonics(lmax: int, p: int = -1) -> Irreps:
        """``1x0e + 1x1o + 1x2e + ...`` up to ``lmax`` (parity ``p**l``).

        >>> Irreps.spherical_harmonics(3)
        1x0e+1x1o+1x2e+1x3o
        """
        lmax = check_int("lmax", lmax, 0)
        if p not in (1, -1):
            raise ValueError(f"p must be 1 or -1, got {p!r}")
        return Irreps([(1, (l, p**l)) for l in range(lmax + 1)])

    # -- tuple protocol ----------------------------------------------------------------------------
    def __getitem__(self, i):  # type: ignore[override]
        out = super().__getitem__(i)
        return Irreps(out) if isinstance(i, slice) else out

    def __add__(self, other: IntoIrreps) -> Irreps:  # type: ignore[override]
        return Irreps(tuple(self) + tuple(Irreps(other)))

    def __radd__(self, other: IntoIrreps) -> Irreps:
        return Irreps(tuple(Irreps(other)) + tuple(self))

    def __mul__(self, n: int) -> Irreps:  # type: ignore[override]
        """Every multiplicity times ``n``, as in e3nn-jax: ``Irreps("0e + 2x1o") * 2`` is ``2x0e+4x1o``
        (a tuple's ``*`` would repeat the blocks: ``Irreps(list(irreps) * n)`` does)."""
        if isinstance(n, bool) or not is_int(n):
            raise TypeError(f"Irreps * n multiplies the multiplicities by an int n >= 0, got {n!r}")
        if n < 0:
            raise ValueError(f"Irreps * n multiplies the multiplicities by an int n >= 0, got {n}")
        return Irreps([MulIrrep(mul * int(n), ir) for mul, ir in self])

    __rmul__ = __mul__

    def __floordiv__(self, n: int) -> Irreps:
        """Every multiplicity divided by ``n`` (rounded down), as in e3nn-jax: ``Irreps("12x0e +
        14x1e") // 2`` is ``6x0e+7x1e``."""
        if isinstance(n, bool) or not is_int(n):
            raise TypeError(f"Irreps // n divides the multiplicities by an int n > 0, got {n!r}")
        if n <= 0:
            raise ValueError(f"Irreps // n divides the multiplicities by an int n > 0, got {n}")
        return Irreps([MulIrrep(mul // int(n), ir) for mul, ir in self])

    def __eq__(self, other: object) -> bool:
        if other is None:  # Irreps(None) is the empty sum, but no Irreps is None (as in e3nn-jax)
            return False
        try:
            other = Irreps(other)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            return False
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return tuple.__hash__(self)

    def __repr__(self) -> str:
        # e3nn-jax prints the empty sum as "Irreps()"; the parser accepts that spelling back
        return "+".join(repr(mul_ir) for mul_ir in self) if self else "Irreps()"

    __str__ = __repr__


IntoIrreps = Union[Irreps, str, Irrep, MulIrrep, Iterable, None]


def as_irreps(irreps: IntoIrreps, name: str) -> Irreps:
    """``Irreps(irreps)`` for the argument called ``name``: the error names it.

    Takes every form :class:`Irreps` takes (a string, e3j's or e3nn-jax's ``Irreps``, an irrep, a list
    of ``(mul, irrep)`` pairs or of irreps). ``None`` is refused here (``Irreps(None)`` is the empty
    sum, but an argument left ``None`` is a mistake, not a request for no irreps).

    >>> as_irreps([(2, (0, 1)), (1, "1o")], "irreps_in")
    2x0e+1x1o
    >>> as_irreps("2z", "irreps_in")
    Traceback (most recent call last):
    ...
    ValueError: irreps_in: invalid irrep '2z': expected a degree and a parity, like '0e', '1o' or '2y' (in irreps '2z')
    """
    if irreps is None:
        raise ValueError(f"{name} must be irreps (a string like '2x0e + 1o', or Irreps), got None")
    try:
        return Irreps(irreps)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name}: {err}") from None


def _is_irrep_like(obj: object) -> bool:
    """An irrep from another library (e3nn-jax's ``Irrep``): integer attributes ``l`` and ``p``.

    Duck-typed so that core never imports e3nn-jax.
    """
    return not isinstance(obj, (str, Irreps)) and hasattr(obj, "l") and hasattr(obj, "p") and not hasattr(obj, "ir")


def _is_mul_irrep_like(obj: object) -> bool:
    """A multiplicity and irrep from another library (e3nn-jax's ``MulIrrep``): attributes ``mul`` and ``ir``."""
    return not isinstance(obj, (str, Irreps)) and hasattr(obj, "mul") and hasattr(obj, "ir")


def _is_irreps_like(obj: object) -> bool:
    """A direct sum of irreps from another library (e3nn-jax's ``Irreps``, a tuple of ``MulIrrep``,
    possibly empty): attributes ``num_irreps`` and ``ls``."""
    return not isinstance(obj, (str, Irreps)) and hasattr(obj, "num_irreps") and hasattr(obj, "ls")


def _mul_irrep(mul: object, ir: object, where: object) -> MulIrrep:
    if not is_int(mul) or mul < 0:
        raise ValueError(f"invalid multiplicity in {where!r}: must be an int >= 0, got {mul!r}")
    return MulIrrep(int(mul), Irrep(ir))  # type: ignore[arg-type]


def _into_mul_irrep(item: object) -> MulIrrep:
    if isinstance(item, MulIrrep):
        return _mul_irrep(item.mul, item.ir, item)
    if isinstance(item, Irrep):
        return MulIrrep(1, item)
    if isinstance(item, str):
        parsed = _parse_irreps(item)
        if len(parsed) != 1:
            raise ValueError(f"invalid irreps item '{item}': expected a single block like '2x1o'")
        return parsed[0]
    if _is_mul_irrep_like(item):  # e.g. e3nn-jax's MulIrrep
        return _mul_irrep(item.mul, item.ir, item)
    if _is_irrep_like(item):  # e.g. e3nn-jax's Irrep, a pair (l, p) that is not (mul, ir)
        return MulIrrep(1, Irrep(item))  # type: ignore[arg-type]
    if is_int(item):  # e3nn-jax reads a lone degree as even: Irreps([0, 1]) is 1x0e+1x1e
        return MulIrrep(1, Irrep(item, 1))  # type: ignore[arg-type]
    if isinstance(item, (tuple, list)) and len(item) == 2:  # lists: (mul, ir) pairs loaded from JSON
        mul, ir = item
        return _mul_irrep(mul, tuple(ir) if isinstance(ir, list) else ir, item)
    raise ValueError(f"cannot interpret {item!r} as an irrep with multiplicity")


def _parse_irreps(text: str) -> list[MulIrrep]:
    if text.strip() in ("", "Irreps()"):
        return []
    out = []
    for raw in text.split("+"):
        token = raw.strip()
        if token == "":
            raise ValueError(f"invalid irreps '{text}': empty term between '+' signs")
        if "x" in token:
            mul_text, _, ir_text = token.partition("x")
            mul_text = mul_text.strip()
            if not (mul_text.isascii() and mul_text.isdigit()):  # "²".isdigit() is True; int() refuses it
                raise ValueError(f"invalid multiplicity '{mul_text}' in '{token}': expected an int >= 0")
            mul = int(mul_text)
        else:
            mul, ir_text = 1, token
        try:
            l, p = _parse_irrep(ir_text)
        except ValueError as err:
            raise ValueError(f"{err} (in irreps '{text}')") from None
        out.append(MulIrrep(mul, Irrep(l, p)))
    return out


def _irrep_set(irreps: object, name: str) -> set[Irrep]:
    try:
        # e3nn-jax's Irrep and MulIrrep are tuples: read whole, never iterated as (l, p) or (mul, ir)
        if isinstance(irreps, (str, MulIrrep)) or _is_mul_irrep_like(irreps):
            irreps = Irreps(irreps)
        elif _is_irrep_like(irreps):
            irreps = Irrep(irreps)
        if isinstance(irreps, Irrep):
            return {irreps}
        return {Irrep(ir) for ir in irreps}  # type: ignore[union-attr]
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name}: cannot interpret {irreps!r} as a set of irreps ({err})") from None
