"""The v2 gate files (issue 18): pre-registered re-runs of the five shipped gates at 8x the
tokens per run with their planned MDE, and the capacity study at a per-parameter budget."""

import math
from pathlib import Path

import pytest

from tern.core.config import param_counts
from tern.core.records import read_jsonl
from tern.decide.planning import measured_rates, plan_gate, speed_key
from tern.decide.power import comparison_key
from tern.decide.registry import read_registry, shipped_registry
from tern.decide.spec import load_gate

GATES = Path(__file__).resolve().parents[2] / "gates"
V2 = sorted((GATES / "v2").glob("*.toml"))
PAIRS = [(GATES / f.name, f) for f in V2 if (GATES / f.name).exists()]


GPU_STUDY = GATES / "v2" / "7_capacity_per_param_gpu.toml"


def test_five_reruns_and_the_capacity_study_on_cpu_and_gpu():
    assert len(PAIRS) == 5 and len(V2) == 7 and GPU_STUDY in V2


@pytest.mark.parametrize("v1, v2", PAIRS, ids=[p[1].stem for p in PAIRS])
def test_v2_is_v1_at_8x_tokens_with_a_planned_mde(v1, v2):
    a, b = load_gate(v1), load_gate(v2)
    assert b.name == f"{a.name}_v2" and b.plan["spread_from"] == a.name
    assert b.tokens_per_run == 8 * a.tokens_per_run  # 1,966,080 tokens per run
    assert (b.rule, b.comparisons, list(b.arms)) == (a.rule, a.comparisons, list(a.arms))
    for arm in a.arms:  # the same models and train settings but the schedule's warm-up
        assert b.model_config(arm) == a.model_config(arm)
        ta, tb = a.train_overrides(arm, 0), b.train_overrides(arm, 0)
        assert tb["warmup_steps"] == 8 * ta["warmup_steps"] and tb["steps"] == 8 * ta["steps"]
    keys = {comparison_key(x, y) for x, y in b.comparisons}
    assert set(b.plan["mde"]) == keys == set(b.plan["seeds_needed"])
    # the planned MDE is what the planner computed from the shipped registry before the
    # gate's own runs (once they are in, it plans from their spread instead)
    before = [x for x in read_registry(shipped_registry()) if x.get("gate") != b.name]
    r = plan_gate(b, before)
    for c in r["comparisons"]:
        assert b.plan["mde"][comparison_key(c["b"], c["a"])] == pytest.approx(c["mde_at_gate"], abs=1e-4)
        assert b.plan["seeds_needed"][comparison_key(c["b"], c["a"])] == c["seeds_needed"]


def test_capacity_study_budget_scales_with_total_params():
    g = load_gate(GATES / "v2" / "6_capacity_per_param.toml")
    assert g.per_param and g.budget["tokens_per_param"] == 1.5
    for arm in g.arms:
        total = param_counts(g.model_config(arm)).total.params
        assert g.arm_tokens(arm) == math.ceil(1.5 * total / 1024) * 1024
        assert 1.5 <= g.arm_tokens(arm) / total < 1.5 + 1024 / total
    assert g.arm_tokens("e64") > 3 * g.arm_tokens("e8")


def test_gpu_capacity_study_is_the_cpu_study_at_a_larger_budget():
    cpu, gpu = load_gate(GATES / "v2" / "6_capacity_per_param.toml"), load_gate(GPU_STUDY)
    assert gpu.name == "capacity_per_param_gpu" and gpu.per_param
    assert (gpu.rule, gpu.comparisons, list(gpu.arms), gpu.metric) == (cpu.rule, cpu.comparisons,
                                                                        list(cpu.arms), cpu.metric)
    for arm in cpu.arms:  # the same models and train settings; only the budget and batch differ
        assert gpu.model_config(arm) == cpu.model_config(arm)
        total = param_counts(gpu.model_config(arm)).total.params
        assert gpu.arm_tokens(arm) == math.ceil(4 * total / 8192) * 8192
        ta, tb = cpu.train_overrides(arm, 0), gpu.train_overrides(arm, 0)
        assert {k: v for k, v in tb.items() if k not in ("steps", "batch_size")} == \
            {k: v for k, v in ta.items() if k not in ("steps", "batch_size")}
    assert tuple(gpu.seeds) == (0, 1, 2, 3, 4) and gpu.plan["spread_from"] == "capacity_per_param"
    # its planned MDE and seeds: the planner's figures from the registry before its runs
    before = [x for x in read_registry(shipped_registry()) if x.get("gate") != gpu.name]
    for c in plan_gate(gpu, before)["comparisons"]:
        key = comparison_key(c["b"], c["a"])
        assert gpu.plan["mde"][key] == pytest.approx(c["mde_at_gate"], abs=1e-4)
        assert gpu.plan["seeds_needed"][key] == c["seeds_needed"]


def test_speed_file_covers_every_v2_cpu_arm():
    rates = measured_rates([], read_jsonl(GATES / "v2" / "train_speed.jsonl"))
    for f in (f for f in V2 if f != GPU_STUDY):  # no CPU rate at the GPU study's batch
        g = load_gate(f)
        b = g.budget
        for arm, spec in g.arms.items():
            assert speed_key(g.model_config(arm).to_dict(), b["batch_size"], b["seq_len"], spec.distill) in rates
