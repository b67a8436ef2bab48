"""Manual mesh axes that values vary over inside ``shard_map`` (JAX's varying manual axes).

Under ``shard_map`` (with its default ``check_vma=True``) every value's type records the manual
mesh axes it varies over. A loop carry started from ``zeros`` is invariant while a body that reads
sharded operands returns a varying value; a primitive whose operands vary over different axes gets
a cotangent for an invariant operand that varies. Both are fixed by casting to the union of the axes
(``jax.lax.pcast(..., to="varying")``, whose transpose is the ``psum`` such a cotangent needs).
Outside ``shard_map`` there are no such axes and nothing changes.
"""

from __future__ import annotations

import jax

__all__ = ["varying_axes", "varying_like"]


def varying_axes(a) -> set:
    """The manual mesh axes ``a`` varies over (empty outside ``shard_map``)."""
    mat = getattr(jax.typeof(a), "mat", None)  # the aval's manual axis type (None outside shard_map)
    return set(getattr(mat, "varying", None) or ())


def varying_like(tree, *operands):
    """``tree`` (a pytree of arrays) with each leaf cast to vary over every manual mesh axis that
    any leaf of ``operands`` (pytrees; ``None`` leaves skipped) varies over."""
    axes = set()
    for leaf in jax.tree.leaves(operands):
        axes |= varying_axes(leaf)

    def cast(a):
        missing = tuple(sorted(axes - varying_axes(a)))
        return jax.lax.pcast(a, missing, to="varying") if missing else a

    return jax.tree.map(cast, tree)
