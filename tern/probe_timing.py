"""Timing loop shared by the bandwidth sweep and the kernel benchmark.

``run(count)`` executes ``count`` repetitions of the work (passes over an array, matvec
calls). :func:`timed_runs` warms up, picks ``count`` so one timed run lasts at least
``min_time_s`` (and is long enough that a fixed per-call cost does not dominate it),
then times ``repeats`` runs; a run that comes out shorter than
``min_time_s`` (the machine sped up after the warm-up) is redone with a larger count, so
every kept sample honours the minimum.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TimingConfig:
    min_time_s: float = 0.1  # each timed run lasts at least this long
    repeats: int = 3  # timed runs kept (best and median are reported)
    warmup_s: float = 0.02  # warm-up (and calibration) time before the timed runs
    max_calibration_s: float = 0.25  # longest run the fixed-cost check may grow to

    def __post_init__(self) -> None:
        if not (self.min_time_s > 0 and math.isfinite(self.min_time_s)):
            raise ValueError(f"min_time_s must be > 0, got {self.min_time_s}")
        if not (isinstance(self.repeats, int) and self.repeats >= 1):
            raise ValueError(f"repeats must be an integer >= 1, got {self.repeats!r}")
        if not (self.warmup_s >= 0 and math.isfinite(self.warmup_s)):
            raise ValueError(f"warmup_s must be >= 0, got {self.warmup_s}")
        if not (self.max_calibration_s > 0 and math.isfinite(self.max_calibration_s)):
            raise ValueError(f"max_calibration_s must be > 0, got {self.max_calibration_s}")


@dataclass(frozen=True)
class Timing:
    counts: tuple[int, ...]  # repetitions in each kept run
    seconds: tuple[float, ...]  # duration of each kept run, each >= min_time_s

    def rates(self, units_per_count: float) -> list[float]:
        """Units per second of every kept run (e.g. bytes per pass -> bytes/s)."""
        return [units_per_count * c / s for c, s in zip(self.counts, self.seconds, strict=True)]

    def rate_per_count(self) -> float:
        """Best repetitions per second (a count hint for the next, similar measurement)."""
        return max(c / s for c, s in zip(self.counts, self.seconds, strict=True))


def _timed(run: Callable[[int], None], count: int) -> float:
    t0 = time.perf_counter()
    run(count)
    return time.perf_counter() - t0


def timed_runs(run: Callable[[int], None], cfg: TimingConfig, count_hint: int = 1,
               max_count: int = 1 << 40, fixed_cost_check: bool = True) -> Timing:
    """Warm up, calibrate and time ``run``. ``count_hint`` is a first guess of the count
    that lasts ``cfg.warmup_s`` (e.g. from the previous working-set size).
    ``fixed_cost_check``: make sure a fixed cost per ``run`` call (not per count) does not
    dominate; needed when one call starts threads, skipped for single-thread kernels."""
    count = max(1, min(int(count_hint), max_count))
    dt = _timed(run, count)  # the first run also warms caches (and compiles, if needed)
    while dt < cfg.warmup_s and count < max_count:  # warm up for at least warmup_s
        count = min(max_count, max(count * 2, math.ceil(count * 1.2 * cfg.warmup_s / max(dt, 1e-7))))
        dt = _timed(run, count)
    # A fixed cost per call (thread wake-up; on a busy machine a descheduled worker can
    # cost tens of ms) must not set the count: grow it until doubling the count about
    # doubles the time (jumping up to 8x while it does not), up to max_calibration_s a run.
    cap_s = max(cfg.min_time_s, cfg.max_calibration_s)
    while fixed_cost_check and count < max_count:
        doubled = min(max_count, 2 * count)
        dt2 = _timed(run, doubled)
        if dt2 >= 1.6 * dt or dt2 >= cap_s or doubled >= max_count:
            count, dt = doubled, dt2
            break
        jump = max(2.0, min(8.0, cap_s / max(dt2, 1e-9)))  # do not overshoot the cap
        count = min(max_count, math.ceil(doubled * jump / 2))
        dt = _timed(run, count)
    floor = count  # below this the fixed cost dominates
    count = min(max_count, max(floor, math.ceil(count * 1.05 * cfg.min_time_s / max(dt, 1e-9))))
    counts, seconds = [], []
    for _ in range(cfg.repeats):
        for _attempt in range(8):
            ran = count
            dt = _timed(run, ran)
            if dt >= cfg.min_time_s or count >= max_count:
                break
            count = min(max_count, math.ceil(count * 1.1 * cfg.min_time_s / max(dt, 1e-9)))
        counts.append(ran)
        seconds.append(dt)
    return Timing(counts=tuple(counts), seconds=tuple(seconds))
