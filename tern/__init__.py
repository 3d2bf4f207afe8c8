"""tern: a research kit for CPU-first language models.

probe the host -> predict decode tok/s (two-pool roofline) -> train ternary / MoE / SSM
models -> decode with a numba engine -> plot measured against predicted -> decide with
pre-registered gates.
"""

import os as _os

# torch's and numba's OpenMP worker threads spin-wait by default and steal the cores from
# each other on small machines (measured: ~3x slower training on 2 cores). Must be set
# before libgomp loads, i.e. before torch or numba start threads; a user's value wins.
_os.environ.setdefault("GOMP_SPINCOUNT", "2000")

__version__ = "0.1.0"
