"""The report's one-screen summary: the kit's six questions and what this run measured.

Every answer is drawn from the headlines the notebooks saved (tern.report.notebook
.save_headline, one dict per notebook, units in the keys); nothing here is a number of its
own. A notebook that did not run (or saved nothing) answers "not run".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from tern.probe.timing import noted_compile_s

LEVEL_ORDER = ("L1", "L2", "L3", "L4", "DRAM")


@dataclass(frozen=True)
class Answer:
    step: str  # "probe", "predict", ...
    question: str
    notebooks: tuple[str, ...]  # notebook name prefixes ("01", ...) the answer comes from
    text: str | None  # plain text (None: not run)
    figure: str | None  # the figure file name to link to


# ---- numbers ------------------------------------------------------------------------------


def num(x: Any, unit: str = "") -> str:
    """A measured number rounded for reading: 3 significant figures, thousands separated,
    no trailing zeros (222,000 / 6,570 / 210 / 31.6 / 3.6 / 0.00371); integers as they are;
    None as "–", booleans as yes / no."""
    if x is None or isinstance(x, bool):
        return "–" if x is None else ("yes" if x else "no")
    if isinstance(x, int):
        s = f"{x:,}"
    else:
        x = float(x)
        if not math.isfinite(x) or x == 0:
            s = "0" if x == 0 else str(x)
        else:
            digits = 2 - math.floor(math.log10(abs(x)))  # decimals for 3 significant figures
            s = f"{round(x, digits):,.{max(digits, 0)}f}"
            if "." in s:
                s = s.rstrip("0").rstrip(".")
    return f"{s} {unit}" if unit else s


def count(n: Any) -> str:
    """A parameter count: 9.86 B, 503 M, 8.3 k."""
    if n is None:
        return "–"
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return num(n / div, suffix)
    return num(n)


def size(n: Any, binary: bool = False) -> str:
    """Bytes: 32 MiB (binary, cache sizes) or 2.54 GB (decimal, files and RSS)."""
    if n is None:
        return "–"
    base, units = (1024.0, ("KiB", "MiB", "GiB", "TiB")) if binary else (1000.0, ("kB", "MB", "GB", "TB"))
    value, unit = float(n), "B"
    for u in units:
        if abs(value) < base:
            break
        value, unit = value / base, u
    return num(value, unit)


def _plural(ts: list[int]) -> str:
    return f"{' / '.join(map(str, ts))} thread{'s' * (ts != [1])}"


def _by_threads(values: dict[int, Any]) -> str:
    """``{1: 191.2, 2: 284.4}`` -> ``191 / 284``."""
    return " / ".join(num(values[t]) for t in sorted(values))


def _per_thread(h: dict[str, Any], pattern: str) -> dict[str, dict[int, Any]]:
    """{group: {threads: value}} of the keys matching ``pattern`` (groups ``g`` and ``t``)."""
    out: dict[str, dict[int, Any]] = {}
    for k, v in h.items():
        m = re.fullmatch(pattern, k)
        if m and isinstance(v, (int, float)) and not isinstance(v, bool):
            out.setdefault(m["g"], {})[int(m["t"])] = v
    return out


# ---- the answers --------------------------------------------------------------------------


def probe_answer(h: dict[str, Any]) -> str:
    levels = _per_thread(h, r"read_(?P<g>[A-Za-z0-9]+)_(?P<t>\d+)t_gbps")
    order = sorted(levels, key=lambda lv: LEVEL_ORDER.index(lv) if lv in LEVEL_ORDER else len(LEVEL_ORDER))
    ts = sorted({t for lv in levels.values() for t in lv})
    parts = []
    if levels:
        parts.append("read " + " · ".join(f"{lv} {_by_threads(levels[lv])}" for lv in order)
                     + f" GB/s ({_plural(ts)})")
    if h.get("llc_bytes"):
        parts.append(f"last-level cache {size(h['llc_bytes'], binary=True)}")
    if h.get("cpu_model"):
        parts.append(str(h["cpu_model"]) + (f", {h['probe_mode']} probe" if h.get("probe_mode") else ""))
    if h.get("probe_wall_s"):
        took = f"the probe took {num(h['probe_wall_s'])} s"
        c = noted_compile_s(h.get("probe_compile_s"))
        if c is not None:  # a fresh machine: numba compiled the kernels inside the probe
            took += f", {num(c)} s of it numba compiling (once; cached for the next runs)"
        parts.append(took)
    return "; ".join(parts) or "no figures saved"


def predict_answer(h: dict[str, Any]) -> str:
    rates = _per_thread(h, r"(?P<g>[^_]+_.+)_(?P<t>\d+)t_tok_per_s")
    hosts = sorted({g.split("_", 1)[1] for g in rates})
    host = "your_machine" if "your_machine" in hosts else (hosts[0] if hosts else None)
    if host is None:
        return "no predictions saved"
    mine = {g.split("_", 1)[0]: v for g, v in rates.items() if g.split("_", 1)[1] == host}
    ts = sorted({t for v in mine.values() for t in v})
    order = sorted(mine, key=lambda c: -min(mine[c].values()))  # fastest (smallest) first
    text = (" · ".join(f"{c} {_by_threads(mine[c])}" for c in order) + f" tok/s ({_plural(ts)}"
            + ("" if host == "your_machine" else f"; {host.replace('_', ' ')}: this host has no profile") + ")")
    budgets: dict[int, Any] = {}
    for k, v in sorted(h.items()):
        m = re.fullmatch(r"(?P<total>[\d.]+)b_(?P<target>[\d.]+)tps_(?P<host>.+)_(?P<t>\d+)t_active_budget_mb", k)
        if m and m["host"] == host:
            budgets[int(m["t"])] = v
            total, target = m["total"], m["target"]
    if budgets:
        text += (f"; a {total}B-total model reaches {target} tok/s if a token reads at most "
                 f"{_by_threads(budgets)} MB ({_plural(sorted(budgets))})")
    return text


def train_answer(runs: dict[str, dict[str, Any]]) -> str | None:
    parts = [f"{name.split('train_', 1)[-1]}: {num(h.get('val_bpb'))} bits/byte on validation after "
             f"{num(h.get('steps'))} steps ({num(h.get('train_tokens'))} tokens at "
             f"{num(h.get('train_tokens_per_s'))} tok/s, {num(h.get('wall_s'))} s on {h.get('device', '?')})"
             for name, h in runs.items()]
    return "; ".join(parts) or None


def run_answer(h: dict[str, Any]) -> str:
    t = h.get("threads")
    text = (f"baseline {num(h.get('baseline_tok_per_s'))} → {num(h.get('ladder_tok_per_s'))} tok/s "
            f"({num(h.get('ladder_speedup_x'))}×)" + (f" on {_plural([t])}" if isinstance(t, int) else ""))
    if h.get("python_overhead_us_per_token") is not None:
        text += f"; Python overhead {num(h['python_overhead_us_per_token'])} µs/token"
    bpb = [b for b in h.get("bpb_per_rung") or [] if isinstance(b, (int, float))]
    if bpb:
        same = num(min(bpb)) == num(max(bpb))
        text += f"; bits/byte {num(min(bpb))}" + (
            " on every rung" if same else f"–{num(max(bpb))} across rungs")
    if h.get("model_source"):
        text += f"; model: {h['model_source']}"
    return text


def measure_answer(h: dict[str, Any]) -> str:
    parts = []
    if h.get("median_measured_over_predicted") is not None:
        parts.append(f"measured / predicted tok/s: median {num(h['median_measured_over_predicted'])}"
                     + (f", worst {num(h['worst_measured_over_predicted'])}"
                        if h.get("worst_measured_over_predicted") is not None else ""))
    if h.get("median_abs_error") is not None:
        parts.append(f"median error {num(100 * h['median_abs_error'])} %")
    for k, v in sorted(h.items()):
        m = re.fullmatch(r"fraction_within_(\d+)pct", k)
        if m and v is not None:
            parts.append(f"{num(100 * v)} % of {num(h.get('points'))} points within ±{m[1]} %")
    if isinstance(h.get("meets_targets"), bool):
        parts.append(f"meets its targets: {num(h['meets_targets'])}")
    drifted = h.get("host_drifted_points")
    if drifted and h.get("points"):
        from tern.measure.hosts import DRIFT_TOLERANCE, host_drifted

        medians = ", ".join(f"{name} {num(h[key])}x" for name, key in
                            (("read", "host_read_over_probe_median"), ("kernel", "host_kernel_over_probe_median"))
                            if h.get(key) is not None)
        if host_drifted({"drifted": drifted, "n": h["points"]}):
            parts.append(f"the host drifted: at {num(drifted)} of {num(h['points'])} points its read rate or kernel "
                         f"speed was more than ±{num(100 * DRIFT_TOLERANCE)} % from its probe's (medians: "
                         f"{medians}): re-run on a quiet machine")
    pair = _per_thread(h, r"(?P<g>105m|206m)_tok_per_s_(?P<t>\d+)t")
    if pair:
        ts = sorted({t for v in pair.values() for t in v})
        parts.append("at equal active params " + " vs ".join(f"{g.upper()} {_by_threads(v)}"
                                                            for g, v in sorted(pair.items()))
                     + f" tok/s ({_plural(ts)})")
    return "; ".join(parts) or "no figures saved"


def ten_b_answer(h: dict[str, Any]) -> str:
    meas = _per_thread(h, r"measured_tok_per_s(?P<g>)_(?P<t>\d+)t").get("", {})
    pred = _per_thread(h, r"predicted_tok_per_s(?P<g>)_(?P<t>\d+)t").get("", {})
    text = (f"{h.get('config', '?')} ({count(h.get('total_params'))} params, {count(h.get('active_params'))} "
            f"active, {size(h.get('packed_bytes'))} packed): measured {_by_threads(meas) or '–'} tok/s, "
            f"predicted {_by_threads(pred) or '–'} ({_plural(sorted(meas or pred))})")
    reached = {int(m[1]): v for k, v in h.items()
               if (m := re.fullmatch(r"measured_reaches_target_(\d+)t", k)) and isinstance(v, bool)}
    if reached:
        text += (f"; measured at the target on {_plural(sorted(reached))}: "
                 f"{' / '.join(num(reached[t]) for t in sorted(reached))}")
    elif h.get("predicted_reaches_target") is not None:
        text += f"; predicted to reach the target: {num(h['predicted_reaches_target'])}"
    rss = [v for k, v in h.items() if k.startswith("peak_rss_bytes_") and isinstance(v, (int, float))]
    if rss:
        text += f"; peak RSS {size(max(rss))}"
    if h.get("smoke_stand_in"):
        text += " (SMOKE: measured on a stand-in with fewer experts, not the 10B model)"
    return text


def decide_answer(h: dict[str, Any]) -> str | None:
    verdicts = {k.removesuffix("_verdict"): v for k, v in sorted(h.items()) if k.endswith("_verdict")}
    if not verdicts:
        return None
    tally = ", ".join(f"{sum(v == x for v in verdicts.values())} {x}" for x in sorted(set(verdicts.values())))
    text = (f"{len(verdicts)} gate{'s' * (len(verdicts) != 1)} ({tally}): "
            + " · ".join(f"{g} {v}" for g, v in verdicts.items()))
    if len(verdicts) == 1:  # one gate: its comparisons fit too
        g = next(iter(verdicts))
        text += "".join(f" (Δ {num(v)} ± {num(h.get(k.replace('_delta_', '_se_')))} "
                        f"{k.rsplit('_delta_', 1)[1].replace('val_bpb', 'bits/byte')})"
                        for k, v in sorted(h.items())
                        if k.startswith(f"{g}_") and "_delta_" in k and isinstance(v, (int, float)))
    return text


def _pick(headlines: dict[str, dict], prefix: str) -> dict[str, Any] | None:
    return next((h for n, h in sorted(headlines.items()) if n.startswith(prefix)), None)


def answers(headlines: dict[str, dict]) -> tuple[Answer | None, list[Answer]]:
    """(the 10B answer or None when notebook 08 saved nothing, the six step answers)."""
    def one(step, question, nb, fn, figure):
        h = _pick(headlines, nb)
        return Answer(step, question, (nb,), fn(h) if h else None, figure)

    trains = {n: h for n, h in sorted(headlines.items()) if n[:2] in ("03", "04")}
    rows = [
        one("probe", "What do this host's caches and memory deliver?", "01", probe_answer,
            "probe_read_bandwidth.png"),
        one("predict", "How fast should each model decode here?", "02", predict_answer, "roofline_presets.png"),
        Answer("train", "What does a short training run reach?", ("03", "04"), train_answer(trains),
               "train_sandbox_curves.png"),
        one("run", "How fast does the engine decode, and what does each optimization buy?", "05",
            run_answer, "engine_ladder.png"),
        one("measure", "Does the prediction hold when measured?", "06", measure_answer,
            "sweep_fixed_active.png"),
        one("decide", "Which design changes pass their pre-registered gates?", "07", decide_answer,
            "gates_forest.png"),
    ]
    h10 = _pick(headlines, "08")
    lead = (Answer("10B", "How fast does a ~10B-total ternary MoE decode on this CPU?", ("08",),
                   ten_b_answer(h10), "toward_10b_target.png") if h10 else None)
    return lead, rows
