"""Engine operation costs: the probe's measured compute side of a decoded token.

The bandwidth curve says how fast bytes arrive; this says how long the engine's own
operations take once they have arrived. Each operation the per-token loop runs
(tern.kernels.ops) is timed here on this host, on cache-resident data (at most ~0.5 MiB,
inside L2 on current CPUs), in a numba loop (no Python call in the timed path), at
several sizes, and a linear cost model is fitted (non-negative least squares, seconds):

=================  ====================================================  ================
op                 timed function                                        cost model
=================  ====================================================  ================
ternary_matvec     kernels_ternary.ternary_matvec(_par)                  call + row x rows + unit x weights
ternary_stream     kernels_ternary.ternary_matvec_stream(_par) (one row    call + row x rows + unit x weights
                   per pass: long rows of DRAM-resident pools)
ternary_blocked    kernels_blocked.blocked16_matvec(_next/_par): the      call + row x rows + unit x weights
                   blocked16 layout (Engine(layout="auto") on AVX-512)
ternary_skip       kernels_ternary.ternary_matvec_skip(_par), every     call + row x outputs + unit x nonzero
                   shape with all inputs and a quarter of them nonzero  inputs' weights + input x inputs
                   (skipped inputs' rows are not read, but every input
                   is listed: its skip_groups pass; the per-output cost
                   is the accumulator set-up and scaling)
int8_matvec        ops.matvec_int8w(_par) (int8 embedding / head)         call + row x rows + unit x weights
fp32_matvec        kernels_dense.matvec_fp32_nb(_parallel_nb) (fp32 head) call + row x rows + unit x weights
w16_matvec         kernels_stored.matvec_w16(_par): fp16 / bf16 heads,    call + row x rows + unit x weights
                   tables and routers, 2 bytes a weight (timed as fp16;
                   bf16 widens by a shift where fp16 converts)
router_int8        kernels_stored._router_int8: an int8 router, each row  call + row x rows + unit x weights
                   dequantized into an L1 row and summed by the fp32 row
                   dot (1 thread only: the one-region step splits its
                   rows into single-thread items)
ssm_step           ops.selective_scan_step (dt projection + scan)        call + row x d_inner*dt_rank + unit x d_inner*d_state
attention          ops.attend (all heads, n cached positions)            call + unit x n*d_model
vector             ops.rmsnorm + quant.quantize_act of one vector        call + unit x length
region_phase       the one-region step's frame (threads > 1 only): its   call + unit x phases
                   counters reset, one numba parallel region entered,
                   and empty single-item phases (claim, finish, wait:
                   tern.kernels.region) walked by every thread
=================  ====================================================  ================

A third term ``tail x tails`` (:func:`tail_units`) covers what the first two do not: the
ternary matvecs' rows whose column count is not a multiple of 256 (the last, partial
segment takes masked loads), the skip kernel's input rows over such outputs, the SSM
step's per-channel work and attention's per-(position, head) work.

``row`` is a per-row (per-channel) cost: short rows pay it once per row whatever their
length, which is why small matrices run far below a kernel's large-shape G ops/s.
Matvecs are also timed with ``threads`` > 1 through their parallel variants (the engine
splits only matrices of at least ``PAR_MIN_WEIGHTS`` weights over threads, so these are
timed at sizes above that). The roofline (tern.predict.roofline) adds these costs per token.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import numpy as np

from tern.core.engine_tuning import for_threads
from tern.core.host_profile import OpCost
from tern.core.host_queries import ROUTER_OP
from tern.core.records import summarize
from tern.kernels.attention import SCORE_PAD
from tern.kernels.kernels_dense import column_blocks
from tern.kernels.region import phase_counters
from tern.probe.bandwidth import numba_threads
from tern.probe.op_drivers import drivers
from tern.probe.timing import RETIME_FACTOR, TimingConfig, retime_slow, timed_runs

MATVEC_OPS = ("ternary_matvec", "ternary_stream", "ternary_blocked", "ternary_skip", "int8_matvec", "fp32_matvec",
              "w16_matvec")
# ROUTER_OP: timed at 1 thread only (tern.predict.inventory prices its items there)
OPS = MATVEC_OPS + (ROUTER_OP, "ssm_step", "attention", "vector")
REGION_OP = "region_phase"  # timed at threads > 1 only (tern.predict.inventory prices it there)
_REGION_PHASES = (4, 32, 128, 512)

# (rows, cols) shapes, all cache-resident: rows x cols / 4 bytes ternary, x 1 int8, x 4 fp32, x 2 w16
_MATVEC_SHAPES = {
    "ternary": ((32, 256), (256, 256), (1024, 256), (64, 1024), (512, 1024), (128, 4096), (1024, 2048),
                (512, 384), (1536, 384), (256, 640), (768, 1152)),  # the last four: partial segments
    "int8": ((64, 256), (512, 256), (1024, 256), (256, 1024), (128, 2048)),
    "fp32": ((64, 256), (512, 128), (256, 512), (128, 1024)),
    "w16": ((64, 256), (512, 256), (256, 1024), (128, 2048)),
    # routers: E experts x d_model (the sweep's 4m family has up to 2,676 x 256; the 10B picks 256 x 1,024)
    "router": ((64, 256), (512, 256), (2048, 256), (256, 1024), (128, 2048)),
}
# parallel variants: the engine splits only matrices of >= PAR_MIN_WEIGHTS (1M) weights
_PAR_SHAPES = {
    "ternary": ((1024, 1024), (2048, 1024), (1024, 2048), (4096, 1024), (512, 4096), (8192, 2048), (2048, 8192),
                (4096, 384), (2048, 640)),
    "int8": ((1024, 1024), (2048, 512), (512, 2048)),
    "fp32": ((1024, 1024), (512, 2048)),
    "w16": ((1024, 1024), (512, 2048)),
}
_QUICK_SHAPES = {
    "ternary": ((32, 256), (1024, 256), (128, 4096), (1536, 384)),
    "int8": ((64, 256), (1024, 256), (128, 2048)),
    "fp32": ((64, 256), (512, 128), (128, 1024)),
    "w16": ((64, 256), (512, 256), (128, 2048)),
    "router": ((64, 256), (2048, 256), (128, 2048)),
}
# (Di, N, R); dt_rank R varies apart from Di so the fit separates the dt projection (Di x R)
# from the scan (Di x N)
_SSM_SHAPES = ((256, 16, 16), (512, 16, 32), (1024, 16, 64), (512, 8, 32), (256, 32, 16), (512, 16, 128),
               (768, 16, 24), (1536, 16, 48),
               (1024, 16, 128))
_SSM_QUICK = (0, 4, 5)
_ATTN_SHAPES = ((256, 4, 32), (256, 4, 128), (512, 8, 128), (512, 8, 64), (1024, 16, 64), (384, 6, 128),
                (768, 12, 64), (384, 12, 128))  # (D, heads, n)
_VECTOR_SIZES = (128, 512, 2048, 8192)
# the skip kernel's shapes carry the percentage of nonzero inputs: at two densities the fit tells the
# listing of every input (input_s) from the rows of the nonzero ones (unit_s); 25: a dReLU's at random init
_SKIP_PCTS = (100, 25)


def skip_nonzero(inputs: int, pct: int) -> int:
    """Nonzero inputs of a skip-kernel shape timed at ``pct`` percent (at least one)."""
    return max(1, round(inputs * pct / 100))


# ---- one op at one size ---------------------------------------------------------------------
@dataclass(frozen=True)
class OpSample:
    op: str
    threads: int
    rows: int  # per-row units (rows of a matrix, d_inner x dt_rank of an SSM step; 0 where none)
    units: float  # the per-unit count (weights, d_inner x d_state, n x d_model, length)
    seconds: float  # median seconds per call
    tails: int = 0  # rows whose last 256-column segment is partial (ternary matvecs)
    inputs: int = 0  # inputs the skip kernel lists, zero or not (0: other ops)


def _setup(op: str, shape: tuple[int, ...], threads: int, rng: np.random.Generator, stream_prefetch: bool = True):
    """(run(count), rows, units) for one op at one shape (``stream_prefetch``: Engine.stream_prefetch)."""
    from tern.kernels.packing import random_ternary2

    d = drivers()
    f32 = np.float32
    par = threads > 1
    if op in ("ternary_matvec", "ternary_stream"):
        r, c = shape
        P = random_ternary2(r, c, seed=int(rng.integers(1 << 30)))
        S, xq, out = np.ones(r, f32), rng.integers(-127, 128, c).astype(np.int8), np.zeros(r, f32)
        stream = op == "ternary_stream"
        return (lambda n: d["ternary"](P, S, xq, out, n, par, False, stream, stream_prefetch)), r, float(r * c)
    if op == "ternary_blocked":
        from tern.kernels.kernels_blocked import pack_blocked16

        r, c = shape
        P = pack_blocked16(random_ternary2(r, c, seed=int(rng.integers(1 << 30))), c)
        S, xq, out = np.ones(r, f32), rng.integers(-127, 128, c).astype(np.int8), np.zeros(r, f32)
        return (lambda n: d["blocked"](P, S, xq, out, n, par)), r, float(r * c)
    if op == "ternary_skip":
        h, dd, pct = shape  # H inputs (rows of the transposed matrix), D outputs, percent nonzero
        Pt = random_ternary2(h, dd, seed=int(rng.integers(1 << 30)))
        nz = skip_nonzero(h, pct)
        hq = np.zeros(h, np.int8)  # nz inputs nonzero at random places, the rest skipped
        hq[rng.choice(h, nz, replace=False)] = rng.integers(1, 128, nz).astype(np.int8)
        S, out = np.ones(dd, f32), np.zeros(dd, f32)
        return (lambda n: d["ternary"](Pt, S, hq, out, n, par, True, False, False)), dd, float(nz * dd)
    if op == "int8_matvec":
        r, c = shape
        W = rng.integers(-127, 128, (r, c)).astype(np.int8)
        S, x, out = np.ones(r, f32), rng.standard_normal(c).astype(f32), np.zeros(r, f32)
        return (lambda n: d["int8"](W, S, x, out, n, par)), r, float(r * c)
    if op == ROUTER_OP:
        r, c = shape
        W = rng.integers(-127, 128, (r, c)).astype(np.int8)
        S = (0.01 * (1.0 + rng.random(r))).astype(f32)
        x, out = rng.standard_normal(c).astype(f32), np.zeros(r, f32)
        return (lambda n: d["router"](W, S, x, out, n)), r, float(r * c)
    if op == "fp32_matvec":
        r, c = shape
        W = rng.standard_normal((r, c)).astype(f32)
        x, out = rng.standard_normal(c).astype(f32), np.zeros(r, f32)
        return (lambda n: d["fp32"](W, x, out, n, par)), r, float(r * c)
    if op == "w16_matvec":
        r, c = shape
        W = rng.standard_normal((r, c)).astype(np.float16).view(np.uint16)  # fp16 bits, as stored
        x, out = rng.standard_normal(c).astype(f32), np.zeros(r, f32)
        return (lambda n: d["w16"](W, x, out, n, par)), r, float(r * c)
    if op == "ssm_step":
        di, ns, rk = shape
        dtw = column_blocks((0.1 * rng.standard_normal((di, rk))).astype(f32))  # as the engine re-packs it
        AT = -np.abs(rng.standard_normal((ns, di))).astype(f32)
        hT, dbc = np.zeros((ns, di), f32), rng.standard_normal(rk + 2 * ns).astype(f32)
        uc = rng.standard_normal(di).astype(f32)
        z, dt, y, dtb, Dp = uc.copy(), np.zeros(di, f32), np.zeros(di, f32), np.zeros(di, f32), np.ones(di, f32)
        return (lambda n: d["ssm"](dtw, dtb, AT, Dp, hT, dbc, uc, z, dt, y, n)), di * rk, float(di * ns)
    if op == "attention":
        dm, nh, npos = shape
        kc = rng.standard_normal(npos * dm).astype(f32)  # one block of every head, slot-major, as the engine's one thread
        vc = rng.standard_normal(npos * dm).astype(f32)
        uz, sc, y = rng.standard_normal(3 * dm).astype(f32), np.zeros(nh * (npos + SCORE_PAD), f32), np.zeros(dm, f32)
        args = (uz, kc, vc, np.int64(dm), np.int64(npos), np.int64(nh), np.int64(npos - 1), sc, y)
        return (lambda n: d["attn"](*args, n)), 0, float(npos * dm)
    if op == "vector":
        (length,) = shape
        x, g = rng.standard_normal(length).astype(f32), np.ones(length, f32)
        xn, xq = np.zeros(length, f32), np.zeros(length, np.int8)
        return (lambda n: d["vector"](x, g, xn, xq, n)), 0, float(length)
    if op == REGION_OP:
        (phases,) = shape
        ctr = phase_counters(phases)
        return (lambda n: d["region"](ctr, phases, threads, n)), 0, float(phases)
    raise ValueError(f"unknown op {op!r}; ops: {OPS}")


def op_shapes(op: str, threads: int = 1, quick: bool = False) -> tuple[tuple[int, ...], ...]:
    """Sizes an op is timed at (see the module table)."""
    if op in MATVEC_OPS:
        fam = {"ternary_matvec": "ternary", "ternary_stream": "ternary", "ternary_skip": "ternary",
               "ternary_blocked": "ternary", "int8_matvec": "int8",
               "fp32_matvec": "fp32", "w16_matvec": "w16"}[op]
        base = (_PAR_SHAPES[fam][:3] if quick else _PAR_SHAPES[fam]) if threads > 1 else \
            (_QUICK_SHAPES if quick else _MATVEC_SHAPES)[fam]
        return tuple((*sh, pct) for sh in base for pct in _SKIP_PCTS) if op == "ternary_skip" else base
    if op == ROUTER_OP:  # one thread: its items run the single-thread kernel
        return (_QUICK_SHAPES if quick else _MATVEC_SHAPES)["router"] if threads == 1 else ()
    if op == "ssm_step":
        return tuple(_SSM_SHAPES[i] for i in _SSM_QUICK) if quick else _SSM_SHAPES
    if op == "attention":
        return _ATTN_SHAPES[:3] if quick else _ATTN_SHAPES
    if op == "vector":
        return tuple((n,) for n in (_VECTOR_SIZES[:2] + _VECTOR_SIZES[-1:] if quick else _VECTOR_SIZES))
    if op == REGION_OP:
        return tuple((n,) for n in (_REGION_PHASES[::3] if quick else _REGION_PHASES))
    raise ValueError(f"unknown op {op!r}; ops: {OPS}")


def time_op(op: str, shape: tuple[int, ...], threads: int = 1, timing: TimingConfig | None = None,
            seed: int = 0, stream_prefetch: bool = True) -> OpSample:
    """Median seconds per call of ``op`` at ``shape`` on ``threads`` threads (``stream_prefetch``:
    the streaming kernel's, as Engine.stream_prefetch)."""
    timing = timing or TimingConfig(min_time_s=0.02, repeats=3, warmup_s=0.005)
    rng = np.random.default_rng(seed)
    with numba_threads(threads):
        run, rows, units = _setup(op, shape, threads, rng, stream_prefetch)
        t = timed_runs(run, timing, fixed_cost_check=threads > 1)
    per_call = summarize([s / c for c, s in zip(t.counts, t.seconds, strict=True)])
    return OpSample(op, threads, rows, units, per_call["median"], tail_units(op, shape),
                    shape[0] if op == "ternary_skip" else 0)


def tail_units(op: str, shape: tuple[int, ...]) -> int:
    """The third term of an op's cost at ``shape`` (OpCost.tail_s): ternary matvecs, rows
    whose last 256-column segment is partial (masked loads); the skip kernel, input rows
    whose outputs end in a partial segment; the SSM step, its channels (element-wise work
    per channel: gating, D skip); attention, its (position, head) pairs (scores, softmax)."""
    if op in ("ternary_matvec", "ternary_stream"):
        return shape[0] if shape[1] % 256 else 0
    if op == "ternary_skip":  # (inputs, outputs, percent nonzero): the nonzero inputs
        return skip_nonzero(shape[0], shape[2]) if shape[1] % 256 else 0
    if op == "ssm_step":
        return shape[0]
    if op == "attention":
        return shape[1] * shape[2]
    return 0


# ---- fitting -------------------------------------------------------------------------------
def nnls(A: np.ndarray, b: np.ndarray, iters: int = 200) -> np.ndarray:
    """Non-negative least squares min |A x - b| (x >= 0) by active-set elimination: solve,
    drop the most negative coefficient, repeat (A is small: a few columns)."""
    A, b = np.asarray(A, float), np.asarray(b, float)
    active = list(range(A.shape[1]))
    x = np.zeros(A.shape[1])
    for _ in range(iters):
        if not active:
            break
        sol, *_ = np.linalg.lstsq(A[:, active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return x


def fit_cost(samples: list[OpSample]) -> OpCost:
    """Fit seconds = call + row x rows + unit x units to samples of one op and thread
    count. Rows are weighted by 1/seconds (relative error is what predictions feel)."""
    if not samples:
        raise ValueError("no samples to fit")
    op, threads = samples[0].op, samples[0].threads
    if any(s.op != op or s.threads != threads for s in samples):
        raise ValueError("fit_cost needs samples of one op and thread count")
    has_rows = any(s.rows for s in samples)
    has_tails = any(s.tails for s in samples)
    has_inputs = any(s.inputs for s in samples)
    cols = [[1.0, float(s.rows), s.units, float(s.tails), float(s.inputs)] for s in samples]
    keep = [0] + ([1] if has_rows else []) + [2] + ([3] if has_tails else []) + ([4] if has_inputs else [])
    A = np.array(cols)[:, keep] / np.array([[s.seconds] for s in samples])
    x = np.zeros(5)
    x[keep] = nnls(A, np.ones(len(samples)))
    call, row, unit, tail, inp = (float(v) for v in x)
    cost = OpCost(op=op, threads=threads, call_s=call, row_s=row, unit_s=unit, samples=len(samples),
                  max_rel_err=0.0, tail_s=tail, input_s=inp)
    pred = np.array([cost.seconds(1, s.rows, s.units, s.tails, s.inputs) for s in samples])
    meas = np.array([s.seconds for s in samples])
    return dataclasses.replace(cost, max_rel_err=float(np.max(np.abs(pred / meas - 1))))


def slow_samples(samples: list[OpSample]) -> list[int]:
    """Indices of samples whose seconds exceed RETIME_FACTOR x the fit of all samples (timed
    again: tern.probe.timing.retime_slow)."""
    if len(samples) < 3:
        return []
    c = fit_cost(samples)
    return [i for i, s in enumerate(samples)
            if s.seconds > RETIME_FACTOR * c.seconds(1, s.rows, s.units, s.tails, s.inputs)]


def measure_op_costs(threads: tuple[int, ...] = (1,), quick: bool = False, progress: bool = True,
                     timing: TimingConfig | None = None,
                     stream_prefetch: bool | dict[str, bool] = True) -> list[OpCost]:
    """Time every op at its sizes (matvecs also at each thread count > 1) and fit costs;
    samples far slower than their fit (:func:`slow_samples`) are timed again first.
    ``stream_prefetch``: the streaming kernel's software prefetch (the engine's on this host;
    per thread count: tern.core.engine_tuning.for_threads)."""
    from tqdm import tqdm

    plan = [(op, 1, shape) for op in OPS for shape in op_shapes(op, 1, quick)]
    plan += [(op, t, shape) for t in threads if t > 1 for op in MATVEC_OPS + (REGION_OP,)
             for shape in op_shapes(op, t, quick)]
    by_key: dict[tuple[str, int], list[tuple[tuple[int, ...], OpSample]]] = {}
    for op, t, shape in tqdm(plan, desc="engine op costs", unit="size", disable=not progress, leave=False,
                             file=sys.stderr, mininterval=0.5):
        by_key.setdefault((op, t), []).append((shape, time_op(op, shape, t, timing,
                                                              stream_prefetch=for_threads(stream_prefetch, t))))
    costs = []
    for (op, t), timed in by_key.items():
        shapes = [shape for shape, _ in timed]
        samples = retime_slow([x for _, x in timed], slow_samples,
                              lambda i, op=op, t=t, shapes=shapes: time_op(op, shapes[i], t, timing,
                                                                           stream_prefetch=for_threads(stream_prefetch, t)),
                              lambda x: x.seconds)
        costs.append(fit_cost(samples))
    return costs


def render_costs(costs: list[OpCost]) -> str:
    lines = [f"{'op':<15} {'thr':>3} {'call us':>8} {'row ns':>8} {'unit ps':>8} {'tail ns':>8} {'input ns':>8} "
             f"{'fit err':>8}"]
    for c in costs:
        lines.append(f"{c.op:<15} {c.threads:>3} {c.call_s * 1e6:>8.3f} {c.row_s * 1e9:>8.3f} {c.unit_s * 1e12:>8.2f} "
                     f"{c.tail_s * 1e9:>8.3f} {c.input_s * 1e9:>8.3f} {100 * c.max_rel_err:>7.1f}%")
    return "\n".join(lines)
