"""How far apart the cores under two threads are: a cache line handed back and forth.

Two numba threads take turns incrementing one shared int64 (an atomic read-modify-write,
then a spin on an acquire load until the other thread has taken its turn), so each turn
moves the cache line from one core to the other and back. The round trip — the seconds of
two turns — is the cost of every hand-off between the threads: the one-region step's
claims, finishes and phase waits (tern.kernels.region) pay it at every phase.

Why the probe measures it. The 2-vCPU AMD EPYC Zen 4 VM of sessions 20-29 decoded its
cache-resident models at 2 threads in two bands for no reason its other measurements
showed (benchmarks/README, "Two bands at 2 threads: where the vCPUs sit"). On 2026-12-05
the round trip was 356 ns while the 28M peer ran 2 threads at 1.17x one thread, and 53 ns
an hour later at 1.77x: the hypervisor had put the two vCPUs on cores that share no L3
(another CCD) and later on neighbouring ones. /sys shows the same 32 MiB L3 either way.
So a 2-thread figure means little without the round trip measured beside it: the probe
records it in its profile and beside each of its engine-run rounds, and the sweep and
`tern bench peers` beside every 2-thread point.

Robustness: numba does not promise that a parallel loop's two iterations run on two
threads at once. Each spin gives up after ``SPIN_LIMIT`` checks and the measurement is then
None (never a hang): a 1-CPU machine or a single-threaded numba has no round trip.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numba
import numpy as np

from tern.kernels.region import atomic_add, atomic_load, spin_pause
from tern.probe.placement import far_apart

SPIN_LIMIT = 50_000_000  # checks of one turn before giving up (~seconds: far beyond any real round trip)
TURNS = 20_000  # round trips per timed run (~1 ms at 50 ns, ~7 ms at 356 ns)
LINE_INT64 = 8  # int64s per 64-byte cache line: the counter sits alone on its line


@numba.njit(cache=True, parallel=True)
def _ping_pong(line, turns, spin_limit):
    """Two threads alternate ``turns`` times each on ``line[LINE_INT64]``: thread 0 moves it
    from even to odd, thread 1 from odd to even. ``line[0]`` ends 1 if a spin gave up."""
    for tid in numba.prange(2):
        for k in range(turns):
            want = 2 * k + tid
            spins = 0
            while atomic_load(line, LINE_INT64) != want:
                if atomic_load(line, 0) != 0:  # the other thread gave up
                    break
                spins += 1
                if spins > spin_limit:
                    atomic_add(line, 0, 1)
                    break
                spin_pause()
            if atomic_load(line, 0) != 0:
                break
            atomic_add(line, LINE_INT64, 1)


def _run(turns: int, spin_limit: int) -> float | None:
    """Seconds per round trip of one timed run (None: the threads did not run at once)."""
    line = np.zeros(3 * LINE_INT64, dtype=np.int64)  # [0]: gave up; [LINE_INT64]: the counter, alone on its line
    t0 = time.perf_counter()
    _ping_pong(line, turns, spin_limit)
    dt = time.perf_counter() - t0
    if line[0] != 0 or line[LINE_INT64] != 2 * turns:
        return None
    return dt / turns


def measure_round_trip(runs: int = 5, turns: int = TURNS, spin_limit: int = SPIN_LIMIT) -> dict[str, Any] | None:
    """The two threads' cache-line round trip: ``{"round_trip_ns": median, "min_ns", "max_ns",
    "runs", "turns", "far": tern.probe.placement.far_apart(median)}`` over ``runs`` timed runs of ``turns`` round trips
    (after one untimed run that compiles and wakes the threads), or None where numba has fewer
    than 2 threads or its two iterations did not run at once. Takes ~10-50 ms."""
    for name, v in (("runs", runs), ("turns", turns), ("spin_limit", spin_limit)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if numba.config.NUMBA_NUM_THREADS < 2:
        return None
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        if _run(min(turns, 1000), spin_limit) is None:
            return None
        got = [_run(turns, spin_limit) for _ in range(runs)]
    finally:
        numba.set_num_threads(before)
    if any(g is None for g in got):
        return None
    ns = [g * 1e9 for g in got]
    med = statistics.median(ns)
    return {"round_trip_ns": med, "min_ns": min(ns), "max_ns": max(ns), "runs": runs, "turns": turns,
            "far": far_apart(med)}


def round_trip_ns(runs: int = 3, turns: int = 5_000) -> float | None:
    """A quick median round trip in ns (what the sweep and the peers record beside a 2-thread
    point), or None where there is none to measure."""
    m = measure_round_trip(runs=runs, turns=turns)
    return None if m is None else round(m["round_trip_ns"], 1)
