"""Does a kernel's speed hang on where the caller's stack lies? Time it at several depths.

numba does not realign a compiled function's frame: a 64-byte stack slot lies across two
cache lines or not depending on the stack pointer the caller leaves, which moves with the
Python call depth (here: nested ``map`` frames) and from one process to the next. A kernel
that spills a vector and reads it straight back pays a failed store-to-load forward each
time the slot straddles a line. Session 28 (AMD EPYC Zen 4 VM, 1 thread): the 4-row ternary
pass over 512 x 384 ran 5.5 us at one depth and 2.9 at the next, alternating with each
frame, until the partial-segment tail stopped spilling (tern.kernels.simd ``half_tail``);
the probe's partial-segment cost had come out 1.0 or 5.5 ns a row by the same chance.

Each arm runs in its own process (``--code-root DIR``: import tern from DIR; ``.``: this
checkout), timing the engine's 1-thread row pass (kernels_ternary.ternary_matvec_next, the
4-row and the one-row form) on ``--shapes`` and ``Engine.step`` on ``--models`` at stack
depths 0 .. ``--depths``-1, one JSONL row per (arm, op, depth) in ``--out``. Run arms in
alternating processes, each with its own ``NUMBA_CACHE_DIR``:

    for r in 1 2 3; do for root in /tmp/old .; do
      NUMBA_CACHE_DIR=/tmp/nb-$(basename $root) flock /tmp/tern-cpu.lock \\
        .venv/bin/python benchmarks/stack_depth.py --code-root $root --round $r; done; done
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def at_depth(depth: int, fn):
    """fn() called under ``depth`` extra C frames (each map + lambda moves the stack pointer)."""
    if depth == 0:
        return fn()
    return next(map(lambda _: at_depth(depth - 1, fn), [0]))


def time_at_depths(fn, depths: int, repeats: int, count: int, before=None) -> list[list[float]]:
    """Seconds per fn() call, ``repeats`` samples of ``count`` calls at each depth (``before()``
    untimed ahead of each sample)."""
    out = []
    for d in range(depths):
        at_depth(d, lambda: [fn() for _ in range(4)])
        samples = []
        for _ in range(repeats):
            if before is not None:
                before()
            t0 = time.perf_counter()
            at_depth(d, lambda: [fn() for _ in range(count)])
            samples.append((time.perf_counter() - t0) / count)
        out.append(samples)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code-root", default=".", help="import tern from this checkout (default: this one)")
    ap.add_argument("--round", default="1", help="free label of the round (alternating processes)")
    ap.add_argument("--shapes", nargs="*", default=["512x384", "1536x384", "256x640", "512x512"],
                    help="ROWSxCOLS of the row-pass matrices (cache-resident)")
    ap.add_argument("--models", nargs="*", default=["105m", "30m", "sandbox"],
                    help="presets (tern.core.config) whose random packed model Engine.step decodes")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="Engine threads")
    ap.add_argument("--depths", type=int, default=2, help="stack depths 0 .. N-1 (default 2: the two parities)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default="results/bench/stack_depth.jsonl")
    ap.add_argument("--models-dir", default="results/models")
    a = ap.parse_args(argv)
    if a.depths < 1 or a.repeats < 1:
        ap.error("--depths and --repeats must be >= 1")
    try:
        shapes = [tuple(int(v) for v in text.lower().split("x")) for text in a.shapes]
    except ValueError:
        shapes = []
    if len(shapes) != len(a.shapes) or any(len(s) != 2 or min(s) < 1 for s in shapes):
        ap.error(f"--shapes takes ROWSxCOLS with positive sizes, e.g. 512x384 (got {a.shapes})")
    root = str(Path(a.code_root).resolve())
    sys.path.insert(0, root)
    import numpy as np

    import tern
    from tern.core.config import get_preset
    from tern.core.records import append_jsonl, git_commit, run_metadata, summarize
    from tern.kernels import kernels_ternary as kt
    from tern.kernels.packing import random_ternary2
    from tern.measure.sweep_models import ensure_model
    from tern.run.engine import Engine

    if not Path(tern.__file__).resolve().is_relative_to(root):
        ap.error(f"tern is already imported from {Path(tern.__file__).parent}, not from --code-root {root}: "
                 "run each arm in its own process")
    commit = git_commit()  # the checkout tern was imported from: the code root's
    base = {"benchmark": "stack_depth", "code_root": root, "code_commit": commit, "round": a.round,
            "repeats": a.repeats}

    def record(op, threads, per_depth, unit_calls):
        meds = []
        for d, samples in enumerate(per_depth):
            s = summarize(samples)
            meds.append(f"{s['median'] * 1e6:9.2f}")
            row = {**run_metadata(threads), **base, "op": op, "depth": d, "seconds_per_call": s,
                   "calls_per_sample": unit_calls}
            append_jsonl(a.out, row)
        meds = " ".join(meds)
        print(f"{commit[:7] + commit[40:]:>13} {op:<28} t{threads} us by depth: {meds}", flush=True)

    rng = np.random.default_rng(0)
    none = np.zeros((1, 0), np.uint8)
    for rows, cols in shapes:
        P = random_ternary2(rows, cols, seed=1)
        S, out = np.ones(rows, np.float32), np.zeros(rows, np.float32)
        xq = rng.integers(-127, 128, cols).astype(np.int8)
        for one_row in (False, True):
            def call(P=P, S=S, xq=xq, out=out, one_row=one_row):
                kt.ternary_matvec_next(P, S, xq, np.float32(0.01), out, one_row, kt.ROW_PREFETCH, none)
            record(f"{'1row' if one_row else '4row'} {rows}x{cols}", 1,
                   time_at_depths(call, a.depths, a.repeats, 1000), 1000)
    for name in a.models:
        path = ensure_model(get_preset(name), Path(a.models_dir))
        for t in a.threads:
            eng = Engine(path, threads=t)
            tok = iter(range(1 << 30))

            def step(eng=eng, tok=tok):
                eng.step(next(tok) % 100)

            def fresh(eng=eng):  # each sample decodes tokens 17 .. 144 of a new sequence
                eng.reset()
                for _ in range(16):
                    step()
            per_depth = time_at_depths(step, a.depths, a.repeats, 128, before=fresh)
            eng.close()
            record(f"Engine.step {name}", t, per_depth, 128)
    print(f"rows appended to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
