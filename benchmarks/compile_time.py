"""How long numba takes to compile the engine from nothing: what a user waits for on the first
``tern`` run after an install, what every cold CI run and every fresh wheel install pays.

Each measurement is a fresh process that imports ``tern`` from one checkout (``PYTHONPATH``)
with an empty numba cache of its own (a new temporary ``NUMBA_CACHE_DIR``, removed after), loads
``--model`` in ``tern.run.Engine`` at each ``--threads`` in turn and decodes two tokens: the
first ``Engine`` compiles the kernels and the per-token step, each later one what it adds (the
one-region step at 2+ threads). numba's compile events (``numba.core.event``,
"numba:compile") give each compiled function's seconds, inclusive and exclusive of the
compiles nested inside it. With several ``--code-root`` the checkouts alternate inside every
round and take turns at going first (benchmarks/code_ab.py's ``round_order``). One JSONL row
per (round, checkout): tern.core.records.run_metadata, the checkout and its commit, seconds
per ``Engine``, the compile total, compiles counted, and the slowest functions::

    git worktree add /tmp/base HEAD
    flock /tmp/tern-cpu.lock .venv/bin/python benchmarks/compile_time.py --model M.tern \\
        --code-root /tmp/base . --threads 1 2 --out benchmarks/compile_time/<host>.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from tern.core.records import append_jsonl, checkout_commit, run_metadata
from tern.probe.timing import CompileClock

TOP = 25  # slowest functions kept per row


def exclusive_seconds(events: list[tuple[str, float, str]]) -> dict[str, dict[str, float]]:
    """Per function name, from ("start" | "end", time s, name) events of nested compiles in the
    order numba emits them: seconds inclusive and exclusive of the compiles nested inside, and
    how many times it was compiled (one per signature)."""
    stack: list[list] = []
    out: dict[str, dict[str, float]] = {}
    for kind, t, name in events:
        if kind == "start":
            stack.append([name, t, 0.0])
            continue
        if not stack or stack[-1][0] != name:
            raise ValueError(f"compile events out of order: end of {name!r} inside {stack[-1][0] if stack else None!r}")
        n, t0, nested = stack.pop()
        f = out.setdefault(n, {"inclusive_s": 0.0, "exclusive_s": 0.0, "compiles": 0})
        f["inclusive_s"] += t - t0
        f["exclusive_s"] += t - t0 - nested
        f["compiles"] += 1
        if stack:
            stack[-1][2] += t - t0
    if stack:
        raise ValueError(f"compile events unfinished: {[s[0] for s in stack]}")
    return out


@contextmanager
def record_compiles():
    """Inside the block, numba's compile events are appended to the yielded list; the listener
    is removed after it."""
    from numba.core import event

    events: list[tuple[str, float, str]] = []

    def name(ev) -> str:
        fn = getattr(ev.data.get("dispatcher"), "py_func", None)
        return f"{fn.__module__}.{fn.__qualname__}" if fn is not None else "?"

    class Listener(event.Listener):
        def on_start(self, ev):
            events.append(("start", time.perf_counter(), name(ev)))

        def on_end(self, ev):
            events.append(("end", time.perf_counter(), name(ev)))

    listener = Listener()
    event.register("numba:compile", listener)
    try:
        yield events
    finally:
        event.unregister("numba:compile", listener)


def worker(model: str, threads: list[int]) -> dict:
    """In a process with an empty numba cache: seconds to build and step each Engine, and the
    compile events' totals (the slowest TOP functions by exclusive seconds)."""
    engine_s = {}
    with record_compiles() as events, CompileClock() as clock:  # the probe's own compile clock for the total
        t0 = time.perf_counter()
        from tern.run.engine import Engine

        import_s = time.perf_counter() - t0
        for t in threads:
            t1 = time.perf_counter()
            eng = Engine(model, threads=t)
            eng.step(1)
            eng.step(2)
            engine_s[str(t)] = time.perf_counter() - t1
    per_fn = exclusive_seconds(events)
    slowest = sorted(per_fn.items(), key=lambda kv: -kv[1]["exclusive_s"])[:TOP]
    return {"import_s": import_s, "engine_s": engine_s,
            "compile_s": clock.seconds,
            "compiles": sum(int(f["compiles"]) for f in per_fn.values()),
            "functions": [{"name": n, **f} for n, f in slowest]}


def run_cold(root: Path, model: Path, threads: list[int]) -> dict:
    """:func:`worker` with ``tern`` from ``root`` and a new empty numba cache (removed after)."""
    with tempfile.TemporaryDirectory(prefix="tern-cold-numba-") as cache:
        env = {**os.environ, "PYTHONPATH": str(root), "NUMBA_CACHE_DIR": cache}
        cmd = [sys.executable, __file__, "--worker", "--model", str(model), "--threads", *map(str, threads)]
        res = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"compile_time: the run with {root} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="a packed model file (.tern)")
    p.add_argument("--code-root", type=Path, nargs="+", default=[Path(".")], help="checkouts to compare (. is this one)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="Engine thread counts, built in this order")
    p.add_argument("--rounds", type=int, default=1, help="cold compiles per checkout")
    p.add_argument("--out", type=Path, help="JSONL rows are appended here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if any(t < 1 for t in a.threads):
        p.error(f"--threads must be >= 1, got {a.threads}")
    if a.worker:
        print(json.dumps(worker(str(a.model), a.threads)))
        return 0
    if a.out is None:
        p.error("--out is required")
    if a.rounds < 1:
        p.error("--rounds must be >= 1")
    if not a.model.is_file():
        p.error(f"--model {a.model} does not exist")
    roots = [r.resolve() for r in a.code_root]
    for r in roots:
        if not (r / "tern" / "__init__.py").is_file():
            p.error(f"{r} is not a tern checkout (no tern/__init__.py)")
    from code_ab import label, round_order  # the same turn-taking and labels as the decode A/B

    commits = {r: checkout_commit(r) for r in roots}
    totals: dict[Path, list[float]] = {r: [] for r in roots}
    for rnd in range(a.rounds):
        for slot, r in enumerate(round_order(roots, rnd)):
            m = run_cold(r, a.model.resolve(), a.threads)
            totals[r].append(sum(m["engine_s"].values()))
            append_jsonl(a.out, {**run_metadata(max(a.threads)), "bench": "compile_time", "model": a.model.name,
                                 "round": rnd, "slot": slot, "code_root": str(r), "code_commit": commits[r],
                                 "engine_threads": a.threads, **m})
            print(f"round {rnd} {label(commits[r])} ({r}): " + ", ".join(
                f"Engine({t} thread{'s' if int(t) > 1 else ''}) {s:.1f} s" for t, s in m["engine_s"].items())
                + f"; {m['compiles']} compiles, {m['compile_s']:.1f} s compiling", flush=True)
    for r in roots:
        print(f"{label(commits[r])} ({r}): median {statistics.median(totals[r]):.1f} s from an empty cache "
              f"to a decoded token at every thread count, over {a.rounds} round(s)")
    print(f"rows appended to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
