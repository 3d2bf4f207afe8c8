"""benchmarks/chain_prefetch.py: both forms of both passes compute the kernel's sums, every
(shape, pass, form) gets one JSONL row, bad shapes are argparse errors."""

import json

import numpy as np
import pytest
from conftest import load_benchmark

from tern.kernels import kernels_ternary as kt
from tern.kernels.simd import ROW_DOT_ISA

pytestmark = pytest.mark.skipif(ROW_DOT_ISA == "none", reason="needs the SIMD row passes")


@pytest.fixture(scope="module")
def cp():
    return load_benchmark("chain_prefetch")


@pytest.mark.parametrize("one_row", [False, True])
@pytest.mark.parametrize("chained", [False, True])
def test_the_cycle_leaves_the_last_matrix_sums(cp, one_row, chained):
    rng = np.random.default_rng(3)
    rows, rb = 12, 72  # a partial last segment
    mats = rng.integers(0, 256, size=(3, rows, rb), dtype=np.uint8)
    xq = rng.integers(-127, 128, size=4 * rb, dtype=np.int8)
    scale = rng.uniform(0.5, 2, rows).astype(np.float32)
    order = np.array([2, 0, 1], np.int64)
    ref, out = np.empty(rows, np.float32), np.full(rows, np.nan, np.float32)
    kt.ternary_matvec_rows(mats[1], scale, xq, np.float32(0.01), ref, one_row, True)
    cp.run_cycle(mats, order, scale, xq, out, one_row, chained)
    np.testing.assert_array_equal(out, ref)


def test_one_row_per_shape_pass_and_form(cp, tmp_path, capsys):
    cp.main(["--results", str(tmp_path), "--shapes", "8x64", "16x32", "--bytes", "65536", "--repeats", "2"])
    rows = [json.loads(line) for line in (tmp_path / "bench" / "chain_prefetch.jsonl").read_text().splitlines()]
    assert {(r["rows"], r["row_bytes"], r["pass"], r["form"]) for r in rows} == {
        (n, b, p, f) for n, b in ((8, 64), (16, 32)) for p in ("4-row", "one-row") for f in ("plain", "chained")}
    assert all(r["gbps"]["repeats"] == 2 and r["gbps"]["median"] > 0 and r["threads"] == 1 for r in rows)
    assert "GB/s" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [["--shapes", "512"], ["--shapes", "0x256"], ["--shapes", "ax4"], ["--repeats", "0"]])
def test_bad_arguments_are_argparse_errors(cp, bad):
    with pytest.raises(SystemExit):
        cp.main(bad)
