"""Ternary matvec kernels and activation quantization against numpy references."""

import numba
import numpy as np
import pytest

from tern.kernels import kernels_ternary as K
from tern.kernels import packing as P
from tern.kernels import simd
from tern.kernels.quant import quantize_act, quantize_act_checked
from tern.probe.ternary_variants import VARIANTS, calibrate_kernels, get_variant


def _host_isas_list():
    order = ["avx2", "avx512bw", "avx512vnni"]
    if simd.ROW_DOT_ISA == "none":
        return []
    return order[: order.index(simd.ROW_DOT_ISA) + 1]



SHAPES = [(1, 1), (1, 300), (3, 5), (7, 64), (5, 255), (4, 256), (9, 257), (33, 700), (17, 1100), (64, 4096),
          (5, 128), (9, 384), (6, 640)]  # the last three: a last segment of exactly 128 columns


def _problem(rows, cols, seed, p_zero_act=0.0):
    rng = np.random.default_rng(seed)
    wt = rng.integers(-1, 2, size=(rows, cols)).astype(np.int8)  # (rows, cols)
    xq = rng.integers(-127, 128, size=cols).astype(np.int8)  # (cols,)
    xq[rng.random(cols) < p_zero_act] = 0
    rs = (rng.random(rows) + 0.5).astype(np.float32)  # (rows,)
    return wt, rs, xq, np.float32(0.0123)


def _ref_quantize(x, eps=1e-5):
    """docs/MODEL.md BitLinear activation quantizer in numpy float32."""
    ms = np.float32((x.astype(np.float64) ** 2).mean())
    u = x / np.sqrt(ms + np.float32(eps))  # (n,)
    a = max(np.abs(u).max(), np.float32(1e-5))
    q = np.clip(np.rint(u * np.float32(127.0) / a), -127, 127).astype(np.int8)
    return q, np.float32(a / np.float32(127.0))


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000])
def test_quantize_act_matches_numpy(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    q, s = quantize_act_checked(x)
    q_ref, s_ref = _ref_quantize(x)
    np.testing.assert_array_equal(q, q_ref)
    assert s == s_ref
    assert np.abs(q).max() == 127


def test_quantize_act_rounds_half_to_even():
    # eps chosen so that mean(x^2) + eps = 65536: rms = 256 and u*127/a = x/2 exactly.
    x = np.array([254, 1, 3, 5, -3], dtype=np.float32)
    q, s = quantize_act_checked(x, eps=65536.0 - 64560.0 / 5)
    assert q.tolist() == [127, 0, 2, 2, -2]
    assert s == np.float32(np.float32(254 / 256) / np.float32(127))
    np.testing.assert_array_equal(q, _ref_quantize(x, eps=65536.0 - 64560.0 / 5)[0])


def test_quantize_act_zero_input_and_njit_call():
    q, s = quantize_act_checked(np.zeros(5, dtype=np.float32))
    assert not q.any() and s == np.float32(np.float32(1e-5) / np.float32(127))
    out = np.empty(3, dtype=np.int8)
    s2 = quantize_act(np.array([1, -2, 0.5], dtype=np.float32), out)  # njit, default eps
    np.testing.assert_array_equal(out, _ref_quantize(np.array([1, -2, 0.5], dtype=np.float32))[0])
    assert s2 == _ref_quantize(np.array([1, -2, 0.5], dtype=np.float32))[1]


def test_quantize_act_rejects_bad_input():
    with pytest.raises(ValueError):
        quantize_act_checked(np.zeros(3, dtype=np.float64))
    with pytest.raises(ValueError, match="empty"):
        quantize_act_checked(np.zeros(0, dtype=np.float32))
    with pytest.raises(ValueError, match="non-finite"):
        quantize_act_checked(np.array([1.0, np.inf], dtype=np.float32))
    with pytest.raises(ValueError, match="xq_out"):
        quantize_act_checked(np.zeros(3, dtype=np.float32), np.zeros(4, dtype=np.int8))


DENSE_KERNELS = [K.ternary_matvec, K.ternary_matvec_par, K.ternary_matvec_unpack, K.ternary_matvec_unpack_par,
                 K.ternary_matvec_simd, K.ternary_matvec_simd_par, K.ternary_matvec_simd_stream,
                 K.ternary_matvec_simd_stream_par]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kernel", DENSE_KERNELS, ids=lambda f: f.__name__)
def test_dense_kernels_exact(kernel, shape):
    wt, rs, xq, xs = _problem(*shape, seed=sum(shape))
    ref = K.reference_matvec(wt, rs, xq, xs)
    out = np.full(shape[0], np.nan, dtype=np.float32)
    kernel(P.pack_ternary2(wt), rs, xq, xs, out)
    np.testing.assert_allclose(out, ref, rtol=1e-6)


@pytest.mark.parametrize("shape", SHAPES + [(37, 2048)])
@pytest.mark.parametrize("kernel", [K.ternary_matvec_stream, K.ternary_matvec_stream_par], ids=lambda f: f.__name__)
def test_stream_kernels_exact_with_and_without_prefetch(kernel, shape):
    """The engine's streaming kernel takes its software prefetch as an argument (the probe's
    per-host choice, tern.core.engine_tuning): both settings give the default kernel's output
    bit for bit, and the reference's values."""
    wt, rs, xq, xs = _problem(*shape, seed=5 * sum(shape))
    packed = P.pack_ternary2(wt)
    ref = np.empty(shape[0], dtype=np.float32)
    K.ternary_matvec(packed, rs, xq, xs, ref)
    np.testing.assert_allclose(ref, K.reference_matvec(wt, rs, xq, xs), rtol=1e-6)
    for prefetch in (False, True):
        out = np.full(shape[0], np.nan, dtype=np.float32)
        kernel(packed, rs, xq, xs, out, prefetch)
        assert np.array_equal(out, ref), prefetch


@pytest.mark.skipif(K.DEFAULT_VARIANT != "simd", reason="the row passes need AVX2 / AVX-512")
@pytest.mark.parametrize("shape", SHAPES + [(37, 2048), (21, 5000)])
@pytest.mark.parametrize("kernel", [K.ternary_matvec_rows, K.ternary_matvec_rows_par], ids=lambda f: f.__name__)
def test_row_pass_options_bit_identical(kernel, shape):
    """Software prefetch and the one-row pass change no arithmetic: every combination gives
    the default kernel's output bit for bit (rows past the end are only prefetched)."""
    wt, rs, xq, xs = _problem(*shape, seed=3 * sum(shape))
    packed = P.pack_ternary2(wt)
    ref = np.empty(shape[0], dtype=np.float32)
    K.ternary_matvec(packed, rs, xq, xs, ref)
    for one_row in (False, True):
        for prefetch in (False, True):
            out = np.full(shape[0], np.nan, dtype=np.float32)
            kernel(packed, rs, xq, xs, out, one_row, prefetch)
            assert np.array_equal(out, ref), (one_row, prefetch)


def test_row_prefetch_setting_and_override(tmp_path):
    """TERN_ROW_PREFETCH=0 / 1 overrides the default at import (own numba cache here: the
    setting is compiled into the cached kernels)."""
    import os
    import subprocess
    import sys

    assert isinstance(K.ROW_PREFETCH, bool) and isinstance(K.ROW_PREFETCH_DEFAULT, bool)
    for val, want in (("0", "False"), ("1", "True")):
        env = {**os.environ, "TERN_ROW_PREFETCH": val, "NUMBA_CACHE_DIR": str(tmp_path / val)}
        got = subprocess.run([sys.executable, "-c", "import tern.kernels.kernels_ternary as K; print(K.ROW_PREFETCH)"],
                             env=env, capture_output=True, text=True, check=True).stdout.split()[-1]
        assert got == want


@pytest.mark.skipif(K.DEFAULT_VARIANT != "simd", reason="the row passes need AVX2 / AVX-512")
def test_row_pass_prefetch_distance_is_compiled_in():
    """The row passes prefetch at least PREFETCH_MIN_BYTES ahead (8 KB: measured against 4 KB
    in tern.kernels.prefetch): the distance is a constant of the emitted code."""
    import re

    from numba import njit

    from tern.kernels.prefetch import PREFETCH_MIN_BYTES

    assert PREFETCH_MIN_BYTES == 8192
    wt, rs, xq, xs = _problem(8, 1024, seed=5)
    packed = P.pack_ternary2(wt)
    out = np.empty(8, dtype=np.float32)
    fresh = njit(cache=False)(K.ternary_matvec_rows.py_func)  # cached code shows no IR
    fresh(packed, rs, xq, xs, out, False, True)  # one signature: prefetch is a runtime flag
    ir = fresh.inspect_llvm(fresh.signatures[0])
    assert "llvm.prefetch" in ir
    assert re.search(rf"\bi64 {PREFETCH_MIN_BYTES}\b", ir), "prefetch distance constant not in the IR"
    # into the cache level ROW_PREFETCH_LEVEL (L2: locality 2, x86 prefetcht1), read, data cache
    from tern.kernels.prefetch import PREFETCH_LEVELS, ROW_LOCALITY, ROW_PREFETCH_LEVEL

    assert ROW_LOCALITY == PREFETCH_LEVELS[ROW_PREFETCH_LEVEL]
    localities = set(re.findall(r"llvm\.prefetch\.p0[^(]*\([^)]*?i32 0, i32 (\d), i32 1\)", ir))
    assert localities == {str(ROW_LOCALITY)}, localities


def _vector_spill_reloads(asm: str) -> list[str]:
    """Vector registers stored to a stack slot and loaded back within a few instructions
    (AT&T syntax): a store-to-load forward whose speed hangs on where the stack lies."""
    import re

    lines = asm.splitlines()
    found = []
    for i, line in enumerate(lines):
        m = re.search(r"vmov\w*\s+%[xyz]mm\d+,\s*(-?\d+)\(%rsp\)", line)
        if m:
            slot = re.escape(m.group(1))
            found += [f"{line.strip()} | {nxt.strip()}" for nxt in lines[i + 1:i + 16]
                      if re.search(rf"\s{slot}\(%rsp\),\s*%[xyz]mm", nxt)][:1]
    return found


@pytest.mark.skipif(K.DEFAULT_VARIANT != "simd", reason="the row passes need AVX2 / AVX-512")
def test_row_passes_keep_accumulators_off_the_stack():
    """The 4-row pass with a partial last segment keeps its accumulators in registers. It had
    spilled 256-bit tail sums through 64-byte stack slots and read them straight back: where
    the process's stack put a slot across a cache line, each forward failed and 4-row passes
    over 384 columns ran 1.9x slower (AMD EPYC Zen 4; a numba frame is not realigned, so which
    processes were slow was chance - and so was the probe's partial-segment cost)."""
    from numba import njit

    wt, rs, xq, xs = _problem(8, 384, seed=6)  # one compiled pass holds every tail form
    packed = P.pack_ternary2(wt)
    out = np.empty(8, dtype=np.float32)
    fresh = njit(cache=False)(K.ternary_matvec_then.py_func)  # cached code shows no assembly
    fresh(packed, rs, xq, xs, out, False, True, np.zeros((1, 0), np.uint8))
    ref = np.empty(8, dtype=np.float32)
    K.ternary_matvec(packed, rs, xq, xs, ref)
    assert np.array_equal(out, ref)
    assert _vector_spill_reloads(fresh.inspect_asm(fresh.signatures[0])) == []


def test_vector_spill_reloads_finds_a_store_forward():
    asm = "\tvmovdqu64\t%zmm0, 432(%rsp)\n\tvpxor\t%xmm0, %xmm0, %xmm0\n\tvpaddd\t432(%rsp), %zmm15, %zmm15\n"
    assert len(_vector_spill_reloads(asm)) == 1
    assert _vector_spill_reloads(asm.replace("vpaddd\t432", "vpaddd\t496")) == []


def test_row_prefetch_level_env_is_validated_and_compiled_in(tmp_path):
    """TERN_ROW_PREFETCH_LEVEL=l1|l2 sets the row passes' prefetch level at import (own numba
    cache: compiled in, and part of the cache stamp); anything else is a clear error."""
    import os
    import subprocess
    import sys

    code = ("import tern.kernels.kernels_ternary as K, tern.kernels.prefetch as P; "
            "print(P.ROW_PREFETCH_LEVEL, P.ROW_LOCALITY, 'row_prefetch_level=' + P.ROW_PREFETCH_LEVEL in K.COMPILED_SETTINGS)")
    for val, want in (("l1", "l1 3 True"), (" L2 ", "l2 2 True")):
        env = {**os.environ, "TERN_ROW_PREFETCH_LEVEL": val, "NUMBA_CACHE_DIR": str(tmp_path / val.strip())}
        got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert got.stdout.strip().splitlines()[-1] == want
    env = {**os.environ, "TERN_ROW_PREFETCH_LEVEL": "l3", "NUMBA_CACHE_DIR": str(tmp_path / "bad")}
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "TERN_ROW_PREFETCH_LEVEL must be 'l1' or 'l2'" in bad.stderr


def test_extreme_sums_exact():
    # all +1 weights against all +127 (and all -1 against -127): the largest sums.
    cols = 1000
    wt = np.ones((2, cols), dtype=np.int8)
    wt[1] = -1
    xq = np.full(cols, 127, dtype=np.int8)
    rs = np.ones(2, dtype=np.float32)
    out = np.empty(2, dtype=np.float32)
    K.ternary_matvec(P.pack_ternary2(wt), rs, xq, np.float32(1), out)
    assert out.tolist() == [127.0 * cols, -127.0 * cols]


SKIP_KERNELS = [K.ternary_matvec_skip, K.ternary_matvec_skip_par, K.ternary_matvec_skip_plain]
if K.DEFAULT_VARIANT == "simd":
    SKIP_KERNELS += [K.ternary_matvec_skip_simd, K.ternary_matvec_skip_simd_par]


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (300, 7), (257, 40), (1000, 96), (64, 13), (255, 9),
                                   (600, 70), (513, 33)])
@pytest.mark.parametrize("p_zero", [0.0, 0.7, 1.0])
@pytest.mark.parametrize("kernel", SKIP_KERNELS, ids=lambda f: f.__name__)
def test_skip_kernel_equals_dense(kernel, shape, p_zero):
    rows, cols = shape
    wt, rs, xq, xs = _problem(rows, cols, seed=rows + cols, p_zero_act=p_zero)
    packed_t = P.pack_ternary2(np.ascontiguousarray(wt.T))  # (cols, row_bytes(rows))
    out = np.full(rows, np.nan, dtype=np.float32)
    kernel(packed_t, rs, xq, xs, out)
    dense = np.empty(rows, dtype=np.float32)
    K.ternary_matvec(P.pack_ternary2(wt), rs, xq, xs, dense)
    np.testing.assert_allclose(out, dense, rtol=1e-6)
    np.testing.assert_allclose(out, K.reference_matvec(wt, rs, xq, xs), rtol=1e-6)


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 8, 9, 255, 256, 2048])
@pytest.mark.parametrize("p_zero", [0.0, 0.3, 0.75, 1.0])
def test_skip_groups_lists_the_nonzero_inputs_in_order(n, p_zero):
    """The branch-free compaction: every nonzero input once, in order, padded to whole groups of 4
    with row 0 / activation 0 (the stores of zeros that land in the pads or the sink leave nothing)."""
    rng = np.random.default_rng(n + int(10 * p_zero))
    xq = rng.integers(-127, 128, n).astype(np.int8)
    xq[rng.random(n) < p_zero] = 0
    if n >= 2:
        xq[-1] = 0  # a zero after the last nonzero: its store must not clobber the last real slot
    idx, qq, qsum = K.skip_groups(xq)
    nz = np.flatnonzero(xq)
    m = 4 * ((nz.size + 3) // 4)
    assert idx.shape == (m,) and qq.shape == (m // 4,) and qq.dtype == np.int32
    np.testing.assert_array_equal(idx[:nz.size], nz)
    np.testing.assert_array_equal(idx[nz.size:], 0)
    qb = qq.view(np.int8)
    np.testing.assert_array_equal(qb[:nz.size], xq[nz])
    np.testing.assert_array_equal(qb[nz.size:], 0)
    assert int(qsum) == int(xq.astype(np.int64).sum())


@pytest.mark.parametrize("kernel", SKIP_KERNELS, ids=lambda f: f.__name__)
def test_skip_kernel_ignores_weights_of_zero_inputs(kernel):
    wt, rs, xq, xs = _problem(300, 50, seed=5, p_zero_act=0.5)
    packed_t = P.pack_ternary2(np.ascontiguousarray(wt.T))
    garbage = packed_t.copy()
    garbage[xq == 0] = 0xFF  # invalid codes where the input is zero: never read
    a, b = np.empty(300, np.float32), np.empty(300, np.float32)
    kernel(packed_t, rs, xq, xs, a)
    kernel(garbage, rs, xq, xs, b)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("isa", _host_isas_list() or ["none"])
@pytest.mark.parametrize("width", [32, 64])
def test_skip_chunk_every_isa_path(isa, width):
    if isa == "none":
        pytest.skip("no x86 SIMD path on this CPU")
    chunk = simd._make_skip_chunk(isa, width)

    @numba.njit
    def run(packed_t, idx, qq, g0, g1, off, nvalid, acc):
        chunk(packed_t, idx, qq, g0, g1, off, nvalid, acc)

    rng = np.random.default_rng(width)
    for outs, nvalid, off in [(256, width, 0), (600, width, 64), (600, 22, 128), (70, 18, 0)]:
        wt = rng.integers(-1, 2, size=(outs, 11)).astype(np.int8)  # W (outs, 11 inputs)
        packed_t = P.pack_ternary2(np.ascontiguousarray(wt.T))  # (11, row_bytes(outs))
        idx = np.array([3, 0, 7, 10, 5, 5, 1, 2], dtype=np.int64)
        qb = rng.integers(-127, 128, size=8).astype(np.int8)
        acc = rng.integers(-1000, 1000, size=4 * width).astype(np.int32)
        expect = acc.astype(np.int64).copy()
        codes = P.unpack_ternary2(packed_t, outs).astype(np.int64) + 1  # (11, outs) codes
        g = min(64, packed_t.shape[1] - off)  # bytes of this segment (off is a segment start + h)
        seg0 = (off // 64) * 64
        gseg = min(64, packed_t.shape[1] - seg0)
        for k in range(4):
            for j in range(nvalid):
                slot = 4 * seg0 + gseg * k + (off - seg0) + j
                if slot < outs:
                    expect[k * width + j] += sum(codes[idx[t], slot] * int(qb[t]) for t in range(8))
        run(packed_t, idx, qb.view(np.int32), 0, 2, off, nvalid, acc)
        valid = [k * width + j for k in range(4) for j in range(nvalid)
                 if 4 * seg0 + gseg * k + (off - seg0) + j < outs]
        assert g > 0
        np.testing.assert_array_equal(acc[valid], expect[valid])


def test_threads_1_vs_2_identical():
    wt, rs, xq, xs = _problem(333, 1500, seed=9)
    packed = P.pack_ternary2(wt)
    outs = []
    old = numba.get_num_threads()
    try:
        for t in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(t)
            o = np.empty(333, dtype=np.float32)
            K.ternary_matvec_par(packed, rs, xq, xs, o)
            outs.append(o)
    finally:
        numba.set_num_threads(old)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_checked_wrapper_rejects_bad_args():
    wt, rs, xq, xs = _problem(4, 10, seed=1)
    packed = P.pack_ternary2(wt)
    out = np.empty(4, dtype=np.float32)
    K.check_matvec_args(packed, rs, xq, xs, out)  # fine
    with pytest.raises(ValueError, match="bytes"):
        K.check_matvec_args(packed, rs, np.zeros(20, np.int8), xs, out)
    with pytest.raises(ValueError, match="out"):
        K.check_matvec_args(packed, rs, xq, xs, np.empty(5, np.float32))
    with pytest.raises(ValueError, match="row_scale"):
        K.check_matvec_args(packed, rs[:3].copy(), xq, xs, out)
    with pytest.raises(ValueError, match="xq"):
        K.check_matvec_args(packed, rs, xq.astype(np.int16), xs, out)
    with pytest.raises(ValueError, match="-128"):
        K.check_matvec_args(packed, rs, np.full(10, -128, np.int8), xs, out)
    with pytest.raises(ValueError, match="finite"):
        K.check_matvec_args(packed, np.full(4, np.nan, np.float32), xq, xs, out)
    packed_t = P.pack_ternary2(np.ascontiguousarray(wt.T))
    K.check_matvec_args(packed_t, rs, xq, xs, out, transposed=True)
    with pytest.raises(ValueError, match="packed_t"):
        K.check_matvec_args(packed, rs, xq, xs, out, transposed=True)


# ---- every variant of tern.probe.ternary_variants, and every ISA path of tern.kernels.simd ----



@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_exact(name, shape):
    v = get_variant(name)
    wt, rs, xq, xs = _problem(*shape, seed=3 * sum(shape))
    layout = v.prepare(P.pack_ternary2(wt), shape[1])
    ref = K.reference_matvec(wt, rs, xq, xs)
    for f in (v.matvec, v.matvec_par):
        out = np.full(shape[0], np.nan, dtype=np.float32)
        f(layout, rs, xq, xs, out)
        np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_variant_extreme_values_exact():
    # -127 activations everywhere with all-(-1) rows: int32 sums near the largest magnitude
    cols = 3000
    wt = np.stack([np.full(cols, -1, np.int8), np.full(cols, 1, np.int8), np.zeros(cols, np.int8)])
    xq = np.full(cols, -127, dtype=np.int8)
    rs = np.ones(3, dtype=np.float32)
    for v in VARIANTS.values():
        out = np.empty(3, dtype=np.float32)
        v.matvec(v.prepare(P.pack_ternary2(wt), cols), rs, xq, np.float32(1), out)
        assert out.tolist() == [127.0 * cols, -127.0 * cols, 0.0], v.name


@pytest.mark.parametrize("isa", _host_isas_list() or ["none"])
def test_row_dot_every_isa_path(isa):
    if isa == "none":
        pytest.skip("no x86 SIMD path on this CPU")
    for prefetch in (0, 256):  # prefetch changes no sum
        _check_row_dots(simd._make_row_dot(isa, 1, prefetch), simd._make_row_dot(isa, 2, prefetch),
                        simd._make_row_dot(isa, 4, prefetch))


@pytest.mark.parametrize("isa", _host_isas_list() or ["none"])
def test_row_dot_largest_sums_every_isa_path(isa):
    """The row dots keep each 2-bit group's codes in place (code * 4**k, k = 0..3) and shift
    the int32 accumulators back once per row: at MAX_COLS columns of code 2 (w = +1)
    against +127 group 3's lanes reach 64 * 254 * 8 * 16,513 (AVX2), within 2**31; a wrong
    scale, a logical instead of arithmetic shift or a lane overflow breaks one of these
    (the plain-sum bound, 8,454,660 columns, overflowed a lane and failed here)."""
    if isa == "none":
        pytest.skip("no x86 SIMD path on this CPU")
    rows4 = simd._make_row_dot(isa, 4, 0)

    @numba.njit
    def dots(packed, xq):
        nfull = xq.shape[0] // 256
        return rows4(packed, 0, xq, nfull, packed.shape[1] - 64 * nfull)

    for cols in (256, 1100, K.MAX_COLS - 3, K.MAX_COLS):
        wt = np.ones((4, cols), dtype=np.int8)  # code 2 everywhere
        wt[2, ::2] = -1  # code 0 on even columns: only the odd ones count
        wt[3] = 0  # code 1
        xq = np.full(cols, 127, dtype=np.int8)
        xq[1::2] = -127
        want = (wt.astype(np.int64) + 1) @ xq.astype(np.int64)
        assert list(dots(P.pack_ternary2(wt), xq)) == want.tolist(), cols
        got = dots(P.pack_ternary2(wt), np.abs(xq))
        assert got[0] == 254 * cols, cols


def _check_row_dots(row_dot, rows2_dot, rows4_dot):
    @numba.njit
    def dots(packed, xq, out1, out2, out4):
        nfull = xq.shape[0] // 256
        gtail = packed.shape[1] - 64 * nfull
        for r in range(packed.shape[0]):
            out1[r] = row_dot(packed, r, xq, nfull, gtail)
        for r in range(0, packed.shape[0] - 1, 2):
            s = rows2_dot(packed, r, xq, nfull, gtail)
            out2[r], out2[r + 1] = s[0], s[1]
        for r in range(0, packed.shape[0] - 3, 4):
            s = rows4_dot(packed, r, xq, nfull, gtail)
            for i in range(4):
                out4[r + i] = s[i]

    for rows, cols in [(4, 1), (4, 63), (8, 64), (5, 255), (4, 256), (7, 257), (2, 511), (6, 1100), (4, 128), (5, 384),
                       (8, 640)]:  # 128 / 384 / 640: the unmasked 128-column last segment
        wt, _, xq, _ = _problem(rows, cols, seed=rows * cols)
        outs = [np.zeros(rows, dtype=np.int64) for _ in range(3)]
        dots(P.pack_ternary2(wt), xq, *outs)
        ref = (wt.astype(np.int64) + 1) @ xq.astype(np.int64)
        np.testing.assert_array_equal(outs[0], ref)
        np.testing.assert_array_equal(outs[1][: rows // 2 * 2], ref[: rows // 2 * 2])
        np.testing.assert_array_equal(outs[2][: rows // 4 * 4], ref[: rows // 4 * 4])


def test_calibrate_kernels_reports_every_variant():
    res = calibrate_kernels(rows=64, cols=512, repeats=2, min_time_s=0.001)
    assert set(res["gops_per_s"]) == set(VARIANTS)
    assert all(g > 0 for g in res["gops_per_s"].values())
    assert res["fastest"] in VARIANTS and res["default"] == K.DEFAULT_VARIANT
    with pytest.raises(ValueError, match="unknown ternary variant"):
        get_variant("nope")


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (65, 300), (130, 1000)])
def test_lut_plain_and_blocked_layout(shape):
    from tern.kernels import kernels_lut as L

    wt, rs, xq, xs = _problem(*shape, seed=7 * sum(shape))
    packed = P.pack_ternary2(wt)
    ref = K.reference_matvec(wt, rs, xq, xs)
    for f in (L.ternary_matvec_lut_plain, L.ternary_matvec_lut_plain_par):
        out = np.empty(shape[0], dtype=np.float32)
        f(L.to_lut81(packed, shape[1]), rs, xq, xs, out)
        np.testing.assert_allclose(out, ref, rtol=1e-6)
    blocked = L.to_lut81_blocked(packed, shape[1])  # (blocks, groups, 64)
    assert blocked.shape == (-(-shape[0] // 64), -(-shape[1] // 4), 64)
    np.testing.assert_array_equal(blocked.transpose(0, 2, 1).reshape(-1, blocked.shape[1])[: shape[0]],
                                  L.to_lut81(packed, shape[1]))
    assert (blocked.transpose(0, 2, 1).reshape(-1, blocked.shape[1])[shape[0]:] == L.CODE_ZERO4).all()


def test_ternary_matvec_checked():
    wt, rs, xq, xs = _problem(37, 300, seed=11, p_zero_act=0.5)
    ref = K.reference_matvec(wt, rs, xq, xs)
    for threads in (1, 2):
        np.testing.assert_allclose(K.ternary_matvec_checked(P.pack_ternary2(wt), rs, xq, xs, threads=threads),
                                   ref, rtol=1e-6)
        packed_t = P.pack_ternary2(np.ascontiguousarray(wt.T))
        np.testing.assert_allclose(K.ternary_matvec_checked(packed_t, rs, xq, xs, transposed=True,
                                                            threads=threads), ref, rtol=1e-6)
    with pytest.raises(ValueError, match="bytes"):
        K.ternary_matvec_checked(P.pack_ternary2(wt), rs, xq[:200].copy(), xs)
    with pytest.raises(ValueError, match="C-contiguous"):
        K.ternary_matvec_checked(P.pack_ternary2(wt), rs, np.repeat(xq, 2)[::2], xs)


def test_cache_guard_drops_entries_when_a_dependency_changes(tmp_path):
    from types import SimpleNamespace

    from tern.kernels.cache_guard import drop_stale_cache

    mod, dep, cache = tmp_path / "mod.py", tmp_path / "dep.py", tmp_path / "__pycache__"
    mod.write_text("x = 1\n")
    dep.write_text("a = 1\n")
    cache.mkdir()
    fn = SimpleNamespace(_cache=SimpleNamespace(_cache_path=str(cache)))
    entry = cache / "mod.f-1.py311.nbi"
    entry.write_text("old")
    assert drop_stale_cache(str(mod), ("dep.py",), fn) and not entry.exists()  # no marker yet
    entry.write_text("new")
    assert not drop_stale_cache(str(mod), ("dep.py",), fn) and entry.exists()  # same deps: kept
    dep.write_text("a = 2\n")
    assert drop_stale_cache(str(mod), ("dep.py",), fn) and not entry.exists()  # changed: dropped
    other = cache / "other.f-1.py311.nbi"  # another module's entries are never touched
    other.write_text("x")
    dep.write_text("a = 3\n")
    drop_stale_cache(str(mod), ("dep.py",), fn)
    assert other.exists()


def test_skip_prefetch_setting_parses_and_overrides(tmp_path):
    """TERN_SKIP_PREFETCH="GROUPS,l1|l2" sets the skip kernel's prefetch at import (its own numba
    cache: compiled in); a malformed value is an error naming the variable and the form."""
    import os
    import subprocess
    import sys

    from tern.kernels.prefetch import skip_prefetch_setting

    assert (K.SKIP_PREFETCH_GROUPS, K.SKIP_PREFETCH_LEVEL) == (4, "l2")
    assert skip_prefetch_setting(" 2, L1 ") == (2, "l1") and skip_prefetch_setting("0,l2") == (0, "l2")
    for bad in ("4", "4,l3", "x,l2", "-1,l1", "4,l2,1"):
        with pytest.raises(ValueError, match="TERN_SKIP_PREFETCH must be"):
            skip_prefetch_setting(bad)
    env = {**os.environ, "TERN_SKIP_PREFETCH": "2,l1", "NUMBA_CACHE_DIR": str(tmp_path / "nb")}
    code = ("import numpy as np; import tern.kernels.kernels_ternary as K; from tern.kernels.packing import pack_ternary2\n"
            "rng = np.random.default_rng(0); wt = rng.integers(-1, 2, (300, 700)).astype(np.int8)\n"
            "xq = np.where(rng.random(300) < .3, rng.integers(-127, 128, 300), 0).astype(np.int8)\n"
            "out = np.empty(700, np.float32); rs = np.ones(700, np.float32)\n"
            "K.ternary_matvec_skip(pack_ternary2(wt), rs, xq, np.float32(1), out)\n"
            "ok = np.array_equal(out, (wt.astype(np.int64).T @ xq.astype(np.int64)).astype(np.float32))\n"
            "print(K.SKIP_PREFETCH_GROUPS, K.SKIP_PREFETCH_LEVEL, ok)")
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert got[-3:] == ["2", "l1", "True"]
