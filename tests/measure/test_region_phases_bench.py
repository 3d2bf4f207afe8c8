"""benchmarks/region_phases.py: refuses to run on the unclocked build (saying how to get the
clocked one), and sums the per-phase medians into single-item and split phases."""

import numpy as np
import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def rp():
    return load_benchmark("region_phases")


def test_needs_the_clocked_build(rp, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        rp.main(["--model", str(tmp_path / "m.tern")])
    assert e.value.code == 2 and "TERN_PHASE_CLOCK=1" in capsys.readouterr().err


def test_bad_arguments_and_model_files_are_argparse_errors(rp, monkeypatch, tmp_path, capsys):
    from tern.kernels import region

    monkeypatch.setattr(region, "PHASE_CLOCK", True)
    bad = tmp_path / "bad.tern"
    bad.write_bytes(b"garbage")
    for argv, words in ((["--model", "m.tern", "--threads", "1"], "--threads >= 2"),
                        (["--model", "m.tern", "--rounds", "0"], "--rounds >= 1"),
                        (["--model", str(tmp_path / "missing.tern")], "does not exist"),
                        (["--model", str(bad)], "not a packed model")):
        with pytest.raises(SystemExit) as e:
            rp.main(argv)
        assert e.value.code == 2 and words in capsys.readouterr().err, argv


def test_summary_of_single_and_split_phases(rp):
    hz = 1e9  # 1 cycle = 1 ns
    items = np.array([1, 2, 1, 4])
    rows = [np.array([1_000, 4_000, 500, 8_000]), np.array([3_000, 6_000, 700, 10_000]),
            np.array([2_000, 5_000, 600, 9_000])]
    s = rp.summarise(rows, items, hz)
    assert s["phases"] == 4 and s["single_phases"] == 2
    assert s["phase_us"] == [2.0, 5.0, 0.6, 9.0]  # medians per phase
    assert s["single_us"] == pytest.approx(2.6) and s["split_us"] == pytest.approx(14.0)
    assert s["token_us"] == pytest.approx(16.6)  # median of the tokens' sums (13.5, 19.7, 16.6)


def test_row_keeps_both_ways_beside_the_thread_count(rp, monkeypatch, tmp_path):
    """The row's ``ways`` holds both summaries; ``threads`` stays the run's thread count."""
    import json

    from tern.kernels import region

    monkeypatch.setattr(region, "PHASE_CLOCK", True)
    summary = {"token_us": 1.0, "single_us": 0.5, "split_us": 0.5, "phases": 2, "single_phases": 1,
               "phase_us": [0.5, 0.5]}

    class FakeEngine:
        class cfg:
            vocab_size = 10

        def __init__(self, *a, **k):
            pass

    monkeypatch.setattr("tern.run.engine.Engine", FakeEngine)
    monkeypatch.setattr(rp, "clocked_tokens", lambda eng, toks: ([np.array([1, 2])], np.array([1, 2])))
    monkeypatch.setattr(rp, "summarise", lambda rows, items, hz: dict(summary))
    monkeypatch.setattr(rp, "cycles_per_second", lambda: 1e9)
    assert rp.main(["--model", "m.tern", "--results", str(tmp_path), "--rounds", "1", "--tokens", "2"]) == 0
    (row,) = [json.loads(x) for x in (tmp_path / "bench" / "region_phases.jsonl").read_text().splitlines()]
    assert row["threads"] == 2 and set(row["ways"]) == {"threads", "walk"} and row["ways"]["walk"] == summary
    assert row["items_per_phase"] == [1, 2] and row["record"] == "region_phases"
