"""The ternary row passes' prefetch chained into the matrix read next, measured at the kernel:
over a cycle of packed matrices visited in random order (as a MoE layer's chosen experts are),
the engine's single-thread pass (tern.kernels.kernels_ternary.ternary_matvec_next) with
``nxt`` the matrix it reads next ("chained": its start is prefetched as this matrix's own
prefetch runs past its end) against ``nxt`` = NO_NEXT ("plain": the passes before the chain).
Both with the row passes' software prefetch on, as the engine runs them; 4-row and one-row
(streaming) passes; every form once per round, interleaved, in one process; same sums.

One JSONL row per (shape, pass, form) in ``<results>/bench/chain_prefetch.jsonl``:
tern.core.records.run_metadata and a summary of GB/s (packed bytes per second, 1 thread).

    flock /tmp/tern-cpu.lock .venv/bin/python benchmarks/chain_prefetch.py [--shapes 512x256 1024x128]

AMD EPYC Zen 4 VM (session 25, 1 thread, 512 MiB of matrices, a prototype of the same loop,
5 rounds, median GB/s plain -> chained, 4-row pass): 512 x 256 B (128 KB: the 9.7B MoE
peer's gate / up) 21.5 -> 23.4, 1024 x 128 B (its down) 18.6 -> 20.0, 1024 x 256 B (256 KB)
23.9 -> 25.5, 2048 x 512 B (1 MB) 25.4 -> 26.7. A plain read of the same 128 KB chunks in
random order: 22.7 GB/s, in address order 27.6 (the chunk boundaries cost what chaining wins back).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numba
import numpy as np

from tern.core.records import append_jsonl, run_metadata, summarize
from tern.kernels import kernels_ternary as kt
from tern.kernels.kernels_ternary import NO_NEXT, ternary_matvec_next


@numba.njit(cache=True)
def run_cycle(mats, order, scale, xq, out, one_row, chained):
    """Every matrix of ``mats[order]`` times xq, one after another (1 thread)."""
    for j in range(order.shape[0]):
        if chained:
            nxt = mats[order[(j + 1) % order.shape[0]]]
            ternary_matvec_next(mats[order[j]], scale, xq, np.float32(0.01), out, one_row, True, nxt)
        else:
            ternary_matvec_next(mats[order[j]], scale, xq, np.float32(0.01), out, one_row, True, NO_NEXT)


def parse_shape(text: str) -> tuple[int, int]:
    """``"ROWSxROW_BYTES"`` -> (rows, packed bytes per row)."""
    rows, _, rb = text.lower().partition("x")
    if not (rows.isdigit() and rb.isdigit() and int(rows) > 0 and int(rb) > 0):
        raise argparse.ArgumentTypeError(f"a shape is ROWSxROW_BYTES (e.g. 512x256), got {text!r}")
    return int(rows), int(rb)


def run(args: argparse.Namespace) -> list[dict]:
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    out_path = Path(args.results) / "bench" / "chain_prefetch.jsonl"
    rows_out = []
    for rows, rb in args.shapes:
        k = max(2, args.bytes // (rows * rb))
        mats = rng.integers(0, 256, size=(k, rows, rb), dtype=np.uint8)
        order = rng.permutation(k).astype(np.int64)
        scale = np.ones(rows, np.float32)
        xq = rng.integers(-127, 128, size=4 * rb, dtype=np.int8)
        ref, out = np.empty(rows, np.float32), np.empty(rows, np.float32)
        forms = [(p, c) for p in ("4-row", "one-row") for c in ("plain", "chained")]
        gbps: dict[tuple[str, str], list[float]] = {f: [] for f in forms}
        for p, c in forms:  # compile, warm, and the same sums either way
            run_cycle(mats, order[:2], scale, xq, out, p == "one-row", c == "chained")
            kt.ternary_matvec_rows(mats[order[1]], scale, xq, np.float32(0.01), ref, p == "one-row", True)
            if not np.array_equal(out, ref):
                raise AssertionError(f"{p} {c}: sums differ from ternary_matvec_rows")
        for _ in range(args.repeats):
            for p, c in forms:
                t0 = time.perf_counter()
                run_cycle(mats, order, scale, xq, out, p == "one-row", c == "chained")
                gbps[(p, c)].append(mats.nbytes / (time.perf_counter() - t0) / 1e9)
        for (p, c), v in gbps.items():
            row = {**run_metadata(1), "bench": "chain_prefetch", "pass": p, "form": c, "rows": rows, "row_bytes": rb,
                   "matrices": k, "working_set_bytes": int(mats.nbytes), "gbps": summarize(v)}
            append_jsonl(out_path, row)
            rows_out.append(row)
        print(f"{rows} x {rb} B ({rows * rb >> 10} KB) matrices in random order, 1 thread: " + ", ".join(
            f"{p} {c} {summarize(v)['median']:.1f}" for (p, c), v in gbps.items()) + " GB/s", flush=True)
        del mats
    print(f"rows appended to {out_path}")
    return rows_out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default="results", help="results folder (rows: <results>/bench/chain_prefetch.jsonl)")
    p.add_argument("--shapes", nargs="+", type=parse_shape, default=[(512, 256), (1024, 128), (1024, 256), (2048, 512)],
                   metavar="ROWSxROW_BYTES", help="matrix shapes: rows x packed bytes per row (4 columns a byte)")
    p.add_argument("--bytes", type=int, default=512 << 20, help="working set: bytes of matrices per shape (DRAM)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (median reported)")
    a = p.parse_args(argv)
    if a.bytes < 1 or a.repeats < 1:
        p.error("--bytes and --repeats must be positive")
    run(a)


if __name__ == "__main__":
    main()
