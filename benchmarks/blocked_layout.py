"""The blocked16 layout's pass against the engine's row passes, same matrices, one process, interleaved.

Each arm reads a cycle of ``--rows`` x ``--cols`` ternary matrices in random order (as routed
experts are), each pass handing the next matrix to its chained prefetch as the engine does:

* ``rows-4row``: the ternary2 rows, 4 rows a pass (kernels_ternary.ternary_matvec_next, the default);
* ``rows-stream``: the ternary2 rows, one row a pass (the engine's streaming form for long DRAM rows);
* ``blocked16``: the same weights re-packed into 16-row blocks (kernels_blocked.blocked16_matvec_next);
* ``blocked16-nopf``: the same without the prefetch into the next matrix.

Working sets: one in L2 (``--l2-bytes``), one in L3 (``--cache-bytes``), one from DRAM
(``--dram-bytes``); every arm once per round, ``--repeats`` rounds, and the plain read kernel over
the DRAM set's bytes timed beside them. GB/s of packed bytes. Outputs are checked equal first.

    flock /tmp/tern-cpu.lock .venv/bin/python benchmarks/blocked_layout.py [--shapes 640x2560 2560x640]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numba
import numpy as np

from tern.core.records import append_jsonl, run_metadata, summarize
from tern.kernels.kernels_blocked import blocked16_matvec_next, pack_blocked16
from tern.kernels.kernels_ternary import ternary_matvec_next
from tern.kernels.packing import random_ternary2
from tern.probe.bandwidth import read_kernel


@numba.njit(cache=True)
def _cycle_rows(mats, order, scale, xq, out, one_row):
    n = order.shape[0]
    for i in range(n):
        ternary_matvec_next(mats[order[i]], scale, xq, np.float32(1.0), out, one_row, True, mats[order[(i + 1) % n]])


@numba.njit(cache=True)
def _cycle_blocked(mats, order, scale, xq, out, prefetch):
    n = order.shape[0]
    for i in range(n):
        blocked16_matvec_next(mats[order[i]], scale, xq, np.float32(1.0), out, prefetch, mats[order[(i + 1) % n]])


ARMS = {"rows-4row": (False, False), "rows-stream": (False, True), "blocked16": (True, True),
        "blocked16-nopf": (True, False)}  # name -> (blocked layout, one_row / prefetch)


def _run(arm: str, rows_mats, blk_mats, order, scale, xq, out) -> None:
    blocked, flag = ARMS[arm]
    if blocked:
        _cycle_blocked(blk_mats, order, scale, xq, out, flag)
    else:
        _cycle_rows(rows_mats, order, scale, xq, out, flag)


def run(args: argparse.Namespace) -> list[dict]:
    rng = np.random.default_rng(0)
    out_path = Path(args.results) / "bench" / "blocked_layout.jsonl"
    rows_out = []
    for shape in args.shapes:
        rows, cols = (int(v) for v in shape.lower().split("x"))
        one = random_ternary2(rows, cols, seed=1)
        blk_one = pack_blocked16(one, cols)
        xq = rng.integers(-127, 128, size=cols, dtype=np.int8)
        scale = np.ones(rows, np.float32)
        for where, size in (("L2", args.l2_bytes), ("L3", args.cache_bytes), ("DRAM", args.dram_bytes)):
            k = max(2, size // one.nbytes)
            rows_mats = np.empty((k,) + one.shape, np.uint8)
            rows_mats[:] = one
            blk_mats = np.empty((k,) + blk_one.shape, np.uint8)
            blk_mats[:] = blk_one
            order = rng.permutation(k).astype(np.int64)
            outs = {a: np.full(rows, np.nan, np.float32) for a in ARMS}
            for a in ARMS:  # compile, warm, and the same outputs
                _run(a, rows_mats, blk_mats, order[:2], scale, xq, outs[a])
            if any(not np.array_equal(o, outs["rows-4row"]) for o in outs.values()):
                raise SystemExit(f"{shape}: the arms' outputs differ")
            gbps: dict[str, list[float]] = {a: [] for a in ARMS}
            flat = rows_mats.reshape(-1)[:rows_mats.nbytes // 8 * 8].view(np.float64)  # the read kernel's bytes
            read = []
            for _ in range(args.repeats):
                for a in ARMS:
                    calls, t0 = 0, time.perf_counter()
                    while (dt := time.perf_counter() - t0) < args.min_time_s or calls == 0:
                        _run(a, rows_mats, blk_mats, order, scale, xq, outs[a])
                        calls += 1
                    gbps[a].append(rows_mats.nbytes * calls / dt / 1e9)
                calls, t0 = 0, time.perf_counter()
                while (dt := time.perf_counter() - t0) < args.min_time_s or calls == 0:
                    read_kernel(flat, 1)
                    calls += 1
                read.append(flat.nbytes * calls / dt / 1e9)
            for a, v in gbps.items():
                row = {**run_metadata(1), "bench": "blocked_layout", "arm": a, "rows": rows, "cols": cols,
                       "row_bytes": one.shape[1], "matrices": k, "where": where, "working_set_bytes": int(rows_mats.nbytes),
                       "gbps": summarize(v), "read_gbps": summarize(read)}
                append_jsonl(out_path, row)
                rows_out.append(row)
            print(f"{rows} x {cols} ({one.shape[1]} B rows), {where}, {k} matrices: " + ", ".join(
                f"{a} {summarize(v)['median']:.1f}" for a, v in gbps.items())
                + f"; read kernel {summarize(read)['median']:.1f} GB/s", flush=True)
            del rows_mats, blk_mats
    print(f"rows appended to {out_path}")
    return rows_out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default="results", help="results folder (rows: <results>/bench/blocked_layout.jsonl)")
    p.add_argument("--shapes", nargs="+", default=["128x384", "384x128", "4096x512", "512x4096", "640x2560", "2560x640"],
                   help="ROWSxCOLS of the matrices (defaults: the sandbox's and the ~250 MB and 10B models' experts)")
    p.add_argument("--l2-bytes", type=int, default=256 << 10, help="working set of the L2 cycle")
    p.add_argument("--cache-bytes", type=int, default=8 << 20, help="working set of the L3 cycle")
    p.add_argument("--dram-bytes", type=int, default=512 << 20, help="working set of the DRAM cycle")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (median reported)")
    p.add_argument("--min-time-s", type=float, default=0.15, help="seconds per timed run")
    a = p.parse_args(argv)
    try:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in a.shapes]
    except ValueError:
        p.error(f"--shapes takes ROWSxCOLS, got {a.shapes}")
    if any(len(s) != 2 or min(s) < 1 for s in shapes) or min(a.l2_bytes, a.cache_bytes, a.dram_bytes) < 1 or a.repeats < 1:
        p.error("--shapes need two positive sizes; the working sets and --repeats must be positive")
    run(a)


if __name__ == "__main__":
    main()
