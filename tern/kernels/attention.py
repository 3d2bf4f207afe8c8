"""The decode engine's attention over its key / value ring buffers, one token.

Each attention layer keeps its last ``W`` (attn_window) keys and values in one flat cache per
layer, (W x D,), D = heads x head_dim, split into ``nb`` blocks of whole heads
(tern.kernels.region.item_rows; ``nb`` = the engine's G_ATTN_BLOCKS: the one-region step's attention items,
one per thread, and 1 on one thread). Each block is **slot-major**: (W, its heads x head_dim), slot
``position % W`` holding the block's heads' keys (values) of that position side by side. A token's
attention of one block reads its used key slots once front to back (every head's scores), then its
used value slots: two sequential streams, one per thread at 2 threads.

Until session 46 the caches were per head, (heads, W, head_dim): a token then read 2 x heads
separate runs of ``n x head_dim x 4`` bytes (n = min(t + 1, W); 8 KiB at n = 32, head_dim 64), too
short for the hardware prefetcher, and summed each head's values through an output vector held in
memory. A layout of one slot-major block for every head at any thread count (tried first) made
the region step's two threads read alternate halves of each slot: the 9.7B MoE peer ran x1.14 at
1 thread and x0.91-0.92 at 2 (benchmarks/README, session 46).

Exactness: :func:`attend_heads` is not inlined and every caller (the one-thread step, block
after block; the one-region step's items, a block each; the probe) runs this one compiled body
with int64 head bounds, so each head's sums are the same at any thread count and whatever
block it sits in (tests/run/test_engine_region.py).
"""

from __future__ import annotations

import numba
import numpy as np

from tern.kernels.cache_guard import drop_stale_cache
from tern.kernels.kernels_stored import JIT
from tern.kernels.prefetch import CACHE_LINE_BYTES
from tern.kernels.region import item_rows
from tern.kernels.routing import softmax

LINE_FLOATS = CACHE_LINE_BYTES // 4  # float32 values in a cache line
SCORE_PAD = 2 * LINE_FLOATS  # the scores scratch holds heads x (window + SCORE_PAD) floats (attend_heads)


@numba.njit(cache=True, inline="always")
def head_block(cache, W, hd, h0, h1):
    """The (W, (h1 - h0) * hd) slot-major block of heads h0..h1 in one layer's flat cache (W * D,)."""
    return cache[h0 * hd * W:h1 * hd * W].reshape((W, (h1 - h0) * hd))


@numba.njit(**JIT)
def store_kv_block(kb, vb, uz, D, c0, slot):
    """The token's key and value columns c0 .. c0 + width (uz[D:2D], uz[2D:3D]) into slot
    ``slot`` of one block's slot-major buffers kb, vb (W, width)."""
    kr, vr = kb[slot], vb[slot]
    for c in range(kr.shape[0]):
        kr[c] = uz[D + c0 + c]
        vr[c] = uz[2 * D + c0 + c]


@numba.njit(**JIT)
def attend_heads(q, kb, vb, t, h0, h1, hd, sc, y):
    """y[h0*hd:h1*hd] = per head h: softmax(q_h k_h / sqrt(hd)) v_h at position t, over the last
    n = min(t + 1, W) slots (oldest first) of the block of heads h0..h1, kb, vb (W, (h1 - h0) * hd)
    slot-major; q, y (D,); sc (>= heads x (W + SCORE_PAD),) scratch: head h's n scores from
    sc[h * ss], ss >= n + 16 a whole number of cache lines (calls on other heads, the one-region
    step's items on other threads, write no line in common)."""
    W = kb.shape[0]
    n = min(t + 1, W)
    s0 = (t - n + 1) % W  # the oldest slot
    ss = (n + SCORE_PAD - 1) // LINE_FLOATS * LINE_FLOATS  # a head's stride in sc: >= n + one whole line
    scale = np.float32(1.0 / np.sqrt(np.float32(hd)))
    sj = s0
    for j in range(n):  # scores: the block's used key slots front to back
        kr = kb[sj]
        for h in range(h0, h1):
            o, b = h * hd, (h - h0) * hd
            qh, kh = q[o:o + hd], kr[b:b + hd]
            s = np.float32(0.0)
            for c in range(hd):
                s += qh[c] * kh[c]
            sc[h * ss + j] = s * scale
        sj = sj + 1 if sj + 1 < W else 0
    for h in range(h0, h1):
        softmax(sc[h * ss:h * ss + n])
        for c in range(h * hd, (h + 1) * hd):
            y[c] = 0.0
    sj = s0
    for j in range(n):  # outputs: the block's used value slots front to back
        vr = vb[sj]
        for h in range(h0, h1):
            o, b = h * hd, (h - h0) * hd
            p = sc[h * ss + j]
            yh, vh = y[o:o + hd], vr[b:b + hd]
            for c in range(hd):
                yh[c] += p * vh[c]
        sj = sj + 1 if sj + 1 < W else 0


@numba.njit(**JIT)
def attend_block(q, kc, vc, uz, D, W, nh, nb, b, t, sc, y):
    """Block b of nb of one layer's flat caches kc, vc (W * D,): store the token's key and value
    of its heads in slot t % W, then attend them (:func:`attend_heads`)."""
    hd = D // nh
    h0, h1 = item_rows(nh, nb, b, 1)  # the region step's attention item b: whole heads
    kb, vb = head_block(kc, W, hd, h0, h1), head_block(vc, W, hd, h0, h1)
    store_kv_block(kb, vb, uz, D, h0 * hd, t % W)
    attend_heads(q, kb, vb, t, h0, h1, hd, sc, y)


@numba.njit(**JIT)
def attend(q, kc, vc, uz, D, W, nh, nb, t, sc, y):
    """Every head at position t on one thread, block after block (:func:`attend_block`)."""
    for b in range(nb):
        attend_block(q, kc, vc, uz, D, W, nh, nb, np.int64(b), t, sc, y)


drop_stale_cache(__file__, ("routing.py", "fastmath.py", "kernels_stored.py", "prefetch.py", "region.py"), attend)  # cache hygiene
