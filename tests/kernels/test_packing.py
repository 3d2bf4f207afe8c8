"""Packing round trips, layout facts and weight quantization (tern.kernels.packing)."""

import numpy as np
import pytest

from tern.core.formats import tensor_bytes
from tern.kernels import packing as P

SHAPES = [(1, 1), (1, 4), (3, 5), (2, 63), (4, 255), (5, 256), (3, 257), (7, 700), (2, 1023), (9, 4096)]


def _rand_ternary(rng, rows, cols):
    return rng.integers(-1, 2, size=(rows, cols)).astype(np.int8)


@pytest.mark.parametrize("shape", SHAPES)
def test_ternary2_round_trip(shape):
    rng = np.random.default_rng(sum(shape))
    wt = _rand_ternary(rng, *shape)
    packed = P.pack_ternary2(wt)
    assert packed.dtype == np.uint8
    assert packed.shape == (shape[0], P.ternary2_row_bytes(shape[1]))
    np.testing.assert_array_equal(P.unpack_ternary2(packed, shape[1]), wt)


@pytest.mark.parametrize("shape", SHAPES)
def test_b3_round_trip_and_expand(shape):
    rng = np.random.default_rng(sum(shape) + 1)
    wt = _rand_ternary(rng, *shape)
    packed = P.pack_ternary_b3(wt)
    assert packed.shape == (shape[0], -(-shape[1] // 5))
    assert packed.max() <= 242
    np.testing.assert_array_equal(P.unpack_ternary_b3(packed, shape[1]), wt)
    np.testing.assert_array_equal(P.expand_b3_to_ternary2(packed, shape[1]), P.pack_ternary2(wt))


def test_ternary2_layout_is_documented_one():
    # column s + G*k + j in bits 2k of byte j; code w + 1; full segment G = 64.
    wt = np.zeros((1, 300), dtype=np.int8)
    wt[0, 64 * 2 + 5] = 1  # segment 0, k=2, j=5 -> byte 5 bits 4..5 = code 2
    wt[0, 256 + 11 * 3 + 7] = -1  # tail: L=44, G=11, k=3, j=7 -> byte 64+7, bits 6..7 = code 0
    packed = P.pack_ternary2(wt)
    assert packed.shape == (1, 75)
    expect = np.full(75, 0x55, dtype=np.uint8)
    expect[5] = 0x55 & ~(3 << 4) | (2 << 4)
    expect[64 + 7] = 0x55 & ~(3 << 6)
    np.testing.assert_array_equal(packed[0], expect)


def test_row_bytes_match_formats():
    for cols in (4, 256, 4096, 14336):
        assert P.ternary2_row_bytes(cols) * 3 + 3 * 4 == tensor_bytes("ternary2", (3, cols))
    assert P.ternary_b3_row_bytes(5) == 1 and P.ternary_b3_row_bytes(6) == 2


def test_random_ternary2_valid_and_seeded():
    a = P.random_ternary2(37, 300, seed=3, p_zero=0.5)
    b = P.random_ternary2(37, 300, seed=3, p_zero=0.5)
    np.testing.assert_array_equal(a, b)
    wt = P.unpack_ternary2(a, 300)
    assert set(np.unique(wt)) <= {-1, 0, 1}
    assert 0.4 < (wt == 0).mean() < 0.6


def test_quantize_weights_matches_model_md():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 37)).astype(np.float32)
    w[2] = 0.0  # all-zero row: scale clamps to 1e-8, weights stay 0
    wt, s = P.quantize_weights(w)
    s_ref = np.maximum(np.abs(w.astype(np.float64)).mean(axis=1), 1e-8).astype(np.float32)
    np.testing.assert_array_equal(s, s_ref)
    np.testing.assert_array_equal(wt, np.clip(np.rint(w / s_ref[:, None]), -1, 1).astype(np.int8))
    assert s[2] == np.float32(1e-8) and not wt[2].any()
    # round half to even: w / s = 0.5 -> 0, 1.5 -> 2 -> clamped 1
    w2 = np.array([[0.5, 1.5, 1.0, 1.0]], dtype=np.float32)  # mean |w| = 1
    wt2, s2 = P.quantize_weights(w2)
    assert s2[0] == 1.0 and wt2.tolist() == [[0, 1, 1, 1]]


@pytest.mark.parametrize("bad", [
    np.zeros((2, 3), dtype=np.int16),
    np.zeros(3, dtype=np.int8),
    np.full((2, 3), 2, dtype=np.int8),
    np.zeros((0, 3), dtype=np.int8),
    [[0, 1]],
])
def test_pack_rejects_bad_weights(bad):
    with pytest.raises(ValueError):
        P.pack_ternary2(bad)
    with pytest.raises(ValueError):
        P.pack_ternary_b3(bad)


def test_unpack_rejects_bad_packed():
    good = P.pack_ternary2(np.zeros((2, 10), dtype=np.int8))
    with pytest.raises(ValueError, match="bytes per row"):
        P.unpack_ternary2(good, 20)
    bad = good.copy()
    bad[1, 0] = 0xFF  # code 3
    with pytest.raises(ValueError, match="invalid code"):
        P.unpack_ternary2(bad, 10)
    with pytest.raises(ValueError):
        P.unpack_ternary2(good.astype(np.int8), 10)
    with pytest.raises(ValueError, match="> 242"):
        P.unpack_ternary_b3(np.full((1, 2), 250, dtype=np.uint8), 10)
    with pytest.raises(ValueError):
        P.ternary2_row_bytes(0)


def test_quantize_weights_rejects_bad_input():
    with pytest.raises(ValueError):
        P.quantize_weights(np.zeros((2, 2), dtype=np.float64))
    with pytest.raises(ValueError, match="non-finite"):
        P.quantize_weights(np.array([[1.0, np.nan]], dtype=np.float32))
