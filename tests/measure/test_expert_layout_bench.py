"""benchmarks/expert_layout.py: its "together" passes read the bytes tern.run.weights.experts_together puts
where the "apart" passes read them, one JSONL row per arm, bad arguments are argparse errors."""

import json

import numpy as np
import pytest
from conftest import load_benchmark

from tern.kernels.kernels_blocked import blocked16_shape
from tern.run.weights import experts_together


@pytest.fixture(scope="module")
def el():
    return load_benchmark("expert_layout")


def test_together_plan_reads_what_experts_together_stores(el):
    D, H, E, K, L = 48, 32, 5, 2, 2
    gb, db = int(np.prod(blocked16_shape(H, D))), int(np.prod(blocked16_shape(D, H)))
    apart = np.random.default_rng(0).integers(0, 256, size=L * E * (2 * gb + db), dtype=np.uint8)
    per = E * (2 * gb + db)
    together = np.concatenate([experts_together([apart[b:b + E * gb], apart[b + E * gb:b + 2 * E * gb],
                                                 apart[b + 2 * E * gb:b + per]], E) for b in range(0, L * per, per)])
    choices = np.array([[[0, 3], [1, 4]], [[2, 4], [0, 1]]])  # (tokens, layers, top_k)
    pa, pt = el.plan("apart", choices, D, H, E), el.plan("together", choices, D, H, E)
    assert len(pa[0]) == len(pt[0]) == 2 * L * K * 3
    assert np.array_equal(pa[1], pt[1]) and np.array_equal(pa[3], pt[3])
    for oa, ot, nb, bb in zip(pa[0], pt[0], pa[1], pa[2], strict=True):
        assert np.array_equal(apart[oa:oa + nb * bb], together[ot:ot + nb * bb])


def test_rows_per_arm(el, tmp_path, capsys):
    el.main(["--results", str(tmp_path), "--d-model", "64", "--hidden", "32", "--experts", "6", "--top-k", "2",
             "--layers", "2", "--tokens", "3", "--repeats", "2"])
    rows = [json.loads(line) for line in (tmp_path / "bench" / "expert_layout.jsonl").read_text().splitlines()]
    assert {r["arm"] for r in rows} == {"apart", "together", "read"}
    assert all(r["gbps"]["repeats"] == 2 and r["gbps"]["median"] > 0 and r["bytes_per_token"] > 0 for r in rows)
    assert "GB/s" in capsys.readouterr().out


def test_bad_arguments_are_argparse_errors(el):
    for argv in (["--experts", "0"], ["--top-k", "9", "--experts", "8"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            el.main(argv)
