"""One decode measurement in its own process: ``python -m tern.measure.sweep_worker MODEL ...``.

Prints one JSON object: tok/s per repeat and their summary, the engine's settings and the
process's peak RSS (so each sweep point's memory is its own). Tokens fed are uniformly
random ids (seeded): routing then has no temporal locality, as the reference project
observed for real text, so expert reuse in cache is not flattered by repetitive input.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def time_decode(engine: Any, tokens: int, repeats: int, warmup: int, seed: int = 0,
                min_time_s: float = 0.0) -> dict[str, Any]:
    """tok/s of ``engine.step`` over ``repeats`` samples, after ``warmup`` untimed tokens.
    A sample is one or more runs of ``tokens`` random token ids, each from a reset engine
    state (so every run decodes the same context lengths), repeated until the sample has
    timed at least ``min_time_s`` seconds: a 64-token run of a small model lasts a few
    milliseconds, shorter than the hiccups of a shared machine, and one hiccup then decides
    a whole sample. ``runs_per_sample``: how many runs each sample took."""
    from tern.core.records import summarize
    from tern.run.timing import time_steps

    if not (tokens >= 1 and repeats >= 1 and warmup >= 0):
        raise ValueError(f"need tokens >= 1, repeats >= 1, warmup >= 0; got {tokens}, {repeats}, {warmup}")
    if not (isinstance(min_time_s, (int, float)) and 0 <= min_time_s <= 60):
        raise ValueError(f"min_time_s must be a number of seconds in [0, 60], got {min_time_s!r}")
    rng = np.random.default_rng(seed)
    V = engine.cfg.vocab_size
    if warmup:
        time_steps(engine, rng.integers(0, V, size=warmup))
    samples, runs = [], []
    for _ in range(repeats):
        seconds, n = 0.0, 0
        while n == 0 or seconds < min_time_s:
            seconds += time_steps(engine, rng.integers(0, V, size=tokens)) * tokens
            n += 1
        samples.append(n * tokens / seconds)
        runs.append(n)
    s = summarize(samples)
    return {"tok_per_s": s["median"], "tok_per_s_min": s["min"], "tok_per_s_max": s["max"],
            "repeats": s["repeats"], "spread_rel": s["spread_rel"], "samples_tok_per_s": samples,
            "runs_per_sample": runs, "min_time_s": float(min_time_s)}


def peak_rss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)  # Linux reports KiB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tern.measure.sweep_worker", description=__doc__)
    ap.add_argument("model", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-time-s", type=float, default=0.0,
                    help="each sample repeats its run of --tokens until it has timed this many seconds")
    ap.add_argument("--region", action=argparse.BooleanOptionalAction, default=None,
                    help="the engine's one-region token step at threads > 1 (default: the engine's "
                         "default, on); --no-region: a parallel region per large matrix")
    from tern.kernels.policy import LAYOUT_MODES

    ap.add_argument("--layout", choices=LAYOUT_MODES, default="auto", help="Engine(layout=...)")
    args = ap.parse_args(argv)
    from tern.run.engine import Engine

    t0 = time.perf_counter()
    try:
        eng = Engine(args.model, threads=args.threads, region="auto" if args.region is None else args.region,
                     layout=args.layout)
    except ValueError as e:
        print(f"sweep worker: {e}", file=sys.stderr)
        return 2
    load_s = time.perf_counter() - t0
    rss_loaded = peak_rss_bytes()
    try:
        res = time_decode(eng, args.tokens, args.repeats, args.warmup, args.seed, args.min_time_s)
    except ValueError as e:
        print(f"sweep worker: {e}", file=sys.stderr)
        return 2
    from tern.kernels.ops_region import run_policy

    policy = run_policy(eng.par_min_weights, eng.region_params if eng.region else None, eng.stream_prefetch,
                        eng.stream_dram, eng.layout == "blocked16")
    out = {**res, "load_s": load_s, "rss_after_load_bytes": rss_loaded,
           "peak_rss_bytes": peak_rss_bytes(), "engine": eng.describe(), "engine_policy": policy.to_dict()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
