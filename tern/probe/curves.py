"""Kernel working-set curves: the engine's own matvec kernels timed over buffers that span
every tier from L2 to DRAM, at 1 and all threads.

The op costs (tern.probe.ops) price the engine's work on cache-resident data. How much
slower a kernel runs when its weights come from further out depends on how the kernel
overlaps its arithmetic with the memory stream, and that differs from host to host (one
core that adds the two, another that hides most of the stall). So it is measured, not
assumed: each weight-reading op runs over a cycle of ``k`` matrices of one shape whose
bytes add up to the working set ``W`` — every matrix is read once per cycle, as every
weight of a pool is read once per token, in a fixed random order (routing picks experts
in no useful order, so a prefetcher gets no run across matrices) — and the seconds per
call are recorded at each ``W``. The predictor (tern.predict.roofline) scales each op's per-weight cost by the
curve's slowdown at the pool's working set.

Three ways an op runs at ``threads`` > 1, as the engine runs it (tern.kernels.policy,
tern.kernels.ops):

* ``serial`` — one thread (the curve is timed at 1 thread);
* ``rows``  — the parallel kernel splits one matrix's rows over the threads;
* ``experts`` — ``threads`` chosen experts at once, each on one thread with the
  single-thread kernel (expert-parallel routed experts).

Shapes (rows x cols; 256 KiB of weights per matrix at least): the 4-row ternary pass and the blocked16 pass
(one thread: chained into the next matrix, as the engine) on 256-byte rows, the streaming pass on 1 KiB rows
(the engine streams 320 B - 4 KB rows of DRAM-resident pools), the activation-skip kernel with a quarter of
its inputs nonzero (tern.predict.inventory.HIDDEN_DENSITY at random initialisation; skipped rows are not
read), the int8, fp16 / bf16 (w16) and fp32 matvecs of heads and routers. The ternary ops are timed at a second, 4x smaller
matrix too (:data:`SMALL_CURVE_SHAPES`), serial and expert-parallel: from the two sizes the predictor reads
each call's time at the op's own matrix size, so a per-call stall (a cold prefetch stream at every matrix)
is measured, not folded into a per-weight rate (tern.predict.stall.curve_stall). The 4-row pass has a
third, row-heavy shape (:data:`ROWY_CURVE_SHAPES`: the same weights over twice the rows), so a per-row term
is measured at every working set too. The weights are mapped from a file, as the engine maps (:class:`CurveBuffer`).

The probe samples its curves in rounds (:func:`measure_op_curves`): every point of every curve
is calibrated first, then each round takes one sample of every point, and a point keeps the
median over the rounds. Until session 51 each curve was timed back to back, one after the
other; on the AMD EPYC Zen 4 VM, where the two vCPUs' placement and the cores' speed move
within a minute, two curve stages 50 s apart then priced the same 2-thread sweep points up to
1.8x apart (one 2-thread skip curve 2.4x slower at every working set in one stage than in the
next). Four stages each way, alternating (benchmarks/curve_repeatability.py, committed host
amd-epyc-zen4-s50b re-predicted): the median point's spread over the stages 20.6 -> 11.4 % at
2 threads, the 90th percentile 62 -> 17 %, 1 thread 7.1 -> 6.7 % (90th 14.6 -> 11.0 %), for
52 s a stage against 45.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np

from tern.core.engine_tuning import for_threads
from tern.core.host_caches import KIB, MIB
from tern.core.host_profile import OpCurve
from tern.core.host_queries import OP_WEIGHT_BYTES, ROUTER_OP
from tern.core.records import summarize
from tern.probe.bandwidth import numba_threads
from tern.probe.curve_buffer import CurveBuffer
from tern.probe.curve_drivers import SKIP_DENSITY, setup_cycle
from tern.probe.timing import (
    RETIME_FACTOR,
    Calibrated,
    Timing,
    TimingConfig,
    calibrate,
    retime_slow,
    timed_runs,
)

# op -> (rows, cols) of each matrix in the cycle (ternary_skip: inputs x outputs, transposed)
CURVE_SHAPES = {
    "ternary_matvec": (1024, 1024),
    "ternary_stream": (256, 4096),
    "ternary_blocked": (1024, 1024),
    "ternary_skip": (1024, 1024),
    "int8_matvec": (512, 512),
    "fp32_matvec": (256, 256),
    "w16_matvec": (256, 512),  # fp16 / bf16 heads, tables and routers: 256 KiB, as the fp32 shape
    ROUTER_OP: (256, 1024),  # the engine's int8 router kernel (1 thread: its items' kernel)
}
PAR_CURVE_SHAPES = {  # the engine splits only matrices of >= PAR_MIN_WEIGHTS (1M) weights
    "ternary_matvec": (1024, 1024),
    "ternary_stream": (256, 4096),
    "ternary_blocked": (1024, 1024),
    "ternary_skip": (1024, 1024),
    "int8_matvec": (1024, 1024),
    "fp32_matvec": (1024, 1024),
    "w16_matvec": (1024, 1024),
}
EXPERT_OPS = ("ternary_matvec", "ternary_stream", "ternary_blocked", "ternary_skip")
# a second, 4x smaller matrix of each ternary op (64 KiB; serial and expert-parallel): with
# two sizes the predictor separates what each call pays on arriving at its matrix from
# DRAM (a prefetch stream starting cold, first-touch misses) from the per-weight slowdown,
# so that small experts (e.g. 512 x 1024) and large matrices both price right
SMALL_CURVE_SHAPES = {
    "ternary_matvec": (256, 1024),
    "ternary_stream": (64, 4096),
    "ternary_blocked": (256, 1024),
    "ternary_skip": (256, 1024),
}
# a third, row-heavy shape of the 4-row pass (the weights of the main shape over twice its
# rows; serial and expert-parallel): with three shapes the predictor fits each call's time at
# a working set as per-call + per-weight + per-row terms, so matrices of short rows and many
# of them (e.g. 4096 x 512 expert gate/up projections) price how much of their per-row work
# overlaps the memory stream on this host instead of adding it (tern.predict.inventory)
ROWY_CURVE_SHAPES = {"ternary_matvec": (2048, 512)}
WORKING_SETS = tuple(int(256 * KIB * 2 ** i) for i in range(0, 10)) + (512 * MIB,)  # 256 KiB .. 128 MiB, 512 MiB
QUICK_WORKING_SETS = (256 * KIB, 2 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)
CURVE_TIMING = TimingConfig(min_time_s=0.03, repeats=3, warmup_s=0.01)  # each sample >= 30 ms; 3 samples a point


def _weight_bytes(op: str, rows: int, cols: int) -> int:
    """Bytes of weights one matrix of ``op`` stores (ternary2: 2 bits, int8: 1 B, fp16 / bf16: 2 B, fp32: 4 B)."""
    if op == "ternary_blocked":  # rows and columns padded to 16 (imported here: it builds numba intrinsics)
        from tern.kernels.kernels_blocked import blocked16_bytes
        return blocked16_bytes(rows, cols)
    if op.startswith("ternary"):  # whole bytes of 4 codes a row
        return rows * ((cols + 3) // 4)
    return int(rows * cols * OP_WEIGHT_BYTES.get(op, 4.0))  # an unknown op: setup_cycle names the known ones


# A point is implausibly slow (and timed again: tern.probe.timing.retime_slow) when its
# seconds per byte exceed RETIME_FACTOR x some larger working set's (data further out cannot
# stream faster; a pause of the core can) or, at the largest working set, RETIME_LAST_FACTOR x
# the one before it.
RETIME_LAST_FACTOR = 2.0


def implausible_points(ws_bytes: Sequence[int], seconds: Sequence[float]) -> list[int]:
    """Indices of points whose seconds per byte exceed RETIME_FACTOR x some larger working
    set's (the last point: RETIME_LAST_FACTOR x the one before it)."""
    per_byte = [t / w for w, t in zip(ws_bytes, seconds, strict=True)]
    out = [i for i in range(len(per_byte) - 1) if per_byte[i] > RETIME_FACTOR * min(per_byte[i + 1:])]
    if len(per_byte) > 1 and per_byte[-1] > RETIME_LAST_FACTOR * per_byte[-2]:
        out.append(len(per_byte) - 1)
    return out


def implausible_calls(cycles: Sequence[int], seconds_per_call: Sequence[float]) -> list[int]:
    """:func:`implausible_points` of a curve whose point i times one call on a cycle of
    ``cycles[i]`` equal matrices: a call's seconds times the matrices of its cycle are the
    cycle's seconds, which its bytes are in proportion to. (Until session 31 the per-call
    seconds went in as if per cycle: they fell as 1 / working set, so every point but the last
    was named and timed twice more, 60 % of the probe's curve stage: 79 -> 34 s on the Intel
    Xeon VM, with the points' medians 1.00x what the retimed ones read.)"""
    if len(cycles) != len(seconds_per_call) or any(n < 1 for n in cycles):
        raise ValueError(f"implausible_calls needs one time per cycle of >= 1 matrices, got {len(cycles)} "
                         f"cycles {list(cycles)[:4]} and {len(seconds_per_call)} times")
    return implausible_points(cycles, [s * n for s, n in zip(seconds_per_call, cycles, strict=True)])


class CurveRuns:
    """One curve's points set up and calibrated, ready to be sampled: each :meth:`sample` times
    one run of every point (a warm-up cycle first, so a cache-resident point does not start
    from what another curve left in the caches), and :meth:`curve` makes the OpCurve of the
    samples so far. :func:`measure_curve` samples one curve alone (its points in turn, round
    after round); :func:`measure_op_curves` samples every curve of the probe in rounds."""

    def __init__(self, op: str, split: str, threads: int, working_sets: tuple[int, ...], buf: CurveBuffer,
                 timing: TimingConfig | None = None, seed: int = 0, shape: tuple[int, int] | None = None,
                 stream_prefetch: bool = True):
        self.timing = timing or CURVE_TIMING
        self.op, self.split = op, split
        shapes = PAR_CURVE_SHAPES if split == "rows" else CURVE_SHAPES
        if shape is None and op not in shapes:
            raise ValueError(f"no {split} working-set curve for op {op!r}; ops: {sorted(shapes)}")
        self.shape = shape or shapes[op]
        self.mat_bytes = _weight_bytes(op, *self.shape)
        self.group = threads if split == "experts" else 1
        self.numba_threads = threads if split != "serial" else 1
        rng = np.random.default_rng(seed)
        self.cycles: list[int] = []  # matrices per cycle of each point
        for ws in working_sets:
            n_mats = max(self.group, int(round(ws / self.mat_bytes)) // self.group * self.group)
            if n_mats * self.mat_bytes > buf.data.size or (self.cycles and n_mats <= self.cycles[-1]):
                continue  # too large for the buffer, or the same cycle as the last point
            self.cycles.append(n_mats)
        self.runs = [setup_cycle(op, split, threads, self.shape, n, buf, rng, stream_prefetch) for n in self.cycles]
        with numba_threads(self.numba_threads):
            self.calibrated = [self._calibrate(run) for run in self.runs]

    def _calibrate(self, run: Callable[[int], None]) -> Calibrated:
        run(1)  # compile / load from the cache, touch the pages
        return calibrate(run, self.timing, fixed_cost_check=False)

    def sample(self) -> None:
        """One more timed run of every point, small to large."""
        with numba_threads(self.numba_threads):
            for c in self.calibrated:
                c.run(1)
                c.time_once()

    def _point(self, i: int, t: Timing) -> tuple[float, float, float]:
        """(median, fastest, slowest) seconds per call of point ``i`` (on one thread: with
        experts, ``group`` calls at once)."""
        calls = self.cycles[i] / self.group
        per_call = summarize([s / (n * calls) for n, s in zip(t.counts, t.seconds, strict=True)])
        return per_call["median"], per_call["min"], per_call["max"]

    def _timed_alone(self, i: int) -> tuple[float, float, float]:
        """Point ``i`` timed again back to back (:func:`tern.probe.timing.timed_runs`)."""
        self.runs[i](1)
        return self._point(i, timed_runs(self.runs[i], self.timing, fixed_cost_check=False))

    def curve(self, retime: bool = True) -> OpCurve:
        """The curve of the samples taken; implausibly slow points (:func:`implausible_calls`)
        timed again back to back (``retime``; not for a curve of a cache-resident and a DRAM
        point only, whose jump is the measurement)."""
        points = [self._point(i, c.timing()) for i, c in enumerate(self.calibrated)]
        if retime:
            with numba_threads(self.numba_threads):
                points = retime_slow(points, lambda pts: implausible_calls(self.cycles, [p[0] for p in pts]),
                                     self._timed_alone, lambda p: p[0])
        return OpCurve(op=self.op, split=self.split, threads=self.numba_threads, rows=self.shape[0],
                       cols=self.shape[1], density=SKIP_DENSITY if self.op == "ternary_skip" else 1.0,
                       working_set_bytes=tuple(n * self.mat_bytes for n in self.cycles),
                       seconds=tuple(p[0] for p in points), seconds_min=tuple(p[1] for p in points),
                       seconds_max=tuple(p[2] for p in points))


def measure_curve(op: str, split: str, threads: int, working_sets: tuple[int, ...], buf: CurveBuffer,
                  timing: TimingConfig | None = None, seed: int = 0,
                  shape: tuple[int, int] | None = None, stream_prefetch: bool = True, retime: bool = True) -> OpCurve:
    """Seconds per matvec of ``op`` (run as ``split`` on ``threads`` threads) at each
    working set: a cycle of matrices of ``shape`` (default: the op's curve shape) adding up to
    it, ``timing.repeats`` samples of every point in turn (:class:`CurveRuns`; ``retime``: see
    :meth:`CurveRuns.curve`). ``stream_prefetch``: the streaming kernel's software prefetch
    (Engine.stream_prefetch)."""
    runs = CurveRuns(op, split, threads, working_sets, buf, timing, seed, shape, stream_prefetch)
    for _ in range(runs.timing.repeats):
        runs.sample()
    return runs.curve(retime)


KERNEL_REFERENCE_WS = 1 * MIB  # in L2 or L3 on every host seen: what it times is the core's speed


@lru_cache(maxsize=2)
def _reference_buffer(nbytes: int) -> CurveBuffer:
    """kernel_reference's weight bytes, written once per size and process (a sweep times
    the kernel before every point)."""
    return CurveBuffer(nbytes)


def kernel_reference(threads: int, rows: int = 1024, cols: int = 1024,
                     working_set_bytes: int = KERNEL_REFERENCE_WS) -> dict[str, float | int | str]:
    """The engine's 4-row ternary pass timed now on cache-resident matrices of (rows, cols)
    adding up to ``working_set_bytes``, as the probe's curve of it runs: one thread, or
    ``threads`` single-thread calls at once ("experts") beyond one: {op, split, threads,
    rows, cols, working_set_bytes, seconds_per_call}. Beside a decode measurement it says
    whether the cores run as fast as when the host was probed (a shared VM's cores slow
    down when a neighbour works, while its memory may read as fast as ever)."""
    if not (isinstance(threads, int) and threads >= 1):
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    for name, v in (("rows", rows), ("cols", cols), ("working_set_bytes", working_set_bytes)):
        if not (isinstance(v, int) and v >= 1):
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    split = "serial" if threads == 1 else "experts"
    buf = _reference_buffer(working_set_bytes + _weight_bytes("ternary_matvec", rows, cols) * threads)
    c = measure_curve("ternary_matvec", split, threads, (working_set_bytes,), buf,
                      timing=TimingConfig(min_time_s=0.03, repeats=5, warmup_s=0.01), shape=(rows, cols))
    return {"op": c.op, "split": c.split, "threads": c.threads, "rows": rows, "cols": cols,
            "working_set_bytes": c.working_set_bytes[0], "seconds_per_call": c.seconds[0]}


def curve_plan(threads: tuple[int, ...], quick: bool = False) -> list[tuple[str, str, int, tuple[int, int]]]:
    """(op, split, threads, matrix shape) of every curve a probe measures (quick: the
    1-thread ternary ones, without the row-heavy shape). The smaller and row-heavy shapes
    come last, so a reader that takes the first curve of an op finds the main shape."""
    if quick:
        ops = ("ternary_matvec", "ternary_stream", "ternary_blocked", "ternary_skip")
        return ([(op, "serial", 1, CURVE_SHAPES[op]) for op in ops]
                + [(op, "serial", 1, SMALL_CURVE_SHAPES[op]) for op in ops])
    plan = [(op, "serial", 1, shape) for op, shape in CURVE_SHAPES.items()]
    small = [(op, "serial", 1, shape) for op, shape in SMALL_CURVE_SHAPES.items()]
    for t in threads:
        if t > 1:
            plan += [(op, "rows", t, shape) for op, shape in PAR_CURVE_SHAPES.items()]
            plan += [(op, "experts", t, CURVE_SHAPES[op]) for op in EXPERT_OPS]
            small += [(op, "experts", t, SMALL_CURVE_SHAPES[op]) for op in EXPERT_OPS]
    rowy = [(op, "serial", 1, shape) for op, shape in ROWY_CURVE_SHAPES.items()]
    rowy += [(op, "experts", t, shape) for t in threads if t > 1 for op, shape in ROWY_CURVE_SHAPES.items()]
    return plan + small + rowy


def measure_op_curves(threads: tuple[int, ...] = (1,), quick: bool = False, progress: bool = True,
                      timing: TimingConfig | None = None, max_bytes: int | None = None,
                      stream_prefetch: bool | dict[str, bool] = True) -> list[OpCurve]:
    """Every curve of :func:`curve_plan` over the probe's working sets (``stream_prefetch``:
    the streaming kernel's software prefetch, the engine's on this host, per thread count:
    tern.core.engine_tuning.for_threads). Every point of every curve is set up and
    calibrated first; then ``timing.repeats`` rounds, each timing one run of every point of
    every curve (:class:`CurveRuns`), so each point's median spans the whole stage and a slow
    minute of a shared host widens every point's spread instead of setting one curve apart
    from the curves the predictor combines with it (the two or three shapes of one op)."""
    from tqdm import tqdm

    sets = QUICK_WORKING_SETS if quick else WORKING_SETS
    if max_bytes is not None:
        sets = tuple(w for w in sets if w <= max_bytes) or sets[:1]
    buf = CurveBuffer(max(sets))
    plan = curve_plan(threads, quick)
    timing = timing or CURVE_TIMING
    with tqdm(total=len(plan) * (1 + timing.repeats), desc="kernel curves", unit="curve", disable=not progress,
              leave=False, file=sys.stderr, mininterval=0.5) as bar:
        runs = []
        for op, split, t, shape in plan:
            runs.append(CurveRuns(op, split, t, sets, buf, timing, shape=shape,
                                  stream_prefetch=for_threads(stream_prefetch, t)))
            bar.update()
        for _ in range(timing.repeats):
            for r in runs:
                r.sample()
                bar.update()
        return [r.curve() for r in runs]


def render_curves(curves: list[OpCurve]) -> str:
    """Per curve: ns per weight byte at each working set (smaller is faster)."""
    lines = []
    for c in curves:
        per_byte = [s / _weight_bytes(c.op, c.rows, c.cols) * 1e9 / c.density for s in c.seconds]
        pts = " ".join(f"{_fmt_ws(w)}:{g:.3f}" for w, g in zip(c.working_set_bytes, per_byte, strict=True))
        lines.append(f"{c.op:<15} {c.rows:>5}x{c.cols:<5} {c.split:<8} t{c.threads}  ns/B  {pts}")
    return "\n".join(lines)


def _fmt_ws(n: int) -> str:
    e = int(math.log2(n))
    return f"{n >> 20}M" if e >= 20 else f"{n >> 10}K"
