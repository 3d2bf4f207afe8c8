"""SIMD row-dot primitives for the ternary2 layout, written as numba intrinsics.

numba's own integer promotion (everything narrower than 64 bits is computed in int64)
keeps LLVM from finding the byte dot-product instructions, so the hottest loop — one
packed row against the int8 activations — is emitted here as LLVM IR directly:

* ``avx512vnni``: 64 packed bytes -> four code vectors (one mask each, codes left in place
  and scaled back once per row) -> ``vpdpbusd``
  (u8 code x s8 activation, 4 products summed into each int32 lane);
* ``avx512bw`` / ``avx2``: the same with ``vpmaddubsw`` + ``vpmaddwd`` (512 or 2 x 256 bit);
* any other CPU: :data:`ROW_DOT_ISA` is ``"none"`` and callers use their plain-numba loop.

The ISA is chosen once at import from the CPU numba compiles for (``NUMBA_CPU_NAME`` /
``NUMBA_CPU_FEATURES`` or the host), so cached code always matches the machine.

``rows_codes_dot`` (same arguments) returns the tuple of ROWS_PER_DOT such sums for rows
r, r+1, ... in one pass over xq (each activation vector loaded once for all of them).

``row_codes_dot_pf`` / ``rows_codes_dot_pf``: the same, with software prefetch (tern.kernels.prefetch).

``row_codes_dot(packed, r, xq, nfull, gtail)`` returns ``sum_c code[r, c] * xq[c]`` (int32)
over the first ``nfull`` complete 256-column segments of row ``r`` plus a last, partial
segment of ``gtail`` bytes (``0 <= gtail <= 64``; ``nfull = cols // 256``), where code = w + 1 in {0, 1, 2} and ``xq`` (cols,)
int8 is unpadded: the tail segment uses masked loads for both the packed bytes and the
activations, so nothing is read past a row or past ``xq`` and nothing is allocated.
"""

from __future__ import annotations

import functools

import llvmlite.binding as llvm
import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from tern.kernels.prefetch import PREFETCH_MIN_BYTES, ROW_LOCALITY, emit_prefetch, prefetch_ahead


@functools.cache
def target_features() -> frozenset[str]:
    """Features of numba's target CPU (NUMBA_CPU_NAME/FEATURES, else the host's); read once."""
    if numba.config.CPU_NAME:  # numba compiles for a named CPU: trust only the listed features
        return frozenset(f[1:] for f in (numba.config.CPU_FEATURES or "").split(",") if f.startswith("+"))
    host = llvm.get_host_cpu_features()
    return frozenset(k for k in host if host[k])


def _pick_isa(feats: set[str]) -> str:
    if "avx512vnni" in feats and "avx512bw" in feats:
        return "avx512vnni"
    if "avx512bw" in feats:
        return "avx512bw"
    if "avx2" in feats:
        return "avx2"
    return "none"


ROW_DOT_ISA = _pick_isa(target_features())
SEG_BYTES = 64


_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_V64I8 = ir.VectorType(_I8, 64)
_V16I32 = ir.VectorType(_I32, 16)
_V32I16 = ir.VectorType(_I16, 32)
_V32I8 = ir.VectorType(_I8, 32)
_V8I32 = ir.VectorType(_I32, 8)
_V16I16 = ir.VectorType(_I16, 16)


def _fn(module, name, ret, argtys):
    if name in module.globals:
        return module.globals[name]
    return ir.Function(module, ir.FunctionType(ret, argtys), name)


def _splat(vty, value):
    return ir.Constant(vty, [ir.Constant(vty.element, value)] * vty.count)


def _load_vec(builder, base, offset, vty):
    ptr = builder.gep(base, [offset])
    ptr = builder.bitcast(ptr, ir.PointerType(vty))
    return builder.load(ptr, align=1)


def _broadcast(builder, value, vty):
    """``value`` (a scalar of vty's element type) in every lane of a ``vty`` vector."""
    v = builder.insert_element(ir.Constant(vty, None), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, vty.count), [0] * vty.count))


def _lanes_below(builder, n, nvalid):
    """<n x i1>: lane j < nvalid (i64)."""
    vty = ir.VectorType(_I32, n)
    return builder.icmp_unsigned("<", ir.Constant(vty, list(range(n))), _broadcast(builder, builder.trunc(nvalid, _I32), vty))


def _masked_load(builder, base, offset, vty, nvalid):
    """Load ``vty`` bytes from base+offset keeping lanes < nvalid (others 0), never
    touching memory past the valid lanes."""
    ptr = builder.bitcast(builder.gep(base, [offset]), ir.PointerType(vty))
    fn = _fn(builder.module, f"llvm.masked.load.v{vty.count}i8.p0", vty,
             [ir.PointerType(vty), _I32, ir.VectorType(ir.IntType(1), vty.count), vty])
    return builder.call(fn, [ptr, ir.Constant(_I32, 1), _lanes_below(builder, vty.count, nvalid), ir.Constant(vty, None)])


def _clamp64(builder, v, hi):
    """v (i64) limited to 0 .. hi (a Python int)."""
    zero, c = ir.Constant(_I64, 0), ir.Constant(_I64, hi)
    return builder.select(builder.icmp_signed("<", v, c), builder.select(builder.icmp_signed("<", v, zero), zero, v), c)


def _codes_scaled(builder, packed_vec, k, vty_bytes):
    """Group k's codes left in place, code * 4**k (one AND, no shift); :func:`_unscale`
    shifts the row's accumulators back once (exact: every product is a multiple of 4**k).
    code * 4**k <= 128 fits u8, and vpmaddubsw's int16 pair sums stay <= 2 * 128 * 127."""
    return builder.and_(packed_vec, _splat(vty_bytes, 3 << (2 * k)))


def _unscale(builder, accs, scaled=True):
    """acc_0 + acc_1 / 4 + acc_2 / 16 + acc_3 / 64, lane by lane (exact arithmetic shifts);
    the plain sum of the accumulators when the codes were shifted down (``scaled`` False)."""
    tot = builder.load(accs[0])
    for k, a in enumerate(accs[1:], start=1):
        v = builder.load(a)
        tot = builder.add(tot, builder.ashr(v, _splat(v.type, 2 * k)) if scaled else v)
    return tot


def _codes(builder, packed_vec, k, vty_bytes):
    """Codes of group k (bits 2k..2k+1 of every byte) as a byte vector."""
    n32 = vty_bytes.count // 4
    v32 = ir.VectorType(_I32, n32)
    x = builder.bitcast(packed_vec, v32)
    if k:
        x = builder.lshr(x, _splat(v32, 2 * k))
    x = builder.and_(x, _splat(v32, 0x03030303))
    return builder.bitcast(x, vty_bytes)


def _dot_step(builder, isa, acc, codes, q):
    """acc (int32 lanes) += 4-byte group sums of codes (u8) * q (s8)."""
    m = builder.module
    if isa == "avx512vnni":
        fn = _fn(m, "llvm.x86.avx512.vpdpbusd.512", _V16I32, [_V16I32, _V16I32, _V16I32])
        return builder.call(fn, [acc, builder.bitcast(codes, _V16I32), builder.bitcast(q, _V16I32)])
    if isa == "avx512bw":
        mad = _fn(m, "llvm.x86.avx512.pmaddubs.w.512", _V32I16, [_V64I8, _V64I8])
        wd = _fn(m, "llvm.x86.avx512.pmaddw.d.512", _V16I32, [_V32I16, _V32I16])
        p16 = builder.call(mad, [codes, q])
        return builder.add(acc, builder.call(wd, [p16, _splat(_V32I16, 1)]))
    # avx2: accumulator is <8 x i32>, codes/q are <32 x i8>
    mad = _fn(m, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
    wd = _fn(m, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
    p16 = builder.call(mad, [codes, q])
    return builder.add(acc, builder.call(wd, [p16, _splat(_V16I16, 1)]))


def _emit_row_dot(context, builder, sig, args, isa, nrows, prefetch=0, scaled=None, locality=ROW_LOCALITY):
    """Dot products of rows r .. r+nrows-1 against xq: one pass over xq, each activation
    vector loaded once and used for every row (nrows * 4 vector accumulators); ``prefetch``
    > 0: each full segment prefetches the next pass's rows, >= ``prefetch`` bytes on, at
    ``locality`` (tern.kernels.prefetch.PREFETCH_LEVELS)."""
    pk_ty, _, qp_ty, _, _ = sig.args
    packed_arg, r, qp_arg, nfull, gtail = args  # qp: the unpadded int8 activations
    pk = context.make_array(pk_ty)(context, builder, packed_arg)
    qa = context.make_array(qp_ty)(context, builder, qp_arg)
    stride0 = cgutils.unpack_tuple(builder, pk.strides)[0]
    data = builder.bitcast(pk.data, ir.PointerType(_I8))
    row_bases = [builder.gep(data, [builder.mul(builder.add(r, ir.Constant(_I64, i)), stride0)])
                 for i in range(nrows)]
    qbase = builder.bitcast(qa.data, ir.PointerType(_I8))
    ncols = cgutils.unpack_tuple(builder, qa.shape)[0]

    width = 32 if isa == "avx2" else 64  # bytes per vector
    vbytes = ir.VectorType(_I8, width)
    vacc = _V8I32 if isa == "avx2" else _V16I32
    accs = [[cgutils.alloca_once_value(builder, ir.Constant(vacc, None)) for _ in range(4)]
            for _ in range(nrows)]
    ahead = prefetch_ahead(builder, stride0, nrows, prefetch) if prefetch else None
    # one-row pass: codes masked in place (one AND per group); multi-row: shifted down, then
    # masked. Same sums. AMD EPYC Zen 4, 1 thread (benchmarks/row_dot_form.py, 3 processes):
    # 4-row pass over 128 KiB matrices from DRAM x1.20-1.29 shifted (1-6 % slower in L3); the
    # one-row pass up to x1.17 masked. The 10B pick: x1.32 at 1 thread (session 20).
    scaled = nrows == 1 if scaled is None else scaled  # given: benchmarks/row_dot_form.py
    codes_of = _codes_scaled if scaled else _codes

    def segment(seg_byte, seg_q, g, tail):
        """Accumulate one segment of g bytes (g = 64, or the last segment's length)."""
        for h in range(SEG_BYTES // width):  # halves for avx2
            off = builder.add(seg_byte, ir.Constant(_I64, h * width))
            if tail:
                nvalid = _clamp64(builder, builder.sub(g, ir.Constant(_I64, h * width)), width)
                pvs = [_masked_load(builder, rb, off, vbytes, nvalid) for rb in row_bases]
            else:
                if ahead is not None and h == 0:  # one prefetch per 64-byte segment and row
                    for rb in row_bases:
                        emit_prefetch(builder, rb, builder.add(off, ahead), locality)
                pvs = [_load_vec(builder, rb, off, vbytes) for rb in row_bases]
            for k in range(4):
                qoff = builder.add(seg_q, builder.add(builder.mul(g, ir.Constant(_I64, k)),
                                                      ir.Constant(_I64, h * width)))
                if tail:  # activations past the end of xq are not read (their codes are 0)
                    qvalid = _clamp64(builder, builder.sub(ncols, qoff), width)
                    q = _masked_load(builder, qbase, qoff, vbytes, qvalid)
                else:
                    q = _load_vec(builder, qbase, qoff, vbytes)
                for i, pv in enumerate(pvs):
                    a = accs[i][k]
                    builder.store(_dot_step(builder, isa, builder.load(a), codes_of(builder, pv, k, vbytes), q), a)

    with cgutils.for_range(builder, nfull) as loop:
        i = loop.index
        segment(builder.mul(i, ir.Constant(_I64, SEG_BYTES)), builder.mul(i, ir.Constant(_I64, 4 * SEG_BYTES)),
                ir.Constant(_I64, SEG_BYTES), False)
    def half_tail(seg_byte, seg_q):
        """The last segment when it is exactly 128 columns (32 bytes: d_model 384, 640, ...):
        plain 32-byte loads, no masks, zero-extended to the vector width and summed straight
        into each row's accumulators. (It had kept 16 separate 256-bit tail accumulators: with
        all 32 vector registers taken, LLVM spilled them through 64-byte stack slots of a
        frame it does not realign, and where the process's stack put a slot across a cache line
        every store-to-load forward failed: 4-row passes over 384 columns ran 1.9x slower in
        one process than in the next, by stack depth alone. benchmarks/README.md.)"""
        v32 = ir.VectorType(_I8, 32)

        def widen(v):  # upper lanes 0: their codes and products are 0
            if width == 32:
                return v
            return builder.shuffle_vector(v, ir.Constant(v32, [0] * 32), ir.Constant(ir.VectorType(_I32, 64),
                                                                                     list(range(64))))

        pvs = [widen(_load_vec(builder, rb, seg_byte, v32)) for rb in row_bases]
        for k in range(4):
            q = widen(_load_vec(builder, qbase, builder.add(seg_q, ir.Constant(_I64, 32 * k)), v32))
            for i, pv in enumerate(pvs):
                a = accs[i][k]
                builder.store(_dot_step(builder, isa, builder.load(a), codes_of(builder, pv, k, vbytes), q), a)

    with builder.if_then(builder.icmp_signed(">", gtail, ir.Constant(_I64, 0))):
        seg_byte = builder.mul(nfull, ir.Constant(_I64, SEG_BYTES))
        seg_q = builder.mul(nfull, ir.Constant(_I64, 4 * SEG_BYTES))
        exact128 = builder.icmp_signed("==", builder.sub(ncols, seg_q), ir.Constant(_I64, 128))
        with builder.if_else(exact128) as (fast, general):
            with fast:
                half_tail(seg_byte, seg_q)
            with general:
                segment(seg_byte, seg_q, gtail, True)
    red = _fn(builder.module, f"llvm.vector.reduce.add.v{vacc.count}i32", _I32, [vacc])
    sums = []
    for row in accs:  # scaled: accumulator k holds 4**k times its group's dot (_codes_scaled)
        sums.append(builder.call(red, [_unscale(builder, row, scaled)]))
    if nrows == 1:
        return sums[0]
    return context.make_tuple(builder, sig.return_type, sums)


def rows_dot_intrinsic(nrows, emit):
    """A numba intrinsic ``f(packed, r, x, nfull, gtail)`` over a C-contiguous uint8 matrix
    and an int8 vector returning ``nrows`` int32 dots (one int32 when ``nrows == 1``); the
    index arguments arrive as i64 and ``emit(context, builder, signature, args)`` emits
    the body (the ternary2 row dot here, the base-3 one in tern.kernels.kernels_b3)."""
    @intrinsic
    def rows_dot(typingctx, packed, r, x, nfull, gtail):
        if not (isinstance(packed, types.Array) and packed.ndim == 2 and packed.dtype == types.uint8
                and packed.layout == "C"
                and isinstance(x, types.Array) and x.ndim == 1 and x.dtype == types.int8
                and x.layout == "C"):
            return None
        ret = types.int32 if nrows == 1 else types.UniTuple(types.int32, nrows)
        sig = ret(packed, types.int64, x, types.int64, types.int64)

        def codegen(context, builder, signature, args):
            a = list(args)
            for i in (1, 3, 4):  # index arguments as i64
                a[i] = context.cast(builder, a[i], signature.args[i], types.int64)
            return emit(context, builder, signature, a)

        return sig, codegen

    return rows_dot


def _make_row_dot(isa, nrows=1, prefetch=0, scaled=None, locality=ROW_LOCALITY):
    return rows_dot_intrinsic(nrows, lambda context, builder, sig, args:
                              _emit_row_dot(context, builder, sig, args, isa, nrows, prefetch, scaled, locality))


ROWS_PER_DOT = 2 if ROW_DOT_ISA == "avx2" else 4  # rows sharing one pass over xq (register budget)
_ISA = ROW_DOT_ISA if ROW_DOT_ISA != "none" else "avx2"
row_codes_dot = _make_row_dot(_ISA)
rows_codes_dot = _make_row_dot(_ISA, ROWS_PER_DOT)
row_codes_dot_pf = _make_row_dot(_ISA, 1, PREFETCH_MIN_BYTES)
rows_codes_dot_pf = _make_row_dot(_ISA, ROWS_PER_DOT, PREFETCH_MIN_BYTES)


@intrinsic
def popcount64(typingctx, x):
    """Number of set bits of a uint64 (``llvm.ctpop``; vpopcntq when vectorized)."""
    if x != types.uint64:
        return None

    def codegen(context, builder, signature, args):
        fn = _fn(builder.module, "llvm.ctpop.i64", _I64, [_I64])
        return builder.call(fn, [args[0]])

    return types.uint64(types.uint64), codegen


# ---- activation-skip accumulate (transposed orientation) ------------------------------------

SKIP_CHUNK_BYTES = 32 if ROW_DOT_ISA == "avx2" else 64  # packed bytes one skip_chunk call covers


def _interleave4(builder, c, width):
    """Byte vectors c[0..3] (width bytes, byte j = code of output j for input i) -> width/16
    vectors whose 4-byte lane i of vector m holds (c0[16m+i], c1[16m+i], c2[16m+i], c3[16m+i])."""
    def pairs(a, b, half):  # bytes (a[j], b[j]) for j in half*width/2 ..
        base = half * width // 2
        mask = []
        for j in range(width // 2):
            mask += [base + j, width + base + j]
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, width), mask))

    p01 = [pairs(c[0], c[1], h) for h in range(2)]  # each: 2-byte pairs of width/2 outputs
    p23 = [pairs(c[2], c[3], h) for h in range(2)]
    out = []
    w16 = ir.VectorType(_I16, width // 2)
    for m in range(width // 16):
        h, o = divmod(16 * m, width // 2)  # which pair vector, output offset inside it
        a = builder.bitcast(p01[h], w16)
        b = builder.bitcast(p23[h], w16)
        mask = []
        for i in range(16):
            mask += [o + i, width // 2 + o + i]
        out.append(builder.bitcast(builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, 32), mask)),
                                   ir.VectorType(_I8, 64)))
    return out


def _emit_skip_chunk(context, builder, sig, args, isa, width):
    pk_ty, idx_ty, qq_ty, _, _, _, _, acc_ty = sig.args
    packed_arg, idx_arg, qq_arg, g0, g1, byte_off, nvalid, acc_arg = args
    pk = context.make_array(pk_ty)(context, builder, packed_arg)
    ia = context.make_array(idx_ty)(context, builder, idx_arg)
    qa = context.make_array(qq_ty)(context, builder, qq_arg)
    aa = context.make_array(acc_ty)(context, builder, acc_arg)
    stride0 = cgutils.unpack_tuple(builder, pk.strides)[0]
    base = builder.gep(builder.bitcast(pk.data, ir.PointerType(_I8)), [byte_off])
    idx_ptr = builder.bitcast(ia.data, ir.PointerType(_I64))
    qq_ptr = builder.bitcast(qa.data, ir.PointerType(_I32))
    acc_ptr = builder.bitcast(aa.data, ir.PointerType(_I32))

    vbytes = ir.VectorType(_I8, width)
    nm = width // 16  # accumulator vectors per code group k (16 int32 lanes each)
    accs = []
    for k in range(4):  # running sums come from acc (k * width + j) and go back there
        row = []
        for m in range(nm):
            ptr = builder.bitcast(builder.gep(acc_ptr, [ir.Constant(_I64, k * width + 16 * m)]),
                                  ir.PointerType(_V16I32))
            row.append(cgutils.alloca_once_value(builder, builder.load(ptr, align=4)))
        accs.append(row)
    full = builder.icmp_signed(">=", nvalid, ir.Constant(_I64, width))

    with cgutils.for_range(builder, g1, start=g0) as loop:
        gi = loop.index
        rows = []
        for t in range(4):
            rix = builder.load(builder.gep(idx_ptr, [builder.add(builder.mul(gi, ir.Constant(_I64, 4)),
                                                                   ir.Constant(_I64, t))]))
            rows.append(builder.gep(base, [builder.mul(rix, stride0)]))
        q4 = builder.load(builder.gep(qq_ptr, [gi]))  # 4 activation bytes of this group
        qv = _broadcast(builder, q4, _V16I32)
        with builder.if_else(full) as (then, otherwise):
            with then:
                pv_full = [builder.load(builder.bitcast(p, ir.PointerType(vbytes)), align=1) for p in rows]
                bb_full = builder.basic_block
            with otherwise:
                pv_part = [_masked_load(builder, p, ir.Constant(_I64, 0), vbytes, nvalid) for p in rows]
                bb_part = builder.basic_block
        pvs = []
        for a, b in zip(pv_full, pv_part, strict=True):
            phi = builder.phi(vbytes)
            phi.add_incoming(a, bb_full)
            phi.add_incoming(b, bb_part)
            pvs.append(phi)
        inter = _interleave4(builder, pvs, width)  # the 4 rows' bytes once; (lane >> 2k) & 3: group k's codes
        for k in range(4):
            for m, iv in enumerate(inter):
                a = accs[k][m]
                builder.store(_skip_dot(builder, isa, builder.load(a), _codes(builder, iv, k, _V64I8), qv), a)
    for k in range(4):
        for m in range(nm):
            ptr = builder.gep(acc_ptr, [ir.Constant(_I64, k * width + 16 * m)])
            builder.store(builder.load(accs[k][m]), builder.bitcast(ptr, ir.PointerType(_V16I32)), align=4)
    return context.get_dummy_value()


def _skip_dot(builder, isa, acc, codes64, q4):
    """acc (16 int32) += per-lane sum over 4 bytes of codes (u8) * q4 bytes (s8)."""
    if isa in ("avx512vnni", "avx512bw"):
        return _dot_step(builder, isa, acc, codes64, builder.bitcast(q4, _V64I8))
    # avx2: two 256-bit halves
    lo = ir.Constant(_V8I32, list(range(8)))
    hi = ir.Constant(_V8I32, list(range(8, 16)))
    parts = []
    c32 = builder.bitcast(codes64, _V16I32)
    for sel in (lo, hi):
        a8 = builder.shuffle_vector(acc, acc, sel)
        c8 = builder.bitcast(builder.shuffle_vector(c32, c32, sel), _V32I8)
        q8 = builder.bitcast(builder.shuffle_vector(q4, q4, sel), _V32I8)
        parts.append(_dot_step(builder, isa, a8, c8, q8))
    return builder.shuffle_vector(parts[0], parts[1], ir.Constant(_V16I32, list(range(16))))


def _make_skip_chunk(isa, width):
    @intrinsic
    def skip_chunk(typingctx, packed_t, idx, qq, g0, g1, byte_off, nvalid, acc):
        """acc[k * width + j] += sum over groups g0 <= g < g1 of sum_t code(idx[4g+t], byte_off + j, k)
        * q_t (j < nvalid <= width; code = w + 1, q_t the bytes of qq[g])."""
        ok = (isinstance(packed_t, types.Array) and packed_t.ndim == 2 and packed_t.dtype == types.uint8
              and packed_t.layout == "C"
              and isinstance(idx, types.Array) and idx.ndim == 1 and idx.dtype == types.int64
              and isinstance(qq, types.Array) and qq.ndim == 1 and qq.dtype == types.int32
              and isinstance(acc, types.Array) and acc.ndim == 1 and acc.dtype == types.int32)
        if not ok:
            return None
        sig = types.none(packed_t, idx, qq, types.int64, types.int64, types.int64, types.int64, acc)

        def codegen(context, builder, signature, args):
            return _emit_skip_chunk(context, builder, signature, list(args), isa, width)

        return sig, codegen

    return skip_chunk


skip_chunk = _make_skip_chunk(ROW_DOT_ISA if ROW_DOT_ISA != "none" else "avx2", SKIP_CHUNK_BYTES)


# ---- AVX-512 VBMI (vpermi2b) for the T-MAC-style lookups of tern.kernels.kernels_lut ----------

HAS_VBMI = {"avx512vbmi", "avx512bw"} <= target_features()
