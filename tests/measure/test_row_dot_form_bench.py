"""benchmarks/row_dot_form.py: both code forms of both passes compute the engine kernel's
sums, every (pass, form, matrix size, tier) gets one JSONL row, bad arguments are argparse
errors."""

import json

import numpy as np
import pytest
from conftest import load_benchmark

from tern.kernels import kernels_ternary as kt
from tern.kernels.simd import ROW_DOT_ISA

pytestmark = pytest.mark.skipif(ROW_DOT_ISA == "none", reason="needs the SIMD row passes")


@pytest.fixture(scope="module")
def rdf():
    return load_benchmark("row_dot_form")


@pytest.mark.parametrize("row_bytes", [64, 256, 288])  # 288: a partial last segment
def test_every_form_of_every_pass_gives_the_kernel_sums(rdf, row_bytes):
    rng = np.random.default_rng(row_bytes)
    rows = 12
    mats = rng.integers(0, 256, size=(3, rows, row_bytes), dtype=np.uint8)
    xq = rng.integers(-127, 128, size=4 * row_bytes, dtype=np.int8)
    order = np.array([2, 0, 1], np.int64)
    ref = np.empty(rows, np.float32)
    kt.ternary_matvec_simd(mats[1], np.ones(rows, np.float32), xq, np.float32(1), ref)  # the last matrix run
    for (nrows, form), f in rdf.passes().items():
        out = np.full(rows, np.nan, np.float32)
        f(mats, order, xq, out)
        np.testing.assert_array_equal(out, ref, err_msg=f"{nrows}-row {form}")


def test_rows_per_pass_form_and_tier(rdf, tmp_path, capsys):
    rdf.main(["--results", str(tmp_path), "--rows", "8", "--row-bytes", "64", "--cache-bytes", "65536",
              "--dram-bytes", "131072", "--repeats", "2", "--min-time-s", "0.001"])
    rows = [json.loads(line) for line in (tmp_path / "bench" / "row_dot_form.jsonl").read_text().splitlines()]
    assert {(r["pass"], r["form"], r["where"]) for r in rows} == {
        (p, f, w) for p in ("4-row", "1-row") for f in ("masked", "shifted") for w in ("L3", "DRAM")}
    assert all(r["gbps"]["repeats"] == 2 and r["gbps"]["median"] > 0 and r["rows"] == 8 for r in rows)
    assert "GB/s" in capsys.readouterr().out


def test_bad_arguments_are_argparse_errors(rdf):
    with pytest.raises(SystemExit):
        rdf.main(["--rows", "1"])
