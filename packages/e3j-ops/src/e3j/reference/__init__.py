"""The reference backend: pure-JAX kernels, the CPU path and the ground truth for every kernel."""
