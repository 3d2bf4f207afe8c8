"""benchmarks/curve_stability.py: a worker measures the curve point and the read kernel in
its own process, the parent writes one JSONL row per (mode, shape) with every process's
figure, and bad shapes / rounds are a clear argparse error."""

import json

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def cs():
    return load_benchmark("curve_stability")


def test_shapes_are_parsed_or_refused(cs):
    assert cs.parse_shape("1024x1024") == (1024, 1024) and cs.parse_shape("256X4096") == (256, 4096)
    for bad in ("1024", "axb", "8x1024", "1024x1000", "1024x128"):
        with pytest.raises(Exception, match="shape"):
            cs.parse_shape(bad)


def test_bad_arguments_exit_with_a_message(cs, capsys):
    for argv in (["--rounds", "0"], ["--working-set-mib", "4"], ["--shapes", "12x12"]):
        with pytest.raises(SystemExit) as e:
            cs.main(argv)
        assert e.value.code == 2
    assert "--rounds must be >= 1" in capsys.readouterr().err


def test_one_row_per_mode_and_shape(cs, tmp_path, capsys):
    cs.main(["--results", str(tmp_path), "--rounds", "2", "--modes", "cached", "--working-set-mib", "16",
             "--shapes", "256x1024"])
    rows = [json.loads(line) for line in (tmp_path / "bench" / "curve_stability.jsonl").read_text().splitlines()]
    assert len(rows) == 1
    r = rows[0]
    assert (r["mode"], r["shape"], r["rounds"], r["working_set_bytes"]) == ("cached", "256x1024", 2, 16 << 20)
    assert len(r["gbps_per_process"]) == 2 and all(g > 0 for g in r["gbps_per_process"])
    assert r["gbps"]["median"] > 0 and r["read_gbps"]["median"] > 0 and r["threads"] == 1
    assert "GB/s median" in capsys.readouterr().out
