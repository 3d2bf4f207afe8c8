"""Does 2-thread decoding follow where the threads' cores sit? Watch both for a while.

On the 2-vCPU AMD EPYC Zen 4 VM the cache-resident peers decoded at 2 threads in two bands
(28M: 1.6-1.8x one thread or 1.1-1.2x) that moved within minutes. Session 29 timed the
threads' cache-line round trip beside them (tern.probe.core_latency): ~55 ns in the fast band,
~356 ns in the slow one (vCPUs on cores that share no L3). This script keeps watching: every
``--every`` seconds for ``--minutes`` it times the round trip, then each ``--models`` file's
``Engine.step`` at 1 and 2 threads (interleaved, ``--tokens`` tokens x ``--repeats`` after a
warm-up), then the round trip again, and appends one JSONL row per model and sample
(tern.core.records.run_metadata; round trip before / after, tok/s at 1 and 2 threads and their
ratio) to ``--out``. ``--plot FILE.png`` draws 2 threads over 1 against the round trip from the
rows in ``--out`` (no timing).

    flock /tmp/tern-cpu.lock .venv/bin/python benchmarks/core_bands.py --minutes 30 \\
        --models results/models/peers/peer-28m-*.tern results/models/peers/peer-5.6m-*.tern
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

DEFAULT_OUT = "benchmarks/core_bands/core_bands.jsonl"


def sample(engines: dict[int, object], tokens, repeats: int) -> dict[int, float]:
    """tok/s of each engine: median of ``repeats`` runs of ``tokens``, thread counts interleaved."""
    from tern.run.timing import time_steps

    got: dict[int, list[float]] = {t: [] for t in engines}
    for _ in range(repeats):
        for t, eng in engines.items():
            got[t].append(1.0 / time_steps(eng, tokens))
    return {t: statistics.median(v) for t, v in got.items()}


def watch(models: list[Path], minutes: float, every: float, tokens: int, repeats: int, out: Path,
          progress: bool = True) -> list[dict]:
    import numpy as np

    from tern.core.records import append_jsonl, run_metadata
    from tern.probe.core_latency import round_trip_ns
    from tern.run.engine import Engine

    rng = np.random.default_rng(0)
    engines = {}
    for m in models:
        engines[m] = {t: Engine(m, threads=t) for t in (1, 2)}
        toks = rng.integers(0, engines[m][1].cfg.vocab_size, size=tokens)
        sample(engines[m], toks, 2)  # compile and warm the caches
    rows, end = [], time.monotonic() + 60 * minutes
    while True:
        t0 = time.monotonic()
        for m, engs in engines.items():
            toks = rng.integers(0, engs[1].cfg.vocab_size, size=tokens)
            before = round_trip_ns()
            tps = sample(engs, toks, repeats)
            after = round_trip_ns()
            row = {**run_metadata(threads=2), "benchmark": "core_bands", "model": str(m),
                   "config_name": engs[1].cfg.name, "tokens": tokens, "repeats": repeats,
                   "round_trip_before_ns": before, "round_trip_after_ns": after,
                   "tok_per_s_1t": tps[1], "tok_per_s_2t": tps[2], "two_over_one": tps[2] / tps[1]}
            append_jsonl(out, row)
            rows.append(row)
            if progress:
                print(f"{row['timestamp']} {m.name[:28]:<28} round trip {before} / {after} ns  "
                      f"1t {tps[1]:8.0f}  2t {tps[2]:8.0f} tok/s  2t/1t {row['two_over_one']:.2f}",
                      file=sys.stderr, flush=True)
        if time.monotonic() >= end:
            return rows
        time.sleep(max(0.0, every - (time.monotonic() - t0)))


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name in sorted({r["config_name"] for r in rows}):
        mine = [r for r in rows if r["config_name"] == name and r["round_trip_before_ns"] and r["round_trip_after_ns"]]
        ax.scatter([(r["round_trip_before_ns"] + r["round_trip_after_ns"]) / 2 for r in mine],
                   [r["two_over_one"] for r in mine], label=name, s=18)
    ax.set_xscale("log")
    ax.set_xlabel("threads' cache-line round trip (ns, mean of before / after)")
    ax.set_ylabel("2 threads / 1 thread (tok/s ratio)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.legend(fontsize=8)
    ax.set_title("2-thread decode against where the threads' cores sit", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", type=Path, help="packed .tern files (cache-resident ones show it best)")
    ap.add_argument("--minutes", type=float, default=10.0, help="how long to watch")
    ap.add_argument("--every", type=float, default=30.0, help="seconds from one sample to the next")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help="JSONL rows are appended here")
    ap.add_argument("--plot", type=Path, default=None, help="draw the rows of --out into this PNG (no timing)")
    a = ap.parse_args(argv)
    if a.plot is not None:
        from tern.core.records import read_jsonl

        rows = [r for r in read_jsonl(a.out) if r.get("benchmark") == "core_bands"]
        if not rows:
            ap.error(f"no core_bands rows in {a.out}")
        plot(rows, a.plot)
        print(f"wrote {a.plot} from {len(rows)} rows", file=sys.stderr)
        return 0
    if not a.models:
        ap.error("--models is required (or --plot)")
    missing = [str(m) for m in a.models if not m.is_file()]
    if missing:
        ap.error(f"no such model file: {', '.join(missing)}")
    if a.minutes < 0 or a.every <= 0 or a.tokens < 1 or a.repeats < 1:
        ap.error("need --minutes >= 0, --every > 0, --tokens >= 1, --repeats >= 1")
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        ap.error("needs 2 numba threads (NUMBA_NUM_THREADS >= 2 on a machine with 2 CPUs)")
    watch(a.models, a.minutes, a.every, a.tokens, a.repeats, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
