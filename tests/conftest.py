"""Shared test configuration.

Four host devices (for the shard_map tests) must be requested before JAX initializes its backends;
float64 is switched on for the whole suite: tests that exercise float32 say so with explicit dtypes,
and the float64 oracles (e3nn-jax in float64) need it.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import jax

jax.config.update("jax_enable_x64", True)
