"""Shared test configuration.

float64 is switched on for the whole suite: tests that exercise float32 say so with explicit
dtypes, and the float64 oracles (e3nn-jax in float64) need it.
"""

import jax

jax.config.update("jax_enable_x64", True)
