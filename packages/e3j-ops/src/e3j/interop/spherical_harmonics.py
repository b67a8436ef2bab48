"""``e3nn.spherical_harmonics`` on e3j's exact polynomials, ``IrrepsArray`` in and out."""

from __future__ import annotations

from collections.abc import Sequence

import e3nn_jax as e3nn
import jax

from e3j_core import Irreps, as_irreps
from e3j_core.spherical_harmonics import _as_ls, is_degrees

from .._checks import check_truth
from ..spherical_harmonics import _vector_parity, check_algorithm
from ..spherical_harmonics import spherical_harmonics as _sh
from .layout import to_e3nn_irreps

__all__ = ["spherical_harmonics"]


def spherical_harmonics(
    irreps_out: e3nn.Irreps | Irreps | str | int | Sequence[int],
    input: e3nn.IrrepsArray | jax.Array,
    normalize: bool,
    normalization: str | None = None,
    *,
    algorithm: tuple[str, ...] | None = None,
) -> e3nn.IrrepsArray:
    """Equal to ``e3nn.spherical_harmonics(irreps_out, input, normalize, normalization, algorithm=...)``.

    ``input``: ``[..., 3]`` array or an ``IrrepsArray`` of one vector (``1o`` or ``1e``); degrees
    given as an int or ints take their parity from it (``p**l``), as in e3nn-jax, and need it.
    ``normalization=None`` reads e3nn-jax's configured default. ``algorithm`` is checked and
    ignored, as by :func:`e3j.spherical_harmonics`; integer inputs are promoted as there.

    >>> import jax.numpy as jnp
    >>> spherical_harmonics([1, 2], e3nn.IrrepsArray("1e", jnp.array([0.0, 1.0, 0.0])), True).irreps
    1x1e+1x2e
    """
    normalize = check_truth("normalize", normalize)
    check_algorithm(algorithm)
    if normalization is None:
        normalization = e3nn.config("spherical_harmonics_normalization")
    vec_p = _vector_parity(input.irreps) if isinstance(input, e3nn.IrrepsArray) else None
    ls = _as_ls(irreps_out, "irreps_out")  # checked degrees, one per copy
    if is_degrees(irreps_out):
        if vec_p is None:
            raise ValueError("irreps_out given as degrees needs input as an IrrepsArray (1o or 1e), as in e3nn-jax")
        irreps = as_irreps([(1, (l, vec_p**l)) for l in ls], "irreps_out")
    else:
        irreps = as_irreps(irreps_out, "irreps_out")
    # the core function checks the parities of an IrrepsArray input and reads its array
    return e3nn.IrrepsArray(to_e3nn_irreps(irreps), _sh(irreps, input, normalize, normalization))
