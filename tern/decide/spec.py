"""Gate files: the pre-registered, declarative description of one A/B (or A/B/C...) test.

A gate file is TOML (``gates/*.toml``)::

    schema = 1
    name = "ternary_mlp"                 # unique name in the registry
    question = "What does ternary cost against fp32 weights in the MLP?"
    preregistration = '''Written before any run: ...'''
    metric = "val_bpb"                   # the decided metric (default val_bpb)
    record = ["sparsity", "tokens_per_s", "expert_load"]   # kept alongside (optional)
    seeds = [0, 1, 2]                    # >= 3 distinct integers; arms are paired by seed
    rule = "B - A <= +0.03 at 2 sigma"   # the pass rule (see tern.decide.stats)
    baseline = "A"                       # default "A"
    compare = [["B", "A"]]               # optional [B, A] pairs; default: each arm vs baseline

    [budget]                             # identical for every arm and seed
    steps = 300                          # or tokens = N (steps = ceil(N / (batch_size * seq_len)))
    batch_size = 16
    seq_len = 128

    [common]                             # optional, applied to every arm (and teacher)
    preset = "sandbox"
    model = { d_model = 128 }            # ModelConfig overrides
    train = { lr = 3e-3 }                # TrainConfig overrides

    [arms.A]
    model = { mlp_format = "fp32" }
    [arms.B]
    model = { mlp_format = "ternary2" }

``[budget] tokens_per_param = x`` (instead of steps / tokens) gives every arm its own
budget, ceil(x * total_params(arm) / (batch_size * seq_len)) steps (a capacity study: the
same tokens per parameter, not the same tokens; the paired check then requires each run
to have trained its arm's planned tokens). An optional ``[plan]`` table holds the
planner's figures written before the runs (power, effect, spread_from, mde, seeds_needed,
note; see :mod:`tern.decide.power`).

Distillation gates add ``[teachers.NAME]`` (preset/model/train/seed: a model trained once by
the kit, with its own budget in ``train``) and an arm ``distill = {teacher = "NAME",
method = "logit" | "byte", alpha = 0.5, temperature = 1.0}`` (see :mod:`tern.train.distill`).

Validation is strict: unknown keys, fewer than 3 seeds, a rule that does not parse, a
budget in minutes (arms would see different tokens), an arm overriding the budget or the
seed, or two arms with identical configs are a ``ValueError`` naming the field.

The gate's *content* (the parsed TOML, canonical JSON: sorted keys, no whitespace, so
comments and formatting do not count) is hashed with SHA-256 into every registry record;
an edited gate gets a new hash and cannot reuse runs of the old one.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tern.core.config import ModelConfig, get_preset, param_counts
from tern.decide.power import validate_plan

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

GATE_SCHEMA = 1
TOP_KEYS = {"schema", "name", "question", "preregistration", "metric", "record", "seeds", "rule",
            "baseline", "compare", "budget", "common", "arms", "teachers", "plan"}
REQUIRED_TOP = ("name", "question", "preregistration", "seeds", "rule", "budget", "arms")
BUDGET_KEYS = {"steps", "tokens", "tokens_per_param", "batch_size", "seq_len"}
ARM_KEYS = {"preset", "model", "train", "distill", "label"}
COMMON_KEYS = {"preset", "model", "train"}
TEACHER_KEYS = {"preset", "model", "train", "seed"}
DISTILL_KEYS = {"teacher", "method", "alpha", "temperature"}
DISTILL_METHODS = ("logit", "byte")
# Train keys an arm may not set: the budget and the seed are the gate's, equal for all arms.
RESERVED_TRAIN_KEYS = {"steps", "tokens", "minutes", "batch_size", "seq_len", "seed"}
MIN_SEEDS = 3
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")

_NUM = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_SIGMA = r"(?:sigma|σ)"
_MARGIN_RE = re.compile(rf"^B\s*-\s*A\s*(<=|>=)\s*({_NUM})(?:\s+at\s+({_NUM})\s*{_SIGMA})?$")
_SUPER_RE = re.compile(rf"^B\s*(<|>)\s*A\s+at\s+({_NUM})\s*{_SIGMA}$")
DEFAULT_K_SIGMA = 2.0


@dataclass(frozen=True)
class Rule:
    """A parsed pass rule on the paired difference Δ = B − A of the gate's metric.

    kind "margin" (non-inferiority): ``B - A <= x`` (or ``>= x``) at k sigma;
    kind "superiority": ``B < A`` (or ``B > A``) at k sigma.
    """

    text: str
    kind: str  # "margin" | "superiority"
    op: str  # "<=", ">=", "<", ">"
    margin: float  # x for "margin" rules; 0.0 for superiority
    k_sigma: float

    @property
    def threshold(self) -> float:
        """The value of Δ the rule compares against (plotted as the threshold line)."""
        return self.margin

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "kind": self.kind, "op": self.op, "margin": self.margin,
                "k_sigma": self.k_sigma}


def parse_rule(text: Any) -> Rule:
    """Parse ``"B - A <= +0.01 [at 2 sigma]"``, ``"B - A >= -0.01 [at k sigma]"``,
    ``"B < A at 2 sigma"`` or ``"B > A at 2 sigma"`` (k defaults to 2 for margin rules)."""
    if not isinstance(text, str):
        raise ValueError(f"gate field 'rule' must be a string, got {text!r}")
    t = " ".join(text.split())
    m = _MARGIN_RE.match(t)
    if m:
        k = float(m.group(3)) if m.group(3) else DEFAULT_K_SIGMA
        rule = Rule(t, "margin", m.group(1), float(m.group(2)), k)
    else:
        m = _SUPER_RE.match(t)
        if not m:
            raise ValueError(
                f"gate field 'rule' {text!r} does not parse; use 'B - A <= +x [at k sigma]', "
                "'B - A >= -x [at k sigma]', 'B < A at k sigma' or 'B > A at k sigma'")
        rule = Rule(t, "superiority", m.group(1), 0.0, float(m.group(2)))
    if not (math.isfinite(rule.margin) and math.isfinite(rule.k_sigma) and rule.k_sigma > 0):
        raise ValueError(f"gate field 'rule' {text!r}: margin must be finite and k sigma > 0")
    return rule


@dataclass(frozen=True)
class ArmSpec:
    name: str
    preset: str
    model: dict[str, Any]  # ModelConfig overrides (common merged in)
    train: dict[str, Any]  # TrainConfig overrides (common merged in, no budget / seed)
    distill: dict[str, Any] | None = None
    label: str = ""


@dataclass(frozen=True)
class TeacherSpec:
    name: str
    preset: str
    model: dict[str, Any]
    train: dict[str, Any]  # the teacher's own budget lives here
    seed: int


@dataclass(frozen=True)
class GateSpec:
    name: str
    question: str
    preregistration: str
    metric: str
    record: tuple[str, ...]
    seeds: tuple[int, ...]
    rule: Rule
    budget: dict[str, Any]  # steps (or tokens_per_param), batch_size, seq_len (tokens -> steps)
    arms: dict[str, ArmSpec]  # file order
    baseline: str
    comparisons: tuple[tuple[str, str], ...]  # (B, A) pairs
    teachers: dict[str, TeacherSpec] = field(default_factory=dict)
    content: dict[str, Any] = field(default_factory=dict, repr=False)  # the parsed file
    hash: str = ""  # sha256 of the canonical content
    path: str = ""
    arm_steps: dict[str, int] = field(default_factory=dict)  # every arm's steps
    plan: dict[str, Any] = field(default_factory=dict)  # the pre-registered [plan] table

    @property
    def short_hash(self) -> str:
        return self.hash[:12]

    @property
    def per_param(self) -> bool:
        """Whether the budget is tokens per parameter (arms train different tokens)."""
        return "tokens_per_param" in self.budget

    @property
    def tokens_per_run(self) -> int:
        """Training tokens of one arm run (the largest arm's with a per-parameter budget)."""
        return max(self.arm_tokens(a) for a in self.arms)

    def arm_tokens(self, arm: str) -> int:
        b = self.budget
        return self.arm_steps[arm] * b["batch_size"] * b["seq_len"]

    def model_config(self, arm: str) -> ModelConfig:
        a = self.arms[arm]
        return _build_model(a.preset, a.model, f"arm {arm!r}")

    def teacher_model_config(self, teacher: str) -> ModelConfig:
        t = self.teachers[teacher]
        return _build_model(t.preset, t.model, f"teacher {teacher!r}")

    def train_overrides(self, arm: str, seed: int) -> dict[str, Any]:
        """The full TrainConfig keyword set of one (arm, seed) run: arm overrides, then
        the gate's budget and the seed (equal for every arm: same tokens, same order)."""
        b = self.budget
        return {**self.arms[arm].train, "steps": self.arm_steps[arm], "batch_size": b["batch_size"],
                "seq_len": b["seq_len"], "seed": seed}

    def teacher_train_overrides(self, teacher: str) -> dict[str, Any]:
        t = self.teachers[teacher]
        return {**t.train, "seed": t.seed}


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_hash(content: dict[str, Any]) -> str:
    """SHA-256 of a gate's canonical content (formatting and comments do not count)."""
    return hashlib.sha256(canonical_json(content).encode("utf-8")).hexdigest()


def _build_model(preset: str, overrides: dict[str, Any], where: str) -> ModelConfig:
    try:
        return get_preset(preset).replace(**overrides)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where} model: {e}") from None


def _check_keys(d: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ValueError(f"gate field {where!r} must be a table, got {type(d).__name__}")
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ValueError(f"gate field {where!r} has unknown keys {unknown}; allowed: {sorted(allowed)}")
    return d


def _table(d: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    v = d.get(key, {})
    if not isinstance(v, dict):
        raise ValueError(f"gate field '{where}.{key}' must be a table, got {type(v).__name__}")
    return dict(v)


def _pos_int(v: Any, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"gate field {where!r} must be an integer >= 1, got {v!r}")
    return v


def _str(d: dict[str, Any], key: str) -> str:
    v = d[key]
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"gate field {key!r} must be a non-empty string, got {v!r}")
    return v


def _budget(b: Any) -> dict[str, Any]:
    b = _check_keys(b, BUDGET_KEYS | {"minutes"}, "budget")
    if "minutes" in b:
        raise ValueError("gate field 'budget.minutes' is not allowed: a time budget gives arms of "
                         "different speed different tokens; use budget.steps or budget.tokens")
    for k in ("batch_size", "seq_len"):
        if k not in b:
            raise ValueError(f"gate field 'budget.{k}' is required")
        _pos_int(b[k], f"budget.{k}")
    if sum(k in b for k in ("steps", "tokens", "tokens_per_param")) != 1:
        raise ValueError("gate field 'budget' needs exactly one of 'steps', 'tokens' or "
                         "'tokens_per_param'")
    per_step = b["batch_size"] * b["seq_len"]
    if "tokens_per_param" in b:
        x = b["tokens_per_param"]
        if not isinstance(x, (int, float)) or isinstance(x, bool) or not 0 < x < math.inf:
            raise ValueError(f"gate field 'budget.tokens_per_param' must be a number > 0, got {x!r}")
        return {"tokens_per_param": float(x), "batch_size": b["batch_size"], "seq_len": b["seq_len"]}
    if "steps" in b:
        steps = _pos_int(b["steps"], "budget.steps")
    else:
        steps = -(-_pos_int(b["tokens"], "budget.tokens") // per_step)
    return {"steps": steps, "batch_size": b["batch_size"], "seq_len": b["seq_len"]}


def _train_overrides(t: dict[str, Any], where: str) -> dict[str, Any]:
    bad = sorted(set(t) & RESERVED_TRAIN_KEYS)
    if bad:
        raise ValueError(f"gate field '{where}.train' may not set {bad}: the budget and the seed "
                         "belong to the gate (budget, seeds) and are equal for every arm")
    return t


def gate_from_dict(content: dict[str, Any], path: str = "") -> GateSpec:
    """Validate a parsed gate file and resolve it (see the module docstring)."""
    c = _check_keys(content, TOP_KEYS, "<top level>")
    for k in REQUIRED_TOP:
        if k not in c:
            raise ValueError(f"gate field {k!r} is required")
    if c.get("schema", GATE_SCHEMA) != GATE_SCHEMA:
        raise ValueError(f"gate field 'schema' must be {GATE_SCHEMA}, got {c['schema']!r}")
    name = _str(c, "name")
    if not _NAME_RE.match(name):
        raise ValueError(f"gate field 'name' {name!r} may only use letters, digits, '_', '.', '-'")
    question, prereg = _str(c, "question"), _str(c, "preregistration")
    metric = c.get("metric", "val_bpb")
    if not isinstance(metric, str) or not metric:
        raise ValueError(f"gate field 'metric' must be a metric name, got {metric!r}")
    record = c.get("record", [])
    if not isinstance(record, list) or not all(isinstance(r, str) for r in record):
        raise ValueError(f"gate field 'record' must be a list of metric names, got {record!r}")
    seeds = c["seeds"]
    if (not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool)
                                               and s >= 0 for s in seeds)):
        raise ValueError(f"gate field 'seeds' must be a list of integers >= 0, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"gate field 'seeds' has repeated seeds: {seeds}")
    if len(seeds) < MIN_SEEDS:
        raise ValueError(f"gate field 'seeds' needs at least {MIN_SEEDS} seeds, got {len(seeds)}")
    rule = parse_rule(c["rule"])
    budget = _budget(c["budget"])

    common = _check_keys(c.get("common", {}), COMMON_KEYS, "common")
    c_model = _table(common, "model", "common")
    c_train = _train_overrides(_table(common, "train", "common"), "common")

    teachers: dict[str, TeacherSpec] = {}
    teachers_in = c.get("teachers", {})
    if not isinstance(teachers_in, dict):
        raise ValueError(f"gate field 'teachers' must be a table, got {type(teachers_in).__name__}")
    for tname, t in teachers_in.items():
        t = _check_keys(t, TEACHER_KEYS, f"teachers.{tname}")
        preset = t.get("preset", common.get("preset"))
        if not isinstance(preset, str):
            raise ValueError(f"gate field 'teachers.{tname}.preset' is required (or common.preset)")
        ttrain = {**c_train, **_table(t, "train", f"teachers.{tname}")}
        if "seed" in ttrain:
            raise ValueError(f"gate field 'teachers.{tname}.train' may not set 'seed'; "
                             f"use teachers.{tname}.seed")
        if "minutes" in ttrain:
            raise ValueError(f"gate field 'teachers.{tname}.train.minutes' is not allowed: "
                             "give the teacher steps so that its training is reproducible")
        if "steps" not in ttrain:
            raise ValueError(f"gate field 'teachers.{tname}.train.steps' is required (the teacher's budget)")
        seed = t.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"gate field 'teachers.{tname}.seed' must be an integer >= 0, got {seed!r}")
        tmodel = {**c_model, **_table(t, "model", f"teachers.{tname}")}
        teachers[tname] = TeacherSpec(tname, preset, tmodel, ttrain, seed)
        _build_model(preset, tmodel, f"teacher {tname!r}")

    arms_in = c["arms"]
    if not isinstance(arms_in, dict) or len(arms_in) < 2:
        raise ValueError("gate field 'arms' must be a table of at least two arms")
    arms: dict[str, ArmSpec] = {}
    for aname, a in arms_in.items():
        if not _NAME_RE.match(aname):
            raise ValueError(f"gate field 'arms.{aname}': arm names may only use letters, digits, _ . -")
        a = _check_keys(a, ARM_KEYS, f"arms.{aname}")
        preset = a.get("preset", common.get("preset"))
        if not isinstance(preset, str):
            raise ValueError(f"gate field 'arms.{aname}.preset' is required (or common.preset)")
        model = {**c_model, **_table(a, "model", f"arms.{aname}")}
        train = {**c_train, **_train_overrides(_table(a, "train", f"arms.{aname}"), f"arms.{aname}")}
        distill = a.get("distill")
        if distill is not None:
            distill = dict(_check_keys(distill, DISTILL_KEYS, f"arms.{aname}.distill"))
            if distill.get("teacher") not in teachers:
                raise ValueError(f"gate field 'arms.{aname}.distill.teacher' must name one of "
                                 f"[teachers]: {sorted(teachers)}, got {distill.get('teacher')!r}")
            if distill.setdefault("method", "logit") not in DISTILL_METHODS:
                raise ValueError(f"gate field 'arms.{aname}.distill.method' must be one of "
                                 f"{DISTILL_METHODS}, got {distill['method']!r}")
            alpha = distill.setdefault("alpha", 0.5)
            if not isinstance(alpha, (int, float)) or not 0 < alpha <= 1:
                raise ValueError(f"gate field 'arms.{aname}.distill.alpha' must be in (0, 1], got {alpha!r}")
            temp = distill.setdefault("temperature", 1.0)
            if not isinstance(temp, (int, float)) or not temp > 0:
                raise ValueError(f"gate field 'arms.{aname}.distill.temperature' must be > 0, got {temp!r}")
        label = a.get("label", "")
        if not isinstance(label, str):
            raise ValueError(f"gate field 'arms.{aname}.label' must be a string")
        arms[aname] = ArmSpec(aname, preset, model, train, distill, label)
        _build_model(preset, model, f"arm {aname!r}")

    baseline = c.get("baseline", "A")
    if baseline not in arms:
        raise ValueError(f"gate field 'baseline' must name an arm ({sorted(arms)}), got {baseline!r}")
    if "compare" in c:
        comp = c["compare"]
        if (not isinstance(comp, list) or not comp
                or not all(isinstance(p, list) and len(p) == 2 for p in comp)):
            raise ValueError(f"gate field 'compare' must be a list of [B, A] arm pairs, got {comp!r}")
        for b, a in comp:
            if b not in arms or a not in arms or a == b:
                raise ValueError(f"gate field 'compare' pair {[b, a]} must name two different arms "
                                 f"of {sorted(arms)}")
        comparisons = tuple((b, a) for b, a in comp)
    else:
        comparisons = tuple((b, baseline) for b in arms if b != baseline)

    per_step = budget["batch_size"] * budget["seq_len"]
    arm_steps = {a: budget["steps"] if "steps" in budget else max(1, math.ceil(
        budget["tokens_per_param"] * param_counts(_build_model(arms[a].preset, arms[a].model, a)).total.params
        / per_step)) for a in arms}
    plan = validate_plan(c.get("plan", {}))
    spec = GateSpec(name, question, prereg, metric, tuple(record), tuple(seeds), rule, budget,
                    arms, baseline, comparisons, teachers, content, content_hash(content), path,
                    arm_steps, plan)
    _check_arms_differ(spec)
    return spec


def _check_arms_differ(spec: GateSpec) -> None:
    seen: dict[str, str] = {}
    for name, a in spec.arms.items():
        key = canonical_json([spec.model_config(name).replace(name="x").to_dict(), a.train, a.distill])
        if key in seen:
            raise ValueError(f"gate field 'arms': arms {seen[key]!r} and {name!r} are identical")
        seen[key] = name


def load_gate(path: str | Path) -> GateSpec:
    """Read and validate a gate TOML file (errors name the file and the field)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no gate file at {p}")
    try:
        content = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{p}: not valid TOML ({e})") from None
    try:
        return gate_from_dict(content, str(p))
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None
