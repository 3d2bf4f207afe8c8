"""The activation-skip kernel from DRAM with other software-prefetch settings, A/B.

The skip kernel (tern.kernels.kernels_ternary.ternary_matvec_skip: the down projections of
dReLU / ReLU^2 MLPs, reading only the rows of nonzero hidden units) prefetches the scattered
rows of the next groups while it computes one. Its distance and cache level are compiled in
(``TERN_SKIP_PREFETCH="GROUPS,l1|l2"``, read at import), so each setting runs in its own
process with its own ``NUMBA_CACHE_DIR``; the settings take turns in rotating rounds, so a
drifting host slows all alike. Each run times the real kernel as the probe's curves do
(tern.probe.curves.measure_curve, op ``ternary_skip``): a cycle of transposed matrices
adding up to ``--ws-mib``, a quarter of the inputs nonzero, in a fixed random order.

    flock /tmp/tern-cpu.lock .venv/bin/python benchmarks/skip_prefetch.py [--settings 2,l1 4,l2] [--shape 2048x2048]

One JSONL row per setting (<results>/bench/skip_prefetch.jsonl): run metadata, GB/s of the
rows read (median, min, max, spread over rounds), seconds per call, and the speed-up over
the first setting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from curve_stability import parse_shape  # ROWSxCOLS (here inputs x outputs)

ROOT = Path(__file__).resolve().parents[1]


def worker(shape: tuple[int, int], ws_bytes: int, threads: int, split: str) -> dict:
    """Seconds per call of the skip kernel as compiled in this process (its TERN_SKIP_PREFETCH)."""
    from tern.kernels import kernels_ternary as kt
    from tern.probe.curve_buffer import CurveBuffer
    from tern.probe.curves import SKIP_DENSITY, _weight_bytes, measure_curve
    from tern.probe.timing import TimingConfig

    mat = _weight_bytes("ternary_skip", *shape)
    buf = CurveBuffer(max(mat, ws_bytes // mat * mat))
    c = measure_curve("ternary_skip", "serial" if threads == 1 else split, threads, (buf.data.size,), buf,
                      TimingConfig(min_time_s=0.2, repeats=3, warmup_s=0.05), shape=shape)
    return {"setting": f"{kt.SKIP_PREFETCH_GROUPS},{kt.SKIP_PREFETCH_LEVEL}", "seconds_per_call": c.seconds[0],
            "bytes_read_per_call": mat * SKIP_DENSITY, "working_set_bytes": c.working_set_bytes[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", nargs="+", default=["2,l1", "4,l1", "2,l2", "4,l2", "8,l2"],
                    help="TERN_SKIP_PREFETCH values, GROUPS,l1|l2 (the first is the baseline)")
    ap.add_argument("--shape", type=parse_shape, default=(2048, 2048),
                    help="INPUTSxOUTPUTS of each transposed matrix (default 2048x2048: 512 B rows)")
    ap.add_argument("--ws-mib", type=int, default=256, help="MiB of matrices in the cycle (default 256: DRAM)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--split", choices=("rows", "experts"), default="rows",
                    help="threads > 1: each matrix's output segments over the threads (rows: part rows each) or "
                         "one matrix per thread (experts: whole rows, as expert-parallel MoE layers run)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--results", default="results", help="results folder (bench/skip_prefetch.jsonl)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.shape, args.ws_mib << 20, args.threads, args.split)))
        return 0
    from tern.core.records import append_jsonl, run_metadata, summarize
    from tern.kernels.prefetch import skip_prefetch_setting

    try:
        for s in args.settings:
            skip_prefetch_setting(s)
    except ValueError as e:
        print(f"skip_prefetch: {e}", file=sys.stderr)
        return 2
    if args.rounds < 1 or args.threads < 1 or args.ws_mib < 1:
        print("skip_prefetch: --rounds, --threads and --ws-mib must be >= 1", file=sys.stderr)
        return 2
    runs: dict[str, list[dict]] = {s: [] for s in args.settings}
    for r in range(args.rounds):
        order = args.settings[r % len(args.settings):] + args.settings[:r % len(args.settings)]
        for s in order:
            env = {**os.environ, "TERN_SKIP_PREFETCH": s,
                   "NUMBA_CACHE_DIR": str(ROOT / args.results / f"numba-cache-skip-{s.replace(',', '-')}")}
            cmd = [sys.executable, __file__, "--worker", "--shape", f"{args.shape[0]}x{args.shape[1]}",
                   "--ws-mib", str(args.ws_mib), "--threads", str(args.threads), "--split", args.split]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"skip_prefetch: the {s} run failed:\n{out.stderr[-2000:]}", file=sys.stderr)
                return 1
            runs[s].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds} {s}: {runs[s][-1]['seconds_per_call'] * 1e6:.1f} us a call",
                  file=sys.stderr)
    base = None
    for s in args.settings:
        gbps = summarize([x["bytes_read_per_call"] / x["seconds_per_call"] / 1e9 for x in runs[s]])
        base = base or gbps["median"]
        row = {**run_metadata(threads=args.threads), "benchmark": "skip_prefetch", "setting": s, "split": args.split,
               "shape": list(args.shape), "working_set_bytes": runs[s][0]["working_set_bytes"],
               "rounds": args.rounds, "gbps_rows_read": gbps,
               "seconds_per_call": [x["seconds_per_call"] for x in runs[s]], "speedup_vs_first": gbps["median"] / base}
        append_jsonl(ROOT / args.results / "bench" / "skip_prefetch.jsonl", row)
        print(json.dumps({"setting": s, "gbps_median": round(gbps["median"], 2), "gbps_min": round(gbps["min"], 2),
                          "gbps_max": round(gbps["max"], 2), "speedup_vs_first": round(row["speedup_vs_first"], 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
