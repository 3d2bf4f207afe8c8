"""Embedding, head and router matrices read in the dtype the packed file stores them in.

The engine's tables of full-precision rows (embedding, untied head, MoE routers) come as
fp32, int8 (per-row absmax scale), fp16 or bf16. Converting fp16 / bf16 to fp32 at load
doubles the bytes a token reads (the 1.1B peers shape: a 131 MB fp16 head read as 262 MB);
these kernels read the stored 2-byte values directly and widen them in registers
(``vcvtph2ps`` for fp16, a 16-bit shift for bf16). Both conversions are exact, and each
row's sum runs in the same order as the fp32 kernel's (tern.kernels.kernels_dense), so the
results are bit-identical to converting at load (tested: tests/kernels/test_kernels_stored.py).
On a CPU without F16C the fp16 widening is integer code (:func:`_f16_to_f32_bits`, still
exact); there the loops may vectorize differently, so sums agree to float rounding only.

Also here, shared with tern.kernels.ops: the buffer-address helpers (``u8``, ``f32``: a
tensor's address is ``byte_offset * 2 + buffer_id``, 0 the memory-mapped file, 1 the
engine's aux buffer) and the JIT flags of the per-token code.

Orientation: W is (rows, cols) = (outputs, inputs); ``x`` (cols,) float32.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from tern.kernels.cache_guard import drop_stale_cache
from tern.kernels.kernels_dense import (
    matvec_fp32_nb,
    matvec_fp32_parallel_nb,
    row_dot_bf16,
    row_dot_fp16,
    row_dot_int8,
)
from tern.kernels.prefetch import DENSE_L2_MAX_ROW_BYTES, PREFETCH_STAMP, prefetch_row, rows_ahead
from tern.kernels.simd import target_features

# Reassociation and FMA contraction let LLVM vectorize the reductions (a fixed order for a
# given build, so thread counts never change results); the numpy error model drops the
# zero-division checks that otherwise keep loops with a division scalar. No nnan / ninf:
# softmax starts from -inf.
FASTMATH = {"reassoc", "contract"}
JIT = dict(cache=True, error_model="numpy", fastmath=FASTMATH)
ZERO = np.float32(0.0)

# stored dtype codes of the engine's dense tables (tern.kernels.ops G_EMBED_KIND / G_HEAD_KIND /
# G_ROUTER_KIND)
DENSE_FP32, DENSE_INT8, DENSE_FP16, DENSE_BF16 = 0, 1, 2, 3
DENSE_KINDS = {"fp32": DENSE_FP32, "int8": DENSE_INT8, "fp16": DENSE_FP16, "bf16": DENSE_BF16}


# ---- buffer access ----------------------------------------------------------------------


@numba.njit(cache=True, inline="always")
def u8(buf, aux, addr, nbytes):
    """``nbytes`` bytes at ``addr`` (uint8 view)."""
    off = addr >> 1
    if addr & 1:
        return aux[off:off + nbytes]
    return buf[off:off + nbytes]


@numba.njit(cache=True, inline="always")
def f32(buf, aux, addr, n):
    """``n`` float32 at ``addr``."""
    return u8(buf, aux, addr, 4 * n).view(np.float32)


# ---- 2-byte floats ----------------------------------------------------------------------


@intrinsic
def _f16_to_f32_fpext(typingctx, v):
    """IEEE half (its bits as uint16) -> float32, exact (``fpext``: vcvtph2ps with F16C)."""
    if v != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


@intrinsic
def _u32_as_f32(typingctx, v):
    """The float32 whose bits are the low 32 bits of ``v`` (an unsigned integer: numba
    widens uint32 arithmetic to uint64)."""
    if v not in (types.uint32, types.uint64):
        return None

    def codegen(context, builder, signature, args):
        low = builder.trunc(args[0], ir.IntType(32)) if signature.args[0] == types.uint64 else args[0]
        return builder.bitcast(low, ir.FloatType())
    return types.float32(v), codegen


@intrinsic
def _f32_as_u32(typingctx, v):
    """The bits of float32 ``v`` as uint32."""
    if v != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@numba.njit(cache=True, inline="always")
def _f16_to_f32_bits(h):
    """IEEE half (its bits as uint16) -> float32, exact, in integer arithmetic: for CPUs
    without F16C, where LLVM's ``fpext half`` becomes a call to compiler-rt's
    ``__extendhfsf2``, which numba's JIT cannot link (the process aborts: "LLVM ERROR:
    Symbol not found"). Branch-free (selects), so a loop over a row still vectorizes:
    exponent and mantissa move up 13 bits and the exponent is rebiased (+112); infinities
    and NaNs get the top exponent; zeros and subnormals are renormalised by one float
    subtraction (m x 2^-24 is exact in float32)."""
    b = np.uint32(h)
    o = (b & np.uint32(0x7FFF)) << np.uint32(13)
    e = o & np.uint32(0x0F800000)
    o = o + np.uint32(112 << 23)
    o = o + (np.uint32(112 << 23) if e == np.uint32(0x0F800000) else np.uint32(0))
    sub = _f32_as_u32(_u32_as_f32(o + np.uint32(1 << 23)) - np.float32(6.103515625e-05))  # 2^-14
    bits = (sub if e == np.uint32(0) else o) | ((b & np.uint32(0x8000)) << np.uint32(16))
    return _u32_as_f32(bits)


# the conversion every fp16 reader uses, chosen once for the CPU numba compiles for (each
# target caches its own code)
HAS_F16C = "f16c" in target_features()
f16_to_f32 = _f16_to_f32_fpext if HAS_F16C else _f16_to_f32_bits


@intrinsic
def bf16_to_f32(typingctx, v):
    """bfloat16 (its bits as uint16) -> float32, exact: the bits in the upper half."""
    if v != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        w = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(w, ir.FloatType())
    return types.float32(types.uint16), codegen


@numba.njit(fastmath=True, cache=True, inline="always")
def _plain_dot_f16(W, r, x):
    """sum_c W[r, c] * x[c] over fp16 bits without F16C (LLVM's fpext would call compiler-rt):
    a plain loop over f16_to_f32, so its sums match the fp32 kernel's to float rounding only."""
    s = np.float32(0.0)
    for c in range(x.shape[0]):
        s += f16_to_f32(W[r, c]) * x[c]
    return s


_dot_f16 = row_dot_fp16 if HAS_F16C else _plain_dot_f16


@numba.njit(fastmath=True, cache=True)
def _dot16(W, x, r, bf16):
    """sum_c W[r, c] * x[c], W (rows, cols) uint16 holding fp16 (or ``bf16``) bits, in the order
    of kernels_dense._dot_fp32 (kernels_dense.float_row_dot): bit for bit its sums of the fp32
    conversion (fp16 without F16C: :func:`_plain_dot_f16`)."""
    return row_dot_bf16(W, r, x) if bf16 else _dot_f16(W, r, x)


@numba.njit(cache=True, inline="always")
def _w16_prefetch_stop(W):
    """Rows of fp16 / bf16 the kernels prefetch (prefetch_row's ``stop``): all when a row has at
    most DENSE_L2_MAX_ROW_BYTES (into L2), none when longer: with the IR row dot, AMD EPYC Zen 4,
    1 thread, 131 MB from DRAM (benchmarks/dense_prefetch.py, GB/s whole row ahead / none): 2,048
    columns (the 1.1B peer's head) 17.5 into L1 / 29.6 none, 4,096 12.6 / 24.5; 1,024 30.5 into L2 / 28.4."""
    return W.shape[0] if W.shape[1] * W.itemsize <= DENSE_L2_MAX_ROW_BYTES else 0


@numba.njit(fastmath=True, cache=True)
def matvec_w16(W, x, out, bf16):
    """out (rows,) = W (rows, cols) fp16 / bf16 bits @ x (cols,) float32; one thread. Rows of up to
    DENSE_L2_MAX_ROW_BYTES are prefetched :func:`tern.kernels.prefetch.rows_ahead` rows early
    (:func:`_w16_prefetch_stop`); the
    fp16 / bf16 choice is made outside the row loop (a per-row branch on a runtime flag
    cost the prefetch its gain: measured, 10.4 against 12.0 GB/s)."""
    a = rows_ahead(W)
    n = W.shape[0]
    stop = _w16_prefetch_stop(W)
    if bf16:
        for r in range(n):
            prefetch_row(W, r + a, stop)
            out[r] = _dot16(W, x, r, True)
    else:
        for r in range(n):
            prefetch_row(W, r + a, stop)
            out[r] = _dot16(W, x, r, False)


@numba.njit(fastmath=True, cache=True, parallel=True)
def matvec_w16_par(W, x, out, bf16):
    """:func:`matvec_w16`, output rows split over numba threads (same per-row order)."""
    a = rows_ahead(W)
    n = W.shape[0]
    stop = _w16_prefetch_stop(W)
    if bf16:
        for r in numba.prange(n):
            prefetch_row(W, r + a, stop)
            out[r] = _dot16(W, x, r, True)
    else:
        for r in numba.prange(n):
            prefetch_row(W, r + a, stop)
            out[r] = _dot16(W, x, r, False)


# ---- int8 weights, fp32 activation --------------------------------------------------------


@numba.njit(inline="always", **JIT)
def _int8w_row(Wq, x, r):
    """sum_c Wq[r, c] * x[c] in float32 (the one per-row order both variants use)."""
    s = ZERO
    for c in range(Wq.shape[1]):
        s += np.float32(Wq[r, c]) * x[c]
    return s


@numba.njit(**JIT)
def matvec_int8w(Wq, scale, x, out):
    """out (rows,) = scale * (Wq (rows, cols) int8 @ x (cols,) fp32): an int8-stored matrix
    (embedding / head, per-row absmax scale) times a full-precision activation."""
    a = rows_ahead(Wq)
    for r in range(Wq.shape[0]):
        prefetch_row(Wq, r + a, Wq.shape[0])
        out[r] = _int8w_row(Wq, x, r) * scale[r]


@numba.njit(parallel=True, **JIT)
def matvec_int8w_par(Wq, scale, x, out):
    """:func:`matvec_int8w` with output rows split over numba threads (same per-row order)."""
    a = rows_ahead(Wq)
    for r in numba.prange(Wq.shape[0]):
        prefetch_row(Wq, r + a, Wq.shape[0])
        out[r] = _int8w_row(Wq, x, r) * scale[r]


# ---- the engine's entry points --------------------------------------------------------------


@numba.njit(cache=True)
def dense_matvec(buf, aux, kind, addr, s_addr, rows, cols, x, out, parallel):
    """out (rows,) = the stored (rows, cols) matrix at ``addr`` (``kind``: DENSE_*; int8 with
    its per-row scales at ``s_addr``) @ x (cols,) float32, rows split over threads when
    ``parallel``."""
    if kind == DENSE_INT8:
        Wq = u8(buf, aux, addr, rows * cols).view(np.int8).reshape(rows, cols)
        S = f32(buf, aux, s_addr, rows)
        if parallel:
            matvec_int8w_par(Wq, S, x, out)
        else:
            matvec_int8w(Wq, S, x, out)
    elif kind == DENSE_FP32:
        W = f32(buf, aux, addr, rows * cols).reshape(rows, cols)
        if parallel:
            matvec_fp32_parallel_nb(W, x, out)
        else:
            matvec_fp32_nb(W, x, out)
    else:
        W16 = u8(buf, aux, addr, 2 * rows * cols).view(np.uint16).reshape(rows, cols)
        if parallel:
            matvec_w16_par(W16, x, out, kind == DENSE_BF16)
        else:
            matvec_w16(W16, x, out, kind == DENSE_BF16)


@numba.njit(cache=True)
def dense_row(buf, aux, kind, addr, s_addr, row, cols, out):
    """out (cols,) float32 = row ``row`` of the stored (rows, cols) matrix at ``addr``."""
    if kind == DENSE_INT8:
        q = u8(buf, aux, addr + 2 * row * cols, cols).view(np.int8)
        s = f32(buf, aux, s_addr + 8 * row, 1)[0]
        for i in range(cols):
            out[i] = np.float32(q[i]) * s
    elif kind == DENSE_FP32:
        w = f32(buf, aux, addr + 8 * row * cols, cols)
        for i in range(cols):
            out[i] = w[i]
    else:
        h = u8(buf, aux, addr + 4 * row * cols, 2 * cols).view(np.uint16)
        if kind == DENSE_BF16:
            for i in range(cols):
                out[i] = bf16_to_f32(h[i])
        else:
            for i in range(cols):
                out[i] = f16_to_f32(h[i])


@numba.njit(fastmath=True, cache=True)
def _router_int8(Wq, sc, xn, out):
    """out (E,) = the int8 router Wq (E, D) with row scales sc: each row's weights dequantized
    in the row dot itself (``float32(q) * scale``, as the file reader does, then the fp32 row
    dot's order: kernels_dense.float_row_dot), so the sums are the fp32 table's bit for bit.
    One call per router: calling matvec_fp32_nb once per row (session 25) cost the sweep's 4m
    models with 313-2,676 experts 15-42 % of their 1-thread speed (AMD EPYC Zen 4, committed
    hosts amd-epyc-zen4-s24 / -s26). Until session 38 each row was first dequantized into an L1
    scratch row and then summed: 5.8-6.2 GB/s from DRAM over 128 x 2,560 routers (Zen 4, 1 thread)."""
    E = Wq.shape[0]
    a = rows_ahead(Wq)
    for e in range(E):
        prefetch_row(Wq, e + a, E)
        out[e] = row_dot_int8(Wq, e, xn, sc[e])


@numba.njit(**JIT)
def router_logits(buf, aux, kind, addr, s_addr, E, D, xn, out):
    """out (E,) = router (E, D) @ xn (D,): every kind's rows summed by the same row dot
    (kernels_dense.float_row_dot's order): fp32, fp16 / bf16 widened in it, int8 rows (row
    scales at ``s_addr``) dequantized a row at a time into an L1 scratch row, ``float32(q) *
    scale`` as the file reader dequantizes them: the routing math of docs/MODEL.md is fp32 on
    the exact dequantized weights, so the logits equal the fp32 table's bit for bit while the
    rows are read at their stored width (engines before EnginePolicy.router_int8 dequantized
    int8 routers to an fp32 table at load). The row dots run inside matvec_fp32_nb / matvec_w16,
    compiled with one set of fast-math flags (numba puts a function's flags on every float
    instruction in it, the row dot's too, so the same flags keep the same order)."""
    if kind == DENSE_INT8:
        _router_int8(u8(buf, aux, addr, E * D).view(np.int8).reshape(E, D), f32(buf, aux, s_addr, E), xn, out[:E])
    elif kind == DENSE_FP32:
        matvec_fp32_nb(f32(buf, aux, addr, E * D).reshape(E, D), xn, out[:E])
    else:
        Wh = u8(buf, aux, addr, 2 * E * D).view(np.uint16).reshape(E, D)
        matvec_w16(Wh, xn, out[:E], kind == DENSE_BF16)


# numba cache hygiene: the cached code above embeds tern.kernels.kernels_dense's kernels
drop_stale_cache(__file__, ("kernels_dense.py", "prefetch.py", PREFETCH_STAMP), dense_matvec)
