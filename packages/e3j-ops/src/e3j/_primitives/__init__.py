"""JAX primitives of e3j: abstract evaluation, AD, batching and per-platform lowering."""
