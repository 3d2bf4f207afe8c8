"""benchmarks/dense_prefetch.py: its comparison forms compute the shipped kernels' results
bit for bit (only the prefetch differs), every (dtype, columns, threads, form) gets one
JSONL row, and bad arguments are a clear argparse error."""

import json

import numpy as np
import pytest
from conftest import load_benchmark

from tern.kernels.kernels_stored import matvec_int8w, matvec_w16


@pytest.fixture(scope="module")
def dp():
    return load_benchmark("dense_prefetch")


@pytest.mark.parametrize("cols", [64, 1000, 2048])
def test_comparison_forms_match_the_shipped_kernels(dp, cols):
    rng = np.random.default_rng(cols)
    rows = 37
    W16 = (rng.standard_normal((rows, cols), dtype=np.float32)).astype(np.float16).view(np.uint16)
    W8 = rng.integers(-127, 128, (rows, cols), dtype=np.int8)
    x = rng.standard_normal(cols).astype(np.float32)
    sc = rng.random(rows).astype(np.float32)
    ref16, ref8 = np.empty(rows, np.float32), np.empty(rows, np.float32)
    matvec_w16(W16, x, ref16, False)
    matvec_int8w(W8, sc, x, ref8)
    for on in (1, 2, 3, 0):  # halves, the whole row into L2, into L1, none
        for fn, args, ref in ((dp._w16_split, (W16, x), ref16), (dp._w16_split_par, (W16, x), ref16),
                              (dp._int8_split, (W8, sc, x), ref8), (dp._int8_split_par, (W8, sc, x), ref8)):
            o = np.full(rows, np.nan, np.float32)
            fn(*args, o, on)
            np.testing.assert_array_equal(o, ref, err_msg=f"{fn} prefetch={on}")


def test_rows_per_form(dp, tmp_path, capsys):
    dp.main(["--results", str(tmp_path), "--cols", "256", "--threads", "1", "--bytes", "65536", "--repeats", "2"])
    rows = [json.loads(line) for line in (tmp_path / "bench" / "dense_prefetch.jsonl").read_text().splitlines()]
    assert {(r["dtype"], r["form"]) for r in rows} == {(d, f) for d in ("fp16", "int8")
                                                       for f in ("whole row (shipped)", "halves", "whole row into L2",
                                                                 "whole row into L1", "none")}
    assert all(r["gbps"]["repeats"] == 2 and r["gbps"]["median"] > 0 and r["threads"] == 1 for r in rows)
    assert "GB/s" in capsys.readouterr().out


def test_bad_arguments_are_argparse_errors(dp):
    with pytest.raises(SystemExit):
        dp.main(["--cols", "0"])
