"""Is the probe's DRAM point of a kernel curve the same from one process to the next?

The prediction model prices a DRAM-bound matvec from the probe's kernel curves
(tern.probe.curves: the engine's kernels over a cycle of matrices adding up to each working
set). On the Intel Xeon VM of session 19 the 4-row ternary pass on 1024 x 1024 matrices over
512 MiB read at 9.2 GB/s in the committed probe (intel-xeon-amx-s19), 10.6 and 17.0 GB/s in
two curve-only re-runs the same hour, while the read kernel stayed at ~18: the probe's
slowest point of the curve, and with it the predicted DRAM stall, moved by up to 1.8x
between processes. This benchmark measures that spread: ``--rounds`` separate processes,
each timing the curve's point at ``--working-set`` (file-backed buffer, random matrix order,
the probe's own driver and timing) for each ``--shapes`` and the read kernel beside it at
the same working set. Processes alternate between numba's on-disk cache (``cached``, how a
probe normally runs) and a fresh, empty cache directory (``fresh``: every kernel compiled in
the process), because the two were seen to differ (session 19, 1024 x 1024 at 512 MiB:
cached 9.5-12.5 GB/s in six processes, fresh 16.1-18.4 in four).

Intel Xeon VM, session 19 (`--rounds 3`, GB/s per process; the read kernel 18.5 / 19.5 GB/s
medians beside them): 1024 x 1024 cached 9.5 / 9.5 / 9.9, fresh 15.7 / 16.0 / 17.4; 256 x 4096
(1 KiB rows) cached 14.8 / 14.4 / 15.7, fresh 14.3 / 14.9 / 14.9. The cached object code of the
kernel was byte for byte the code compiled fresh (objdump), and neither compiling the curve
driver without the cache (kernels still loaded from it: 9.7-10.6) nor inlining the default
wrappers into their callers (9.5-9.8) made the cached process fast: what differs is how the
loaded code runs, not the code. The engine itself decoded the 10B pick alike from a fresh
and a cached compile (158.7 against 149-153 tok/s, 1 thread, within this VM's noise), so the
cached probe's 4-row DRAM points are slower than the engine's reads: its stall is overpriced.

One JSONL row per (mode, shape) in ``<results>/bench/curve_stability.jsonl``
(tern.core.records.run_metadata, summaries of GB/s over the rounds, every process's figure,
and the read kernel's), printed as a table.

    flock /tmp/tern-cpu.lock .venv/bin/python benchmarks/curve_stability.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tern.core.host_caches import MIB
from tern.core.records import append_jsonl, run_metadata, summarize

MODES = ("cached", "fresh")
DEFAULT_SHAPES = ("1024x1024", "256x4096")


def parse_shape(text: str) -> tuple[int, int]:
    """``ROWSxCOLS`` -> (rows, cols), both >= 16 and cols a multiple of 256."""
    try:
        r, c = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is ROWSxCOLS, e.g. 1024x1024; got {text!r}") from None
    if r < 16 or c < 256 or c % 256:
        raise argparse.ArgumentTypeError(f"shape {text!r}: rows >= 16, cols a multiple of 256 (>= 256)")
    return r, c


def measure_here(shapes: list[tuple[int, int]], working_set: int) -> dict:
    """In this process: GB/s of the probe's 4-row ternary curve driver at ``working_set``
    for each shape, and the read kernel's at the same working set."""
    from tern.probe.bandwidth import read_reference
    from tern.probe.curve_buffer import CurveBuffer
    from tern.probe.curves import _weight_bytes, measure_curve
    from tern.probe.timing import TimingConfig

    buf = CurveBuffer(working_set)
    out = {}
    for r, c in shapes:
        curve = measure_curve("ternary_matvec", "serial", 1, (working_set,), buf,
                              TimingConfig(min_time_s=0.2, repeats=3, warmup_s=0.05), shape=(r, c))
        out[f"{r}x{c}"] = _weight_bytes("ternary_matvec", r, c) / curve.seconds[0] / 1e9
    out["read"] = read_reference(working_set, 1)["gbps_median"]
    return out


def run_process(mode: str, shapes: list[str], working_set: int, timeout_s: float = 900.0) -> dict:
    """One worker process in ``mode`` (``fresh``: a new, empty NUMBA_CACHE_DIR)."""
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="tern-curve-cache-") as cache:
        if mode == "fresh":
            env["NUMBA_CACHE_DIR"] = cache
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--working-set-mib",
               str(working_set // MIB), "--shapes", *shapes]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    if r.returncode != 0:
        raise RuntimeError(f"curve_stability worker ({mode}) failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="results", help="results folder (bench/curve_stability.jsonl)")
    ap.add_argument("--rounds", type=int, default=3, help="processes per mode (alternating), default 3")
    ap.add_argument("--working-set-mib", type=int, default=512, help="the curve point's working set (MiB)")
    ap.add_argument("--shapes", nargs="+", type=parse_shape, default=[parse_shape(s) for s in DEFAULT_SHAPES],
                    help="matrix shapes ROWSxCOLS (default: %(default)s)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    shapes = args.shapes
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.working_set_mib < 16:
        ap.error("--working-set-mib must be >= 16")
    ws = args.working_set_mib * MIB
    names = [f"{r}x{c}" for r, c in shapes]
    if args.worker:
        print(json.dumps(measure_here(shapes, ws)))
        return 0
    from tqdm import tqdm

    got: dict[str, list[dict]] = {m: [] for m in args.modes}
    jobs = [m for _ in range(args.rounds) for m in args.modes]
    for mode in tqdm(jobs, desc="processes", unit="process", file=sys.stderr):
        got[mode].append(run_process(mode, names, ws))
    out = Path(args.results) / "bench" / "curve_stability.jsonl"
    print(f"{'mode':<7} {'shape':<10} {'GB/s median':>11} {'min':>6} {'max':>6}  read GB/s (median)  per process")
    for mode, runs in got.items():
        read = summarize([r["read"] for r in runs])
        for name in names:
            g = [r[name] for r in runs]
            s = summarize(g)
            append_jsonl(out, {**run_metadata(threads=1), "benchmark": "curve_stability", "mode": mode,
                               "op": "ternary_matvec", "shape": name, "working_set_bytes": ws,
                               "rounds": len(runs), "gbps": s, "gbps_per_process": g,
                               "read_gbps": read, "read_gbps_per_process": [r["read"] for r in runs]})
            print(f"{mode:<7} {name:<10} {s['median']:>11.1f} {s['min']:>6.1f} {s['max']:>6.1f}  "
                  f"{read['median']:>18.1f}  {' '.join(f'{v:.1f}' for v in g)}")
    print(f"rows appended to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
