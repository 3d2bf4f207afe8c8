"""benchmarks/compile_time.py: compile events folded into per-function seconds, rows per round and
checkout with the checkouts taking turns, bad input refused before anything compiles (a fake cold
run: a real one compiles the whole engine, ~2 minutes)."""

import json
from pathlib import Path

import numba
import pytest
from conftest import load_benchmark

_REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ct():
    load_benchmark("code_ab")  # its round_order, imported as the script's own folder has it
    return load_benchmark("compile_time")


def test_exclusive_seconds_subtract_the_nested_compiles(ct):
    ev = [("start", 0.0, "top"), ("start", 1.0, "mid"), ("start", 2.0, "leaf"), ("end", 5.0, "leaf"),
          ("end", 7.0, "mid"), ("start", 8.0, "leaf"), ("end", 9.0, "leaf"), ("end", 10.0, "top")]
    got = ct.exclusive_seconds(ev)
    assert got["top"] == {"inclusive_s": 10.0, "exclusive_s": 3.0, "compiles": 1}  # 10 - (6 + 1)
    assert got["mid"] == {"inclusive_s": 6.0, "exclusive_s": 3.0, "compiles": 1}
    assert got["leaf"] == {"inclusive_s": 4.0, "exclusive_s": 4.0, "compiles": 2}
    with pytest.raises(ValueError, match="out of order"):
        ct.exclusive_seconds([("start", 0.0, "a"), ("end", 1.0, "b")])
    with pytest.raises(ValueError, match="unfinished"):
        ct.exclusive_seconds([("start", 0.0, "a")])


def test_the_recorder_sees_a_real_nested_compile(ct):
    with ct.record_compiles() as events:
        @numba.njit
        def inner(x):
            return x + 1

        @numba.njit
        def outer(x):
            return inner(x) * 2

        assert outer(3) == 8
    got = ct.exclusive_seconds(events)
    names = {n.rsplit(".", 1)[-1]: f for n, f in got.items()}
    assert names["outer"]["compiles"] == 1 and names["inner"]["compiles"] == 1
    assert names["outer"]["inclusive_s"] >= names["inner"]["inclusive_s"] > 0
    assert 0 < names["outer"]["exclusive_s"] <= names["outer"]["inclusive_s"]


def test_rows_per_round_and_checkout_taking_turns(ct, tmp_path, monkeypatch, capsys):
    other = tmp_path / "other"
    (other / "tern").mkdir(parents=True)
    (other / "tern" / "__init__.py").write_text("")
    model = tmp_path / "m.tern"
    model.write_bytes(b"x")
    calls = []

    def fake(root, path, threads):
        calls.append(root)
        return {"import_s": 0.1, "engine_s": {str(t): 10.0 * t for t in threads}, "compile_s": 25.0, "compiles": 7,
                "functions": [{"name": "ops.token_step", "inclusive_s": 20.0, "exclusive_s": 5.0, "compiles": 1}]}

    monkeypatch.setattr(ct, "run_cold", fake)
    out = tmp_path / "rows.jsonl"
    assert ct.main(["--model", str(model), "--code-root", str(_REPO), str(other), "--rounds", "2",
                    "--out", str(out)]) == 0
    assert calls == [_REPO, other, other, _REPO]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["round"], r["slot"], r["code_root"]) for r in rows] == [
        (0, 0, str(_REPO)), (0, 1, str(other)), (1, 0, str(other)), (1, 1, str(_REPO))]
    assert all(r["engine_threads"] == [1, 2] and r["engine_s"] == {"1": 10.0, "2": 20.0} for r in rows)
    text = capsys.readouterr().out
    assert "median 30.0 s from an empty cache" in text and "7 compiles" in text


def test_bad_input_is_a_usage_error(ct, tmp_path, capsys):
    model = tmp_path / "m.tern"
    model.write_bytes(b"x")
    cases = [(["--model", str(tmp_path / "none.tern")], "does not exist"),
             (["--model", str(model), "--code-root", str(tmp_path)], "not a tern checkout"),
             (["--model", str(model), "--rounds", "0"], "--rounds"),
             (["--model", str(model), "--threads", "0"], "--threads"),
             (["--model", str(model), "--code-root", str(_REPO)], None)]
    for argv, msg in cases:
        extra = [] if msg is None else ["--out", str(tmp_path / "x.jsonl")]
        with pytest.raises(SystemExit) as e:
            ct.main([*argv, *extra])
        assert e.value.code == 2 and (msg or "--out is required") in capsys.readouterr().err, argv
    assert not (tmp_path / "x.jsonl").exists()
