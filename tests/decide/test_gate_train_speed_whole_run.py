"""benchmarks/gate_train_speed.py --whole-run: whole training runs timed in processes that
import tern from the checkout named by --code-root (issue 18's same-host before/after)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tern.core.records import read_jsonl
from tern.decide.harness import smoke_gate_file

REPO = Path(__file__).resolve().parents[2]
_PATH = REPO / "benchmarks" / "gate_train_speed.py"


def _script():
    spec = importlib.util.spec_from_file_location("gate_train_speed", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 CPUs for two side-by-side runs")
def test_whole_run_rows_name_the_checkout_they_ran(tmp_path, capsys):
    gate = smoke_gate_file(tmp_path)
    out = tmp_path / "speed.jsonl"
    all_cpus = str(os.cpu_count())
    rc = _script().main(["--whole-run", "--gate", str(gate), "--arms", "B", "--threads", "1", all_cpus,
                         "--concurrent", "2", "--run-steps", "2", "--code-root", str(REPO), "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "oversubscribe" in printed  # 2 runs x all CPUs each: skipped, and said so
    rows = read_jsonl(out)
    assert len(rows) == 2 and {r["concurrent"] for r in rows} == {2}  # the two side-by-side copies
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    for r in rows:
        assert r["record"] == "train_speed" and r["mode"] == "whole_run" and r["gate"] == "smoke"
        assert r["arm"] == "B" and r["threads"] == 1 and r["steps_timed"] == 2
        assert r["tokens_per_s"] > 0 and r["wall_s"] > r["eval_s"] >= 0 and r["eval_bpb"] > 0
        assert Path(r["tern_package"]) == REPO / "tern" and r["code_commit"].startswith(head)
        assert r["batch_size"] == 2 and r["seq_len"] == 32 and "git_commit" in r


def test_whole_run_refuses_a_checkout_without_the_gate(tmp_path):
    res = subprocess.run([sys.executable, str(_PATH), "--whole-run", "--gate", "gates/no_such_gate.toml",
                          "--arms", "A", "--threads", "1", "--code-root", str(REPO)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode != 0 and "is not in checkout" in res.stderr
    assert "tok/s" not in res.stdout


def test_step_rows_say_where_they_ran_and_cuda_without_a_gpu_is_refused(tmp_path, monkeypatch):
    gate = smoke_gate_file(tmp_path)
    mod = _script()
    row = mod.measure(str(gate), "B", "auto", 1, steps=1, warmup=0, eval_full=False, eval_batch=None, profile=1)
    assert row["device"] == "cpu" and row["gpu"] is None and row["tokens_per_s"] > 0
    prof = row["profile_ms"]  # CPU: self CPU ms by category, no GPU figures
    assert prof["steps"] == 1 and sum(prof["self_ms_per_step"].values()) > 0 and "device_ms_per_step" not in prof
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        mod.main(["--gate", str(gate), "--arms", "B", "--device", "cuda"])


def test_parts_time_every_block_and_add_up_to_about_the_whole(tmp_path):
    gate = smoke_gate_file(tmp_path)
    row = _script().measure(str(gate), "B", "auto", 1, steps=1, warmup=0, eval_full=False, eval_batch=None,
                            parts=True)
    pm = row["parts_ms"]
    from tern.decide.spec import load_gate

    n_layers = load_gate(str(gate)).model_config("B").n_layers
    mixers = [k for k in pm["parts"] if k.startswith("layer ") and "mixer" in k]
    assert len(mixers) == n_layers and "head + loss" in pm["parts"] and "optimizer update" in pm["parts"]
    assert all(v > 0 for v in pm["parts"].values()) and pm["whole_forward_backward"] > 0
    blocks = sum(v for k, v in pm["parts"].items() if k.startswith(("layer ", "head")))
    # each block timed alone: their sum is the whole forward + backward within a loose factor
    assert 0.3 < blocks / pm["whole_forward_backward"] < 3.0
