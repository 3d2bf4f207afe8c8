"""`tern gate plan`: a gate's power and cost before it runs (arithmetic in tern.decide.power).

The seed-to-seed spread of each comparison comes from the registry: the gate's own runs
(same hash), else the runs of the gate named by its ``[plan] spread_from`` (arms matched by
name), else those of a gate of the same name, else a short pilot (:func:`pilot_spec`, run
by ``tern gate plan --pilot-steps N``). Training rates come from measured rows only: the
registry's ``gate_run`` rows (``metrics.tokens_per_s``; validation seconds = the run's
wall_s − train_s) and ``train_speed`` rows of a speed file (``benchmarks/gate_train_speed.py``,
which win where both match), matched on the resolved model config, batch, sequence length
and distillation. Speed rows measured on a GPU (``device: "cuda"``, `gate_train_speed.py
--device cuda`) never price the CPU wall time: they give the GPU wall time, at the number of
runs side by side (``concurrent``) whose summed rate was best; a ``--gpu-tok-per-s`` the
user passes wins over them. Without either, the plan gives no GPU figure.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from tern.core.config import param_counts
from tern.decide import power as pw
from tern.decide.registry import _fmt, finished_runs
from tern.decide.spec import GateSpec, canonical_json, gate_from_dict

SPEED_RECORD = "train_speed"


def speed_key(model_config: dict[str, Any], batch_size: int, seq_len: int,
              distill: dict | None = None) -> str:
    """What a measured training rate applies to: model config (name aside), batch, seq_len
    and the distillation method (a KD arm trains slower than plain CE on the same model)."""
    mc = {k: v for k, v in model_config.items() if k != "name"}
    d = {k: distill.get(k) for k in ("method", "teacher")} if distill else None
    return canonical_json([mc, batch_size, seq_len, d])


def measured_rates(rows: Sequence[dict], speed_rows: Sequence[dict] = ()) -> dict[str, dict]:
    """speed_key -> {tok_per_s (median), eval_s (median), n, source}: ``train_speed`` rows
    where they exist for a key, else the registry's gate_run rows."""
    out: dict[str, dict] = {}
    for source, rr in (("registry", rows), ("speed file", speed_rows)):
        acc: dict[str, tuple[list[float], list[float]]] = {}
        for r in rr:
            if r.get("record") == "gate_run":
                m, tc = r["metrics"], r["train_config"]
                rate = m.get("tokens_per_s")
                ev = (m["wall_s"] - m["train_s"]) if {"wall_s", "train_s"} <= set(m) else 0.0
                key = speed_key(r["model_config"], tc["batch_size"], tc["seq_len"], r.get("distill"))
            elif r.get("record") == SPEED_RECORD and r.get("device", "cpu") == "cpu":
                rate, ev = r.get("tokens_per_s"), r.get("eval_s", 0.0)
                key = speed_key(r["model_config"], r["batch_size"], r["seq_len"], r.get("distill"))
            else:
                continue
            if isinstance(rate, (int, float)) and rate > 0:
                a = acc.setdefault(key, ([], []))
                a[0].append(float(rate))
                a[1].append(float(ev))
        for key, (rates, evs) in acc.items():
            out[key] = {"tok_per_s": statistics.median(rates), "eval_s": statistics.median(evs),
                        "n": len(rates), "source": source}
    return out


def measured_gpu_rates(speed_rows: Sequence[dict]) -> dict[str, dict]:
    """speed_key -> {tok_per_s (median per run), eval_s (median), concurrent, total_tok_per_s,
    n, gpu}: of the ``device: "cuda"`` speed rows of one key, the concurrency whose runs summed
    to the highest rate (concurrent x median per-run rate)."""
    acc: dict[str, dict[int, list[dict]]] = {}
    for r in speed_rows:
        if r.get("record") != SPEED_RECORD or r.get("device") != "cuda" or not r.get("tokens_per_s"):
            continue
        key = speed_key(r["model_config"], r["batch_size"], r["seq_len"], r.get("distill"))
        acc.setdefault(key, {}).setdefault(int(r.get("concurrent") or 1), []).append(r)
    out: dict[str, dict] = {}
    for key, by_c in acc.items():
        best = None
        for c, rr in sorted(by_c.items()):
            rate = statistics.median(float(r["tokens_per_s"]) for r in rr)
            ev = statistics.median(float(r.get("eval_s") or 0.0) for r in rr)
            if best is None or c * rate > best["total_tok_per_s"]:
                best = {"tok_per_s": rate, "eval_s": ev, "concurrent": c, "total_tok_per_s": c * rate,
                        "n": len(rr), "gpu": rr[0].get("gpu")}
        out[key] = best
    return out


def spread_source(spec: GateSpec, rows: Sequence[dict]) -> tuple[str, list[dict]]:
    """(basis, run rows) supplying the seed spread (module docstring)."""
    own = list(finished_runs(list(rows), spec.hash).values())
    if any(r["role"] == "arm" for r in own):
        return f"this gate's runs [{spec.short_hash}]", own
    for name in (spec.plan.get("spread_from"), spec.name):
        if not name:
            continue
        hashes = [r["gate_hash"] for r in rows if r.get("record") == "gate_run" and r["gate"] == name]
        if hashes:
            h = hashes[-1]
            return f"runs of gate {name} [{h[:12]}]", list(finished_runs(list(rows), h).values())
    return "none", []


def plan_gate(spec: GateSpec, rows: Sequence[dict], *, power: float | None = None,
              effect: float | None = None, token_exponent: float | None = None,
              speed_rows: Sequence[dict] = (), gpu_tok_per_s: float | None = None,
              workers: int = 1) -> dict[str, Any]:
    """Power and cost of ``spec`` (see tern.decide.power for every formula)."""
    p = power if power is not None else spec.plan.get("power", pw.DEFAULT_POWER)
    k, rule, n_gate = spec.rule.k_sigma, spec.rule, len(spec.seeds)
    basis, src = spread_source(spec, rows)
    vals: dict[str, dict[int, float]] = {}
    src_tokens: dict[str, int] = {}
    for r in src:
        if r["role"] == "arm" and r["arm"] in spec.arms and spec.metric in r["metrics"]:
            vals.setdefault(r["arm"], {})[r["seed"]] = float(r["metrics"][spec.metric])
            src_tokens[r["arm"]] = int(r["metrics"].get("train_tokens") or 0)
    comps = []
    for b, a in spec.comparisons:
        sd, n_src, pairing = pw.sd_delta(vals.get(a, {}), vals.get(b, {}))
        t_from = _geo(src_tokens.get(a), src_tokens.get(b))
        t_to = _geo(spec.arm_tokens(a), spec.arm_tokens(b))
        sd_here = pw.scale_se(sd, t_from, t_to, token_exponent) if t_from else sd
        se_here = sd_here / math.sqrt(n_gate)
        common = sorted(set(vals.get(a, {})) & set(vals.get(b, {})))
        observed = (sum(vals[b][s] - vals[a][s] for s in common) / len(common)) if common else None
        target, t_basis = pw.target_effect(rule.kind, rule.margin, spec.plan.get("effect"), effect,
                                           observed)
        comps.append({
            "b": b, "a": a, "spread": pairing, "n_spread": n_src, "sd_delta": sd,
            "spread_tokens": t_from, "observed_delta": observed,
            "se_at_gate": se_here, "mde_at_gate": pw.mde(k, se_here, p),
            "target_effect": target, "target_basis": t_basis,
            "seeds_needed": pw.seeds_needed(k, sd_here, target, p, minimum=3) if target else None,
            "tokens_needed": pw.tokens_needed(k, se_here, t_to, target, token_exponent, p)
            if target else None})
    need = [c["seeds_needed"] for c in comps if c["seeds_needed"] is not None]
    seeds_needed = max(need) if need and len(need) == len(comps) else None
    cost = _cost(spec, rows, speed_rows, seeds_needed, gpu_tok_per_s, workers)
    return {"gate": spec.name, "gate_hash": spec.hash, "rule": rule.text, "k_sigma": k, "power": p,
            "z_power": pw.z_power(p), "metric": spec.metric, "seeds": n_gate,
            "tokens_per_run": {a: spec.arm_tokens(a) for a in spec.arms},
            "tokens_per_param": {a: spec.arm_tokens(a) / param_counts(spec.model_config(a)).total.params
                                 for a in spec.arms},
            "spread_basis": basis, "token_exponent": token_exponent,
            "token_scaling": (f"se ∝ T^-{token_exponent:g}" if token_exponent is not None else
                              "unknown: spread carried unchanged across budgets; no token count derived"),
            "seed_scaling": "se ∝ 1/sqrt(seeds)", "comparisons": comps, "seeds_needed": seeds_needed,
            **cost}


def _geo(x: int | None, y: int | None) -> int:
    return int(round(math.sqrt(x * y))) if x and y else 0


def _cost(spec: GateSpec, rows, speed_rows, seeds_needed, gpu_tok_per_s, workers) -> dict[str, Any]:
    rates, gpu_rates = measured_rates(rows, speed_rows), measured_gpu_rates(speed_rows)
    b = spec.budget
    arms, gpu_arms = {}, {}
    for name, arm in spec.arms.items():
        key = speed_key(spec.model_config(name).to_dict(), b["batch_size"], b["seq_len"], arm.distill)
        r = rates.get(key)
        gpu_arms[name] = gpu_rates.get(key)
        arms[name] = {"tokens": spec.arm_tokens(name), **(r or {"tok_per_s": None, "eval_s": None,
                                                              "n": 0, "source": "none"})}
        arms[name]["run_s"] = pw.run_seconds(spec.arm_tokens(name), arms[name]["tok_per_s"],
                                             arms[name]["eval_s"] or 0.0)
    teacher_cost = {}
    for t, ts in spec.teachers.items():
        tr = ts.train
        key = speed_key(spec.teacher_model_config(t).to_dict(), tr["batch_size"], tr["seq_len"])
        r = rates.get(key) or {"tok_per_s": None, "eval_s": None, "n": 0, "source": "none"}
        tok = tr["steps"] * tr["batch_size"] * tr["seq_len"]
        teacher_cost[t] = {"tokens": tok, **r, "run_s": pw.run_seconds(tok, r["tok_per_s"], r["eval_s"] or 0.0)}
    teachers = [c["run_s"] for c in teacher_cost.values()]

    def wall(n: int | None) -> float | None:
        if n is None:
            return None
        runs = [a["run_s"] for _ in range(n) for a in arms.values()]  # seed-major, as run_gate
        t = pw.total_seconds(teachers, workers) if teachers else 0.0
        s = pw.total_seconds(runs, workers)
        return None if s is None or t is None else s + t

    # the GPU wall time from measured rows needs every arm measured (teachers are not timed there)
    measured_gpu = not gpu_tok_per_s and not spec.teachers and all(gpu_arms.values())
    shown_gpu = not gpu_tok_per_s and any(gpu_arms.values())

    def gpu(n: int | None) -> float | None:
        if n is None:
            return None
        if measured_gpu:  # each arm's runs c at a time at their measured per-run rate and validation
            return sum(n * (arms[a]["tokens"] / g["tok_per_s"] + g["eval_s"]) / g["concurrent"]
                       for a, g in gpu_arms.items())
        if not gpu_tok_per_s:
            return None
        tok = sum(a["tokens"] for a in arms.values()) * n
        tok += sum(t.train["steps"] * t.train["batch_size"] * t.train["seq_len"] for t in spec.teachers.values())
        return tok / gpu_tok_per_s / workers

    n_gate = len(spec.seeds)
    n_need = max(seeds_needed, n_gate) if seeds_needed else None
    return {"arms_cost": arms, "teachers_cost": teacher_cost, "workers": workers, "cpu_wall_s": wall(n_gate),
            "cpu_wall_s_needed": wall(n_need), "gpu_tok_per_s": gpu_tok_per_s,
            "gpu_measured": gpu_arms if shown_gpu else None,
            "gpu_wall_s": gpu(n_gate), "gpu_wall_s_needed": gpu(n_need)}


def pilot_spec(spec: GateSpec, steps: int, seeds: int = 3) -> GateSpec:
    """A short pilot of ``spec``: the same arms, ``steps`` steps, its first ``seeds`` seeds,
    named ``NAME.pilot<steps>`` (a gate of its own in the registry; its spread feeds the plan
    unchanged unless a token exponent is given)."""
    c = dict(spec.content)
    c["name"] = f"{spec.name}.pilot{steps}"
    c["seeds"] = list(spec.seeds[:max(3, seeds)])
    c["budget"] = {"steps": steps, "batch_size": spec.budget["batch_size"], "seq_len": spec.budget["seq_len"]}
    c["preregistration"] = f"Pilot of {spec.name} ({steps} steps) for its seed spread; not a finding."
    c.pop("plan", None)
    return gate_from_dict(c)


def _mins(s: float | None) -> str:
    return "unknown (no measured rate)" if s is None else f"{s / 60:.1f} min"


def format_plan(r: dict[str, Any]) -> str:
    """The plan as text: spread, MDE at the gate's seeds, seeds / tokens needed, wall time."""
    toks = sorted(set(r["tokens_per_run"].values()))
    tpp = ", ".join(f"{a} {x:.2f}" for a, x in r["tokens_per_param"].items())
    out = [f"gate {r['gate']} [{r['gate_hash'][:12]}]  rule: {r['rule']}  (metric {r['metric']})",
           f"  budget: {', '.join(f'{t:,}' for t in toks)} tokens per run; tokens per parameter: {tpp}",
           f"  spread from {r['spread_basis']}; power {r['power']:g} (z {r['z_power']:.3f}), "
           f"MDE = (k + z) se, {r['seed_scaling']}; tokens: {r['token_scaling']}"]
    for c in r["comparisons"]:
        out.append(f"  {c['b']} vs {c['a']}: sd Δ {_fmt(c['sd_delta'], '.5f')} ({c['spread']}, "
                   f"n={c['n_spread']}), observed Δ {_fmt(c['observed_delta'], '+.5f')}; at "
                   f"{r['seeds']} seeds se {_fmt(c['se_at_gate'], '.5f')}, MDE "
                   f"{_fmt(c['mde_at_gate'], '.5f')}; target δ {_fmt(c['target_effect'], '.4f')} "
                   f"({c['target_basis']}) needs {c['seeds_needed'] or 'unknown'} seeds"
                   + (f" or {c['tokens_needed']:,} tokens/run" if c["tokens_needed"] else ""))
    for kind, costs in (("arm", r["arms_cost"]), ("teacher", r.get("teachers_cost", {}))):
        for a, x in costs.items():
            rate = (f"{x['tok_per_s']:,.0f} tok/s + {x['eval_s']:.1f} s validation" if x["tok_per_s"]
                    else "no rate")
            out.append(f"  {kind} {a}: {x['tokens']:,} tokens at {rate} ({x['source']}, n={x['n']}) "
                       f"-> {_mins(x['run_s'])} per run")
    w = f" over {r['workers']} workers" if r["workers"] > 1 else " (serial)"
    out.append(f"  wall time here{w}: {_mins(r['cpu_wall_s'])} at {r['seeds']} seeds; "
               f"{_mins(r['cpu_wall_s_needed'])} at the seeds needed ({r['seeds_needed'] or 'unknown'})")
    if r.get("gpu_measured"):
        for a, g in r["gpu_measured"].items():
            out.append(f"  GPU arm {a}: " + ("not measured" if g is None else
                       f"{g['tok_per_s']:,.0f} tok/s per run x {g['concurrent']} side by side "
                       f"+ {g['eval_s']:.1f} s validation (measured on {g['gpu'] or 'a GPU'}, n={g['n']})"))
        out.append(f"  GPU wall time: {_mins(r['gpu_wall_s'])} at {r['seeds']} seeds; "
                   f"{_mins(r['gpu_wall_s_needed'])} at the seeds needed")
    elif r["gpu_tok_per_s"]:
        out.append(f"  GPU at the given {r['gpu_tok_per_s']:,.0f} tok/s (training only): "
                   f"{_mins(r['gpu_wall_s'])} at {r['seeds']} seeds; {_mins(r['gpu_wall_s_needed'])} "
                   f"at the seeds needed")
    else:
        out.append("  GPU: no figure (pass --gpu-tok-per-s, or a --speed file with rows measured there)")
    return "\n".join(out)


def plan_toml(r: dict[str, Any]) -> str:
    """The ``[plan]`` table of a gate file from a plan (paste it in before the runs)."""
    mde = ", ".join(f'"{pw.comparison_key(c["b"], c["a"])}" = {c["mde_at_gate"]:.4f}'
                    for c in r["comparisons"] if math.isfinite(c["mde_at_gate"]))
    need = ", ".join(f'"{pw.comparison_key(c["b"], c["a"])}" = {c["seeds_needed"]}'
                     for c in r["comparisons"] if c["seeds_needed"])
    return (f"[plan]\npower = {r['power']:g}\nmde = {{ {mde} }}\nseeds_needed = {{ {need} }}\n"
            f"note = \"{r['spread_basis']}; {r['token_scaling']}\"\n")


def plan_rows(registry: str | None) -> list[dict]:
    """Registry rows a plan reads: ``registry`` as given; else this machine's results
    registry and the shipped gates/registry.jsonl together (runs are keyed by hash, so a
    row present in both counts once)."""
    from tern.decide.registry import default_registry, read_registry, shipped_registry

    if registry:
        return read_registry(registry)
    return read_registry(shipped_registry()) + read_registry(default_registry())


def plan_files(files: Sequence[str], registry: str | None = None, *, speed: str | None = None,
               pilot_steps: int | None = None, workers: int = 1, progress: bool = True,
               **kw: Any) -> list[dict[str, Any]]:
    """Plans of gate files (:func:`plan_gate`). With ``pilot_steps``, a gate with no spread in
    the registry first runs its pilot (:func:`pilot_spec`) into ``registry`` (default: the
    results registry)."""
    from tern.core.records import read_jsonl
    from tern.decide.spec import load_gate

    specs = [load_gate(f) for f in files]
    speed_rows = read_jsonl(speed) if speed else []
    if speed and not speed_rows:
        raise ValueError(f"speed file {speed} holds no rows")
    for i, r in enumerate(speed_rows, 1):  # rows measured_rates / measured_gpu_rates read
        if r.get("record") == SPEED_RECORD and not (isinstance(r.get("model_config"), dict) and all(
                isinstance(r.get(k), (int, float)) for k in ("batch_size", "seq_len", "tokens_per_s"))):
            raise ValueError(f"speed file {speed}, row {i}: a train_speed row needs model_config, batch_size, "
                             f"seq_len and tokens_per_s (benchmarks/gate_train_speed.py writes them)")
    out = []
    for spec in specs:
        rows = plan_rows(registry)
        if pilot_steps and spread_source(spec, rows)[0] == "none":
            from tern.decide.harness import run_gate
            from tern.decide.registry import default_registry

            pilot = pilot_spec(spec, pilot_steps)
            run_gate(pilot, registry or default_registry(), progress=progress)
            rows = plan_rows(registry)
            spec = gate_from_dict({**spec.content, "plan": {**spec.plan, "spread_from": pilot.name}},
                                  spec.path)
        out.append(plan_gate(spec, rows, speed_rows=speed_rows, workers=workers, **kw))
    return out
