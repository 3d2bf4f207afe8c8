"""benchmarks/format_ab.py: config names, bad input refused before anything is built or timed,
and its rows (a fake worker: no timing)."""

import json
from pathlib import Path

import pytest
from conftest import load_benchmark

from tern.core.config import get_preset


@pytest.fixture(scope="module")
def fab():
    return load_benchmark("format_ab")


def test_config_names(fab):
    cfg = fab.config_named("d2560-L8-E256k4-h640")
    assert (cfg.d_model, cfg.n_layers, cfg.n_experts, cfg.top_k, cfg.expert_hidden) == (2560, 8, 256, 4, 640)
    assert cfg.dt_format == "fp16"  # the 10B space's storage
    assert fab.config_named("sandbox") == get_preset("sandbox")
    with pytest.raises(ValueError, match="neither"):
        fab.config_named("d2560-L8")


@pytest.mark.parametrize("argv,msg", [
    (["--configs", "nope", "--field", "dt_format", "--values", "fp32", "fp16"], "neither"),
    (["--configs", "sandbox", "--field", "bogus", "--values", "a", "b"], "unknown ModelConfig keys"),
    (["--configs", "sandbox", "--field", "dt_format", "--values", "fp32", "int8"], "dt_format"),
    (["--configs", "sandbox", "--field", "dt_format", "--values", "fp32", "fp16", "--rounds", "0"], "rounds"),
])
def test_bad_input_is_one_usage_error(fab, tmp_path, capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        fab.main([*argv, "--out", str(tmp_path / "x.jsonl"), "--models", str(tmp_path)])
    assert e.value.code == 2 and msg in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


def test_rows_alternate_and_summarise(fab, tmp_path, monkeypatch, capsys):
    calls = []

    def fake_measure(path, cfg, threads):
        calls.append((Path(path).name, threads))
        return 100.0 if "fp32" not in Path(path).name and len(calls) % 2 else 90.0

    monkeypatch.setattr(fab, "measure", fake_measure)
    monkeypatch.setattr(fab, "ensure_model", lambda cfg, d: Path(d) / f"{cfg.name}-{cfg.dt_format}.tern")
    out = tmp_path / "ab.jsonl"
    assert fab.main(["--configs", "sandbox", "--field", "dt_format", "--values", "fp32", "fp16", "--threads", "1",
                     "--rounds", "2", "--out", str(out), "--models", str(tmp_path)]) == 0
    assert [c[0].split("-")[-1] for c in calls] == ["fp32.tern", "fp16.tern", "fp16.tern", "fp32.tern"]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["value"], r["threads"], len(r["rounds_tok_per_s"])) for r in rows] == [("fp32", 1, 2), ("fp16", 1, 2)]
    assert all(r["record"] == "format_ab" and r["git_commit"] and r["tok_per_s"]["repeats"] == 2 for r in rows)
    assert rows[1]["active_bytes"] < rows[0]["active_bytes"]
    assert "ratio" in capsys.readouterr().out
