"""The blocked16 layout (16 rows one stream) and its matvec kernels against the ternary2 kernels and numpy."""

import numba
import numpy as np
import pytest

from tern.kernels import kernels_blocked as B
from tern.kernels import simd
from tern.kernels.kernels_ternary import act_sum, reference_matvec, ternary_matvec
from tern.kernels.packing import pack_ternary2

SHAPES = [(1, 1), (1, 3), (15, 16), (16, 16), (17, 17), (5, 255), (33, 256), (40, 257), (16, 384), (9, 1000),
          (130, 128), (64, 4096), (3, 40)]


def _problem(rows, cols, seed):
    rng = np.random.default_rng(seed)
    wt = rng.integers(-1, 2, size=(rows, cols)).astype(np.int8)  # (rows, cols)
    xq = rng.integers(-127, 128, size=cols).astype(np.int8)  # (cols,)
    rs = (rng.random(rows) + 0.5).astype(np.float32)  # (rows,)
    return wt, rs, xq, np.float32(0.0123)


def _layout_by_definition(wt):
    """The module docstring's layout, written out one weight at a time (independent of the packer)."""
    rows, cols = wt.shape
    nb, bb = B.blocked16_shape(rows, cols)
    out = np.zeros((nb, bb), np.uint8)
    for r in range(rows):
        for c in range(cols):
            t, k, i = c // 16, (c % 16) // 4, c % 4
            out[r // 16, 64 * t + 4 * (r % 16) + i] |= (int(wt[r, c]) + 1) << (2 * k)
    return out


@pytest.mark.parametrize("rows,cols", [(1, 1), (17, 17), (16, 300), (33, 40)])
def test_pack_blocked16_follows_the_documented_layout(rows, cols):
    wt = _problem(rows, cols, rows + cols)[0]
    bl = B.pack_blocked16(pack_ternary2(wt), cols)
    assert bl.shape == B.blocked16_shape(rows, cols) and bl.nbytes == B.blocked16_bytes(rows, cols)
    assert np.array_equal(bl, _layout_by_definition(wt))
    assert np.array_equal(B.blocked16_from_ternary(wt), bl)


def test_blocked16_is_the_ternary2_size_on_multiples_of_16():
    assert B.blocked16_bytes(512, 384) == 512 * 384 // 4
    assert B.blocked16_bytes(17, 17) == 2 * 2 * 64  # padded to 32 x 32
    with pytest.raises(ValueError, match="rows, cols >= 1"):
        B.blocked16_shape(0, 16)


def _isas():
    order = ["avx2", "avx512bw", "avx512vnni"]
    return [] if simd.ROW_DOT_ISA == "none" else order[: order.index(simd.ROW_DOT_ISA) + 1]


@pytest.mark.parametrize("rows,cols", SHAPES)
def test_blocked_kernels_equal_the_ternary2_kernel_bit_for_bit(rows, cols):
    wt, rs, xq, xs = _problem(rows, cols, rows * 31 + cols)
    want = np.empty(rows, np.float32)
    ternary_matvec(pack_ternary2(wt), rs, xq, xs, want)
    np.testing.assert_allclose(want, reference_matvec(wt, rs, xq, xs), rtol=1e-6)
    bl = B.pack_blocked16(pack_ternary2(wt), cols)
    for fn in (B.blocked16_matvec, B.blocked16_matvec_par, B.blocked16_matvec_plain):
        got = np.full(rows, np.nan, np.float32)
        fn(bl, rs, xq, xs, got)
        assert np.array_equal(got, want), fn
    for prefetch in (True, False):
        got = np.full(rows, np.nan, np.float32)
        B.blocked16_matvec_next(bl, rs, xq, xs, got, prefetch, bl)
        assert np.array_equal(got, want), prefetch
    assert np.array_equal(B.blocked16_matvec_checked(bl, rs, xq, xs, threads=2), want)


@pytest.mark.skipif(simd.ROW_DOT_ISA == "none", reason="no SIMD row dot on this CPU")
@pytest.mark.parametrize("isa", _isas())
@pytest.mark.parametrize("ahead", [0, 8192])
def test_every_simd_form_of_the_block_pass_is_exact(isa, ahead):
    """The AVX2 (two 8-row halves), AVX-512BW and VNNI forms this CPU can run, with and without the
    prefetch that runs on into the next matrix, on odd shapes: rows and columns past the matrix are
    masked (no output written past ``out``: sentinels stay)."""
    block_pass = B._make_block_pass(isa, ahead)
    nxt = np.zeros((3, 100), np.uint8)

    @numba.njit
    def run(packed, rs, xq, xs, out):
        q = act_sum(xq)
        for b in range(packed.shape[0]):
            block_pass(packed, b, xq, q, rs, xs, out, nxt)

    for rows, cols in SHAPES:
        wt, rs, xq, xs = _problem(rows, cols, rows + 7 * cols)
        want = np.empty(rows, np.float32)
        ternary_matvec(pack_ternary2(wt), rs, xq, xs, want)
        room = np.full(rows + 40, -7.0, np.float32)  # out is a view: 40 sentinels follow it
        run(B.pack_blocked16(pack_ternary2(wt), cols), rs, xq, xs, room[:rows])
        assert np.array_equal(room[:rows], want), (isa, rows, cols)
        assert np.all(room[rows:] == -7.0), (isa, rows, cols)


def test_extreme_activations_stay_exact():
    """Every weight +1 (code 2, the largest code: x 4**3 = 128 in the top group) against 127 and
    against -127: the int16 pair sums of vpmaddubsw and the int32 lanes hold."""
    for v in (127, -127):
        wt = np.ones((32, 4096), np.int8)
        xq = np.full(4096, v, np.int8)
        rs = np.ones(32, np.float32)
        got = B.blocked16_matvec_checked(B.blocked16_from_ternary(wt), rs, xq, 1.0)
        assert np.all(got == np.float32(4096 * v))


def test_bad_input_is_refused_with_a_clear_error():
    wt, rs, xq, xs = _problem(20, 40, 0)
    bl = B.blocked16_from_ternary(wt)
    out = np.empty(20, np.float32)
    with pytest.raises(ValueError, match="a blocked16 \\(20, 49\\) matrix has"):
        B.blocked16_matvec_checked(bl, rs, np.zeros(49, np.int8), xs)
    with pytest.raises(ValueError, match="xq must be a C-contiguous 1-D int8"):
        B.blocked16_matvec_checked(bl, rs, xq.astype(np.int16), xs)
    with pytest.raises(ValueError, match="row_scale has 19 entries"):
        B.blocked16_matvec_checked(bl, rs[:19], xq, xs, out=out)
    with pytest.raises(ValueError, match="-128"):
        B.blocked16_matvec_checked(bl, rs, np.full(40, -128, np.int8), xs)
    with pytest.raises(ValueError, match="finite"):
        B.blocked16_matvec_checked(bl, rs, xq, np.float32("nan"))
    with pytest.raises(ValueError, match="columns need"):
        B.pack_blocked16(pack_ternary2(wt), 41)
    with pytest.raises(ValueError, match="2-D uint8"):
        B.pack_blocked16(wt, 40)
    wide = B.BLOCKED_MAX_COLS + 1  # past it an int32 lane could overflow: refused, never wrong numbers
    with pytest.raises(ValueError, match="exceed BLOCKED_MAX_COLS"):
        B.blocked16_matvec_checked(np.zeros(B.blocked16_shape(1, wide), np.uint8), np.ones(1, np.float32),
                                   np.zeros(wide, np.int8), 1.0)
    with pytest.raises(ValueError, match="exceed BLOCKED_MAX_COLS"):
        B.pack_blocked16(np.zeros((1, (wide + 3) // 4), np.uint8), wide)


def test_exact_at_the_column_limit():
    """BLOCKED_MAX_COLS columns of +1 weights against 127: the top group's lanes reach 4064 x cols, within 1,023 of
    int32's largest value before their shift back, and the sums stay exact (the AVX-512BW / AVX2 forms' int16
    pair sums are covered by test_extreme_activations_stay_exact)."""
    cols = B.BLOCKED_MAX_COLS
    assert 64 * 2 * 127 * (cols // 4) <= 2**31 - 1 < 64 * 2 * 127 * ((cols + 16) // 4)
    bl = B.blocked16_from_ternary(np.ones((16, cols), np.int8))
    got = B.blocked16_matvec_checked(bl, np.ones(16, np.float32), np.full(cols, 127, np.int8), 1.0)
    assert np.all(got == np.float32(127 * cols))
