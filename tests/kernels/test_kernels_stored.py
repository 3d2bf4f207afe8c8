"""Embedding / head / router matrices read as stored (tern.kernels.kernels_stored): fp16 and
bf16 widened in registers give exactly the fp32 kernels' results on the converted matrix."""

import numba
import numpy as np
import pytest

from tern.kernels.kernels_dense import matvec_fp32_nb
from tern.kernels.kernels_stored import (
    DENSE_BF16,
    DENSE_FP16,
    DENSE_FP32,
    DENSE_INT8,
    JIT,
    dense_matvec,
    dense_row,
    router_logits,
)

SHAPES = [(1, 1), (5, 48), (97, 100), (64, 256), (300, 1000)]


@numba.njit(**JIT)
def _route_loop(Wr, xn, out):
    """The fp32 router loop the engine ran before this module (tern.kernels.ops.route)."""
    for e in range(Wr.shape[0]):
        s = np.float32(0.0)
        for d in range(Wr.shape[1]):
            s += Wr[e, d] * xn[d]
        out[e] = s


def _stored(kind, rng, rows, cols):
    """(bytes as the file holds them, the exact fp32 matrix they decode to)."""
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if kind == DENSE_FP16:
        h = w.astype(np.float16)
        return h.view(np.uint8).reshape(-1), h.astype(np.float32)
    if kind == DENSE_BF16:
        b = (w.view(np.uint32) >> 16).astype(np.uint16)  # bf16: the upper 16 bits
        return b.view(np.uint8).reshape(-1), (b.astype(np.uint32) << 16).view(np.float32)
    return w.view(np.uint8).reshape(-1), w


@pytest.mark.parametrize("kind", [DENSE_FP16, DENSE_BF16, DENSE_FP32])
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_widened_matvec_is_the_fp32_kernel_bit_for_bit(kind, rows, cols):
    rng = np.random.default_rng(rows * 7 + cols)
    raw, w32 = _stored(kind, rng, rows, cols)
    x = rng.standard_normal(cols).astype(np.float32)
    want = np.zeros(rows, np.float32)
    matvec_fp32_nb(w32, x, want)
    aux = np.zeros(64, np.uint8)
    for parallel in (False, True):
        got = np.full(rows, np.nan, np.float32)
        dense_matvec(raw, aux, kind, 0, -1, rows, cols, x, got, parallel)  # address 0: the file buffer
        assert np.array_equal(got, want)
    r = rows // 2
    row = np.full(cols, np.nan, np.float32)
    dense_row(aux, raw, kind, 1, -1, r, cols, row)  # address 1: the aux buffer
    assert np.array_equal(row, w32[r])
    want_r = np.zeros(rows, np.float32)
    _route_loop(w32, x, want_r)
    got_r = np.full(rows, np.nan, np.float32)
    router_logits(raw, aux, kind, 0, rows, cols, x, got_r)
    assert np.array_equal(got_r, want_r)


def test_int8_rows_and_matvec_apply_the_row_scale():
    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, size=(6, 40)).astype(np.int8)
    s = rng.uniform(0.01, 0.1, 6).astype(np.float32)
    buf = np.concatenate([q.reshape(-1).view(np.uint8), s.view(np.uint8)])
    x = rng.standard_normal(40).astype(np.float32)
    out = np.zeros(6, np.float32)
    dense_matvec(buf, buf, DENSE_INT8, 0, 2 * q.size, 6, 40, x, out, False)
    np.testing.assert_allclose(out, (q.astype(np.float64) @ x) * s, rtol=1e-5)
    row = np.zeros(40, np.float32)
    dense_row(buf, buf, DENSE_INT8, 0, 2 * q.size, 3, 40, row)
    assert np.array_equal(row, q[3].astype(np.float32) * s[3])
