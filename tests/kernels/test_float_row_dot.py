"""tern.kernels.kernels_dense.float_row_dot: the IR row dot of the fp32 / fp16 / bf16 dense
kernels: right sums at every column count (whole blocks and the tail), one order for every
kind (a stored fp16 / bf16 row sums as its fp32 conversion, bit for bit), and which fp16
rows the stored kernels prefetch."""

import numba
import numpy as np
import pytest

from tern.kernels import kernels_stored as ks
from tern.kernels.kernels_dense import DOT_ACCS, DOT_LANES, row_dot_bf16, row_dot_fp16, row_dot_fp32


def _rows_of(dot):
    @numba.njit
    def rows(W, x):
        out = np.empty(W.shape[0], np.float32)
        for r in range(W.shape[0]):
            out[r] = dot(W, r, x)
        return out
    return rows


_ROWS = {row_dot_fp32: _rows_of(row_dot_fp32), row_dot_fp16: _rows_of(row_dot_fp16), row_dot_bf16: _rows_of(row_dot_bf16)}


def _dots(dot, W, x):
    return _ROWS[dot](W, x)


@pytest.mark.parametrize("cols", [1, 15, 63, 64, 65, 130, 1000, 2048])
def test_sums_at_every_column_count(cols):
    rng = np.random.default_rng(cols)
    w = rng.standard_normal((5, cols)).astype(np.float32)
    x = rng.standard_normal(cols).astype(np.float32)
    ref = w.astype(np.float64) @ x.astype(np.float64)
    got32 = _dots(row_dot_fp32, w, x)
    np.testing.assert_allclose(got32, ref, rtol=1e-5, atol=1e-4 * np.sqrt(cols))
    h = w.astype(np.float16)
    if ks.HAS_F16C:
        assert np.array_equal(_dots(row_dot_fp16, h.view(np.uint16), x), _dots(row_dot_fp32, h.astype(np.float32), x))
    b = (w.view(np.uint32) >> 16).astype(np.uint16)
    w_b = (b.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(_dots(row_dot_bf16, b, x), _dots(row_dot_fp32, w_b, x))


def test_the_order_is_the_blocked_one():
    """Integers large and small placed so that only the documented order gives this sum:
    lane sums of DOT_ACCS accumulators, then lanes in order, then the tail."""
    block = DOT_ACCS * DOT_LANES
    cols = block + 3
    w = np.ones((1, cols), np.float32)
    x = np.zeros(cols, np.float32)
    x[0], x[DOT_LANES] = 2.0**24, 1.0  # accumulators 0 and 1, lane 0: 2**24 + 1 rounds to 2**24
    x[1] = -(2.0**24)  # lane 1, added after lane 0's sum
    x[block:] = 1.0  # the tail, one by one
    got = _dots(row_dot_fp32, w, x)[0]
    lane0 = np.float32(np.float32(2.0**24) + np.float32(1.0))  # 2**24 (ties to even)
    want = np.float32(np.float32(lane0 - np.float32(2.0**24)) + 3.0)
    assert got == want == 3.0


def test_rejects_what_it_cannot_read():
    x = np.ones(8, np.float32)
    with pytest.raises(numba.core.errors.TypingError):
        _dots(row_dot_fp32, np.ones((2, 8), np.float64), x)
    with pytest.raises(numba.core.errors.TypingError):
        _dots(row_dot_fp16, np.ones((2, 16), np.uint16)[:, ::2], x)


def test_fp16_rows_longer_than_the_l2_setting_are_not_prefetched():
    from tern.kernels.prefetch import DENSE_L2_MAX_ROW_BYTES

    short = np.zeros((10, DENSE_L2_MAX_ROW_BYTES // 2), np.uint16)
    long = np.zeros((10, DENSE_L2_MAX_ROW_BYTES // 2 + 1), np.uint16)
    stop = numba.njit(lambda W: ks._w16_prefetch_stop(W))
    assert stop(short) == 10 and stop(long) == 0
