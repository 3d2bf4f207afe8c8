"""Ternary matvec kernels read straight from the base-3 layout (1.6 bits per weight).

Layout (tern.kernels.packing, ``ternary_b3``): ``packed`` (rows, ceil(cols / 5)) uint8,
byte ``i`` of a row = ``sum_k code[5i + k] * 3**k`` (code = w + 1; padding trits code 1),
so valid bytes are 0..242. The kernels compute exactly what the ternary2 kernels
(tern.kernels.kernels_ternary) compute on the expanded matrix,

    out[r] = row_scale[r] * x_scale * sum_c Wt[r, c] * xq[c]

(the integer sum exact in int32, the same float32 expression), so results are bit-identical.

Decoding. A row is read in blocks of 64 bytes (320 weights). Each byte becomes its 5 codes
in registers: with AVX-512 VBMI two 256-entry byte tables, each looked up with two
``vpermi2b`` and a blend on bit 7 — one gives digits 0..3 packed 2 bits each (the ternary2
byte of those 4 codes, split with shift + mask), the other digit 4 — else (AVX2 /
AVX-512BW) by comparisons and subtractions of 81, 27, 9, 3. Code ``k`` of the 64 bytes
multiplies activations ``5j + k`` (j < 64): the kernels read the activations in that
order, ``xp = b3_permute(xq)`` (:func:`b3_act_len` bytes, zero past ``cols``), one pass
over ``xq`` per matvec (the engine permutes once per quantized activation and passes
``xp``). Products are u8 code x s8 activation (vpdpbusd / vpmaddubsw) minus ``sum(xq)``,
as in the ternary2 kernels. The last, partial block is read with a masked load, nothing
past a row.

Kernels (``@njit(cache=True)``, validated inputs; :func:`b3_matvec_checked` validates):
``b3_matvec_xp`` (ROWS_PER_DOT rows per pass over xp, the activation loads shared, each
block prefetching the rows of the next pass (tern.kernels.prefetch, as ternary2's passes): from
DRAM this beat a one-row streaming pass with or without prefetch) and ``b3_matvec_xp_par`` over numba
threads (blocks of ROW_BLOCK rows); ``b3_matvec`` / ``b3_matvec_par`` take ``xq`` and
permute it themselves. Without AVX2 (ROW_DOT_ISA "none") every one of them
runs the portable plain-numba loop (a 243 x 5 code table).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange
from numba.core import cgutils

from tern.kernels.cache_guard import drop_stale_cache
from tern.kernels.kernels_ternary import MAX_COLS, act_sum, check_kernel_arrays
from tern.kernels.packing import B3_MAX_BYTE, B3_TRITS
from tern.kernels.prefetch import (
    PREFETCH_MIN_BYTES,
    PREFETCH_STAMP,
    ROW_LOCALITY,
    emit_prefetch,
    prefetch_ahead,
)
from tern.kernels.simd import (
    _I8,
    _I32,
    _I64,
    _ISA,
    _V64I8,
    HAS_VBMI,
    ROW_DOT_ISA,
    ROWS_PER_DOT,
    _dot_step,
    _fn,
    _load_vec,
    _masked_load,
    _splat,
    rows_dot_intrinsic,
)

# Launch numba's threading layer at import (see tern.kernels.kernels_ternary).
numba.get_num_threads()

BLOCK_BYTES = 64  # packed bytes per block (one zmm load)
BLOCK_COLS = BLOCK_BYTES * B3_TRITS  # 320 weights per block
ROW_BLOCK = 16  # rows per parallel work item (as the ternary2 kernels)
DECODE = "vbmi" if HAS_VBMI else "cmp"  # how bytes become codes on this CPU


def _digits(v: int) -> list[int]:
    return [(v // 3**k) % 3 for k in range(B3_TRITS)]


# byte -> codes 0..3 packed 2 bits each (a ternary2 byte), byte -> code 4; bytes > 242 map to 0
_TAB_LO4 = [sum(d << (2 * k) for k, d in enumerate(_digits(v)[:4])) if v <= B3_MAX_BYTE else 0 for v in range(256)]
_TAB_D4 = [_digits(v)[4] if v <= B3_MAX_BYTE else 0 for v in range(256)]
CODES = np.array([_digits(v) for v in range(B3_MAX_BYTE + 1)], dtype=np.int8)  # (243, 5) plain decode


def b3_act_len(cols: int) -> int:
    """Length of the permuted activation vector of a ``cols``-input b3 matvec: 320 per
    block of 64 packed bytes (the last one padded with zeros)."""
    rb = (cols + B3_TRITS - 1) // B3_TRITS
    return BLOCK_COLS * ((rb + BLOCK_BYTES - 1) // BLOCK_BYTES)


@numba.njit(cache=True)
def b3_permute(xq, xp):
    """xp[320 b + 64 k + j] = xq[320 b + 5 j + k] (0 past the end of xq); xp must hold
    b3_act_len(len(xq)) entries."""
    n = xq.shape[0]
    nb = xp.shape[0] // BLOCK_COLS
    for b in range(nb):
        base = b * BLOCK_COLS
        if base + BLOCK_COLS <= n:
            for k in range(B3_TRITS):
                for j in range(BLOCK_BYTES):
                    xp[base + BLOCK_BYTES * k + j] = xq[base + B3_TRITS * j + k]
        else:
            for k in range(B3_TRITS):
                for j in range(BLOCK_BYTES):
                    c = base + B3_TRITS * j + k
                    xp[base + BLOCK_BYTES * k + j] = xq[c] if c < n else np.int8(0)


# ---- the row dot: packed b3 row(s) against the permuted activations (LLVM IR) ---------------


def _const_vec(values):
    return ir.Constant(_V64I8, [ir.Constant(_I8, v) for v in values])


def _lookup256(builder, v, table, neg):
    """table[v] for 64 bytes: two vpermi2b over the low / high 128 entries, blended on bit 7."""
    perm = _fn(builder.module, "llvm.x86.avx512.vpermi2var.qi.512", _V64I8, [_V64I8, _V64I8, _V64I8])
    t = [_const_vec(table[64 * i:64 * i + 64]) for i in range(4)]
    lo = builder.call(perm, [t[0], v, t[1]])
    hi = builder.call(perm, [t[2], v, t[3]])
    return builder.select(neg, hi, lo)


def _decode(builder, v, vty, decode):
    """The 5 code vectors (u8 in {0, 1, 2}) of byte vector v, code k first."""
    if decode == "vbmi":  # vty is 64 bytes
        neg = builder.icmp_signed("<", v, ir.Constant(vty, None))
        lo4 = _lookup256(builder, v, _TAB_LO4, neg)
        d4 = _lookup256(builder, v, _TAB_D4, neg)
        v32 = ir.VectorType(_I32, vty.count // 4)
        x = builder.bitcast(lo4, v32)
        codes = []
        for k in range(4):
            y = builder.lshr(x, _splat(v32, 2 * k)) if k else x
            codes.append(builder.bitcast(builder.and_(y, _splat(v32, 0x03030303)), vty))
        return codes + [d4]
    codes = [None] * B3_TRITS
    for k in range(B3_TRITS - 1, 0, -1):  # digit k = (v >= 3^k) + (v >= 2 * 3^k); v -= digit * 3^k
        p = 3**k
        m1 = builder.icmp_unsigned(">=", v, _splat(vty, p))
        m2 = builder.icmp_unsigned(">=", v, _splat(vty, 2 * p))
        codes[k] = builder.add(builder.zext(m1, vty), builder.zext(m2, vty))
        v = builder.sub(v, builder.select(m2, _splat(vty, 2 * p), builder.select(m1, _splat(vty, p), _splat(vty, 0))))
    codes[0] = v
    return codes


def _emit_b3_dot(context, builder, sig, args, isa, decode, nrows, prefetch, locality):
    pk_ty, _, xp_ty, _, _ = sig.args
    packed_arg, r, xp_arg, nfull, gtail = args
    pk = context.make_array(pk_ty)(context, builder, packed_arg)
    xa = context.make_array(xp_ty)(context, builder, xp_arg)
    stride0 = cgutils.unpack_tuple(builder, pk.strides)[0]
    data = builder.bitcast(pk.data, ir.PointerType(_I8))
    row_bases = [builder.gep(data, [builder.mul(builder.add(r, ir.Constant(_I64, i)), stride0)])
                 for i in range(nrows)]
    xbase = builder.bitcast(xa.data, ir.PointerType(_I8))
    width = 32 if isa == "avx2" else 64
    if decode == "vbmi":
        width = 64
    vbytes = ir.VectorType(_I8, width)
    vacc = ir.VectorType(_I32, width // 4)
    nacc = B3_TRITS if nrows == 1 else 2  # independent accumulator chains per row
    accs = [[cgutils.alloca_once_value(builder, ir.Constant(vacc, None)) for _ in range(nacc)]
            for _ in range(nrows)]

    ahead = prefetch_ahead(builder, stride0, nrows, prefetch)  # the next pass's rows, >= prefetch bytes on

    def dot(acc, codes, q):
        if width == 64:
            return _dot_step(builder, isa, acc, codes, q)
        return _dot_step(builder, "avx2", acc, codes, q)

    def block(byte_off, nvalid):
        """One block of 64 packed bytes at byte_off (nvalid: bytes to read, None = all)."""
        xoff = builder.mul(byte_off, ir.Constant(_I64, B3_TRITS))  # 320 activations per 64 bytes
        for h in range(BLOCK_BYTES // width):
            off = builder.add(byte_off, ir.Constant(_I64, h * width))
            if nvalid is None:
                if prefetch:  # a hint only: past the row (or the array) it never faults
                    for rb in row_bases:
                        emit_prefetch(builder, rb, builder.add(off, ahead), locality)
                pvs = [_load_vec(builder, rb, off, vbytes) for rb in row_bases]
            else:
                left = builder.sub(nvalid, ir.Constant(_I64, h * width))
                left = builder.select(builder.icmp_signed("<", left, ir.Constant(_I64, 0)), ir.Constant(_I64, 0), left)
                left = builder.select(builder.icmp_signed(">", left, ir.Constant(_I64, width)),
                                      ir.Constant(_I64, width), left)
                pvs = [_masked_load(builder, rb, off, vbytes, left) for rb in row_bases]
            codes = [_decode(builder, pv, vbytes, decode) for pv in pvs]
            for k in range(B3_TRITS):
                q = _load_vec(builder, xbase, builder.add(xoff, ir.Constant(_I64, BLOCK_BYTES * k + h * width)), vbytes)
                for i in range(nrows):
                    a = accs[i][k % nacc]
                    builder.store(dot(builder.load(a), codes[i][k], q), a)

    with cgutils.for_range(builder, nfull) as loop:
        block(builder.mul(loop.index, ir.Constant(_I64, BLOCK_BYTES)), None)
    with builder.if_then(builder.icmp_signed(">", gtail, ir.Constant(_I64, 0))):
        block(builder.mul(nfull, ir.Constant(_I64, BLOCK_BYTES)), gtail)
    red = _fn(builder.module, f"llvm.vector.reduce.add.v{vacc.count}i32", _I32, [vacc])
    sums = []
    for row in accs:
        tot = builder.load(row[0])
        for a in row[1:]:
            tot = builder.add(tot, builder.load(a))
        sums.append(builder.call(red, [tot]))
    if nrows == 1:
        return sums[0]
    return context.make_tuple(builder, sig.return_type, sums)


def make_b3_dot(isa: str, decode: str, nrows: int = 1, prefetch: int = 0, locality: int = ROW_LOCALITY):
    """An intrinsic ``(packed, r, xp, nfull, gtail) -> int32`` (a tuple of ``nrows`` for
    nrows > 1): ``sum_c code[r + i, c] * xp'`` over row r + i's nfull complete 64-byte
    blocks plus a last block of gtail bytes (0 <= gtail < 64), xp in b3_permute order.
    ``isa``: the dot instruction (tern.kernels.simd); ``decode``: "vbmi" or "cmp";
    ``prefetch``: each block's loads prefetch the same bytes max(prefetch, nrows * row
    stride) bytes further on (the rows of the next pass; 0: no prefetch), at ``locality``
    (tern.kernels.prefetch.PREFETCH_LEVELS)."""
    if decode == "vbmi" and isa == "avx2":
        raise ValueError("the vbmi decode needs AVX-512")

    return rows_dot_intrinsic(nrows, lambda context, builder, sig, args:
                              _emit_b3_dot(context, builder, sig, args, isa, decode, nrows, prefetch, locality))


_DECODE = DECODE if _ISA != "avx2" else "cmp"
# prefetch distance: tern.kernels.prefetch.PREFETCH_MIN_BYTES (measured with this kernel)
b3_row_dot = make_b3_dot(_ISA, _DECODE, 1, PREFETCH_MIN_BYTES)
b3_rows4_dot = make_b3_dot(_ISA, _DECODE, ROWS_PER_DOT, PREFETCH_MIN_BYTES)
HAS_SIMD = ROW_DOT_ISA != "none"


# ---- plain numba (any CPU) ------------------------------------------------------------------


@numba.njit(cache=True, inline="always")
def _rows_plain(packed, row_scale, xp, x_scale, out, r0, r1, codes):
    """Portable loop: per byte its 5 codes from the (243, 5) table, against xp; the sum of
    xp (== sum of xq) is subtracted once per row."""
    rb = packed.shape[1]
    qsum = act_sum(xp)
    for r in range(r0, r1):
        acc = np.int32(0)
        for i in range(rb):
            b = packed[r, i]
            base = (i // BLOCK_BYTES) * BLOCK_COLS + (i % BLOCK_BYTES)
            for k in range(B3_TRITS):
                acc = np.int32(acc + np.int32(codes[b, k]) * np.int32(xp[base + BLOCK_BYTES * k]))
        out[r] = row_scale[r] * x_scale * np.float32(np.int32(acc - qsum))


# ---- SIMD row passes ------------------------------------------------------------------------


@numba.njit(cache=True, inline="always")
def _rows_one(packed, row_scale, xp, qsum, x_scale, out, r0, r1):
    """Rows r0..r1-1 one at a time (the rows left after the ROWS_PER_DOT-row passes)."""
    rb = packed.shape[1]
    nfull = rb // BLOCK_BYTES
    gtail = rb - nfull * BLOCK_BYTES
    for r in range(r0, r1):
        acc = np.int32(b3_row_dot(packed, r, xp, nfull, gtail) - qsum)
        out[r] = row_scale[r] * x_scale * np.float32(acc)


@numba.njit(cache=True, inline="always")
def _rows_multi(packed, row_scale, xp, qsum, x_scale, out, r0, r1):
    """Rows r0..r1-1: ROWS_PER_DOT rows per pass over xp, the last few one at a time."""
    rb = packed.shape[1]
    nfull = rb // BLOCK_BYTES
    gtail = rb - nfull * BLOCK_BYTES
    r = r0
    while r + ROWS_PER_DOT <= r1:
        sums = b3_rows4_dot(packed, r, xp, nfull, gtail)
        for i in range(ROWS_PER_DOT):
            out[r + i] = row_scale[r + i] * x_scale * np.float32(np.int32(sums[i] - qsum))
        r += ROWS_PER_DOT
    _rows_one(packed, row_scale, xp, qsum, x_scale, out, r, r1)


@numba.njit(cache=True, parallel=True)
def _multi_par(packed, row_scale, xp, x_scale, out):
    qsum = act_sum(xp)
    rows = packed.shape[0]
    for i in prange((rows + ROW_BLOCK - 1) // ROW_BLOCK):
        _rows_multi(packed, row_scale, xp, qsum, x_scale, out, i * ROW_BLOCK, min(rows, (i + 1) * ROW_BLOCK))


@numba.njit(cache=True, parallel=True)
def _plain_par(packed, row_scale, xp, x_scale, out, codes):
    rows = packed.shape[0]
    for i in prange((rows + ROW_BLOCK - 1) // ROW_BLOCK):
        _rows_plain(packed, row_scale, xp, x_scale, out, i * ROW_BLOCK, min(rows, (i + 1) * ROW_BLOCK), codes)


# ---- kernels on permuted activations (what the engine calls) --------------------------------


@numba.njit(cache=True)
def b3_matvec_plain_xp(packed, row_scale, xp, x_scale, out):
    """Portable plain-numba b3 matvec (any CPU)."""
    _rows_plain(packed, row_scale, xp, x_scale, out, 0, packed.shape[0], CODES)


@numba.njit(cache=True)
def b3_matvec_plain_xp_par(packed, row_scale, xp, x_scale, out):
    _plain_par(packed, row_scale, xp, x_scale, out, CODES)


@numba.njit(cache=True)
def b3_matvec_simd_xp(packed, row_scale, xp, x_scale, out):
    """SIMD b3 matvec, ROWS_PER_DOT rows per pass; ``xp`` = b3_permute(xq)."""
    _rows_multi(packed, row_scale, xp, act_sum(xp), x_scale, out, 0, packed.shape[0])


@numba.njit(cache=True)
def b3_matvec_simd_xp_par(packed, row_scale, xp, x_scale, out):
    """b3_matvec_simd_xp with blocks of ROW_BLOCK rows split over numba threads."""
    _multi_par(packed, row_scale, xp, x_scale, out)


# the defaults (``b3_matvec_xp`` / ``_par``, what the engine calls): SIMD where
# tern.kernels.simd found AVX2 / AVX-512, else the plain loop (chosen here, so a CPU without
# AVX2 never compiles the SIMD code)
b3_matvec_xp = b3_matvec_simd_xp if HAS_SIMD else b3_matvec_plain_xp
b3_matvec_xp_par = b3_matvec_simd_xp_par if HAS_SIMD else b3_matvec_plain_xp_par


# ---- kernels on xq (permute, then the above) ------------------------------------------------


@numba.njit(cache=True)
def _permuted(xq):
    nb = (((xq.shape[0] + B3_TRITS - 1) // B3_TRITS) + BLOCK_BYTES - 1) // BLOCK_BYTES
    xp = np.empty(nb * BLOCK_COLS, dtype=np.int8)
    b3_permute(xq, xp)
    return xp


@numba.njit(cache=True)
def b3_matvec(packed, row_scale, xq, x_scale, out):
    """Single-thread b3 matvec on plain ``xq`` (allocates and fills the permuted copy)."""
    b3_matvec_xp(packed, row_scale, _permuted(xq), x_scale, out)


@numba.njit(cache=True)
def b3_matvec_par(packed, row_scale, xq, x_scale, out):
    """Multi-thread b3 matvec on plain ``xq`` (threads: numba.set_num_threads by the caller)."""
    b3_matvec_xp_par(packed, row_scale, _permuted(xq), x_scale, out)


# ---- validation -----------------------------------------------------------------------------


def check_b3_args(packed, row_scale, xq, x_scale, out) -> None:
    """ValueError naming the problem unless the arguments fit a b3 matvec: bytes <= 242,
    ceil(cols / 5) bytes per row, and what the ternary2 kernels need (C-contiguous uint8 /
    float32 / int8 / float32 arrays of matching lengths, finite scales, xq >= -127)."""
    check_kernel_arrays(packed, row_scale, xq, out)
    rows, cols = packed.shape[0], xq.shape[0]
    problems = [(rows < 1 or cols < 1, f"empty matvec: packed {packed.shape}, xq {xq.shape}"),
                (packed.shape[1] != (cols + B3_TRITS - 1) // B3_TRITS,
                 f"packed (ternary_b3) rows hold {packed.shape[1]} bytes; {cols} inputs need ceil({cols} / 5) = "
                 f"{(cols + B3_TRITS - 1) // B3_TRITS}"),
                (out.shape[0] != rows, f"out has {out.shape[0]} entries; packed has {rows} rows"),
                (row_scale.shape[0] != rows, f"row_scale has {row_scale.shape[0]} entries; expected {rows}"),
                (cols > MAX_COLS, f"{cols} inputs exceed MAX_COLS = {MAX_COLS} (int32 sums could overflow)")]
    for bad, msg in problems:
        if bad:
            raise ValueError(msg)
    if not (np.all(np.isfinite(row_scale)) and np.isfinite(x_scale)):
        raise ValueError(f"row_scale and x_scale must be finite (x_scale {x_scale!r})")
    if xq.min() < -127:
        raise ValueError("xq holds -128; quantize_act produces values in [-127, 127]")
    if int(packed.max()) > B3_MAX_BYTE:
        raise ValueError(f"packed (ternary_b3) holds the byte {int(packed.max())} > {B3_MAX_BYTE} (5 base-3 digits)")


def b3_matvec_checked(packed: np.ndarray, row_scale: np.ndarray, xq: np.ndarray, x_scale,
                      out: np.ndarray | None = None, threads: int = 1) -> np.ndarray:
    """Validate, then run the b3 kernel (``threads`` > 1: the parallel kernel at numba's
    current thread count)."""
    rows = row_scale.shape[0] if isinstance(row_scale, np.ndarray) and row_scale.ndim == 1 else 0
    if out is None:
        out = np.empty(rows, dtype=np.float32)
    check_b3_args(packed, row_scale, xq, x_scale, out)
    (b3_matvec if threads == 1 else b3_matvec_par)(packed, row_scale, xq, np.float32(x_scale), out)
    return out


# numba cache hygiene: the cached kernels above embed tern.kernels.simd's helpers
drop_stale_cache(__file__, ("simd.py", "kernels_ternary.py", "packing.py", "prefetch.py", PREFETCH_STAMP), b3_permute)
