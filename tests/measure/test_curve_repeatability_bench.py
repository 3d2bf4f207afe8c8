"""benchmarks/curve_repeatability.py: each run's curves replace a committed host's op curves and
its sweep is re-predicted; the spread over runs is zero for identical curves and grows when a
run's curves move; one row per run and a summary row per (checkout, threads); bad arguments are
a clear argparse error."""

import dataclasses
import json

import pytest
from conftest import load_benchmark

from tern.measure.hosts import load_hosts


@pytest.fixture(scope="module")
def cr():
    load_benchmark("code_ab")  # its checkout order and labels, imported by name as the script does
    return load_benchmark("curve_repeatability")


@pytest.fixture(scope="module")
def host():
    return next(h for h in load_hosts() if h.label == "amd-epyc-zen4-s50b")


def _slower(curves, factor):
    return tuple(dataclasses.replace(c, seconds=tuple(s * factor for s in c.seconds)) for c in curves)


def test_the_spread_is_zero_for_the_same_curves_and_grows_with_a_slower_run(cr, host):
    same = cr.prediction_spread(host, [host.profile.op_curves] * 3)
    assert set(same) == {1, 2} and all(s["median_spread"] == 0 and s["pairs_within_5pct"] == 1 for s in same.values())
    assert same[1]["points"] + same[2]["points"] == len(host.rows) and same[1]["runs"] == 3
    moved = cr.prediction_spread(host, [host.profile.op_curves, _slower(host.profile.op_curves, 1.5)])
    for s in moved.values():  # slower kernels: every point predicted slower, some by more than 10 %
        assert 0 < s["median_spread"] <= s["p90_spread"] <= s["max_spread"] < 0.5
        assert s["pairs_within_10pct"] < 1


def test_curves_round_trip_through_a_row(cr, host):
    row = json.loads(json.dumps({"curves": [dataclasses.asdict(c) for c in host.profile.op_curves]}))
    assert cr.curves_of(row) == host.profile.op_curves


def test_one_row_per_run_and_a_summary_per_checkout_and_thread_count(cr, host, tmp_path, monkeypatch, capsys):
    calls = []

    def fake_stage(root, threads, quick, max_bytes):
        calls.append((root, tuple(threads), quick, max_bytes))
        return {"wall_s": 1.5, "curves": [dataclasses.asdict(c) for c in _slower(host.profile.op_curves,
                                                                                  1 + 0.05 * len(calls))]}

    monkeypatch.setattr(cr, "run_stage", fake_stage)
    out = tmp_path / "rows.jsonl"
    assert cr.main(["--runs", "2", "--host", host.label, "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(calls) == 3  # the warm round, then two timed runs
    runs = [r for r in rows if r["kind"] == "run"]
    assert [r["round"] for r in runs] == [0, 1] and all(len(r["curves"]) == len(host.profile.op_curves) for r in runs)
    summary = [r for r in rows if r["kind"] == "summary"]
    assert sorted(r["threads"] for r in summary) == [1, 2] and all(r["host_label"] == host.label for r in summary)
    assert all(r["runs"] == 2 and r["median_spread"] > 0 and "git_commit" in r for r in summary)
    assert "spread median" in capsys.readouterr().out


@pytest.mark.parametrize("argv,msg", [(["--runs", "1"], "--runs must be >= 2"),
                                      (["--host", "no-such-host"], "no committed host 'no-such-host'"),
                                      (["--code-root", "/"], "is not a tern checkout")])
def test_bad_arguments_exit_with_a_message(cr, capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        cr.main(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err
