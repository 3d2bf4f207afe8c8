"""Timing loop shared by the bandwidth sweep and the kernel benchmark.

``run(count)`` executes ``count`` repetitions of the work (passes over an array, matvec
calls). :func:`calibrate` warms up and picks ``count`` so one timed run lasts at least
``min_time_s`` (and is long enough that a fixed per-call cost does not dominate it); the
:class:`Calibrated` it returns then takes one kept sample per :meth:`Calibrated.time_once`
call. A run that comes out shorter than ``min_time_s`` (the machine sped up after the
warm-up) is redone with a larger count, so every kept sample honours the minimum.

Two orders of samples:

* :func:`timed_runs` takes ``repeats`` samples back to back (one measurement on its own);
* :func:`timed_rounds` takes them in rounds over several calibrated runs: round r times
  one run of each, in the given order, before round r+1 starts. Each measurement's
  samples are then spread over the whole duration, so drift of a shared machine (another
  tenant's load coming and going) widens every measurement's spread instead of shifting
  one measurement against its neighbour.

Each kept sample records its start on :func:`clock` (``time.perf_counter``, seconds).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

clock = time.perf_counter  # seconds; tests replace it with a fake clock


@dataclass(frozen=True)
class TimingConfig:
    min_time_s: float = 0.1  # each timed run lasts at least this long
    repeats: int = 3  # timed runs kept (best, median and worst are reported)
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
    starts_s: tuple[float, ...] = ()  # clock() at the start of each kept run (s), in order

    def rates(self, units_per_count: float) -> list[float]:
        """Units per second of every kept run (e.g. bytes per pass -> bytes/s)."""
        return [units_per_count * c / s for c, s in zip(self.counts, self.seconds, strict=True)]


def _timed(run: Callable[[int], None], count: int) -> tuple[float, float]:
    """(start on clock(), duration in s) of one ``run(count)``."""
    t0 = clock()
    run(count)
    return t0, clock() - t0


class Calibrated:
    """A ``run`` with its count chosen by :func:`calibrate`; collects kept samples."""

    def __init__(self, run: Callable[[int], None], cfg: TimingConfig, count: int, max_count: int,
                 calibration_rate: float):
        self.run, self.cfg, self.max_count = run, cfg, max_count
        self.count = count  # repetitions per timed run (grows if a run comes out short)
        self.calibration_rate = calibration_rate  # repetitions/s of the last calibration run
        self._counts: list[int] = []
        self._seconds: list[float] = []
        self._starts: list[float] = []

    def time_once(self) -> float:
        """Take one kept sample (at least ``min_time_s`` long); returns its duration (s)."""
        for _attempt in range(8):
            ran = self.count
            t0, dt = _timed(self.run, ran)
            if dt >= self.cfg.min_time_s or self.count >= self.max_count:
                break
            self.count = min(self.max_count,
                             math.ceil(self.count * 1.1 * self.cfg.min_time_s / max(dt, 1e-9)))
        self._counts.append(ran)
        self._seconds.append(dt)
        self._starts.append(t0)
        return dt

    def timing(self) -> Timing:
        """The samples kept so far, in the order taken."""
        return Timing(counts=tuple(self._counts), seconds=tuple(self._seconds),
                      starts_s=tuple(self._starts))


def calibrate(run: Callable[[int], None], cfg: TimingConfig, count_hint: int = 1,
              max_count: int = 1 << 40, fixed_cost_check: bool = True) -> Calibrated:
    """Warm up ``run`` and choose its count. ``count_hint`` is a first guess of the count
    that lasts ``cfg.warmup_s`` (e.g. from the previous working-set size).
    ``fixed_cost_check``: make sure a fixed cost per ``run`` call (not per count) does not
    dominate; needed when one call starts threads, skipped for single-thread kernels."""
    count = max(1, min(int(count_hint), max_count))
    _, dt = _timed(run, count)  # the first run also warms caches (and compiles, if needed)
    while dt < cfg.warmup_s and count < max_count:  # warm up for at least warmup_s
        count = min(max_count, max(count * 2, math.ceil(count * 1.2 * cfg.warmup_s / max(dt, 1e-7))))
        _, dt = _timed(run, count)
    # A fixed cost per call (thread wake-up; on a busy machine a descheduled worker can
    # cost tens of ms) must not set the count: grow it until doubling the count about
    # doubles the time (jumping up to 8x while it does not), up to max_calibration_s a run.
    cap_s = max(cfg.min_time_s, cfg.max_calibration_s)
    while fixed_cost_check and count < max_count:
        doubled = min(max_count, 2 * count)
        _, dt2 = _timed(run, doubled)
        if dt2 >= 1.6 * dt or dt2 >= cap_s or doubled >= max_count:
            count, dt = doubled, dt2
            break
        jump = max(2.0, min(8.0, cap_s / max(dt2, 1e-9)))  # do not overshoot the cap
        count = min(max_count, math.ceil(doubled * jump / 2))
        _, dt = _timed(run, count)
    rate = count / max(dt, 1e-9)
    floor = count  # below this the fixed cost dominates
    count = min(max_count, max(floor, math.ceil(count * 1.05 * cfg.min_time_s / max(dt, 1e-9))))
    return Calibrated(run, cfg, count, max_count, rate)


def timed_runs(run: Callable[[int], None], cfg: TimingConfig, count_hint: int = 1,
               max_count: int = 1 << 40, fixed_cost_check: bool = True) -> Timing:
    """Calibrate ``run`` (see :func:`calibrate`), then time ``cfg.repeats`` runs back to back."""
    c = calibrate(run, cfg, count_hint, max_count, fixed_cost_check)
    for _ in range(cfg.repeats):
        c.time_once()
    return c.timing()


def timed_rounds(calibrated: Sequence[Calibrated], rounds: int,
                 after_each: Callable[[int, int], None] | None = None) -> list[Timing]:
    """``rounds`` rounds; round r times one run of every ``calibrated[i]`` in order before
    round r+1 starts. ``after_each(r, i)`` is called after each run (e.g. a progress bar).
    Returns each one's Timing (``rounds`` samples each, in the order of ``calibrated``)."""
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    for r in range(rounds):
        for i, c in enumerate(calibrated):
            c.time_once()
            if after_each is not None:
                after_each(r, i)
    return [c.timing() for c in calibrated]


# Re-timing of implausibly slow measurements (tern.probe.curves, tern.probe.ops): a point more
# than RETIME_FACTOR x slower than its neighbours allow is timed again, at most RETIME_ROUNDS
# times, and keeps its fastest timing: a pause of the core (another process, the hypervisor)
# only ever adds time, and a real slowdown times slow again and stays. (Session 20, AMD EPYC
# Zen 4 VM: with other work on the machine for a few seconds, single 2-thread curve points
# read 14x and 32x their neighbours, op-cost fits had errors of 35-89 %, and the predictor's
# 2-thread figures came out up to 12x too slow.)
RETIME_FACTOR = 1.5
RETIME_ROUNDS = 2


def retime_slow(points: list, suspects: Callable[[list], list[int]], again: Callable[[int], object],
                seconds: Callable[[object], float], rounds: int = RETIME_ROUNDS) -> list:
    """``points`` with every index ``suspects(points)`` names timed again by ``again(i)`` and
    kept where faster (by ``seconds``), until none is named or after ``rounds`` rounds."""
    points = list(points)
    for _ in range(rounds):
        named = suspects(points)
        for i in named:
            new = again(i)
            if seconds(new) < seconds(points[i]):
                points[i] = new
        if not named:
            break
    return points


def noted_compile_s(value: Any) -> float | None:
    """A profile's ``probe_compile_s`` when it is worth saying: a number of at least 1 s (a fresh
    machine compiled the kernels inside the probe); None when absent, malformed (a string, NaN, a
    bool) or ~0 (a warm numba cache)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1.0:
        return None
    return float(value)


class CompileClock:
    """Seconds numba spends compiling inside a ``with`` block: its "numba:compile" events,
    nested compiles (a kernel's callees) counted once, loads from numba's on-disk cache not
    at all. On a fresh machine (or after an engine change) the probe compiles every kernel
    before timing it; this keeps that one-off cost apart from the probe's own measuring time
    (session 34, Intel Xeon VM: a quick probe took 163 s with an empty cache, 138 s of it
    compiling, and 26 s with a warm one; the kernel rates timed after compiling in the same
    process matched the warm-cache runs').

    ``seconds`` is readable inside the block (compiles finished so far) and after it."""

    def __init__(self) -> None:
        self._listener = None
        self._seconds = 0.0

    def __enter__(self) -> CompileClock:
        from numba.core import event

        self._listener = event.TimingListener()
        event.register("numba:compile", self._listener)
        return self

    def __exit__(self, *exc: object) -> None:
        from numba.core import event

        if self._listener is not None:
            event.unregister("numba:compile", self._listener)
            self._seconds = self._measured()
            self._listener = None

    def _measured(self) -> float:
        return float(self._listener.duration) if self._listener is not None and self._listener.done else 0.0

    @property
    def seconds(self) -> float:
        return self._measured() if self._listener is not None else self._seconds
