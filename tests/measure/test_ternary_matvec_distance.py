"""benchmarks/ternary_matvec.py --prefetch-distance: the row passes compiled per prefetch
distance compute the engine kernel's sums, every (pass, distance, threads, matrix) gets one
JSONL row, and a bad distance is a clear argparse error; --row-length adds the default
kernel's cache-resident rows (section rowlen_cache)."""

import json

import numpy as np
import pytest
from conftest import load_benchmark

from tern.kernels import kernels_ternary as kt
from tern.kernels.packing import random_ternary2
from tern.kernels.prefetch import ROW_PREFETCH_LEVEL

pytestmark = pytest.mark.skipif(kt.DEFAULT_VARIANT != "simd", reason="the row passes need AVX2 / AVX-512")


@pytest.fixture(scope="module")
def tm():
    return load_benchmark("ternary_matvec")


def test_distance_passes_compute_the_kernels_sums(tm):
    rows, cols = 48, 1408 * 4
    packed = random_ternary2(rows, cols, seed=2)
    xq = np.random.default_rng(3).integers(-127, 128, size=cols, dtype=np.int8)
    ref = np.empty(rows, np.float32)
    kt.ternary_matvec(packed, np.ones(rows, np.float32), xq, np.float32(1), ref)
    for distance in (0, 4096, 8192):  # 0: compiled without software prefetch
        for name, fns in tm.distance_passes(distance).items():
            for fn in fns:  # 1-thread and parallel
                out = np.full(rows, np.nan, np.float32)
                fn(packed, xq, out)
                assert np.array_equal(out, ref), (distance, name)


def test_distance_section_rows(tm, tmp_path, capsys):
    out = tmp_path / "k.jsonl"
    tm.main(["--prefetch-distance", "4096,8192", "--threads", "1", "--row-bytes", "256",
             "--dram-bytes", "1", "--repeats", "2", "--min-time-s", "0.002", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    read = [r for r in rows if r["kernel"] == "read_bandwidth"]
    rows = [r for r in rows if r["kernel"] != "read_bandwidth"]
    got = {(r["kernel"], r["prefetch_bytes"], r["working_set_bytes"]) for r in rows}
    sizes = {r["working_set_bytes"] for r in rows}
    assert len(sizes) == 2 and len(rows) == 2 * 2 * 2 == len(got)  # 2 passes x 2 distances x 2 matrices
    big = max(sizes)  # the "DRAM" matrix: the read kernel's ceiling beside it, each pass a share of it
    assert len(read) == 1 and read[0]["section"] == "distance" and read[0]["gbps"]["median"] > 0
    for r in rows:
        assert r["section"] == "distance" and r["row_bytes"] == 256 and r["threads"] == 1
        assert r["gbps"]["repeats"] == 2 and r["gbps"]["median"] > 0
        assert r["prefetch_level"] == ROW_PREFETCH_LEVEL
        assert ("pct_of_read_gbps" in r) == (r["working_set_bytes"] == big)
        if r["working_set_bytes"] == big:
            assert r["pct_of_read_gbps"] == pytest.approx(100 * r["gbps"]["median"] / read[0]["gbps"]["median"])
    assert f"prefetch 8192 B ahead into {ROW_PREFETCH_LEVEL}" in capsys.readouterr().out


def test_distance_section_crosses_levels_with_distances(tm, tmp_path):
    """--prefetch-level l1,l2: each nonzero distance once per level, 0 (no prefetch) once."""
    out = tmp_path / "k.jsonl"
    tm.main(["--prefetch-distance", "0,8192", "--prefetch-level", "l1,l2", "--threads", "1", "--row-bytes", "512",
             "--dram-bytes", "1", "--repeats", "1", "--min-time-s", "0.002", "--no-dram", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines() if '"read_bandwidth"' not in line]
    got = sorted({(r["kernel"], r["prefetch_bytes"], r["prefetch_level"] or "") for r in rows})
    assert got == sorted((k, d, lv) for k in ("ternary2", "ternary2_stream")
                         for d, lv in ((0, ""), (8192, "l1"), (8192, "l2")))


def test_row_passes_compiled_per_level_compute_the_same_sums(tm):
    rows, cols = 32, 2048
    packed = random_ternary2(rows, cols, seed=4)
    xq = np.random.default_rng(5).integers(-127, 128, size=cols, dtype=np.int8)
    outs = []
    for level in ("l1", "l2"):
        for fns in tm.distance_passes(4096, level).values():
            out = np.full(rows, np.nan, np.float32)
            fns[0](packed, xq, out)
            outs.append(out)
    assert all(np.array_equal(o, outs[0]) for o in outs)


@pytest.mark.parametrize("bad", ["l3", "l1,l1", "", "L2,x"])
def test_bad_level_is_a_clear_error(tm, bad, capsys):
    with pytest.raises(SystemExit):
        tm.main(["--prefetch-distance", "8192", "--prefetch-level", bad, "--out", ""])
    assert "--prefetch-level" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["100", "-64", "4k", ",", "0,64,0"])
def test_bad_distance_is_a_clear_error(tm, bad, capsys):
    with pytest.raises(SystemExit):
        tm.main(["--prefetch-distance", bad, "--out", ""])
    assert "--prefetch-distance" in capsys.readouterr().err


def test_rowlen_section_has_a_cache_resident_row_per_row_length(tm, tmp_path):
    assert [tm.cache_rows(b) for b in (128, 256, 1024, 8192, 65536)] == [1024, 512, 128, 16, 16]
    out = tmp_path / "r.jsonl"
    tm.main(["--row-length", "--threads", "1", "--row-bytes", "256,1024", "--dram-bytes", "1",
             "--repeats", "2", "--min-time-s", "0.002", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    cache = [r for r in rows if r["section"] == "rowlen_cache"]
    assert {(r["rows"], r["cols"]) for r in cache} == {(512, 1024), (128, 4096)}
    assert all(r["kernel"] == f"ternary_{kt.DEFAULT_VARIANT}" and r["gbps"]["median"] > 0 for r in cache)
    assert {r["section"] for r in rows} == {"rowlen", "rowlen_cache"}
