"""benchmarks/skip_patterns.py: one row per shape with every way timed; bad arguments are usage errors."""

import json

import numpy as np
import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def sp():
    return load_benchmark("skip_patterns")


def test_one_row_per_shape(sp, tmp_path, capsys):
    assert sp.main(["--shapes", "64x256", "40x96", "--copies", "2", "--patterns", "3", "--rounds", "1",
                    "--calls", "5", "--results", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "bench" / "skip_patterns.jsonl").read_text().splitlines()]
    assert [(r["inputs"], r["outputs"]) for r in rows] == [(64, 256), (40, 96)]
    ways = {"kernel fresh", "kernel repeated", "listing fresh", "listing repeated"}
    assert all(set(r["us_per_call"]) == ways and r["us_per_call"]["kernel fresh"]["median"] > 0 for r in rows)
    assert all(r["git_commit"] and r["threads"] == 1 and r["density"] == sp.DENSITY for r in rows)
    assert "repeated" in capsys.readouterr().out


def test_activations_have_the_density_asked(sp):
    acts = sp.activations(4096, 3, 0.25, seed=1)
    assert acts.shape == (3, 4096) and acts.dtype == np.int8
    assert 0.22 < np.count_nonzero(acts) / acts.size < 0.28
    assert not np.array_equal(acts[0] != 0, acts[1] != 0)  # each pattern its own zeros


def test_bad_arguments_are_errors(sp, tmp_path):
    with pytest.raises(SystemExit):
        sp.main(["--rounds", "0", "--results", str(tmp_path)])
    with pytest.raises(SystemExit):
        sp.main(["--shapes", "12y3"])
