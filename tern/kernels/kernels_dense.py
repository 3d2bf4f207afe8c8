"""Dense matvec baselines: fp32 and int8 (int8 weights x int8 activations, int32 sums).

These are the decode engine's baseline kernels and the compute roof the probe measures
(``tern.probe.kernel_table``). Orientation: W is (rows, cols) = (output units, inputs).

    matvec_fp32:  out[r] = sum_c W[r, c] * x[c]
    matvec_int8:  out[r] = row_scale[r] * x_scale * sum_c Wq[r, c] * xq[c]   (sum exact, int32)

The ``*_nb`` functions are ``@njit(cache=True)`` kernels for numba callers (the engine);
they assume validated, C-contiguous inputs. The functions without ``_nb`` validate and
raise ``ValueError`` naming the problem. ``*_parallel`` variants split output rows over
numba's threads (``prange``). The int32 sum is exact while cols * 127 * 127 < 2**31
(cols < 133 000), which :func:`matvec_int8` checks.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

INT8_MAX_COLS = (2**31 - 1) // (127 * 127)  # int32 sums of int8 x int8 products stay exact
_F32, _I32, _I64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
DOT_LANES, DOT_ACCS = 16, 4  # the float row dot's vector accumulators: DOT_ACCS of DOT_LANES lanes


def _widen(builder, ptr, kind, lanes=DOT_LANES):
    """``lanes`` weights at the i8 pointer ``ptr`` as float32 lanes: fp32 loaded, fp16 widened
    (``fpext``: F16C's vcvtph2ps), bf16 shifted into the upper half, int8 converted (all exact)."""
    f32s = ir.VectorType(_F32, lanes)
    if kind == "int8":  # sign-extended and converted exactly (vpmovsxbd + vcvtdq2ps)
        v = builder.load(builder.bitcast(ptr, ir.PointerType(ir.VectorType(ir.IntType(8), lanes))), align=1)
        return builder.sitofp(v, f32s)
    if kind == "fp32":
        return builder.load(builder.bitcast(ptr, ir.PointerType(f32s)), align=1)
    v = builder.load(builder.bitcast(ptr, ir.PointerType(ir.VectorType(ir.IntType(16), lanes))), align=1)
    if kind == "fp16":
        return builder.fpext(builder.bitcast(v, ir.VectorType(ir.HalfType(), lanes)), f32s)
    return builder.bitcast(builder.shl(builder.zext(v, ir.VectorType(_I32, lanes)), ir.Constant(ir.VectorType(_I32, lanes), 16)),
                           f32s)


def float_row_dot(kind: str):
    """An intrinsic ``f(W, r, x)`` -> float32 sum_c W[r, c] * x[c], W (rows, cols) C-contiguous
    float32 (``kind`` "fp32") or uint16 bits of fp16 / bf16, x (cols,) float32; for ``kind``
    "int8" ``f(W, r, x, s)``: W int8 and s the row's float32 scale, each weight dequantized as
    ``float32(q) * s`` (rounded before its FMA, as the file reader's table), the same IR for
    every kind: DOT_ACCS accumulators of DOT_LANES lanes over blocks of DOT_ACCS * DOT_LANES
    columns (products contracted into FMAs), summed lane-wise, their lanes summed in order, then
    the remaining columns one by one. numba puts its caller's fast-math flags on every float
    instruction of a function, these too, so every caller is compiled with fastmath=True
    (matvec_fp32_nb, matvec_w16): under the same flags a stored fp16 / bf16 matrix gives the
    sums of its fp32 conversion bit for bit (tested). Written as IR because LLVM's own
    vectorisation of the plain loop read an fp16 head at 12.8 GB/s from DRAM where this reads
    29.1 (AMD EPYC Zen 4, 1 thread, 32,000 x 2,048: the 1.1B peer's head; 45 in L2)."""
    wdt = {"fp32": types.float32, "int8": types.int8}.get(kind, types.uint16)
    item = {"fp32": 4, "int8": 1}.get(kind, 2)

    scaled = kind == "int8"  # int8 rows carry a row scale: w = float32(q) * s, as the file reader dequantizes

    # the body of both signatures
    def codegen(context, builder, signature, args):
        wa = context.make_array(signature.args[0])(context, builder, args[0])
        xa = context.make_array(signature.args[2])(context, builder, args[2])
        r = context.cast(builder, args[1], signature.args[1], types.int64)
        row = builder.gep(builder.bitcast(wa.data, ir.PointerType(ir.IntType(8))),
                          [builder.mul(r, cgutils.unpack_tuple(builder, wa.strides)[0])])
        xb = builder.bitcast(xa.data, ir.PointerType(ir.IntType(8)))
        cols = cgutils.unpack_tuple(builder, xa.shape)[0]
        vty = ir.VectorType(_F32, DOT_LANES)
        splats = {}  # int8: the row scale in every lane, per block width (built once, before the loops)
        if scaled:
            for lanes in (DOT_LANES, 1):
                v = builder.insert_element(ir.Constant(ir.VectorType(_F32, lanes), None), args[3], ir.Constant(_I32, 0))
                splats[lanes] = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes))

        def weights(ptr, lanes):  # a block's weights as float32 lanes; int8 dequantized (no fma: q * s rounds)
            w = _widen(builder, ptr, kind, lanes)
            return builder.fmul(w, splats[lanes]) if scaled else w

        accs = [cgutils.alloca_once_value(builder, ir.Constant(vty, [0.0] * DOT_LANES)) for _ in range(DOT_ACCS)]
        block = DOT_ACCS * DOT_LANES
        nblocks = builder.sdiv(cols, ir.Constant(_I64, block))
        with cgutils.for_range(builder, nblocks) as loop:
            c0 = builder.mul(loop.index, ir.Constant(_I64, block))
            for k, acc in enumerate(accs):
                c = builder.add(c0, ir.Constant(_I64, k * DOT_LANES))
                w = weights(builder.gep(row, [builder.mul(c, ir.Constant(_I64, item))]), DOT_LANES)
                xv = _widen(builder, builder.gep(xb, [builder.mul(c, ir.Constant(_I64, 4))]), "fp32")
                builder.store(builder.fadd(builder.load(acc), builder.fmul(w, xv, flags=["contract"]),
                                           flags=["contract"]), acc)
        tot = builder.load(accs[0])
        for acc in accs[1:]:
            tot = builder.fadd(tot, builder.load(acc))
        s = cgutils.alloca_once_value(builder, builder.extract_element(tot, ir.Constant(_I32, 0)))
        for i in range(1, DOT_LANES):
            builder.store(builder.fadd(builder.load(s), builder.extract_element(tot, ir.Constant(_I32, i))), s)
        with cgutils.for_range(builder, builder.sub(cols, builder.mul(nblocks, ir.Constant(_I64, block)))) as loop:
            c = builder.add(builder.mul(nblocks, ir.Constant(_I64, block)), loop.index)
            def one(v):  # lane 0 of a one-lane block
                return builder.extract_element(v, ir.Constant(_I32, 0))
            w = one(weights(builder.gep(row, [builder.mul(c, ir.Constant(_I64, item))]), 1))
            xv = one(_widen(builder, builder.gep(xb, [builder.mul(c, ir.Constant(_I64, 4))]), "fp32", 1))
            builder.store(builder.fadd(builder.load(s), builder.fmul(w, xv, flags=["contract"]), flags=["contract"]), s)
        return builder.load(s)

    def typed(W, x, scale):
        if not (isinstance(W, types.Array) and W.ndim == 2 and W.dtype == wdt and W.layout == "C"
                and isinstance(x, types.Array) and x.ndim == 1 and x.dtype == types.float32 and x.layout == "C"
                and len(scale) == int(scaled) and all(t == types.float32 for t in scale)):
            return None
        return types.float32(W, types.int64, x, *scale), codegen

    if scaled:
        @intrinsic
        def row_dot(typingctx, W, r, x, s):
            return typed(W, x, (s,))
    else:
        @intrinsic
        def row_dot(typingctx, W, r, x):
            return typed(W, x, ())

    return row_dot


row_dot_fp32, row_dot_fp16, row_dot_bf16, row_dot_int8 = (float_row_dot(k) for k in ("fp32", "fp16", "bf16", "int8"))


# ---- column blocks: a matvec with no horizontal sums -----------------------------------------
COLUMN_BLOCK = 64  # outputs per block of :func:`column_blocks` (4 vectors of DOT_LANES float32 lanes)


def column_blocks(W: np.ndarray, block: int = COLUMN_BLOCK) -> np.ndarray:
    """W (rows, cols) -> (ceil(rows / block), cols, block), C-contiguous: block b holds rows
    b * block .. b * block + block - 1 transposed (column c of those rows as ``block`` contiguous
    values), the rows past ``rows`` zero; float16 as its uint16 bits. The layout
    :func:`block_matvec` reads as one stream."""
    if W.ndim != 2:
        raise ValueError(f"column_blocks needs a 2-D matrix, got shape {W.shape}")
    W = W.view(np.uint16) if W.dtype == np.float16 else W
    nb = -(-W.shape[0] // block)
    out = np.zeros((nb * block, W.shape[1]), W.dtype)
    out[:W.shape[0]] = W
    return np.ascontiguousarray(out.reshape(nb, block, W.shape[1]).transpose(0, 2, 1))


def _block_matvec_codegen(kind: str):
    """Code of :func:`block_matvec`: acc[j] = sum_c Wb[b, c, j] * x[c] for j < COLUMN_BLOCK,
    Wb (blocks, cols, COLUMN_BLOCK) C-contiguous float32 (``kind`` "fp32") or uint16 bits of fp16
    (:func:`column_blocks` of a (rows, cols) matrix), x (>= cols,) and acc (COLUMN_BLOCK,) float32.
    Every output has its own lane, so nothing is summed across lanes: two sets of
    COLUMN_BLOCK / DOT_LANES vector accumulators take the even and the odd columns (products
    contracted into FMAs, 8 independent chains), added once at the end. The SSM's dt projection
    (Di x R, R = 160 on the d2560 10B picks) read as stored, one dot per channel, spent most of its
    time summing each row's lanes: AMD EPYC Zen 4, 1 thread, 5120 x 160 fp16 in cache 51.6 -> 33.9 us
    (benchmarks/README, "The scan's dt projection in column blocks")."""
    item = {"fp32": 4}.get(kind, 2)
    nvec = COLUMN_BLOCK // DOT_LANES

    def codegen(context, builder, signature, args):
        wa = context.make_array(signature.args[0])(context, builder, args[0])
        xa = context.make_array(signature.args[2])(context, builder, args[2])
        aa = context.make_array(signature.args[3])(context, builder, args[3])
        b = context.cast(builder, args[1], signature.args[1], types.int64)
        s0, s1, _ = cgutils.unpack_tuple(builder, wa.strides)
        cols = cgutils.unpack_tuple(builder, wa.shape)[1]
        blk = builder.gep(builder.bitcast(wa.data, ir.PointerType(ir.IntType(8))), [builder.mul(b, s0)])
        xp = builder.bitcast(xa.data, ir.PointerType(_F32))
        vty = ir.VectorType(_F32, DOT_LANES)
        zero = ir.Constant(vty, [0.0] * DOT_LANES)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(nvec)] for _ in range(2)]

        def column(c, acc):  # acc[m] += Wb[b, c, 16m ..] * x[c]
            xv = builder.insert_element(ir.Constant(vty, None), builder.load(builder.gep(xp, [c])), ir.Constant(_I32, 0))
            xv = builder.shuffle_vector(xv, xv, ir.Constant(ir.VectorType(_I32, DOT_LANES), [0] * DOT_LANES))
            row = builder.gep(blk, [builder.mul(c, s1)])
            for m in range(nvec):
                w = _widen(builder, builder.gep(row, [ir.Constant(_I64, m * DOT_LANES * item)]), kind)
                builder.store(builder.fadd(builder.load(acc[m]), builder.fmul(w, xv, flags=["contract"]),
                                           flags=["contract"]), acc[m])

        npair = builder.sdiv(cols, ir.Constant(_I64, 2))
        with cgutils.for_range(builder, npair) as loop:
            c = builder.mul(loop.index, ir.Constant(_I64, 2))
            column(c, accs[0])
            column(builder.add(c, ir.Constant(_I64, 1)), accs[1])
        with builder.if_then(builder.icmp_signed("!=", builder.mul(npair, ir.Constant(_I64, 2)), cols)):
            column(builder.sub(cols, ir.Constant(_I64, 1)), accs[0])
        ap = builder.bitcast(aa.data, ir.PointerType(_F32))
        for m in range(nvec):
            tot = builder.fadd(builder.load(accs[0][m]), builder.load(accs[1][m]))
            builder.store(tot, builder.bitcast(builder.gep(ap, [ir.Constant(_I64, m * DOT_LANES)]), ir.PointerType(vty)),
                          align=4)
        return context.get_dummy_value()

    return codegen


_BLOCK_KINDS = {types.float32: "fp32", types.uint16: "fp16"}  # Wb's dtype -> the weights' kind
_BLOCK_CODEGEN = {kind: _block_matvec_codegen(kind) for kind in _BLOCK_KINDS.values()}


@intrinsic
def block_matvec(typingctx, Wb, b, x, acc):
    """``block_matvec(Wb, b, x, acc)``: block b of a :func:`column_blocks` matrix (float32, or fp16 as
    uint16 bits) times x into acc (COLUMN_BLOCK,) float32 (:func:`_block_matvec_codegen`)."""
    if not (isinstance(Wb, types.Array) and Wb.ndim == 3 and Wb.dtype in _BLOCK_KINDS and Wb.layout == "C"
            and isinstance(b, types.Integer)
            and isinstance(x, types.Array) and x.ndim == 1 and x.dtype == types.float32 and x.layout == "C"
            and isinstance(acc, types.Array) and acc.ndim == 1 and acc.dtype == types.float32 and acc.layout == "C"):
        return None
    return types.none(Wb, b, x, acc), _BLOCK_CODEGEN[_BLOCK_KINDS[Wb.dtype]]


@njit(cache=True, inline="always")
def _dot_fp32(W, x, r):
    """sum_c W[r, c] * x[c] (:func:`float_row_dot`'s order)."""
    return row_dot_fp32(W, r, x)


@njit(cache=True)
def _dot_int8(Wq, xq, r):
    """sum_c Wq[r, c] * xq[c] in int32. The explicit int32 casts keep numba from widening
    to int64, so LLVM emits sign-extend + vpmaddwd (16-bit multiply, 32-bit pair sums)."""
    s = np.int32(0)
    for c in range(xq.shape[0]):
        s = np.int32(s + np.int32(Wq[r, c]) * np.int32(xq[c]))
    return s


@njit(fastmath=True, cache=True)
def matvec_fp32_nb(W, x, out):
    """out (rows,) f4 = W (rows, cols) f4 @ x (cols,) f4; one thread."""
    for r in range(W.shape[0]):
        out[r] = _dot_fp32(W, x, r)


@njit(fastmath=True, cache=True, parallel=True)
def matvec_fp32_parallel_nb(W, x, out):
    """As :func:`matvec_fp32_nb`, output rows split over numba's threads."""
    for r in prange(W.shape[0]):
        out[r] = _dot_fp32(W, x, r)


@njit(cache=True)
def matvec_int8_nb(Wq, row_scale, xq, x_scale, out):
    """out (rows,) f4 = row_scale (rows,) f4 * x_scale * (Wq (rows, cols) i1 @ xq (cols,) i1)."""
    for r in range(Wq.shape[0]):
        out[r] = np.float32(_dot_int8(Wq, xq, r)) * row_scale[r] * x_scale


@njit(cache=True, parallel=True)
def matvec_int8_parallel_nb(Wq, row_scale, xq, x_scale, out):
    """As :func:`matvec_int8_nb`, output rows split over numba's threads."""
    for r in prange(Wq.shape[0]):
        out[r] = np.float32(_dot_int8(Wq, xq, r)) * row_scale[r] * x_scale


# ---- validating wrappers --------------------------------------------------------------------


def _need(name: str, a: object, dtype: type, ndim: int) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != np.dtype(dtype) or a.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D {np.dtype(dtype).name} array, "
                         f"got {a.ndim}-D {a.dtype}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use np.ascontiguousarray)")
    return a


def _check_matvec(w_name: str, W: np.ndarray, w_dtype: type, x_name: str, x: np.ndarray,
                  x_dtype: type, per_row: dict[str, np.ndarray]) -> int:
    """W (rows, cols), x (cols,) and float32 (rows,) arrays ``per_row``; returns cols."""
    _need(w_name, W, w_dtype, 2)
    _need(x_name, x, x_dtype, 1)
    rows, cols = W.shape
    if x.shape[0] != cols:
        raise ValueError(f"{x_name} has {x.shape[0]} elements but {w_name} has {cols} columns")
    for name, a in per_row.items():
        _need(name, a, np.float32, 1)
        if a.shape[0] != rows:
            raise ValueError(f"{name} has {a.shape[0]} elements but {w_name} has {rows} rows")
    return cols


def check_matvec_fp32(W: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """Raise ValueError unless W (rows, cols) f4, x (cols,) f4, out (rows,) f4 fit."""
    _check_matvec("W", W, np.float32, "x", x, np.float32, {"out": out})


def check_matvec_int8(Wq: np.ndarray, row_scale: np.ndarray, xq: np.ndarray, x_scale: float,
                      out: np.ndarray) -> None:
    """Raise ValueError unless Wq (rows, cols) i1, row_scale (rows,) f4, xq (cols,) i1,
    a finite x_scale and out (rows,) f4 fit, with cols small enough for exact int32 sums."""
    cols = _check_matvec("Wq", Wq, np.int8, "xq", xq, np.int8, {"row_scale": row_scale, "out": out})
    if cols > INT8_MAX_COLS:
        raise ValueError(f"{cols} columns can overflow the int32 sum (at most {INT8_MAX_COLS})")
    if not np.isfinite(x_scale):
        raise ValueError(f"x_scale must be finite, got {x_scale}")


def matvec_fp32(W: np.ndarray, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = W @ x (fp32, one thread), validated; returns out."""
    check_matvec_fp32(W, x, out)
    matvec_fp32_nb(W, x, out)
    return out


def matvec_fp32_parallel(W: np.ndarray, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = W @ x (fp32, rows over numba's threads), validated; returns out."""
    check_matvec_fp32(W, x, out)
    matvec_fp32_parallel_nb(W, x, out)
    return out


def matvec_int8(Wq: np.ndarray, row_scale: np.ndarray, xq: np.ndarray, x_scale: float,
                out: np.ndarray) -> np.ndarray:
    """out = row_scale * x_scale * (Wq @ xq) with an exact int32 sum (one thread); returns out."""
    check_matvec_int8(Wq, row_scale, xq, x_scale, out)
    matvec_int8_nb(Wq, row_scale, xq, np.float32(x_scale), out)
    return out


def matvec_int8_parallel(Wq: np.ndarray, row_scale: np.ndarray, xq: np.ndarray, x_scale: float,
                         out: np.ndarray) -> np.ndarray:
    """As :func:`matvec_int8`, output rows over numba's threads; returns out."""
    check_matvec_int8(Wq, row_scale, xq, x_scale, out)
    matvec_int8_parallel_nb(Wq, row_scale, xq, np.float32(x_scale), out)
    return out
