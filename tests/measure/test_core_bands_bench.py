"""benchmarks/core_bands.py: one row per model and sample with the round trip before and after
and both thread counts, a plot from the rows alone, bad arguments as argparse errors."""

import json

import numba
import pytest
from conftest import TRAIN_TINY, load_benchmark


@pytest.fixture(scope="module")
def cb():
    return load_benchmark("core_bands")


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 numba threads")
def test_rows_carry_round_trips_and_both_thread_counts(cb, tmp_path, capsys):
    from tern.packed.writer import random_model

    model = random_model(TRAIN_TINY, tmp_path / "tiny.tern", seed=0, progress=False)
    out = tmp_path / "bands.jsonl"
    assert cb.main(["--models", str(model), "--minutes", "0", "--tokens", "4", "--repeats", "1",
                    "--out", str(out)]) == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["benchmark"] == "core_bands" and row["config_name"] == "tiny" and row["threads"] == 2
    assert row["round_trip_before_ns"] > 0 and row["round_trip_after_ns"] > 0
    assert row["two_over_one"] == pytest.approx(row["tok_per_s_2t"] / row["tok_per_s_1t"])
    assert "2t/1t" in capsys.readouterr().err
    png = tmp_path / "bands.png"
    assert cb.main(["--out", str(out), "--plot", str(png)]) == 0 and png.stat().st_size > 1000


def test_plot_needs_rows_and_models_must_exist(cb, tmp_path, capsys):
    for bad in (["--out", str(tmp_path / "none.jsonl"), "--plot", str(tmp_path / "x.png")],
                ["--models", str(tmp_path / "missing.tern")], [],
                ["--models", str(tmp_path), "--repeats", "0"]):
        with pytest.raises(SystemExit) as e:
            cb.main(bad)
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "no core_bands rows" in err and "no such model file" in err and "--models is required" in err
