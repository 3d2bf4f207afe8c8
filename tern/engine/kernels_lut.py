"""Ternary matvec variant "lut": T-MAC-style look-up tables over groups of 4 activations.

Layout (derived from ternary2 by :func:`to_lut81`, e.g. at load time): ``codes``
(rows, ceil(cols / 4)) uint8, byte ``g`` = ``sum_k (W[r, 4g + k] + 1) * 3**k`` in 0..80
(missing weights count as 0) — still 2 bits per weight.

Per matvec the activations give one table per group of 4: ``T[g, i] = sum_k t_k(i) * q[4g+k]``
(int16, 81 entries, t_k(i) the k-th base-3 digit of i minus 1); a row's dot product is then
``sum_g T[g, codes[r, g]]`` — one load and one add per 4 weights, no multiplies. Tables are
walked in tiles of GROUP_TILE groups (10 KiB, L1-resident) across all rows of a block.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from .packing import unpack_ternary2

LUT_ENTRIES = 81
GROUP_TILE = 64  # groups per table tile: 64 * 81 * 2 bytes = 10 KiB
ROW_BLOCK = 64  # rows per parallel work item
_CHUNK_ROWS_WEIGHTS = 1 << 24


def to_lut81(packed2: np.ndarray, cols: int) -> np.ndarray:
    """Convert a ternary2-packed matrix to (rows, ceil(cols/4)) uint8 base-3 group codes."""
    ng = (cols + 3) // 4 if isinstance(cols, int) and cols > 0 else 1
    rows = packed2.shape[0] if isinstance(packed2, np.ndarray) and packed2.ndim == 2 else 1
    out = np.empty((rows, ng), dtype=np.uint8)
    step = max(1, _CHUNK_ROWS_WEIGHTS // max(cols, 1))
    for r0 in range(0, rows, step):
        wt = unpack_ternary2(packed2[r0:r0 + step], cols)  # validates; (r, cols)
        codes = np.ones((wt.shape[0], 4 * ng), dtype=np.uint8)  # (r, 4 ng), pad = code 1
        codes[:, :cols] = wt + 1
        codes = codes.reshape(wt.shape[0], ng, 4)
        out[r0:r0 + step] = codes[:, :, 0] + 3 * codes[:, :, 1] + 9 * codes[:, :, 2] + 27 * codes[:, :, 3]
    return out


@numba.njit(cache=True)
def build_tables(xq, ng):
    """Tables (ng, 81) int16: T[g, i] = sum_k (digit_k(i) - 1) * xq[4g + k]."""
    t = np.empty((ng, LUT_ENTRIES), dtype=np.int16)
    n = xq.shape[0]
    for g in range(ng):
        q = np.zeros(4, dtype=np.int16)
        for k in range(4):
            if 4 * g + k < n:
                q[k] = xq[4 * g + k]
        i = 0
        for c3 in range(-1, 2):
            for c2 in range(-1, 2):
                for c1 in range(-1, 2):
                    for c0 in range(-1, 2):
                        t[g, i] = c0 * q[0] + c1 * q[1] + c2 * q[2] + c3 * q[3]
                        i += 1
    return t


@numba.njit(cache=True, inline="always")
def _rows_lut(codes, row_scale, t, x_scale, out, r0, r1):
    ng = codes.shape[1]
    acc = np.zeros(r1 - r0, dtype=np.int32)
    for g0 in range(0, ng, GROUP_TILE):
        g1 = min(ng, g0 + GROUP_TILE)
        for r in range(r0, r1):
            s = np.int32(0)
            for g in range(g0, g1):
                s = np.int32(s + t[g, codes[r, g]])
            acc[r - r0] += s
    for r in range(r0, r1):
        out[r] = row_scale[r] * x_scale * np.float32(acc[r - r0])


@numba.njit(cache=True)
def ternary_matvec_lut(codes, row_scale, xq, x_scale, out):
    """Variant "lut": ``codes`` from :func:`to_lut81`, otherwise as ternary_matvec."""
    t = build_tables(xq, codes.shape[1])
    _rows_lut(codes, row_scale, t, x_scale, out, 0, codes.shape[0])


@numba.njit(cache=True, parallel=True)
def ternary_matvec_lut_par(codes, row_scale, xq, x_scale, out):
    """Variant "lut", blocks of ROW_BLOCK rows split over numba threads."""
    t = build_tables(xq, codes.shape[1])
    rows = codes.shape[0]
    for i in prange((rows + ROW_BLOCK - 1) // ROW_BLOCK):
        _rows_lut(codes, row_scale, t, x_scale, out, i * ROW_BLOCK, min(rows, (i + 1) * ROW_BLOCK))
