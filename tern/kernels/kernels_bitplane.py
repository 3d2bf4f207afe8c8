"""Ternary matvec variant "bitplane": 64-bit weight bit-planes x activation bit-planes, popcount.

Layout (derived from ternary2 by :func:`to_bitplanes`, e.g. at load time):
``planes`` (rows, 2, nw) uint64 with ``nw = ceil(cols / 64)``; bit ``c % 64`` of word
``c // 64`` is set in ``planes[r, 0]`` where W[r, c] = +1 and in ``planes[r, 1]`` where
W[r, c] = -1 (2 bits per weight, padding bits clear).

The int8 activations are split into their 8 two's-complement bit-planes X_b (8, nw), so

    sum_c W[r, c] * q[c] = sum_b s_b * (popcount(P & X_b) - popcount(M & X_b)),
    s_b = 2**b for b < 7 and s_7 = -128.

Inner loop: 16 AND + 16 POPCNT per 64 weights, vectorized by LLVM to vpopcntq on
AVX-512 VPOPCNTDQ (scalar popcnt elsewhere).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from tern.kernels.cache_guard import drop_stale_cache
from tern.kernels.packing import unpack_ternary2
from tern.kernels.simd import popcount64

ROW_BLOCK = 16  # rows per parallel work item
_CHUNK_ROWS_WEIGHTS = 1 << 24


def to_bitplanes(packed2: np.ndarray, cols: int) -> np.ndarray:
    """Convert a ternary2-packed (rows, ceil(cols/4)) matrix to (rows, 2, ceil(cols/64)) uint64."""
    rows = packed2.shape[0] if isinstance(packed2, np.ndarray) and packed2.ndim == 2 else 0
    nw = (cols + 63) // 64 if isinstance(cols, int) and cols > 0 else 0
    out = np.zeros((max(rows, 1), 2, max(nw, 1)), dtype=np.uint64)
    step = max(1, _CHUNK_ROWS_WEIGHTS // max(cols, 1))
    for r0 in range(0, max(rows, 1), step):
        wt = unpack_ternary2(packed2[r0:r0 + step], cols)  # validates; (r, cols)
        for i, val in enumerate((1, -1)):
            bits = np.zeros((wt.shape[0], nw * 64), dtype=np.uint8)  # (r, 64 nw)
            bits[:, :cols] = wt == val
            out[r0:r0 + step, i] = np.packbits(bits, axis=1, bitorder="little").view("<u8")
    return out


@numba.njit(cache=True)
def act_planes(xq, nw):
    """The 8 two's-complement bit-planes of ``xq`` (cols,) int8 as (8, nw) uint64."""
    x = np.zeros((8, nw), dtype=np.uint64)
    for c in range(xq.shape[0]):
        v = np.uint64(np.uint8(xq[c]))
        w = c // 64
        sh = np.uint64(c % 64)
        for b in range(8):
            x[b, w] |= ((v >> np.uint64(b)) & np.uint64(1)) << sh
    return x


@numba.njit(cache=True, inline="always")
def _pc(a, b):
    return np.int64(popcount64(a & b))


@numba.njit(cache=True, inline="always")
def _rows_bitplane(planes, row_scale, x, x_scale, out, r0, r1):
    nw = planes.shape[2]
    for r in range(r0, r1):
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.int64(0)
        for w in range(nw):
            p = planes[r, 0, w]
            m = planes[r, 1, w]
            a0 += _pc(p, x[0, w]) - _pc(m, x[0, w])
            a1 += _pc(p, x[1, w]) - _pc(m, x[1, w])
            a2 += _pc(p, x[2, w]) - _pc(m, x[2, w])
            a3 += _pc(p, x[3, w]) - _pc(m, x[3, w])
            a4 += _pc(p, x[4, w]) - _pc(m, x[4, w])
            a5 += _pc(p, x[5, w]) - _pc(m, x[5, w])
            a6 += _pc(p, x[6, w]) - _pc(m, x[6, w])
            a7 += _pc(p, x[7, w]) - _pc(m, x[7, w])
        acc = a0 + 2 * a1 + 4 * a2 + 8 * a3 + 16 * a4 + 32 * a5 + 64 * a6 - 128 * a7
        out[r] = row_scale[r] * x_scale * np.float32(acc)


@numba.njit(cache=True)
def ternary_matvec_bitplane(planes, row_scale, xq, x_scale, out):
    """Variant "bitplane": ``planes`` from :func:`to_bitplanes`, otherwise as ternary_matvec."""
    x = act_planes(xq, planes.shape[2])
    _rows_bitplane(planes, row_scale, x, x_scale, out, 0, planes.shape[0])


@numba.njit(cache=True, parallel=True)
def ternary_matvec_bitplane_par(planes, row_scale, xq, x_scale, out):
    """Variant "bitplane", blocks of ROW_BLOCK rows split over numba threads."""
    x = act_planes(xq, planes.shape[2])
    rows = planes.shape[0]
    for i in prange((rows + ROW_BLOCK - 1) // ROW_BLOCK):
        _rows_bitplane(planes, row_scale, x, x_scale, out, i * ROW_BLOCK, min(rows, (i + 1) * ROW_BLOCK))


# numba cache hygiene: the cached kernels above embed tern.kernels.simd's intrinsics
drop_stale_cache(__file__, ("simd.py",), act_planes)
