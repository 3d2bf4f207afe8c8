"""benchmarks/code_ab.py: bad input refused before anything is timed, and its rows and summary
(a fake worker: no timing)."""

import json
import subprocess
from pathlib import Path

import pytest
from conftest import load_benchmark

from tern.core.config import ModelConfig
from tern.packed.writer import random_model

_REPO = Path(__file__).resolve().parents[2]  # this checkout
TINY = ModelConfig(name="tiny-ab", vocab_size=64, d_model=32, n_layers=2, attn_layers=(1,), n_heads=2,
                   attn_window=16, d_state=8, max_seq_len=16, mlp_hidden=64)


@pytest.fixture(scope="module")
def cab():
    return load_benchmark("code_ab")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "tiny.tern"
    random_model(TINY, path, progress=False)
    return path


def test_bad_input_is_one_usage_error(cab, tmp_path, capsys, model):
    garbage = tmp_path / "bad.tern"
    garbage.write_bytes(b"garbage!")
    cases = [(["--model", str(tmp_path / "none.tern"), "--code-root", str(_REPO)], "does not exist"),
             (["--model", str(garbage), "--code-root", str(_REPO)], "not a packed model"),
             (["--model", str(model), "--code-root", str(tmp_path)], "not a tern checkout"),
             (["--model", str(model), "--code-root", str(_REPO), "--threads", "0"], "threads=0"),
             (["--model", str(model), "--code-root", str(_REPO), "--rounds", "0"], "--rounds")]
    for argv, msg in cases:
        with pytest.raises(SystemExit) as e:
            cab.main([*argv, "--out", str(tmp_path / "x.jsonl")])
        assert e.value.code == 2 and msg in capsys.readouterr().err, argv
    assert not (tmp_path / "x.jsonl").exists()


def test_rows_alternate_and_summarise_paired_ratios(cab, tmp_path, monkeypatch, capsys, model):
    other = tmp_path / "other"
    (other / "tern").mkdir(parents=True)
    (other / "tern" / "__init__.py").write_text("")
    calls = []
    speed = {str(_REPO): [100.0, 120.0, 90.0], str(other): [110.0, 108.0, 99.0]}

    def fake_worker(root, path, point):
        calls.append((str(root), point.threads))
        n = sum(1 for c in calls if c == (str(root), point.threads))
        return {"tok_per_s": speed[str(root)][n - 1], "spread_rel": 0.01}

    monkeypatch.setattr(cab, "worker", fake_worker)
    out = tmp_path / "ab.jsonl"
    assert cab.main(["--model", str(model), "--code-root", str(_REPO), str(other), "--threads", "1",
                     "--rounds", "3", "--no-warm-round", "--out", str(out)]) == 0
    a, b = (str(_REPO), 1), (str(other), 1)
    assert calls == [a, b, b, a, a, b]  # the checkouts alternate inside each round, in turn first
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["round"], r["slot"], r["code_root"]) for r in rows] == [
        (0, 0, a[0]), (0, 1, b[0]), (1, 0, b[0]), (1, 1, a[0]), (2, 0, a[0]), (2, 1, b[0])]
    text = capsys.readouterr().out
    # paired ratios (each checkout's n-th run against the first's) 1.10, 0.90, 1.10: median x1.100
    assert "x1.100 (x0.90-1.10), faster in 2 of 3 rounds" in text


def test_summary_labels_keep_a_dirty_tree_visible(cab):
    assert cab.label("857809d6d2e233a743b167b56a664b8536aa95a4+dirty") == "857809d6d2e2+dirty"
    assert cab.label("857809d6d2e233a743b167b56a664b8536aa95a4") == "857809d6d2e2"


@pytest.mark.parametrize("error", [RuntimeError("sweep worker failed"), subprocess.TimeoutExpired(["worker"], 3600)])
def test_a_failed_or_hung_worker_is_one_clear_error(cab, monkeypatch, model, error):
    def failing(*a, **k):
        raise error

    monkeypatch.setattr(cab, "measure_in_subprocess", failing)
    with pytest.raises(SystemExit) as e:
        cab.worker(_REPO, model, cab.SweepPoint("code_ab", TINY.name, TINY, 1))
    assert str(e.value).startswith(f"code_ab: the worker with {_REPO} failed")
