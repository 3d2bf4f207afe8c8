"""DRAM read bandwidth: tern's numba read kernel against an independent C kernel.

Compiles benchmarks/c_read_bandwidth.c with ``gcc -O3 -march=native`` (OpenMP when the
compiler has it), runs it and tern's read kernel (tern.probe_bandwidth.measure_point) at
the same DRAM-sized working set (default max(1 GiB, 8 x LLC)) for each thread count,
prints both figures and their ratio, and appends one JSONL row per thread count
(tern.records: run metadata + repeats / median / spread of both sides).

    .venv/bin/python benchmarks/compare_c_read.py                 # 1 and all threads
    .venv/bin/python benchmarks/compare_c_read.py --threads 1 --ws-mib 2048

A benchmark, not a unit test: the issue's acceptance is that the two agree within 10 %.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tern.host_profile import HostProfile
from tern.probe import default_thread_counts
from tern.probe_bandwidth import GIB, MIB, SweepBuffers, format_bytes, measure_point
from tern.probe_caches import detect_caches
from tern.probe_timing import TimingConfig
from tern.records import append_jsonl, run_metadata, summarize

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


def run_c(exe: Path, ws: int, threads: int, timing: TimingConfig) -> dict:
    r = subprocess.run([str(exe), str(ws), str(threads), str(timing.min_time_s), str(timing.repeats)],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ws-mib", type=int, default=None,
                    help="working set in MiB (default: max(1 GiB, 8 x last-level cache))")
    ap.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1 and all)")
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per timed run (default 0.2)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per side and round (default 3)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="C and numba take turns this many times, so drift on a shared machine "
                         "hits both sides alike (default 3)")
    ap.add_argument("--cc", default="gcc", help="C compiler (default gcc)")
    ap.add_argument("--out", default="results/bench_c_read.jsonl", help="JSONL file rows are appended to")
    args = ap.parse_args(argv)

    caches, source = detect_caches()
    llc = HostProfile("caches only", False, {}, caches, source, ()).llc_bytes
    ws = args.ws_mib * MIB if args.ws_mib else max(1 * GIB, 8 * llc)
    threads = [int(t) for t in args.threads.split(",")] if args.threads else list(default_thread_counts())
    timing = TimingConfig(min_time_s=args.min_time, repeats=args.repeats, warmup_s=args.min_time / 4)
    cc_version = subprocess.run([args.cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]

    print(f"read bandwidth at {format_bytes(ws)} (LLC {format_bytes(llc)}), {args.rounds} rounds x "
          f"{args.repeats} runs >= {args.min_time} s per side; C: {cc_version}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        exe, flags = compile_c(args.cc, Path(tmp))
        if "-fopenmp" not in flags:
            print("note: no OpenMP; the C side runs one thread", file=sys.stderr)
        buffers = None
        print(f"{'threads':>7} {'C GB/s':>8} {'numba GB/s':>10} {'numba/C':>8}  (medians; best in brackets)")
        for t in threads:
            if t > 1 and "-fopenmp" not in flags:
                print(f"{t:>7} skipped: the C side has no OpenMP", file=sys.stderr)
                continue
            c_runs: list[float] = []
            nb_runs: list[float] = []
            for _ in range(args.rounds):
                c = run_c(exe, ws, t, timing)
                c_runs += c["gbps_runs"]
                buffers = buffers or SweepBuffers(ws)
                point, timing_nb = measure_point("read", ws, t, buffers, timing)
                nb_runs += [r / 1e9 for r in timing_nb.rates(point.working_set_bytes)]
            c_sum, nb_sum = summarize(c_runs), summarize(nb_runs)
            ratio = nb_sum["median"] / c_sum["median"]
            print(f"{t:>7} {c_sum['median']:>8.1f} {nb_sum['median']:>10.1f} {ratio:>8.3f}  "
                  f"[{c_sum['max']:.1f} / {nb_sum['max']:.1f}]")
            append_jsonl(args.out, {
                **run_metadata(threads=t), "benchmark": "c_read_vs_numba_read",
                "working_set_bytes": point.working_set_bytes, "c_working_set_bytes": c["working_set_bytes"],
                "c_compiler": cc_version, "c_flags": flags, "c_openmp": "-fopenmp" in flags,
                "min_time_s": args.min_time, "rounds": args.rounds,
                "c_gbps": c_sum, "numba_gbps": nb_sum, "numba_over_c_median": ratio,
            })
    print(f"rows appended to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
