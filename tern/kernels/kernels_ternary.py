"""Ternary matvec kernels over the ternary2 layout (see tern.kernels.packing).

Orientation: ``packed`` is (rows, ternary2_row_bytes(cols)) uint8 holding W (rows = output
units, cols = inputs), ``row_scale`` (rows,) float32, ``xq`` (cols,) int8 and ``x_scale``
float32 from tern.kernels.quant.quantize_act; ``out`` (rows,) float32 receives

    out[r] = row_scale[r] * x_scale * sum_c Wt[r, c] * xq[c]

with the integer sum exact (int32; cols <= MAX_COLS). All kernels here are
``@njit(cache=True)``, callable from other njit code, and assume validated inputs;
:func:`ternary_matvec_checked` is the validating Python wrapper (:func:`check_matvec_args`
the check alone). The activation-skip kernels read the TRANSPOSED orientation (see the
section below). Variants, layouts and the default rule: tern.probe.ternary_variants.
"""

from __future__ import annotations

import os

import numba
import numpy as np
from numba import prange

from tern.kernels.cache_guard import drop_stale_cache
from tern.kernels.kernels_unpack import ternary_matvec_unpack, ternary_matvec_unpack_par  # noqa: F401  (variant "unpack")
from tern.kernels.prefetch import (
    CACHE_LINE_BYTES,
    LINE_PREFETCH,
    PREFETCH_MIN_BYTES,
    PREFETCH_STAMP,
    prefetch_line,
    prefetch_line_l2,
    skip_prefetch_setting,
)
from tern.kernels.simd import (
    ROW_DOT_ISA,
    ROWS_PER_DOT,
    SKIP_CHUNK_BYTES,
    row_codes_dot,
    row_codes_dot_pf,
    rows_codes_dot,
    rows_codes_dot_pf,
    skip_chunk,
)

# Launch numba's threading layer at import: the plain-njit wrappers below (ternary_matvec_par,
# ...) call parallel kernels, and such a call loaded from the on-disk cache segfaults when the
# layer is not up yet (a parallel=True function called directly would launch it itself).
numba.get_num_threads()

SEG_COLS, SEG_BYTES = 256, 64  # columns and packed bytes of one segment (one 64-byte load)
# Inputs per row with exact int32 sums (group k's codes x 4**k: an int32 lane adds 8 x 128 x 127 per segment): 4,227,328
MAX_COLS = SEG_COLS * ((2**31 - 1) // (8 * 128 * 127))
ROW_BLOCK = 16  # rows per parallel work item
SKIP_GROUP_BLOCK = 2  # groups of 4 nonzero inputs per pass of the skip kernel (8 rows: streaming reads)
# Skip kernel prefetch: groups (4 rows) ahead, whole rows into L2 (prefetcht1) or L1: 4 into L2 read 1.69x faster than
# 2 into L1 from DRAM on Zen 4 (tern.kernels.prefetch). TERN_SKIP_PREFETCH="GROUPS,l1|l2" overrides (skip_prefetch.py)
SKIP_PREFETCH_GROUPS, SKIP_PREFETCH_LEVEL = skip_prefetch_setting(os.environ.get("TERN_SKIP_PREFETCH", "4,l2"))
_skip_prefetch = LINE_PREFETCH[SKIP_PREFETCH_LEVEL]
SKIP_PAR_SEGS = 2  # 256-output segments per parallel work item of the skip kernel
# Software prefetch in the "simd" row passes (tern.kernels.prefetch; same sums). Zen 5, benchmarks/ternary_matvec.py
# --prefetch, GB/s off -> on at 1 / 2 threads: 4-row pass from DRAM 18.5 -> 30.5 / 32.3 -> 40.3, in cache 75 -> 81 /
# 142 -> 151; one-row pass from DRAM 16.2 -> 18.8 / 31.0 -> 36.3. The 4-row passes take ROW_PREFETCH (TERN_ROW_PREFETCH
# =0 / 1 overrides it at import). The engine's one-row pass takes it as an argument: on Zen 4 it ran faster from DRAM
# without, so the probe times both (tern.core.engine_tuning). COMPILED_SETTINGS: import-time settings in the cache stamps.
ROW_PREFETCH_DEFAULT = True
ROW_PREFETCH = os.environ.get("TERN_ROW_PREFETCH", "1" if ROW_PREFETCH_DEFAULT else "0").strip() not in ("0", "")
COMPILED_SETTINGS = f"pf={ROW_PREFETCH},{SKIP_PREFETCH_GROUPS},{SKIP_PREFETCH_LEVEL};{PREFETCH_STAMP}"


@numba.njit(cache=True)
def act_sum(xq):
    """sum(xq) as int32 (the kernels sum code * xq with code = w + 1, then subtract it)."""
    s = np.int32(0)
    for i in range(xq.shape[0]):
        s = np.int32(s + xq[i])
    return s


# ---- variant "simd": the same unpack with vpdpbusd / vpmaddubsw (tern.kernels.simd) ---------

NO_NEXT = np.zeros((1, 0), np.uint8)  # the row passes' ``nxt`` when no matrix is read next (nothing chained)


@numba.njit(cache=True, inline="always")
def chain_span(rows, rb, r, n):
    """Bytes [lo, hi) of the next matrix the pass over rows r .. r+n-1 of a (rows, rb) packed matrix prefetches
    (hi <= lo: none). A pass prefetches max(PREFETCH_MIN_BYTES, n * rb) bytes ahead of its rows; :func:`_chain_prefetch`
    carries what falls past the matrix's end into the matrix read next: its first bytes in order (all at r = 0 when
    the matrix is shorter than that distance)."""
    ahead = max(PREFETCH_MIN_BYTES, n * rb)
    end = rows * rb
    return max(r * rb + ahead - end, 0) if r else 0, (r + n) * rb + ahead - end


@numba.njit(cache=True, inline="always")
def _chain_prefetch(packed, r, n, nxt):
    """chain_span's bytes of ``nxt`` (2-D uint8, C order; NO_NEXT: none) into L2. Over scattered
    128 KB matrices from DRAM (Zen 4, 1 thread) the 4-row pass read 21.5 -> 23.4 GB/s with it."""
    lo, hi = chain_span(packed.shape[0], packed.shape[1], r, n)
    for off in range(lo & -CACHE_LINE_BYTES, min(hi, nxt.size), CACHE_LINE_BYTES):
        prefetch_line_l2(nxt, 0, off)


@numba.njit(cache=True, inline="always")
def _rows_stream(packed, row_scale, xq, qsum, x_scale, out, r0, r1, prefetch, nxt):
    """Rows r0..r1-1 one at a time in address order, one sequential read stream (also the 4-row pass's tail
    rows). From DRAM the hardware prefetcher follows the 4-row pass's 4 streams badly once rows pass a few hundred
    bytes (Zen 4, benchmarks/ternary_matvec.py --row-length: 7-10 GB/s at 512 B - 8 KB rows, this form 18-21, ~15 %
    slower in cache). Used per tern.kernels.policy.stream_row_bytes. ``prefetch``: see ROW_PREFETCH."""
    nfull = xq.shape[0] // SEG_COLS
    gtail = packed.shape[1] - nfull * SEG_BYTES
    for r in range(r0, r1):
        if prefetch:
            _chain_prefetch(packed, r, 1, nxt)
        d = row_codes_dot_pf(packed, r, xq, nfull, gtail) if prefetch else row_codes_dot(packed, r, xq, nfull, gtail)
        out[r] = row_scale[r] * x_scale * np.float32(np.int32(d - qsum))


@numba.njit(cache=True, inline="always")
def _rows_simd(packed, row_scale, xq, qsum, x_scale, out, r0, r1, one_row, prefetch, nxt):
    """Rows r0..r1-1: ROWS_PER_DOT rows per pass over xq, or (``one_row``) _rows_stream's form; ``prefetch``: see
    ROW_PREFETCH; ``nxt``: the matrix read next (_chain_prefetch)."""
    nfull = xq.shape[0] // SEG_COLS  # complete 256-column segments
    gtail = packed.shape[1] - nfull * SEG_BYTES  # bytes of the last, partial segment (<= 64)
    r = r0
    while not one_row and r + ROWS_PER_DOT <= r1:  # ROWS_PER_DOT rows per pass over xq
        if prefetch:
            _chain_prefetch(packed, r, ROWS_PER_DOT, nxt)
        sums = rows_codes_dot_pf(packed, r, xq, nfull, gtail) if prefetch else rows_codes_dot(packed, r, xq, nfull, gtail)
        for i in range(ROWS_PER_DOT):
            out[r + i] = row_scale[r + i] * x_scale * np.float32(np.int32(sums[i] - qsum))
        r += ROWS_PER_DOT
    _rows_stream(packed, row_scale, xq, qsum, x_scale, out, r, r1, prefetch, nxt)


@numba.njit(cache=True, parallel=True)
def _simd_par(packed, row_scale, xq, x_scale, out, one_row, prefetch):
    qsum = act_sum(xq)
    rows = packed.shape[0]
    for i in prange((rows + ROW_BLOCK - 1) // ROW_BLOCK):
        _rows_simd(packed, row_scale, xq, qsum, x_scale, out, i * ROW_BLOCK, min(rows, (i + 1) * ROW_BLOCK),
                   one_row, prefetch, NO_NEXT)


@numba.njit(cache=True)
def ternary_matvec_simd(packed, row_scale, xq, x_scale, out):
    """Variant "simd" (x86 with AVX2 or AVX-512): 64-byte loads, shift+mask to u8 codes,
    u8 x s8 dot products (vpdpbusd with VNNI), minus sum(xq)."""
    _rows_simd(packed, row_scale, xq, act_sum(xq), x_scale, out, 0, packed.shape[0], False, ROW_PREFETCH, NO_NEXT)


@numba.njit(cache=True)
def ternary_matvec_simd_par(packed, row_scale, xq, x_scale, out):
    """Variant "simd", blocks of ROW_BLOCK rows split over numba threads."""
    _simd_par(packed, row_scale, xq, x_scale, out, False, ROW_PREFETCH)


@numba.njit(cache=True)
def ternary_matvec_rows(packed, row_scale, xq, x_scale, out, one_row, prefetch):
    """Variant "simd", ``one_row`` (the streaming pass) and ``prefetch`` as arguments (same sums; A/Bs)."""
    _rows_simd(packed, row_scale, xq, act_sum(xq), x_scale, out, 0, packed.shape[0], one_row, prefetch, NO_NEXT)


@numba.njit(cache=True)
def ternary_matvec_then(packed, row_scale, xq, x_scale, out, one_row, prefetch, nxt):
    """ternary_matvec_rows whose prefetch runs on past this matrix into ``nxt`` (2-D uint8, C order), the packed
    matrix read after it (_chain_prefetch; NO_NEXT: none). A hint: the same sums."""
    _rows_simd(packed, row_scale, xq, act_sum(xq), x_scale, out, 0, packed.shape[0], one_row, prefetch, nxt)


@numba.njit(cache=True)
def ternary_matvec_rows_par(packed, row_scale, xq, x_scale, out, one_row, prefetch):
    """ternary_matvec_rows over numba threads (blocks of ROW_BLOCK rows)."""
    _simd_par(packed, row_scale, xq, x_scale, out, one_row, prefetch)


@numba.njit(cache=True)
def ternary_matvec_simd_stream(packed, row_scale, xq, x_scale, out):
    """Variant "simd", one row per pass (one sequential read stream; see _rows_stream)."""
    _rows_simd(packed, row_scale, xq, act_sum(xq), x_scale, out, 0, packed.shape[0], True, ROW_PREFETCH, NO_NEXT)


@numba.njit(cache=True)
def ternary_matvec_simd_stream_par(packed, row_scale, xq, x_scale, out):
    """Variant "simd", one row per pass, blocks of ROW_BLOCK rows split over numba threads."""
    _simd_par(packed, row_scale, xq, x_scale, out, True, ROW_PREFETCH)


# ---- default ---------------------------------------------------------------------------------
# Rule (Zen 4, benchmarks/ternary_matvec.py; tern.probe.ternary_variants): "simd" where tern.kernels.simd found
# AVX2 / AVX-512 at import, else the portable "unpack" (both read the stored layout; calibrate_kernels re-measures).
DEFAULT_VARIANT = "simd" if ROW_DOT_ISA != "none" else "unpack"

_DEFAULT = ternary_matvec_simd if DEFAULT_VARIANT == "simd" else ternary_matvec_unpack
_DEFAULT_PAR = ternary_matvec_simd_par if DEFAULT_VARIANT == "simd" else ternary_matvec_unpack_par


@numba.njit(cache=True)
def _unpack_rows(packed, row_scale, xq, x_scale, out, one_row, prefetch):
    """Variant "unpack" in ternary_matvec_rows's signature (it reads rows in address order)."""
    ternary_matvec_unpack(packed, row_scale, xq, x_scale, out)


@numba.njit(cache=True)
def _unpack_rows_par(packed, row_scale, xq, x_scale, out, one_row, prefetch):
    ternary_matvec_unpack_par(packed, row_scale, xq, x_scale, out)


@numba.njit(cache=True)
def _unpack_then(packed, row_scale, xq, x_scale, out, one_row, prefetch, nxt):
    ternary_matvec_unpack(packed, row_scale, xq, x_scale, out)


_ROWS = ternary_matvec_rows if DEFAULT_VARIANT == "simd" else _unpack_rows
_THEN = ternary_matvec_then if DEFAULT_VARIANT == "simd" else _unpack_then
_ROWS_PAR = ternary_matvec_rows_par if DEFAULT_VARIANT == "simd" else _unpack_rows_par


@numba.njit(cache=True)
def ternary_matvec(packed, row_scale, xq, x_scale, out):
    """Default single-thread ternary matvec (DEFAULT_VARIANT on this CPU)."""
    _DEFAULT(packed, row_scale, xq, x_scale, out)


@numba.njit(cache=True)
def ternary_matvec_par(packed, row_scale, xq, x_scale, out):
    """Default multi-thread ternary matvec (threads: numba.set_num_threads by the caller)."""
    _DEFAULT_PAR(packed, row_scale, xq, x_scale, out)


@numba.njit(cache=True)
def ternary_matvec_stream(packed, row_scale, xq, x_scale, out, prefetch):
    """Default single-thread streaming ternary matvec (rows in address order; the "unpack"
    variant already reads that way); ``prefetch``: the simd pass's software prefetch."""
    _ROWS(packed, row_scale, xq, x_scale, out, True, prefetch)


@numba.njit(cache=True)
def ternary_matvec_next(packed, row_scale, xq, x_scale, out, one_row, prefetch, nxt):
    """Default single-thread ternary matvec, the 4-row (or with ``one_row`` the streaming) pass, whose software
    prefetch runs on into ``nxt``, the packed matrix read next (ternary_matvec_then; the "unpack" variant ignores it)."""
    _THEN(packed, row_scale, xq, x_scale, out, one_row, prefetch, nxt)


@numba.njit(cache=True)
def ternary_matvec_stream_par(packed, row_scale, xq, x_scale, out, prefetch):
    """Default multi-thread streaming ternary matvec."""
    _ROWS_PAR(packed, row_scale, xq, x_scale, out, True, prefetch)


# ---- activation skip (transposed orientation) -----------------------------------------------
# Orientation of every skip kernel: ``packed_t`` is W.T packed with pack_ternary2, i.e.
# (cols, ternary2_row_bytes(rows)) — one packed row per INPUT unit c holding W[:, c];
# ``row_scale`` (rows,) is the per-output-row scale of the original W; ``xq`` (cols,),
# ``out`` (rows,). They compute out[d] = row_scale[d] * x_scale * sum_{c: xq[c] != 0} xq[c] * W[d, c]
# and never read the packed rows of inputs whose xq[c] == 0.


@numba.njit(cache=True)
def skip_groups(xq):
    """Nonzero inputs in groups of 4: ``(idx (4 * ng,) int64, qq (ng,) int32: 4 activation bytes, qsum int32)``; pads: row 0,
    activation 0. Branch-free: each input is stored at the next free slot, which only a nonzero one advances (a token's
    zeros move every token: a branch per input mispredicted, 4.5 against 1.1 us for 2,048 inputs at 25 % nonzero on the
    Zen 5 VM, session 49; benchmarks/skip_patterns.py)."""
    nz = 0
    for c in range(xq.shape[0]):
        nz += np.int64(xq[c] != 0)
    m = 4 * ((nz + 3) // 4)
    idx, qb = np.empty(m + 1, dtype=np.int64), np.empty(m + 1, dtype=np.int8)  # slot m: a sink; all set below
    qsum, i = np.int32(0), 0
    for c in range(xq.shape[0]):
        idx[i], qb[i] = c, xq[c]  # i <= nz <= m
        qsum = np.int32(qsum + xq[c])
        i += np.int64(xq[c] != 0)
    idx[nz:] = 0  # the pads and the sink: a zero's store may have landed there
    qb[nz:] = 0
    return idx[:m], qb[:m].view(np.int32), qsum


@numba.njit(cache=True)
def ternary_matvec_skip_plain(packed_t, row_scale, xq, x_scale, out):
    """Skip kernel in plain numba (portable): nonzero inputs 4 at a time (skip_groups), per segment and 2-bit
    slot one contiguous loop LLVM vectorises (SSE / NEON). Zen 5 compiling for Nehalem, 25 % nonzero, 512 x 2048:
    28.8 us against 116.7 for the earlier per-input scalar form and 64 for the dense row pass."""
    rows, rb = out.shape[0], packed_t.shape[1]
    idx, qq, qsum = skip_groups(xq)
    qb = qq.view(np.int8)  # (4 * ng,) the group's activations, padding entries 0
    acc = np.zeros(4 * rb, dtype=np.int32)  # slot order of the ternary2 layout
    nfull = rows // SEG_COLS
    gtail = rb - nfull * SEG_BYTES
    for i in range(0, idx.shape[0], 4):
        p0, p1, p2, p3 = packed_t[idx[i]], packed_t[idx[i + 1]], packed_t[idx[i + 2]], packed_t[idx[i + 3]]
        q0, q1, q2, q3 = np.int32(qb[i]), np.int32(qb[i + 1]), np.int32(qb[i + 2]), np.int32(qb[i + 3])
        for b in range(nfull + (1 if gtail > 0 else 0)):
            g, b0 = (SEG_BYTES if b < nfull else gtail), b * SEG_BYTES
            for k in range(4):
                sh = 2 * k
                a = acc[b * SEG_COLS + k * g: b * SEG_COLS + (k + 1) * g]  # (g,) outputs of slot k
                for j in range(g):
                    a[j] += ((((np.int32(p0[b0 + j]) >> sh) & 3) * q0 + ((np.int32(p1[b0 + j]) >> sh) & 3) * q1)
                             + (((np.int32(p2[b0 + j]) >> sh) & 3) * q2 + ((np.int32(p3[b0 + j]) >> sh) & 3) * q3))
    for d in range(rows):
        out[d] = row_scale[d] * x_scale * np.float32(np.int32(acc[d] - qsum))


@numba.njit(cache=True, inline="always")
def _skip_segments(packed_t, idx, qq, qsum, row_scale, x_scale, out, s0, s1):
    """All nonzero inputs into the outputs of 256-output segments s0 <= seg < s1. Blocks of SKIP_GROUP_BLOCK
    input groups are the outer loop, so the rows read at a time (a few hundred KB) stay in L2 for every segment."""
    rows = out.shape[0]
    nfull = rows // SEG_COLS
    nch = SEG_BYTES // SKIP_CHUNK_BYTES
    acc = np.zeros((s1 - s0, nch, 4 * SKIP_CHUNK_BYTES), dtype=np.int32)
    ng = qq.shape[0]
    b_lo, b_hi = s0 * SEG_BYTES, min(s1 * SEG_BYTES, packed_t.shape[1])  # bytes of each row used
    whole = b_lo == 0 and b_hi == packed_t.shape[1]  # whole rows (one thread's call) or part rows (split)
    for g0 in range(0, ng, SKIP_GROUP_BLOCK):
        g1 = min(ng, g0 + SKIP_GROUP_BLOCK)
        # scattered rows: fetch a block's SKIP_PREFETCH_GROUPS ahead while this one computes; whole rows at
        # SKIP_PREFETCH_LEVEL, part rows (output segments split over threads) into L1 (into L2: 0.70x, Zen 4, 2 threads)
        for gp in range(g0 + SKIP_PREFETCH_GROUPS, min(ng, g1 + SKIP_PREFETCH_GROUPS)):
            for t in range(4):
                for b in range(b_lo, b_hi, 64):
                    if whole:
                        _skip_prefetch(packed_t, idx[4 * gp + t], b)
                    else:
                        prefetch_line(packed_t, idx[4 * gp + t], b)
        for seg in range(s0, s1):
            g = SEG_BYTES if seg < nfull else packed_t.shape[1] - nfull * SEG_BYTES
            for h in range((g + SKIP_CHUNK_BYTES - 1) // SKIP_CHUNK_BYTES):
                h0 = h * SKIP_CHUNK_BYTES
                skip_chunk(packed_t, idx, qq, g0, g1, seg * SEG_BYTES + h0, min(SKIP_CHUNK_BYTES, g - h0),
                           acc[seg - s0, h])
    for seg in range(s0, s1):
        g = SEG_BYTES if seg < nfull else packed_t.shape[1] - nfull * SEG_BYTES
        for h in range((g + SKIP_CHUNK_BYTES - 1) // SKIP_CHUNK_BYTES):
            h0 = h * SKIP_CHUNK_BYTES
            for k in range(4):  # outputs d0 .. d0 + n - 1 (the padding past ``rows`` dropped), contiguous: vectorised
                d0 = seg * SEG_COLS + g * k + h0
                n = max(0, min(SKIP_CHUNK_BYTES, g - h0, rows - d0))
                a, o, r = acc[seg - s0, h, k * SKIP_CHUNK_BYTES:k * SKIP_CHUNK_BYTES + n], out[d0:d0 + n], row_scale[d0:d0 + n]
                for j in range(n):
                    o[j] = r[j] * x_scale * np.float32(np.int32(a[j] - qsum))


@numba.njit(cache=True)
def ternary_matvec_skip_simd(packed_t, row_scale, xq, x_scale, out):
    """Skip kernel with SIMD (x86): nonzero inputs 4 at a time, code bytes interleaved (one vpdpbusd: 4 x 16)."""
    idx, qq, qsum = skip_groups(xq)
    nseg = (packed_t.shape[1] + SEG_BYTES - 1) // SEG_BYTES
    _skip_segments(packed_t, idx, qq, qsum, row_scale, x_scale, out, 0, nseg)


@numba.njit(cache=True, parallel=True)
def ternary_matvec_skip_simd_par(packed_t, row_scale, xq, x_scale, out):
    """Skip kernel with SIMD, ranges of 256-output segments split over numba threads."""
    idx, qq, qsum = skip_groups(xq)
    nseg = (packed_t.shape[1] + SEG_BYTES - 1) // SEG_BYTES
    for p in prange((nseg + SKIP_PAR_SEGS - 1) // SKIP_PAR_SEGS):
        _skip_segments(packed_t, idx, qq, qsum, row_scale, x_scale, out,
                       p * SKIP_PAR_SEGS, min(nseg, (p + 1) * SKIP_PAR_SEGS))


_SKIP = ternary_matvec_skip_simd if DEFAULT_VARIANT == "simd" else ternary_matvec_skip_plain
_SKIP_PAR = ternary_matvec_skip_simd_par if DEFAULT_VARIANT == "simd" else ternary_matvec_skip_plain


@numba.njit(cache=True)
def ternary_matvec_skip(packed_t, row_scale, xq, x_scale, out):
    """Default activation-skip matvec (transposed orientation, see above)."""
    _SKIP(packed_t, row_scale, xq, x_scale, out)


@numba.njit(cache=True)
def ternary_matvec_skip_par(packed_t, row_scale, xq, x_scale, out):
    """Default activation-skip matvec over numba threads (output segments split)."""
    _SKIP_PAR(packed_t, row_scale, xq, x_scale, out)


# ---- validation and reference ---------------------------------------------------------------
def check_kernel_arrays(packed, row_scale, xq, out) -> None:
    """ValueError unless packed / row_scale / xq / out are C-contiguous 2-D uint8 / 1-D float32 / int8 / float32
    arrays (the array part of every packed matvec's check: b3, blocked16)."""
    for a, name, dtype, ndim in ((packed, "packed", np.uint8, 2), (row_scale, "row_scale", np.float32, 1),
                                 (xq, "xq", np.int8, 1), (out, "out", np.float32, 1)):
        if not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim != ndim or not a.flags.c_contiguous:
            raise ValueError(f"{name} must be a C-contiguous {ndim}-D {np.dtype(dtype).name} array, got "
                             f"{getattr(a, 'dtype', type(a))} with shape {getattr(a, 'shape', None)}")


def check_matvec_args(packed, row_scale, xq, x_scale, out, transposed: bool = False) -> None:
    """ValueError naming the problem unless the arguments fit a ternary2 matvec.

    ``transposed``: ``packed`` is W.T (the skip kernel's orientation)."""
    from tern.kernels.packing import ternary2_row_bytes

    check_kernel_arrays(packed, row_scale, xq, out)
    if packed.shape[0] < 1 or xq.shape[0] < 1:
        raise ValueError(f"empty matvec: packed {packed.shape}, xq {xq.shape}")
    if transposed:
        rows, cols = out.shape[0], packed.shape[0]
        if xq.shape[0] != cols:
            raise ValueError(f"xq has {xq.shape[0]} entries; packed_t has {cols} rows (one per input)")
        if rows < 1 or packed.shape[1] != ternary2_row_bytes(rows):
            raise ValueError(f"packed_t rows hold {packed.shape[1]} bytes; {rows} outputs need "
                             f"{ternary2_row_bytes(max(rows, 1))}")
    else:
        rows, cols = packed.shape[0], xq.shape[0]
        if packed.shape[1] != ternary2_row_bytes(cols):
            raise ValueError(f"packed rows hold {packed.shape[1]} bytes; {cols} inputs need "
                             f"{ternary2_row_bytes(cols)}")
        if out.shape[0] != rows:
            raise ValueError(f"out has {out.shape[0]} entries; packed has {rows} rows")
    if row_scale.shape[0] != rows:
        raise ValueError(f"row_scale has {row_scale.shape[0]} entries; expected {rows}")
    if not np.all(np.isfinite(row_scale)):
        raise ValueError("row_scale has non-finite values")
    if not np.isfinite(x_scale):
        raise ValueError(f"x_scale must be finite, got {x_scale!r}")
    if xq.min() < -127:
        raise ValueError("xq holds -128; quantize_act produces values in [-127, 127]")
    if cols > MAX_COLS:
        raise ValueError(f"{cols} inputs exceed MAX_COLS = {MAX_COLS} (int32 sums could overflow)")


def ternary_matvec_checked(packed: np.ndarray, row_scale: np.ndarray, xq: np.ndarray, x_scale,
                           out: np.ndarray | None = None, transposed: bool = False,
                           threads: int = 1) -> np.ndarray:
    """Validate, then run the default kernel (``transposed``: the activation-skip kernel on
    W.T; ``threads`` > 1: the parallel kernel, numba's current thread count)."""
    rows = (row_scale.shape[0] if isinstance(row_scale, np.ndarray) and row_scale.ndim == 1 else 0)
    if out is None:
        out = np.empty(rows, dtype=np.float32)
    check_matvec_args(packed, row_scale, xq, x_scale, out, transposed=transposed)
    xs = np.float32(x_scale)
    if transposed:
        (ternary_matvec_skip if threads == 1 else ternary_matvec_skip_par)(packed, row_scale, xq, xs, out)
    else:
        (ternary_matvec if threads == 1 else ternary_matvec_par)(packed, row_scale, xq, xs, out)
    return out


def reference_matvec(wt: np.ndarray, row_scale: np.ndarray, xq: np.ndarray, x_scale) -> np.ndarray:
    """numpy reference: exact int64 sums of ``wt`` (rows, cols) int8 times ``xq``, then the 2 scales."""
    acc = wt.astype(np.int64) @ xq.astype(np.int64)  # (rows,)
    return row_scale * np.float32(x_scale) * acc.astype(np.float32)


drop_stale_cache(__file__, ("simd.py", "prefetch.py", COMPILED_SETTINGS), act_sum)  # cache hygiene: simd's intrinsics inside
