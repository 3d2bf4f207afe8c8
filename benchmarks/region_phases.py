"""Where the one-region step's time goes at 2+ threads, phase by phase (issue 16: "2 threads >= 1.6x
1 thread on models >= 28M"): the region step compiled with the phase clock
(``TERN_PHASE_CLOCK=1``, tern.kernels.region) keeps, per token, the cycle at which each phase's
last item finished. The same engine is timed two ways in one process, interleaved rounds:

- ``threads``: the region step on its threads (what ``Engine.step`` runs);
- ``walk``: the same step walked by one thread (numba's threads set to 1: that thread claims
  every item of every phase in turn), i.e. the same phases and row ranges without a second thread.

Per way, the median over tokens of each phase's microseconds, summed over the phases with one
item ("single": norms, quantizers, residuals, routing - one thread runs them while the others
wait) and over the phases with several ("split": matrix row ranges, heads, chosen experts, scan
channels). A split phase's walk / threads ratio is what the second thread buys there (the
threads' count at most); a single phase's threads - walk difference is the hand-over's cost. The
clock's atomics add a little to every item, so compare the two ways, not these totals with
unclocked figures (``Engine.step`` of the unclocked build: ``benchmarks/op_breakdown.py``).

    TERN_PHASE_CLOCK=1 NUMBA_CACHE_DIR=/tmp/tern-phase-clock flock /tmp/tern-cpu.lock \\
        .venv/bin/python benchmarks/region_phases.py --model results/models/peers/peer-28m-*.tern

(own ``NUMBA_CACHE_DIR``: the clocked build replaces the unclocked one in a shared cache). One
JSONL row per run (<results>/bench/region_phases.jsonl: run_metadata, per way the totals,
per-phase medians: ``ways.threads`` / ``ways.walk``; items per phase).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numba
import numpy as np

from tern.kernels.region import cycles_per_second


def clocked_tokens(engine, tokens: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Each token's phase cycles (tern.kernels.region.phase_clock) after a reset, and the items
    per phase (the same for every token: the phase sequence depends on the model only)."""
    from tern.kernels.region import phase_clock

    step, before, after = engine.fused_call()  # the region step and the engine's buffers
    ctr, scal = after[-2], after[-1]
    engine.reset()
    rows, items = [], None
    for t in tokens:
        step(*before, int(t), *after)
        n = int(scal[-1])  # phases this token used (token_step_region writes it)
        cyc, done = phase_clock(ctr, n)
        rows.append(cyc)
        items = done
    return rows, items


def summarise(rows: list[np.ndarray], items: np.ndarray, hz: float) -> dict:
    """Median microseconds per phase and per token, and their sums over single and split phases."""
    n = min(len(r) for r in rows)
    per = np.median(np.array([r[:n] for r in rows]), axis=0) / hz * 1e6  # (n,) us
    single = items[:n] == 1
    return {"token_us": float(np.median([r.sum() for r in rows]) / hz * 1e6),
            "single_us": float(per[single].sum()), "split_us": float(per[~single].sum()),
            "phases": int(n), "single_phases": int(single.sum()), "phase_us": [round(float(v), 3) for v in per]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a packed .tern file")
    ap.add_argument("--threads", type=int, default=2, help="the region step's threads (>= 2; default 2)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per round, from a reset (default 64)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per way (default 5)")
    ap.add_argument("--results", default="results", help="results folder (rows: <results>/bench/region_phases.jsonl)")
    a = ap.parse_args(argv)
    from tern.kernels.region import PHASE_CLOCK

    if not PHASE_CLOCK:
        ap.error("the phase clock is compiled in at import: run with TERN_PHASE_CLOCK=1 (and its own NUMBA_CACHE_DIR)")
    if a.threads < 2 or a.tokens < 1 or a.rounds < 1:
        ap.error("need --threads >= 2, --tokens >= 1, --rounds >= 1")
    if a.threads > numba.config.NUMBA_NUM_THREADS:
        ap.error(f"--threads {a.threads} exceeds numba's {numba.config.NUMBA_NUM_THREADS} threads")
    from tern.core.records import append_jsonl, run_metadata
    from tern.run.engine import Engine

    try:
        eng = Engine(a.model, threads=a.threads, region=True)
    except (OSError, ValueError) as e:  # a missing or invalid model file: say which, no traceback
        ap.error(str(e))
    hz = cycles_per_second()
    tokens = np.random.default_rng(0).integers(0, eng.cfg.vocab_size, a.tokens)
    ways = {"threads": a.threads, "walk": 1}
    rows: dict[str, list[np.ndarray]] = {w: [] for w in ways}
    items = None
    for nt in ways.values():  # warm-up (compiles)
        numba.set_num_threads(nt)
        clocked_tokens(eng, tokens[:8])
    for _ in range(a.rounds):
        for w, nt in ways.items():
            numba.set_num_threads(nt)
            r, items = clocked_tokens(eng, tokens)
            rows[w] += r
    numba.set_num_threads(a.threads)
    out = {w: summarise(rows[w], items, hz) for w in ways}
    th, wk = out["threads"], out["walk"]
    print(f"{Path(a.model).name}: {th['phases']} phases ({th['single_phases']} single-item), "
          f"medians over {a.rounds} x {a.tokens} tokens, us per token")
    print(f"  {'':8s} {'token':>8s} {'single':>8s} {'split':>8s}")
    for w in ways:
        o = out[w]
        print(f"  {w:8s} {o['token_us']:8.1f} {o['single_us']:8.1f} {o['split_us']:8.1f}")
    print(f"  walk / threads: token x{wk['token_us'] / th['token_us']:.2f}, split phases "
          f"x{wk['split_us'] / th['split_us']:.2f}; single phases +{th['single_us'] - wk['single_us']:.1f} us "
          f"({(th['single_us'] - wk['single_us']) / max(th['single_phases'], 1) * 1e3:.0f} ns each)")
    row = {"record": "region_phases", "model": str(a.model), "tokens": a.tokens, "rounds": a.rounds,
           "cycles_per_s": hz, "items_per_phase": [int(v) for v in items], "ways": out,
           **run_metadata(a.threads)}
    path = Path(a.results) / "bench" / "region_phases.jsonl"
    append_jsonl(path, row)
    print(f"row appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
