"""Check an e3j installed from wheels, run by that installation's interpreter (no pytest, no test tree).

    VENV/bin/python tests/integration/wheel_smoke.py --backends reference,pallas_gpu,... [--oracle e3nn]

1. Every ``e3j*`` distribution is installed in this interpreter's prefix (not a source tree).
2. ``python -m e3j info`` exits 0, lists exactly the expected backends and none that failed to load.
3. A tensor product (float32, channels last) on every CPU-runnable backend installed agrees with the
   reference backend's, and with e3nn-jax's when ``--oracle e3nn`` (e3nn-jax must then be importable).

Used by tests/integration/test_wheels.py (pure wheels) and ``nox -s wheelhouse`` (``e3j[cuda]``, ``e3j[tpu]``).
Exits non-zero with a message on the first failed check.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

IRREPS_X, IRREPS_Y, FILTER = "0e + 1o + 2e", "0e + 1o", "0e + 1o + 1e + 2e"
BATCH, CHANNELS = 5, 6
RTOL = 1e-5  # float32 kernels against each other and e3nn-jax (relative to the output's largest entry)


def _fail(message: str) -> None:
    sys.exit(f"wheel_smoke: FAILED: {message}")


def check_installed_here() -> list[str]:
    """The e3j distributions installed, each checked to live under this interpreter's prefix."""
    prefix = Path(sys.prefix).resolve()
    names = []
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name.lower().startswith("e3j"):
            continue
        where = Path(dist.locate_file("")).resolve()
        if prefix not in where.parents:
            _fail(f"{name} is installed at {where}, outside this environment ({prefix})")
        names.append(f"{name} {dist.version}")
    import e3j

    if prefix not in Path(e3j.__file__).resolve().parents:
        _fail(f"e3j is imported from {e3j.__file__}, not from this environment ({prefix})")
    return sorted(names)


def check_info(expected: set[str]) -> None:
    """``python -m e3j info``: exit status 0, exactly ``expected`` backends, no discovery errors."""
    result = subprocess.run([sys.executable, "-m", "e3j", "info"], capture_output=True, text=True)
    print(result.stdout, end="")
    if result.returncode != 0:
        _fail(f"python -m e3j info exited with {result.returncode}:\n{result.stderr}")
    if "Backends that failed to load" in result.stdout:
        _fail("python -m e3j info reports backends that failed to load (above)")
    section = result.stdout.split("\nBackends:\n", 1)[1].split("\n\n", 1)[0]
    listed = set(re.findall(r"^  (\S+) \S+$", section, flags=re.MULTILINE))
    if listed != expected:
        _fail(f"python -m e3j info lists backends {sorted(listed)}, expected {sorted(expected)}")


def _e3nn_tensor_product(x, y):
    import e3nn_jax as e3nn
    import jax.numpy as jnp

    def one_channel(c: int):
        xc, yc = e3nn.IrrepsArray(IRREPS_X, x[..., c]), e3nn.IrrepsArray(IRREPS_Y, y[..., c])
        return e3nn.tensor_product(xc, yc, filter_ir_out=FILTER).array

    return jnp.stack([one_channel(c) for c in range(x.shape[-1])], axis=-1)


def check_op(oracle: str | None) -> list[str]:
    """The tensor product on every CPU backend (and e3nn-jax) against the reference; the backends run."""
    import jax
    import numpy as np

    import e3j

    rng = np.random.default_rng(0)
    tp = e3j.TensorProduct(IRREPS_X, IRREPS_Y, filter=FILTER)
    x = rng.standard_normal((BATCH, tp.coo.dim_x, CHANNELS)).astype(np.float32)
    y = rng.standard_normal((BATCH, tp.coo.dim_y, CHANNELS)).astype(np.float32)
    expected = np.asarray(jax.jit(lambda a, b: tp(a, b, backend="reference"))(x, y))
    scale = float(np.abs(expected).max())
    if not scale > 0:
        _fail("the reference tensor product is zero: the check would be vacuous")
    results = {}
    for b in e3j.backends.available_backends():
        if "cpu" in b.platforms and b.name != "reference":
            results[b.name] = jax.jit(lambda a, c, name=b.name: tp(a, c, backend=name))(x, y)
    if oracle == "e3nn":
        results["e3nn-jax"] = _e3nn_tensor_product(x, y)
    for name, value in results.items():
        err = float(np.abs(np.asarray(value) - expected).max()) / scale
        if not err <= RTOL:
            _fail(f"{name}'s tensor product differs from the reference's by {err:.2e} (relative), more than {RTOL}")
    return sorted(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", required=True, help="comma-separated: exactly the backends e3j should list")
    parser.add_argument("--oracle", choices=["e3nn"], help="also compare with e3nn-jax (must be installed)")
    args = parser.parse_args(argv)
    print("installed:", ", ".join(check_installed_here()))
    check_info({b.strip() for b in args.backends.split(",") if b.strip()})
    checked = check_op(args.oracle)
    print(f"wheel_smoke: ok (tensor product against the reference: {', '.join(checked) or 'no other CPU backend'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
