"""How the row-at-a-time kernels of the stored fp16 / int8 tables (heads, routers:
tern.kernels.kernels_stored) prefetch, measured: the shipped kernels (the whole row
``rows_ahead`` rows on, in one burst before each row's sum: tern.kernels.prefetch.prefetch_row,
into L2 for rows of at most DENSE_L2_MAX_ROW_BYTES, else into L1) against the same loop with
the row's lines in two halves (before and after the sum), with the whole row into L2 only
(``prefetcht1``) or into L1 whatever its length, and with no software prefetch.

All forms run in one process on one matrix (``--bytes``, on transparent huge pages as the
engine's weight copy), in interleaved runs, so a drifting VM hits them alike. One JSONL row
per (dtype, columns, threads, form) in ``<results>/bench/dense_prefetch.jsonl``:
tern.core.records.run_metadata and summaries of GB/s (weight bytes per call / seconds).

    .venv/bin/python benchmarks/dense_prefetch.py [--cols 1024 2048 4096] [--threads 1 2]

Intel Xeon VM (session 18, 9 interleaved runs, median GB/s, whole row -> halves, 1 / 2
threads). 131 MB: fp16 2,048 columns 14.3 -> 16.8 / 35.7 -> 40.8, int8 4,096 10.7 -> 12.2 /
24.6 -> 29.9, every cell of 1,024 / 2,048 / 4,096 columns 1.00-1.21x. But at 512 MB the
cells scatter both ways (int8 2,048 at 1 thread 13.3-13.9 -> 9.0-10.0; fp16 1,024 15.5 ->
9.7, at 2 threads 15.9 -> 18.8), and the engine's 1.1B peer (fp16 head, 131 MB of its
547 MB) decoded alike with either (3 interleaved rounds: 1 thread 33.7 / 33.2 / 33.7 ->
32.8 / 33.2 / 33.7 tok/s, 2 threads 60.0 / 59.5 / 60.2 -> 59.8 / 58.9 / 61.3): the
131 MB figures hold for a matrix read again and again, partly from this VM's L3, not for
a head read from DRAM once per token. The whole row stays.

AMD EPYC Zen 4 VM (session 24, 131 MB, 9 interleaved runs, median GB/s at 1 thread, shipped /
halves / whole row into L2 / none): fp16 1,024 columns 22.1 / 14.2 / 31.1 / 30.5, 2,048 (the 1.1B
peer's head) 23.4 / 17.0 / 16.3 / 24.3, 4,096 15.8 / 14.5 / 14.8 / 25.4; int8 1,024 15.8 / 17.1 /
21.5 / 14.7, 2,048 17.1 / 11.9 / 22.2 / 16.3, 4,096 13.0 / 12.3 / 14.0 / 14.6. Into L2 wins at
rows of up to 2 KB and loses at the 1.1B head's 4 KB, so the shipped kernels now choose by the row's
bytes (tern.kernels.prefetch.DENSE_L2_MAX_ROW_BYTES; the whole row into L1 above 2 KB) (the 2-thread cells of
the three comparison forms read as their 1-thread ones in that run; the shipped kernel's did not:
fp16 4,096 15.8 -> 27.0; not explained).

Same VM, session 25, after the row dot became IR (tern.kernels.kernels_dense.float_row_dot;
fresh numba cache, 5 interleaved runs, 1 thread, shipped / halves / into L2 / into L1 / none):
fp16 1,024 columns 30.5 / 20.3 / 31.1 / 19.6 / 28.4, 2,048 17.5 / 19.5 / 15.9 / 15.6 / 29.6,
4,096 12.6 / 11.4 / 13.7 / 12.8 / 24.5: the fp16 / bf16 kernels now leave rows longer than
DENSE_L2_MAX_ROW_BYTES to the hardware prefetcher (kernels_stored._w16_prefetch_stop).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numba
import numpy as np

from tern.core.records import append_jsonl, run_metadata, summarize
from tern.kernels.kernels_stored import (
    JIT,
    _dot16,
    _int8w_row,
    matvec_int8w,
    matvec_int8w_par,
    matvec_w16,
    matvec_w16_par,
)
from tern.kernels.prefetch import CACHE_LINE_BYTES, prefetch_line, prefetch_line_l2, rows_ahead
from tern.run.weights import huge_page_copy


@numba.njit(cache=True, inline="always")
def _half_row(W, r, stop, second):
    """Prefetch the lines of the first (``second`` False) or second half of row ``r``."""
    if r < stop:
        nbytes = W.shape[1] * W.itemsize
        mid = (nbytes // CACHE_LINE_BYTES + 1) // 2 * CACHE_LINE_BYTES
        for off in range(mid if second else 0, nbytes if second else mid, CACHE_LINE_BYTES):
            prefetch_line(W, r, off)


@numba.njit(cache=True, inline="always")
def _row_at(W, r, stop, l2):
    """Every line of row ``r`` into L2 only (prefetcht1) or into L1 (prefetcht0), whatever its
    length (prefetch_row chooses by the row's bytes)."""
    if r < stop:
        for off in range(0, W.shape[1] * W.itemsize, CACHE_LINE_BYTES):
            if l2:
                prefetch_line_l2(W, r, off)
            else:
                prefetch_line(W, r, off)


def _w16_loop(W, x, out, on):
    """The fp16 loop with the row's lines prefetched in two halves (``on`` 1), the whole row
    into L2 (2) or into L1 (3), or not at all (0)."""
    a, n = rows_ahead(W), W.shape[0]
    for r in numba.prange(n):
        if on == 1:
            _half_row(W, r + a, n, False)
        elif on >= 2:
            _row_at(W, r + a, n, on == 2)
        out[r] = _dot16(W, x, r, False)
        if on == 1:
            _half_row(W, r + a, n, True)


def _int8_loop(Wq, scale, x, out, on):
    a, n = rows_ahead(Wq), Wq.shape[0]
    for r in numba.prange(n):
        if on == 1:
            _half_row(Wq, r + a, n, False)
        elif on >= 2:
            _row_at(Wq, r + a, n, on == 2)
        out[r] = _int8w_row(Wq, x, r) * scale[r]
        if on == 1:
            _half_row(Wq, r + a, n, True)


# serial (1 thread: prange runs as range, as the shipped 1-thread kernels) and parallel builds
_w16_split = numba.njit(fastmath=True, cache=True)(_w16_loop)
_w16_split_par = numba.njit(fastmath=True, cache=True, parallel=True)(_w16_loop)
_int8_split = numba.njit(**JIT)(_int8_loop)
_int8_split_par = numba.njit(parallel=True, **JIT)(_int8_loop)


def forms(kind: str, W: np.ndarray, x: np.ndarray, out: np.ndarray, threads: int) -> dict:
    """{form: call} for one matrix; the shipped kernel first."""
    sc = np.ones(W.shape[0], np.float32)
    if kind == "fp16":
        shipped, other = (matvec_w16, _w16_split) if threads == 1 else (matvec_w16_par, _w16_split_par)
        return {"whole row (shipped)": lambda: shipped(W, x, out, False), "halves": lambda: other(W, x, out, 1),
                "whole row into L2": lambda: other(W, x, out, 2), "whole row into L1": lambda: other(W, x, out, 3),
                "none": lambda: other(W, x, out, 0)}
    shipped, other = (matvec_int8w, _int8_split) if threads == 1 else (matvec_int8w_par, _int8_split_par)
    return {"whole row (shipped)": lambda: shipped(W, sc, x, out), "halves": lambda: other(W, sc, x, out, 1),
            "whole row into L2": lambda: other(W, sc, x, out, 2), "whole row into L1": lambda: other(W, sc, x, out, 3),
            "none": lambda: other(W, sc, x, out, 0)}


def run(args: argparse.Namespace) -> list[dict]:
    rng = np.random.default_rng(0)
    out_path = Path(args.results) / "bench" / "dense_prefetch.jsonl"
    rows_out = []
    for kind in args.dtypes:
        itemsize = 2 if kind == "fp16" else 1
        for cols in args.cols:
            rows = max(1, args.bytes // (cols * itemsize))
            if kind == "fp16":
                W0 = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16).view(np.uint16)
            else:
                W0 = rng.integers(-127, 128, (rows, cols), dtype=np.int8)
            W = huge_page_copy(W0.view(np.uint8)).view(W0.dtype).reshape(rows, cols)
            del W0
            x = rng.standard_normal(cols).astype(np.float32)
            out = np.zeros(rows, np.float32)
            for t in args.threads:
                numba.set_num_threads(t)
                calls = forms(kind, W, x, out, t)
                for c in calls.values():
                    c()  # compile / load from cache, warm
                gbps: dict[str, list[float]] = {f: [] for f in calls}
                for _ in range(args.repeats):
                    for f, c in calls.items():
                        t0 = time.perf_counter()
                        c()
                        gbps[f].append(W.nbytes / (time.perf_counter() - t0) / 1e9)
                for f, v in gbps.items():
                    row = {**run_metadata(t), "bench": "dense_prefetch", "dtype": kind, "rows": rows, "cols": cols,
                           "weight_bytes": int(W.nbytes), "form": f, "gbps": summarize(v)}
                    append_jsonl(out_path, row)
                    rows_out.append(row)
                print(f"{kind} {cols} cols, {t} thread(s): " + ", ".join(
                    f"{f} {summarize(v)['median']:.1f}" for f, v in gbps.items()) + " GB/s", flush=True)
            del W
    print(f"rows appended to {out_path}")
    return rows_out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default="results", help="results folder (rows: <results>/bench/dense_prefetch.jsonl)")
    p.add_argument("--dtypes", nargs="+", default=["fp16", "int8"], choices=["fp16", "int8"])
    p.add_argument("--cols", nargs="+", type=int, default=[1024, 2048, 4096], help="columns (inputs) per row")
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--bytes", type=int, default=131_072_000, help="matrix bytes (default: the 1.1B peer's fp16 head)")
    p.add_argument("--repeats", type=int, default=9, help="interleaved runs per form (median reported)")
    a = p.parse_args(argv)
    if min(a.cols) < 1 or min(a.threads) < 1 or a.bytes < 1 or a.repeats < 1:
        p.error("--cols, --threads, --bytes and --repeats must be positive")
    run(a)


if __name__ == "__main__":
    main()
