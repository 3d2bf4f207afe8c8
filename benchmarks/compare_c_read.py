"""DRAM read bandwidth: tern's numba read kernel against an independent C kernel.

Compiles benchmarks/c_read_bandwidth.c with ``gcc -O3 -march=native`` (OpenMP when the
compiler has it), runs it and tern's read kernel (tern.probe.bandwidth.calibrate_point)
at the same DRAM-sized working set (default max(1 GiB, 8 x LLC)) for each thread count.

Paired rounds: the numba side is calibrated once; then each round takes ONE timed C run
(a fresh process: allocate, touch, warm up, one run) and ONE timed numba run, the side
that goes first alternating between rounds. Both sides so sample the same regimes of a
drifting shared machine, and the robust comparison is the median of the per-round
ratios numba / C. Prints each side's median and range and that paired ratio, and
appends one JSONL row per thread count (tern.core.records: run metadata, each side's runs
and summary, the per-round ratios).

    .venv/bin/python benchmarks/compare_c_read.py                 # 1 and all threads
    .venv/bin/python benchmarks/compare_c_read.py --threads 1 --ws-mib 2048 --rounds 9

A benchmark, not a unit test: the issue's acceptance is that the two agree within 10 %.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tern.core.host_caches import detect_caches
from tern.core.host_profile import HostProfile
from tern.core.records import append_jsonl, run_metadata, summarize
from tern.probe.bandwidth import (
    GIB,
    MIB,
    SweepBuffers,
    calibrate_point,
    compile_kernels,
    format_bytes,
    numba_threads,
)
from tern.probe.profile import default_thread_counts
from tern.probe.timing import Calibrated, TimingConfig

SRC = Path(__file__).resolve().parent / "c_read_bandwidth.c"
CFLAGS = ["-O3", "-march=native"]


def compile_c(cc: str, workdir: Path) -> tuple[Path, list[str]]:
    """The C benchmark binary and the flags it was built with (OpenMP if available)."""
    if shutil.which(cc) is None:
        raise SystemExit(f"compiler {cc!r} not found; install gcc or pass --cc")
    exe = workdir / "c_read_bandwidth"
    for flags in (CFLAGS + ["-fopenmp"], CFLAGS):
        r = subprocess.run([cc, *flags, str(SRC), "-o", str(exe)], capture_output=True, text=True)
        if r.returncode == 0:
            return exe, flags
    raise SystemExit(f"{cc} failed to compile {SRC}:\n{r.stderr}")


def run_c(exe: Path, ws: int, threads: int, min_time_s: float) -> dict:
    """One timed run of the C kernel (its own warm-up first), as its JSON output."""
    r = subprocess.run([str(exe), str(ws), str(threads), str(min_time_s), "1"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def paired_rounds(run_c_once: Callable[[], float], numba: Calibrated, rounds: int,
                  bytes_per_pass: int) -> tuple[list[float], list[float], list[str]]:
    """``rounds`` rounds of one C run and one numba run (GB/s each), the side that goes
    first alternating (C first in round 0). Returns C runs, numba runs, and who went first."""
    c_runs: list[float] = []
    first: list[str] = []
    for r in range(rounds):
        if r % 2 == 0:
            c_runs.append(run_c_once())
            numba.time_once()
        else:
            numba.time_once()
            c_runs.append(run_c_once())
        first.append("c" if r % 2 == 0 else "numba")
    nb_runs = [g / 1e9 for g in numba.timing().rates(bytes_per_pass)]
    return c_runs, nb_runs, first


def _range(s: dict) -> str:
    return f"{s['median']:.1f} [{s['min']:.1f}-{s['max']:.1f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ws-mib", type=int, default=None,
                    help="working set in MiB (default: max(1 GiB, 8 x last-level cache))")
    ap.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1 and all)")
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per timed run (default 0.2)")
    ap.add_argument("--rounds", type=int, default=9,
                    help="paired rounds, each one C run and one numba run (default 9): the "
                         "timed runs per side")
    ap.add_argument("--cc", default="gcc", help="C compiler (default gcc)")
    ap.add_argument("--out", default="results/bench_c_read.jsonl", help="JSONL file rows are appended to")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")

    caches, source = detect_caches()
    llc = HostProfile("caches only", False, {}, caches, source, ()).llc_bytes
    ws = args.ws_mib * MIB if args.ws_mib else max(1 * GIB, 8 * llc)
    threads = [int(t) for t in args.threads.split(",")] if args.threads else list(default_thread_counts())
    timing = TimingConfig(min_time_s=args.min_time, repeats=args.rounds, warmup_s=args.min_time / 4)
    cc_version = subprocess.run([args.cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]

    print(f"read bandwidth at {format_bytes(ws)} (LLC {format_bytes(llc)}), {args.rounds} paired rounds "
          f"(one C and one numba run >= {args.min_time} s each); C: {cc_version}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        exe, flags = compile_c(args.cc, Path(tmp))
        if "-fopenmp" not in flags:
            print("note: no OpenMP; the C side runs one thread", file=sys.stderr)
        compile_kernels()
        buffers = None
        print(f"{'threads':>7} {'C GB/s':>18} {'numba GB/s':>18} {'numba/C paired':>22}  "
              f"(median [min-max] over rounds)")
        for t in threads:
            if t > 1 and "-fopenmp" not in flags:
                print(f"{t:>7} skipped: the C side has no OpenMP", file=sys.stderr)
                continue
            buffers = buffers or SweepBuffers(ws)
            c_out: list[dict] = []

            def c_once(t=t, c_out=c_out) -> float:
                c_out.append(run_c(exe, ws, t, args.min_time))
                return float(c_out[-1]["gbps_runs"][0])

            with numba_threads(t):
                numba, nb_ws = calibrate_point("read", ws, t, buffers, timing)
                c_runs, nb_runs, first = paired_rounds(c_once, numba, args.rounds, nb_ws)
            ratios = [n / c for n, c in zip(nb_runs, c_runs, strict=True)]  # per round
            c_sum, nb_sum, ratio_sum = summarize(c_runs), summarize(nb_runs), summarize(ratios)
            print(f"{t:>7} {_range(c_sum):>18} {_range(nb_sum):>18} "
                  f"{ratio_sum['median']:>8.3f} [{ratio_sum['min']:.3f}-{ratio_sum['max']:.3f}]")
            append_jsonl(args.out, {
                **run_metadata(threads=t), "benchmark": "c_read_vs_numba_read",
                "working_set_bytes": nb_ws, "c_working_set_bytes": c_out[0]["working_set_bytes"],
                "c_compiler": cc_version, "c_flags": flags, "c_openmp": "-fopenmp" in flags,
                "min_time_s": args.min_time, "rounds": args.rounds, "order": "paired_rounds",
                "first_per_round": first,
                "c_runs_gbps": c_runs, "numba_runs_gbps": nb_runs, "numba_over_c_per_round": ratios,
                "c_gbps": c_sum, "numba_gbps": nb_sum, "numba_over_c_paired": ratio_sum,
                "numba_over_c_paired_median": ratio_sum["median"],
                "numba_over_c_median": nb_sum["median"] / c_sum["median"],  # ratio of medians
            })
    print(f"rows appended to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
