"""tern.kernels.attention: the engine's attention over slot-major blocks of heads agrees with a
plain numpy reference on the ring buffer, and gives the same bits whatever the number of blocks.
(The engine's caches start on a cache line: tests/run/test_engine_region.py.)"""

import numpy as np
import pytest

from tern.kernels import attention as A
from tern.kernels.region import item_rows


def _reference(keys, values, nh):
    """softmax(q k / sqrt(hd)) v per head over the given positions (oldest first): keys (n, D),
    values (n, D), q the newest token's query -> (D,)."""
    def run(q):
        D = q.shape[0]
        hd = D // nh
        out = np.zeros(D, np.float64)
        for h in range(nh):
            s = keys[:, h * hd:(h + 1) * hd].astype(np.float64) @ q[h * hd:(h + 1) * hd] / np.sqrt(hd)
            p = np.exp(s - s.max())
            out[h * hd:(h + 1) * hd] = (p / p.sum()) @ values[:, h * hd:(h + 1) * hd]
        return out
    return run


def _decode(nh, hd, W, nb, tokens, seed=0):
    """Outputs of ``tokens`` steps (T, D) and the (q, k, v) of every step."""
    D = nh * hd
    kc, vc = np.zeros((1, W * D), np.float32), np.zeros((1, W * D), np.float32)
    sc, y = np.zeros(nh * (W + A.SCORE_PAD), np.float32), np.zeros(D, np.float32)
    rng = np.random.default_rng(seed)
    outs, qkv = [], []
    for t in range(tokens):
        uz = rng.standard_normal(3 * D).astype(np.float32)  # q, k, v of the token
        A.attend(uz[:D], kc[0], vc[0], uz, np.int64(D), np.int64(W), np.int64(nh), np.int64(nb), np.int64(t), sc, y)
        outs.append(y.copy())
        qkv.append(uz.reshape(3, D))
    return np.stack(outs), np.stack(qkv)


@pytest.mark.parametrize("nh, hd, W", [(4, 16, 8), (5, 8, 6), (1, 32, 4)])
def test_attention_matches_the_reference_past_the_window(nh, hd, W):
    out, qkv = _decode(nh, hd, W, 1, 3 * W + 2)
    for t in range(out.shape[0]):
        first = max(0, t - W + 1)  # the last min(t + 1, W) positions
        ref = _reference(qkv[first:t + 1, 1], qkv[first:t + 1, 2], nh)(qkv[t, 0].astype(np.float64))
        np.testing.assert_allclose(out[t], ref, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("nh, nb", [(9, 2), (8, 2), (5, 4), (5, 5), (16, 3)])
def test_blocks_of_heads_give_the_same_bits(nh, nb):
    one, _ = _decode(nh, 8, 7, 1, 20)
    blocks, _ = _decode(nh, 8, 7, nb, 20)
    assert np.array_equal(one, blocks)


def test_item_rows_of_heads_cover_every_head_once():
    for nh in range(1, 20):
        for nb in range(1, nh + 1):
            covered = [h for b in range(nb) for h in range(*item_rows(nh, nb, b, 1))]
            assert covered == list(range(nh)), (nh, nb)
