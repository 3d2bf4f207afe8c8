"""benchmarks/stack_depth.py: calls really run deeper, every (op, depth) gets one JSONL row with
its code root, bad arguments are argparse errors."""

import inspect
import json

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def sd():
    return load_benchmark("stack_depth")


def test_each_depth_adds_frames(sd):
    def frames():
        return len(inspect.stack(0))
    got = [sd.at_depth(d, frames) for d in range(3)]
    assert got[0] < got[1] < got[2]


def test_time_at_depths_runs_before_each_sample(sd):
    calls = []
    out = sd.time_at_depths(lambda: calls.append("f"), 2, 3, 5, before=lambda: calls.append("b"))
    assert [len(x) for x in out] == [3, 3] and all(s >= 0 for x in out for s in x)
    assert calls.count("b") == 6 and calls.count("f") == 2 * (4 + 3 * 5)


def test_rows_per_op_and_depth(sd, tmp_path, capsys):
    out = tmp_path / "sd.jsonl"
    sd.main(["--shapes", "8x384", "--models", "--depths", "2", "--repeats", "2", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["op"], r["depth"]) for r in rows) == [("1row 8x384", 0), ("1row 8x384", 1),
                                                            ("4row 8x384", 0), ("4row 8x384", 1)]
    for r in rows:
        assert r["benchmark"] == "stack_depth" and r["seconds_per_call"]["repeats"] == 2
        assert r["code_root"] and r["threads"] == 1 and "git_commit" in r
        assert r["code_commit"] == r["git_commit"]  # the checkout tern came from
    assert "us by depth" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [["--depths", "0"], ["--repeats", "0"], ["--shapes", "8by384"],
                                 ["--shapes", "0x384"], ["--shapes", "8x384x2"]])
def test_bad_arguments_are_errors(sd, bad, tmp_path):
    with pytest.raises(SystemExit) as e:
        sd.main([*bad, "--out", str(tmp_path / "x.jsonl")])
    assert e.value.code == 2


def test_a_code_root_other_than_the_imported_tern_is_refused(sd, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:  # tern is imported from this checkout already
        sd.main(["--code-root", str(tmp_path), "--shapes", "--models", "--out", str(tmp_path / "x.jsonl")])
    assert e.value.code == 2 and "already imported" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()
