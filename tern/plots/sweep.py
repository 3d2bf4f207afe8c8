"""Figures of decode sweeps: measured points over the predicted curve, and their ratios.
Every figure is drawn from sweep rows (tern.sweep / the JSONL records) plus a host profile."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ..config import ModelConfig, param_counts  # noqa: E402
from ..host_profile import HostProfile  # noqa: E402
from ..roofline import cache_capacity_bytes, predict  # noqa: E402


def _panels(rows: list[dict[str, Any]], family: str) -> list[tuple[str, int]]:
    return sorted({(r["budget"], r["threads"]) for r in rows if r["family"] == family})


def _mark_caches(ax: Any, host: HostProfile, threads: int) -> None:
    for lvl, style in ((2, ":"), (3, "--")):
        cap = cache_capacity_bytes(host, lvl, threads)
        if cap:
            ax.axvline(cap, color="grey", ls=style, lw=1)
            ax.text(cap, ax.get_ylim()[0], f" L{lvl} {cap / 2**20:.1f} MiB", rotation=90,
                    va="bottom", ha="right", fontsize=7, color="grey")


def predicted_curve(base: ModelConfig, host: HostProfile, threads: int, experts: list[int]
                    ) -> tuple[list[int], list[float]]:
    """(total bytes, predicted tok/s) for ``base`` with each routed-expert count."""
    xs, ys = [], []
    for e in experts:
        cfg = base.replace(n_experts=e)
        xs.append(param_counts(cfg).total.bytes)
        ys.append(predict(cfg, host, threads=threads).tok_per_s)
    return xs, ys


def plot_fixed_active(rows: list[dict[str, Any]], host: HostProfile) -> Figure:
    """tok/s against total model bytes (log-log) at fixed active params: measured points
    (median, min-max bars) over this host's predicted curve, L2 and L3 marked; one panel per
    active budget and thread count."""
    panels = _panels(rows, "fixed_active")
    if not panels:
        raise ValueError("no fixed_active rows to plot")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (budget, t) in zip(axes[0], panels, strict=True):
        pts = sorted((r for r in rows if r["family"] == "fixed_active" and r["budget"] == budget
                      and r["threads"] == t), key=lambda r: r["total_bytes"])
        base = ModelConfig.from_dict(pts[0]["config"])
        lo, hi = min(r["config"]["n_experts"] for r in pts), max(r["config"]["n_experts"] for r in pts)
        grid = sorted({max(base.top_k, int(round(lo * (hi / lo) ** (i / 40)))) for i in range(41)})
        xs, ys = predicted_curve(base, host, t, grid)
        ax.plot(xs, ys, "-", color="C0", label=f"predicted ({host.label[:28]})")
        med = [r["tok_per_s"] for r in pts]
        err = [[r["tok_per_s"] - r.get("tok_per_s_min", r["tok_per_s"]) for r in pts],
               [r.get("tok_per_s_max", r["tok_per_s"]) - r["tok_per_s"] for r in pts]]
        ax.errorbar([r["total_bytes"] for r in pts], med, yerr=err, fmt="o", color="C3",
                    ms=4, capsize=2, label="measured (median, min-max)")
        ax.set_xscale("log")
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
    fig, ax = plt.subplots(figsize=(6, 4.2))
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
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.axhspan(0.75, 1.25, color="C2", alpha=0.12, label="±25 %")
    ax.axhline(1.0, color="C2", lw=1)
    keys = sorted({(r["family"], r["budget"], r["threads"]) for r in rows})
    for i, (fam, b, t) in enumerate(keys):
        sel = [r for r in rows if (r["family"], r["budget"], r["threads"]) == (fam, b, t)]
        ax.plot([r["total_bytes"] for r in sel], [r["ratio"] for r in sel], "o", color=f"C{i % 10}",
                label=f"{fam} {b}, {t} thr")
    ax.set_xscale("log")
    ax.set_xlabel("total model bytes (packed)")
    ax.set_ylabel("measured / predicted tok/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
