"""What loading a model costs: load time and resident memory per engine layout, each load in a fresh process.

Arms (``--arms``, each ``LAYOUT[:noskip]``): ``rows`` (ternary rows as stored), ``blocked16`` (re-packed at
load into 16-row blocks, the default on CPUs with AVX2 since session 43), and ``blocked16:noskip`` (the same,
with the weights' huge-page copy holding the whole file, as before session 43: the file bytes of the
re-packed matrices copied though never read). Every arm runs once per round in its own process,
``--repeats`` rounds in turn; each process loads ``--model`` with ``weights="copy"`` and reports the
seconds ``Engine(...)`` took and /proc/self/status: VmHWM (peak resident), RssAnon (the copy and the
re-packed buffer) and RssFile (page-cache pages of the mapped file, which the kernel may reclaim).
One JSONL row per arm (``<results>/bench/load_memory.jsonl``): run metadata, the medians and spread.

    flock /tmp/tern-cpu.lock .venv/bin/python benchmarks/load_memory.py --model results/models/M.tern
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from tern.core.records import append_jsonl, run_metadata, summarize

FIELDS = ("load_s", "VmHWM", "RssAnon", "RssFile")
LAYOUT_ARMS = ("rows", "blocked16", "blocked16:noskip")

_CHILD = r"""
import json, sys, time
import tern.run.engine as te
path, layout, skip = sys.argv[1], sys.argv[2], sys.argv[3] == "skip"
if not skip:  # the copy before session 43: the whole file
    te.tensor_ranges = lambda model, names: []
t = time.perf_counter()
eng = te.Engine(path, layout=layout, weights="copy")
load = time.perf_counter() - t
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
out = {k: int(status[k].split()[0]) * 1024 for k in ("VmHWM", "RssAnon", "RssFile") if k in status}
print(json.dumps({"load_s": load, "layout": eng.layout, **out}))
"""


def load_once(model: Path, arm: str) -> dict:
    """One fresh process loading ``model`` as ``arm``: its load seconds and memory figures (bytes)."""
    layout, _, mode = arm.partition(":")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(model), layout, "noskip" if mode else "skip"],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"loading {model} as {arm} failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> list[dict]:
    model = Path(args.model)
    if not model.is_file():
        raise SystemExit(f"no model file at {model}")
    got: dict[str, list[dict]] = {a: [] for a in args.arms}
    for _ in range(args.repeats):
        for arm in args.arms:
            got[arm].append(load_once(model, arm))
    out_path = Path(args.results) / "bench" / "load_memory.jsonl"
    rows = []
    for arm, runs in got.items():
        row = {**run_metadata(1), "bench": "load_memory", "arm": arm, "model": model.name,
               "file_bytes": model.stat().st_size, "layout": runs[0].get("layout"),
               **{f: summarize([r[f] for r in runs if f in r]) for f in FIELDS}}
        append_jsonl(out_path, row)
        rows.append(row)
        print(f"{arm:<18} load {row['load_s']['median']:6.2f} s   peak {row['VmHWM']['median'] / 1e9:5.2f} GB   "
              f"anonymous {row['RssAnon']['median'] / 1e9:5.2f} GB   file pages {row['RssFile']['median'] / 1e9:5.2f} GB")
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="packed model file (.tern)")
    p.add_argument("--arms", nargs="+", default=list(LAYOUT_ARMS), choices=LAYOUT_ARMS)
    p.add_argument("--repeats", type=int, default=3, help="rounds, every arm once per round (default 3)")
    p.add_argument("--results", default="results", help="results folder (rows: <results>/bench/load_memory.jsonl)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    run(args)


if __name__ == "__main__":
    main()
