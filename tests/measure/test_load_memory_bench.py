"""benchmarks/load_memory.py: one row per arm with load seconds and memory medians, each load in its own
process with the layout it names; bad arguments are errors (what the copy leaves out is tested in
tests/run/test_engine_blocked.py)."""

import json

import pytest
from conftest import SMALL, load_benchmark

from tern.packed.writer import random_model


@pytest.fixture(scope="module")
def lm():
    return load_benchmark("load_memory")


def test_one_row_per_arm(lm, tmp_path, capsys):
    model = random_model(SMALL.replace(d_model=256, n_heads=4), tmp_path / "m.tern", seed=1, progress=False)
    lm.main(["--model", str(model), "--repeats", "1", "--results", str(tmp_path)])
    rows = {r["arm"]: r for r in map(json.loads, (tmp_path / "bench" / "load_memory.jsonl").read_text().splitlines())}
    assert set(rows) == set(lm.LAYOUT_ARMS)
    assert rows["rows"]["layout"] == "rows" and rows["blocked16"]["layout"] == "blocked16"
    assert all(r[f]["repeats"] == 1 and r[f]["median"] > 0 for r in rows.values() for f in ("load_s", "VmHWM"))
    assert all(r["file_bytes"] == model.stat().st_size for r in rows.values())
    assert "anonymous" in capsys.readouterr().out


def test_bad_arguments_are_errors(lm, tmp_path):
    with pytest.raises(SystemExit):
        lm.main(["--model", str(tmp_path / "missing.tern")])
    with pytest.raises(SystemExit):
        lm.main(["--model", "x", "--repeats", "0"])
    with pytest.raises(SystemExit):
        lm.main(["--model", "x", "--arms", "cols"])
