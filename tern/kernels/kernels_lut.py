"""Ternary matvec variant "lut": T-MAC-style look-up tables over groups of 4 activations.

Group code of 4 weights: ``sum_k (W[r, 4g + k] + 1) * 3**k`` in 0..80 (missing weights
count as 0; 8 bits per 4 weights — still 2 bits per weight). Per matvec the activations
give one table per group: ``T[g, i] = sum_k t_k(i) * q[4g+k]`` (int16, 81 entries,
t_k(i) the k-th base-3 digit of i minus 1); a row's dot product is ``sum_g T[g, code[r, g]]``
— lookups and adds, no multiplies.

Two implementations (the registry's "lut" picks the first where the CPU allows):

* VBMI (AVX-512 VBMI): layout (ceil(rows/64), groups, 64) uint8 from :func:`to_lut81_blocked`,
  64 rows per block, one byte lane per row (padding rows hold code 40 = all zeros). Each
  table is split into its low and high bytes (128-entry byte tables, 2 zmm each) and looked
  up for 64 rows at once with ``vpermi2b``; int16 sums over GROUP_TILE groups, then int32.
  Tables are walked in tiles of GROUP_TILE groups (16 KiB, L1-resident) across all blocks.
* plain: layout (rows, groups) uint8 from :func:`to_lut81`, scalar lookups.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from tern.kernels.cache_guard import drop_stale_cache
from tern.kernels.packing import unpack_ternary2
from tern.kernels.simd import _I8, _I32, _I64, _V32I16, _V64I8, HAS_VBMI, _fn, _load_vec  # the IR helpers

# ---- the VBMI lookup tile, emitted as LLVM IR (vpermi2b over a 128-entry byte table) ---------

LUT_ROWS = 64  # rows per block: one byte lane per row


def _emit_lut_tile(context, builder, sig, args):
    cd_ty, tb_ty, _, _, _, acc_ty = sig.args
    codes_arg, tables_arg, blk, g0, g1, acc_arg = args
    cd = context.make_array(cd_ty)(context, builder, codes_arg)
    tb = context.make_array(tb_ty)(context, builder, tables_arg)
    aa = context.make_array(acc_ty)(context, builder, acc_arg)
    cstr = cgutils.unpack_tuple(builder, cd.strides)  # (blocks, groups, 64) bytes
    tstr = cgutils.unpack_tuple(builder, tb.strides)  # (groups, 2, 128) bytes
    cbase = builder.gep(builder.bitcast(cd.data, ir.PointerType(_I8)), [builder.mul(blk, cstr[0])])
    tbase = builder.bitcast(tb.data, ir.PointerType(_I8))
    acc_ptr = builder.bitcast(aa.data, ir.PointerType(_I32))
    perm = _fn(builder.module, "llvm.x86.avx512.vpermi2var.qi.512", _V64I8, [_V64I8, _V64I8, _V64I8])
    v32i16 = _V32I16
    acc16 = [cgutils.alloca_once_value(builder, ir.Constant(v32i16, None)) for _ in range(2)]
    with cgutils.for_range(builder, g1, start=g0) as loop:
        g = loop.index
        idx = _load_vec(builder, cbase, builder.mul(g, cstr[1]), _V64I8)
        toff = builder.mul(g, tstr[0])
        lo_a = _load_vec(builder, tbase, toff, _V64I8)
        lo_b = _load_vec(builder, tbase, builder.add(toff, ir.Constant(_I64, 64)), _V64I8)
        hi_a = _load_vec(builder, tbase, builder.add(toff, ir.Constant(_I64, 128)), _V64I8)
        hi_b = _load_vec(builder, tbase, builder.add(toff, ir.Constant(_I64, 192)), _V64I8)
        lo = builder.call(perm, [lo_a, idx, lo_b])  # byte j: low byte of T[g, idx[j]]
        hi = builder.call(perm, [hi_a, idx, hi_b])
        for h in range(2):  # int16 lanes for rows 32h .. 32h+31
            mask = []
            for j in range(32 * h, 32 * h + 32):
                mask += [j, 64 + j]
            w = builder.bitcast(builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 64), mask)), v32i16)
            builder.store(builder.add(builder.load(acc16[h]), w), acc16[h])
    for h in range(2):
        wide = builder.sext(builder.load(acc16[h]), ir.VectorType(_I32, 32))
        ptr = builder.bitcast(builder.gep(acc_ptr, [ir.Constant(_I64, 32 * h)]), ir.PointerType(ir.VectorType(_I32, 32)))
        builder.store(builder.add(builder.load(ptr, align=4), wide), ptr, align=4)
    return context.get_dummy_value()


@intrinsic
def lut_tile(typingctx, codes, tables, blk, g0, g1, acc):
    """acc[j] += sum_{g0 <= g < g1} T[g, codes[blk, g, j]] for the 64 rows j of block blk,
    T[g, i] the int16 whose bytes are tables[g, 0, i] (low) and tables[g, 1, i] (high).
    Sums stay in int16 inside a call: g1 - g0 <= 64 with |T| <= 508. Needs AVX-512 VBMI."""
    ok = (isinstance(codes, types.Array) and codes.ndim == 3 and codes.dtype == types.uint8
          and codes.layout == "C"
          and isinstance(tables, types.Array) and tables.ndim == 3 and tables.dtype == types.uint8
          and tables.layout == "C"
          and isinstance(acc, types.Array) and acc.ndim == 1 and acc.dtype == types.int32)
    if not ok:
        return None
    sig = types.none(codes, tables, types.int64, types.int64, types.int64, acc)

    def codegen(context, builder, signature, args):
        return _emit_lut_tile(context, builder, signature, list(args))

    return sig, codegen


LUT_ENTRIES = 81
GROUP_TILE = 64  # groups per table tile: 64 * 256 bytes = 16 KiB; 64 * 508 fits int16
CODE_ZERO4 = 40  # group code of 4 zero weights (1 + 3 + 9 + 27)
ROW_BLOCK = 64  # rows per parallel work item (plain)
BLOCKS_PER_ITEM = 2  # 64-row blocks per parallel work item (VBMI)
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


def to_lut81_blocked(packed2: np.ndarray, cols: int) -> np.ndarray:
    """Convert a ternary2-packed matrix to (ceil(rows/64), ceil(cols/4), 64) uint8 group codes:
    block b, group g, lane j = code of row 64b + j (padding rows: code 40, all zero)."""
    flat = to_lut81(packed2, cols)  # (rows, ng)
    rows, ng = flat.shape
    nb = (rows + LUT_ROWS - 1) // LUT_ROWS
    padded = np.full((nb * LUT_ROWS, ng), CODE_ZERO4, dtype=np.uint8)
    padded[:rows] = flat
    return np.ascontiguousarray(padded.reshape(nb, LUT_ROWS, ng).transpose(0, 2, 1))


@numba.njit(cache=True)
def build_table_bytes(xq, ng):
    """The tables of :func:`build_tables` as bytes for vpermi2b: (ng, 2, 128) uint8,
    [g, 0, i] the low and [g, 1, i] the high byte of T[g, i] for i < 81 (entries 81..127
    are never looked up and left unset). Built as T[a + 9b] = A[a] + B[b] from the 9-entry
    pair tables A (activations 0, 1) and B (2, 3)."""
    tb = np.empty((ng, 2, 128), dtype=np.uint8)
    n = xq.shape[0]
    pa = np.empty(9, dtype=np.int16)
    pb = np.empty(9, dtype=np.int16)
    for g in range(ng):
        q0 = np.int16(xq[4 * g]) if 4 * g < n else np.int16(0)
        q1 = np.int16(xq[4 * g + 1]) if 4 * g + 1 < n else np.int16(0)
        q2 = np.int16(xq[4 * g + 2]) if 4 * g + 2 < n else np.int16(0)
        q3 = np.int16(xq[4 * g + 3]) if 4 * g + 3 < n else np.int16(0)
        for i1 in range(3):
            for i0 in range(3):
                pa[i0 + 3 * i1] = np.int16((i0 - 1) * q0 + (i1 - 1) * q1)
                pb[i0 + 3 * i1] = np.int16((i0 - 1) * q2 + (i1 - 1) * q3)
        for b in range(9):
            for a in range(9):
                v = np.uint16(np.int16(pa[a] + pb[b]))
                tb[g, 0, a + 9 * b] = np.uint8(v & np.uint16(0xFF))
                tb[g, 1, a + 9 * b] = np.uint8(v >> np.uint16(8))
    return tb


@numba.njit(cache=True, inline="always")
def _blocks_lut_vbmi(codes, row_scale, tb, x_scale, out, b0, b1):
    nb, ng = b1 - b0, codes.shape[1]
    rows = out.shape[0]
    acc = np.zeros((nb, LUT_ROWS), dtype=np.int32)
    for g0 in range(0, ng, GROUP_TILE):
        for b in range(b0, b1):
            lut_tile(codes, tb, b, g0, min(ng, g0 + GROUP_TILE), acc[b - b0])
    for b in range(b0, b1):
        for j in range(LUT_ROWS):
            r = b * LUT_ROWS + j
            if r < rows:
                out[r] = row_scale[r] * x_scale * np.float32(acc[b - b0, j])


@numba.njit(cache=True)
def ternary_matvec_lut_vbmi(codes, row_scale, xq, x_scale, out):
    """Variant "lut" with vpermi2b: ``codes`` from :func:`to_lut81_blocked`; out (rows,)."""
    tb = build_table_bytes(xq, codes.shape[1])
    _blocks_lut_vbmi(codes, row_scale, tb, x_scale, out, 0, codes.shape[0])


@numba.njit(cache=True, parallel=True)
def ternary_matvec_lut_vbmi_par(codes, row_scale, xq, x_scale, out):
    """Variant "lut" with vpermi2b, 64-row blocks split over numba threads."""
    tb = build_table_bytes(xq, codes.shape[1])
    nb = codes.shape[0]
    for i in prange((nb + BLOCKS_PER_ITEM - 1) // BLOCKS_PER_ITEM):
        _blocks_lut_vbmi(codes, row_scale, tb, x_scale, out, i * BLOCKS_PER_ITEM,
                         min(nb, (i + 1) * BLOCKS_PER_ITEM))


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
def ternary_matvec_lut_plain(codes, row_scale, xq, x_scale, out):
    """Variant "lut" without VBMI: ``codes`` from :func:`to_lut81`, otherwise as ternary_matvec."""
    t = build_tables(xq, codes.shape[1])
    _rows_lut(codes, row_scale, t, x_scale, out, 0, codes.shape[0])


@numba.njit(cache=True, parallel=True)
def ternary_matvec_lut_plain_par(codes, row_scale, xq, x_scale, out):
    """Variant "lut" without VBMI, blocks of ROW_BLOCK rows split over numba threads."""
    t = build_tables(xq, codes.shape[1])
    rows = codes.shape[0]
    for i in prange((rows + ROW_BLOCK - 1) // ROW_BLOCK):
        _rows_lut(codes, row_scale, t, x_scale, out, i * ROW_BLOCK, min(rows, (i + 1) * ROW_BLOCK))


if HAS_VBMI:
    prepare_lut, ternary_matvec_lut, ternary_matvec_lut_par = (
        to_lut81_blocked, ternary_matvec_lut_vbmi, ternary_matvec_lut_vbmi_par)
else:
    prepare_lut, ternary_matvec_lut, ternary_matvec_lut_par = (
        to_lut81, ternary_matvec_lut_plain, ternary_matvec_lut_plain_par)


# numba cache hygiene: the cached kernels above embed tern.kernels.simd's intrinsics
drop_stale_cache(__file__, ("simd.py",), build_tables)
