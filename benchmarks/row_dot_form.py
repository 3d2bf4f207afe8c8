"""The ternary row dot's two code forms, in one process on the same matrices, interleaved.

Each packed byte holds four 2-bit codes (groups k = 0..3). The row dot (tern.kernels.simd)
either masks group k in place (code * 4**k, one AND; the accumulators are shifted back once
per row: "masked") or shifts it down first and then masks ("shifted"). The sums are the
same. Which is faster depends on the pass and on where the weights come from, so both are
compiled here for the 4-row and the one-row pass (1 thread) and timed over a cycle of
matrices of ``--rows`` x ``--row-bytes`` visited in random order (as routed experts are), in
L3 (``--cache-bytes``) and from DRAM (``--dram-bytes``), every form once per round.

AMD EPYC Zen 4 VM, session 20, three processes (5 rounds each, 256 B rows; GB/s medians,
masked / shifted): the 4-row pass from DRAM over 512-row (128 KiB) matrices 10.3 / 12.8,
9.1 / 11.7, 11.6 / 13.9 (shifted x1.20-1.29 every time), over 1024-row (256 KiB) ones
13.5 / 14.3, 12.5 / 10.4, 13.0 / 16.3; in L3 the masked 4-row pass is 1-6 % faster; the
one-row pass (the engine's streamed DRAM pools) 15.5 / 13.3, 14.7 / 12.5, 16.0 / 16.1 over
128 KiB and 18.9 / 16.9, 17.2 / 16.8, 18.2 / 16.9 over 256 KiB. The engine runs the 4-row
pass shifted and the one-row pass masked (the ~10B picks' experts are 128 KiB matrices).

    flock /tmp/tern-cpu.lock .venv/bin/python benchmarks/row_dot_form.py [--rows 512 1024]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numba
import numpy as np

from tern.core.records import append_jsonl, run_metadata, summarize
from tern.kernels import kernels_ternary as kt
from tern.kernels.prefetch import PREFETCH_MIN_BYTES
from tern.kernels.simd import _ISA, ROW_DOT_ISA, ROWS_PER_DOT, _make_row_dot

FORMS = {"masked": True, "shifted": False}


def make_pass(nrows: int, scaled: bool):
    """A 1-thread pass of ``nrows`` rows per dot over matrices ``mats[order]`` (the engine's
    software prefetch, no scales): out[r] = code dot - sum(xq) of each matrix's rows."""
    dot = _make_row_dot(_ISA, nrows, PREFETCH_MIN_BYTES, scaled)

    @numba.njit
    def run(mats, order, xq, out):
        nfull = xq.shape[0] // kt.SEG_COLS
        gtail = mats.shape[2] - nfull * kt.SEG_BYTES
        qsum = kt.act_sum(xq)
        for m in order:
            packed = mats[m]
            if nrows == 1:
                for r in range(packed.shape[0]):
                    out[r] = np.float32(dot(packed, r, xq, nfull, gtail) - qsum)
            else:
                for r in range(0, packed.shape[0] - nrows + 1, nrows):
                    sums = dot(packed, r, xq, nfull, gtail)
                    for i in range(nrows):
                        out[r + i] = np.float32(sums[i] - qsum)
    return run


def passes() -> dict[tuple[int, str], object]:
    return {(n, f): make_pass(n, s) for n in (ROWS_PER_DOT, 1) for f, s in FORMS.items()}


def run(args: argparse.Namespace) -> list[dict]:
    if ROW_DOT_ISA == "none":
        raise SystemExit("the row dot's code forms need the SIMD row passes (AVX2 / AVX-512)")
    rng = np.random.default_rng(0)
    out_path = Path(args.results) / "bench" / "row_dot_form.jsonl"
    fns = passes()
    xq = rng.integers(-127, 128, size=4 * args.row_bytes, dtype=np.int8)
    rows_out = []
    for rows in args.rows:
        for where, size in (("L3", args.cache_bytes), ("DRAM", args.dram_bytes)):
            k = max(1, size // (rows * args.row_bytes))
            mats = rng.integers(0, 256, size=(k, rows, args.row_bytes), dtype=np.uint8)
            order = rng.permutation(k).astype(np.int64)
            out = np.empty(rows, np.float32)
            for f in fns.values():
                f(mats, order, xq, out)  # compile, warm
            gbps: dict[tuple[int, str], list[float]] = {key: [] for key in fns}
            for _ in range(args.repeats):
                for key, f in fns.items():
                    calls, t0 = 0, time.perf_counter()
                    while (dt := time.perf_counter() - t0) < args.min_time_s or calls == 0:
                        f(mats, order, xq, out)
                        calls += 1
                    gbps[key].append(mats.nbytes * calls / dt / 1e9)
            for (nrows, form), v in gbps.items():
                row = {**run_metadata(1), "bench": "row_dot_form", "pass": f"{nrows}-row", "form": form,
                       "rows": rows, "row_bytes": args.row_bytes, "matrices": k, "where": where,
                       "working_set_bytes": int(mats.nbytes), "gbps": summarize(v)}
                append_jsonl(out_path, row)
                rows_out.append(row)
            print(f"{rows} x {args.row_bytes} B matrices, {where}: " + ", ".join(
                f"{n}-row {f} {summarize(v)['median']:.1f}" for (n, f), v in gbps.items()) + " GB/s", flush=True)
            del mats
    print(f"rows appended to {out_path}")
    return rows_out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default="results", help="results folder (rows: <results>/bench/row_dot_form.jsonl)")
    p.add_argument("--rows", nargs="+", type=int, default=[512, 1024], help="rows per matrix")
    p.add_argument("--row-bytes", type=int, default=256, help="packed bytes per row (4 columns a byte)")
    p.add_argument("--cache-bytes", type=int, default=8 << 20, help="working set of the L3 cycle")
    p.add_argument("--dram-bytes", type=int, default=512 << 20, help="working set of the DRAM cycle")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (median reported)")
    p.add_argument("--min-time-s", type=float, default=0.15, help="seconds per timed run")
    a = p.parse_args(argv)
    if min(a.rows) < ROWS_PER_DOT or a.row_bytes < 1 or min(a.cache_bytes, a.dram_bytes) < 1 or a.repeats < 1:
        p.error(f"--rows must be >= {ROWS_PER_DOT}; --row-bytes, the working sets and --repeats positive")
    run(a)


if __name__ == "__main__":
    main()
