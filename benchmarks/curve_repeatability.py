"""Is the probe's kernel-curve stage repeatable? Its curves run again and again, by one or more
checkouts of tern in alternating processes, and a committed host's sweep re-predicted from each.

The predictor prices every matvec of a token from the probe's kernel curves
(tern.probe.curves), combining an op's two or three measured shapes into a per-call, per-row
and per-weight stall. On a shared VM whose speed moves within minutes, a curve measured in a
slow minute beside its sibling shape in a fast one makes that fit, and every prediction built
on it, wrong. Here the stage itself is run ``--runs`` times per checkout (each run a fresh
process importing ``tern`` from its checkout, with the checkout's own numba cache
``<checkout>/.numba-ab-cache``; checkouts alternate, every other round in reverse order, as
benchmarks/code_ab.py); each run's curves replace the op curves of the committed host
``--host`` (its profile otherwise unchanged), its sweep rows are re-predicted, and the
spread of each point's prediction over the runs is summarised per thread count: the median
and 90th percentile of max / min - 1, and the share of run pairs within 5 and 10 %.

One JSONL row per run (tern.core.records.run_metadata, the checkout and its commit, wall
seconds and the curves themselves, so the summary can be recomputed) and one ``summary`` row
per (checkout, threads)::

    git worktree add /tmp/base HEAD
    flock /tmp/tern-cpu.lock .venv/bin/python benchmarks/curve_repeatability.py --code-root /tmp/base . \\
        --runs 3 --out benchmarks/curve_rounds/LABEL.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from code_ab import checkout_env, checkout_roots, label, round_order

from tern.core.host_profile import OpCurve
from tern.core.records import append_jsonl, checkout_commit, run_metadata
from tern.measure.hosts import load_hosts, repredict

CHILD = """\
import dataclasses, json, sys, time
from tern.probe.curves import measure_op_curves
out, threads, quick, max_bytes = sys.argv[1], tuple(int(t) for t in sys.argv[2].split(",")), sys.argv[3] == "1", int(sys.argv[4])
t0 = time.perf_counter()
curves = measure_op_curves(threads, quick=quick, progress=False, max_bytes=max_bytes or None)
json.dump({"wall_s": time.perf_counter() - t0, "curves": [dataclasses.asdict(c) for c in curves]}, open(out, "w"))
"""


def run_stage(root: Path, threads: list[int], quick: bool, max_bytes: int) -> dict:
    """{wall_s, curves (as dicts)} of one curve stage in a fresh process importing ``root``'s tern."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "curves.json"
        p = subprocess.run([sys.executable, "-c", CHILD, str(out), ",".join(map(str, threads)), "1" if quick else "0",
                            str(max_bytes)], cwd=root, env=checkout_env(root), capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            raise SystemExit(f"curve_repeatability: the curve stage of {root} failed:\n{p.stderr[-3000:]}")
        return json.loads(out.read_text())


def curves_of(row: dict) -> tuple[OpCurve, ...]:
    """The OpCurves of a run row (JSON lists back to tuples)."""
    return tuple(OpCurve(**{k: tuple(v) if isinstance(v, list) else v for k, v in c.items()}) for c in row["curves"])


def prediction_spread(host, runs: list[tuple[OpCurve, ...]]) -> dict[int, dict]:
    """Per thread count of ``host``'s sweep rows: how far each point's prediction moved over the
    runs' curves (``host``'s profile with its op curves replaced by each run's)."""
    preds = [repredict(host.rows, dataclasses.replace(host.profile, op_curves=c)) for c in runs]
    out = {}
    for t in sorted({p["threads"] for p in preds[0]}):
        spread, pairs = [], []
        for j, p in enumerate(preds[0]):
            if p["threads"] != t:
                continue
            v = [q[j]["predicted_tok_per_s"] for q in preds]
            spread.append(max(v) / min(v) - 1)
            pairs += [abs(a / b - 1) for a, b in itertools.combinations(v, 2)]
        spread.sort()
        out[t] = {"points": len(spread), "runs": len(runs), "median_spread": statistics.median(spread),
                  "p90_spread": spread[int(0.9 * (len(spread) - 1))], "max_spread": spread[-1],
                  "pairs_within_5pct": sum(x <= 0.05 for x in pairs) / len(pairs) if pairs else None,
                  "pairs_within_10pct": sum(x <= 0.10 for x in pairs) / len(pairs) if pairs else None}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--code-root", type=Path, nargs="+", default=[Path(".")], help="checkouts (. is this one)")
    p.add_argument("--runs", type=int, default=3, help="curve stages per checkout (>= 2)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--host", default=None, help="committed host whose sweep is re-predicted (default: the newest)")
    p.add_argument("--quick", action="store_true", help="the quick probe's curves")
    p.add_argument("--max-bytes", type=int, default=0, help="largest working set (0: the probe's)")
    p.add_argument("--no-warm-round", action="store_true", help="skip the untimed compiling round")
    p.add_argument("--out", type=Path, default=Path("results/bench/curve_repeatability.jsonl"))
    a = p.parse_args(argv)
    roots = checkout_roots(p, a.code_root)
    if a.runs < 2:
        p.error("--runs must be >= 2 (a spread needs two runs)")
    hosts = load_hosts()
    if not hosts:
        p.error("no committed hosts (benchmarks/hosts) to re-predict")
    if a.host is None:
        host = max(hosts, key=lambda h: str(h.meta.get("timestamp") or ""))
    else:
        host = next((h for h in hosts if h.label == a.host), None)
        if host is None:
            p.error(f"no committed host {a.host!r}; known: {', '.join(h.label for h in hosts)}")
    commits = {r: checkout_commit(r) for r in roots}
    if not a.no_warm_round:
        for r in roots:
            run_stage(r, a.threads, a.quick, a.max_bytes)
    runs: dict[Path, list[tuple[OpCurve, ...]]] = {r: [] for r in roots}
    for rnd in range(a.runs):
        for slot, r in enumerate(round_order(roots, rnd)):
            res = run_stage(r, a.threads, a.quick, a.max_bytes)
            runs[r].append(curves_of(res))
            append_jsonl(a.out, {**run_metadata(max(a.threads)), "bench": "curve_repeatability", "kind": "run",
                                 "round": rnd, "slot": slot, "code_root": str(r), "code_commit": commits[r],
                                 "thread_counts": a.threads, "quick": a.quick, **res})
            print(f"round {rnd} {label(commits[r]):>18} ({r}): curve stage {res['wall_s']:.1f} s", flush=True)
    for r in roots:
        for t, s in prediction_spread(host, runs[r]).items():
            append_jsonl(a.out, {**run_metadata(t), "bench": "curve_repeatability", "kind": "summary",
                                 "code_root": str(r), "code_commit": commits[r], "host_label": host.label, **s})
            print(f"{label(commits[r]):>18} t{t}: {host.label}'s {s['points']} points re-predicted from {s['runs']} "
                  f"runs' curves: spread median {s['median_spread']:.1%}, p90 {s['p90_spread']:.1%}, max "
                  f"{s['max_spread']:.1%}; run pairs within 5 % {s['pairs_within_5pct']:.0%}, within 10 % "
                  f"{s['pairs_within_10pct']:.0%}")
    print(f"rows appended to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
