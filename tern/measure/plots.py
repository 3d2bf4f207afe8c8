"""Figures of decode sweeps: measured points over the predicted curve, and their ratios.
Every figure is drawn from sweep rows (tern.measure.sweep / the JSONL records) plus a host profile."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from tern.core.config import ModelConfig, param_counts
from tern.core.figure import subplots
from tern.core.host_profile import HostProfile
from tern.core.host_queries import cache_marks
from tern.core.records import read_jsonl
from tern.measure.verdict import speed_checks
from tern.predict.pools import decoded_context
from tern.predict.roofline import predict


def _panels(rows: list[dict[str, Any]], family: str) -> list[tuple[str, int]]:
    return sorted({(r["budget"], r["threads"]) for r in rows if r["family"] == family})


def _mark_caches(ax: Any, host: HostProfile, threads: int) -> None:
    marks = cache_marks(host, threads)[-2:]  # the last two cache tiers of the measured curve
    for (name, cap), style in zip(marks, (":", "--")[-len(marks):], strict=True):
        ax.axvline(cap, color="grey", ls=style, lw=1)
        ax.text(cap, ax.get_ylim()[0], f" {name} {cap / 2**20:.1f} MiB", rotation=90,
                va="bottom", ha="right", fontsize=7, color="grey")


def _si_bytes(n: float) -> str:
    """2e6 -> '2 MB', 1.5e9 -> '1.5 GB' (decimal units, as model files are quoted)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size * 0.999:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _bytes_log_axis(ax: Any, values: list[float]) -> None:
    """Log x axis of byte counts labelled '2 MB', '1 GB': ticks at 1, 2, 5 per decade when
    the data span at most 2.5 decades, at the decades otherwise; minor ticks unlabelled (the
    default labels every minor tick of a short log axis, and they overlap)."""
    ax.set_xscale("log")
    lo, hi = min(values), max(values)
    span = math.log10(hi / lo) if lo > 0 and hi > lo else 0.0
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if span <= 2.5 else (1.0,)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _si_bytes(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())


def predicted_curve(base: ModelConfig, host: HostProfile, threads: int, experts: list[int],
                    tokens: int | None = None) -> tuple[list[int], list[float]]:
    """(total bytes, predicted tok/s) for ``base`` with each routed-expert count, at the mean
    context of runs of ``tokens`` from a reset (as the sweep measured; None: a full window)."""
    ctx = decoded_context(tokens, base.attn_window)
    xs, ys = [], []
    for e in experts:
        cfg = base.replace(n_experts=e)
        xs.append(param_counts(cfg).total.bytes)
        ys.append(predict(cfg, host, threads=threads, context=ctx).tok_per_s)
    return xs, ys


def plot_fixed_active(rows: list[dict[str, Any]], host: HostProfile) -> Figure:
    """tok/s against total model bytes (log-log) at fixed active params: measured points
    (median, min-max bars) over this host's predicted curve, L2 and L3 marked; one panel per
    active budget and thread count."""
    panels = _panels(rows, "fixed_active")
    if not panels:
        raise ValueError("no fixed_active rows to plot")
    fig, axes = subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (budget, t) in zip(axes[0], panels, strict=True):
        pts = sorted((r for r in rows if r["family"] == "fixed_active" and r["budget"] == budget
                      and r["threads"] == t), key=lambda r: r["total_bytes"])
        base = ModelConfig.from_dict(pts[0]["config"])
        lo, hi = min(r["config"]["n_experts"] for r in pts), max(r["config"]["n_experts"] for r in pts)
        grid = sorted({max(base.top_k, int(round(lo * (hi / lo) ** (i / 40)))) for i in range(41)})
        xs, ys = predicted_curve(base, host, t, grid, pts[0].get("tokens"))
        ax.plot(xs, ys, "-", color="C0", label=f"predicted ({host.label[:28]})")
        med = [r["tok_per_s"] for r in pts]
        err = [[r["tok_per_s"] - r.get("tok_per_s_min", r["tok_per_s"]) for r in pts],
               [r.get("tok_per_s_max", r["tok_per_s"]) - r["tok_per_s"] for r in pts]]
        ax.errorbar([r["total_bytes"] for r in pts], med, yerr=err, fmt="o", color="C3",
                    ms=4, capsize=2, label="measured (median, min-max)")
        _bytes_log_axis(ax, [*xs, *(r["total_bytes"] for r in pts)])
        ax.set_yscale("log")
        act = pts[0]["active_params"] / 1e6
        ax.set_title(f"~{act:.0f}M active params, {t} thread{'s' if t > 1 else ''}")
        ax.set_xlabel("total model bytes (packed)")
        ax.set_ylabel("decode speed (tok/s)")
        _mark_caches(ax, host, t)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_fixed_total(rows: list[dict[str, Any]]) -> Figure:
    """tok/s against active bytes per token at a fixed expert pool (growing top-k)."""
    pts = [r for r in rows if r["family"] == "fixed_total"]
    if not pts:
        raise ValueError("no fixed_total rows to plot")
    fig, ax = subplots(figsize=(6, 4.2))
    for t in sorted({r["threads"] for r in pts}):
        sel = sorted((r for r in pts if r["threads"] == t), key=lambda r: r["active_bytes"])
        ax.plot([r["active_bytes"] / 1e6 for r in sel], [r["tok_per_s"] for r in sel], "o",
                label=f"measured, {t} thread(s)")
        ax.plot([r["active_bytes"] / 1e6 for r in sel], [r["predicted_tok_per_s"] for r in sel], "--",
                label=f"predicted, {t} thread(s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("active bytes per token (MB)")
    ax.set_ylabel("decode speed (tok/s)")
    ax.set_title("fixed total, growing top-k (ternary2)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_ratios(rows: list[dict[str, Any]]) -> Figure:
    """measured / predicted for every point against total bytes, with the ±25 % band."""
    if not rows:
        raise ValueError("no rows to plot")
    fig, ax = subplots(figsize=(7, 4.4))
    ax.axhspan(0.75, 1.25, color="C2", alpha=0.12, label="±25 %")
    ax.axhline(1.0, color="C2", lw=1)
    keys = sorted({(r["family"], r["budget"], r["threads"]) for r in rows})
    for i, (fam, b, t) in enumerate(keys):
        sel = [r for r in rows if (r["family"], r["budget"], r["threads"]) == (fam, b, t)]
        ax.plot([r["total_bytes"] for r in sel], [r["ratio"] for r in sel], "o", color=f"C{i % 10}",
                label=f"{fam} {b}, {t} thr")
    _bytes_log_axis(ax, [r["total_bytes"] for r in rows])
    ax.set_xlabel("total model bytes (packed)")
    ax.set_ylabel("measured / predicted tok/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=min(3, len(keys) + 1), loc="upper center", bbox_to_anchor=(0.5, -0.16))
    fig.tight_layout()
    return fig


def plot_against_target(rows: list[dict[str, Any]], target_tok_per_s: float, title: str = "") -> Figure:
    """Per thread count: measured tok/s (median, min-max bars) beside the predicted tok/s,
    with the target as a dashed line and each measured bar labelled with its fraction of
    the target (notebook 08's ~10B pick)."""
    checks = speed_checks(rows, target_tok_per_s)  # validates the rows and the target
    by_t = {int(r["threads"]): r for r in rows}
    fig, ax = subplots(figsize=(6.4, 4.2))
    x = list(range(len(checks)))
    meas = [c.measured_tok_per_s for c in checks]
    err = [[c.measured_tok_per_s - by_t[c.threads].get("tok_per_s_min", c.measured_tok_per_s) for c in checks],
           [by_t[c.threads].get("tok_per_s_max", c.measured_tok_per_s) - c.measured_tok_per_s for c in checks]]
    w = 0.38
    measured = ax.bar([i - w / 2 for i in x], meas, w, yerr=err, capsize=3, color="C3",
                      label="measured (median, min-max)")
    predicted = ax.bar([i + w / 2 for i in x], [c.predicted_tok_per_s for c in checks], w, color="C0",
                       alpha=0.75, label="predicted")
    ax.axhline(target_tok_per_s, color="k", ls="--", lw=1.2, label=f"target {target_tok_per_s:g} tok/s")
    top = max([target_tok_per_s, *meas, *(c.predicted_tok_per_s for c in checks),
               *(by_t[c.threads].get("tok_per_s_max", 0.0) for c in checks)])
    ax.set_ylim(0, top * 1.3)
    for mb, pb, c in zip(measured, predicted, checks, strict=True):  # numbers inside the bars' tops
        for b, text in ((mb, f"{c.measured_tok_per_s:,.0f} tok/s\n{c.of_target:.2f}x target"),
                        (pb, f"{c.predicted_tok_per_s:,.0f} tok/s")):
            inside = b.get_height() > 0.2 * top
            ax.annotate(text, (b.get_x() + b.get_width() / 2, b.get_height()), xytext=(0, -6 if inside else 4),
                        textcoords="offset points", ha="center", va="top" if inside else "bottom", fontsize=8,
                        color="white" if inside else "k")
    ax.set_xticks(x, [f"{c.threads} thread{'s' if c.threads > 1 else ''}" for c in checks])
    ax.set_ylabel("decode speed (tok/s)")
    ax.set_title(title or f"{rows[0].get('name', 'model')}: measured, predicted and target", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


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
    fig, ax = subplots(figsize=(8, 4.2))
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


