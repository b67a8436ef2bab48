"""e3nn-jax's scalar MLP (the radial network of NequIP and MACE), able to return its output factored."""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import jax.scipy.special as jsp

from .._checks import check_bool, check_positive_int, check_rank, float_dtype, is_irreps_array
from ..factored import FactoredWeights
from .linear import parse_normalization

__all__ = ["MultiLayerPerceptron"]


class MultiLayerPerceptron(nn.Module):
    """``e3nn_jax.flax.MultiLayerPerceptron``: same fields, parameters (names, shapes, initialization) and math.

    ``list_neurons``: the width of each layer; ``act``: the activation, normalized as e3nn-jax does
    (divided by its root mean square under a standard normal input); ``gradient_normalization``:
    ``"path"`` (e3nn-jax's default, also for ``None``: e3nn-jax's global ``e3nn.config`` is not
    read), ``"element"`` or a float (0 is ``"element"``, 1 ``"path"``);
    ``output_activation``: ``True`` (``act``), ``False`` or a callable; ``with_bias``.
    Input ``[..., F]`` (a plain array, or an e3nn ``IrrepsArray`` of scalars, returned as one).

    ``factored=True`` (needs no output activation and an input ``[E, F]``, one row per edge) returns the output as
    :class:`e3j.FactoredWeights` ``hidden @ kernel (+ bias)`` instead of the ``[..., W]`` array:
    given to :class:`e3j.interop.MessagePassing` (or :class:`e3j.MulIrConvolution`) as its
    weights, the reordering of e3nn's weight axis into e3j's groups is applied to the kernel's
    columns instead of to every edge's weights. Swapping ``e3nn.flax.MultiLayerPerceptron(...)``
    for ``MultiLayerPerceptron(..., factored=True)`` keeps the parameter tree.

    >>> import jax, jax.numpy as jnp
    >>> mlp = MultiLayerPerceptron((16, 8), jax.nn.silu, output_activation=False, factored=True)
    >>> w, params = mlp.init_with_output(jax.random.key(0), jnp.ones((5, 4)))
    >>> jax.tree.map(jnp.shape, params["params"]), w.shape
    ({'Dense_0': {'kernel': (4, 16)}, 'Dense_1': {'kernel': (16, 8)}}, (5, 8))
    """

    list_neurons: tuple[int, ...]
    act: Callable | None = None
    gradient_normalization: str | float | None = None
    output_activation: Callable | bool = True
    with_bias: bool = False
    factored: bool = False

    @nn.compact
    def __call__(self, x):
        if not isinstance(self.list_neurons, (tuple, list)):
            raise TypeError(f"list_neurons must be a tuple of layer widths, got {self.list_neurons!r}")
        if len(self.list_neurons) == 0:
            raise ValueError("list_neurons must name at least one layer")
        check_bool("with_bias", self.with_bias)
        check_bool("factored", self.factored)
        if self.act is not None and not callable(self.act):
            raise TypeError(f"act must be a callable (e.g. jax.nn.silu) or None, got {self.act!r}")
        for n in self.list_neurons:
            check_positive_int("list_neurons", n, f" per layer (its width): {tuple(self.list_neurons)}")
        last_act = self.act if self.output_activation is True else self.output_activation or None
        if self.output_activation is not True and self.output_activation is not False:
            if not callable(self.output_activation):
                raise TypeError(f"output_activation must be a bool or a callable, got {self.output_activation!r}")
        if self.factored and last_act is not None:
            raise ValueError("factored=True needs a linear last layer: output_activation=False (or act=None)")
        gn = parse_normalization(self.gradient_normalization, "gradient_normalization", "path")

        irreps_array = is_irreps_array(x)
        if irreps_array:
            if not x.irreps.is_scalar():
                raise ValueError(f"x: the MLP takes scalars (0e) only, got irreps {x.irreps}")
            wrap, x = type(x), x.array
        if self.factored:  # FactoredWeights' hidden holds one row per edge
            check_rank("x", x, (2,), "[E, features] with factored=True (one row per edge)")
        check_rank("x", x, tuple(range(1, 33)), "[..., features]")
        float_dtype("x", x)
        _check_width(self, x)
        act = None if self.act is None else _normalize(self.act)
        last_act = None if last_act is None else _normalize(last_act)

        for i, features in enumerate(self.list_neurons):
            alpha = 1 / x.shape[-1]
            scale = jnp.sqrt(alpha) ** gn
            kernel_init = nn.initializers.normal(stddev=jnp.sqrt(alpha) ** (1.0 - gn))
            if self.factored and i == len(self.list_neurons) - 1:
                kernel, bias = _LastDense(features, self.with_bias, kernel_init, x.dtype, name=f"Dense_{i}")(x)
                return FactoredWeights(scale * x, kernel, None if bias is None else scale * bias)
            dense = nn.Dense(
                features=features,
                use_bias=self.with_bias,
                kernel_init=kernel_init,
                bias_init=nn.initializers.zeros,
                param_dtype=x.dtype,
            )
            x = scale * dense(x)
            a = act if i < len(self.list_neurons) - 1 else last_act
            if a is not None:
                x = a(x)
        return wrap(f"{x.shape[-1]}x0e", x) if irreps_array else x


def _check_width(mlp: MultiLayerPerceptron, x) -> None:
    """Features of another width than the parameters were made for named as ``x`` (flax would say
    its initializer "expected to generate shape" ... for ``Dense_0``'s kernel)."""
    kernel = mlp.variables.get("params", {}).get("Dense_0", {}).get("kernel")
    if kernel is not None and (width := jnp.shape(nn.meta.unbox(kernel))[0]) != x.shape[-1]:
        raise ValueError(
            f"x has {x.shape[-1]} features (last axis) but the parameters were made for {width} "
            f"(Dense_0's kernel is {jnp.shape(nn.meta.unbox(kernel))})"
        )


class _LastDense(nn.Module):
    """The parameters of ``flax.linen.Dense`` (same names, shapes, initialization), not applied."""

    features: int
    use_bias: bool
    kernel_init: Callable
    param_dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype) if self.use_bias else None
        return kernel, bias


def _normalize(phi: Callable) -> Callable:
    """``phi / c`` with ``c² = E[phi(z)²]``, z standard normal: e3nn-jax's ``normalize_function``,
    evaluated the same way (a million normal quantiles) so that the constant is the same number."""
    with jax.ensure_compile_time_eval():
        z = jnp.sqrt(2) * jsp.erfinv(jnp.linspace(-1.0, 1.0, 1_000_001 + 2)[1:-1])
        c = (jnp.mean(phi(z) ** 2) ** 0.5).item()
        unit = bool(jnp.allclose(c, 1.0))
    if unit:
        return phi
    return lambda x: phi(x) / c
