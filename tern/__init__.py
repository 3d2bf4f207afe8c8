"""tern: a research kit for CPU-first language models.

probe the host -> predict decode tok/s (two-pool roofline) -> train ternary / MoE / SSM
models -> decode with a numba engine -> plot measured against predicted -> decide with
pre-registered gates.
"""

import os as _os
import sys as _sys

# How long an idle OpenMP worker (libgomp: numba's and torch's, two copies on a 2-core
# machine) spins for the next parallel region before it sleeps. Long spins made torch's and
# numba's workers steal the cores from each other (~3x slower training on 2 cores, session
# 2); 2,000 fixed that but was too short for the gaps of Python between a token's region and
# the next, or between torch ops: the worker slept and waking it cost tens of us. Session 30,
# Intel Xeon VM, 2 threads, 2,000 -> 20,000 (the same within noise up to 300,000): the engine's
# Engine.step on the 28M / 86M peers 333-374 -> 303-315 / 740-768 -> 673-700 us a token; gate
# training e8 / e64 101 -> 83 / 122 -> 100 ms a step; sandbox training 3,777-3,841 -> 4,263-4,314
# tok/s (same loss). Read when libgomp loads, so set before torch or numba start threads; a
# user's value wins.
USER_GOMP_SPINCOUNT = _os.environ.get("GOMP_SPINCOUNT")  # None: tern's value (peers run llama.cpp without it)
# torch imported first, with no spin policy of the user's: its libgomp has read the default
# already, and setting the variable now changes only numba's pool (tern.train.model warns)
OMP_SPIN_SET_TOO_LATE = ("torch" in _sys.modules and USER_GOMP_SPINCOUNT is None
                         and "OMP_WAIT_POLICY" not in _os.environ)
_os.environ.setdefault("GOMP_SPINCOUNT", "20000")

__version__ = "0.1.0"
