"""Pre-registered A/B gates over seeds: run the arms, decide mechanically, keep a registry.

A gate (a TOML file, see :mod:`tern.decide.spec`) names two or more arms, a metric
(validation BPB by default), a pass rule, ≥ 3 seeds and a token budget, written down
before anything runs. :func:`run_gate` trains every (arm, seed) pair with the *same*
budget and seed (same tokens in the same order), pairs the arms by seed and decides the
rule from the paired differences Δ = B − A (mean ± standard error, z-score; the exact
definitions of pass / fail / inconclusive are in :mod:`tern.decide.stats`).

Registry (JSONL, default ``results/gates/registry.jsonl``) — only ever appended to:

- ``record: "gate_run"`` — one finished training run: gate name and hash, arm, seed,
  role ("arm" or "teacher"), ``config_hash``, ``metrics`` (what the runner returned:
  val_bpb, train_tokens, tokens_per_s, sparsity, expert_load, ...), the resolved
  ``model_config`` and ``train_config``, ``counts`` (tern.core.config.param_counts summary),
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
out_dir=, progress=)`` (default :func:`tern.train.distill.run_distill`). Teachers are trained
first by ``runner`` with an ``out_dir`` under ``work_dir`` and must return the path of the
weights they wrote as ``checkpoint``; a teacher whose checkpoint has disappeared is
retrained while students still need it.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tern.core.config import ModelConfig
from tern.core.records import run_metadata
from tern.decide.power import DEFAULT_POWER, mde, seeds_needed, target_effect
from tern.decide.registry import (
    REGISTRY_SCHEMA,
    append_row,
    config_hash,
    default_registry,
    finished_runs,
    read_registry,
)
from tern.decide.spec import GateSpec, load_gate
from tern.decide.stats import combine, compare
from tern.decide.workers import RunJob, run_jobs

Runner = Callable[..., dict]


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
    from tern.train.config import TrainConfig

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
             progress: bool = True, workers: int = 1, scheduler: Any = None) -> dict[str, Any]:
    """Run (or resume) a gate and append its verdict to the registry; returns the verdict
    record. Finished runs of the same gate hash and config are read back, not retrained.
    ``workers`` / ``scheduler``: where the independent runs execute (tern.decide.workers:
    this process, a local process pool, or a Dask cluster); teachers run before students."""
    if not isinstance(spec, GateSpec):
        spec = load_gate(spec)
    registry = (Path(registry) if registry is not None else default_registry()).resolve()
    work_dir = (Path(work_dir) if work_dir is not None else registry.parent / "work").resolve()
    if make_train is None:
        make_train = default_make_train()
    runs = plan_runs(spec, make_train)
    if runner is None:
        from tern.train.loop import run_training as runner
    if distill_runner is None and any(r.distill for r in runs):
        from tern.train.distill import run_distill as distill_runner

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
    where = (f"on Dask ({scheduler if isinstance(scheduler, str) else 'client'})" if scheduler is not None
             else f"over {workers} local workers" if workers > 1 else "in this process")
    _log(f"gate {spec.name} [{spec.short_hash}]: {len(runs)} runs, {len(runs) - len(todo)} "
         f"already in {registry}, {len(todo)} to train {where}", progress)
    serial = workers == 1 and scheduler is None

    def job(run: PlannedRun) -> RunJob:
        ck, tcfg, out = None, None, None
        if run.distill:
            t = teachers[run.distill["teacher"]]
            ckpt = teacher_checkpoint(t)
            if ckpt is None:
                raise ValueError(f"teacher {t.arm} has no checkpoint file; the runner must return "
                                 "'checkpoint' (the path it wrote under out_dir)")
            ck, tcfg = str(ckpt), t.model_cfg
        elif run.role == "teacher":
            out = str(_run_dir(work_dir, spec, run))
        return RunJob(spec.name, spec.hash, spec.metric, run, str(registry),
                      distill_runner if run.distill else runner, out, ck, tcfg,
                      progress=progress and serial)

    n_done = [0]

    def finished(row: dict) -> None:
        done[(row["arm"], row["seed"], row["config_hash"])] = row
        n_done[0] += 1
        _log(f"gate {spec.name}: run {n_done[0]}/{len(todo)} done: {row['arm']} seed {row['seed']} "
             f"{spec.metric} {row['metrics'][spec.metric]:.5f} ({row['wall_s']:.0f} s)", progress)

    for role in ("teacher", "arm"):  # students need their teachers' checkpoints
        run_jobs([job(r) for r in todo if r.role == role], workers=workers, scheduler=scheduler,
                 on_row=finished)
    current = [done[(r.arm, r.seed, r.config_hash)] for r in runs]
    verdict = verdict_record(spec, current)
    verdict.update(runs_reused=len([r for r in runs if r not in todo]), runs_trained=n_done[0],
                   registry=str(registry))
    append_row(registry, verdict)
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
    """Decide every comparison of the gate from its run rows (see tern.decide.stats)."""
    by_arm: dict[str, dict[int, float]] = {}
    tokens: dict[str, dict[int, Any]] = {}
    for r in run_rows:
        if r["role"] == "arm":
            by_arm.setdefault(r["arm"], {})[r["seed"]] = float(r["metrics"][spec.metric])
            t = r["metrics"].get("train_tokens")
            # a per-parameter budget: arms differ by design; each run must match its own plan
            if spec.per_param:
                t = "as planned" if t == spec.arm_tokens(r["arm"]) else f"{r['arm']}: {t}"
            tokens.setdefault(r["arm"], {})[r["seed"]] = t
    p = spec.plan.get("power", DEFAULT_POWER)
    comps = []
    for b, a in spec.comparisons:
        c = compare(spec.rule, by_arm.get(a, {}), by_arm.get(b, {}), tokens.get(a, {}), tokens.get(b, {}))
        sd = c["sd_delta"]
        target, basis = target_effect(spec.rule.kind, spec.rule.margin, spec.plan.get("effect"), None,
                                      c["mean_delta"])
        comps.append({"b": b, "a": a, **c, "mde": mde(spec.rule.k_sigma, c["se_delta"], p),
                      "power": p, "target_effect": target, "target_basis": basis,
                      "seeds_needed": seeds_needed(spec.rule.k_sigma, sd, target, p) if target else None})
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


def plan(spec: GateSpec, registry: str | Path, make_train: Callable[[dict], Any] | None = None) -> dict:
    """What `run` would do: the runs, which are already in the registry, the tokens."""
    if make_train is None:
        make_train = default_make_train()
    runs = plan_runs(spec, make_train)
    done = finished_runs(read_registry(registry), spec.hash)
    rr = [{"arm": r.arm, "seed": r.seed, "done": (r.arm, r.seed, r.config_hash) in done} for r in runs]
    return {"gate": spec.name, "gate_hash": spec.hash, "runs": rr, "runs_total": len(rr),
            "runs_done": sum(r["done"] for r in rr), "train_tokens_per_run": spec.tokens_per_run,
            "train_tokens_total": sum(spec.arm_tokens(a) for a in spec.arms) * len(spec.seeds),
            "teacher_steps": {t: s.train["steps"] for t, s in spec.teachers.items()}}


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


# ---- CLI ----------------------------------------------------------------------------------


