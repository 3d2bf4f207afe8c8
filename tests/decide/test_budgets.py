"""Both budgets side by side (tern.decide.budgets): v1 verdicts next to v2 ones or their
planned MDE."""

import math
from pathlib import Path

from tern.decide.budgets import budget_comparison, format_budget_table, v2_gate_files
from tern.decide.harness import SMOKE_GATE, run_gate
from tern.decide.registry import shipped_registry


def runner(model_cfg, train_cfg, out_dir=None, progress=True):
    seed, steps = train_cfg["seed"], train_cfg["steps"]
    tern = model_cfg.mlp_format == "ternary2"
    return {"val_bpb": 3.0 - steps / 100 + seed / 10 + (0.02 * (seed + 1) / (steps / 2) if tern else 0.0),
            "train_tokens": steps * train_cfg["batch_size"] * train_cfg["seq_len"]}


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_v1_next_to_v2_run_and_not_run(tmp_path):
    reg = tmp_path / "registry.jsonl"
    v1 = write(tmp_path, "smoke.toml", SMOKE_GATE)
    v2_text = (SMOKE_GATE.replace('name = "smoke"', 'name = "smoke_v2"').replace("steps = 2\n", "steps = 16\n")
               + '\n[plan]\nspread_from = "smoke"\nmde = { "B-A" = 0.0123 }\n')
    v2 = write(tmp_path, "smoke_v2.toml", v2_text)
    run_gate(v1, reg, runner=runner, make_train=dict, progress=False)
    rows = budget_comparison(reg, [v2])
    (r,) = rows
    assert (r["v1"], r["gate"], r["b"], r["a"]) == ("smoke", "smoke_v2", "B", "A")
    assert r["tokens_v1"] == 128 and r["tokens_v2"] == 1024
    assert r["n_v1"] == 3 and math.isclose(r["mean_delta_v1"], 0.04)  # deltas .02 .04 .06
    assert r["verdict_v2"] == "not run" and r["mde_v2"] == 0.0123 and r["mde_v2_planned"]
    text = format_budget_table(rows)
    assert "0.0123*" in text and "not run" in text and "128 -> 1,024" in text
    v = run_gate(v2, reg, runner=runner, make_train=dict, progress=False)
    (r,) = budget_comparison(reg, [v2])
    assert not r["mde_v2_planned"] and r["verdict_v2"] == v["verdict"] and r["n_v2"] == 3
    assert r["mde_v2"] == v["comparisons"][0]["mde"]
    assert abs(r["mean_delta_v2"]) < abs(r["mean_delta_v1"])  # the fake effect shrinks with steps
    assert format_budget_table([]).startswith("no v2 gates")


def test_shipped_v2_files_against_the_shipped_registry():
    files = v2_gate_files()
    assert [f.name for f in files] == sorted(p.name for p in (Path(__file__).resolve().parents[2]
                                                              / "gates" / "v2").glob("*.toml"))
    rows = budget_comparison(shipped_registry())
    assert len(rows) == 20 and all(r["verdict_v1"] != "not run" for r in rows)
    assert {r["v1"] for r in rows if r["gate"] == "capacity_per_param_gpu"} == {"capacity_per_param"}
    for r in rows:  # a v2 gate not run yet shows its planned MDE; a run one, its verdict and MDE
        assert r["mde_v2"] > 0 and (r["verdict_v2"] == "not run") == bool(r["mde_v2_planned"]), r
    ran = {r["gate"] for r in rows if r["verdict_v2"] != "not run"}
    assert {"ternary_mlp_v2", "sparse_mlp_v2", "granular_moe_v2"} <= ran
