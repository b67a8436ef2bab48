"""Primitives for multilinear forms, closed under JVP and transposition (paper Eq. 14–18).

Both hot operations are contractions of one multilinear form ``Φ`` over *slots*:

- tensor product: ``Φ(x, y, z) = Σ_r c_r x[i1] y[i2] z[i0]`` (slots ``x, y, z``),
- convolution: ``Φ(x, y, s, m) = Σ_edges Σ_r c_r x_a[i1] y_ab[i2] s_ab[i3] m_b[i0]``.

``contract_j(A)`` is the gradient of ``Φ`` with respect to slot ``j``, evaluated on values ``A`` of the
other slots: ``contract_z`` is the forward tensor product, ``contract_x`` its VJP for ``x``,
``contract_m`` the convolution, ``contract_{x,y,s}`` the convolution backward. Two primitives:

``M(Q; outs)``
    one output per ``j`` in ``outs``: ``contract_j(Q∖j)``. The forward op is ``M`` with
    ``outs = (z,)`` or ``(m,)``; a fused backward is ``M`` with several ``outs``.
``L(Q, T; outs)``
    linear in ``T``: output ``j`` is ``Σ_{k ∈ T, k ≠ j} contract_j(Q∖j with slot k replaced by T_k)``.

Rules, all in terms of ``M`` and ``L`` (so every order of differentiation works):

- ``jvp M(Q; J) = L(Q, Q̇; J)`` — one call, linear in all tangents jointly, whose transpose is one
  fused backward call;
- ``transpose_T L(Q, T; J)`` with cotangents ``g_J`` is ``L(Q, g_J; K)`` for the undefined slots ``K``;
- ``jvp L(Q, T; J) = L(Q, Ṫ; J) + Σ_{k ∈ T} L(Q[k→T_k], Q̇∖k; J∖k)``.

Kernels only ever see ``M``-shaped calls: ``L`` lowers to one ``M`` evaluation per tangent slot (a
form may merge some: the factored forms evaluate the tangents of both factors of their weights as one,
:func:`factored_evaluations`).
Nothing differentiates through a kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from e3j_core import TensorProductCoo

from .. import contract
from .._vma import varying_like
from ..backends import OpRequest, kernels_of, programs_per_request, select_backend

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
#: compiled programs kept for eager (un-jitted) calls, one per static setting (an op, its derivative
#: order and requested outputs, its backend): an eager training step of a model with 14 convolutions
#: uses ~70, and cycling through more than the cache holds recompiles every one of them every step
EAGER_PROGRAMS = 256


@dataclass(frozen=True)
class CooSpec:
    """Static parameters shared by the tensor-product and convolution primitives.

    Every slot carries channels except ``y`` when it is broadcast over them (``y_channels=False``).
    """

    coo: TensorProductCoo
    y_channels: bool
    #: pytree structure of the graph whose leaves ride along as non-differentiable operands (the
    #: convolution's :class:`e3j.Graph`): kernels get it back with its named fields
    graph_tree: Any = None

    def has_channels(self, slot: str) -> bool:
        return slot != "y" or self.y_channels

    @property
    def lmax(self) -> int:
        return coo_lmax(self.coo)


def coo_lmax(coo: TensorProductCoo) -> int:
    """The largest degree among a product's operands and output (what a backend's ``max_l`` bounds)."""
    return max(ir.l for irreps in (coo.irreps_x, coo.irreps_y, coo.irreps_out) for _, ir in irreps)


@dataclass(frozen=True)
class Multilinear:
    """The op-specific parts of a multilinear form.

    Attributes:
        name: primitive name prefix.
        slots: slot names; ``Q``/``T``/``outs`` params are tuples of these.
        out_aval: ``(spec, slot, avals_by_slot, aux_avals) -> ShapedArray`` of ``contract_slot``.
        batch: ``(M_bind, spec, assignment, aux, dims, outs) -> (outputs, out_dims)`` or ``None`` to
            use the generic sequential fallback.
        dispatch: ``(form, platform, requested, spec, operands, aux, outs) -> {slot: array}``, how one
            ``M`` evaluation reaches the kernels; ``None``: :func:`dispatch` (one COO op).
        evaluations: ``(Q, T, outs) -> [(operands, outputs)]``, the ``M`` evaluations whose sum an
            ``L`` call is; ``None``: :func:`one_per_tangent`.
        dispatch_L: ``(form, platform, requested, spec, Q, T, aux, outs) -> {slot: array} | None``,
            an ``L`` call lowered as a whole (the factored forms on a backend without their
            kernels, :func:`multiplied_out`); ``None``, or a ``None`` result: its evaluations, each
            through ``dispatch``.
    """

    name: str
    slots: tuple[str, ...]
    out_aval: Callable[..., Any]
    batch: Callable[..., Any] | None = None
    dispatch: Callable[..., dict] | None = None
    evaluations: Callable[..., list] | None = None
    dispatch_L: Callable[..., dict | None] | None = None


class Primitives:
    """The ``M`` and ``L`` primitives of one :class:`Multilinear` form, with all their rules."""

    def __init__(self, form: Multilinear) -> None:
        self.form = form
        self.M = Primitive(f"e3j_{form.name}")
        self.L = Primitive(f"e3j_{form.name}_lin")
        for p in (self.M, self.L):
            p.multiple_results = True
            p.def_impl(partial(_apply_jitted, p))
        self.M.def_abstract_eval(self._abstract_M)
        self.L.def_abstract_eval(self._abstract_L)
        ad.primitive_jvps[self.M] = self._jvp_M
        ad.primitive_jvps[self.L] = self._jvp_L
        ad.primitive_transposes[self.M] = self._transpose_M
        ad.primitive_transposes[self.L] = self._transpose_L
        batching.primitive_batchers[self.M] = self._batch_M
        batching.primitive_batchers[self.L] = self._batch_L
        for platform in PLATFORMS:
            mlir.register_lowering(self.M, self._lowering_M(platform), platform=platform)
            mlir.register_lowering(self.L, self._lowering_L(platform), platform=platform)

    # -- binding ------------------------------------------------------------------------------
    def bind_M(self, spec, Q: dict, aux: Sequence, outs: Sequence[str], backend: str | None) -> dict:
        q_slots = tuple(s for s in self.form.slots if s in Q)
        outs = tuple(s for s in self.form.slots if s in outs)
        if not outs:
            return {}
        # under shard_map, operands vary alike: an invariant operand's cotangent is then summed
        # over the axes the others vary over (pcast's transpose), as its type requires
        Q = varying_like(Q, Q)
        results = self.M.bind(
            *[Q[s] for s in q_slots],
            *aux,
            spec=spec,
            q_slots=q_slots,
            outs=outs,
            n_aux=len(aux),
            backend=backend,
        )
        return dict(zip(outs, results))

    def bind_L(self, spec, Q: dict, T: dict, aux: Sequence, outs: Sequence[str], backend: str | None) -> dict:
        q_slots = tuple(s for s in self.form.slots if s in Q)
        t_slots = tuple(s for s in self.form.slots if s in T)
        outs = tuple(s for s in self.form.slots if s in outs)
        if not outs or not t_slots:
            return {}
        Q, T = varying_like((Q, T), Q, T)
        results = self.L.bind(
            *[Q[s] for s in q_slots],
            *[T[s] for s in t_slots],
            *aux,
            spec=spec,
            q_slots=q_slots,
            t_slots=t_slots,
            outs=outs,
            n_aux=len(aux),
            backend=backend,
        )
        return dict(zip(outs, results))

    # -- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _split(args, q_slots, t_slots, n_aux):
        nq, nt = len(q_slots), len(t_slots)
        Q = dict(zip(q_slots, args[:nq]))
        T = dict(zip(t_slots, args[nq : nq + nt]))
        aux = tuple(args[nq + nt : nq + nt + n_aux])
        return Q, T, aux

    def _abstract_M(self, *avals, spec, q_slots, outs, n_aux, backend):
        Q, _, aux = self._split(avals, q_slots, (), n_aux)
        return [self.form.out_aval(spec, j, Q, aux) for j in outs]

    def _abstract_L(self, *avals, spec, q_slots, t_slots, outs, n_aux, backend):
        Q, T, aux = self._split(avals, q_slots, t_slots, n_aux)
        return [self.form.out_aval(spec, j, {**Q, **T}, aux) for j in outs]

    # -- JVP ----------------------------------------------------------------------------------
    def _jvp_M(self, primals, tangents, *, spec, q_slots, outs, n_aux, backend):
        Q, _, aux = self._split(primals, q_slots, (), n_aux)
        dQ, _, _ = self._split(tangents, q_slots, (), n_aux)
        out = self.bind_M(spec, Q, aux, outs, backend)
        Qdot = {k: v for k, v in dQ.items() if type(v) is not ad.Zero}
        lin = self.bind_L(spec, Q, Qdot, aux, outs, backend)
        primal_out = [out[j] for j in outs]
        tangent_out = [lin[j] if j in lin else _zero_tangent(out[j]) for j in outs]
        return primal_out, tangent_out

    def _jvp_L(self, primals, tangents, *, spec, q_slots, t_slots, outs, n_aux, backend):
        Q, T, aux = self._split(primals, q_slots, t_slots, n_aux)
        dQ, dT, _ = self._split(tangents, q_slots, t_slots, n_aux)
        out = self.bind_L(spec, Q, T, aux, outs, backend)
        Tdot = {k: v for k, v in dT.items() if type(v) is not ad.Zero}
        Qdot = {k: v for k, v in dQ.items() if type(v) is not ad.Zero}
        terms = [self.bind_L(spec, Q, Tdot, aux, outs, backend)]
        for k, Tk in T.items():
            rest = {s: v for s, v in Qdot.items() if s != k}
            terms.append(self.bind_L(spec, {**Q, k: Tk}, rest, aux, [j for j in outs if j != k], backend))
        tangent_out = []
        for j in outs:
            parts = [t[j] for t in terms if j in t]
            tangent_out.append(_sum(parts) if parts else _zero_tangent(out[j]))
        return [out[j] for j in outs], tangent_out

    # -- transpose ----------------------------------------------------------------------------
    def _transpose_M(self, cts, *args, spec, q_slots, outs, n_aux, backend):
        # M is linear in any one operand slot k: its transpose is contract_k of the cotangents
        Q, _, aux = self._split(args, q_slots, (), n_aux)
        undefined = [k for k, v in Q.items() if ad.is_undefined_primal(v)]
        if len(undefined) != 1:
            raise ValueError(f"{self.M.name} is linear in one operand at a time, got {undefined} as linear inputs")
        (k,) = undefined
        known = {s: v for s, v in Q.items() if s != k}
        G = {j: ct for j, ct in zip(outs, cts) if type(ct) is not ad.Zero}
        res = self.bind_L(spec, known, G, aux, [k], backend) if G else {}
        ct_k = res[k] if k in res else ad.Zero(Q[k].aval)
        return [ct_k if s == k else None for s in Q] + [None] * len(aux)

    def _transpose_L(self, cts, *args, spec, q_slots, t_slots, outs, n_aux, backend):
        Q, T, aux = self._split(args, q_slots, t_slots, n_aux)
        G = {j: ct for j, ct in zip(outs, cts) if type(ct) is not ad.Zero}
        undefined_q = [k for k, v in Q.items() if ad.is_undefined_primal(v)]
        if undefined_q:
            return self._transpose_L_in_operand(undefined_q, G, Q, T, aux, spec, backend)
        undefined = [k for k, v in T.items() if ad.is_undefined_primal(v)]
        res = self.bind_L(spec, Q, G, aux, undefined, backend) if G else {}
        t_cts = []
        for k, v in T.items():
            if not ad.is_undefined_primal(v):
                t_cts.append(None)
            elif k in res:
                t_cts.append(res[k])
            else:
                t_cts.append(ad.Zero(v.aval))
        return [None] * len(Q) + t_cts + [None] * len(aux)

    def _transpose_L_in_operand(self, undefined_q, G, Q, T, aux, spec, backend):
        """``L`` transposed in one operand slot ``q`` with its tangents known (a JVP's tangent as a
        function of a primal, e.g. under ``jax.linear_transpose``): output ``j``'s term for tangent
        slot ``k`` reads ``Q[q]`` once when ``k != q``, so ``q``'s cotangent is
        ``Σ_{k ≠ q} L(Q[k→T_k], G∖k; q)``; a term with ``k = q`` does not read ``Q[q]``."""
        if len(undefined_q) != 1 or any(ad.is_undefined_primal(v) for v in T.values()):
            undefined = undefined_q + [f"tangent {k}" for k, v in T.items() if ad.is_undefined_primal(v)]
            raise ValueError(
                f"{self.L.name} is linear in one operand or in its tangents, got {undefined} as linear inputs"
            )
        (q,) = undefined_q
        known = {s: v for s, v in Q.items() if s != q}
        parts = []
        for k, Tk in T.items():
            Gk = {j: g for j, g in G.items() if j != k}
            if k != q and Gk:
                parts += [r[q] for r in [self.bind_L(spec, {**known, k: Tk}, Gk, aux, [q], backend)] if q in r]
        ct_q = _sum(parts) if parts else ad.Zero(Q[q].aval)
        return [ct_q if s == q else None for s in Q] + [None] * (len(T) + len(aux))

    # -- batching -----------------------------------------------------------------------------
    def _batch_M(self, args, dims, *, spec, q_slots, outs, n_aux, backend):
        Q, _, aux = self._split(args, q_slots, (), n_aux)
        qd, _, auxd = self._split(dims, q_slots, (), n_aux)

        def call(spec, Q, aux, outs):
            return self.bind_M(spec, Q, aux, outs, backend)

        return self._batch(call, spec, Q, {}, aux, qd, {}, auxd, outs)

    def _batch_L(self, args, dims, *, spec, q_slots, t_slots, outs, n_aux, backend):
        Q, T, aux = self._split(args, q_slots, t_slots, n_aux)
        qd, td, auxd = self._split(dims, q_slots, t_slots, n_aux)

        def call(spec, QT, aux, outs):
            q = {k: v for k, v in QT.items() if not k.startswith("~")}
            t = {k[1:]: v for k, v in QT.items() if k.startswith("~")}
            return self.bind_L(spec, q, t, aux, outs, backend)

        # tangent slots are keyed with a leading "~" so one dict carries both groups
        QT = {**Q, **{"~" + k: v for k, v in T.items()}}
        QTd = {**qd, **{"~" + k: v for k, v in td.items()}}
        return self._batch(call, spec, QT, {}, aux, QTd, {}, auxd, outs)

    def _batch(self, call, spec, values, _unused, aux, dims, _unused_d, auxd, outs):
        if self.form.batch is not None:
            res = self.form.batch(call, spec, values, aux, dims, auxd, outs)
            if res is not None:
                return res
        return _sequential_batch(call, spec, values, aux, dims, auxd, outs)

    # -- lowering -----------------------------------------------------------------------------
    def _lowering_M(self, platform: str):
        def impl(*args, spec, q_slots, outs, n_aux, backend):
            Q, _, aux = self._split(args, q_slots, (), n_aux)
            res = (self.form.dispatch or dispatch)(self.form, platform, backend, spec, Q, aux, outs)
            return [res[j] for j in outs]

        return mlir.lower_fun(impl, multiple_results=True)

    def _lowering_L(self, platform: str):
        def impl(*args, spec, q_slots, t_slots, outs, n_aux, backend):
            Q, T, aux = self._split(args, q_slots, t_slots, n_aux)
            whole = self.form.dispatch_L
            acc = whole(self.form, platform, backend, spec, Q, T, aux, outs) if whole is not None else None
            if acc is None:
                acc = {}
                for A, js in (self.form.evaluations or one_per_tangent)(Q, T, outs):
                    res = (self.form.dispatch or dispatch)(self.form, platform, backend, spec, A, aux, js)
                    for j in js:
                        acc[j] = res[j] if j not in acc else acc[j] + res[j]
            results = []
            for j in outs:
                if j in acc:
                    results.append(acc[j])
                else:
                    avals = {k: jax.typeof(v) for k, v in {**Q, **T}.items()}
                    aval = self.form.out_aval(spec, j, avals, tuple(jax.typeof(a) for a in aux))
                    results.append(jnp.zeros(aval.shape, aval.dtype))
            return results

        return mlir.lower_fun(impl, multiple_results=True)


def one_per_tangent(Q: dict, T: dict, outs: tuple[str, ...]) -> list[tuple[dict, tuple[str, ...]]]:
    """The ``M`` evaluations of ``L(Q, T; outs)``: for each tangent slot ``k``, the outputs but ``k``
    with ``Q``'s slot ``k`` replaced by ``T_k``."""
    evaluations = []
    for k, Tk in T.items():
        js = tuple(j for j in outs if j != k)
        if js:
            evaluations.append(({**Q, k: Tk}, js))
    return evaluations


def factored_evaluations(Q: dict, T: dict, outs: tuple[str, ...]) -> list[tuple[dict, tuple[str, ...]]]:
    """:func:`one_per_tangent` for a form whose weights are a product ``h @ k`` (slots ``h [E, H]``
    and ``k [H, ...]``): the tangents of both factors are one tangent of the weights, ``ḣ k + h k̇ =
    [ḣ, h] @ [k; k̇]``, so the outputs other than ``h`` and ``k`` take one evaluation with the factors
    stacked (a hidden width of ``2H``) instead of one per factor: a forces loss differentiated
    with respect to the radial network's parameters then sweeps the edges as often as with an array
    of weights."""
    if not ("h" in T and "k" in T and "h" in Q and "k" in Q):
        return one_per_tangent(Q, T, outs)
    evaluations = []
    rest = tuple(j for j in outs if j not in ("h", "k"))
    if rest:
        h = jnp.concatenate([T["h"], Q["h"]], axis=1)
        k = jnp.concatenate([Q["k"], T["k"]], axis=0)
        evaluations.append(({**Q, "h": h, "k": k}, rest))
    if "k" in outs:
        evaluations.append(({**Q, "h": T["h"]}, ("k",)))
    if "h" in outs:
        evaluations.append(({**Q, "k": T["k"]}, ("h",)))
    others = {s: v for s, v in T.items() if s not in ("h", "k")}
    return evaluations + one_per_tangent(Q, others, outs)


def multiplied_out(
    Q: dict, T: dict | None, outs: tuple[str, ...], dtype, tail: tuple[int, ...], run: Callable, edge_mask
) -> dict:
    """The outputs ``outs`` of ``M(Q; outs)`` (``T is None``) or of ``L(Q, T; outs)`` of a factored
    form (weights ``h [E, H] @ k [H, *tail]``) on a backend without its kernels, through the array
    form (slot ``s``): ``run(operands, outs)`` evaluates one ``M`` of the array form.

    The weights are multiplied out once per call (``s = h @ k``, ``[E, *tail]``, a temporary) and
    their tangent with them (``ṡ = ḣ k + h k̇``); the array form's ``L`` then runs one evaluation per
    tangent slot, the weights' cotangents of all of them summed (``ds``) before the products that
    give the factors': ``dh = ds k^T + ds_Q k̇^T``, ``dk = h^T ds + ḣ^T ds_Q`` (``ds_Q`` the weights'
    cotangent on ``Q`` itself, which the evaluation of ``ṡ`` gives along, since it does not read the
    weights). One product of each kind per call, where one per evaluation cost up to three times as
    many (a force-training step's second-order call). ``tail`` is explicit: ``E``, ``H`` or its
    width may be 0. ``edge_mask [E]``: the graph's; padding edges' rows of ``h`` (and of its tangent)
    are zeroed here, where the products read every row (``0 * NaN`` in ``h^T ds``), as the fused
    kernels zero them chunk by chunk: the ops pass ``h`` unmasked, the route to a backend with
    factored kernels copying nothing."""
    width = math.prod(tail)

    def factor(v, rows_first: bool):
        if v is None:
            return None
        v = jnp.asarray(v).astype(dtype)
        if rows_first:
            return jnp.where(jnp.reshape(edge_mask, (-1, 1)), v, 0)
        return v.reshape(v.shape[0], width)

    h, k = factor(Q.get("h"), True), factor(Q.get("k"), False)
    array_q = {s: v for s, v in Q.items() if s not in ("h", "k")}
    if h is not None and k is not None:
        array_q["s"] = jnp.dot(h, k).reshape(h.shape[0], *tail)
    wants_factors = "h" in outs or "k" in outs
    array_outs = tuple(o for o in outs if o not in ("h", "k")) + (("s",) if wants_factors else ())
    th = tk = ds_q = None
    if T is None:
        acc = run(array_q, array_outs)
    else:
        th, tk = factor(T.get("h"), True), factor(T.get("k"), False)
        array_t = {s: v for s, v in T.items() if s not in ("h", "k")}
        terms = ([jnp.dot(th, k)] if th is not None and k is not None else []) + (
            [jnp.dot(h, tk)] if tk is not None and h is not None else []
        )
        if terms:
            array_t["s"] = _sum(terms).reshape(terms[0].shape[0], *tail)
        wants_ds_q = ("h" in outs and tk is not None) or ("k" in outs and th is not None)
        acc = {}
        for t, Tt in array_t.items():
            js = tuple(j for j in array_outs if j != t) + (("s",) if t == "s" and wants_ds_q else ())
            if not js:
                continue
            res = dict(run({**array_q, t: Tt}, js))
            if t == "s" and wants_ds_q:
                ds_q = res.pop("s")
            for j, v in res.items():
                acc[j] = v if j not in acc else acc[j] + v
        if wants_ds_q and ds_q is None:  # no tangent of the weights reaches another output
            ds_q = run(array_q, ("s",))["s"]
    acc = dict(acc)
    ds = acc.pop("s", None)
    ds, ds_q = (None if d is None else d.reshape(d.shape[0], width) for d in (ds, ds_q))
    if "h" in outs:
        parts = ([jnp.dot(ds, k.T)] if ds is not None else []) + (
            [jnp.dot(ds_q, tk.T)] if ds_q is not None and tk is not None else []
        )
        if parts:
            acc["h"] = _sum(parts)
    if "k" in outs:
        parts = ([jnp.dot(h.T, ds)] if ds is not None else []) + (
            [jnp.dot(th.T, ds_q)] if ds_q is not None and th is not None else []
        )
        if parts:
            acc["k"] = _sum(parts).reshape(parts[0].shape[0], *tail)
    return acc


def dispatch(form: Multilinear, platform: str, requested: str | None, spec: CooSpec, A: dict, aux, outs) -> dict:
    """The ``M`` outputs ``outs``: select the backend that runs the op on ``platform`` (inside a
    lowering) and call its kernels under the kernel contract.

    ``A`` maps slots to the traced operands of one ``M`` evaluation, ``aux`` holds the graph's leaves.
    """
    op = form.name
    channels = next(a.shape[-1] for k, a in A.items() if spec.has_channels(slot_of(k)))
    dtype = jnp.dtype(next(iter(A.values())).dtype).name
    backend = select_backend(OpRequest(op, platform, dtype, channels, spec.lmax), requested)
    graph = jax.tree.unflatten(spec.graph_tree, aux) if spec.graph_tree is not None else None
    avals = {k: jax.typeof(v) for k, v in A.items()}
    aux_avals = tuple(jax.typeof(a) for a in aux)
    return contract.run(
        op,
        kernels_of(backend, platform),
        backend.name,
        spec.coo,
        A,
        graph,
        outs,
        y_channels=spec.y_channels,
        result_type=lambda slot: form.out_aval(spec, slot, avals, aux_avals),
    )


def _apply_jitted(primitive: Primitive, *args, **params):
    """Eager evaluation: the primitive compiled on its own (what ``jit`` of one primitive gives)."""
    # compiled under jax.disable_jit() too: there jit would call bind, whose impl is this (a loop)
    with jax.disable_jit(False):
        return _jitted(primitive, tuple(sorted(params.items())))(*args)


@programs_per_request(maxsize=EAGER_PROGRAMS)
def _jitted(primitive: Primitive, params: tuple) -> Callable:
    # params are the primitive's static parameters (hashable): one compiled function per setting
    # (and E3J_BACKEND value), the least recently used dropped past EAGER_PROGRAMS (each holds its
    # executables: unbounded, a loop over many irreps ran the process out of memory maps)
    return jax.jit(partial(primitive.bind, **dict(params)))


def out_aval(shape: tuple[int, ...], dtype, operands: Sequence) -> jax.core.ShapedArray:
    """A result aval that varies over the manual mesh axes its operands vary over (shard_map)."""
    varying = [a for a in operands if getattr(a, "mat", None) is not None and not a.mat.empty]
    if not varying:
        return jax.core.ShapedArray(shape, dtype)
    widest = max(varying, key=lambda a: len(a.mat.varying))
    sharding = jax.sharding.NamedSharding(widest.sharding.mesh, jax.sharding.PartitionSpec(*([None] * len(shape))))
    return jax.core.ShapedArray(shape, dtype, sharding=sharding, manual_axis_type=widest.mat)


def slot_of(key: str) -> str:
    """The slot name of an operand key (batching rules key tangent slots as ``"~" + slot``)."""
    return key.lstrip("~")


def _zero_tangent(primal) -> ad.Zero:
    """A symbolic zero tangent for ``primal`` (``ad.Zero.from_primal_value`` is gone in JAX 0.11.2)."""
    return ad.Zero(jax.typeof(primal).to_tangent_aval())


def _sum(parts):
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def _sequential_batch(call, spec, values, aux, dims, auxd, outs):
    """Fallback batching: loop over the mapped axis with ``lax.map`` (correct for any operand)."""
    size = next(v.shape[d] for v, d in zip([*values.values(), *aux], [*dims.values(), *auxd]) if d is not None)
    keys = list(values)

    def move(v, d):
        return jnp.moveaxis(v, d, 0) if d is not None else None

    mapped_vals = [move(values[k], dims[k]) for k in keys]
    mapped_aux = [move(a, d) for a, d in zip(aux, auxd)]

    def body(xs):
        vals, ax = xs
        vs = {k: (vals[i] if dims[k] is not None else values[k]) for i, k in enumerate(keys)}
        aa = tuple(ax[i] if auxd[i] is not None else aux[i] for i in range(len(aux)))
        res = call(spec, vs, aa, outs)
        return [res[j] for j in outs]

    placeholder = jnp.zeros((size,), jnp.int8)
    vals_in = [v if v is not None else placeholder for v in mapped_vals]
    aux_in = [a if a is not None else placeholder for a in mapped_aux]
    res = jax.lax.map(body, (vals_in, aux_in))
    return res, [0] * len(outs)
