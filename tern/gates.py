"""Pre-registered A/B gates over seeds: run the arms, decide mechanically, keep a registry.

A gate (a TOML file, see :mod:`tern.gates_spec`) names two or more arms, a metric
(validation BPB by default), a pass rule, ≥ 3 seeds and a token budget, written down
before anything runs. :func:`run_gate` trains every (arm, seed) pair with the *same*
budget and seed (same tokens in the same order), pairs the arms by seed and decides the
rule from the paired differences Δ = B − A (mean ± standard error, z-score; the exact
definitions of pass / fail / inconclusive are in :mod:`tern.gates_stats`).

Registry (JSONL, default ``results/gates/registry.jsonl``) — only ever appended to:

- ``record: "gate_run"`` — one finished training run: gate name and hash, arm, seed,
  role ("arm" or "teacher"), ``config_hash``, ``metrics`` (what the runner returned:
  val_bpb, train_tokens, tokens_per_s, sparsity, expert_load, ...), the resolved
  ``model_config`` and ``train_config``, ``counts`` (tern.config.param_counts summary),
  ``wall_s`` and ``run_metadata``.
- ``record: "gate_verdict"`` — the decision: gate name and hash, the gate's full content
  (pre-registration included), rule, per-comparison statistics with per-seed values,
  per-arm summaries, the overall verdict, and ``run_metadata``.

Every record carries the SHA-256 of the gate's canonical content. A run is reused
(resume after an interruption) only when gate hash, arm, seed and ``config_hash`` (the
resolved model + train config, so a changed preset also invalidates) all match; an
edited gate therefore starts from scratch, and old rows stay in the file untouched.

The harness does not know how training works: ``runner(model_cfg, train_cfg, out_dir=None,
progress=True) -> dict`` defaults to :func:`tern.train.run_training`; distillation arms
use ``distill_runner(model_cfg, train_cfg, teacher_checkpoint=, teacher_cfg=, distill=,
out_dir=, progress=)`` (default :func:`tern.distill.run_distill`). Teachers are trained
first by ``runner`` with an ``out_dir`` under ``work_dir`` and must return the path of the
weights they wrote as ``checkpoint``; a teacher whose checkpoint has disappeared is
retrained while students still need it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import ModelConfig, param_counts
from .gates_spec import GateSpec, canonical_json, content_hash, load_gate
from .gates_stats import combine, compare
from .records import append_jsonl, read_jsonl, run_metadata

REGISTRY_SCHEMA = 1
Runner = Callable[..., dict]

JSON_FIELDS = """\
  every object has command ("run" | "dry-run" | "list" | "show" | "plot")
  run:  {verdicts: [one verdict record per gate file, in order]}; a verdict record is
        {record: "gate_verdict", gate, gate_hash, verdict
        ("pass" | "fail" | "inconclusive"), metric, rule: {text, kind, op, margin, k_sigma},
        comparisons: [{b, a, n, mean_delta, sd_delta, se_delta, z, lo, hi, verdict, reason,
        per_seed: [{seed, a, b, delta}]}], arms: {arm: {n, mean, se, per_seed: {seed: value},
        total_params, active_params, recorded: {metric: mean}}}, runs_reused, runs_trained,
        registry, content (the gate file), run_metadata}
        (--dry-run: {plans: [{gate, gate_hash, runs: [{arm, seed, done}], runs_total,
        runs_done, train_tokens_per_run, train_tokens_total, teacher_steps}]})
  list: {registry, gates: [{gate, gate_hash, verdict, rule, metric, comparisons:
        [{b, a, n, mean_delta, se_delta, z, verdict}], runs_done, runs_total, timestamp}]}
  show: {gate, gate_hash, verdict record (as run) or null, runs: [gate_run rows]}
  plot: {figures: [png paths]}"""


# ---- registry -----------------------------------------------------------------------------


def default_registry() -> Path:
    from .notebook import results_dir

    return results_dir("results") / "gates" / "registry.jsonl"


def _jsonable(x: Any) -> Any:
    """Plain JSON types from numpy scalars/arrays, tuples and dataclasses."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _jsonable(dataclasses.asdict(x))
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist"):  # numpy arrays and scalars, torch tensors
        return _jsonable(x.tolist())
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def config_hash(model_cfg: ModelConfig, train_cfg: Any, distill: dict | None = None) -> str:
    """SHA-256 of a run's resolved configs (what resume compares besides the gate hash)."""
    return content_hash({"model": model_cfg.to_dict(), "train": _jsonable(train_cfg),
                         "distill": distill})


def read_registry(path: str | Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(path) if r.get("record") in ("gate_run", "gate_verdict")]


def finished_runs(rows: list[dict[str, Any]], gate_hash: str) -> dict[tuple[str, int, str], dict]:
    """(arm, seed, config_hash) -> the latest gate_run row of this gate hash."""
    out = {}
    for r in rows:
        if r.get("record") == "gate_run" and r.get("gate_hash") == gate_hash:
            out[(r["arm"], r["seed"], r["config_hash"])] = r
    return out


# ---- resolving runs -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    arm: str  # arm name, or "teacher:NAME"
    seed: int
    role: str  # "arm" | "teacher"
    model_cfg: ModelConfig
    train_cfg: Any
    distill: dict | None
    config_hash: str


def default_make_train() -> Callable[[dict], Any]:
    """Build a :class:`tern.train.TrainConfig` from keyword overrides (its own validation
    speaks; unknown keys are a ValueError)."""
    from .train import TrainConfig

    known = {f.name for f in dataclasses.fields(TrainConfig)}

    def make(kw: dict[str, Any]) -> Any:
        unknown = sorted(set(kw) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig keys {unknown}; known: {sorted(known)}")
        return TrainConfig(**kw)

    return make


def plan_runs(spec: GateSpec, make_train: Callable[[dict], Any]) -> list[PlannedRun]:
    """Every run of the gate in execution order: teachers first, then seed-major (all arms
    of seed 0, then seed 1, ...) so that an interrupted gate holds complete pairs.
    All configs are built (and validated) here, before anything trains."""
    runs = []
    for t in spec.teachers:
        mc = spec.teacher_model_config(t)
        try:
            tc = make_train(spec.teacher_train_overrides(t))
        except (TypeError, ValueError) as e:
            raise ValueError(f"teacher {t!r} train config: {e}") from None
        runs.append(PlannedRun(f"teacher:{t}", spec.teachers[t].seed, "teacher", mc, tc, None,
                               config_hash(mc, tc)))
    for seed in spec.seeds:
        for arm, a in spec.arms.items():
            mc = spec.model_config(arm)
            try:
                tc = make_train(spec.train_overrides(arm, seed))
            except (TypeError, ValueError) as e:
                raise ValueError(f"arm {arm!r} train config: {e}") from None
            runs.append(PlannedRun(arm, seed, "arm", mc, tc, a.distill, config_hash(mc, tc, a.distill)))
    return runs


def _run_dir(work_dir: Path, spec: GateSpec, run: PlannedRun) -> Path:
    safe = run.arm.replace(":", "_")
    return work_dir / f"{spec.name}-{spec.short_hash}" / f"{safe}-seed{run.seed}"


# ---- running a gate -----------------------------------------------------------------------


def run_gate(spec: GateSpec | str | Path, registry: str | Path | None = None, *,
             runner: Runner | None = None, distill_runner: Runner | None = None,
             make_train: Callable[[dict], Any] | None = None, work_dir: str | Path | None = None,
             progress: bool = True) -> dict[str, Any]:
    """Run (or resume) a gate and append its verdict to the registry; returns the verdict
    record. Finished runs of the same gate hash and config are read back, not retrained."""
    if not isinstance(spec, GateSpec):
        spec = load_gate(spec)
    registry = Path(registry) if registry is not None else default_registry()
    work_dir = (Path(work_dir) if work_dir is not None else registry.parent / "work").resolve()
    if make_train is None:
        make_train = default_make_train()
    runs = plan_runs(spec, make_train)
    if runner is None:
        from .train import run_training as runner
    if distill_runner is None and any(r.distill for r in runs):
        from .distill import run_distill as distill_runner

    done = finished_runs(read_registry(registry), spec.hash)
    teachers = {r.arm.split(":", 1)[1]: r for r in runs if r.role == "teacher"}
    pending_distill = any(r.distill and (r.arm, r.seed, r.config_hash) not in done for r in runs)

    def teacher_checkpoint(t: PlannedRun) -> Path | None:
        row = done.get((t.arm, t.seed, t.config_hash))
        ck = row["metrics"].get("checkpoint") if row else None
        return Path(ck) if ck and Path(ck).is_file() else None

    # a teacher is (re)trained when it has no run yet, or when students still need it and
    # its checkpoint is gone (the registry keeps figures, the work folder keeps weights)
    todo = [r for r in runs if (r.arm, r.seed, r.config_hash) not in done
            or (r.role == "teacher" and pending_distill and teacher_checkpoint(r) is None)]
    trained = 0
    _log(f"gate {spec.name} [{spec.short_hash}]: {len(runs)} runs, {len(runs) - len(todo)} "
         f"already in {registry}, {len(todo)} to train", progress)
    for i, run in enumerate(todo):
        _log(f"gate {spec.name}: run {i + 1}/{len(todo)}: {run.arm} seed {run.seed}", progress)
        t0 = time.perf_counter()
        if run.distill:
            t = teachers[run.distill["teacher"]]
            ckpt = teacher_checkpoint(t)
            if ckpt is None:
                raise ValueError(f"teacher {t.arm} has no checkpoint file; the runner must return "
                                 "'checkpoint' (the path it wrote under out_dir)")
            metrics = distill_runner(run.model_cfg, run.train_cfg, teacher_checkpoint=ckpt,
                                     teacher_cfg=t.model_cfg, distill=dict(run.distill),
                                     out_dir=None, progress=progress)
        elif run.role == "teacher":
            metrics = runner(run.model_cfg, run.train_cfg, out_dir=_run_dir(work_dir, spec, run),
                             progress=progress)
        else:
            metrics = runner(run.model_cfg, run.train_cfg, out_dir=None, progress=progress)
        wall_s = time.perf_counter() - t0
        metrics = _jsonable(metrics)
        if not isinstance(metrics, dict) or spec.metric not in metrics:
            raise ValueError(f"runner returned no {spec.metric!r} for {run.arm} seed {run.seed}: "
                             f"{sorted(metrics) if isinstance(metrics, dict) else metrics!r}")
        row = {"record": "gate_run", "schema": REGISTRY_SCHEMA, "gate": spec.name,
               "gate_hash": spec.hash, "arm": run.arm, "seed": run.seed, "role": run.role,
               "config_hash": run.config_hash, "metrics": metrics,
               "model_config": run.model_cfg.to_dict(), "train_config": _jsonable(run.train_cfg),
               "distill": run.distill, "counts": param_counts(run.model_cfg).summary(),
               "wall_s": wall_s, "run_metadata": run_metadata()}
        append_jsonl(registry, row)
        done[(run.arm, run.seed, run.config_hash)] = row
        trained += 1
    current = [done[(r.arm, r.seed, r.config_hash)] for r in runs]
    verdict = verdict_record(spec, current)
    verdict.update(runs_reused=len([r for r in runs if r not in todo]), runs_trained=trained,
                   registry=str(registry))
    append_jsonl(registry, verdict)
    _log(f"gate {spec.name}: {verdict['verdict'].upper()}", progress)
    return verdict


def _log(msg: str, on: bool) -> None:
    if on:
        print(msg, file=sys.stderr, flush=True)


def _mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    if n == 0:
        return math.nan, math.nan
    m = sum(xs) / n
    if n < 2:
        return m, math.nan
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def scalar_metrics(name: str, value: Any) -> dict[str, float]:
    """Plain numbers of a recorded metric: a number as ``{name: v}``; a list of per-layer
    dicts (e.g. ``sparsity`` [{layer, zero_frac}], ``expert_load`` [{layer, max_over_mean,
    dead_experts, ...}]) as the mean over layers of each numeric field, ``{name.field: v}``."""
    if _number(value):
        return {name: float(value)}
    out: dict[str, float] = {}
    if isinstance(value, list) and value and all(isinstance(d, dict) for d in value):
        keys = {k for d in value for k, v in d.items() if _number(v) and k != "layer"}
        for k in sorted(keys):
            xs = [float(d[k]) for d in value if _number(d.get(k))]
            out[f"{name}.{k}"] = sum(xs) / len(xs)
    return out


def arm_summaries(spec_record: dict[str, Any], run_rows: list[dict[str, Any]]) -> dict[str, dict]:
    """Per arm: metric per seed, mean ± standard error across seeds, parameter counts and
    the means over seeds of the recorded side metrics (see :func:`scalar_metrics`)."""
    metric, record = spec_record["metric"], spec_record["record"]
    out: dict[str, dict] = {}
    for r in run_rows:
        if r["role"] != "arm":
            continue
        a = out.setdefault(r["arm"], {"per_seed": {}, "total_params": r["counts"]["total_params"],
                                      "active_params": r["counts"]["active_params"], "_rec": {}})
        a["per_seed"][str(r["seed"])] = r["metrics"][metric]
        for k in record:
            for name, v in scalar_metrics(k, r["metrics"].get(k)).items():
                a["_rec"].setdefault(name, []).append(v)
    for a in out.values():
        vals = [float(v) for v in a["per_seed"].values()]
        a["n"] = len(vals)
        a["mean"], a["se"] = _mean_se(vals)
        a["recorded"] = {k: sum(v) / len(v) for k, v in a.pop("_rec").items()}
    return out


def verdict_record(spec: GateSpec, run_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Decide every comparison of the gate from its run rows (see tern.gates_stats)."""
    by_arm: dict[str, dict[int, float]] = {}
    tokens: dict[str, dict[int, Any]] = {}
    for r in run_rows:
        if r["role"] == "arm":
            by_arm.setdefault(r["arm"], {})[r["seed"]] = float(r["metrics"][spec.metric])
            tokens.setdefault(r["arm"], {})[r["seed"]] = r["metrics"].get("train_tokens")
    comps = []
    for b, a in spec.comparisons:
        c = compare(spec.rule, by_arm.get(a, {}), by_arm.get(b, {}), tokens.get(a, {}), tokens.get(b, {}))
        comps.append({"b": b, "a": a, **c})
    expected = len(spec.seeds) * len(spec.arms)
    have = sum(len(v) for v in by_arm.values())
    return {"record": "gate_verdict", "schema": REGISTRY_SCHEMA, "gate": spec.name,
            "gate_hash": spec.hash, "gate_file": spec.path, "question": spec.question,
            "metric": spec.metric, "record_metrics": list(spec.record), "rule": spec.rule.to_dict(),
            "verdict": combine([c["verdict"] for c in comps]), "complete": have == expected,
            "comparisons": comps,
            "arms": arm_summaries({"metric": spec.metric, "record": list(spec.record)}, run_rows),
            "labels": {k: a.label for k, a in spec.arms.items()},
            "content": spec.content, "run_metadata": run_metadata()}


# ---- reading the registry -----------------------------------------------------------------


def latest_verdicts(rows: list[dict[str, Any]]) -> dict[str, dict]:
    """The latest verdict record of each gate name (file order: later rows win)."""
    out: dict[str, dict] = {}
    for r in rows:
        if r.get("record") == "gate_verdict":
            out[r["gate"]] = r
    return out


def gate_runs(rows: list[dict[str, Any]], gate_hash: str) -> list[dict[str, Any]]:
    """The run rows of one gate hash, latest per (arm, seed, config_hash)."""
    return list(finished_runs(rows, gate_hash).values())


def list_gates(registry: str | Path) -> list[dict[str, Any]]:
    """One summary row per gate name: its latest verdict, or the run progress of a gate
    that has runs but no verdict yet (interrupted)."""
    rows = read_registry(registry)
    verdicts = latest_verdicts(rows)
    out = []
    for name, v in verdicts.items():
        out.append({"gate": name, "gate_hash": v["gate_hash"], "verdict": v["verdict"],
                    "rule": v["rule"]["text"], "metric": v["metric"],
                    "runs_done": sum(a["n"] for a in v["arms"].values()),
                    "runs_total": len(v["content"]["seeds"]) * len(v["content"]["arms"]),
                    "timestamp": v["run_metadata"]["timestamp"],
                    "comparisons": [{k: c[k] for k in ("b", "a", "n", "mean_delta", "se_delta", "z",
                                                       "verdict")} for c in v["comparisons"]]})
    pending: dict[str, dict] = {}
    for r in rows:
        if r.get("record") == "gate_run" and r["gate"] not in verdicts and r["role"] == "arm":
            p = pending.setdefault(r["gate"], {"gate": r["gate"], "gate_hash": r["gate_hash"],
                                               "verdict": "running", "rule": "", "metric": "",
                                               "runs": set(), "runs_total": None, "comparisons": [],
                                               "timestamp": r["run_metadata"]["timestamp"]})
            p["runs"].add((r["arm"], r["seed"]))
    for p in pending.values():
        p["runs_done"] = len(p.pop("runs"))
        out.append(p)
    return out


def show_gate(registry: str | Path, name: str) -> dict[str, Any]:
    """The latest verdict of gate ``name`` and its run rows (or its runs so far)."""
    rows = read_registry(registry)
    v = latest_verdicts(rows).get(name)
    if v is not None:
        h = v["gate_hash"]
    else:
        hashes = [r["gate_hash"] for r in rows if r.get("record") == "gate_run" and r["gate"] == name]
        if not hashes:
            known = sorted({r["gate"] for r in rows})
            raise ValueError(f"no gate named {name!r} in {registry}; gates there: {known}")
        h = hashes[-1]
    return {"gate": name, "gate_hash": h, "verdict": v, "runs": gate_runs(rows, h)}


def plan(spec: GateSpec, registry: str | Path, make_train: Callable[[dict], Any] | None = None) -> dict:
    """What `run` would do: the runs, which are already in the registry, the tokens."""
    if make_train is None:
        make_train = default_make_train()
    runs = plan_runs(spec, make_train)
    done = finished_runs(read_registry(registry), spec.hash)
    rr = [{"arm": r.arm, "seed": r.seed, "done": (r.arm, r.seed, r.config_hash) in done} for r in runs]
    n_arm_runs = len(spec.seeds) * len(spec.arms)
    return {"gate": spec.name, "gate_hash": spec.hash, "runs": rr, "runs_total": len(rr),
            "runs_done": sum(r["done"] for r in rr), "train_tokens_per_run": spec.tokens_per_run,
            "train_tokens_total": spec.tokens_per_run * n_arm_runs,
            "teacher_steps": {t: s.train["steps"] for t, s in spec.teachers.items()}}


def shipped_gates() -> list[Path]:
    """The gate files shipped in ``gates/`` of the checkout, in order."""
    from .notebook import repo_root

    root = repo_root()
    d = root / "gates" if root else Path.cwd() / "gates"
    files = sorted(d.glob("*.toml"))
    if not files:
        raise ValueError(f"no gate files in {d}")
    return files


def shipped_registry() -> Path:
    """``gates/registry.jsonl`` of the checkout: the records of the shipped gates as run on
    the machine named in each record (a copy of a finished run's registry, committed)."""
    from .notebook import repo_root

    root = repo_root()
    return (root / "gates" if root else Path.cwd() / "gates") / "registry.jsonl"


def registry_to_show(results_registry: str | Path, ran_here: bool) -> Path:
    """The registry a notebook shows: the results folder's when gates ran here or it
    holds records, else the shipped one (when present)."""
    own = Path(results_registry)
    if ran_here or (own.exists() and own.stat().st_size > 0):
        return own
    shipped = shipped_registry()
    return shipped if shipped.exists() else own


def gate_headlines(registry: str | Path) -> dict[str, Any]:
    """Headline figures of every gate's latest verdict: the verdict, and per comparison
    the mean Δ and its standard error (keys carry the metric, e.g. ``_delta_val_bpb``)."""
    out: dict[str, Any] = {}
    for name, v in latest_verdicts(read_registry(registry)).items():
        out[f"{name}_verdict"] = v["verdict"]
        for c in v["comparisons"]:
            key = f"{name}_{c['b']}_vs_{c['a']}"
            out[f"{key}_delta_{v['metric']}"] = c["mean_delta"]
            out[f"{key}_se_{v['metric']}"] = c["se_delta"]
    return out


def registry_report(registry: str | Path) -> str:
    """The verdict table followed by every gate's verdict in full (text)."""
    gates = list_gates(registry)
    if not gates:
        return f"no gates in {registry}"
    parts = [format_table(gates)]
    for g in gates:
        v = show_gate(registry, g["gate"])
        parts.append(format_verdict(v["verdict"]) if v["verdict"] else
                     f"gate {g['gate']}: no verdict yet, {len(v['runs'])} run(s) finished")
    return "\n\n".join(parts)


# ---- a tiny gate for smoke tests and notebooks --------------------------------------------

SMOKE_GATE = """\
schema = 1
name = "smoke"
question = "Smoke test of the harness: a one-layer model, fp32 against ternary MLP, 2 steps."
preregistration = '''Not a finding: 2 training steps of a 1-layer d_model 32 model exercise the
harness (pairing, registry, verdict) end to end. Budget: 2 steps x 2 x 32 tokens per arm;
validation BPB on the first 4,096 validation tokens only (a quick estimate).'''
metric = "val_bpb"
record = ["sparsity", "tokens_per_s"]
seeds = [0, 1, 2]
rule = "B - A <= +0.05 at 2 sigma"

[budget]
steps = 2
batch_size = 2
seq_len = 32

[common]
preset = "sandbox"
model = { d_model = 32, n_layers = 1, attn_layers = [], moe_layers = [], mlp_hidden = 64, n_experts = 0, top_k = 0, expert_hidden = 0, n_shared = 0, shared_hidden = 0, max_seq_len = 32 }
train = { final_eval_tokens = 4096, warmup_steps = 1 }

[arms.A]
label = "fp32 MLP"
model = { mlp_format = "fp32" }

[arms.B]
label = "ternary MLP"
model = { mlp_format = "ternary2" }
"""


def smoke_gate_file(folder: str | Path) -> Path:
    """Write the tiny smoke gate (:data:`SMOKE_GATE`) into ``folder``; returns its path."""
    p = Path(folder) / "smoke_gate.toml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(SMOKE_GATE, encoding="utf-8")
    return p


# ---- rendering ----------------------------------------------------------------------------


def _fmt(x: float, spec: str) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_table(gates: list[dict[str, Any]]) -> str:
    """Verdict table: one line per comparison of each gate."""
    lines = [f"{'gate':<22} {'hash':<12} {'B vs A':<24} {'n':>2} {'mean Δ':>9} {'± se':>8} "
             f"{'z':>6} {'verdict':<12} rule"]
    for g in gates:
        comps = g["comparisons"] or [{"b": "", "a": "", "n": 0, "mean_delta": math.nan,
                                      "se_delta": math.nan, "z": math.nan, "verdict": g["verdict"]}]
        for i, c in enumerate(comps):
            vs = f"{c['b']} vs {c['a']}" if c["b"] else f"({g['runs_done']} runs)"
            lines.append(f"{g['gate'] if i == 0 else '':<22} {g['gate_hash'][:12] if i == 0 else '':<12} "
                         f"{vs:<24} {c['n']:>2} {_fmt(c['mean_delta'], '+.5f'):>9} "
                         f"{_fmt(c['se_delta'], '.5f'):>8} {_fmt(c['z'], '+.2f'):>6} "
                         f"{c['verdict']:<12} {g['rule'] if i == 0 else ''}")
        if len(comps) > 1:
            lines.append(f"{'':<22} {'':<12} {'gate verdict':<24} {'':>2} {'':>9} {'':>8} {'':>6} "
                         f"{g['verdict']}")
    lines.append("(Δ = B − A of the gate's metric, per seed paired; se: standard error; "
                 "z = mean/se; val_bpb in bits/byte)")
    return "\n".join(lines)


def format_verdict(v: dict[str, Any]) -> str:
    c = v["content"]
    out = [f"gate {v['gate']}  [{v['gate_hash'][:12]}]  verdict: {v['verdict'].upper()}",
           f"question: {v['question']}", f"rule: {v['rule']['text']}  (metric {v['metric']}, "
           f"seeds {c['seeds']}, budget {c['budget']})", "pre-registration:",
           *("  " + line for line in c["preregistration"].strip().splitlines()), "arms:"]
    for name, a in v["arms"].items():
        rec = ", ".join(f"{k} {x:.4g}" for k, x in a["recorded"].items())
        out.append(f"  {name:<10} {v['metric']} {_fmt(a['mean'], '.5f')} ± {_fmt(a['se'], '.5f')} "
                   f"(n={a['n']}; total {a['total_params'] / 1e6:.2f}M, active "
                   f"{a['active_params'] / 1e6:.2f}M params){'; ' + rec if rec else ''}")
    out.append("comparisons:")
    for cmp in v["comparisons"]:
        seeds = "  ".join(f"s{p['seed']}: {p['delta']:+.5f}" for p in cmp["per_seed"])
        out.append(f"  {cmp['b']} vs {cmp['a']}: Δ {_fmt(cmp['mean_delta'], '+.5f')} ± "
                   f"{_fmt(cmp['se_delta'], '.5f')} (z {_fmt(cmp['z'], '+.2f')}, n={cmp['n']}) "
                   f"-> {cmp['verdict']} ({cmp['reason']})")
        out.append(f"    per seed Δ: {seeds}")
    return "\n".join(out)


# ---- CLI ----------------------------------------------------------------------------------


def cli_configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="gate_cmd", metavar="<run|list|show|plot>", required=True)
    r = sub.add_parser("run", help="run (or resume) a gate file and append its verdict")
    r.add_argument("files", nargs="+", metavar="file",
                   help="gate TOML file(s), run one after the other (e.g. gates/*.toml)")
    r.add_argument("--dry-run", action="store_true", help="validate and list the runs; train nothing")
    r.add_argument("--work-dir", default=None, help="teacher checkpoints (default: next to the registry)")
    r.add_argument("--quiet", action="store_true", help="no progress output")
    sub.add_parser("list", help="verdict table of every gate in the registry")
    s = sub.add_parser("show", help="one gate: verdict, pre-registration, per-seed results")
    s.add_argument("name")
    pl = sub.add_parser("plot", help="forest plot of all verdicts and the capacity-scaling plot")
    pl.add_argument("--out", default=None, help="folder for the PNGs (default: next to the registry)")
    pl.add_argument("--capacity-gate", default="capacity_scaling",
                    help="gate whose arms make the capacity-scaling plot")
    for q in (r, sub.choices["list"], s, pl):
        q.add_argument("--registry", default=None,
                       help="registry JSONL (default: results/gates/registry.jsonl)")
        # also accepted after the nested command (`tern gate list --json`)
        q.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print exactly one JSON object on stdout (logs go to stderr)")


def cli_run(args: argparse.Namespace) -> dict[str, Any]:
    registry = Path(args.registry) if args.registry else default_registry()
    if args.gate_cmd == "run":
        specs = [load_gate(f) for f in args.files]  # all validated before anything trains
        if args.dry_run:
            return {"command": "dry-run", "plans": [plan(s, registry) for s in specs]}
        return {"command": "run", "verdicts": [run_gate(s, registry, work_dir=args.work_dir,
                                                        progress=not args.quiet) for s in specs]}
    if args.gate_cmd == "list":
        return {"command": "list", "registry": str(registry), "gates": list_gates(registry)}
    if args.gate_cmd == "show":
        return {"command": "show", **show_gate(registry, args.name)}
    from .plots.gates import plot_registry

    out = Path(args.out) if args.out else registry.parent
    return {"command": "plot", "figures": [str(p) for p in
                                           plot_registry(registry, out, args.capacity_gate)]}


def cli_render(result: dict[str, Any]) -> str:
    cmd = result.pop("command")
    if cmd == "list":
        return format_table(result["gates"]) if result["gates"] else f"no gates in {result['registry']}"
    if cmd == "run":
        return "\n\n".join(format_verdict(v) for v in result["verdicts"])
    if cmd == "show":
        if result["verdict"]:
            return format_verdict(result["verdict"])
        return (f"gate {result['gate']} [{result['gate_hash'][:12]}]: no verdict yet, "
                f"{len(result['runs'])} run(s) finished")
    if cmd == "dry-run":
        lines = [f"gate {p['gate']} [{p['gate_hash'][:12]}]: {p['runs_total']} runs "
                 f"({p['runs_done']} already done), {p['train_tokens_per_run']:,} train tokens per "
                 f"arm run, {p['train_tokens_total']:,} in all arm runs; teacher steps "
                 f"{p['teacher_steps'] or 'none'}" for p in result["plans"]]
        total = sum(p["train_tokens_total"] for p in result["plans"])
        return "\n".join(lines + [f"all arm runs: {total:,} train tokens (teachers not included)"])
    return "\n".join(result["figures"])


__all__ = ["run_gate", "plan", "plan_runs", "list_gates", "show_gate", "verdict_record",
           "arm_summaries", "read_registry", "finished_runs", "latest_verdicts", "gate_runs",
           "default_registry", "smoke_gate_file", "shipped_gates", "gate_headlines", "registry_report", "format_table", "format_verdict", "load_gate", "canonical_json"]
