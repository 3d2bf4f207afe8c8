"""Ternary matvec variant "unpack": the portable plain-numba kernel over the ternary2 layout
(2-bit codes -> int8 weights -> int16 segment sums), for CPUs without the SIMD row passes of
tern.kernels.simd. Orientation and results as tern.kernels.kernels_ternary (which re-exports it
and makes it the default where tern.kernels.simd found no AVX2 / AVX-512)."""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from tern.kernels.cache_guard import drop_stale_cache
from tern.kernels.packing import SEGMENT_BYTES, SEGMENT_COLS

ROW_BLOCK = 16  # rows per parallel work item (as the simd variant)


# ---- variant "unpack": plain numba shifts/masks + int16 segment sums ------------------------

@numba.njit(cache=True, inline="always")
def _seg_dot_signed(packed, r, b0, g, xq, q0):
    """sum over one segment of w * q (w = code - 1); |sum| <= 256 * 127 fits int16."""
    acc = np.int16(0)
    for j in range(g):
        p = np.int16(packed[r, b0 + j])
        acc = np.int16(acc + ((p & 3) - 1) * np.int16(xq[q0 + j])
                       + (((p >> 2) & 3) - 1) * np.int16(xq[q0 + g + j])
                       + (((p >> 4) & 3) - 1) * np.int16(xq[q0 + 2 * g + j])
                       + (((p >> 6) & 3) - 1) * np.int16(xq[q0 + 3 * g + j]))
    return acc


@numba.njit(cache=True, inline="always")
def _tail_dot_signed(packed, r, b0, g, xq, q0):
    """The last, partial segment (g <= 64 bytes): slots past the end of xq are skipped."""
    acc = np.int32(0)
    n = xq.shape[0]
    for j in range(g):
        p = np.int32(packed[r, b0 + j])
        for k in range(4):
            i = q0 + g * k + j
            if i < n:
                acc = np.int32(acc + (((p >> (2 * k)) & 3) - 1) * np.int32(xq[i]))
    return acc


@numba.njit(cache=True, inline="always")
def _rows_unpack(packed, row_scale, xq, x_scale, out, r0, r1):
    nfull = xq.shape[0] // SEGMENT_COLS  # complete 256-column segments
    gtail = packed.shape[1] - nfull * SEGMENT_BYTES  # bytes of the last, partial segment (<= 64)
    for r in range(r0, r1):
        acc = np.int32(0)
        for b in range(nfull):
            acc = np.int32(acc + _seg_dot_signed(packed, r, b * SEGMENT_BYTES, SEGMENT_BYTES, xq, b * SEGMENT_COLS))
        if gtail > 0:
            acc = np.int32(acc + _tail_dot_signed(packed, r, nfull * SEGMENT_BYTES, gtail, xq, nfull * SEGMENT_COLS))
        out[r] = row_scale[r] * x_scale * np.float32(acc)


@numba.njit(cache=True)
def ternary_matvec_unpack(packed, row_scale, xq, x_scale, out):
    """Variant "unpack" (portable plain numba): 2-bit codes -> int8 weights -> int16 dot."""
    _rows_unpack(packed, row_scale, xq, x_scale, out, 0, packed.shape[0])


@numba.njit(cache=True, parallel=True)
def ternary_matvec_unpack_par(packed, row_scale, xq, x_scale, out):
    """Variant "unpack", blocks of ROW_BLOCK rows split over numba threads."""
    rows = packed.shape[0]
    for i in prange((rows + ROW_BLOCK - 1) // ROW_BLOCK):
        _rows_unpack(packed, row_scale, xq, x_scale, out, i * ROW_BLOCK, min(rows, (i + 1) * ROW_BLOCK))


drop_stale_cache(__file__, ("packing.py", "policy.py"), ternary_matvec_unpack)  # numba cache hygiene
