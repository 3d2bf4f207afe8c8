"""Memory bandwidth against working-set size: numba read, copy and triad kernels.

* ``read``  sums an array (8 bytes read per float64): the decode roof, since decoding a
  token streams weights and writes almost nothing. The sum goes into independent vector
  accumulators (``fastmath`` lets LLVM reassociate, so the loop vectorizes with several
  zmm/ymm accumulators instead of one serial add chain).
* ``copy``  b[i] = a[i]          counted as 16 bytes per element (read a, write b)
* ``triad`` a[i] = b[i] + q*c[i] counted as 24 bytes per element (read b and c, write a)

Copy and triad are counted the STREAM way: the write-allocate traffic (the cache reads
the destination line before overwriting it) is NOT counted, so at DRAM sizes their
figures understate the bytes the memory bus really moves (by 1/2 for copy, 1/3 for triad).

The repetition loop over passes is inside the kernels, and with several threads inside
each thread's chunk (``prange`` over chunks), so one call does all the timed work and the
threads never synchronise between passes. Working set = bytes of all arrays the kernel
touches; GB/s = 1e9 bytes per second.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numba
import numpy as np
from numba import njit, prange

from tern.core.host_caches import GIB, KIB, MIB
from tern.core.host_profile import BandwidthPoint
from tern.core.records import summarize
from tern.probe import timing as probe_timing
from tern.probe.timing import Calibrated, Timing, TimingConfig, calibrate

KERNELS = ("read", "copy", "triad")
N_ARRAYS = {"read": 1, "copy": 2, "triad": 3}  # float64 arrays touched
LINE_ELEMS = 8  # float64 per 64-byte cache line: sizes and thread chunks are multiples
TRIAD_SCALAR = 3.0


# ---- kernels ------------------------------------------------------------------------------


@njit(cache=True)
def _chunk(n, chunks, t):
    """Bounds of chunk ``t`` of ``chunks`` over n elements, aligned to cache lines."""
    per = (n // chunks) // LINE_ELEMS * LINE_ELEMS
    lo = t * per
    hi = n if t == chunks - 1 else lo + per
    return lo, hi


# The helpers loop from 0 over whole (sliced) arrays: numba then knows the index is not
# negative and emits no wrap-around select, which would block vectorization.


@njit(fastmath=True, cache=True)
def _sum_passes(a, passes):
    total = 0.0
    for _ in range(passes):
        s = 0.0
        for i in range(a.shape[0]):  # vectorized: reassociation allowed by fastmath
            s += a[i]
        total += s
    return total


@njit(fastmath=True, cache=True)
def _copy_passes(a, b, passes):
    for _ in range(passes):
        for i in range(a.shape[0]):
            b[i] = a[i]


@njit(fastmath=True, cache=True)
def _triad_passes(a, b, c, q, passes):
    for _ in range(passes):
        for i in range(a.shape[0]):
            a[i] = b[i] + q * c[i]


@njit(fastmath=True, cache=True)
def read_kernel(a, passes):
    """Sum of ``a`` (n,) f8 over ``passes`` passes (returns passes * sum(a))."""
    return _sum_passes(a, passes)


@njit(fastmath=True, cache=True, parallel=True)
def read_kernel_parallel(a, passes, chunks):
    partial = np.zeros(chunks)  # (chunks,)
    for t in prange(chunks):
        lo, hi = _chunk(a.shape[0], chunks, t)
        partial[t] = _sum_passes(a[lo:hi], passes)
    return partial.sum()


@njit(fastmath=True, cache=True)
def copy_kernel(a, b, passes):
    """b[:] = a[:] (both (n,) f8), ``passes`` times."""
    _copy_passes(a, b, passes)


@njit(fastmath=True, cache=True, parallel=True)
def copy_kernel_parallel(a, b, passes, chunks):
    for t in prange(chunks):
        lo, hi = _chunk(a.shape[0], chunks, t)
        _copy_passes(a[lo:hi], b[lo:hi], passes)


@njit(fastmath=True, cache=True)
def triad_kernel(a, b, c, q, passes):
    """a[:] = b[:] + q * c[:] (all (n,) f8), ``passes`` times."""
    _triad_passes(a, b, c, q, passes)


@njit(fastmath=True, cache=True, parallel=True)
def triad_kernel_parallel(a, b, c, q, passes, chunks):
    for t in prange(chunks):
        lo, hi = _chunk(a.shape[0], chunks, t)
        _triad_passes(a[lo:hi], b[lo:hi], c[lo:hi], q, passes)


def compile_kernels() -> None:
    """Compile (or load from numba's cache) every kernel before anything is timed."""
    a, b, c = np.ones(64), np.ones(64), np.ones(64)
    read_kernel(a, 1)
    read_kernel_parallel(a, 1, 2)
    copy_kernel(a, b, 1)
    copy_kernel_parallel(a, b, 1, 2)
    triad_kernel(a, b, c, TRIAD_SCALAR, 1)
    triad_kernel_parallel(a, b, c, TRIAD_SCALAR, 1, 2)


def read_kernel_simd() -> str:
    """Widest vector register the read loop adds from memory with: 'zmm' (512-bit),
    'ymm' (256-bit), 'xmm' (128-bit), 'scalar', or 'unknown' (not x86). Compiles an
    uncached copy of the loop, since numba cannot show the assembly of cached code."""
    fresh = njit(fastmath=True, cache=False)(_sum_passes.py_func)
    fresh(np.ones(64), 1)
    asm = fresh.inspect_asm(fresh.signatures[0])
    adds = [ln for ln in asm.splitlines() if re.search(r"\bv?addp[sd]\b", ln) and "(" in ln]
    for reg in ("zmm", "ymm", "xmm"):
        if any(reg in ln for ln in adds):
            return reg
    if re.search(r"\bv?adds[sd]\b", asm):
        return "scalar"
    return "unknown"


# ---- threads ------------------------------------------------------------------------------


def max_threads() -> int:
    """Threads numba may use (NUMBA_NUM_THREADS, by default the logical CPUs)."""
    return int(numba.config.NUMBA_NUM_THREADS)


def check_threads(threads: int) -> int:
    if not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    if threads > max_threads():
        raise ValueError(f"{threads} threads requested but numba may use at most {max_threads()} "
                         f"(NUMBA_NUM_THREADS / logical CPUs)")
    return int(threads)


@contextmanager
def numba_threads(threads: int) -> Iterator[None]:
    """Run the block with numba's thread count set to ``threads``, restoring it after."""
    check_threads(threads)
    prev = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        yield
    finally:
        numba.set_num_threads(prev)


# ---- buffers ------------------------------------------------------------------------------


class SweepBuffers:
    """One page-aligned, touched float64 buffer of ``max_ws_bytes`` from which every
    kernel's arrays are cut (so the sweep allocates and page-faults once). Arrays of one
    kernel start at staggered offsets so their streams do not alias in the caches."""

    def __init__(self, max_ws_bytes: int):
        if max_ws_bytes < 4 * KIB:
            raise ValueError(f"max_ws_bytes must be >= 4 KiB, got {max_ws_bytes}")
        self.max_ws_bytes = int(max_ws_bytes)
        n = self.max_ws_bytes // 8 + 3 * 64 + 4096  # stagger room
        raw = np.empty(n + 512, dtype=np.float64)
        start = (-raw.ctypes.data % 4096) // 8  # page-align the first array
        self._buf = raw[start:start + n]
        self._buf.fill(1.0)  # touch every page (zero pages would alias one physical page)

    def max_elements(self, kernel: str) -> int:
        return (self.max_ws_bytes // (8 * N_ARRAYS[kernel])) // LINE_ELEMS * LINE_ELEMS

    def arrays(self, kernel: str, n: int) -> tuple[np.ndarray, ...]:
        """``N_ARRAYS[kernel]`` disjoint (n,) f8 views."""
        if n < LINE_ELEMS or n > self.max_elements(kernel):
            raise ValueError(f"{n} elements per array does not fit {kernel!r} in a "
                             f"{self.max_ws_bytes}-byte buffer")
        k = N_ARRAYS[kernel]
        slot = self.max_elements(kernel)
        # stagger by 1 KiB + one line per array so a[i], b[i], c[i] map to different sets
        return tuple(self._buf[j * (slot + 136):j * (slot + 136) + n] for j in range(k))


# ---- one measurement ----------------------------------------------------------------------


def elements_for(kernel: str, working_set_bytes: int) -> int:
    """Elements per array so the kernel's arrays total (about) ``working_set_bytes``."""
    if kernel not in N_ARRAYS:
        raise ValueError(f"unknown bandwidth kernel {kernel!r}; choose from {KERNELS}")
    n = (int(working_set_bytes) // (8 * N_ARRAYS[kernel])) // LINE_ELEMS * LINE_ELEMS
    return max(n, LINE_ELEMS)


def run_passes(kernel: str, arrays: tuple[np.ndarray, ...], threads: int, passes: int) -> float:
    """Run ``passes`` passes of ``kernel`` over ``arrays`` on ``threads`` threads (the
    caller sets numba's thread count, see :func:`numba_threads`); returns the read sum
    (0.0 for copy and triad)."""
    if kernel == "read":
        (a,) = arrays
        return read_kernel(a, passes) if threads == 1 else read_kernel_parallel(a, passes, threads)
    if kernel == "copy":
        a, b = arrays
        copy_kernel(a, b, passes) if threads == 1 else copy_kernel_parallel(a, b, passes, threads)
        return 0.0
    if kernel == "triad":
        a, b, c = arrays
        if threads == 1:
            triad_kernel(a, b, c, TRIAD_SCALAR, passes)
        else:
            triad_kernel_parallel(a, b, c, TRIAD_SCALAR, passes, threads)
        return 0.0
    raise ValueError(f"unknown bandwidth kernel {kernel!r}; choose from {KERNELS}")


def bandwidth_point(kernel: str, threads: int, working_set_bytes: int, timing: Timing,
                    origin_s: float) -> BandwidthPoint:
    """The BandwidthPoint of ``timing``'s runs over ``working_set_bytes`` (the bytes one
    pass touches); run starts are stored as seconds since ``origin_s`` (on probe_timing.clock)."""
    runs = [r / 1e9 for r in timing.rates(working_set_bytes)]  # GB/s per run, in order
    s = summarize(runs)
    return BandwidthPoint(kernel=kernel, threads=threads, working_set_bytes=working_set_bytes,
                          gbps_best=s["max"], gbps_median=s["median"], repeats=int(s["repeats"]),
                          gbps_min=s["min"], runs_gbps=tuple(runs),
                          runs_at_s=tuple(t - origin_s for t in timing.starts_s))


def calibrate_point(kernel: str, working_set_bytes: int, threads: int, buffers: SweepBuffers,
                    timing: TimingConfig, count_hint: int = 1) -> tuple[Calibrated, int]:
    """Warm up and choose the pass count of one kernel at one working set (the caller
    holds numba's thread count at ``threads``, see :func:`numba_threads`). Returns the
    calibrated run and the working set in bytes it really touches."""
    check_threads(threads)
    n = elements_for(kernel, working_set_bytes)
    arrays = buffers.arrays(kernel, n)
    ws = n * 8 * N_ARRAYS[kernel]
    c = calibrate(lambda passes: run_passes(kernel, arrays, threads, passes), timing, count_hint,
                  fixed_cost_check=threads > 1)
    return c, ws


def measure_point(kernel: str, working_set_bytes: int, threads: int, buffers: SweepBuffers,
                  timing: TimingConfig, count_hint: int = 1) -> tuple[BandwidthPoint, Timing]:
    """GB/s of one kernel at one working set on ``threads`` threads (best, median and
    worst of ``timing.repeats`` runs, each at least ``timing.min_time_s`` long).

    For a single point: its repeats are timed back to back right after calibration (run
    starts in the point are seconds since the first run). :func:`sweep` instead spreads
    each point's repeats over the whole curve, in rounds."""
    with numba_threads(threads):
        c, ws = calibrate_point(kernel, working_set_bytes, threads, buffers, timing, count_hint)
        for _ in range(timing.repeats):
            c.time_once()
    t = c.timing()
    return bandwidth_point(kernel, threads, ws, t, t.starts_s[0]), t


# ---- the sweep ----------------------------------------------------------------------------


def working_set_sizes(min_bytes: int, max_bytes: int, points_per_octave: int) -> list[int]:
    """Sizes 2**(k / points_per_octave) bytes from min to max (both included), rounded to
    whole cache lines."""
    if not (4 * KIB <= min_bytes < max_bytes):
        raise ValueError(f"need 4 KiB <= min_bytes < max_bytes, got {min_bytes}, {max_bytes}")
    if points_per_octave < 1:
        raise ValueError(f"points_per_octave must be >= 1, got {points_per_octave}")
    lo, hi = math.log2(min_bytes), math.log2(max_bytes)
    steps = math.ceil((hi - lo) * points_per_octave - 1e-9)
    sizes = [int(round(2 ** (lo + (hi - lo) * k / steps) / 64)) * 64 for k in range(steps + 1)]
    return sorted(set(sizes))


@dataclass(frozen=True)
class SweepConfig:
    min_ws_bytes: int = 4 * KIB
    max_ws_bytes: int = 512 * MIB
    points_per_octave: int = 4  # for the read kernel (the decode roof)
    stream_points_per_octave: int | None = None  # copy and triad (None: as read)
    kernels: tuple[str, ...] = KERNELS
    thread_counts: tuple[int, ...] = (1,)
    timing: TimingConfig = field(default_factory=TimingConfig)

    def __post_init__(self) -> None:
        working_set_sizes(self.min_ws_bytes, self.max_ws_bytes, self.points_per_octave)
        if self.stream_points_per_octave is not None and self.stream_points_per_octave < 1:
            raise ValueError(f"stream_points_per_octave must be >= 1, got {self.stream_points_per_octave}")
        bad = [k for k in self.kernels if k not in KERNELS]
        if bad or not self.kernels:
            raise ValueError(f"unknown or no bandwidth kernels {list(self.kernels)}; choose from {KERNELS}")
        if not self.thread_counts:
            raise ValueError("thread_counts is empty")
        for t in self.thread_counts:
            check_threads(t)

    def sizes(self, kernel: str = "read") -> list[int]:
        ppo = self.points_per_octave if kernel == "read" else (self.stream_points_per_octave
                                                               or self.points_per_octave)
        return working_set_sizes(self.min_ws_bytes, self.max_ws_bytes, ppo)

    def n_points(self) -> int:
        return sum(len(self.sizes(k)) for k in self.kernels) * len(self.thread_counts)


# A /sys last-level cache above this is read as this much when sizing the sweep: the Intel
# Xeon VM reports a 480 MiB L3 (the socket's), one of its cores reads at L3 speed only up to
# ~105-110 MiB (2 threads ~113-132 MiB: the measured tiers), so 1 GiB is DRAM there. Sweeping to
# 1 GiB instead of 4 x 480 MiB (session 30, numba's cache warm, one probe each): the bandwidth
# stage 120 -> 109 s, the full probe 234 -> 223 s, the triad's three buffers 5.6 -> 3 GiB, the
# same measured tiers (1 thread L3 107 / 110 MiB at 29.4 / 29.3 GB/s, DRAM 19.2 / 18.3 GB/s).
LLC_HINT_CAP_BYTES = 256 * MIB


def default_max_ws_bytes(llc_bytes: int, quick: bool = False) -> int:
    """Largest working set: max(4 x LLC, 512 MiB) for a full sweep; 4 x LLC (at least
    64 MiB, still well past the last-level cache) for a quick one; the LLC taken as at most
    LLC_HINT_CAP_BYTES (a VM's /sys may report a whole socket's cache)."""
    llc = min(max(int(llc_bytes), 1 * MIB), LLC_HINT_CAP_BYTES)
    return max(4 * llc, 64 * MIB) if quick else max(4 * llc, 512 * MIB)


def sweep(cfg: SweepConfig, progress: bool = True,
          buffers: SweepBuffers | None = None) -> list[BandwidthPoint]:
    """Every (kernel, threads, working set) point of ``cfg``, small to large sizes.

    One curve (kernel, thread count) at a time: every point is warmed up and its pass
    count chosen once, small to large (each size's rate is the next one's count hint);
    then the ``cfg.timing.repeats`` timed runs are taken in rounds, round r timing one run
    of every point of the curve, small to large, before round r+1 (see
    :func:`tern.probe.timing.timed_rounds`). A point's runs are so spread over the
    curve's whole timed duration, and a machine that drifts between regimes shows as
    spread within points (``gbps_min`` .. ``gbps_best``) instead of a step between
    neighbours. Run starts are stored as seconds since the sweep began."""
    from tqdm import tqdm

    compile_kernels()
    buffers = buffers or SweepBuffers(cfg.max_ws_bytes)
    rounds = cfg.timing.repeats
    origin_s = probe_timing.clock()
    points: list[BandwidthPoint] = []
    with tqdm(total=cfg.n_points() * (1 + rounds), desc="bandwidth", unit="step", disable=not progress,
              leave=False, file=sys.stderr, mininterval=0.5) as bar:
        for kernel in cfg.kernels:
            sizes = cfg.sizes(kernel)
            for threads in cfg.thread_counts:
                with numba_threads(threads):
                    calibrated: list[Calibrated] = []
                    wss: list[int] = []
                    hint = 1
                    for i, ws in enumerate(sizes):
                        c, real_ws = calibrate_point(kernel, ws, threads, buffers, cfg.timing, hint)
                        calibrated.append(c)
                        wss.append(real_ws)
                        nxt = sizes[min(i + 1, len(sizes) - 1)]
                        # passes per warm-up at the next size (passes/s scale as 1 / bytes)
                        hint = max(1, int(c.calibration_rate * real_ws / nxt * cfg.timing.warmup_s))
                        bar.set_postfix_str(f"{kernel} {threads}T calibrate {format_bytes(ws)}")
                        bar.update()

                    def done(r: int, i: int, kernel=kernel, threads=threads, wss=wss) -> None:
                        bar.set_postfix_str(f"{kernel} {threads}T round {r + 1}/{rounds} "
                                            f"{format_bytes(wss[i])}")
                        bar.update()

                    timings = probe_timing.timed_rounds(calibrated, rounds, after_each=done)
                points += [bandwidth_point(kernel, threads, ws, t, origin_s)
                           for ws, t in zip(wss, timings, strict=True)]
    return points


def format_bytes(n: float) -> str:
    """4096 -> '4 KiB', 1.5 MiB -> '1.5 MiB' (binary units, as cache sizes are quoted)."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if abs(v - round(v)) < 0.05 else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


# ---- the same-run read reference of a decode benchmark ------------------------------------

READ_REFERENCE_MAX_BYTES = 1 << 30  # past a few LLCs the read rate is flat (DRAM)
ReadNow = Callable[[int, int], dict]  # (working_set_bytes, threads) -> read_reference's dict


def read_reference(working_set_bytes: int, threads: int, repeats: int = 5,
                   min_time_s: float = 0.05) -> dict[str, float | int]:
    """The read kernel's GB/s (1e9 B/s) now, over ``working_set_bytes`` (capped at
    READ_REFERENCE_MAX_BYTES) on ``threads`` threads: {gbps_median, gbps_min, gbps_best,
    working_set_bytes, threads, repeats}. A decode benchmark times it right beside the
    decode, so its bandwidth fraction is not at the mercy of a host whose memory speed
    drifts between the probe and the run (this VM kind's DRAM rate moves by 20-40 %)."""
    if not (isinstance(working_set_bytes, (int, np.integer)) and working_set_bytes >= 4 * KIB):
        raise ValueError(f"working_set_bytes must be an integer >= 4 KiB, got {working_set_bytes!r}")
    ws = int(min(working_set_bytes, READ_REFERENCE_MAX_BYTES))
    point, _ = measure_point("read", ws, check_threads(threads), SweepBuffers(ws),
                             TimingConfig(min_time_s=min_time_s, repeats=repeats))
    return {"gbps_median": point.gbps_median, "gbps_min": point.gbps_min, "gbps_best": point.gbps_best,
            "working_set_bytes": point.working_set_bytes, "threads": int(threads), "repeats": point.repeats}
