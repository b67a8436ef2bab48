"""What a function's e3j primitives run, read from its jaxpr (tests only): how many tensor-product
paths, and which primitives on which platform."""

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
                platforms = eqn.params.get("branches_platforms") if eqn.primitive.name == "cond" else None
                if platforms and v is eqn.params["branches"]:
                    v = (v[_branch_of(platforms, "cpu")],)  # the branch that runs here
                for sub in v if isinstance(v, (tuple, list)) else (v,):
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        walk(sub.jaxpr)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        walk(sub)

    walk(jax.make_jaxpr(f)(*args).jaxpr)
    return total


def _branch_of(platforms, platform: str) -> int:
    """The branch of a ``platform_dependent`` that runs on ``platform`` (``platforms``: one group of
    platforms per branch, ``None`` for the default)."""
    for i, group in enumerate(platforms):
        if group is not None and platform in group:
            return i
    return platforms.index(None)


def routes(f, *args) -> dict:
    """The primitives ``f`` binds at its top level on each platform (``"default"``: the others): the
    same list for all when ``f`` binds one form, else each branch of its ``platform_dependent``."""
    jaxpr = jax.make_jaxpr(f)(*args).jaxpr
    top = [e.primitive.name for e in jaxpr.eqns]
    conds = [e for e in jaxpr.eqns if e.primitive.name == "cond" and e.params.get("branches_platforms")]
    keys = ("cpu", "cuda", "rocm", "tpu", "default")
    if not conds:
        return dict.fromkeys(keys, top)
    (cond,) = conds
    names = [[e.primitive.name for e in b.jaxpr.eqns] for b in cond.params["branches"]]
    platforms = cond.params["branches_platforms"]
    return {k: names[_branch_of(platforms, k)] if k != "default" else names[platforms.index(None)] for k in keys}
