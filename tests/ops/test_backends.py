"""Backend discovery, selection policy, overrides and per-platform fallback, and ``python -m e3j info``.

The test plugin ``tests/plugins/e3j-test-backend`` (installed by the nox ``tests`` session) provides:
``test`` (CPU, priority 100, the reference kernels counting their calls in
``e3j_test_backend.calls``), ``incompatible`` (wrong COO format), ``old_jax`` (wrong JAX range),
``load_fails`` (its ``load()`` raises), ``not_a_backend`` (not a descriptor) and ``broken`` (its
module raises on import), ``as_mapping`` (a plain-mapping descriptor, ``auto=False``) and
``bad_mapping`` (a mapping with an unknown field).

Real kernel packages (e3j-pallas-gpu, ...) may be installed in the same environment; the policy
tests here hide them (:func:`_only_test_plugins`) so that the outcome depends on the test plugin
alone. Their own selection is tested with the packages.

Selection happens at lowering time, and JAX caches lowerings by shape: every check below lowers
a fresh ``jit`` at a channel count no other check uses (:func:`fresh`).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys
import warnings

import e3j_test_backend as plugin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import e3j
from e3j import backends
from e3j.__main__ import main
from e3j.backends import BackendError, OpRequest, select_backend

ENV = "E3J_BACKEND"  # the documented name
_channels = itertools.count(101)


def fresh() -> int:
    """A channel count no other lowering in this module has used."""
    return next(_channels)


_REAL_DISCOVERED = backends._discovered
PLUGIN_BACKENDS = {"reference", "test", "incompatible", "old_jax", "load_fails", "as_mapping"}


@pytest.fixture(autouse=True)
def _only_test_plugins(monkeypatch):
    found, errors = backends._discovered()
    kept = tuple(b for b in found if b.name in PLUGIN_BACKENDS)
    monkeypatch.setattr(backends, "_discovered", lambda: (kept, errors))


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    backends._warned.clear()
    plugin.calls.clear()
    yield
    backends._warned.clear()
    plugin.calls.clear()


TP = e3j.TensorProduct("0e + 1o", "0e + 1o")
CONV = e3j.Convolution("0e + 1o", "0e + 1o", filter="0e + 1o")
GRAPH = e3j.Graph.from_edges(np.array([0, 1, 2, 1]), np.array([1, 0, 1, 2]), num_nodes=3)


def tp_args(c: int, dtype=np.float32):
    rng = np.random.default_rng(c)
    return jnp.asarray(rng.normal(size=(3, 4, c)), dtype), jnp.asarray(rng.normal(size=(3, 4)), dtype)


def conv_args(c: int, dtype=np.float32):
    rng = np.random.default_rng(c)
    x = jnp.asarray(rng.normal(size=(3, 4, c)), dtype)
    y = jnp.asarray(rng.normal(size=(4, 4)), dtype)
    s = jnp.asarray(rng.normal(size=(4, CONV.num_paths, c)), dtype)
    return x, y, s, GRAPH


def _abstract(args):
    return [jax.ShapeDtypeStruct(a.shape, a.dtype) if isinstance(a, jax.Array) else a for a in args]


def lower_tp(platform: str = "cpu", backend: str | None = None):
    args = _abstract(tp_args(fresh()))
    return jax.jit(lambda x, y: TP(x, y, backend=backend)).trace(*args).lower(lowering_platforms=(platform,))


def lower_conv(platform: str = "cpu", backend: str | None = None):
    x, y, s, graph = _abstract(conv_args(fresh()))
    fn = jax.jit(lambda x, y, s: CONV(x, y, s, graph, backend=backend))
    return fn.trace(x, y, s).lower(lowering_platforms=(platform,))


LOWER = {"tensor_product": lower_tp, "convolution": lower_conv}


# -- discovery ------------------------------------------------------------------------------------


def test_discovery_finds_the_plugin_backends():
    names = [b.name for b in e3j.available_backends()]
    assert names[0] == "reference"
    assert {"reference", "test", "incompatible", "old_jax", "load_fails"} <= set(names)
    assert "broken" not in names and "not_a_backend" not in names
    test = backends.get_backend("test")
    assert (test.platforms, test.priority, test.version) == (("cpu",), 100, plugin.__version__)
    assert test.incompatibility() is None


def test_broken_plugins_are_reported_not_raised():
    errors = dict(backends.discovery_errors())
    broken = next(v for k, v in errors.items() if k.startswith("broken ("))
    assert "ImportError" in broken and "libe3j_missing" in broken
    wrong = next(v for k, v in errors.items() if k.startswith("not_a_backend ("))
    assert "TypeError" in wrong and "expected an e3j.backends.Backend" in wrong
    # the entry point text names where it points
    assert any("e3j_test_backend._broken:backend" in k for k in errors)


def test_mapping_descriptors_and_explicit_only_backends():
    b = backends.get_backend("as_mapping")
    assert b.platforms == ("cpu",) and b.priority == 500 and not b.auto
    errors = dict(backends.discovery_errors())
    bad = next(v for k, v in errors.items() if k.startswith("bad_mapping ("))
    assert "unknown backend descriptor field(s) ['speed']" in bad
    # priority 500 beats the test backend's 100, but auto=False keeps it out of automatic selection
    for op in backends.OPS:
        assert select_backend(OpRequest(op, "cpu", "float32", 64, 3), None).name == "test"
        assert select_backend(OpRequest(op, "cpu", "float32", 64, 3), "as_mapping").name == "as_mapping"
    # by name it runs (its load() returned a mapping of kernels) and gives the reference's numbers
    tp = e3j.TensorProduct("0e + 1o", "1o")
    x, y = jnp.ones((2, 4, 3)), jnp.ones((2, 3))
    np.testing.assert_allclose(tp(x, y, backend="as_mapping"), tp(x, y, backend="reference"), rtol=1e-12)
    assert isinstance(backends.kernels_of(b), e3j.Kernels)


def test_rediscovery_after_cache_clear_is_identical():
    before = _REAL_DISCOVERED()
    _REAL_DISCOVERED.cache_clear()
    after = _REAL_DISCOVERED()
    assert before == after


def test_incompatible_backends_say_why():
    coo = backends.get_backend("incompatible").incompatibility()
    assert coo is not None and "COO format" in coo and str(e3j.backends.COO_FORMAT_VERSION) in coo
    old = backends.get_backend("old_jax").incompatibility()
    assert old is not None and ">=0.4,<0.5" in old and jax.__version__ in old
    assert backends.describe(backends.get_backend("incompatible"))["compatible"] == coo
    assert backends.describe(backends.get_backend("test"))["compatible"] == "yes"


# -- automatic selection --------------------------------------------------------------------------


@pytest.mark.parametrize("op", backends.OPS)
def test_priority_selects_the_test_backend_on_cpu(op):
    # incompatible/old_jax (priority 1000) are rejected, load_fails (200) fails to load, test (100) wins
    assert select_backend(OpRequest(op, "cpu", "float32", 64, 3), None).name == "test"
    assert select_backend(OpRequest(op, "cpu", "float64", 7, 1), None).name == "test"
    # a dtype no plugin supports: the reference, silently on CPU
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert select_backend(OpRequest(op, "cpu", "float16", 64, 3), None).name == "reference"


def test_tensor_product_runs_the_selected_kernels_with_reference_numbers():
    c = fresh()
    x, y = tp_args(c, np.float64)
    out = jax.jit(lambda x, y: TP(x, y))(x, y)
    assert plugin.calls == ["tensor_product"]
    ref = jax.jit(lambda x, y: TP(x, y, backend="reference"))(x, y)
    assert plugin.calls == ["tensor_product"]
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


def test_convolution_runs_the_selected_kernels_with_reference_numbers():
    args = conv_args(fresh(), np.float64)
    out = jax.jit(lambda *a: CONV(*a))(*args)
    assert plugin.calls == ["convolution"]
    ref = jax.jit(lambda *a: CONV(*a, backend="reference"))(*args)
    assert plugin.calls == ["convolution"]
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


def test_backward_kernels_are_selected_too():
    x, y = tp_args(fresh(), np.float64)
    jax.jit(jax.grad(lambda x, y: TP(x, y).sum(), argnums=(0, 1)))(x, y)
    assert "tensor_product_bwd" in plugin.calls
    args = conv_args(fresh(), np.float64)
    plugin.calls.clear()
    jax.jit(jax.grad(lambda x, y, s, g: CONV(x, y, s, g).sum(), argnums=(0, 1, 2)))(*args)
    assert "convolution_bwd" in plugin.calls


# -- overrides ------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", backends.OPS)
def test_backend_argument_overrides_priority(op):
    LOWER[op](backend="reference")
    assert plugin.calls == []
    LOWER[op]()
    assert plugin.calls == [op]


@pytest.mark.parametrize("op", backends.OPS)
def test_use_backend_overrides_priority(op):
    with e3j.use_backend("reference"):
        LOWER[op]()
    assert plugin.calls == []
    with e3j.use_backend("reference"), e3j.use_backend(None):  # None: back to automatic
        LOWER[op]()
    assert plugin.calls == [op]


def test_use_backend_is_recorded_at_call_time_and_resolved_at_lowering():
    args = _abstract(tp_args(fresh()))
    with e3j.use_backend("reference"):
        traced = jax.jit(lambda x, y: TP(x, y)).trace(*args)
    traced.lower()  # outside the block: still the reference
    assert plugin.calls == []


def test_backend_argument_beats_use_backend():
    with e3j.use_backend("reference"):
        lower_tp(backend="test")
    assert plugin.calls == ["tensor_product"]


@pytest.mark.parametrize("op", backends.OPS)
def test_env_var_overrides_priority(op, monkeypatch):
    monkeypatch.setenv(ENV, "reference")
    LOWER[op]()
    assert plugin.calls == []
    monkeypatch.setenv(ENV, "test")
    LOWER[op]()
    assert plugin.calls == [op]


def test_eager_call_reads_env_var_at_lowering(monkeypatch):
    monkeypatch.setenv(ENV, "reference")
    TP(*tp_args(fresh()))
    assert plugin.calls == []
    monkeypatch.delenv(ENV)
    TP(*tp_args(fresh()))  # a new shape: a new lowering
    assert plugin.calls == ["tensor_product"]


def test_eager_call_of_one_shape_follows_a_changed_env_var(monkeypatch):
    """The eager programs are cached per static setting: one of the same shapes, made after
    ``E3J_BACKEND`` changed, lowers again instead of running the backend chosen before."""
    args = tp_args(fresh())
    monkeypatch.setenv(ENV, "reference")
    want = TP(*args)
    assert plugin.calls == []
    monkeypatch.delenv(ENV)
    got = TP(*args)
    assert plugin.calls == ["tensor_product"]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    monkeypatch.setenv(ENV, "reference")
    TP(*args)
    assert plugin.calls == ["tensor_product"]  # the reference's program, from the cache


def test_use_backend_beats_env_var(monkeypatch):
    monkeypatch.setenv(ENV, "reference")
    with e3j.use_backend("test"):
        lower_tp()
    assert plugin.calls == ["tensor_product"]


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ("incompatible", "COO format"),
        ("old_jax", "needs jax>=0.4,<0.5"),
        ("no_such_backend", "unknown e3j backend 'no_such_backend'"),
        ("load_fails", "failed to load: RuntimeError: simulated kernel load failure"),
    ],
)
def test_unusable_env_var_warns_and_falls_back_to_automatic(env, reason, monkeypatch):
    monkeypatch.setenv(ENV, env)
    expected = rf"{ENV}={env} is not used for tensor_product on cpu: .*{reason}"
    with pytest.warns(RuntimeWarning, match=expected):
        lower_tp()
    assert plugin.calls == ["tensor_product"]  # automatic selection still picks the test backend


# -- explicit requests that cannot be honoured -----------------------------------------------------


def test_unknown_backend_names_raise():
    with pytest.raises(BackendError, match=r"unknown e3j backend 'nope'.*installed: reference"):
        TP(*tp_args(3), backend="nope")
    with pytest.raises(BackendError, match="unknown e3j backend 'nope'"):
        CONV(*conv_args(3), backend="nope")
    with pytest.raises(BackendError, match="unknown e3j backend 'nope'"), e3j.use_backend("nope"):
        pass
    with pytest.raises(BackendError, match="unknown e3j backend 'broken'"):  # failed to load: not installed
        backends.get_backend("broken")
    assert issubclass(BackendError, ValueError)


@pytest.mark.parametrize("op", backends.OPS)
@pytest.mark.parametrize(
    ("name", "reason"),
    [("incompatible", "it reads COO format"), ("old_jax", "it needs jax>=0.4,<0.5")],
)
def test_explicit_incompatible_backend_raises_with_reason(op, name, reason):
    with pytest.raises(BackendError, match=rf"backend '{name}' cannot run {op} on cpu: {reason}"):
        LOWER[op](backend=name)
    with pytest.raises(BackendError, match=rf"backend '{name}' cannot run {op} on cpu: {reason}"):
        with e3j.use_backend(name):
            LOWER[op]()


def test_explicit_incompatible_backend_raises_eagerly():
    with pytest.raises(BackendError, match="'incompatible' cannot run tensor_product on cpu: it reads COO"):
        TP(*tp_args(fresh()), backend="incompatible")


def test_explicit_backend_that_fails_to_load_raises():
    with pytest.raises(BackendError, match="backend 'load_fails' failed to load: RuntimeError: simulated"):
        lower_conv(backend="load_fails")


def test_explicit_backend_with_unsupported_dtype_raises():
    req = OpRequest("tensor_product", "cpu", "float16", 8, 1)
    with pytest.raises(BackendError, match="supports float32/float64, not float16"):
        select_backend(req, "test")


def test_reference_named_runs_what_the_fallback_runs():
    # a 16-bit model on the default selection runs on the reference; naming it must not refuse it
    x, y = tp_args(fresh())
    for dtype in (jnp.bfloat16, jnp.float16):
        want = TP(x.astype(dtype), y.astype(dtype))
        got = TP(x.astype(dtype), y.astype(dtype), backend="reference")
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)


def test_op_request_channels_must_be_an_int():
    assert OpRequest("convolution", "cpu", "float32", np.int64(8), 1).channels == 8
    for bad in (None, 8.0, "8", True):
        with pytest.raises(TypeError, match=r"the channel axis C of an operand must be an int, got"):
            OpRequest("convolution", "cpu", "float32", bad, 1)


def test_what_the_reference_refuses_by_name_the_fallback_refuses_too():
    # float8 ran on the default selection's fallback while backend="reference" refused it
    x, y = tp_args(fresh())
    x8, y8 = x.astype(jnp.float8_e4m3fn), y.astype(jnp.float8_e4m3fn)
    with pytest.raises(BackendError, match="supports bfloat16/float16/float32/float64, not float8_e4m3fn"):
        TP(x8, y8, backend="reference")
    message = r"no backend can run tensor_product on cpu: .*test: it supports float32/float64, not float8_e4m3fn.*; "
    with pytest.raises(BackendError, match=message + r"reference: it supports bfloat16/float16/float32/float64, not f"):
        TP(x8, y8)
    req = OpRequest("convolution", "cuda", "float8_e5m2", 8, 1)
    with pytest.raises(BackendError, match=r"no backend can run convolution on cuda: .*reference: it supports"):
        select_backend(req, None)


# -- lowering for other platforms (on a CPU machine) -----------------------------------------------


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
@pytest.mark.parametrize("op", backends.OPS)
def test_accelerator_lowering_falls_back_to_reference_and_warns_once(op, platform):
    with pytest.warns(RuntimeWarning) as record:
        lowered = LOWER[op](platform)
    assert "stablehlo" in lowered.as_text()[:2000] or "func.func" in lowered.as_text()
    messages = [str(w.message) for w in record if "falls back" in str(w.message)]
    assert len(messages) == 1, messages
    (msg,) = messages
    assert f"e3j {op} on {platform} falls back to the pure-JAX reference backend" in msg
    assert f"test: it runs on cpu, not {platform}" in msg  # why each installed backend was not used
    assert "incompatible: it reads COO format" in msg
    assert plugin.calls == []
    with warnings.catch_warnings():  # once only: a second lowering is silent
        warnings.simplefilter("error")
        LOWER[op](platform)


def test_accelerator_fallback_warns_again_per_op_and_platform():
    with pytest.warns(RuntimeWarning, match="tensor_product on cuda falls back"):
        lower_tp("cuda")
    with pytest.warns(RuntimeWarning, match="convolution on cuda falls back"):
        lower_conv("cuda")
    with pytest.warns(RuntimeWarning, match="tensor_product on tpu falls back"):
        lower_tp("tpu")


def test_accelerator_lowering_with_reference_requested_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lower_tp("cuda", backend="reference")
        lower_conv("tpu", backend="reference")


@pytest.mark.parametrize("op", backends.OPS)
def test_cpu_only_backend_requested_for_cuda_raises(op):
    with pytest.raises(BackendError, match=rf"backend 'test' cannot run {op} on cuda: it runs on cpu, not cuda"):
        LOWER[op]("cuda", backend="test")


def test_multi_platform_lowering_selects_per_platform():
    with pytest.warns(RuntimeWarning, match="tensor_product on cuda falls back"):
        args = _abstract(tp_args(fresh()))
        jax.jit(lambda x, y: TP(x, y)).trace(*args).lower(lowering_platforms=("cpu", "cuda"))
    assert plugin.calls == ["tensor_product"]  # the cpu lowering used the test backend


# -- yields: a backend giving an op to a faster one below a channel count --------------------------


def _synthetic(name: str, priority: int, record: list | None = None, **fields) -> backends.Backend:
    """A backend running the reference kernels under another name (selection tests only); with
    ``record``, its grouped kernels append the backend's name to it when traced."""

    def load():
        kernels = backends._load_reference()
        if record is None:
            return kernels

        def wrap(fn):
            def run(*args, **kwargs):
                record.append(name)
                return fn(*args, **kwargs)

            return run

        return dataclasses.replace(
            kernels,
            grouped_convolution=wrap(kernels.grouped_convolution),
            grouped_convolution_bwd=wrap(kernels.grouped_convolution_bwd),
        )

    return backends.Backend(name=name, version="0", platforms=("cpu",), load=load, priority=priority, **fields)


def _install(monkeypatch, *extra: backends.Backend) -> None:
    """The test plugins and ``extra`` (replacing any installed before)."""
    found, errors = backends._discovered()
    kept = tuple(b for b in found if b.name in PLUGIN_BACKENDS)
    monkeypatch.setattr(backends, "_discovered", lambda: ((*kept, *extra), errors))


def conv_req(c: int, dtype: str = "float32") -> OpRequest:
    return OpRequest("convolution", "cpu", dtype, c, 3)


def test_a_backend_yields_an_op_below_a_channel_count(monkeypatch):
    # `wide` (300) yields convolutions below 128 channels to `narrow_fast` (200); `middle` (250), above
    # narrow_fast in priority, must not take them (it is not the one measured faster there)
    wide = _synthetic("wide", 300, yields=(("convolution", 128, "narrow_fast"),))
    _install(monkeypatch, wide, _synthetic("narrow_fast", 200), _synthetic("middle", 250))
    assert select_backend(conv_req(127), None).name == "narrow_fast"
    assert select_backend(conv_req(128), None).name == "wide"
    # only the op named: the tensor product stays on it at any channel count
    assert select_backend(OpRequest("tensor_product", "cpu", "float32", 8, 3), None).name == "wide"
    # by name, and through E3J_BACKEND, it runs below the count too
    assert select_backend(conv_req(8), "wide").name == "wide"
    assert wide.unsupported(conv_req(8)) is None and "below 128 channels narrow_fast" in wide.passed_over(conv_req(8))
    monkeypatch.setenv(ENV, "wide")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert select_backend(conv_req(8), None).name == "wide"


def test_a_backend_keeps_what_the_other_cannot_run(monkeypatch):
    # the one yielded to runs no float16 / fails to load / is not installed: the yielding one runs it,
    # not the reference and not a third backend of lower priority
    cases = [
        (_synthetic("fast_f32", 200), "float16"),
        (_synthetic("fast_broken", 200), "float32"),
        (None, "float32"),
    ]
    for target, dtype in cases:
        name = target.name if target is not None else "not_installed"
        wide = _synthetic(f"wide_{name}", 300, yields=(("convolution", 128, name),), dtypes=("float16", "float32"))
        extra = [wide, _synthetic(f"middle_{name}", 250)]
        if target is not None:
            if name == "fast_broken":
                target = dataclasses.replace(target, load=lambda: 1 / 0)
            extra.append(target)
        _install(monkeypatch, *extra)
        assert select_backend(conv_req(8, dtype), None).name == f"wide_{name}", name
        assert wide.passed_over(conv_req(8, dtype)) is None


def test_backends_yielding_to_each_other_are_not_both_passed_over(monkeypatch):
    a = _synthetic("a", 300, yields=(("convolution", 128, "b"),))
    b = _synthetic("b", 200, yields=(("convolution", 128, "a"),))
    _install(monkeypatch, a, b)
    assert select_backend(conv_req(8), None).name == "a"


def test_info_says_why_a_backend_is_passed_over(monkeypatch, capsys):
    from e3j.__main__ import _passed_over

    _install(monkeypatch, _synthetic("wide", 300, yields={"convolution": (128, "test")}))
    passed = dict(_passed_over(conv_req(64), "test"))
    assert "below 128 channels test runs convolution" in passed["wide"]
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    block = out.split("  wide 0\n", 1)[1].split("compatible:", 1)[0]  # its descriptor's lines
    assert "    yields:        convolution below 128 channels to test when it can run it\n" in block
    assert "yields:" not in out.split("  test ", 1)[1].split("compatible:", 1)[0]


def test_info_says_a_backend_that_fails_to_load_is_passed_over(capsys):
    # the test plugin's load_fails (cpu, priority 200) outranks the chosen test (100): selection
    # skips it for its failed load, as for a kernel package whose shared library is missing
    assert main(["info"]) == 0
    selected = capsys.readouterr().out.split("Selected backend", 1)[1]
    assert (
        "load_fails not used: backend 'load_fails' failed to load: RuntimeError: simulated kernel load failure"
        in selected
    )


def test_info_says_the_environment_chose_a_lower_backend(monkeypatch, capsys):
    # E3J_BACKEND, not a failed load, is why the higher-priority backends were not used
    monkeypatch.setenv("E3J_BACKEND", "reference")
    assert main(["info"]) == 0
    selected = capsys.readouterr().out.split("Selected backend", 1)[1]
    assert "test not used: E3J_BACKEND=reference chose reference" in selected
    assert "load_fails not used: E3J_BACKEND=reference chose reference" in selected
    assert "failed to load" not in selected


def test_yields_are_validated():
    base = {"name": "m", "version": "0", "platforms": ["cpu"], "load": backends._load_reference}
    b = backends.Backend.from_mapping({**base, "yields": {"convolution": (128, "pallas_gpu")}})
    again = backends.Backend.from_mapping({**base, "yields": {"convolution": (128, "pallas_gpu")}})
    assert b.yields == (("convolution", 128, "pallas_gpu"),) and b == again and hash(b) == hash(again)
    assert backends.Backend(**{**base, "platforms": ("cpu",), "yields": [("convolution", 64, "x")]}).yields == (
        ("convolution", 64, "x"),
    )
    for bad in ({"conv": (128, "x")}, {"convolution": (0, "x")}, {"convolution": (True, "x")},
                {"convolution": 128}, {"convolution": (128, "m")}, {"convolution": ("128", "x")}):  # fmt: skip
        with pytest.raises(TypeError, match="yields"):
            backends.Backend.from_mapping({**base, "yields": bad})


def test_declared_kernels_are_validated_and_answer_without_loading():
    def never():
        raise AssertionError("routing on declared kernels must not load them")

    base = {"name": "m", "version": "0", "platforms": ["cpu"], "load": never}
    b = backends.Backend.from_mapping({**base, "kernels": ["convolution", "convolution_bwd"]})
    assert b.kernels == ("convolution", "convolution_bwd")
    assert backends.provides(b, "convolution") and not backends.provides(b, "convolution_factored")
    with pytest.raises(TypeError, match=r"kernels names unknown kernel\(s\) \['conv'\]"):
        backends.Backend.from_mapping({**base, "kernels": ["conv"]})
    # load() must provide what the descriptor declares
    ref = backends.get_backend("reference")
    assert backends.provides(ref, "grouped_convolution_factored")
    wrong = dataclasses.replace(ref, name="declares_too_little", kernels=("convolution", "convolution_bwd"))
    found, errors = backends._discovered()
    backends._kernels.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(backends, "_discovered", lambda: ((*found, wrong), errors))
            with pytest.raises(BackendError, match="its descriptor declares kernels="):
                backends.kernels_of(wrong)
    finally:
        backends._kernels.cache_clear()


def test_a_declared_route_stays_valid_when_its_backend_fails_to_load(monkeypatch):
    """The trace trusts a descriptor's declared kernels (here: factored ones) without loading them;
    lowering then skips the backend, whose kernels fail to load, for one without factored kernels,
    and the factored primitive multiplies the weights out: padding edges' rows of hidden must not
    reach that product (they may be NaN)."""

    def fails():
        raise RuntimeError("simulated missing shared library")

    found, errors = backends._discovered()
    declared = dataclasses.replace(backends.get_backend("reference"), name="declares", priority=300, load=fails)
    monkeypatch.setattr(backends, "_discovered", lambda: ((*found, declared), errors))
    req = OpRequest("convolution", "cpu", "float64", 2, 1)
    assert select_backend(req, None, warn=False, load=False).name == "declares"
    assert select_backend(req, None, warn=False).name == "test"
    conv = e3j.Convolution("0e + 1o", "0e + 1o", filter="0e + 1o")
    rng = np.random.default_rng(0)
    mask = np.array([1, 1, 0, 1, 1, 0], bool)
    graph = e3j.Graph.from_edges(rng.integers(0, 4, 6), rng.integers(0, 4, 6), 4, edge_mask=mask)
    x, y = jnp.asarray(rng.normal(size=(4, 4, 2))), jnp.asarray(rng.normal(size=(6, 4)))
    k, h = jnp.asarray(rng.normal(size=(3, conv.num_paths * 2))), rng.normal(size=(6, 3))

    def dk(h):
        return jax.grad(lambda k: jnp.sum(conv(x, y, e3j.FactoredWeights(jnp.asarray(h), k), graph) ** 2))(k)

    want = dk(np.where(mask[:, None], h, 0.0))
    np.testing.assert_allclose(dk(np.where(mask[:, None], h, np.nan)), want, rtol=1e-12, atol=1e-14)


def test_shipped_descriptors_declare_what_they_load(monkeypatch):
    monkeypatch.setattr(backends, "_discovered", _REAL_DISCOVERED)
    for b in _REAL_DISCOVERED()[0]:
        if b.name in PLUGIN_BACKENDS - {"reference"} or "cpu" not in b.platforms:
            continue  # the plugin's test doubles; accelerator kernels need their platform's libraries
        assert b.kernels is not None, b.name
        try:
            loaded = backends._kernels(b.name)
        except Exception as err:  # e3j-cuda installed without its host module: nothing to compare
            assert b.name in ("cuda_host", "cuda_simt"), (b.name, err)
            continue
        assert {f.name for f in dataclasses.fields(loaded) if getattr(loaded, f.name)} == set(b.kernels), b.name
    with pytest.raises(TypeError, match=r"kernels declares \['convolution_factored'\] without its"):
        backends.Backend(name="m", version="0", platforms=("cpu",), load=dict, kernels=["convolution_factored"])
    cuda_kernels = pytest.importorskip("e3j_cuda.kernels")
    from e3j_cuda import backend as cuda_backend

    assert set(cuda_kernels.__all__) == set(cuda_backend.KERNELS)  # the module's API is what it declares


def test_routing_a_trace_imports_no_accelerator_kernels():
    """An op's trace asks which kernels each platform's backend has. Answered by importing them, a
    CPU-only process imported Pallas's GPU and TPU modules mid-program, whose JAX options join every
    jit cache key: a function compiled before compiled again (a MACE Calculator's second call took
    6-11 s). Fresh process: the modules must not be imported yet."""
    code = """
import sys, jax, jax.numpy as jnp, numpy as np
import e3j
f = jax.jit(lambda a: a * 2)
f(jnp.ones(3))
conv = e3j.Convolution("0e + 1o", "0e + 1o", filter="0e + 1o")
mul = e3j.MulIrConvolution("2x0e + 1x1o", "0e + 1o", "0e + 1o")
g = e3j.Graph.from_edges(np.array([0, 1]), np.array([1, 0]), num_nodes=2)
x, y, h = jnp.ones((2, 4, 2)), jnp.ones((2, 4)), jnp.ones((2, 3))
jax.jit(lambda k: conv(x, y, e3j.FactoredWeights(h, k), g))(jnp.ones((3, conv.num_paths * 2)))
xm = jnp.ones((2, mul.irreps_x.dim))
jax.jit(lambda k: mul(xm, y, e3j.FactoredWeights(h, k), g))(jnp.ones((3, mul.num_weights)))
f(jnp.ones(3))
kernels = ("e3j_pallas_gpu.convolution", "e3j_pallas_tpu.convolution", "e3j_cuda.kernels", "jax._src.pallas.fuser")
print(f._cache_size(), sorted(m for m in sys.modules if m.startswith(kernels)))
"""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[-2] == "1 []", proc.stdout


def test_a_split_plan_runs_on_one_grouped_backend(monkeypatch):
    """A mixed-multiplicity plan that per-group selection splits across backends runs every group
    on the chosen kernel backend with grouped kernels that can run them all, the one chosen for the
    most weight columns first; else each group keeps its own."""
    from e3j._primitives.grouped_convolution import _plan_backends

    plan = e3j.MulIrConvolution("32x0e + 16x1o + 2x2e", "0e + 1o", "0e + 1o + 1e").plan
    cols = {g.channels: g.coo.num_paths * g.channels for g in plan.groups}
    n = len(plan.groups)

    def names(*extra):
        _install(monkeypatch, *extra)
        return [b.name for b in _plan_backends(plan, "cpu", "float32", None)]

    # not split: each its own, all the same
    assert names(_synthetic("w1", 300, yields=(("convolution", 1000, "test"),))) == ["test"] * n
    # split by yields at 32: w2 chosen for the 32-channel group; the test plugin (no grouped kernels)
    # for the others. w2 runs them all with grouped kernels: all on w2
    assert names(_synthetic("w2", 300, yields=(("convolution", 32, "test"),))) == ["w2"] * n
    # split by a limit: w3 (max 16 channels) for the narrow groups only; it cannot run the widest and
    # the test plugin has no grouped kernels: each group its own
    got = names(_synthetic("w3", 300, max_channels=16))
    assert got == ["w3" if g.channels <= 16 else "test" for g in plan.groups] and len(set(got)) == 2
    # two grouped backends split the plan: the one chosen for more weight columns takes every group
    assert cols[32] > cols[16] + cols[2]
    big = _synthetic("g_big", 300, yields=(("convolution", 20, "g_small"),))
    assert names(big, _synthetic("g_small", 200)) == ["g_big"] * n
    # ... unless it cannot run them all: then the other
    only32 = _synthetic("g_only32", 300, channel_multiple=32)
    assert names(only32, _synthetic("g_rest", 200)) == ["g_rest"] * n


def test_the_grouped_op_runs_on_the_plans_backend(monkeypatch):
    """Through ``e3j.MulIrConvolution``: a plan split by a backend's ``yields`` runs its grouped
    kernels once for all groups, forward and backward, with the reference's values."""
    record: list[str] = []
    _install(monkeypatch, _synthetic("w_rec", 300, record, yields=(("convolution", 32, "test"),)))
    op = e3j.MulIrConvolution("32x0e + 16x1o + 2x2e", "0e + 1o", "0e + 1o + 1e")
    rng = np.random.default_rng(0)
    graph = e3j.Graph.from_edges(np.array([0, 1, 2, 1]), np.array([1, 0, 1, 2]), num_nodes=3)
    x = jnp.asarray(rng.normal(size=(3, op.plan.irreps_x.dim)))
    y = jnp.asarray(rng.normal(size=(4, 4)))
    s = jnp.asarray(rng.normal(size=(4, op.plan.num_weights)))

    def loss(x, s, backend=None):
        return jnp.sum(jnp.sin(op(x, y, s, graph, backend=backend)))

    got = jax.value_and_grad(loss, argnums=(0, 1))(x, s)
    assert record == ["w_rec", "w_rec"] and plugin.calls == []  # one forward, one backward; no test kernel
    want = jax.value_and_grad(loss, argnums=(0, 1))(x, s, "reference")
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    for a, b in zip(got[1], want[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


# -- python -m e3j info ---------------------------------------------------------------------------


def _selected(text: str) -> dict[tuple[str, str], str]:
    section = text.split("Selected backend", 1)[1].splitlines()[1:]
    return {(p[0], p[1]): " ".join(p[2:]) for line in section if (p := line.split()) and p[0] in backends.OPS}


def test_info_subprocess():
    env = {k: v for k, v in os.environ.items() if k != ENV}
    proc = subprocess.run(
        [sys.executable, "-m", "e3j", "info"], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"e3j        {e3j.__version__}" in out
    assert f"jax        {jax.__version__}" in out
    assert "jaxlib" in out and "python" in out and f"COO format {e3j.backends.COO_FORMAT_VERSION}" in out
    assert "JAX default platform: cpu" in out
    for name in ("reference", "test", "incompatible", "old_jax", "load_fails"):
        assert f"\n  {name} " in out
    assert "compatible:    no: it reads COO format" in out
    assert "compatible:    no: it needs jax>=0.4,<0.5" in out
    assert "priority:      100" in out
    assert "Backends that failed to load:" in out
    assert "broken (e3j_test_backend._broken:backend): ImportError" in out
    assert "not_a_backend (e3j_test_backend:not_a_backend): TypeError" in out
    assert "float32, 64 channels, lmax 3" in out
    assert _selected(out) == {("tensor_product", "cpu"): "test", ("convolution", "cpu"): "test"}


def test_info_in_process_honours_env_var(capsys, monkeypatch):
    monkeypatch.setenv(ENV, "reference")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"{ENV}: reference" in out
    assert _selected(out) == {("tensor_product", "cpu"): "reference", ("convolution", "cpu"): "reference"}
    assert backends._warned == set()  # info leaves the once-only warnings for real lowerings


def test_info_in_process_reports_unusable_env_var_without_failing(capsys, monkeypatch):
    monkeypatch.setenv(ENV, "incompatible")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert _selected(out) == {("tensor_product", "cpu"): "test", ("convolution", "cpu"): "test"}
    assert "note: E3J_BACKEND=incompatible is not used for convolution on cpu: it reads COO format" in out
    assert backends._warned == set()


@pytest.mark.parametrize("argv", [[], ["nope"], ["info", "--nope"]])
def test_cli_bad_arguments_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "usage: e3j" in capsys.readouterr().err


def test_console_script():
    script = os.path.join(os.path.dirname(sys.executable), "e3j")
    proc = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and "info" in proc.stdout, proc.stderr


class _Client:
    def __init__(self, platform_version):
        self.platform_version = platform_version


class _Device:
    def __init__(self, platform, platform_version=""):
        self.platform = platform
        self.client = _Client(platform_version)


@pytest.mark.parametrize(
    ("device", "want"),
    [
        # what JAX 0.11.2's CUDA plugin reported on the H200: device.platform "gpu"
        (_Device("gpu", "PJRT C API\ncuda 13000"), "cuda"),
        (_Device("gpu", "rocm 60302"), "rocm"),
        (_Device("tpu", "PJRT C API\nTFRT TPU v5 lite"), "tpu"),
        (_Device("cpu", "<unknown>"), "cpu"),
    ],
)
def test_device_platform_names_gpus_as_lowerings_do(device, want):
    # "gpu" matched no backend's platforms, so `e3j info` and `e3j bench` measured only the reference
    assert e3j.backends.device_platform(device) == want
