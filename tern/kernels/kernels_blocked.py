"""Ternary matvec over the row-blocked layout "blocked16": 16 rows read as one stream.

The ternary2 layout (tern.kernels.packing) keeps each row's bytes together, so the 4-row
pass reads four streams and ends every row with a horizontal sum of its accumulators. On
short rows (the routed experts of the ~10B designs: 128-256 B) that per-row cost is as large
as the row's own work, and the pass computes at about the DRAM read rate even in cache
(benchmarks/README.md, "The 4-row pass's fixed cost"). In "blocked16" a block of 16 rows is
one contiguous run of 64-byte vectors, one per group of 16 columns:

    vector t of block b, 4-byte lane r (row 16 b + r), byte i, bits 2k..2k+1:
        the code (w + 1, in {0, 1, 2}) of row 16 b + r at column 16 t + 4 k + i

so lane r of one ``vpdpbusd`` sums row r's four weights of columns 16 t + 4 k .. + 3 times
those four activations broadcast to every lane: the 16 rows' sums finish in the 16 lanes
of the accumulators with no horizontal sum at all. Codes stay in place (code x 4**k, one AND
per group k, no shifts) and each group's accumulator is shifted back once per block, as in
the one-row pass. Rows past the matrix (the last block's padding) and columns past it hold
code 0, whose products are 0; the kernel reads no activation past ``xq`` and writes no output
past ``out``. Same exact int32 sums as every ternary2 kernel, so the outputs are identical.

Bytes: ``blocked16_bytes(rows, cols) = ceil(rows / 16) * ceil(cols / 16) * 64``: the ternary2
size when rows and cols are multiples of 16. Built at load by :func:`pack_blocked16` from the
ternary2 bytes in numba, a byte at a time over whole segments (tern.run.engine ``layout="blocked16"``).
Rows of up to BLOCKED_MAX_COLS inputs (a quarter of the ternary2 kernels' limit: the int32 lanes
take 4 times the products). The one-thread pass prefetches the first bytes of the matrix read next
(``nxt``). Measured against the row passes: benchmarks/blocked_layout.py, benchmarks/README.md.

Kernels: the SIMD pass (AVX-512 VNNI ``vpdpbusd``; AVX-512BW / AVX2 ``vpmaddubsw`` + ``vpmaddwd``)
and a plain-numba pass (any CPU; also the reference the tests compare the SIMD pass with).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from tern.kernels.cache_guard import drop_stale_cache
from tern.kernels.kernels_ternary import NO_NEXT, act_sum, check_kernel_arrays
from tern.kernels.packing import SEGMENT_COLS, pack_ternary2, ternary2_row_bytes
from tern.kernels.prefetch import PREFETCH_LEVELS, PREFETCH_MIN_BYTES, emit_prefetch
from tern.kernels.simd import (
    _I8,
    _I32,
    _I64,
    ROW_DOT_ISA,
    _broadcast,
    _clamp64,
    _dot_step,
    _fn,
    _lanes_below,
    _load_vec,
    _masked_load,
    _splat,
)

BLOCK_ROWS = 16  # rows per block (int32 lanes of one 512-bit accumulator)
GROUP_COLS = 16  # columns per 64-byte vector of a block (4 per byte, 4 bytes per row)
VECTOR_BYTES = BLOCK_ROWS * GROUP_COLS // 4  # 64
# Inputs per row with exact int32 sums: group k's two accumulators of a lane add 4 products of code x 4**k <= 128
# and |x| <= 127 per 16 columns, before their shift back (a quarter of kernels_ternary.MAX_COLS): 528,416
BLOCKED_MAX_COLS = GROUP_COLS * ((2**31 - 1) // (4 * 128 * 127))


@numba.njit(cache=True, inline="always")
def blocked16_dims(rows, cols):
    """(blocks, bytes per block) of a (rows, cols) matrix in the blocked16 layout (njit; no checks)."""
    return (rows + BLOCK_ROWS - 1) // BLOCK_ROWS, (cols + GROUP_COLS - 1) // GROUP_COLS * VECTOR_BYTES


def blocked16_shape(rows: int, cols: int) -> tuple[int, int]:
    """(blocks, bytes per block) of a (rows, cols) matrix in the blocked16 layout (:func:`blocked16_dims`, checked)."""
    if rows < 1 or cols < 1:
        raise ValueError(f"a blocked16 matrix needs rows, cols >= 1, got ({rows}, {cols})")
    return blocked16_dims(int(rows), int(cols))


def blocked16_bytes(rows: int, cols: int) -> int:
    """Bytes of a (rows, cols) matrix in the blocked16 layout (rows and cols padded to 16)."""
    nb, bb = blocked16_shape(rows, cols)
    return nb * bb


def _column_maps(cols: int, first: int = 0) -> tuple[np.ndarray, ...]:
    """Per column c >= ``first``: its ternary2 byte and shift (tern.kernels.packing: segment s of G bytes stores
    column s + G k + j at byte j, bits 2k) and its blocked16 byte (16 t + 4 k + i -> byte 64 t + i of lane 0) and shift."""
    c = np.arange(first, cols, dtype=np.int64)
    seg0 = c // SEGMENT_COLS * SEGMENT_COLS
    g = (np.minimum(SEGMENT_COLS, cols - seg0) + 3) // 4  # bytes of c's segment
    src_byte = seg0 // 4 + (c - seg0) % g
    src_shift = 2 * ((c - seg0) // g)
    t, rest = c // GROUP_COLS, c % GROUP_COLS
    return src_byte, src_shift, t * VECTOR_BYTES + rest % 4, 2 * (rest // 4)


@numba.njit(cache=True, parallel=True)
def _repack(packed, nfull, src_byte, src_shift, dst_byte, dst_shift, out):
    """out (blocks, bytes per block) <- packed (rows, row bytes) ternary2, the blocks over numba's threads;
    padding is code 0. The ``nfull`` complete 256-column segments move a byte at a time: byte i of row r's
    dword in group t (= 16 s + u) holds columns 16 t + 4 k + i, which a full segment stores at its bytes
    (16 u + i) % 64 + 4 k, all in bits 2 (u // 4); the columns after them move a code at a time through
    the maps of :func:`_column_maps`. Any 2-bit code moves as it is (a file's code 3 sums alike either way)."""
    rows = packed.shape[0]
    for b in prange(out.shape[0]):
        out[b, :] = 0
        for r in range(b * BLOCK_ROWS, min(rows, (b + 1) * BLOCK_ROWS)):
            lane = 4 * (r % BLOCK_ROWS)
            for s in range(nfull):
                for u in range(16):
                    sh = 2 * (u // 4)
                    for i in range(4):
                        j = 64 * s + (16 * u + i) % 64
                        v = (((packed[r, j] >> sh) & 3) | (((packed[r, j + 4] >> sh) & 3) << 2)
                             | (((packed[r, j + 8] >> sh) & 3) << 4) | (((packed[r, j + 12] >> sh) & 3) << 6))
                        out[b, VECTOR_BYTES * (16 * s + u) + lane + i] = v
            for c in range(src_byte.shape[0]):
                code = (packed[r, src_byte[c]] >> src_shift[c]) & 3
                out[b, dst_byte[c] + lane] |= np.uint8(code << dst_shift[c])


def pack_blocked16(packed: np.ndarray, cols: int) -> np.ndarray:
    """A ternary2 matrix (rows, ternary2_row_bytes(cols)) -> blocked16 (blocks, bytes per block) uint8."""
    if not isinstance(packed, np.ndarray) or packed.dtype != np.uint8 or packed.ndim != 2:
        raise ValueError(f"packed must be a 2-D uint8 ternary2 matrix, got {getattr(packed, 'dtype', type(packed))} "
                         f"with shape {getattr(packed, 'shape', None)}")
    if packed.shape[1] != ternary2_row_bytes(cols):
        raise ValueError(f"packed rows hold {packed.shape[1]} bytes; {cols} columns need {ternary2_row_bytes(cols)}")
    if cols > BLOCKED_MAX_COLS:
        raise ValueError(f"{cols} columns exceed BLOCKED_MAX_COLS = {BLOCKED_MAX_COLS}: the blocked16 pass's int32 "
                         f"sums could overflow (use the rows layout)")
    out = np.empty(blocked16_shape(packed.shape[0], cols), np.uint8)
    nfull = cols // SEGMENT_COLS
    _repack(np.ascontiguousarray(packed), nfull, *_column_maps(cols, nfull * SEGMENT_COLS), out)
    return out


def blocked16_from_ternary(wt: np.ndarray) -> np.ndarray:
    """A ternary int8 matrix (rows, cols) in {-1, 0, 1} -> blocked16 (tests, benchmarks)."""
    return pack_blocked16(pack_ternary2(wt), wt.shape[1])


# ---- the SIMD block pass (LLVM IR) -----------------------------------------------------------

_F32 = ir.FloatType()


def _masked_f32(builder, ptr, n, mask, store=None):
    vty = ir.VectorType(_F32, n)
    vp = builder.bitcast(ptr, ir.PointerType(vty))
    m1 = ir.VectorType(ir.IntType(1), n)
    if store is None:
        fn = _fn(builder.module, f"llvm.masked.load.v{n}f32.p0", vty, [ir.PointerType(vty), _I32, m1, vty])
        return builder.call(fn, [vp, ir.Constant(_I32, 4), mask, ir.Constant(vty, None)])
    fn = _fn(builder.module, f"llvm.masked.store.v{n}f32.p0", ir.VoidType(), [vty, ir.PointerType(vty), _I32, m1])
    builder.call(fn, [store, vp, ir.Constant(_I32, 4), mask])
    return None


def _emit_block_pass(context, builder, sig, args, isa, ahead):
    """Block b of ``packed``: out[16 b + r] = row_scale[16 b + r] * x_scale * (sum_c code * xq[c] - qsum)
    for the rows r < 16 inside ``out``. ``ahead`` > 0: the vectors of the matrix's last ``ahead`` bytes
    each prefetch a line of ``nxt``, the matrix read next (2-D uint8; empty: none), into L2, so its
    first ``ahead`` bytes are on their way when this one ends. (Prefetching inside the matrix too,
    one line a vector, read slower from DRAM than the hardware prefetcher alone on this one stream:
    AMD EPYC Zen 4, 1 thread, 400 KiB matrices in random order, 23.2 against 27.8 GB/s.)"""
    pk_ty, _, xq_ty, _, rs_ty, _, out_ty, nx_ty = sig.args
    packed_arg, b, xq_arg, qsum, rs_arg, xs, out_arg, nx_arg = args
    pk = context.make_array(pk_ty)(context, builder, packed_arg)
    qa = context.make_array(xq_ty)(context, builder, xq_arg)
    ra = context.make_array(rs_ty)(context, builder, rs_arg)
    oa = context.make_array(out_ty)(context, builder, out_arg)
    stride0 = cgutils.unpack_tuple(builder, pk.strides)[0]
    ngroups = builder.udiv(cgutils.unpack_tuple(builder, pk.shape)[1], ir.Constant(_I64, VECTOR_BYTES))
    mbase = builder.bitcast(pk.data, ir.PointerType(_I8))
    boff = builder.mul(b, stride0)
    base = builder.gep(mbase, [boff])
    total = builder.mul(cgutils.unpack_tuple(builder, pk.shape)[0], stride0)
    nbase = builder.bitcast(context.make_array(nx_ty)(context, builder, nx_arg).data, ir.PointerType(_I8))
    qbase = builder.bitcast(qa.data, ir.PointerType(_I8))
    ncols = cgutils.unpack_tuple(builder, qa.shape)[0]
    nrows = cgutils.unpack_tuple(builder, oa.shape)[0]

    halves = 2 if isa == "avx2" else 1  # 16 rows = two 8-lane halves with AVX2
    width = VECTOR_BYTES // halves
    vbytes = ir.VectorType(_I8, width)
    vacc = ir.VectorType(_I32, 16 // halves)
    # per half, group k and parity of t: two accumulators per group keep two vpdpbusd chains in flight
    accs = [[[cgutils.alloca_once_value(builder, ir.Constant(vacc, None)) for _ in range(2)] for _ in range(4)]
            for _ in range(halves)]

    def group(t, parity, tail_valid=None):
        off = builder.mul(t, ir.Constant(_I64, VECTOR_BYTES))
        if ahead and tail_valid is None:  # one line a vector, the matrix then nxt as one stream
            tgt = builder.add(builder.add(boff, off), ir.Constant(_I64, ahead))
            with builder.if_then(builder.icmp_signed(">=", tgt, total), likely=False):
                emit_prefetch(builder, nbase, builder.sub(tgt, total), PREFETCH_LEVELS["l2"])
        for h in range(halves):
            w = _load_vec(builder, base, builder.add(off, ir.Constant(_I64, h * width)), vbytes)
            for k in range(4):
                qoff = builder.add(builder.mul(t, ir.Constant(_I64, GROUP_COLS)), ir.Constant(_I64, 4 * k))
                if tail_valid is None:
                    qp = builder.bitcast(builder.gep(qbase, [qoff]), ir.PointerType(_I32))
                    q4 = builder.load(qp, align=1)
                else:  # the last group's activations past xq are not read (their codes are 0)
                    nv = _clamp64(builder, builder.sub(ncols, qoff), 4)
                    q4 = builder.bitcast(_masked_load(builder, qbase, qoff, ir.VectorType(_I8, 4), nv), _I32)
                qv = builder.bitcast(_broadcast(builder, q4, vacc), vbytes)
                codes = builder.and_(w, _splat(vbytes, 3 << (2 * k)))  # code * 4**k, in place
                a = accs[h][k][parity]
                builder.store(_dot_step(builder, isa, builder.load(a), codes, qv), a)

    full = builder.udiv(ncols, ir.Constant(_I64, GROUP_COLS))  # groups with all 16 columns inside xq
    pairs = builder.udiv(full, ir.Constant(_I64, 2))
    with cgutils.for_range(builder, pairs) as loop:
        t0 = builder.mul(loop.index, ir.Constant(_I64, 2))
        group(t0, 0)
        group(builder.add(t0, ir.Constant(_I64, 1)), 1)
    with builder.if_then(builder.icmp_signed("<", builder.mul(pairs, ir.Constant(_I64, 2)), full)):
        group(builder.sub(full, ir.Constant(_I64, 1)), 0)
    with builder.if_then(builder.icmp_signed("<", full, ngroups)):
        group(full, 1, tail_valid=True)

    r0 = builder.mul(b, ir.Constant(_I64, BLOCK_ROWS))
    left = builder.sub(nrows, r0)
    xsv = _broadcast(builder, xs, ir.VectorType(_F32, vacc.count))
    qsv = _broadcast(builder, qsum, vacc)
    rsp = builder.bitcast(ra.data, ir.PointerType(_F32))
    outp = builder.bitcast(oa.data, ir.PointerType(_F32))
    for h in range(halves):
        tot = None
        for k in range(4):
            v = builder.add(builder.load(accs[h][k][0]), builder.load(accs[h][k][1]))
            if k:
                v = builder.ashr(v, _splat(vacc, 2 * k))  # exact: every product of group k is a multiple of 4**k
            tot = v if tot is None else builder.add(tot, v)
        f = builder.sitofp(builder.sub(tot, qsv), ir.VectorType(_F32, vacc.count))
        rh = builder.add(r0, ir.Constant(_I64, h * vacc.count))
        mask = _lanes_below(builder, vacc.count,
                            _clamp64(builder, builder.sub(left, ir.Constant(_I64, h * vacc.count)), vacc.count))
        rs = _masked_f32(builder, builder.gep(rsp, [rh]), vacc.count, mask)
        res = builder.fmul(builder.fmul(rs, xsv), f)  # row_scale * x_scale * sum: the ternary2 kernels' order
        _masked_f32(builder, builder.gep(outp, [rh]), vacc.count, mask, store=res)
    return context.get_dummy_value()


def _make_block_pass(isa, ahead=0):
    @intrinsic
    def block_pass(typingctx, packed, b, xq, qsum, row_scale, x_scale, out, nxt):
        ok = (isinstance(packed, types.Array) and packed.ndim == 2 and packed.dtype == types.uint8
              and packed.layout == "C" and isinstance(xq, types.Array) and xq.ndim == 1
              and xq.dtype == types.int8 and xq.layout == "C"
              and isinstance(row_scale, types.Array) and row_scale.ndim == 1 and row_scale.dtype == types.float32
              and row_scale.layout == "C" and isinstance(out, types.Array) and out.ndim == 1
              and out.dtype == types.float32 and out.layout == "C"
              and isinstance(nxt, types.Array) and nxt.ndim == 2 and nxt.dtype == types.uint8 and nxt.layout == "C")
        if not ok:
            return None
        sig = types.none(packed, types.int64, xq, types.int32, row_scale, types.float32, out, nxt)

        def codegen(context, builder, signature, args):
            a = list(args)
            a[1] = context.cast(builder, a[1], signature.args[1], types.int64)
            return _emit_block_pass(context, builder, signature, a, isa, ahead)

        return sig, codegen

    return block_pass


HAS_BLOCK_SIMD = ROW_DOT_ISA != "none"
# Engine(layout="auto") re-packs into this layout where the pass has an AVX-512 form. Its AVX2 form (two 8-row
# halves; numba compiling for Haswell on the Zen 4 VM, session 43, benchmarks/op_breakdown.py --compare, two runs):
# faster at 1 thread (the 30m sweep model 1.35 / 1.08x, the ~250 MB-active model 1.05 / 1.12x) but the DRAM-bound
# model at 2 threads 0.86 / 0.87x the 4-row pass, so AVX2-only CPUs keep the rows layout by default until measured
BLOCKED_BY_DEFAULT = ROW_DOT_ISA.startswith("avx512")
_BLOCK_ISA = ROW_DOT_ISA if HAS_BLOCK_SIMD else "avx2"
block_pass = _make_block_pass(_BLOCK_ISA)
block_pass_pf = _make_block_pass(_BLOCK_ISA, PREFETCH_MIN_BYTES)


# ---- kernels --------------------------------------------------------------------------------


@numba.njit(cache=True, inline="always")
def _plain_block(packed, b, xq, qsum, row_scale, x_scale, out):
    """Block b with plain numba (any CPU): the same sums and the same float arithmetic."""
    cols = xq.shape[0]
    r0 = b * BLOCK_ROWS
    n = min(BLOCK_ROWS, out.shape[0] - r0)
    for r in range(n):
        s = np.int32(0)
        for t in range(packed.shape[1] // VECTOR_BYTES):
            for i in range(4):
                byte = np.int32(packed[b, t * VECTOR_BYTES + 4 * r + i])
                for k in range(4):
                    c = t * GROUP_COLS + 4 * k + i
                    if c < cols:
                        s += ((byte >> (2 * k)) & 3) * np.int32(xq[c])
        out[r0 + r] = row_scale[r0 + r] * x_scale * np.float32(np.int32(s - qsum))


@numba.njit(cache=True)
def blocked16_matvec_plain(packed, row_scale, xq, x_scale, out):
    """out (rows,) = row_scale * x_scale * (W @ xq), W in blocked16 (blocks, bytes per block): plain numba."""
    qsum = act_sum(xq)
    for b in range(packed.shape[0]):
        _plain_block(packed, b, xq, qsum, row_scale, x_scale, out)


@numba.njit(cache=True, inline="always")
def _blocks(packed, row_scale, xq, qsum, x_scale, out, b0, b1, prefetch, nxt):
    for b in range(b0, b1):
        if not HAS_BLOCK_SIMD:
            _plain_block(packed, b, xq, qsum, row_scale, x_scale, out)
        elif prefetch:
            block_pass_pf(packed, b, xq, qsum, row_scale, x_scale, out, nxt)
        else:
            block_pass(packed, b, xq, qsum, row_scale, x_scale, out, nxt)


@numba.njit(cache=True)
def blocked16_matvec(packed, row_scale, xq, x_scale, out):
    """out (rows,) = row_scale * x_scale * (W @ xq) over the blocked16 layout, 1 thread
    (SIMD where tern.kernels.simd found AVX2 / AVX-512, else plain numba), software prefetch on."""
    _blocks(packed, row_scale, xq, act_sum(xq), x_scale, out, 0, packed.shape[0], True, NO_NEXT)


@numba.njit(cache=True)
def blocked16_matvec_next(packed, row_scale, xq, x_scale, out, prefetch, nxt):
    """blocked16_matvec whose software prefetch (``prefetch``) runs PREFETCH_MIN_BYTES ahead into L2,
    past the matrix's end into ``nxt`` (2-D uint8, the matrix read next; NO_NEXT: none). Same sums."""
    _blocks(packed, row_scale, xq, act_sum(xq), x_scale, out, 0, packed.shape[0], prefetch, nxt)


@numba.njit(cache=True, parallel=True)
def blocked16_matvec_par(packed, row_scale, xq, x_scale, out):
    """blocked16_matvec with the blocks split over numba's threads (one block an item)."""
    qsum = act_sum(xq)
    for b in prange(packed.shape[0]):
        _blocks(packed, row_scale, xq, qsum, x_scale, out, b, b + 1, True, NO_NEXT)


def check_blocked_args(packed, row_scale, xq, x_scale, out) -> None:
    """ValueError naming the problem unless the arguments fit a blocked16 matvec."""
    check_kernel_arrays(packed, row_scale, xq, out)
    rows, cols = out.shape[0], xq.shape[0]
    if rows < 1 or cols < 1:
        raise ValueError(f"empty matvec: out {out.shape}, xq {xq.shape}")
    if packed.shape != blocked16_shape(rows, cols):
        raise ValueError(f"packed has shape {packed.shape}; a blocked16 ({rows}, {cols}) matrix has "
                         f"{blocked16_shape(rows, cols)}")
    if row_scale.shape[0] != rows:
        raise ValueError(f"row_scale has {row_scale.shape[0]} entries; out has {rows}")
    if not np.all(np.isfinite(row_scale)) or not np.isfinite(x_scale):
        raise ValueError("row_scale and x_scale must be finite")
    if xq.min() < -127:
        raise ValueError("xq holds -128; quantize_act produces values in [-127, 127]")
    if cols > BLOCKED_MAX_COLS:
        raise ValueError(f"{cols} inputs exceed BLOCKED_MAX_COLS = {BLOCKED_MAX_COLS} (int32 sums could overflow)")


def blocked16_matvec_checked(packed: np.ndarray, row_scale: np.ndarray, xq: np.ndarray, x_scale,
                             out: np.ndarray | None = None, threads: int = 1) -> np.ndarray:
    """Validate, then run :func:`blocked16_matvec` (``threads`` > 1: the parallel kernel)."""
    if out is None:
        out = np.empty(row_scale.shape[0] if isinstance(row_scale, np.ndarray) and row_scale.ndim == 1 else 0,
                       np.float32)
    check_blocked_args(packed, row_scale, xq, x_scale, out)
    (blocked16_matvec if threads == 1 else blocked16_matvec_par)(packed, row_scale, xq, np.float32(x_scale), out)
    return out


drop_stale_cache(__file__, ("simd.py", "kernels_ternary.py", "packing.py", "prefetch.py"), blocked16_matvec)  # cache hygiene
