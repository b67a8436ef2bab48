"""An equivariant linear layer on e3j's ``[..., D, C]`` arrays with ``e3nn_jax.flax.Linear``'s parameters."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from e3j_core import Irreps, as_irreps

from .._checks import check_bool, check_host_index, check_positive_int, check_rank, float_dtype, is_irreps_array
from .._mul_ir_plan import take_runs

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

    The call takes what ``e3nn.flax.Linear``'s takes, in e3j's layout:

    - ``lin(x)``: the parameters above.
    - ``lin(index, x)`` with ``num_indexed_weights=S`` and ``index: int [...]`` (e.g. each node's
      species): every parameter gains a leading ``[S]`` axis and each element uses its row. An
      index is read with JAX's indexing, as in e3nn-jax: a negative one counts from the end
      (``-1`` is row ``S - 1``). Host indices outside ``[-S, S)`` raise a ``ValueError``; traced
      ones (inside ``jit``) cannot be checked, and one past the end is clamped to the last row there
      (e3nn-jax clamps it in both cases): check those before the call.
    - ``lin(weights, x)`` with float ``weights [..., d]`` (e.g. an embedding): every parameter gains
      a leading ``[d]`` axis and each element's parameters are ``weights @ parameter / sqrt(d)``
      (e3nn's ``gradient_normalization`` splits the ``1/sqrt(d)`` between the initialization and
      this product). ``weights_per_channel=True`` gives each channel its own: the parameters are
      ``[d, C, mul_in, mul_out]`` for the irreps of one channel, e3nn's ``weights_per_channel`` on
      its ``[..., C, irreps]`` features (``channels_out`` must equal ``C_in``).

    ``index`` or ``weights`` and ``x``'s batch broadcast together, as in e3nn-jax.

    Output irreps: ``irreps_out`` simplified and, unless ``force_irreps_out``, without the irreps
    the input lacks (zeros for them otherwise), as in e3nn-jax (:meth:`output_irreps` gives them).
    ``biases=True`` adds e3nn's ``b[j]`` parameters to the scalar (``0e``) outputs.
    ``simplify_irreps_internally=False`` keeps both irreps as given (no regrouping, zero-multiplicity
    blocks kept), and only then can ``instructions`` list the ``(i_in, i_out)`` block pairs to
    connect (indices into ``irreps_in`` and into the output irreps); ``parameter_initializer`` is
    e3nn's: a callable returning the initializer of every parameter, biases included.

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
    >>> mixed = Linear("0e + 1o", channels_out=8, irreps_in="0e + 1o", weights_per_channel=True)
    >>> embedding = jnp.ones((5, 6))
    >>> jax.tree.map(jnp.shape, mixed.init(jax.random.key(0), embedding, x)["params"])
    {'w[0,0] 1x0e,1x0e': (6, 8, 1, 1), 'w[1,1] 1x1o,1x1o': (6, 8, 1, 1)}
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
    parameter_initializer: Callable[[], Callable] | None = None
    instructions: Sequence[tuple[int, int]] | None = None
    weights_per_channel: bool = False
    simplify_irreps_internally: bool = True

    def output_irreps(self) -> Irreps:
        """The irreps of the output's rows: ``irreps_out`` simplified and, unless ``force_irreps_out``,
        filtered to the irreps of ``irreps_in`` (as given with ``simplify_irreps_internally=False``;
        ``irreps_out`` as given under ``force_irreps_out``). Callable on an unbound module."""
        if self.force_irreps_out:
            return as_irreps(self.irreps_out, "irreps_out")
        return self._internal_out()

    def _internal_out(self) -> Irreps:
        """The output irreps e3nn-jax's ``FunctionalLinear`` sees (what ``instructions`` index)."""
        check_bool("simplify_irreps_internally", self.simplify_irreps_internally)
        check_bool("force_irreps_out", self.force_irreps_out)
        simplify = self.simplify_irreps_internally
        blocks_in = _blocks(as_irreps(self.irreps_in, "irreps_in"), regroup=simplify)
        irreps_out = as_irreps(self.irreps_out, "irreps_out")
        if simplify:
            irreps_out = irreps_out.simplify()
        return irreps_out if self.force_irreps_out else irreps_out.filter(keep=[ir for ir, _ in blocks_in])

    @nn.compact
    def __call__(self, weights_or_x: jax.Array, x: jax.Array | None = None) -> jax.Array:
        irreps_in = as_irreps(self.irreps_in, "irreps_in")
        for name in ("biases", "channel_axis", "force_irreps_out", "weights_per_channel", "simplify_irreps_internally"):
            check_bool(name, getattr(self, name))
        c_out = check_positive_int("channels_out", self.channels_out)
        if self.num_indexed_weights is not None:
            check_positive_int("num_indexed_weights", self.num_indexed_weights, " or None")
        path_norm = parse_normalization(self.path_normalization, "path_normalization", "element")
        grad_norm = parse_normalization(self.gradient_normalization, "gradient_normalization", "path")
        if self.parameter_initializer is not None and not callable(self.parameter_initializer):
            raise TypeError(
                "parameter_initializer must be a callable returning an initializer (as in e3nn-jax), "
                f"got {self.parameter_initializer!r}"
            )
        mode, given, x = _read_call(weights_or_x, x, self.num_indexed_weights)

        hint = " (e3j's layout: an e3nn IrrepsArray [..., irreps] is x.array[..., None], or e3j.from_mul_ir)"
        if is_irreps_array(x):
            raise TypeError(
                f"x must be an array [..., D_in={irreps_in.dim}, C_in], got an IrrepsArray of {x.irreps}"
                f"{_irreps_array_hint(x, irreps_in)}"
            )
        check_rank("x", x, tuple(range(2, 10)), f"[..., D_in={irreps_in.dim}, C_in]")
        dtype = float_dtype("x", x)
        if x.shape[-2] != irreps_in.dim:
            raise ValueError(f"x must be [..., {irreps_in.dim}, C_in] for irreps_in {irreps_in}, got {x.shape}{hint}")
        c_in = x.shape[-1]
        per_channel = self.weights_per_channel
        if per_channel:
            if self.channel_axis:
                raise ValueError(
                    "weights_per_channel cannot be combined with channel_axis (e3nn-jax: nor with channel_out)"
                )
            if mode != "mixed":
                raise ValueError("weights_per_channel needs float weights: call lin(weights, x), as in e3nn-jax")
            if c_out != c_in:
                raise ValueError(
                    "with weights_per_channel each channel maps to itself: "
                    f"channels_out={c_out} must equal x's C_in={c_in}"
                )
        if self.instructions is not None:
            if self.simplify_irreps_internally:
                raise ValueError("instructions need simplify_irreps_internally=False (as in e3nn-jax)")
            if self.channel_axis:
                raise ValueError("instructions cannot be combined with channel_axis (e3nn-jax: nor with channel_out)")
        if mode == "mixed":
            dtype = jnp.result_type(dtype, given.dtype)  # e3nn-jax computes in the promoted dtype
            x = x.astype(dtype)
            given = given.astype(dtype)
        if mode != "plain":
            batch = _broadcast_batch(x, given, "index" if mode == "indexed" else "weights", mode)
            x = jnp.broadcast_to(x, (*batch, *x.shape[-2:]))
            given = jnp.broadcast_to(given, batch if mode == "indexed" else (*batch, given.shape[-1]))

        # e3nn's blocks: (irrep, [rows of each copy in x]) and each block's multiplicity to e3nn
        blocks_in = _blocks(irreps_in, regroup=self.simplify_irreps_internally)
        blocks_out = _blocks(self._internal_out(), regroup=False)
        mul_in = [len(rows) * (1 if per_channel else c_in) for _, rows in blocks_in]
        mul_out = [len(rows) * (1 if per_channel else c_out) for _, rows in blocks_out]
        if self.instructions is None:
            pairs = [(i, j) for i, (a, _) in enumerate(blocks_in) for j, (b, _) in enumerate(blocks_out) if a == b]
        else:
            pairs = _check_instructions(self.instructions, blocks_in, blocks_out)

        # the parameters' leading axes, and e3nn's extra scale of the mixed weights
        if mode == "plain":
            lead, scale = (), 1.0
        elif mode == "indexed":
            lead, scale = (self.num_indexed_weights,), 1.0
        else:
            d = given.shape[-1]
            # jnp, as e3nn-jax computes it: the same rounding gives the same draws and products
            lead, scale = ((d, c_in) if per_channel else (d,)), jnp.sqrt(1 / d)

        def parameter(name, shape, std):
            # (a mutable params collection creates missing parameters, as flax's own layers do)
            if (
                not self.is_initializing()
                and not self.is_mutable_collection("params")
                and not self.has_variable("params", name)
            ):
                # flax would say only that the name is missing, which reads as a wrong checkpoint
                given = sorted(self.variables.get("params", {}))
                raise ValueError(
                    f"x ({irreps_in}, C_in={c_in}) is not the input these parameters were made for: "
                    f"no parameter {name!r} (they have {given}); apply the module to features of the "
                    "irreps and channel count it was initialized with"
                )
            if self.parameter_initializer is not None:
                init = self.parameter_initializer()
            else:
                init = nn.initializers.normal(std) if std is not None else nn.initializers.zeros
            return self.param(name, init, (*lead, *shape), dtype)

        # parameters first, in e3nn's order (flax draws each from the module's key in creation order)
        params = {}
        for i, j in pairs:
            fan = mul_in[i] ** path_norm * sum(mul_in[k] ** (1.0 - path_norm) for k, jj in pairs if jj == j)
            alpha = 1 / fan if fan > 0 else 1.0
            name = f"w[{i},{j}] {mul_in[i]}x{blocks_in[i][0]},{mul_out[j]}x{blocks_out[j][0]}"
            std = scale ** (1.0 - grad_norm) * math.sqrt(alpha) ** (1.0 - grad_norm)
            params[i, j] = (parameter(name, (mul_in[i], mul_out[j]), std), math.sqrt(alpha) ** grad_norm)
        # biases after the weights, as e3nn creates them (weight_std 0: zeros)
        biases = {}
        for j, (ir, _) in enumerate(blocks_out):
            if self.biases and ir.l == 0 and ir.p == 1:
                biases[j] = parameter(f"b[{j}] {mul_out[j]}x{ir}", (mul_out[j],), None)

        def per_element(w):
            """A parameter as each element's ``[..., *shape]``."""
            if mode == "plain":
                return w
            if mode == "indexed":
                return w[given]
            return scale**grad_norm * jnp.tensordot(given, w, axes=(-1, 0))

        lead_x = x.shape[:-2]
        # each input block's rows, a run of one split where they are consecutive (always, but for a
        # block whose copies are scattered among others by regrouping): a static index gathers
        # element by element on XLA's CPU, and its backward scatter-adds (value and gradient of a
        # 1-channel Linear 0.57-0.73x e3nn-jax's speed with gathers, 0.86-1.18x with slices)
        indices = [np.asarray(rows_in, np.int64).reshape(-1) for _, rows_in in blocks_in]
        runs = {
            i: (int(index[0]), int(index[0]) + index.size)
            for i, index in enumerate(indices)
            if index.size and np.array_equal(index, np.arange(index[0], index[0] + index.size))
        }
        cut = dict(zip(runs, take_runs(x, list(runs.values()), axis=-2)))
        rows = {}
        for i, (ir, rows_in) in enumerate(blocks_in):
            xi = cut[i] if i in runs else x[..., indices[i], :]
            rows[i] = xi.reshape(*lead_x, len(rows_in), ir.dim, c_in)
        outs = []
        for j, (ir, rows_out) in enumerate(blocks_out):
            k_out = len(rows_out)
            acc = jnp.zeros((*lead_x, k_out, ir.dim, c_out), dtype)
            for i in [i for i, jj in pairs if jj == j]:
                w, path_weight = params[i, j]
                rows_in = blocks_in[i][1]
                xi = rows[i]
                w = per_element(w)
                if per_channel:  # w [..., C, k_in, k_out]
                    y = jnp.einsum("...kdc,...ckm->...mdc", xi, w)
                else:
                    w = _copy_major(w, len(rows_in), c_in, k_out, c_out, self.channel_axis)
                    y = jnp.einsum("...kdc,...kcmo->...mdo", xi, w)
                acc = acc + path_weight * y
            if j in biases:
                b = per_element(biases[j])
                b_lead = b.shape[:-2] if per_channel else b.shape[:-1]
                if per_channel:  # [.., C, k_out] -> [.., k_out, C]
                    b = jnp.swapaxes(b, -1, -2)
                elif self.channel_axis:  # [.., C_out · k_out] channel-major -> [.., k_out, C_out]
                    b = jnp.swapaxes(b.reshape(*b_lead, c_out, k_out), -1, -2)
                acc = acc + b.reshape(*b_lead, k_out, 1, c_out)
            outs.append(acc.reshape(*lead_x, k_out * ir.dim, c_out))
        if not outs:
            return jnp.zeros((*lead_x, 0, c_out), dtype)
        return jnp.concatenate(outs, axis=-2)


def _read_call(weights_or_x, x, num_indexed_weights):
    """``(mode, index or weights or None, x)`` from ``lin(x)``, ``lin(index, x)``, ``lin(weights, x)``."""
    if x is None:
        if num_indexed_weights is not None:
            raise ValueError("this Linear has num_indexed_weights: call it as lin(index, x)")
        return "plain", None, weights_or_x
    given = weights_or_x
    if is_irreps_array(given):  # e3nn-jax takes scalar IrrepsArray weights
        if not all(ir.l == 0 and ir.p == 1 for _, ir in as_irreps(str(given.irreps), "weights.irreps")):
            raise ValueError(f"weights given as an IrrepsArray must be scalars (0e), got {given.irreps}")
        given = given.array
    float_or_int = None
    try:
        dtype = jnp.result_type(given)
    except TypeError:
        dtype = None
    if dtype is not None and jnp.issubdtype(dtype, jnp.integer):
        float_or_int = "int"
    elif dtype is not None and jnp.issubdtype(dtype, jnp.floating):
        float_or_int = "float"
    if num_indexed_weights is not None:
        if float_or_int != "int":
            raise TypeError(f"index must be an integer array (num_indexed_weights is set), got {_describe(given)}")
        index = jnp.asarray(given)
        # a host index outside is refused: JAX's indexing would give it the last row's weights
        s = num_indexed_weights
        check_host_index("index", index, -s, s, f"num_indexed_weights={s}; a negative one counts from the end")
        return "indexed", index, x
    if float_or_int == "int":
        raise ValueError("lin(index, x) needs num_indexed_weights; call lin(x), or lin(weights, x) with float weights")
    if float_or_int != "float":
        raise TypeError(f"weights must be a floating-point array [..., d], got {_describe(given)}")
    check_rank("weights", given, tuple(range(1, 10)), "[..., d]")
    if jnp.shape(given)[-1] == 0:
        raise ValueError(f"weights must have a last axis d > 0, got shape {jnp.shape(given)}")
    return "mixed", jnp.asarray(given), x


def _describe(a) -> str:
    dtype = getattr(a, "dtype", None)
    return f"dtype {dtype}" if dtype is not None else type(a).__name__


def _broadcast_batch(x, given, name: str, mode: str) -> tuple[int, ...]:
    """x's batch ``[...]`` broadcast with the index's shape or the weights' ``[...]``, as e3nn-jax does."""
    other = given.shape if mode == "indexed" else given.shape[:-1]
    try:
        return jnp.broadcast_shapes(x.shape[:-2], other)
    except ValueError:
        what = "" if mode == "indexed" else "[..., d] "
        raise ValueError(
            f"{name} {what}must broadcast with x's batch [{', '.join(map(str, x.shape[:-2]))}], got {given.shape}"
        ) from None


def _check_instructions(instructions, blocks_in, blocks_out) -> list[tuple[int, int]]:
    """``instructions`` as ``(i_in, i_out)`` pairs of equal irreps. e3nn-jax does not check the
    irreps: a pair of equal dimensions and different parities would be silently non-equivariant."""
    if isinstance(instructions, (str, bytes)) or not isinstance(instructions, Sequence):
        raise TypeError(f"instructions must be a list of (i_in, i_out) pairs, got {instructions!r}")
    pairs = []
    for ins in instructions:
        if (
            not isinstance(ins, Sequence)
            or len(ins) != 2
            or not all(isinstance(k, numbers.Integral) and not isinstance(k, bool) for k in ins)
        ):
            raise TypeError(f"instructions must be (i_in, i_out) pairs of ints, got {ins!r}")
        i, j = int(ins[0]), int(ins[1])
        if not 0 <= i < len(blocks_in) or not 0 <= j < len(blocks_out):
            raise ValueError(
                f"instruction {(i, j)} is out of range: irreps_in has {len(blocks_in)} blocks, "
                f"the output irreps {len(blocks_out)} (after dropping the irreps the input lacks, as e3nn-jax)"
            )
        if blocks_in[i][0] != blocks_out[j][0]:
            raise ValueError(
                f"instruction {(i, j)} connects {blocks_in[i][0]} to {blocks_out[j][0]}: the irreps must be equal"
            )
        pairs.append((i, j))
    return pairs


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


def _blocks(irreps: Irreps, *, regroup: bool):
    """``[(irrep, [rows of each copy])]``; regrouped as e3nn's ``remove_zero_chunks().regroup()``."""
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


def _irreps_array_hint(x, irreps_in: Irreps) -> str:
    """How an e3nn ``IrrepsArray`` given as ``x`` becomes e3j's ``[..., D_in, C_in]``."""
    given, irreps_in = as_irreps(x.irreps, "x.irreps").simplify(), irreps_in.simplify()  # the same layouts
    if given == irreps_in:
        return " (e3j's layout: here x.array[..., None], one channel)"
    channels = given.dim // irreps_in.dim if irreps_in.dim and given.dim % irreps_in.dim == 0 else 0
    if channels and irreps_in * channels == given:
        return f" (e3j's layout: here e3j.from_mul_ir(x.array, {str(irreps_in)!r}, {channels}), {channels} channels)"
    return (
        f" (e3j's layout: C copies of irreps_in; x's irreps are not {irreps_in} times a channel count: "
        "e3j.from_mul_ir(x.array, irreps_in, C) reads e3nn's array of C x irreps_in)"
    )
