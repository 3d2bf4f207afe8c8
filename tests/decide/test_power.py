"""Power arithmetic (tern.decide.power) on hand-computed cases, the planner
(tern.decide.planning) on a fake registry, `tern gate plan`, MDEs in verdict records and
tables, and per-parameter budgets in gate files."""

import json
import math

import pytest

from tern import cli
from tern.core.config import param_counts
from tern.decide import power as pw
from tern.decide.harness import SMOKE_GATE, run_gate
from tern.decide.planning import format_plan, measured_rates, pilot_spec, plan_gate, plan_toml
from tern.decide.registry import format_table, format_verdict, list_gates, read_registry
from tern.decide.spec import gate_from_dict, load_gate

Z80 = 0.8416212335729143  # Φ⁻¹(0.8)



def write(tmp_path, rule="B - A <= +0.03 at 2 sigma", extra="", name="toy.toml"):
    """The smoke gate (2 steps x 2 x 32 tokens) as gate "toy" with ``rule`` (+ ``extra`` TOML)."""
    p = tmp_path / name
    p.write_text(SMOKE_GATE.replace('name = "smoke"', 'name = "toy"').replace(
        'rule = "B - A <= +0.05 at 2 sigma"', f'rule = "{rule}"') + extra, encoding="utf-8")
    return p


# ---- the arithmetic, by hand ---------------------------------------------------------


def test_z_and_mde_hand_computed():
    assert pw.z_power(0.5) == pytest.approx(0.0, abs=1e-12)
    assert pw.z_power(0.8) == pytest.approx(Z80, rel=1e-9)
    assert pw.mde(2.0, 0.01, 0.5) == pytest.approx(0.02)  # k se: the interval's half-width
    assert pw.mde(2.0, 0.01, 0.8) == pytest.approx(0.01 * (2 + Z80))  # 0.028416
    assert math.isnan(pw.mde(2.0, math.nan))
    for bad in (0, 1, 1.5, -0.1):
        with pytest.raises(ValueError, match="power"):
            pw.z_power(bad)


def test_sd_delta_paired_and_unpaired():
    a = {0: 1.0, 1: 2.0, 2: 3.0}
    b = {0: 1.1, 1: 2.3, 2: 3.2}  # deltas .1 .3 .2: sd .1
    sd, n, basis = pw.sd_delta(a, b)
    assert (sd, n, basis) == (pytest.approx(0.1), 3, "paired")
    sd, n, basis = pw.sd_delta({0: 1.0, 1: 3.0}, {5: 2.0, 6: 4.0})  # sd sqrt(2) each
    assert (sd, basis) == (pytest.approx(2.0), "unpaired")  # sqrt(2 + 2)
    assert pw.sd_delta({0: 1.0}, {0: 2.0})[2] == "none"


def test_seeds_needed_hand_computed():
    # (k sd / δ)² = (2 * .03 / .03)² = 4 exactly at power .5 (not bumped to 5 by rounding)
    assert pw.seeds_needed(2.0, 0.03, 0.03, 0.5) == 4
    assert pw.seeds_needed(2.0, 0.03, 0.03, 0.8) == 9  # (2.8416)² = 8.07
    # gate 1 as shipped: sd .02931, margin .03 -> (2.8416 * .02931 / .03)² = 7.71 -> 8
    assert pw.seeds_needed(2.0, 0.02931269, 0.03, 0.8) == 8
    assert pw.seeds_needed(2.0, 0.001, 0.03, 0.8) == 3  # never below the gate minimum
    assert pw.seeds_needed(2.0, math.nan, 0.03) is None
    assert pw.seeds_needed(2.0, 0.01, 0.0) is None


def test_token_scaling_hand_computed():
    assert pw.scale_se(0.02, 1000, 4000, 0.5) == pytest.approx(0.01)  # sqrt(1/4)
    assert pw.scale_se(0.02, 1000, 4000, None) == 0.02  # unknown: unchanged
    # k se / δ = 2 * .02 / .01 = 4 at power .5; T' = 1000 * 4^(1/.5) = 16000
    assert pw.tokens_needed(2.0, 0.02, 1000, 0.01, 0.5, 0.5) == 16000
    assert pw.tokens_needed(2.0, 0.02, 1000, 0.01, None) is None
    assert pw.tokens_needed(2.0, 0.02, 1000, 0.01, 0.0) is None


def test_target_effect_order():
    assert pw.target_effect("margin", 0.03, None, None, 0.5) == (0.03, "the rule's margin (pass when B = A)")
    assert pw.target_effect("margin", 0.03, 0.01, None, None)[0] == 0.01  # [plan] effect wins
    assert pw.target_effect("margin", 0.03, 0.01, -0.02, None)[0] == 0.02  # given wins over all
    d, basis = pw.target_effect("superiority", 0.0, None, None, -0.008)
    assert d == 0.008 and "observed" in basis
    assert pw.target_effect("superiority", 0.0, None, None, None)[0] is None


def test_wall_time_hand_computed():
    assert pw.run_seconds(20000, 1000.0, 5.0) == pytest.approx(25.0)
    assert pw.run_seconds(20000, None) is None
    assert pw.total_seconds([10.0, 10.0, 10.0, 10.0], 2) == pytest.approx(20.0)
    # in order on the first free worker: 10 | 10, then 30 after the first 10 -> 40
    assert pw.total_seconds([10.0, 10.0, 30.0], 2) == pytest.approx(40.0)
    assert pw.total_seconds([30.0, 10.0, 10.0], 2) == pytest.approx(30.0)  # 30 | 10 + 10
    assert pw.total_seconds([5.0, 7.0, 1.0], 1) == pytest.approx(13.0)
    assert pw.total_seconds([10.0, None]) is None
    with pytest.raises(ValueError):
        pw.total_seconds([1.0], 0)


def test_plan_table_validation(tmp_path):
    g = load_gate(write(tmp_path, extra='[plan]\npower = 0.9\nmde = { "B-A" = 0.02 }\n'))
    assert g.plan == {"power": 0.9, "mde": {"B-A": 0.02}}
    for bad, msg in (('[plan]\nbogus = 1\n', "unknown keys"), ('[plan]\npower = 2.0\n', "power"),
                     ('[plan]\neffect = -1\n', "effect"), ('[plan]\nmde = { "B-A" = "x" }\n', "mde")):
        with pytest.raises(ValueError, match=msg):
            load_gate(write(tmp_path, extra=bad))


# ---- per-parameter budgets ---------------------------------------------------------------


def test_tokens_per_param_budget(tmp_path):
    text = write(tmp_path).read_text().replace("steps = 2\n", "tokens_per_param = 0.5\n")
    (tmp_path / "tpp.toml").write_text(text)
    g = load_gate(tmp_path / "tpp.toml")
    assert g.per_param
    for arm in g.arms:
        total = param_counts(g.model_config(arm)).total.params
        assert g.arm_steps[arm] == math.ceil(0.5 * total / 64)
        assert g.train_overrides(arm, 1)["steps"] == g.arm_steps[arm]
    with pytest.raises(ValueError, match="exactly one"):
        (tmp_path / "both.toml").write_text(text.replace("tokens_per_param = 0.5\n",
                                                         "tokens_per_param = 0.5\nsteps = 3\n"))
        load_gate(tmp_path / "both.toml")


# ---- the planner on a registry ---------------------------------------------------------


class Runner:
    """val_bpb = 2 + seed/10 (+ .01, .02, .03 for ternary on seeds 0, 1, 2; pilots too)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, model_cfg, train_cfg, out_dir=None, progress=True):
        self.calls += 1
        seed = train_cfg["seed"]
        tern = model_cfg.mlp_format == "ternary2"
        tokens = train_cfg["steps"] * train_cfg["batch_size"] * train_cfg["seq_len"]
        return {"val_bpb": 2 + seed / 10 + (0.01 * (seed % 3 + 1) if tern else 0.0),
                "train_tokens": tokens, "tokens_per_s": 100.0 if tern else 200.0,
                "train_s": tokens / (100.0 if tern else 200.0), "wall_s": tokens / 100.0 + 2.0}


def test_plan_gate_from_registry_runs(tmp_path):
    path = write(tmp_path)
    reg = tmp_path / "reg.jsonl"
    run_gate(path, reg, runner=Runner(), make_train=dict, progress=False)
    r = plan_gate(load_gate(path), read_registry(reg))
    c = r["comparisons"][0]
    assert c["spread"] == "paired" and c["sd_delta"] == pytest.approx(0.01)  # deltas .01 .02 .03
    assert c["se_at_gate"] == pytest.approx(0.01 / math.sqrt(3))
    assert c["mde_at_gate"] == pytest.approx((2 + Z80) * 0.01 / math.sqrt(3))
    assert c["target_effect"] == 0.03 and c["seeds_needed"] == 3  # (2.84 * .01 / .03)² < 3
    # cost: 128 tokens per run; A at 200 tok/s (validation = wall - train = 1.28 + 2 - 0.64 s), B at 100
    a, b = r["arms_cost"]["A"], r["arms_cost"]["B"]
    assert a["tok_per_s"] == 200.0 and a["eval_s"] == pytest.approx(2.64)
    assert a["run_s"] == pytest.approx(0.64 + 2.64) and b["run_s"] == pytest.approx(1.28 + 2.0)
    assert r["cpu_wall_s"] == pytest.approx(3 * (3.28 + 3.28))
    assert r["gpu_wall_s"] is None  # never invented
    g = plan_gate(load_gate(path), read_registry(reg), gpu_tok_per_s=64.0, workers=2, power=0.5)
    assert g["gpu_wall_s"] == pytest.approx(6 * 128 / 64.0 / 2)
    assert g["comparisons"][0]["mde_at_gate"] == pytest.approx(2 * 0.01 / math.sqrt(3))
    text = format_plan(r)
    assert "MDE" in text and "no figure" in text and "tokens: unknown" in text
    assert '"B-A" = ' in plan_toml(r)


def test_plan_spread_from_another_gate_and_speed_rows(tmp_path):
    reg = tmp_path / "reg.jsonl"
    run_gate(write(tmp_path), reg, runner=Runner(), make_train=dict, progress=False)
    p = write(tmp_path, extra='[plan]\nspread_from = "toy"\n', name="v2.toml")
    p.write_text(p.read_text().replace('name = "toy"', 'name = "toy_v2"').replace("steps = 2\n", "steps = 8\n"))
    v2 = load_gate(p)
    rows = read_registry(reg)
    r = plan_gate(v2, rows)
    assert r["spread_basis"].startswith("runs of gate toy") and r["comparisons"][0]["spread_tokens"] == 128
    assert r["comparisons"][0]["sd_delta"] == pytest.approx(0.01)  # carried unchanged (γ unknown)
    r = plan_gate(v2, rows, token_exponent=0.5)
    assert r["comparisons"][0]["sd_delta"] == pytest.approx(0.01)  # the source's spread ...
    assert r["comparisons"][0]["se_at_gate"] == pytest.approx(0.01 / 2 / math.sqrt(3))  # ... at 4x tokens
    speed = [{"record": "train_speed", "model_config": v2.model_config("A").to_dict(),
              "batch_size": 2, "seq_len": 32, "tokens_per_s": 1000.0, "eval_s": 1.0}]
    rates = measured_rates(rows, speed)
    r = plan_gate(v2, rows, speed_rows=speed)
    assert r["arms_cost"]["A"]["source"] == "speed file" and r["arms_cost"]["A"]["tok_per_s"] == 1000.0
    assert r["arms_cost"]["B"]["source"] == "registry" and len(rates) == 2


def test_gpu_speed_rows_price_the_gpu_not_the_cpu(tmp_path):
    reg = tmp_path / "reg.jsonl"
    path = write(tmp_path)
    run_gate(path, reg, runner=Runner(), make_train=dict, progress=False)
    spec, rows = load_gate(path), read_registry(reg)

    def row(arm, rate, ev, conc):
        return {"record": "train_speed", "device": "cuda", "gpu": "G", "model_config": spec.model_config(arm).to_dict(),
                "batch_size": 2, "seq_len": 32, "tokens_per_s": rate, "eval_s": ev, "concurrent": conc}

    # A: alone 64 tok/s; 4 side by side 32 each (summed 128: best) -> 4 at a time at 32 tok/s.
    # B: alone 40; 2 side by side 16 each (summed 32 < 40) -> one at a time at 40 tok/s
    speed = [row("A", 64.0, 1.0, 1), row("A", 32.0, 2.0, 4), row("A", 30.0, 2.0, 4), row("A", 34.0, 2.0, 4),
             row("B", 40.0, 0.5, 1), row("B", 16.0, 1.0, 2), row("B", 16.0, 1.0, 2)]
    r = plan_gate(spec, rows, speed_rows=speed)
    assert r["arms_cost"]["A"]["source"] == "registry" and r["arms_cost"]["A"]["tok_per_s"] == 200.0  # CPU untouched
    g = r["gpu_measured"]
    assert (g["A"]["concurrent"], g["A"]["tok_per_s"], g["A"]["total_tok_per_s"]) == (4, 32.0, 128.0)
    assert (g["B"]["concurrent"], g["B"]["tok_per_s"], g["B"]["n"]) == (1, 40.0, 1)
    # 3 seeds, 128 tokens per run: A 3 x (128 / 32 + 2) / 4 = 4.5 s; B 3 x (128 / 40 + 0.5) / 1 = 11.1 s
    assert r["gpu_wall_s"] == pytest.approx(4.5 + 11.1)
    assert "GPU arm A: 32 tok/s per run x 4 side by side" in format_plan(r)
    # a rate the user gives wins; one arm unmeasured: per-arm lines, no wall time
    assert plan_gate(spec, rows, speed_rows=speed, gpu_tok_per_s=64.0)["gpu_wall_s"] == pytest.approx(6 * 128 / 64.0)
    part = plan_gate(spec, rows, speed_rows=speed[:4])
    assert part["gpu_wall_s"] is None and part["gpu_measured"]["B"] is None
    assert "GPU arm B: not measured" in format_plan(part)


def test_pilot_and_cli_plan(tmp_path, capsys, monkeypatch):
    path = write(tmp_path)
    pilot = pilot_spec(load_gate(path), 3)
    assert pilot.name == "toy.pilot3" and pilot.arm_steps == {"A": 3, "B": 3} and pilot.seeds == (0, 1, 2)
    reg = tmp_path / "reg.jsonl"
    import tern.decide.harness as harness

    runner = Runner()
    real = harness.run_gate
    monkeypatch.setattr(harness, "run_gate", lambda *a, **k: real(*a, runner=runner, make_train=dict, **k))
    assert cli.main(["gate", "plan", str(path), "--registry", str(reg), "--pilot-steps", "3", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    p = obj["plans"][0]
    assert runner.calls == 6 and p["spread_basis"].startswith("runs of gate toy.pilot3")
    assert p["comparisons"][0]["sd_delta"] == pytest.approx(0.01)
    assert cli.main(["gate", "plan", str(path), "--registry", str(reg), "--gpu-tok-per-s", "500"]) == 0
    out = capsys.readouterr().out
    assert "GPU at the given 500 tok/s" in out and "MDE" in out
    assert cli.main(["gate", "plan", str(tmp_path / "nope.toml"), "--registry", str(reg)]) == 2
    bad = tmp_path / "speed.jsonl"  # a GPU speed row without its model: an error naming the row
    bad.write_text('{"record": "train_speed", "device": "cuda", "tokens_per_s": 5}\n')
    capsys.readouterr()
    assert cli.main(["gate", "plan", str(path), "--registry", str(reg), "--speed", str(bad)]) == 2
    assert "row 1: a train_speed row needs model_config" in capsys.readouterr().err


# ---- MDE in verdicts -------------------------------------------------------------------


def test_inconclusive_verdict_prints_its_mde(tmp_path):
    reg = tmp_path / "reg.jsonl"
    v = run_gate(write(tmp_path, rule="B - A <= +0.02 at 2 sigma"), reg, runner=Runner(),
                 make_train=dict, progress=False)
    c = v["comparisons"][0]
    assert v["verdict"] == "inconclusive"
    assert c["mde"] == pytest.approx((2 + Z80) * c["se_delta"]) and c["power"] == 0.8
    assert c["seeds_needed"] == pw.seeds_needed(2.0, c["sd_delta"], 0.02)
    text = format_verdict(v)
    assert f"MDE {c['mde']:.5f}" in text and "is not 'no effect'" in text
    table = format_table(list_gates(reg))
    assert f"{c['mde']:.5f}" in table and "MDE" in table.splitlines()[0]
    # records written before MDEs existed: computed from se and the rule's k
    old = dict(v, comparisons=[{k: x for k, x in c.items() if k not in ("mde", "power")}])
    assert f"MDE {c['mde']:.5f}" in format_verdict(old)


def test_per_param_verdict_checks_each_arm_against_its_plan(tmp_path):
    text = (write(tmp_path).read_text().replace("steps = 2\n", "tokens_per_param = 0.01\n")
            .replace('{ mlp_format = "ternary2" }', '{ mlp_format = "ternary2", mlp_hidden = 128 }'))
    (tmp_path / "tpp.toml").write_text(text)
    spec = load_gate(tmp_path / "tpp.toml")
    assert spec.arm_steps["A"] < spec.arm_steps["B"]  # the larger arm trains more tokens
    v = run_gate(spec, tmp_path / "reg.jsonl", runner=Runner(), make_train=dict, progress=False)
    assert v["comparisons"][0]["n"] == 3 and "different train_tokens" not in v["comparisons"][0]["reason"]

    class Short(Runner):  # a run that stopped early: it did not train its arm's planned tokens
        def __call__(self, model_cfg, train_cfg, out_dir=None, progress=True):
            return {**super().__call__(model_cfg, train_cfg), "train_tokens": 1}

    v = run_gate(gate_from_dict({**spec.content, "name": "tpp2"}), tmp_path / "reg2.jsonl",
                 runner=Short(), make_train=dict, progress=False)
    assert v["verdict"] == "inconclusive" and "different train_tokens" in v["comparisons"][0]["reason"]
