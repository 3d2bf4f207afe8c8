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
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from functools import lru_cache

import numba
import numpy as np

from tern.core.engine_tuning import for_threads
from tern.core.host_caches import KIB, MIB
from tern.core.host_profile import OpCurve
from tern.core.host_queries import OP_WEIGHT_BYTES, ROUTER_OP
from tern.core.records import summarize
from tern.kernels.cache_guard import drop_stale_cache
from tern.probe.bandwidth import numba_threads
from tern.probe.curve_buffer import CurveBuffer
from tern.probe.op_drivers import engine_kernel_deps
from tern.probe.timing import RETIME_FACTOR, TimingConfig, retime_slow, timed_runs

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
SKIP_DENSITY = 0.25  # fraction of nonzero inputs of the skip kernel's curve
WORKING_SETS = tuple(int(256 * KIB * 2 ** i) for i in range(0, 10)) + (512 * MIB,)  # 256 KiB .. 128 MiB, 512 MiB
QUICK_WORKING_SETS = (256 * KIB, 2 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)


def _weight_bytes(op: str, rows: int, cols: int) -> int:
    """Bytes of weights one matrix of ``op`` stores (ternary2: 2 bits, int8: 1 B, fp16 / bf16: 2 B, fp32: 4 B)."""
    if op == "ternary_blocked":  # rows and columns padded to 16 (imported here: it builds numba intrinsics)
        from tern.kernels.kernels_blocked import blocked16_bytes
        return blocked16_bytes(rows, cols)
    if op.startswith("ternary"):  # whole bytes of 4 codes a row
        return rows * ((cols + 3) // 4)
    return int(rows * cols * OP_WEIGHT_BYTES.get(op, 4.0))  # an unknown op: _setup names the known ones


# ---- numba drivers: the cycle over the matrices runs inside numba ---------------------------
def _drivers() -> dict[str, Callable]:
    from tern.kernels import kernels_blocked as kb
    from tern.kernels import kernels_dense as kd
    from tern.kernels import kernels_stored as ks
    from tern.kernels import kernels_ternary as kt
    from tern.kernels import ops

    @numba.njit(cache=True)
    def blocked(P, order, S, xq, out, passes, par):
        """P (k, blocks, bytes per block): every matrix once per pass in ``order``, chained as the engine's step."""
        xs = np.float32(0.01)
        n = order.shape[0]
        for _ in range(passes):
            for i in range(n):
                if par:
                    kb.blocked16_matvec_par(P[order[i]], S, xq, xs, out)
                else:
                    kb.blocked16_matvec_next(P[order[i]], S, xq, xs, out, True, P[order[(i + 1) % n]])

    @numba.njit(cache=True, parallel=True)
    def blocked_experts(P, order, S, xq, outs, passes):
        """Groups of ``outs.shape[0]`` blocked16 matrices at once, one per thread slot (nothing chained)."""
        xs = np.float32(0.01)
        slots = outs.shape[0]
        for _ in range(passes):
            for base in range(0, P.shape[0] - slots + 1, slots):
                for c in numba.prange(slots):
                    kb.blocked16_matvec_next(P[order[base + c]], S, xq, xs, outs[c], True, kt.NO_NEXT)

    @numba.njit(cache=True)
    def ternary(P, order, S, xq, out, passes, par, skip, stream, prefetch):
        """P (k, rows, row_bytes): every matrix once per pass, in ``order`` (``prefetch``: the
        streaming kernel's software prefetch)."""
        xs = np.float32(0.01)
        for _ in range(passes):
            for m in order:
                if skip and par:
                    kt.ternary_matvec_skip_par(P[m], S, xq, xs, out)
                elif skip:
                    kt.ternary_matvec_skip(P[m], S, xq, xs, out)
                elif stream and par:
                    kt.ternary_matvec_stream_par(P[m], S, xq, xs, out, prefetch)
                elif stream:
                    kt.ternary_matvec_stream(P[m], S, xq, xs, out, prefetch)
                elif par:
                    kt.ternary_matvec_par(P[m], S, xq, xs, out)
                else:
                    kt.ternary_matvec(P[m], S, xq, xs, out)

    @numba.njit(cache=True, parallel=True)
    def ternary_experts(P, order, S, xq, outs, passes, skip, stream, prefetch):
        """Groups of ``outs.shape[0]`` matrices at once, one per thread slot, each with the
        single-thread kernel (the engine's expert-parallel routed experts)."""
        xs = np.float32(0.01)
        slots = outs.shape[0]
        for _ in range(passes):
            for base in range(0, P.shape[0] - slots + 1, slots):
                for c in numba.prange(slots):
                    m = order[base + c]
                    if skip:
                        kt.ternary_matvec_skip(P[m], S, xq, xs, outs[c])
                    elif stream:
                        kt.ternary_matvec_stream(P[m], S, xq, xs, outs[c], prefetch)
                    else:
                        kt.ternary_matvec(P[m], S, xq, xs, outs[c])

    @numba.njit(cache=True)
    def int8(W, order, S, x, out, passes, par):
        for _ in range(passes):
            for m in order:
                if par:
                    ops.matvec_int8w_par(W[m], S, x, out)
                else:
                    ops.matvec_int8w(W[m], S, x, out)

    @numba.njit(cache=True)
    def router(W, order, S, x, out, passes):
        for _ in range(passes):
            for m in order:
                ks._router_int8(W[m], S, x, out)

    @numba.njit(cache=True)
    def fp32(W, order, x, out, passes, par):
        for _ in range(passes):
            for m in order:
                if par:
                    kd.matvec_fp32_parallel_nb(W[m], x, out)
                else:
                    kd.matvec_fp32_nb(W[m], x, out)

    @numba.njit(cache=True)
    def w16(W, order, x, out, passes, par):
        for _ in range(passes):
            for m in order:
                if par:
                    ks.matvec_w16_par(W[m], x, out, False)
                else:
                    ks.matvec_w16(W[m], x, out, False)

    drop_stale_cache(__file__, engine_kernel_deps(), ternary)
    return {"ternary": ternary, "ternary_experts": ternary_experts, "blocked": blocked,
            "blocked_experts": blocked_experts, "int8": int8, "router": router, "fp32": fp32, "w16": w16}


@lru_cache(maxsize=1)
def drivers() -> dict[str, Callable]:
    return _drivers()


def _setup(op: str, split: str, threads: int, shape: tuple[int, int], n_mats: int, buf: CurveBuffer,
           rng: np.random.Generator, stream_prefetch: bool = True) -> Callable[[int], None]:
    d = drivers()
    f32 = np.float32
    r, c = shape
    par = split == "rows"
    order = rng.permutation(n_mats).astype(np.int64)  # routed experts come in no useful order
    if op == "ternary_blocked":
        from tern.kernels.kernels_blocked import blocked16_shape
        P = buf.view(np.uint8, (n_mats, *blocked16_shape(r, c)))
        xq, S = rng.integers(-127, 128, c).astype(np.int8), np.ones(r, f32)
        outs = np.zeros((threads, r), f32)  # an output per thread slot (serial: the first)
        if split == "experts":
            return lambda n: d["blocked_experts"](P, order, S, xq, outs, n)
        return lambda n: d["blocked"](P, order, S, xq, outs[0], n, par)
    if op.startswith("ternary"):
        rb = (c + 3) // 4
        P = buf.view(np.uint8, (n_mats, r, rb))
        skip, stream = op == "ternary_skip", op == "ternary_stream"
        if skip:  # (inputs r, outputs c): a quarter of the inputs nonzero, at random
            xq = np.where(rng.random(r) < SKIP_DENSITY, rng.integers(1, 128, r), 0).astype(np.int8)
            n_out = c
        else:
            xq = rng.integers(-127, 128, c).astype(np.int8)
            n_out = r
        S = np.ones(n_out, f32)
        if split == "experts":
            outs = np.zeros((threads, n_out), f32)
            return lambda n: d["ternary_experts"](P, order, S, xq, outs, n, skip, stream, stream_prefetch)
        out = np.zeros(n_out, f32)
        return lambda n: d["ternary"](P, order, S, xq, out, n, par, skip, stream, stream_prefetch)
    if op == "int8_matvec":
        W = buf.view(np.int8, (n_mats, r, c))
        S, x, out = np.ones(r, f32), rng.standard_normal(c).astype(f32), np.zeros(r, f32)
        return lambda n: d["int8"](W, order, S, x, out, n, par)
    if op == ROUTER_OP:
        W = buf.view(np.int8, (n_mats, r, c))
        S, x, out = np.full(r, 0.01, f32), rng.standard_normal(c).astype(f32), np.zeros(r, f32)
        return lambda n: d["router"](W, order, S, x, out, n)
    if op == "fp32_matvec":
        W = buf.view(np.float32, (n_mats, r, c))
        x, out = rng.standard_normal(c).astype(f32), np.zeros(r, f32)
        return lambda n: d["fp32"](W, order, x, out, n, par)
    if op == "w16_matvec":  # the buffer's bytes 0x30-0x3F read as fp16 bits are normal numbers (0.13-1.9)
        W = buf.view(np.uint16, (n_mats, r, c))
        x, out = rng.standard_normal(c).astype(f32), np.zeros(r, f32)
        return lambda n: d["w16"](W, order, x, out, n, par)
    raise ValueError(f"no working-set curve for op {op!r}; ops: {sorted(CURVE_SHAPES)}")


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


def measure_curve(op: str, split: str, threads: int, working_sets: tuple[int, ...], buf: CurveBuffer,
                  timing: TimingConfig | None = None, seed: int = 0,
                  shape: tuple[int, int] | None = None, stream_prefetch: bool = True, retime: bool = True) -> OpCurve:
    """Seconds per matvec of ``op`` (run as ``split`` on ``threads`` threads) at each
    working set: a cycle of matrices of ``shape`` (default: the op's curve shape) adding up to
    it. Implausibly slow points (:func:`implausible_points`) are timed again (``retime``; not
    for a curve of a cache-resident and a DRAM point only, whose jump is the measurement).
    ``stream_prefetch``: the streaming kernel's software prefetch (Engine.stream_prefetch)."""
    timing = timing or TimingConfig(min_time_s=0.03, repeats=3, warmup_s=0.01)
    if shape is None:
        shape = (PAR_CURVE_SHAPES if split == "rows" else CURVE_SHAPES)[op]
    mat_bytes = _weight_bytes(op, *shape)
    group = threads if split == "experts" else 1
    rng = np.random.default_rng(seed)
    cycles: list[int] = []  # matrices per cycle of each point
    for ws in working_sets:
        n_mats = max(group, int(round(ws / mat_bytes)) // group * group)
        if n_mats * mat_bytes > buf.data.size or (cycles and n_mats <= cycles[-1]):
            continue  # too large for the buffer, or the same cycle as the last point
        cycles.append(n_mats)
    runs = [_setup(op, split, threads, shape, n, buf, rng, stream_prefetch) for n in cycles]

    def timed(i: int) -> tuple[float, float, float]:
        runs[i](1)  # compile / load from the cache, touch the pages
        t = timed_runs(runs[i], timing, fixed_cost_check=False)
        calls = cycles[i] / group  # seconds per call on one thread: with experts, ``group`` at once
        per_call = summarize([s / (c * calls) for c, s in zip(t.counts, t.seconds, strict=True)])
        return per_call["median"], per_call["min"], per_call["max"]

    with numba_threads(threads if split != "serial" else 1):
        sizes = [n * mat_bytes for n in cycles]
        points = [timed(i) for i in range(len(cycles))]
        if retime:
            points = retime_slow(points, lambda pts: implausible_calls(cycles, [p[0] for p in pts]), timed,
                                 lambda p: p[0])
    return OpCurve(op=op, split=split, threads=threads if split != "serial" else 1, rows=shape[0],
                   cols=shape[1], density=SKIP_DENSITY if op == "ternary_skip" else 1.0,
                   working_set_bytes=tuple(sizes), seconds=tuple(p[0] for p in points),
                   seconds_min=tuple(p[1] for p in points), seconds_max=tuple(p[2] for p in points))


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
    tern.core.engine_tuning.for_threads)."""
    from tqdm import tqdm

    sets = QUICK_WORKING_SETS if quick else WORKING_SETS
    if max_bytes is not None:
        sets = tuple(w for w in sets if w <= max_bytes) or sets[:1]
    buf = CurveBuffer(max(sets))
    plan = curve_plan(threads, quick)
    out = []
    for op, split, t, shape in tqdm(plan, desc="kernel curves", unit="curve", disable=not progress, leave=False,
                                    file=sys.stderr, mininterval=0.5):
        out.append(measure_curve(op, split, t, sets, buf, timing, shape=shape,
                                 stream_prefetch=for_threads(stream_prefetch, t)))
    return out


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
