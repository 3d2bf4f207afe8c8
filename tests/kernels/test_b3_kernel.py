"""The base-3 kernels (tern.kernels.kernels_b3): bit-identical to the ternary2 kernel on the
expanded matrix for every shape (cols not a multiple of 5 or of 320, rows not a multiple of
4), serial and parallel, every decoder; the activation permutation; clear errors."""

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tern.kernels import kernels_b3 as kb
from tern.kernels import kernels_ternary as kt
from tern.kernels.packing import expand_b3_to_ternary2, pack_ternary_b3, unpack_ternary_b3
from tern.kernels.simd import HAS_VBMI, ROW_DOT_ISA


def _case(rows, cols, seed, p_zero=None):
    rng = np.random.default_rng(seed)
    if p_zero is None:
        wt = rng.integers(-1, 2, size=(rows, cols)).astype(np.int8)
    else:  # mostly zeros / all of one sign: extreme digit patterns
        wt = rng.choice(np.array([-1, 0, 1], np.int8), size=(rows, cols), p=p_zero)
    b3 = pack_ternary_b3(wt)
    rs = (rng.random(rows, dtype=np.float32) + np.float32(0.5))
    xq = rng.integers(-127, 128, size=cols).astype(np.int8)
    return wt, b3, rs, xq, np.float32(rng.random() * 0.1 + 1e-3)


def _ternary2(b3, rs, xq, xs):
    out = np.empty(rs.shape[0], np.float32)
    kt.ternary_matvec(expand_b3_to_ternary2(b3, xq.shape[0]), rs, xq, xs, out)
    return out


def _same(a, b):
    return np.array_equal(a.view(np.int32), b.view(np.int32))


KERNELS = (kb.b3_matvec, kb.b3_matvec_par)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 37), cols=st.integers(1, 1400), seed=st.integers(0, 2**16))
def test_bit_identical_to_ternary2(rows, cols, seed):
    wt, b3, rs, xq, xs = _case(rows, cols, seed)
    ref = _ternary2(b3, rs, xq, xs)
    exact = (wt.astype(np.int64) @ xq.astype(np.int64)).astype(np.float32)
    assert np.array_equal(ref, rs * xs * exact)
    for fn in KERNELS:
        out = np.full(rows, np.nan, np.float32)
        fn(b3, rs, xq, xs, out)
        assert _same(out, ref), fn.__name__


@pytest.mark.parametrize("rows,cols", [(4, 320), (17, 321), (9, 640), (33, 4096), (6, 5), (3, 1), (40, 2000)])
def test_extreme_patterns_and_threads(rows, cols):
    """All -1, all +1, all 0 and random rows (bytes 0, 242, 121 and everything between),
    -127 / 127 activations, at 1 and 2 threads."""
    for k, p in enumerate(([1, 0, 0], [0, 0, 1], [0, 1, 0], None)):
        wt, b3, rs, xq, xs = _case(rows, cols, k, p)
        xq[: cols // 2] = 127 if k % 2 else -127
        ref = _ternary2(b3, rs, xq, xs)
        for threads in (1, 2):
            out = kb.b3_matvec_checked(b3, rs, xq, xs, threads=threads)
            assert _same(out, ref)


def test_permutation_and_plain_kernel():
    wt, b3, rs, xq, xs = _case(7, 701, 3)
    xp = np.full(kb.b3_act_len(701), 99, np.int8)
    kb.b3_permute(xq, xp)
    assert kb.b3_act_len(701) == 3 * 320 and kb.b3_act_len(320) == 320 and kb.b3_act_len(321) == 640
    for b in range(3):  # xp[320 b + 64 k + j] = xq[320 b + 5 j + k], zero past the end
        for k in range(5):
            c = 320 * b + 5 * np.arange(64) + k
            want = np.where(c < 701, xq[np.minimum(c, 700)], 0)
            assert np.array_equal(xp[320 * b + 64 * k: 320 * b + 64 * k + 64], want)
    ref = _ternary2(b3, rs, xq, xs)
    for fn in (kb.b3_matvec_plain_xp, kb.b3_matvec_plain_xp_par, kb.b3_matvec_xp, kb.b3_matvec_xp_par):
        out = np.empty(7, np.float32)
        fn(b3, rs, xp, xs, out)
        assert _same(out, ref), fn.__name__
    assert kb.CODES.shape == (243, 5) and np.array_equal(
        unpack_ternary_b3(np.arange(243, dtype=np.uint8)[:, None], 5) + 1, kb.CODES)


@pytest.mark.skipif(ROW_DOT_ISA != "avx512vnni", reason="the other decoders are compiled for this AVX-512 host")
@pytest.mark.parametrize("isa,decode,nrows", [("avx2", "cmp", 2), ("avx512bw", "cmp", 4), ("avx512vnni", "cmp", 1)]
                         + ([("avx512bw", "vbmi", 4)] if HAS_VBMI else []))
def test_every_decoder(isa, decode, nrows):
    """The decoders another CPU would use (comparisons for AVX2 / AVX-512BW without VBMI,
    vpmaddubsw dot products) give the same sums."""
    dot = kb.make_b3_dot(isa, decode, nrows, 256)

    if nrows == 1:
        @numba.njit
        def run(packed, xp, out):
            rb = packed.shape[1]
            for r in range(packed.shape[0]):
                out[r] = dot(packed, r, xp, rb // 64, rb % 64)
    else:
        @numba.njit
        def run(packed, xp, out):
            rb = packed.shape[1]
            for r in range(0, packed.shape[0] - nrows + 1, nrows):
                s = dot(packed, r, xp, rb // 64, rb % 64)
                for i in range(nrows):
                    out[r + i] = s[i]

    for cols in (1, 319, 641, 1500):
        wt, b3, rs, xq, xs = _case(8, cols, cols)
        xp = np.empty(kb.b3_act_len(cols), np.int8)
        kb.b3_permute(xq, xp)
        out = np.zeros(8, np.int64)
        run(b3, xp, out)
        assert np.array_equal(out, (wt + 1).astype(np.int64) @ xq.astype(np.int64))
    with pytest.raises(ValueError, match="AVX-512"):
        kb.make_b3_dot("avx2", "vbmi")


def test_bad_input():
    wt, b3, rs, xq, xs = _case(5, 23, 0)
    bad = b3.copy()
    bad[2, 1] = 243
    with pytest.raises(ValueError, match="243 > 242"):
        kb.b3_matvec_checked(bad, rs, xq, xs)
    with pytest.raises(ValueError, match="ceil"):
        kb.b3_matvec_checked(b3[:, :-1].copy(), rs, xq, xs)
    with pytest.raises(ValueError, match="ceil"):
        kb.b3_matvec_checked(b3, rs, xq[:20].copy(), xs)
    with pytest.raises(ValueError, match="uint8"):
        kb.b3_matvec_checked(b3.astype(np.int16), rs, xq, xs)
    with pytest.raises(ValueError, match="C-contiguous"):
        kb.b3_matvec_checked(np.asfortranarray(np.ones((5, 5), np.uint8)), rs, xq, xs)
    with pytest.raises(ValueError, match="row_scale has 4"):
        kb.b3_matvec_checked(b3, rs[:4].copy(), xq, xs, out=np.empty(5, np.float32))
    with pytest.raises(ValueError, match="-128"):
        kb.b3_matvec_checked(b3, rs, np.full(23, -128, np.int8), xs)
    with pytest.raises(ValueError, match="out"):
        kb.b3_matvec_checked(b3, rs, xq, xs, out=np.empty(4, np.float32))
    with pytest.raises(ValueError, match="finite"):
        kb.b3_matvec_checked(b3, rs, xq, np.float32(np.nan))
