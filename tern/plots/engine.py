"""Figures of the decode engine, drawn from benchmark rows (``results/bench/ladder.jsonl``):
the ablation ladder as bars of tok/s per rung with their BPB."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt  # noqa: E402

from ..records import read_jsonl  # noqa: E402


def latest_ladder(rows: str | Path | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the most recent complete ladder run (one row per rung, in rung order)
    from a JSONL path or a list of rows. A run's rows share their ``run_id``."""
    rows = read_jsonl(rows) if isinstance(rows, (str, Path)) else list(rows)
    ladder = [r for r in rows if r.get("bench") == "ladder"]
    if not ladder:
        raise ValueError("no ladder rows (bench == 'ladder') to plot")
    runs: dict[Any, list[dict[str, Any]]] = {}  # insertion order = file order
    for r in ladder:
        runs.setdefault(r.get("run_id") or (r.get("host"), r.get("timestamp"), r.get("model")), []).append(r)
    complete = [run for run in runs.values() if len(run) > 1
                and sorted(x["rung_index"] for x in run) == list(range(len(run)))]
    if not complete:
        raise ValueError("no complete ladder run among the rows")
    run = complete[-1]  # rows are appended: the last complete run is the latest
    return sorted(run, key=lambda r: r["rung_index"])


def ladder_plot(rows: str | Path | list[dict[str, Any]], path: str | Path | None = None):
    """Bars: median decode tok/s of each rung (error bars: min..max over repeats), labelled
    with the speed-up over the baseline and the rung's validation BPB."""
    run = latest_ladder(rows)
    names = [r["rung"] for r in run]
    med = [r["tok_per_s"]["median"] for r in run]
    lo = [r["tok_per_s"]["median"] - r["tok_per_s"]["min"] for r in run]
    hi = [r["tok_per_s"]["max"] - r["tok_per_s"]["median"] for r in run]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    bars = ax.bar(range(len(run)), med, yerr=[lo, hi], capsize=4, color="tab:blue", alpha=0.85)
    for b, r in zip(bars, run, strict=True):
        bpb = f"\nBPB {r['bpb']:.4f}" if r.get("bpb") is not None else ""
        ax.annotate(f"{r['speedup_vs_baseline']:.2f}x{bpb}", (b.get_x() + b.get_width() / 2, b.get_height()),
                    xytext=(0, 4), textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(run)))
    ax.set_xticklabels(names, rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("decode speed (tok/s, median)")
    ax.set_ylim(0, max(r["tok_per_s"]["max"] for r in run) * 1.3)
    first = run[0]
    ax.set_title(f"ablation ladder: {first.get('config')} model, {first.get('threads')} thread(s), "
                 f"{first.get('cpu', '?')}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
