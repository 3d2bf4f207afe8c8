"""Quality against decode speed (tern.measure.frontier): the arms' definitions, the rows,
resuming, the Pareto front, the figure and `tern bench frontier`'s errors."""

import json

import pytest
from conftest import assert_one_line_error

from tern.cli import main
from tern.core.config import SANDBOX, param_counts, tensor_specs
from tern.core.records import append_jsonl, read_jsonl
from tern.measure import frontier as fr
from tern.measure.plots_frontier import plot_frontier

ARMS = {a.name: a for a in fr.frontier_arms(SANDBOX)}


def _ffn_active_hidden(cfg):
    return cfg.mlp_hidden if not cfg.moe_layers else cfg.top_k * cfg.expert_hidden + cfg.n_shared * cfg.shared_hidden


@pytest.mark.parametrize("base", [SANDBOX, fr.SMOKE_BASE])
def test_arms_have_equal_active_params_within_the_tolerance(base):
    arms = fr.frontier_arms(base)
    assert [a.name for a in arms] == list(fr.ARM_NAMES)
    ref = param_counts(base).active.params
    for a in arms:
        assert a.counts["active_params"] == param_counts(a.config).active.params
        assert abs(a.counts["active_params"] / ref - 1) <= fr.ACTIVE_TOLERANCE, a.name
        assert _ffn_active_hidden(a.config) == _ffn_active_hidden(base)  # FFN hidden units per token: equal


def test_each_arm_has_its_distinguishing_property():
    s, d32, dt, co, fi = (ARMS[n].config for n in fr.ARM_NAMES)
    assert s.to_dict() == {**SANDBOX.to_dict(), "name": "sandbox-sandbox"}
    for dense in (d32, dt):
        assert not dense.moe_layers and dense.n_experts == 0 and dense.mlp_hidden == 4 * 64 + 192
    assert (d32.mixer_format, d32.mlp_format) == ("fp32", "fp32")
    assert (dt.mixer_format, dt.mlp_format) == ("ternary2", "ternary2")
    assert ARMS["dense_fp32"].counts["active_bytes"] > 6 * ARMS["dense_ternary"].counts["active_bytes"]
    # coarse: fewer, wider experts; fine: more, narrower; routed hidden per token and in all equal
    assert co.n_experts < s.n_experts < fi.n_experts and co.expert_hidden > s.expert_hidden > fi.expert_hidden
    for moe in (co, fi):
        assert moe.top_k * moe.expert_hidden == s.top_k * s.expert_hidden
        assert moe.n_experts * moe.expert_hidden == s.n_experts * s.expert_hidden
        assert (moe.n_shared, moe.shared_hidden) == (s.n_shared, s.shared_hidden)
    # the fp32 arm is timed on a ternary twin of exactly its shapes, with the fp32 kernel
    fp32 = ARMS["dense_fp32"]
    assert fp32.kernel == "fp32" and fp32.twin.mlp_format == "ternary2"
    assert [(t.name, t.shape) for t in tensor_specs(fp32.twin)] == [(t.name, t.shape) for t in tensor_specs(d32)]
    assert all(a.twin is None and a.kernel == "ternary" for a in ARMS.values() if a.name != "dense_fp32")


def test_a_base_the_rules_cannot_divide_is_refused():
    with pytest.raises(ValueError, match="granularity 4 must divide"):
        fr.frontier_arms(SANDBOX.replace(top_k=2))
    with pytest.raises(ValueError, match="MoE in every layer"):
        fr.frontier_arms(SANDBOX.replace(moe_layers=(0,), mlp_hidden=64))


def _row(arm, threads, bpb, tps, seed=0, budget=180.0):
    a = ARMS[arm]
    return {"kind": "frontier_point", "key": fr.arm_key(a, seed, budget), "arm": arm, "label": a.label,
            "seed": seed, "threads": threads, "val_bpb": bpb, "budget_s": budget, "cpu": "test cpu",
            "tok_per_s": {"median": tps, "spread_rel": 0.02}, "train": {"train_tokens": 1000},
            **a.counts}


def test_pareto_front_and_seed_means():
    rows = [_row("sandbox", 1, 2.0, 5000), _row("dense_ternary", 1, 2.1, 6000),
            _row("coarse_moe", 1, 2.2, 5500),  # slower and worse than dense_ternary: dominated
            _row("fine_moe", 1, 1.9, 3000), _row("fine_moe", 1, 1.7, 3400, seed=1),
            _row("dense_fp32", 2, 2.3, 900)]
    pts = {(p["arm"], p["threads"]): p for p in fr.frontier_points(rows)}
    assert {k for k, p in pts.items() if p["pareto"]} == {("sandbox", 1), ("dense_ternary", 1), ("fine_moe", 1),
                                                          ("dense_fp32", 2)}
    fine = pts[("fine_moe", 1)]
    assert fine["val_bpb"] == pytest.approx(1.8) and fine["val_bpb_se"] == pytest.approx(0.1)
    assert fine["tok_per_s"] == pytest.approx(3200) and fine["seeds"] == [0, 1]
    assert pts[("sandbox", 1)]["val_bpb_se"] is None
    # a --force re-run's newer row of the same key and thread count replaces the old one
    newer = fr.frontier_points(rows + [_row("coarse_moe", 1, 1.5, 5500)])
    assert next(p for p in newer if p["arm"] == "coarse_moe")["val_bpb"] == 1.5


def test_plot_builds_from_rows_alone():
    rows = [_row(a, t, 2.0 + 0.1 * i, 1000 * (i + 1) * t) for i, a in enumerate(fr.ARM_NAMES) for t in (1, 2)]
    fig = plot_frontier(json.loads(json.dumps(rows)))  # what a JSONL round trip gives
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["1 thread", "2 threads"]
    assert all(ax.get_xscale() == "log" and "tok/s" in ax.get_xlabel() for ax in panels)
    assert "bits per byte" in panels[0].get_ylabel()
    assert "Pareto front" in [t.get_text() for t in fig.legends[0].get_texts()]
    with pytest.raises(ValueError, match="no frontier rows"):
        plot_frontier([])


ROW_FIELDS = {"kind", "key", "arm", "label", "note", "seed", "threads", "config", "total_params", "active_params",
              "total_bytes", "active_bytes", "file_bytes", "budget_s", "train", "val_bpb", "val_tokens",
              "val_scope", "timed_model", "engine", "tok_per_s", "us_per_token", "tokens_per_repeat",
              "warmup_tokens", "smoke", "run_id", "host", "cpu", "versions", "git_commit", "timestamp"}


def test_tiny_run_writes_rows_and_resumes_without_training(tmp_path, monkeypatch):
    r = fr.run_frontier(tmp_path, budget_s=1.0, threads=[1], arms=["sandbox", "dense_fp32"], smoke=True,
                        tokens=8, repeats=2, warmup=2, progress=False)
    assert r["trained"] == ["sandbox/seed0", "dense_fp32/seed0"] and not r["reused"]
    rows = read_jsonl(tmp_path / "bench" / fr.SMOKE_ROWS_NAME)
    assert len(rows) == 2 and all(ROW_FIELDS <= set(row) for row in rows)
    by_arm = {row["arm"]: row for row in rows}
    assert by_arm["sandbox"]["timed_model"] == "exported" and by_arm["sandbox"]["engine"]["kernel"] == "ternary"
    assert by_arm["dense_fp32"]["timed_model"].startswith("shape twin")
    assert by_arm["dense_fp32"]["engine"]["kernel"] == "fp32"
    for row in rows:
        assert row["train"]["train_tokens"] > 0 and 0 < row["val_bpb"] < 20 and row["val_tokens"] == 4096
        assert row["tok_per_s"]["repeats"] == 2 and row["tok_per_s"]["median"] > 0 and row["threads"] == 1
        assert row["budget_s"] == 1.0 and row["smoke"] is True
    # resume: finished arms are read back, not retrained
    monkeypatch.setattr(fr, "measure_arm", lambda *a, **k: pytest.fail("a finished arm was retrained"))
    again = fr.run_frontier(tmp_path, budget_s=1.0, threads=[1], arms=["sandbox", "dense_fp32"], smoke=True,
                            progress=False)
    assert again["trained"] == [] and again["reused"] == ["sandbox/seed0", "dense_fp32/seed0"]
    assert len(again["rows"]) == 2


def test_force_and_a_new_budget_retrain(tmp_path, monkeypatch):
    calls = []

    def fake(arm, seed, budget_s, results, **kw):
        calls.append((arm.name, seed, budget_s))
        return [dict(_row(arm.name, t, 2.0, 100.0, seed, budget_s), smoke=kw["smoke"]) for t in kw["threads"]]

    monkeypatch.setattr(fr, "measure_arm", fake)
    rows_file = tmp_path / "bench" / fr.ROWS_NAME
    append_jsonl(rows_file, _row("sandbox", 1, 2.0, 100.0))
    r = fr.run_frontier(tmp_path, budget_s=180.0, threads=[1], arms=["sandbox", "coarse_moe"], progress=False)
    assert calls == [("coarse_moe", 0, 180.0)] and r["reused"] == ["sandbox/seed0"]
    fr.run_frontier(tmp_path, budget_s=180.0, threads=[1], arms=["sandbox"], force=True, progress=False)
    fr.run_frontier(tmp_path, budget_s=60.0, threads=[1], arms=["sandbox"], progress=False)
    assert calls[1:] == [("sandbox", 0, 180.0), ("sandbox", 0, 60.0)]


@pytest.mark.parametrize("argv, needles", [
    (["--seconds", "0"], ["--seconds must be a number > 0"]),
    (["--minutes", "-1"], ["--minutes must be a number > 0"]),
    (["--arms", "dense", "--seconds", "1"], ["unknown arms ['dense']"]),
    (["--threads", "0", "--seconds", "1"], ["threads must be integers >= 1"]),
    (["--seeds", "-1", "--seconds", "1"], ["seeds must be integers >= 0"]),
    (["--from-rows", "no/such.jsonl"], ["no rows file no/such.jsonl"]),
])
def test_cli_errors_are_one_line(argv, needles, tmp_path, capsys):
    assert main(["bench", "frontier", "--results", str(tmp_path), *argv]) == 2
    assert_one_line_error(capsys.readouterr().err, "tern bench: error:", *needles)


def test_cli_from_rows_prints_json_and_saves_the_figure(tmp_path, capsys):
    rows_file = tmp_path / "rows.jsonl"
    append_jsonl(rows_file, [_row(a, 1, 2.0 + 0.1 * i, 1000.0 * (i + 1)) for i, a in enumerate(fr.ARM_NAMES)])
    fig = tmp_path / "f.png"
    assert main(["bench", "frontier", "--from-rows", str(rows_file), "--figure", str(fig), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bench"] == "frontier" and out["figure"] == str(fig) and fig.stat().st_size > 10_000
    assert [p["arm"] for p in out["points"]] == list(fr.ARM_NAMES) and out["trained"] == []
    assert main(["bench", "frontier", "--from-rows", str(rows_file), "--figure", str(fig)]) == 0
    text = capsys.readouterr().out
    assert "val BPB" in text and "dense_fp32" in text


def test_what_notebook_07_shows(tmp_path, monkeypatch):
    committed = tmp_path / "committed.jsonl"
    monkeypatch.setattr(fr, "committed_rows_path", lambda: None)
    assert fr.frontier_to_show(tmp_path / "empty") is None  # nothing measured: the cell says how
    append_jsonl(committed, [_row("sandbox", 1, 2.0, 100.0), _row("fine_moe", 1, 1.9, 50.0)])
    monkeypatch.setattr(fr, "committed_rows_path", lambda: committed)
    shown = fr.frontier_to_show(tmp_path / "empty")
    assert shown["records"] == str(committed) and [p["arm"] for p in shown["points"]] == ["sandbox", "fine_moe"]
    assert "val BPB" in fr.render_frontier(shown)
    mine = tmp_path / "mine" / "bench" / fr.ROWS_NAME
    append_jsonl(mine, _row("coarse_moe", 2, 2.1, 90.0))
    assert fr.frontier_to_show(tmp_path / "mine")["records"] == str(mine)  # this machine's rows first
    seen = {}
    monkeypatch.setattr(fr, "run_frontier", lambda *a, **k: seen.update(k) or {"rows": []})
    fr.frontier_to_show(tmp_path / "mine", smoke=True, progress=False)
    assert seen["smoke"] is True and seen["budget_s"] == fr.SMOKE_BUDGET_S


def test_an_arm_missing_a_thread_count_is_measured_again(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(fr, "measure_arm", lambda arm, seed, budget_s, results, **kw: calls.append(kw["threads"])
                        or [_row(arm.name, t, 2.0, 100.0, seed, budget_s) for t in kw["threads"]])
    append_jsonl(tmp_path / "bench" / fr.ROWS_NAME, _row("sandbox", 1, 2.0, 100.0))
    assert fr.run_frontier(tmp_path, threads=[1], arms=["sandbox"], progress=False)["trained"] == []
    assert fr.run_frontier(tmp_path, threads=[1, 2], arms=["sandbox"], progress=False)["trained"] == ["sandbox/seed0"]
    assert calls == [[1, 2]]
