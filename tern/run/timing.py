"""Timing the engine per token: from Python (what a user's loop pays) and inside numba
(the engine's own work, no Python between tokens). Used by the probe (engine runs), the
ladder and the sweep worker."""

from __future__ import annotations

import time
from typing import Any

import numba
import numpy as np

from tern.kernels import ops, ops_region
from tern.kernels.cache_guard import drop_stale_cache
from tern.kernels.region_items import REGION_DEPS


def time_steps(engine: Any, tokens: np.ndarray) -> float:
    """Seconds per token of ``engine.step`` over ``tokens`` after a reset."""
    engine.reset()
    step = engine.step
    t0 = time.perf_counter()
    for t in tokens:
        step(int(t))
    return (time.perf_counter() - t0) / len(tokens)


def time_njit(engine: Any, tokens: np.ndarray) -> float:
    """Seconds per token of the bare numba call (no Python checks) over ``tokens``."""
    engine.reset()
    fn, before, after = engine.fused_call()
    if numba.get_num_threads() != engine.threads:
        numba.set_num_threads(engine.threads)
    t0 = time.perf_counter()
    for t in tokens:
        fn(*before, int(t), *after)
    return (time.perf_counter() - t0) / len(tokens)


@numba.njit(cache=True)
def _token_loop(buf, aux, G, T, LI, eps, tokens, ssm_h, conv, kc, vc, pos, work, iwork, counts, last, logits):
    for t in tokens:
        ops.token_step(buf, aux, G, T, LI, eps, t, ssm_h, conv, kc, vc, pos, work, iwork, counts, last, logits)


@numba.njit(cache=True)
def _token_loop_region(buf, aux, G, T, LI, eps, tokens, ssm_h, conv, kc, vc, pos, work, iwork, counts, last,
                       logits, Gserial, rp, ctr, scal):
    for t in tokens:
        ops_region.token_step_region(buf, aux, G, T, LI, eps, t, ssm_h, conv, kc, vc, pos, work, iwork, counts,
                                     last, logits, Gserial, rp, ctr, scal)


def time_in_numba(engine: Any, tokens: np.ndarray) -> float:
    """Seconds per token of the engine's per-token function called from a numba loop: the
    engine's work without any Python between tokens."""
    engine.reset()
    _, before, after = engine.fused_call()
    if numba.get_num_threads() != engine.threads:
        numba.set_num_threads(engine.threads)
    toks = np.ascontiguousarray(tokens, dtype=np.int64)
    t0 = time.perf_counter()
    (_token_loop_region if engine.region else _token_loop)(*before, toks, *after)
    return (time.perf_counter() - t0) / len(toks)


# numba cache hygiene: the loops above are cached with the engine's token steps compiled into
# them, so a change to any engine file must drop them (before, they kept running the old step)
drop_stale_cache(__file__, tuple(f"../kernels/{f}" for f in REGION_DEPS + ("ops_region.py", "region_items.py")),
                 _token_loop)
