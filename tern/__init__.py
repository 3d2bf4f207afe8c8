"""tern: a research kit for CPU-first language models.

probe the host -> predict decode tok/s (two-pool roofline) -> train ternary / MoE / SSM
models -> decode with a numba engine -> plot measured against predicted -> decide with
pre-registered gates.
"""

__version__ = "0.1.0"
