"""One model file decoded by two (or more) checkouts of tern in the same run: what a code
change bought, measured where a drifting VM hits both alike.

Each measurement is ``python -m tern.measure.sweep_worker`` (the sweep's own worker: 5 x 64
tokens after 16 warm-up, samples of >= 0.25 s) in a fresh process that imports ``tern`` from
one checkout (``PYTHONPATH`` and working directory) with that checkout's own numba cache
(``<checkout>/.numba-ab-cache``, so neither loads the other's compiled kernels); the checkouts
alternate inside every round, at every thread count, and every other round runs them in the
reverse order (A B, B A, ...): on the AMD EPYC Zen 4 VM the second process of a round ran the
2.5 GB MoE peer 4-11 % slower than the first whichever checkout it was (session 45), so a fixed
order would have charged that to one checkout. A first untimed round compiles each
checkout's kernels (``--no-warm-round`` skips it). One JSONL row per (round, threads,
checkout): tern.core.records.run_metadata, the checkout and its commit, the worker's tok/s
summary and engine settings. The summary prints each checkout's median over rounds and
the rounds it won::

    git worktree add /tmp/base HEAD
    flock /tmp/tern-cpu.lock .venv/bin/python benchmarks/code_ab.py --model M.tern \\
        --code-root /tmp/base . --threads 1 2 --rounds 4 --out benchmarks/dense_row_dot/F.jsonl
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from tern.core.records import append_jsonl, checkout_commit, run_metadata
from tern.measure.sweep import SweepPoint, measure_in_subprocess
from tern.packed.reader import load_packed


def round_order(roots: list[Path], rnd: int) -> list[Path]:
    """The checkouts in the order round ``rnd`` runs them: as given in even rounds, reversed in
    odd ones, so each checkout takes each slot of a round equally often over an even count."""
    return list(roots) if rnd % 2 == 0 else list(reversed(roots))


def label(commit: str) -> str:
    """A commit as the summary prints it: 12 hex digits, keeping ``+dirty``."""
    return commit[:12] + ("+dirty" if commit.endswith("+dirty") else "")


def checkout_env(root: Path) -> dict[str, str]:
    """This process's environment with ``tern`` imported from the checkout ``root`` and numba
    caching into its own folder (``<root>/.numba-ab-cache``: no checkout loads another's code)."""
    return {**os.environ, "PYTHONPATH": str(root), "NUMBA_CACHE_DIR": str(root / ".numba-ab-cache")}


def checkout_roots(parser: argparse.ArgumentParser, roots: list[Path]) -> list[Path]:
    """``roots`` resolved; any that is not a tern checkout is an argparse error."""
    out = [r.resolve() for r in roots]
    for r in out:
        if not (r / "tern" / "__init__.py").is_file():
            parser.error(f"{r} is not a tern checkout (no tern/__init__.py)")
    return out


def worker(root: Path, model: Path, point: SweepPoint) -> dict:
    """The sweep worker's JSON for ``model`` at ``point``, with ``tern`` (and its own numba cache)
    from the checkout ``root``."""
    env = checkout_env(root)
    try:
        return measure_in_subprocess(model, point, timeout_s=3600, cwd=root, env=env)
    except (RuntimeError, subprocess.TimeoutExpired) as e:  # as tern.measure.peers treats its worker
        raise SystemExit(f"code_ab: the worker with {root} failed: {e}") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="a packed model file (.tern)")
    p.add_argument("--code-root", type=Path, nargs="+", required=True, help="checkouts to compare (. is this one)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=4, help="timed rounds (checkouts alternate in each)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=16)
    p.add_argument("--min-time-s", type=float, default=0.25)
    p.add_argument("--no-warm-round", action="store_true", help="skip the untimed compiling round")
    p.add_argument("--out", type=Path, required=True, help="JSONL rows are appended here")
    a = p.parse_args(argv)
    roots = checkout_roots(p, a.code_root)
    if a.rounds < 1:
        p.error("--rounds must be >= 1")
    try:
        with load_packed(a.model, check="header") as m:
            cfg = m.cfg
        points = {t: SweepPoint("code_ab", cfg.name, cfg, t, a.tokens, a.repeats, a.warmup, a.min_time_s)
                  for t in a.threads}
    except (OSError, ValueError) as e:
        p.error(str(e))
    model = a.model.resolve()
    commits = {r: checkout_commit(r) for r in roots}
    if not a.no_warm_round:
        for t in a.threads:
            for r in roots:
                worker(r, model, points[t])
    tps: dict[tuple[int, Path], list[float]] = {(t, r): [] for t in a.threads for r in roots}
    for rnd in range(a.rounds):
        for t in a.threads:
            for slot, r in enumerate(round_order(roots, rnd)):
                m = worker(r, model, points[t])
                tps[(t, r)].append(m["tok_per_s"])
                append_jsonl(a.out, {**run_metadata(t), "bench": "code_ab", "model": a.model.name, "round": rnd,
                                     "slot": slot, "code_root": str(r), "code_commit": commits[r], **m})
                print(f"round {rnd} threads {t} {label(commits[r]):>18} ({r}): {m['tok_per_s']:.1f} tok/s "
                      f"(spread {m['spread_rel']:.0%})", flush=True)
    for t in a.threads:
        base = tps[(t, roots[0])]
        for r in roots:
            v = tps[(t, r)]
            paired = [x / b for x, b in zip(v, base, strict=True)]  # this round's ratio to the first checkout
            print(f"threads {t} {label(commits[r]):>18}: median {statistics.median(v):.1f} tok/s over {len(v)} rounds"
                  + ("" if r == roots[0] else f"; against the first checkout: median of the rounds' ratios "
                     f"x{statistics.median(paired):.3f} (x{min(paired):.2f}-{max(paired):.2f}), faster in "
                     f"{sum(q > 1 for q in paired)} of {len(v)} rounds"))
    print(f"rows appended to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
