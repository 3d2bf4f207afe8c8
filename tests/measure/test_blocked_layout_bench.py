"""benchmarks/blocked_layout.py: every arm computes the same outputs (checked before timing),
one JSONL row per (shape, tier, arm) with the read kernel's rate beside it, bad arguments are
argparse errors."""

import json

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def bl():
    return load_benchmark("blocked_layout")


def test_rows_per_shape_tier_and_arm(bl, tmp_path, capsys):
    bl.main(["--results", str(tmp_path), "--shapes", "20x40", "32x300", "--l2-bytes", "4096", "--cache-bytes", "65536",
             "--dram-bytes", "131072", "--repeats", "2", "--min-time-s", "0.001"])
    rows = [json.loads(line) for line in (tmp_path / "bench" / "blocked_layout.jsonl").read_text().splitlines()]
    assert {(r["rows"], r["cols"], r["where"], r["arm"]) for r in rows} == {
        (r, c, w, a) for r, c in ((20, 40), (32, 300)) for w in ("L2", "L3", "DRAM") for a in bl.ARMS}
    assert all(r["gbps"]["repeats"] == 2 and r["gbps"]["median"] > 0 and r["matrices"] >= 2 for r in rows)
    assert all(r["read_gbps"]["median"] > 0 for r in rows)
    assert "GB/s" in capsys.readouterr().out


def test_bad_arguments_are_argparse_errors(bl):
    for argv in (["--shapes", "12"], ["--shapes", "0x5"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            bl.main(argv)
