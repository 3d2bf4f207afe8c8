"""Both budgets side by side: each shipped gate's verdict at its v1 budget next to its v2
re-run (gates/v2/, 8x the tokens), so the effect of the budget on every verdict is visible.

A v2 gate that has not run yet shows its pre-registered ``[plan]`` MDE (labelled
"planned"), never a verdict.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tern.decide.power import comparison_key
from tern.decide.registry import _fmt, comparison_mde, latest_verdicts, read_registry
from tern.decide.spec import load_gate


def v2_gate_files() -> list[Path]:
    """gates/v2/*.toml of the checkout (or the installed package data); [] when absent."""
    from tern.core.paths import shipped_dir

    try:
        return sorted((shipped_dir("gates") / "v2").glob("*.toml"))
    except FileNotFoundError:
        return []


def budget_comparison(registry: str | Path, files: list[Path] | None = None) -> list[dict[str, Any]]:
    """One row per comparison of every v2 gate that names its v1 gate (``[plan] spread_from``):
    {gate, v1, b, a, rule, tokens_v1, tokens_v2, and per budget (suffix _v1 / _v2) n,
    mean_delta, se_delta, mde, verdict}; a v2 gate without a verdict has verdict "not run",
    mde its planned one and ``mde_v2_planned`` True."""
    verdicts = latest_verdicts(read_registry(registry))
    rows = []
    for f in (v2_gate_files() if files is None else files):
        spec = load_gate(f)
        v1 = spec.plan.get("spread_from")
        if not v1:
            continue
        old, new = verdicts.get(v1), verdicts.get(spec.name)
        for b, a in spec.comparisons:
            row: dict[str, Any] = {"gate": spec.name, "v1": v1, "b": b, "a": a, "rule": spec.rule.text,
                                   "tokens_v2": spec.arm_tokens(b), "mde_v2_planned": new is None}
            row["tokens_v1"] = _tokens(old, b)
            row.update(_side(old, b, a, "v1"))
            row.update(_side(new, b, a, "v2"))
            if new is None:
                row["mde_v2"] = spec.plan.get("mde", {}).get(comparison_key(b, a), math.nan)
            rows.append(row)
    return rows


def _tokens(v: dict | None, arm: str) -> int | None:
    """Training tokens per run of a verdict's gate (None: no verdict, or a per-parameter budget)."""
    if v is None:
        return None
    b = v["content"]["budget"]
    per = b["batch_size"] * b["seq_len"]
    if "steps" in b:
        return b["steps"] * per
    return -(-b["tokens"] // per) * per if "tokens" in b else None


def _side(v: dict | None, b: str, a: str, tag: str) -> dict[str, Any]:
    c = next((x for x in (v or {}).get("comparisons", []) if (x["b"], x["a"]) == (b, a)), None)
    if c is None:
        return {f"n_{tag}": 0, f"mean_delta_{tag}": math.nan, f"se_delta_{tag}": math.nan,
                f"mde_{tag}": math.nan, f"verdict_{tag}": "not run"}
    return {f"n_{tag}": c["n"], f"mean_delta_{tag}": c["mean_delta"], f"se_delta_{tag}": c["se_delta"],
            f"mde_{tag}": comparison_mde(v, c), f"verdict_{tag}": c["verdict"]}


def _delta(r: dict[str, Any], tag: str) -> str:
    if not r[f"n_{tag}"]:
        return f"{'-':>19}"
    return f"{_fmt(r[f'mean_delta_{tag}'], '+.4f'):>9} ± {_fmt(r[f'se_delta_{tag}'], '.4f'):<7}"


def format_budget_table(rows: list[dict[str, Any]]) -> str:
    """The side-by-side table as text (Δ = B − A in the gate's metric, val_bpb: bits/byte)."""
    if not rows:
        return "no v2 gates (gates/v2/*.toml) to compare"
    lines = [f"{'v2 gate':<20} {'v1 gate':<17} {'B vs A':<16} {'tokens/run v1 -> v2':>22} | "
             f"{'v1: Δ ± se':>19} {'MDE':>7} {'verdict':<12} | {'v2: Δ ± se':>19} {'MDE':>8} verdict"]
    for r in rows:
        t1 = f"{r['tokens_v1']:,}" if r["tokens_v1"] else "?"
        lines.append(
            f"{r['gate']:<20} {r['v1']:<17} {r['b'] + ' vs ' + r['a']:<16} "
            f"{t1 + ' -> ' + format(r['tokens_v2'], ','):>22} | {_delta(r, 'v1')} "
            f"{_fmt(r['mde_v1'], '.4f'):>7} {r['verdict_v1']:<12} | {_delta(r, 'v2')} "
            f"{_fmt(r['mde_v2'], '.4f'):>7}{'*' if r['mde_v2_planned'] else ' '} {r['verdict_v2']}")
    lines.append("(Δ = B − A of val_bpb, bits/byte; MDE: the smallest distance from the rule's threshold "
                 "detected with power 0.8; * planned, from the gate file's [plan] written before its runs)")
    return "\n".join(lines)
