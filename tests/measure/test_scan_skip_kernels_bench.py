"""benchmarks/scan_skip_kernels.py: every case timed by a worker process of the checkout named, one
row per checkout and case; bad arguments are usage errors before anything runs."""

import json

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def sk():
    load_benchmark("curve_stability")  # its parse_shape, imported as the script's own folder has it
    return load_benchmark("scan_skip_kernels")


def test_one_row_per_case(sk, tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    assert sk.main(["--scan", "128x8x4", "--skip", "64x256", "--ws-mib", "1", "--rounds", "1", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    cases = {r["case"] for r in rows}
    assert {"scan_dram_us", "scan_cache_us", "skip_dram_0.25_us"} <= cases
    assert {f"skip_cache_{d}_us" for d in sk.DENSITIES} <= cases
    assert all(r["us_per_call"]["median"] > 0 and r["rounds"] == 1 and r["scan"] == [128, 8, 4] for r in rows)
    assert "a call" in capsys.readouterr().out


def test_attention_cases_alone(sk, tmp_path):
    out = tmp_path / "rows.jsonl"
    assert sk.main(["--cases", "attention", "--attention", "2x8x16", "--positions", "4", "16", "--ws-mib", "1",
                    "--rounds", "1", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["case"] for r in rows} == {f"attn_{w}_n{n}_us" for w in ("cache", "dram") for n in (4, 16)}
    assert all(r["us_per_call"]["median"] > 0 and r["attention"] == [2, 8, 16] for r in rows)


def test_bad_arguments_are_errors(sk, tmp_path):
    assert sk.main(["--code-root", str(tmp_path), "--out", str(tmp_path / "x.jsonl")]) == 2  # not a checkout
    assert sk.main(["--rounds", "0", "--out", str(tmp_path / "x.jsonl")]) == 2
    with pytest.raises(SystemExit):
        sk.main(["--scan", "12x3"])
    assert sk.main(["--attention", "2x8x16", "--positions", "17", "--out", str(tmp_path / "x.jsonl")]) == 2  # past the window
    assert sk.main(["--positions", "0", "--out", str(tmp_path / "x.jsonl")]) == 2
    for bad in (["--attention", "2x8"], ["--cases", "bogus"]):
        with pytest.raises(SystemExit):
            sk.main(bad)
    assert not (tmp_path / "x.jsonl").exists()
