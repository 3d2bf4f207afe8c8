"""How the one-region step (tern.kernels.ops_region) shares a phase's work out: ``n_items``
row ranges of a matrix (:func:`mat_phase`; the head and a MoE router: :func:`dense_phase`),
a layer's chosen experts one per item (:func:`experts_phase`), the activation-skip down projection over output segments (:func:`skip_phase`),
an SSM layer's selective scan over channel ranges (:func:`scan_phase`), an attention layer's
heads (:func:`attn_phase`), and the single
items the vector work between them runs in (:func:`solo` / :func:`end_solo`). Each item
runs the single-thread kernels on its rows, so every row's arithmetic is the same as in
tern.kernels.ops at any thread count."""

from __future__ import annotations

import numba

from tern.kernels import ops
from tern.kernels.cache_guard import NO, NO_ADDR, ONE, drop_stale_cache
from tern.kernels.kernels_stored import DENSE_FP32, DENSE_INT8, dense_matvec, f32, router_logits, u8
from tern.kernels.kernels_ternary import COMPILED_SETTINGS, SEG_BYTES, _skip_segments, skip_groups
from tern.kernels.ops import G_D, G_THREADS
from tern.kernels.policy import (
    REGION_ATTN_MIN_D,
    REGION_ROW_ALIGN,
    REGION_SCAN_ALIGN,
    REGION_SCAN_MIN_WEIGHTS,
)
from tern.kernels.region import REGION_STAMP, claim, finish, item_rows, wait_done

# Region parameters ``rp`` (int64): [min_weights, items_per_thread]; the engine's defaults
# and their measurements: tern.kernels.policy (REGION_MIN_WEIGHTS, REGION_ITEMS_PER_THREAD).
RP_MIN_WEIGHTS, RP_ITEMS = 0, 1


@numba.njit(cache=True, inline="always")
def n_items(G, rp, rows, cols):
    """Items a (rows, cols) matrix is split into: 1 under ``min_weights`` weights."""
    if rows * cols < rp[RP_MIN_WEIGHTS]:
        return 1
    return max(1, min(G[G_THREADS] * rp[RP_ITEMS], (rows + REGION_ROW_ALIGN - 1) // REGION_ROW_ALIGN))


@numba.njit(cache=True, inline="always")
def solo(ctr, p):
    """Is this thread the one that runs phase p's single item?"""
    return claim(ctr, p) == 0


@numba.njit(cache=True, inline="always")
def end_solo(ctr, p, mine):
    """Close a single-item phase (its runner counts it done; everyone waits); the next phase."""
    if mine:
        finish(ctr, p)
    wait_done(ctr, p, ONE)
    return p + 1


@numba.njit(cache=True)
def mat_phase(ctr, p, n, buf, aux, Gs, w_addr, s_addr, rows, cols, xq, xs, xd, out, w2, s2, out2):
    """Phase p: out (rows,) = W @ x in n row-range items, and when ``w2`` >= 0 a second
    matrix of the same shape into out2 (items n .. 2n-1: gate and up in one phase)."""
    total = 2 * n if w2 >= 0 else n
    while True:
        i = claim(ctr, p)
        if i >= total:
            break
        w, s, o = (w_addr, s_addr, out) if i < n else (w2, s2, out2)
        r0, r1 = item_rows(rows, n, i % n, REGION_ROW_ALIGN)
        if r1 > r0:
            ops.bitlinear(buf, aux, Gs, w + 2 * ops.mat_bytes(Gs, r0, cols), s + 8 * r0, r1 - r0, cols,
                          xq, xs, xd, o[r0:r1])
        finish(ctr, p)
    wait_done(ctr, p, total)
    return p + 1


@numba.njit(cache=True)
def dense_phase(ctr, p, n, buf, aux, kind, w_addr, s_addr, rows, D, xn, out, router):
    """Phase p: out (rows,) = the stored (rows, D) table at ``w_addr`` (``kind``:
    kernels_stored.DENSE_*) @ xn in n row-range items: the head (kernels_stored.dense_matvec)
    or, with ``router``, a MoE router (kernels_stored.router_logits: each row's sum as the
    routing item makes it)."""
    row_bytes = D if kind == DENSE_INT8 else (4 * D if kind == DENSE_FP32 else 2 * D)
    while True:
        i = claim(ctr, p)
        if i >= n:
            break
        r0, r1 = item_rows(rows, n, i, REGION_ROW_ALIGN)
        if r1 > r0:
            w, s = w_addr + 2 * row_bytes * r0, s_addr + 8 * r0
            if router:
                router_logits(buf, aux, kind, w, s, r1 - r0, D, xn, out[r0:r1])
            else:
                dense_matvec(buf, aux, kind, w, s, r1 - r0, D, xn, out[r0:r1], NO)
        finish(ctr, p)
    wait_done(ctr, p, n)
    return p + 1


@numba.njit(cache=True)
def experts_phase(ctr, p, tid, buf, aux, Grs, T, l, chosen, k, H, xq, xs, xd, eps, eo_all, gs, us, hds, hqs):
    """Phase p: eo_all[j] (D,) = chosen expert j's output, one expert per item, on thread
    slot ``tid``'s scratch with the single-thread kernels (as ops.routed_experts_par)."""
    D = Grs[G_D]
    mb, db = ops.routed_steps(Grs, T, l, H)
    while True:
        j = claim(ctr, p)
        if j >= k:
            break
        e = chosen[j]
        ops.gated_mlp(buf, aux, Grs, T[l, ops.F_EG] + e * mb, T[l, ops.F_EG_S] + 8 * e * H,
                      T[l, ops.F_EU] + e * mb, T[l, ops.F_EU_S] + 8 * e * H, T[l, ops.F_ED] + e * db,
                      T[l, ops.F_ED_S] + 8 * e * D, H, xq, xs, xd, gs[tid], us[tid], hqs[tid], hds[tid], eps, eo_all[j],
                      T[l, ops.F_EG] + chosen[j + Grs[G_THREADS]] * mb if j + Grs[G_THREADS] < k else NO_ADDR)  # likely next claim
        finish(ctr, p)
    wait_done(ctr, p, k)
    return p + 1


@numba.njit(cache=True)
def skip_phase(ctr, p, n, buf, aux, w_addr, s_addr, D, H, hq, hs, out):
    """Phase p: out (D,) = the activation-skip down projection (the transposed (H, D)
    matrix at ``w_addr``, tern.kernels.kernels_ternary) in n items of whole 256-output
    segments, each over every nonzero hidden unit in the kernel's own order."""
    rb = (D + 3) // 4
    packed_t = u8(buf, aux, w_addr, H * rb).reshape(H, rb)
    row_scale = f32(buf, aux, s_addr, D)
    nseg = (rb + SEG_BYTES - 1) // SEG_BYTES
    while True:
        i = claim(ctr, p)
        if i >= n:
            break
        s0, s1 = item_rows(nseg, n, i, 1)  # whole segments
        if s1 > s0:
            idx, qq, qsum = skip_groups(hq[:H])  # each item its own (a few us), no shared scratch
            _skip_segments(packed_t, idx, qq, qsum, row_scale, hs, out[:D], s0, s1)
        finish(ctr, p)
    wait_done(ctr, p, n)
    return p + 1


@numba.njit(cache=True, inline="always")
def scan_items(G, Di, R, N):
    """Items the selective scan of a layer is split into: one per thread from
    REGION_SCAN_MIN_WEIGHTS weights of dt projection and state (Di x (R + N)), else 1."""
    if Di * (R + N) < REGION_SCAN_MIN_WEIGHTS:
        return 1
    return max(1, min(G[G_THREADS], Di // REGION_SCAN_ALIGN))


@numba.njit(cache=True)
def scan_phase(ctr, p, n, buf, aux, G, T, l, hT, dbc, uc, z, dt, y):
    """Phase p: layer l's selective-scan step (ops.scan_channels) in n items of whole
    REGION_SCAN_ALIGN-channel ranges (channels are independent: the same values as one item)."""
    Di = hT.shape[1]
    while True:
        i = claim(ctr, p)
        if i >= n:
            break
        c0, c1 = item_rows(Di, n, i, REGION_SCAN_ALIGN)
        if c1 > c0:
            ops.scan_channels(buf, aux, G, T, l, hT, dbc, uc, z, dt, y, c0, c1)
        finish(ctr, p)
    wait_done(ctr, p, n)
    return p + 1


@numba.njit(cache=True)
def attn_items(G, D, NH):
    """Items an attention layer's heads are split into: one per thread (at most one a head)
    from REGION_ATTN_MIN_D, else 1 (tern.predict.phases.attn_split counts the same)."""
    if D < REGION_ATTN_MIN_D or NH < 2:
        return 1
    return max(1, min(G[G_THREADS], NH))


@numba.njit(cache=True)
def attn_phase(ctr, p, n, uz, D, W, NH, kc, vc, t, sc, y):
    """Phase p: attention at position t in n items, item i the i-th of the n blocks of whole heads
    one layer's flat caches kc, vc (W * D,) are kept in (tern.kernels.attention: G_ATTN_BLOCKS,
    :func:`attn_items`): it stores its heads' key and value in slot t % W and attends them, the same
    compiled body and values as the one-thread step's block after block (ops.attend)."""
    while True:
        i = claim(ctr, p)
        if i >= n:
            break
        ops.attend_block(uz[:D], kc, vc, uz, D, W, NH, n, i, t, sc, y)
        finish(ctr, p)
    wait_done(ctr, p, n)
    return p + 1


# numba cache hygiene: the cached code above embeds the kernels of these files (the one-region
# step's module adds this one)
REGION_DEPS = ("ops.py", "region.py", "kernels_ternary.py", "kernels_b3.py", "kernels_blocked.py", "simd.py", "quant.py", "kernels_dense.py",
               "fastmath.py", "kernels_stored.py", "prefetch.py", "routing.py", "policy.py", "ssm_step.py",
               "kernels_unpack.py", "cache_guard.py", "attention.py", "activation.py", COMPILED_SETTINGS, REGION_STAMP)  # policy: its REGION_* constants are compiled in
drop_stale_cache(__file__, REGION_DEPS, mat_phase)
