"""Quality against decode speed (tern.measure.frontier): validation BPB against measured
decode tok/s, one panel per thread count, one marker per arm, the Pareto front drawn.
Built from the JSONL rows alone, so the figure can be redrawn from a committed rows file."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from tern.core.figure import subplots
from tern.measure.frontier import ARM_NAMES, frontier_points

MARKERS = dict(zip(ARM_NAMES, ("*", "s", "D", "^", "v"), strict=True))
COLOURS = dict(zip(ARM_NAMES, ("tab:red", "tab:gray", "tab:blue", "tab:orange", "tab:green"), strict=True))


def plot_frontier(rows: list[dict[str, Any]], title: str | None = None) -> Figure:
    """``rows``: frontier rows (tern.measure.frontier.run_frontier, or read from its JSONL).
    X: measured decode tok/s (log); y: validation bits per byte (lower is better); error
    bars ± 1 standard error over seeds where there are several. The Pareto front (no arm
    both faster and lower) is the dashed line through the starred points' order."""
    pts = frontier_points(rows)
    if not pts:
        raise ValueError("no frontier rows with a validation BPB to plot")
    threads = sorted({p["threads"] for p in pts})
    fig, axes = subplots(1, len(threads), figsize=(5.2 * len(threads), 4.2), squeeze=False, sharey=True)
    for ax, t in zip(axes[0], threads, strict=True):
        mine = [p for p in pts if p["threads"] == t]
        for p in mine:
            ax.errorbar([p["tok_per_s"]], [p["val_bpb"]], yerr=[p["val_bpb_se"] or 0.0],
                        marker=MARKERS.get(p["arm"], "o"), color=COLOURS.get(p["arm"], "k"),
                        ms=11 if p["arm"] == "sandbox" else 8, ls="none", capsize=3,
                        label=f"{p['label']} ({p['active_params'] / 1e6:.2f}M active / "
                              f"{p['total_params'] / 1e6:.2f}M total)")
            ax.annotate(p["arm"], (p["tok_per_s"], p["val_bpb"]), textcoords="offset points",
                        xytext=(6, 5), fontsize=8)
        front = sorted((p for p in mine if p["pareto"]), key=lambda p: p["tok_per_s"])
        if len(front) > 1:
            ax.plot([p["tok_per_s"] for p in front], [p["val_bpb"] for p in front], "k--", lw=1,
                    alpha=0.6, label="Pareto front")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("measured decode speed (tok/s, log scale)")
        ax.set_title(f"{t} thread{'s' if t > 1 else ''}", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.margins(y=0.12)
        xs = [p["tok_per_s"] for p in mine]
        ax.set_xlim(min(xs) / 1.4, max(xs) * 1.4)
    axes[0, 0].set_ylabel("validation bits per byte (lower is better)")
    legend: dict[str, Any] = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(lab, h)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=2, fontsize=7, frameon=False)
    r0 = rows[0]
    seeds = sorted({r["seed"] for r in rows})
    fig.suptitle(title or (f"Quality against decode speed: {r0['budget_s']:g} s of CPU training per arm, "
                           f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
                           f"{' (smoke)' if r0.get('smoke') else ''}; {r0.get('cpu', '')}"), fontsize=10)
    fig.tight_layout(rect=(0, 0.02 + 0.04 * ((len(legend) + 1) // 2), 1, 1))
    return fig
