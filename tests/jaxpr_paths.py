"""How many tensor-product paths a function's e3j primitives run: read from its jaxpr (tests only)."""

from __future__ import annotations

import jax


def paths_bound(f, *args) -> int:
    """The paths of every e3j primitive ``f(*args)`` binds, summed: a grouped convolution's plan (all
    its groups), or an op's own table (``coo``), inside nested jaxprs too."""
    total = 0

    def walk(jaxpr):
        nonlocal total
        for eqn in jaxpr.eqns:
            for v in eqn.params.values():
                plan, coo = getattr(v, "plan", None), getattr(v, "coo", None)
                if plan is not None:
                    total += sum(g.coo.num_paths for g in plan.groups)
                elif coo is not None:
                    total += coo.num_paths
                for sub in v if isinstance(v, (tuple, list)) else (v,):
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        walk(sub.jaxpr)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        walk(sub)

    walk(jax.make_jaxpr(f)(*args).jaxpr)
    return total
