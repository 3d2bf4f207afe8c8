"""Figures of the gate registry: the verdict forest plot, the capacity-scaling plot (BPB
against total parameters with error bars across seeds) and expert load per arm.

Every figure is drawn from registry rows (``tern.decide.registry.read_registry``), never from
numbers kept elsewhere, so it can be regenerated at any time.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tern.core.figure import subplots
from tern.decide.harness import arm_summaries
from tern.decide.registry import gate_runs, latest_verdicts, read_registry

VERDICT_COLORS = {"pass": "tab:green", "fail": "tab:red", "inconclusive": "tab:gray"}
METRIC_UNITS = {"val_bpb": "bits/byte"}


def forest_plot(verdicts: list[dict[str, Any]], path: str | Path | None = None):
    """One row per comparison: mean Δ = B − A ± k·se (k from the gate's rule, 2 in the
    shipped gates), coloured by verdict, with the rule's threshold marked on each row."""
    rows = [(v, c) for v in verdicts for c in v["comparisons"]]
    if not rows:
        raise ValueError("forest_plot needs at least one verdict with a comparison")
    fig, ax = subplots(figsize=(8, 0.45 * len(rows) + 1.6))
    for i, (v, c) in enumerate(rows):
        y = len(rows) - 1 - i
        k = v["rule"]["k_sigma"]
        se = c["se_delta"] if c["se_delta"] is not None and math.isfinite(c["se_delta"]) else 0.0
        ax.errorbar(c["mean_delta"], y, xerr=k * se, fmt="o", capsize=3,
                    color=VERDICT_COLORS.get(c["verdict"], "k"))
        ax.plot([v["rule"]["margin"]] * 2, [y - 0.35, y + 0.35], color="tab:orange", lw=2)
    ax.axvline(0.0, color="k", lw=0.6)
    units = {METRIC_UNITS.get(v["metric"], "metric units") for v in verdicts}
    metrics = sorted({v["metric"] for v in verdicts})
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{v['gate']}: {c['b']} vs {c['a']} ({c['verdict']})" for v, c in reversed(rows)])
    ax.set_xlabel(f"Δ {'/'.join(metrics)} = B − A ({', '.join(sorted(units))}); "
                  f"bars ± k·se, orange: rule threshold")
    ax.set_title("Pre-registered gates: paired difference over seeds")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def capacity_points(run_rows: list[dict[str, Any]], metric: str = "val_bpb") -> list[dict[str, Any]]:
    """Per arm: total and active params, mean metric ± standard error across seeds, n;
    sorted by total params."""
    arms = arm_summaries({"metric": metric, "record": []}, run_rows)
    return sorted(({"arm": name, **{k: a[k] for k in ("total_params", "active_params", "n", "mean", "se")}}
                   for name, a in arms.items()), key=lambda p: p["total_params"])


def capacity_plot(run_rows: list[dict[str, Any]], metric: str = "val_bpb", title: str = "",
                  path: str | Path | None = None):
    """Metric against total parameters (log axis), error bars ± 1 standard error across
    seeds, one point per arm, annotated with the arm name and active params."""
    pts = capacity_points(run_rows, metric)
    if not pts:
        raise ValueError("capacity_plot needs gate_run rows")
    fig, ax = subplots(figsize=(6.5, 4.2))
    x = [p["total_params"] / 1e6 for p in pts]
    y = [p["mean"] for p in pts]
    e = [p["se"] if math.isfinite(p["se"]) else 0.0 for p in pts]
    ax.errorbar(x, y, yerr=e, fmt="o-", capsize=4)
    for p, xi, yi in zip(pts, x, y, strict=True):
        ax.annotate(f"{p['arm']} ({p['active_params'] / 1e6:.2f}M active)", (xi, yi),
                    textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("total parameters (millions, log scale)")
    ax.set_ylabel(f"{metric} ({METRIC_UNITS.get(metric, 'metric units')}), mean ± se over seeds")
    ax.set_title(title or "Capacity scaling at fixed active parameters")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def expert_load_matrix(expert_load: Any) -> list[list[float]] | None:
    """Per-layer per-expert assignment counts from a run's ``expert_load`` metric (a list
    of per-layer dicts with ``counts``, as ``TernLM.expert_load()`` gives, or a list of
    per-layer lists); None when absent."""
    if not isinstance(expert_load, list) or not expert_load:
        return None
    rows = [r.get("counts") if isinstance(r, dict) else r for r in expert_load]
    if all(isinstance(r, list) and r for r in rows):
        return [[float(x) for x in r] for r in rows]
    return None


def expert_load_plot(run_rows: list[dict[str, Any]], path: str | Path | None = None):
    """Per arm: the sorted per-expert load (fraction of routed token-slots, times the number
    of experts so that 1.0 = perfectly balanced), averaged over layers and seeds."""
    curves: dict[str, list[list[float]]] = {}
    for r in run_rows:
        m = expert_load_matrix(r["metrics"].get("expert_load")) if r["role"] == "arm" else None
        if m is None:
            continue
        for layer in m:
            tot = sum(layer) or 1.0
            e = len(layer)
            curves.setdefault(r["arm"], []).append(sorted((x / tot * e for x in layer), reverse=True))
    if not curves:
        raise ValueError("expert_load_plot: no run row has a per-layer expert_load")
    fig, ax = subplots(figsize=(6.5, 4.2))
    for arm, rows in curves.items():
        e = len(rows[0])
        mean = [sum(r[i] for r in rows) / len(rows) for i in range(e)]
        ax.plot([(i + 0.5) / e for i in range(e)], mean, marker=".", label=f"{arm} ({e} experts)")
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_xlabel("expert rank by load (fraction of experts, busiest first)")
    ax.set_ylabel("load / balanced load (1.0 = uniform)")
    ax.set_title("Expert load per arm (mean over layers and seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_registry(registry: str | Path, out: str | Path,
                  capacity_gate: str = "capacity_scaling") -> list[Path]:
    """Write the forest plot of every gate's latest verdict, and for ``capacity_gate`` the
    capacity-scaling plot and (when runs report it) the expert load plot, as PNGs in
    ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = read_registry(registry)
    verdicts = latest_verdicts(rows)
    paths = []
    if verdicts:
        p = out / "gates_forest.png"
        forest_plot(list(verdicts.values()), p)
        paths.append(p)
    v = verdicts.get(capacity_gate)
    if v is not None:
        runs = gate_runs(rows, v["gate_hash"])
        p = out / f"gates_{capacity_gate}_capacity.png"
        capacity_plot(runs, v["metric"], f"{capacity_gate}: {v['metric']} against total params", p)
        paths.append(p)
        if any(expert_load_matrix(r["metrics"].get("expert_load")) for r in runs):
            p = out / f"gates_{capacity_gate}_expert_load.png"
            expert_load_plot(runs, p)
            paths.append(p)
    return paths
