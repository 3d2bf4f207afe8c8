"""The activation-skip kernel with the zeros of a real token: one activation pattern repeated
against a fresh pattern every call.

The skip kernel (tern.kernels.kernels_ternary.ternary_matvec_skip: the down projections of
dReLU / ReLU^2 MLPs) first lists the nonzero hidden units (``skip_groups``). A token's zeros
fall differently every token; a benchmark that calls the kernel on one activation vector
again and again lets the CPU's branch predictor learn where they are. Session 49 (Zen 5 VM)
found the engine's down projections 3x slower inside a token than alone for this reason
(``benchmarks/op_breakdown.py``: 12.1 us a token for sweep-4m-e1's two, the dense row pass
3.6), and made the listing branch-free. This times, per shape, in one process and in
interleaved rounds:

- ``skip_groups`` alone and the whole kernel,
- with ``--patterns`` different activation vectors cycled (``fresh``) and with one (``repeated``),
- over ``--copies`` matrices cycled (default 16: 2 MiB for 2048 x 256, past L2, as in a token).

    flock /tmp/tern-cpu.lock .venv/bin/python benchmarks/skip_patterns.py [--shapes 2048x256 4096x512]

One JSONL row per shape (<results>/bench/skip_patterns.jsonl): run metadata, per way the
median microseconds per call over rounds and their spread; the summary prints fresh / repeated.
"""

from __future__ import annotations

import argparse
import sys
import time

import numba
import numpy as np

from tern.core.records import append_jsonl, run_metadata, summarize
from tern.kernels.kernels_ternary import skip_groups, ternary_matvec_skip
from tern.kernels.packing import random_ternary2

DENSITY = 0.25  # nonzero hidden units of a dReLU MLP at random initialisation (tern.predict.inventory)


@numba.njit(cache=True)
def _kernel_calls(mats, scale, acts, out, n):
    for i in range(n):
        ternary_matvec_skip(mats[i % mats.shape[0]], scale, acts[i % acts.shape[0]], np.float32(1.0), out)


@numba.njit(cache=True)
def _listing_calls(acts, n):
    total = 0
    for i in range(n):
        idx, _qq, _qsum = skip_groups(acts[i % acts.shape[0]])
        total += idx.shape[0]
    return total


def activations(inputs: int, patterns: int, density: float, seed: int = 0) -> np.ndarray:
    """(patterns, inputs) int8 activations, ``density`` of them nonzero at random places."""
    rng = np.random.default_rng(seed)
    acts = rng.integers(1, 128, (patterns, inputs)).astype(np.int8)
    acts[rng.random((patterns, inputs)) >= density] = 0
    return acts


def time_shape(inputs: int, outputs: int, copies: int, patterns: int, rounds: int, calls: int) -> dict:
    """Median microseconds per call of each way (kernel / listing x fresh / repeated) over ``rounds``."""
    mats = np.stack([random_ternary2(inputs, outputs, seed=s) for s in range(copies)])
    scale, out = np.ones(outputs, np.float32), np.zeros(outputs, np.float32)
    fresh = activations(inputs, patterns, DENSITY)
    ways = {"kernel fresh": lambda n: _kernel_calls(mats, scale, fresh, out, n),
            "kernel repeated": lambda n: _kernel_calls(mats, scale, fresh[:1], out, n),
            "listing fresh": lambda n: _listing_calls(fresh, n),
            "listing repeated": lambda n: _listing_calls(fresh[:1], n)}
    for run in ways.values():  # compile and warm
        run(16)
    samples: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(rounds):
        for w, run in ways.items():
            t = time.perf_counter()
            run(calls)
            samples[w].append((time.perf_counter() - t) / calls * 1e6)
    return {w: summarize(v) for w, v in samples.items()}


def parse_shape(text: str) -> tuple[int, int]:
    a, sep, b = text.lower().partition("x")
    if not sep or not a.isdigit() or not b.isdigit() or int(a) < 1 or int(b) < 1:
        raise argparse.ArgumentTypeError(f"shape must be INPUTSxOUTPUTS, e.g. 2048x256, got {text!r}")
    return int(a), int(b)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", type=parse_shape, default=[(2048, 256), (4096, 512), (2048, 1024)],
                    help="INPUTSxOUTPUTS of the transposed down projections (default: the 4m / 30m sweep "
                         "families' and a d1024 one)")
    ap.add_argument("--copies", type=int, default=16, help="matrices cycled (default 16)")
    ap.add_argument("--patterns", type=int, default=1024, help="activation vectors cycled in the fresh way")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=3000, help="calls per timed sample")
    ap.add_argument("--results", default="results", help="results folder (bench/skip_patterns.jsonl)")
    args = ap.parse_args(argv)
    if min(args.copies, args.patterns, args.rounds, args.calls) < 1:
        ap.error("--copies, --patterns, --rounds and --calls must be >= 1")
    for inputs, outputs in args.shapes:
        res = time_shape(inputs, outputs, args.copies, args.patterns, args.rounds, args.calls)
        row = {**run_metadata(threads=1), "kind": "skip_patterns", "inputs": inputs, "outputs": outputs,
               "density": DENSITY, "copies": args.copies, "patterns": args.patterns, "rounds": args.rounds,
               "calls": args.calls, "us_per_call": res}
        append_jsonl(f"{args.results}/bench/skip_patterns.jsonl", row)
        med = {w: s["median"] for w, s in res.items()}
        print(f"{inputs}x{outputs}: kernel {med['kernel fresh']:.2f} us fresh / {med['kernel repeated']:.2f} "
              f"repeated ({med['kernel fresh'] / med['kernel repeated']:.2f}x); listing {med['listing fresh']:.2f} / "
              f"{med['listing repeated']:.2f} us ({med['listing fresh'] / med['listing repeated']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
