"""numba decode engine: kernels, packing, decode loop."""
