"""The row passes' prefetch chained into the matrix read next (tern.kernels.kernels_ternary
chain_span / ternary_matvec_next; tern.kernels.ops.bitlinear_then): which bytes it covers, and
that it changes no result."""

import numpy as np
import pytest

from tern.kernels import kernels_ternary as kt
from tern.kernels.packing import random_ternary2
from tern.kernels.prefetch import PREFETCH_MIN_BYTES
from tern.kernels.quant import quantize_act_checked
from tern.kernels.simd import ROWS_PER_DOT


def _spans(rows: int, rb: int, one_row: bool) -> list[tuple[int, int]]:
    """chain_span of every pass, in the order _rows_simd makes them (tail rows one at a time)."""
    out, r = [], 0
    while not one_row and r + ROWS_PER_DOT <= rows:
        out.append(kt.chain_span(rows, rb, r, ROWS_PER_DOT))
        r += ROWS_PER_DOT
    out += [kt.chain_span(rows, rb, q, 1) for q in range(r, rows)]
    return out


@pytest.mark.parametrize("rows, rb, one_row", [(512, 256, False), (1024, 128, False), (64, 4096, False),
                                               (30, 64, False), (7, 300, False), (512, 256, True), (3, 8192, True)])
def test_chain_span_covers_the_next_matrix_start_in_order(rows, rb, one_row):
    spans = [(lo, hi) for lo, hi in _spans(rows, rb, one_row) if hi > lo]
    assert spans, "the last passes must reach into the next matrix"
    assert spans[0][0] == 0  # from its first byte
    for (_, h0), (l1, _) in zip(spans, spans[1:], strict=False):
        assert l1 == h0  # contiguous, in order, never twice
    n_last = 1 if one_row or rows % ROWS_PER_DOT else ROWS_PER_DOT
    assert spans[-1][1] == max(PREFETCH_MIN_BYTES, n_last * rb)  # as far ahead as a pass prefetches
    # passes whose prefetch stays inside the matrix chain nothing
    assert all(hi <= 0 for lo, hi in _spans(rows, rb, one_row)[:len(_spans(rows, rb, one_row)) - len(spans)])


@pytest.mark.parametrize("rows, cols", [(512, 1024), (1024, 512), (37, 1000), (8, 4096)])
@pytest.mark.parametrize("one_row", [False, True])
@pytest.mark.parametrize("prefetch", [False, True])
def test_matvec_next_gives_the_same_sums(rows, cols, one_row, prefetch):
    rng = np.random.default_rng(rows + cols)
    packed = random_ternary2(rows, cols, seed=1)
    scale = rng.uniform(0.5, 2.0, rows).astype(np.float32)
    xq, xs = quantize_act_checked(rng.standard_normal(cols).astype(np.float32))
    ref = np.empty(rows, np.float32)
    kt.ternary_matvec_rows(packed, scale, xq, xs, ref, one_row, prefetch)
    nxt = random_ternary2(64, 256, seed=2)
    for n in (nxt, kt.NO_NEXT, nxt[:1, :0]):
        got = np.full(rows, np.nan, np.float32)
        kt.ternary_matvec_next(packed, scale, xq, xs, got, one_row, prefetch, n)
        np.testing.assert_array_equal(got, ref)


def test_the_chain_is_a_compiled_in_setting(tmp_path):
    """TERN_CHAIN_PREFETCH=0 turns the chain off at import, and the setting is in the stamp of
    every numba cache that compiles it in (via PREFETCH_STAMP / COMPILED_SETTINGS)."""
    import os
    import subprocess
    import sys

    from tern.kernels import prefetch as pf

    assert pf.CHAIN_PREFETCH and "chain=True" in kt.COMPILED_SETTINGS
    code = "import tern.kernels.kernels_ternary as K, tern.kernels.ops as O; print(O.CHAIN_PREFETCH, K.COMPILED_SETTINGS)"
    for value, on in (("0", False), ("1", True)):
        env = {**os.environ, "TERN_CHAIN_PREFETCH": value, "NUMBA_CACHE_DIR": str(tmp_path / value)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
        assert out[0] == str(on) and f"chain={on}" in out[1].split(";")
    assert pf.chain_setting(" 0 ") is False and pf.chain_setting("1") is True
    for bad in ("off", "yes", "", "2"):
        with pytest.raises(ValueError, match="TERN_CHAIN_PREFETCH"):
            pf.chain_setting(bad)
    env = {**os.environ, "TERN_CHAIN_PREFETCH": "off", "NUMBA_CACHE_DIR": str(tmp_path / "bad")}
    r = subprocess.run([sys.executable, "-c", "import tern.kernels.prefetch"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "TERN_CHAIN_PREFETCH must be 0 or 1" in r.stderr
