"""Ternary matvec kernel table: every variant, the fp32 / int8 baselines, shapes, threads.

    .venv/bin/python benchmarks/ternary_matvec.py            # full table (a few minutes)
    .venv/bin/python benchmarks/ternary_matvec.py --quick    # small shapes, short timings

Rows (JSONL, appended to results/bench/kernels.jsonl by default) carry
tern.core.records.run_metadata, the kernel, shape, threads, weight bytes per call and the
summaries (tern.core.records.summarize: repeats, median, min, max, iqr, spread_rel) of
``gops_per_s`` (2 ops per weight: multiply + add) and ``gbps`` (weight bytes read per
second, 1e9 bytes). Sections:

* ``compute``: every registered ternary variant + fp32_matvec + int8_matvec on
  (14336, 4096) and (4096, 14336) — cache-resident for the ternary layouts (~14.7 MB);
* ``skip``: the activation-skip kernel (transposed down projection of a 4096 x 14336
  matrix) at several fractions of nonzero inputs, ops counted dense-equivalent;
* ``dram``: the stored-layout kernels on a >= 256 MiB packed matrix next to the probe's
  read-bandwidth kernel at the same working set (``pct_of_read_gbps``);
* ``b3`` (``--b3``, run alone): the base-3 kernel (tern.kernels.kernels_b3, 1.6 bits per
  weight, read as stored; the activation permutation it needs is timed inside every call)
  against the ternary2 kernels on the same matrix expanded to 2 bits, on (4096, 14336)
  (cache-resident) and a DRAM matrix of >= ``--dram-bytes`` ternary2 bytes, with the
  effective weights per second (``gweights_per_s``) that decide which is faster;
* ``prefetch`` (``--prefetch``, run alone): the ternary2 4-row pass ("ternary2") and the
  one-row streaming pass ("ternary2_stream") with software prefetch off and on
  (kt.ternary_matvec_rows / _par, same sums) on (4096, 14336) (cache-resident) and the
  DRAM matrix of the b3 section, each on/off pair timed back to back, ``--rounds`` times,
  next to the probe's read kernel at the DRAM working set (``pct_of_read_gbps``);
* ``distance`` (``--prefetch-distance 4096,8192``, run alone): the ternary2 4-row and one-row
  passes with their software prefetch compiled for each distance (bytes ahead; the engine's
  is tern.kernels.prefetch.PREFETCH_MIN_BYTES), on an 8 MiB (cache-resident) and a
  >= ``--dram-bytes`` matrix of every ``--row-bytes`` row length, the distances interleaved
  run by run in one process so a drifting host moves them alike (``prefetch_bytes``); with
  ``--prefetch-level l1,l2`` each distance into each cache level (``prefetch_level``);
* ``rowlen`` (``--row-length``, run alone): the 4-row "simd" pass against the one-row "stream" pass
  on >= 256 MiB matrices whose packed rows hold 128 B .. 8 KB — how fast each streams
  DRAM against row length (the rule tern.kernels.policy.STREAM_MIN_ROW_BYTES rests on) —
  and the engine's default kernel on a 128 KiB matrix of each row length (section
  ``rowlen_cache``: L2-resident, an expert matrix's size), its compute rate without DRAM:
  how much faster than DRAM the kernel computes decides how far compute can hide behind
  the loads. Intel Xeon VM, 1 thread (session 16, ``--row-length --threads 1 --row-bytes
  128,256,512,1024,2048``): 20.5 / 24.5 / 25.6 / 27.2 / 26.6 GB/s cache-resident at 128 B ..
  2 KB rows (the Python call included), 9.8-16.6 GB/s from DRAM, read plateau 18.3 GB/s:
  the kernel computes only ~1.5x faster than DRAM delivers there.

Timing: tern.probe.timing.timed_runs (warm-up, >= min_time_s per run, >= 5 repeats).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numba
import numpy as np
from tqdm.auto import tqdm

from tern.core.engine_tuning import stream_prefetch_choice
from tern.core.records import append_jsonl, run_metadata, summarize
from tern.kernels import kernels_b3 as kb
from tern.kernels import kernels_ternary as kt
from tern.kernels.packing import random_ternary2
from tern.kernels.prefetch import PREFETCH_LEVELS, ROW_PREFETCH_LEVEL, prefetch_level_setting
from tern.kernels.simd import HAS_VBMI, ROW_DOT_ISA
from tern.probe import kernel_table as kernel_bench
from tern.probe import ternary_variants as tv
from tern.probe.bandwidth import SweepBuffers, check_threads, measure_point, numba_threads
from tern.probe.timing import TimingConfig, timed_runs

COMPUTE_SHAPES = ((14336, 4096), (4096, 14336))
QUICK_SHAPES = ((4096, 4096),)
SKIP_SHAPE = (4096, 14336)  # (D outputs, H inputs) of a down projection
SKIP_NONZERO = (1.0, 0.5, 0.25, 0.1)
DRAM_MIN_BYTES = 256 * 2**20
BASELINES = ("fp32_matvec", "int8_matvec")
B3_SHAPES = ((4096, 14336),)  # + the DRAM shape b3_dram_shape(--dram-bytes)
B3_KERNELS = ("ternary2", "ternary2_stream", "b3")
ROW_LENGTH_BYTES = (128, 256, 320, 512, 640, 1024, 2560, 4096, 6144, 8192)  # packed bytes per row, rowlen section


def _time_call(call, weight_bytes: int, ops: int, timing: TimingConfig) -> dict:
    call()  # compile / load from cache

    def run(count: int) -> None:
        for _ in range(count):
            call()

    t = timed_runs(run, timing)
    calls_per_s = t.rates(1.0)
    return {"gops_per_s": summarize([c * ops / 1e9 for c in calls_per_s]),
            "gbps": summarize([c * weight_bytes / 1e9 for c in calls_per_s]),
            "us_per_call": summarize([1e6 / c for c in calls_per_s]),
            "weight_bytes": int(weight_bytes), "ops_per_call": int(ops)}


def measure(kernel: str, rows: int, cols: int, threads: int, timing: TimingConfig, section: str,
            seed: int = 0) -> dict:
    """One row: a tern.probe.kernel_table kernel at one shape and thread count."""
    setup = kernel_bench.get_setup(kernel)
    with numba_threads(threads):
        call, wb, ops = setup(rows, cols, threads, np.random.default_rng(seed))
        res = _time_call(call, wb, ops, timing)
    return {"section": section, "kernel": kernel, "rows": rows, "cols": cols, **res}


def measure_skip(nonzero: float, threads: int, timing: TimingConfig, seed: int = 0) -> dict:
    """The skip kernel on a transposed (H, D/4) down projection; ops dense-equivalent."""
    d, h = SKIP_SHAPE
    rng = np.random.default_rng(seed)
    packed_t = random_ternary2(h, d, seed=seed)  # (H, ceil(D/4)) = W.T
    rs = rng.random(d, dtype=np.float32) + np.float32(0.5)  # (D,)
    xq = rng.integers(-127, 128, size=h, dtype=np.int8)  # (H,)
    xq[rng.random(h) >= nonzero] = 0
    out = np.empty(d, dtype=np.float32)
    fn = kt.ternary_matvec_skip if threads == 1 else kt.ternary_matvec_skip_simd_par
    if threads > 1 and kt.DEFAULT_VARIANT != "simd":
        raise ValueError("the parallel skip kernel needs the simd variant")
    with numba_threads(threads):
        res = _time_call(lambda: fn(packed_t, rs, xq, np.float32(0.01), out),
                         int(np.count_nonzero(xq)) * packed_t.shape[1] + rs.nbytes, 2 * d * h, timing)
    return {"section": "skip", "kernel": "ternary_skip", "rows": d, "cols": h,
            "nonzero_frac": float(np.count_nonzero(xq) / h), **res}


@numba.njit(parallel=True, cache=True)
def _expand_b3(b3, cols, out):
    """b3 (rows, ceil(cols/5)) -> ternary2 (rows, cols/4) for cols a multiple of 256 (full
    segments: column c in byte 64 (c // 256) + c % 64, bits 2 ((c % 256) // 64))."""
    for r in numba.prange(b3.shape[0]):
        for j in range(out.shape[1]):
            out[r, j] = 0
        for c in range(cols):
            v = np.int32(b3[r, c // 5])
            for _ in range(c % 5):
                v //= 3
            out[r, 64 * (c // 256) + c % 64] |= np.uint8((v % 3) << (2 * ((c % 256) // 64)))


def b3_matrices(rows: int, cols: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A random b3 matrix (every byte 0..242) and the same trits in the ternary2 layout."""
    if cols % 256:
        raise ValueError(f"b3 section: cols must be a multiple of 256, got {cols}")
    rng = np.random.default_rng(seed)
    b3 = np.empty((rows, (cols + 4) // 5), np.uint8)
    for r0 in range(0, rows, 4096):
        b3[r0:r0 + 4096] = rng.integers(0, 243, size=b3[r0:r0 + 4096].shape, dtype=np.uint8)
    if cols % 5:  # padding trits: code 1 (what pack_ternary_b3 writes)
        last = b3[:, -1].astype(np.int32)
        keep = 3 ** (cols % 5)
        b3[:, -1] = (last % keep + sum(3**k for k in range(cols % 5, 5))).astype(np.uint8)
    t2 = np.empty((rows, cols // 4), np.uint8)
    _expand_b3(b3, cols, t2)
    return b3, t2


def measure_b3(kernel: str, b3: np.ndarray | None, t2: np.ndarray, cols: int, threads: int, timing: TimingConfig,
               seed: int = 0, prefetch: bool | None = None) -> dict:
    """One b3-section row: ``kernel`` ("ternary2", "ternary2_stream" or "b3") on the matrix;
    ``prefetch`` True / False: the ternary2 passes with software prefetch on / off
    (kt.ternary_matvec_rows; None: the default kernels, kt.ROW_PREFETCH, and the engine's
    streaming kernel with this host's choice, tern.core.engine_tuning)."""
    rows = t2.shape[0]
    rng = np.random.default_rng(seed)
    rs = rng.random(rows, dtype=np.float32) + np.float32(0.5)
    xq = rng.integers(-127, 128, size=cols, dtype=np.int8)
    xs = np.float32(0.01)
    out = np.empty(rows, dtype=np.float32)
    par = threads > 1
    if kernel == "b3":
        xp = np.empty(kb.b3_act_len(cols), np.int8)
        fn = kb.b3_matvec_xp_par if par else kb.b3_matvec_xp

        def call():
            kb.b3_permute(xq, xp)  # once per activation in the engine: counted here
            fn(b3, rs, xp, xs, out)
        weight_bytes = b3.nbytes
    elif prefetch is not None:
        fn = kt.ternary_matvec_rows_par if par else kt.ternary_matvec_rows
        one_row = kernel == "ternary2_stream"

        def call():
            fn(t2, rs, xq, xs, out, one_row, prefetch)
        weight_bytes = t2.nbytes
    elif kernel == "ternary2_stream":  # the engine's streaming kernel, with this host's prefetch choice
        fn = kt.ternary_matvec_stream_par if par else kt.ternary_matvec_stream
        pf = stream_prefetch_choice(threads)

        def call():
            fn(t2, rs, xq, xs, out, pf)
        weight_bytes = t2.nbytes
    else:
        fn = kt.ternary_matvec_par if par else kt.ternary_matvec

        def call():
            fn(t2, rs, xq, xs, out)
        weight_bytes = t2.nbytes
    with numba_threads(threads):
        res = _time_call(call, weight_bytes, 2 * rows * cols, timing)
    res["gweights_per_s"] = {k: (v / 2 if k in ("median", "min", "max", "iqr") else v)
                             for k, v in res["gops_per_s"].items()}
    return {"section": "b3", "kernel": kernel, "rows": rows, "cols": cols, **res}


def b3_dram_shape(min_bytes: int) -> tuple[int, int]:
    """(rows, 14336) whose ternary2 payload is at least ``min_bytes`` (b3: 0.8 of it)."""
    return 16 * math.ceil(min_bytes / (14336 // 4) / 16), 14336


def run_b3(args: argparse.Namespace, threads: list[int], timing: TimingConfig, meta: dict) -> list[dict]:
    rows_out = []
    ref = None
    for r, c in (*B3_SHAPES, b3_dram_shape(args.dram_bytes)):
        b3, t2 = b3_matrices(r, c)
        rs = np.ones(r, np.float32)
        xq = np.random.default_rng(1).integers(-127, 128, size=c, dtype=np.int8)
        ref, got = np.empty(r, np.float32), np.empty(r, np.float32)
        kt.ternary_matvec(t2, rs, xq, np.float32(1), ref)
        kb.b3_matvec(b3, rs, xq, np.float32(1), got)
        if not np.array_equal(ref, got):
            raise AssertionError("b3 and ternary2 kernels disagree")
        for t in threads:
            for k in B3_KERNELS:
                row = {**run_metadata(t), **meta, **measure_b3(k, b3, t2, c, t, timing),
                       "b3_decode": kb.DECODE, "working_set_bytes": int(b3.nbytes if k == "b3" else t2.nbytes)}
                rows_out.append(row)
                if args.out:
                    append_jsonl(args.out, row)
        del b3, t2
    return rows_out


def _read_row(rows: int, cols: int, threads: int, buffers: SweepBuffers, timing: TimingConfig, section: str) -> dict:
    """The probe's read-bandwidth kernel at the working set of a (rows, cols) ternary2 matrix."""
    point, _ = measure_point("read", rows * ((cols + 3) // 4), threads, buffers, timing)
    return {"section": section, "kernel": "read_bandwidth", "rows": rows, "cols": cols,
            "working_set_bytes": point.working_set_bytes, "gbps_best": point.gbps_best,
            "gbps": {"median": point.gbps_median, "repeats": timing.repeats}}


def run_prefetch(args: argparse.Namespace, threads: list[int], timing: TimingConfig, meta: dict) -> list[dict]:
    """The prefetch section: each kernel with prefetch off then on, back to back."""
    rows_out = []
    for r, c in (*B3_SHAPES, b3_dram_shape(args.dram_bytes)):
        t2 = random_ternary2(r, c, seed=0)
        dram = t2.nbytes >= args.dram_bytes
        buffers = SweepBuffers(t2.nbytes) if dram else None
        for t in threads:
            read = _read_row(r, c, t, buffers, timing, "prefetch") if dram else None
            jobs = [("read", None)] if dram else []
            jobs += [(k, pf) for _ in range(args.rounds) for k in B3_KERNELS[:2] for pf in (False, True)]
            for k, pf in jobs:
                if k == "read":
                    res = read
                else:
                    res = measure_b3(k, None, t2, c, t, timing, prefetch=pf)
                    res.update(section="prefetch", prefetch=pf)
                    if read:
                        res["pct_of_read_gbps"] = 100.0 * res["gbps"]["median"] / read["gbps"]["median"]
                row = {**run_metadata(t), **meta, "working_set_bytes": int(t2.nbytes), **res}
                rows_out.append(row)
                if args.out:
                    append_jsonl(args.out, row)
        del t2, buffers
    return rows_out


DISTANCE_CACHE_BYTES = 8 * 2**20  # the distance section's cache-resident matrix
DISTANCE_ROW_BYTES = "256,512,1408,3584"  # its default row lengths (d_model 1024 .. 14336)


def distance_passes(distance: int, level: str = ROW_PREFETCH_LEVEL) -> dict[str, tuple]:
    """{"ternary2": (1-thread, parallel), "ternary2_stream": (...)}: the ternary2 4-row and
    one-row passes (as kt._rows_simd, without scales) with software prefetch ``distance``
    bytes ahead into cache ``level`` ("l1" / "l2"), compiled for it here (uncached)."""
    from numba import prange

    from tern.kernels.simd import _ISA, ROWS_PER_DOT, _make_row_dot

    def make(nrows: int) -> tuple:
        dot = _make_row_dot(_ISA, nrows, distance, locality=PREFETCH_LEVELS[level])

        @numba.njit(inline="always")
        def rows(packed, xq, qsum, out, r0, r1):
            nfull = xq.shape[0] // kt.SEG_COLS
            gtail = packed.shape[1] - nfull * kt.SEG_BYTES
            if nrows == 1:
                for r in range(r0, r1):
                    out[r] = np.float32(dot(packed, r, xq, nfull, gtail) - qsum)
            else:
                for r in range(r0, r1 - nrows + 1, nrows):
                    sums = dot(packed, r, xq, nfull, gtail)
                    for i in range(nrows):
                        out[r + i] = np.float32(sums[i] - qsum)

        @numba.njit
        def one(packed, xq, out):
            rows(packed, xq, kt.act_sum(xq), out, 0, packed.shape[0])

        @numba.njit(parallel=True)
        def par(packed, xq, out):
            q, n = kt.act_sum(xq), packed.shape[0]
            for b in prange((n + kt.ROW_BLOCK - 1) // kt.ROW_BLOCK):
                rows(packed, xq, q, out, b * kt.ROW_BLOCK, min(n, (b + 1) * kt.ROW_BLOCK))
        return one, par

    return {"ternary2": make(ROWS_PER_DOT), "ternary2_stream": make(1)}


def run_distance(args: argparse.Namespace, threads: list[int], timing: TimingConfig, meta: dict) -> list[dict]:
    """The distance section: every (pass, distance) on each matrix, interleaved in rounds."""
    if kt.DEFAULT_VARIANT != "simd":
        raise SystemExit("the distance section needs the simd row passes (AVX2 / AVX-512)")
    levels = args.prefetch_level or [ROW_PREFETCH_LEVEL]
    passes = {(d, lv): distance_passes(d, lv) for d in args.prefetch_distance for lv in (levels if d else levels[:1])}
    rows_out = []
    for rb in (int(b) for b in args.row_bytes.split(",")):
        for size in (DISTANCE_CACHE_BYTES, max(args.dram_bytes, 2 * DISTANCE_CACHE_BYTES)):
            n = max(16, size // rb // 16 * 16)
            t2 = random_ternary2(n, 4 * rb, seed=0)
            xq = np.random.default_rng(1).integers(-127, 128, size=4 * rb, dtype=np.int8)
            out = np.empty(n, np.float32)
            dram = size > DISTANCE_CACHE_BYTES
            buffers = SweepBuffers(t2.nbytes) if dram else None
            for t in threads:
                read = _read_row(n, 4 * rb, t, buffers, timing, "distance") if dram else None
                if read:  # the probe's read kernel over the same bytes: the ceiling of the passes
                    rows_out.append({**run_metadata(t), **meta, **read, "row_bytes": rb})
                    if args.out:
                        append_jsonl(args.out, rows_out[-1])
                jobs = [(k, d) for d in passes for k in passes[d]]
                with numba_threads(t):
                    calls = {(k, d): (lambda f=passes[d][k][t > 1], a=t2, x=xq, o=out: f(a, x, o)) for k, d in jobs}
                    runs = {j: [] for j in jobs}
                    for _ in range(args.repeats):  # one run of each job per round
                        for j in jobs:
                            runs[j].append(_time_call(calls[j], t2.nbytes, 2 * n * 4 * rb,
                                                      TimingConfig(min_time_s=timing.min_time_s, repeats=1)))
                for (k, (d, lv)), rs in runs.items():
                    res = {key: summarize([r[key]["median"] for r in rs]) for key in ("gops_per_s", "gbps", "us_per_call")}
                    row = {**run_metadata(t), **meta, "section": "distance", "kernel": k, "rows": n, "cols": 4 * rb,
                           "row_bytes": rb, "prefetch_bytes": d, "prefetch_level": lv if d else None,
                           "working_set_bytes": int(t2.nbytes), **({"pct_of_read_gbps": 100.0 * res["gbps"]["median"]
                                                                    / read["gbps"]["median"]} if read else {}),
                           "weight_bytes": int(t2.nbytes), **res}
                    rows_out.append(row)
                    if args.out:
                        append_jsonl(args.out, row)
    return rows_out


def prefetch_distances(text: str) -> list[int]:
    """--prefetch-distance: comma-separated byte distances, each a multiple of 64; 0 compiles
    the passes without software prefetch (the "off" arm of the same interleaved run)."""
    try:
        ds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated byte counts, got {text!r}") from None
    if not ds or any(d < 0 or d % 64 for d in ds) or len(set(ds)) != len(ds):
        raise argparse.ArgumentTypeError(f"distances must be distinct multiples of 64 bytes (0: no prefetch), "
                                         f"got {text!r}")
    return ds


def prefetch_levels(text: str) -> list[str]:
    """--prefetch-level: comma-separated distinct cache levels, each "l1" or "l2"."""
    try:
        levels = [prefetch_level_setting(x, "--prefetch-level") for x in text.split(",")]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if len(set(levels)) != len(levels):
        raise argparse.ArgumentTypeError(f"levels must be distinct, got {text!r}")
    return levels


ROWLEN_CACHE_BYTES = 128 * 1024  # the rowlen_cache matrix: an expert's gate (512 x 1024 ternary2)


def cache_rows(row_bytes: int) -> int:
    """Rows of the rowlen_cache matrix: ROWLEN_CACHE_BYTES of ``row_bytes`` rows, a multiple
    of 16 (at least 16)."""
    return max(16, ROWLEN_CACHE_BYTES // row_bytes // 16 * 16)


def dram_shape(min_bytes: int) -> tuple[int, int]:
    """A square-ish (rows, cols) whose ternary2 payload is at least ``min_bytes``."""
    side = 256 * math.ceil(math.sqrt(4 * min_bytes) / 256)
    return side, side


def run(args: argparse.Namespace) -> list[dict]:
    threads = [check_threads(int(t)) for t in args.threads.split(",")]
    timing = TimingConfig(min_time_s=args.min_time_s, repeats=args.repeats, warmup_s=args.min_time_s / 2)
    variants = [f"ternary_{v}" for v in tv.VARIANTS]
    shapes = QUICK_SHAPES if args.quick else COMPUTE_SHAPES
    jobs = [("compute", k, r, c, t) for (r, c) in shapes for k in variants + list(BASELINES) for t in threads]
    if not args.no_skip:
        fracs = SKIP_NONZERO[1:3] if args.quick else SKIP_NONZERO
        jobs += [("skip", f, 0, 0, t) for f in fracs for t in threads]
    if not args.no_dram:
        r, c = dram_shape(args.dram_bytes)
        jobs += [("dram", k, r, c, t) for t in threads for k in ("read", "ternary_simd", "ternary_unpack")
                 if k in ("read", *variants)]
    if args.row_length:  # this section alone
        jobs = []
        for rb in (int(b) for b in args.row_bytes.split(",")):
            r = math.ceil(args.dram_bytes / rb / 16) * 16
            jobs += [("rowlen", k, r, 4 * rb, t) for t in threads for k in ("ternary_simd", "ternary_stream")
                     if k in variants]
            jobs += [("rowlen_cache", f"ternary_{kt.DEFAULT_VARIANT}", cache_rows(rb), 4 * rb, t) for t in threads]
    meta = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "bench": "ternary_matvec",
            "default_variant": kt.DEFAULT_VARIANT, "simd_isa": ROW_DOT_ISA, "lut_vbmi": HAS_VBMI}
    if args.b3:  # this section alone
        return run_b3(args, threads, timing, meta)
    if args.prefetch_distance:  # this section alone
        return run_distance(args, threads, timing, meta)
    if args.prefetch:  # this section alone
        return run_prefetch(args, threads, timing, {**meta, "row_prefetch_default": kt.ROW_PREFETCH})
    rows_out: list[dict] = []
    buffers = None
    read_gbps: dict[int, float] = {}
    for section, k, r, c, t in tqdm(jobs, desc="kernels", unit="row", file=sys.stderr):
        if section == "skip":
            row = measure_skip(k, t, timing)
        elif section == "dram" and k == "read":
            buffers = buffers or SweepBuffers(r * ((c + 3) // 4))
            row = _read_row(r, c, t, buffers, timing, "dram")
            read_gbps[t] = row["gbps"]["median"]
        else:
            row = measure(k, r, c, t, timing, section)
            if section == "dram" and t in read_gbps:
                row["pct_of_read_gbps"] = 100.0 * row["gbps"]["median"] / read_gbps[t]
        row = {**run_metadata(t), **meta, **row}
        rows_out.append(row)
        if args.out:
            append_jsonl(args.out, row)
    return rows_out


def render(rows: list[dict]) -> str:
    head = f"{'section':8s} {'kernel':16s} {'shape':>13s} {'thr':>3s} {'Gops/s':>8s} {'GB/s':>7s} " \
           f"{'us/call':>9s} {'spread':>7s} {'note':s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        g = r.get("gops_per_s", {}).get("median", float("nan"))
        spread = r.get("gops_per_s", {}).get("spread_rel", float("nan"))
        us = r.get("us_per_call", {}).get("median", float("nan"))
        note = ""
        if "nonzero_frac" in r:
            note = f"nonzero {r['nonzero_frac']:.2f} (ops dense-equivalent)"
        if "pct_of_read_gbps" in r:
            note = f"{r['pct_of_read_gbps']:.0f}% of read bandwidth ({r['threads']} thr)"
        if "gweights_per_s" in r:
            note = f"{r['gweights_per_s']['median']:.1f} Gweights/s"
        if "prefetch" in r:
            note = f"prefetch {'on' if r['prefetch'] else 'off'}" + (
                f", {r['pct_of_read_gbps']:.0f}% of read bandwidth" if "pct_of_read_gbps" in r else "")
        if "prefetch_bytes" in r:
            note = f"{r['row_bytes']} B rows, " + (f"prefetch {r['prefetch_bytes']} B ahead into {r.get('prefetch_level') or 'l1'}" if r["prefetch_bytes"]
                                                   else "no software prefetch")
        if r["kernel"] == "read_bandwidth":
            note = f"probe read kernel, {r['working_set_bytes'] / 2**20:.0f} MiB"
        lines.append(f"{r['section']:8s} {r['kernel']:16s} {r['rows']:>6d}x{r['cols']:<6d} {r['threads']:>3d} "
                     f"{g:8.1f} {r['gbps']['median']:7.2f} {us:9.1f} {spread:7.2f} {note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one small shape, short timings, no DRAM section")
    p.add_argument("--out", default="results/bench/kernels.jsonl", help="JSONL file rows are appended to ('' = none)")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per row (default 5)")
    p.add_argument("--min-time-s", type=float, default=None, help="seconds per timed run (default 0.1, quick 0.02)")
    p.add_argument("--dram-bytes", type=int, default=DRAM_MIN_BYTES, help="min packed bytes of the DRAM matrix")
    p.add_argument("--no-dram", action="store_true", help="skip the DRAM section")
    p.add_argument("--no-skip", action="store_true", help="skip the activation-skip section")
    p.add_argument("--row-bytes", default=",".join(map(str, ROW_LENGTH_BYTES)),
                   help="comma-separated packed row lengths (bytes) of the rowlen section")
    p.add_argument("--row-length", action="store_true",
                   help="run only the rowlen section: DRAM GB/s of the 4-row and one-row passes against row length")
    p.add_argument("--b3", action="store_true",
                   help="run only the b3 section: the base-3 kernel against ternary2, in cache and from DRAM")
    p.add_argument("--prefetch", action="store_true",
                   help="run only the prefetch section: ternary2 row passes with software prefetch off / on")
    p.add_argument("--prefetch-distance", type=prefetch_distances, default=None, metavar="BYTES[,BYTES]",
                   help="run only the distance section: the row passes with software prefetch compiled for "
                        "each distance (e.g. 4096,8192), interleaved in one process (--row-bytes: its row "
                        f"lengths, default {DISTANCE_ROW_BYTES})")
    p.add_argument("--prefetch-level", type=prefetch_levels, default=None, metavar="l1|l2[,...]",
                   help="distance section: the cache level(s) the prefetch fills, each crossed with every "
                        f"distance (default: the engine's, {ROW_PREFETCH_LEVEL})")
    p.add_argument("--rounds", type=int, default=1, help="prefetch section: off/on pairs per kernel (default 1)")
    args = p.parse_args(argv)
    args.repeats = args.repeats or 5
    if args.prefetch_distance and args.row_bytes == ",".join(map(str, ROW_LENGTH_BYTES)):
        args.row_bytes = DISTANCE_ROW_BYTES
    args.min_time_s = args.min_time_s or (0.02 if args.quick else 0.1)
    if args.quick:
        args.no_dram = True
    rows = run(args)
    print(render(rows))
    if args.out:
        print(f"rows appended to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
