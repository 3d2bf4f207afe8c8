"""Figures of the two-pool roofline: the knee, formats, the 10B feasibility map and
predicted tok/s of the presets. Each returns a matplotlib Figure drawn from the sweeps
in :mod:`tern.predict.roofline` (nothing is computed here that is not computed there)."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
from matplotlib.ticker import MaxNLocator

from tern.core.figure import subplots
from tern.core.formats import get_format
from tern.core.host_profile import HostProfile
from tern.core.host_queries import cache_marks
from tern.predict.roofline import feasibility_grid, sweep_active, sweep_total

DEFAULT_FORMATS = ("fp32", "fp16", "int8", "q4", "lut4", "tq2_0", "ternary2", "tq1_0", "ternary_b3")


def _geom(lo: float, hi: float, n: int) -> list[float]:
    return [float(x) for x in np.geomspace(lo, hi, n)]


def plot_knee(hosts: dict[str, HostProfile], active_params: float = 15e6, bits_per_weight: float = 2.0,
              resident_fraction: float = 0.7, threads: int = 1, totals: list[float] | None = None,
              points: int = 80):
    """Predicted tok/s against total params at fixed active params, log-log, one line
    per host; dotted verticals where the whole model's bytes equal each cache tier the
    host's measured read curve shows."""
    totals = totals or _geom(active_params, active_params * 1000, points)
    fig, ax = subplots(figsize=(7.5, 4.5))
    bpw = bits_per_weight / 8
    for i, (label, host) in enumerate(hosts.items()):
        preds = sweep_total(host, active_params, totals, bits_per_weight, resident_fraction, threads)
        color = f"C{i}"
        ax.plot([p.total_params for p in preds], [p.tok_per_s for p in preds], color=color, label=label)
        for name, cap in cache_marks(host, threads):  # tiers of the measured curve (/sys: a hint)
            if totals[0] <= cap / bpw <= totals[-1]:
                ax.axvline(cap / bpw, color=color, ls=":", lw=1)
                ax.text(cap / bpw, 0.02, f" {name} {cap / 2**20:.3g} MiB", color=color, rotation=90,
                        va="bottom", fontsize=7, transform=ax.get_xaxis_transform())
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"total params (weights at {bits_per_weight:g} bits/weight)")
    ax.set_ylabel("predicted decode speed (tok/s)")
    ax.set_title(f"The knee: {active_params / 1e6:.3g}M active params, {threads} thread(s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_formats(hosts: dict[str, HostProfile], formats: tuple[str, ...] = DEFAULT_FORMATS,
                 actives: list[float] | None = None, threads: int = 1, total_over_active: float = 1.0):
    """Predicted tok/s against active params, one line per weight format, one panel per
    host (total = ``total_over_active`` x active; 1.0 is a dense model)."""
    actives = actives or _geom(1e6, 1e10, 60)
    fig, axes = subplots(1, len(hosts), figsize=(6 * len(hosts), 4.5), squeeze=False, sharey=True)
    for ax, (label, host) in zip(axes[0], hosts.items(), strict=True):
        for j, fmt in enumerate(formats):
            preds = sweep_active(host, actives, fmt, threads, total_over_active)
            ax.plot(actives, [p.tok_per_s for p in preds], color=f"C{j % 10}",
                    label=f"{fmt} ({get_format(fmt).bits_per_weight:g} b/w)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("active params per token")
        ax.set_title(f"{label[:48]}, {threads} thread(s)", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("predicted decode speed (tok/s)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_feasibility(hosts: dict[str, HostProfile], total_params: float = 10e9,
                     target_tok_per_s: float = 100.0, fmt: str = "ternary2",
                     actives: list[float] | None = None, threads: list[int] | None = None,
                     resident_fraction: float = 0.75):
    """Feasibility of a ``total_params`` model: predicted tok/s over active params x
    threads, one panel per host, with the contour of ``target_tok_per_s``."""
    actives = actives or _geom(total_params / 1000, total_params / 2, 40)
    fig, axes = subplots(1, len(hosts), figsize=(6 * len(hosts), 4.5), squeeze=False)
    for ax, (label, host) in zip(axes[0], hosts.items(), strict=True):
        ts = threads or sorted(set(host.thread_counts())) or [1]
        grid = np.array(feasibility_grid(host, total_params, actives, ts, fmt, resident_fraction))  # (T, A)
        mesh = ax.pcolormesh(actives, ts, np.log10(grid), shading="nearest", cmap="viridis")
        if grid.min() < target_tok_per_s < grid.max() and len(ts) > 1:
            cs = ax.contour(actives, ts, grid, levels=[target_tok_per_s], colors="w", linewidths=2)
            ax.clabel(cs, fmt=lambda v: f"{v:g} tok/s", fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("active params per token")
        ax.set_ylabel("threads")
        if len(ts) <= 12:  # one tick per measured thread count
            ax.set_yticks(ts, [str(t) for t in ts])
        else:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{total_params / 1e9:g}B total, {fmt}: {label[:40]}", fontsize=9)
        fig.colorbar(mesh, ax=ax, label="log10 predicted tok/s")
    fig.tight_layout()
    return fig


def plot_presets(rows: list[dict]):
    """Grouped bars of predicted tok/s per preset from :func:`tern.predict.tables.predict_table`
    rows, one bar per (host, threads)."""
    configs = list(dict.fromkeys(r["config"] for r in rows))
    series = list(dict.fromkeys((r["host"], r["threads"]) for r in rows))
    fig, ax = subplots(figsize=(max(6, 1.5 * len(configs)), 4.2))
    w = 0.8 / max(1, len(series))
    for j, (h, t) in enumerate(series):
        ys = [next((r["tok_per_s"] for r in rows if r["config"] == c and r["host"] == h and r["threads"] == t),
                   math.nan) for c in configs]
        ax.bar(np.arange(len(configs)) + j * w, ys, w, label=f"{h[:40]}, {t} thr")
    ax.set_xticks(np.arange(len(configs)) + 0.4 - w / 2, configs)
    ax.set_yscale("log")
    ax.set_ylabel("predicted decode speed (tok/s)")
    ax.set_xlabel("preset")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_time_breakdown(breakdowns: dict[str, dict[str, float]]):
    """Stacked horizontal bars, one per label, of the share of a token's predicted time
    each component takes (op compute, memory stalls, overhead; from
    :func:`tern.predict.roofline.time_breakdown` dicts), the total time and tok/s at the end
    of each bar (shares, so models 100x apart in speed stay readable side by side)."""
    labels = list(breakdowns)
    parts = list(dict.fromkeys(k for b in breakdowns.values() for k in b))
    totals = np.array([sum(breakdowns[lb].values()) for lb in labels])  # seconds per token
    fig, ax = subplots(figsize=(9, 0.6 * len(labels) + 2.2))
    left = np.zeros(len(labels))
    cmap = matplotlib.colormaps["tab20"]
    for i, part in enumerate(parts):
        sec = np.array([breakdowns[lb].get(part, 0.0) for lb in labels])
        pct = np.divide(100 * sec, totals, out=np.zeros_like(sec), where=totals > 0)
        ax.barh(np.arange(len(labels)), pct, left=left, color=cmap(i % 20), label=part)
        left += pct
    for y, tot in enumerate(totals):
        if tot > 0:
            ax.text(101, y, f"{tot * 1e6:,.0f} us = {1 / tot:,.0f} tok/s", va="center", fontsize=8)
    ax.set_yticks(np.arange(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("share of the predicted time per token (%)")
    ax.set_xlim(0, 130)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.45, -0.18))
    ax.set_title("where a decoded token's time goes (op-cost model)", fontsize=10)
    fig.tight_layout()
    return fig
