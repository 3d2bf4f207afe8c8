"""Measured over predicted on every committed host (tern.measure.hosts), this machine first:
one panel per host, points by working set, coloured by thread count, the ±20 % band."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from tern.core.figure import subplots

BAND = 0.20


def plot_hosts(hosts: dict[str, list[dict[str, Any]]], max_cols: int = 3) -> Figure:
    """``hosts``: label -> re-predicted points (tern.measure.hosts.repredict), in the order
    to draw them. Y: measured / predicted tok/s; x: the model's hot working set (MB, log)."""
    if not hosts:
        raise ValueError("no hosts to plot")
    n = len(hosts)
    cols = min(max_cols, n)
    rows = (n + cols - 1) // cols
    fig, axes = subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows), squeeze=False, sharey=True)
    for ax, (label, pts) in zip(axes.flat, hosts.items(), strict=False):
        for t, marker in ((1, "o"), (2, "s"), (4, "^"), (6, "D")):
            mine = [p for p in pts if p["threads"] == t]
            if mine:
                ax.scatter([p["hot_bytes"] / 1e6 for p in mine], [p["ratio"] for p in mine], s=18,
                           marker=marker, label=f"{t} thread{'s' if t > 1 else ''}", alpha=0.8)
        ax.axhspan(1 - BAND, 1 + BAND, color="tab:green", alpha=0.08, lw=0)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("hot working set (MB, log scale)")
        ax.grid(alpha=0.3, which="both")
    for ax in axes[:, 0]:
        ax.set_ylabel("measured / predicted tok/s")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8, loc="lower left")
    fig.suptitle("Probe-only prediction on every committed host (green: ±20 %)", fontsize=11)
    fig.tight_layout()
    return fig
