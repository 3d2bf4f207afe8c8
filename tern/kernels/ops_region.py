"""The per-token step in ONE numba parallel region (the engine's ``region`` option):
:func:`token_step_region` computes exactly what tern.kernels.ops.token_step does, with the
same per-row and per-expert arithmetic, so its logits are bit-identical at any thread count.

Why: tern.kernels.ops splits a matrix over threads in a parallel region of its own, and
only from ``par_min_weights`` weights (1M): each region wakes the worker threads (microseconds,
more on a busy machine), more than a small model's matrices take, so a second thread buys a
small model nothing. Here the threads enter once per token and walk the token's phases
together (tern.kernels.region: claimed items, a wait between dependent phases): every
matrix of at least ``min_weights`` weights is split into row ranges (``items_per_thread``
per thread), a MoE layer's chosen experts are items of one phase (one expert per item, the
single-thread kernels; a single chosen expert's matrices are split like the others), and
the vector work between matrices (norms, quantization, attention, gating, residuals; the
SSM scan of a small layer) is one item that one thread runs while the others wait; a large
SSM layer's scan is split over its channels (tern.kernels.region_items.scan_phase). A row range is the same matrix at an address further on (``ops.mat_bytes``),
read by the single-thread kernels with the globals of ``Gs`` (G with G_PAR = 0).
"""

from __future__ import annotations

import numba
import numpy as np

from tern.kernels import ops
from tern.kernels.cache_guard import NO, NO_ADDR, ONE, YES, ZERO, drop_stale_cache
from tern.kernels.kernels_blocked import BLOCKED_BY_DEFAULT
from tern.kernels.kernels_stored import dense_row, f32
from tern.kernels.kernels_ternary import DEFAULT_VARIANT, SEG_COLS
from tern.kernels.ops import (
    F_CONV_B,
    F_CONV_W,
    F_ED,
    F_ED_S,
    F_EG,
    F_EG_S,
    F_EU,
    F_EU_S,
    F_IN,
    F_IN_S,
    F_NORM1,
    F_NORM2,
    F_OUT,
    F_OUT_S,
    F_ROUTER,
    F_ROUTER_S,
    F_SD,
    F_SD_S,
    F_SG,
    F_SG_S,
    F_SU,
    F_SU_S,
    F_XP,
    F_XP_S,
    G_ACT,
    G_ACT_SKIP,
    G_ATTN_BLOCKS,
    G_D,
    G_DI,
    G_EMBED,
    G_EMBED_KIND,
    G_EMBED_S,
    G_HEAD,
    G_HEAD_KIND,
    G_HEAD_S,
    G_K,
    G_KERNEL,
    G_MOE_SKIP,
    G_N,
    G_NH,
    G_NL,
    G_NORM_F,
    G_R,
    G_ROUTER_KIND,
    G_THREADS,
    G_V,
    G_WIN,
    KERNEL_TERNARY,
    KIND_SSM,
    L_E,
    L_HE,
    L_HSH,
    L_KIND,
    L_MOE,
    L_NSH,
    L_STATE,
    L_TOPK,
)
from tern.kernels.policy import (
    PAR_MIN_WEIGHTS,
    REGION_ATTN_MIN_D,
    REGION_ITEMS_PER_THREAD,
    REGION_MIN_WEIGHTS,
    EnginePolicy,
)
from tern.kernels.region import clock_start
from tern.kernels.region_items import (
    REGION_DEPS,
    RP_ITEMS,
    RP_MIN_WEIGHTS,
    attn_phase,
    dense_phase,
    end_solo,
    experts_phase,
    mat_phase,
    n_items,
    scan_items,
    scan_phase,
    skip_phase,
    solo,
)
from tern.kernels.routing import pick_experts

# the activation-skip down projection split over 256-output segments (its SIMD form only)
SKIP_SEGMENTS = DEFAULT_VARIANT == "simd"
# scal (float32, >= 3): the activation scales one phase's item computes for the next phase
S_MIX, S_FFN, S_HID = 0, 1, 2


def run_policy(par_min_weights: int, region_params=None, stream_prefetch: bool = True,
               stream: bool = True, blocked: bool = BLOCKED_BY_DEFAULT) -> EnginePolicy:
    """The EnginePolicy an engine runs with (recorded with its measurements, so that the
    predictor prices its splits): the per-matrix step's ``par_min_weights``; with the
    region's parameters (``Engine.region_params``, None: no region) the one-region step;
    ``stream_prefetch`` / ``stream``: the engine's (Engine.stream_prefetch / stream_dram);
    ``blocked``: its layout is blocked16 (default: the ``layout="auto"`` choice of this CPU)."""
    if region_params is None:
        return EnginePolicy(par_min_weights=int(par_min_weights), router_int8=True,
                            stream_prefetch=bool(stream_prefetch), stream=bool(stream), blocked=bool(blocked))
    return EnginePolicy(par_min_weights=int(par_min_weights), region=True,
                        region_min_weights=int(region_params[RP_MIN_WEIGHTS]),
                        region_items=int(region_params[RP_ITEMS]), region_skip_split=SKIP_SEGMENTS,
                        router_int8=True, region_router_split=True, region_scan_split=True,
                        region_attn_split=True, region_attn_min_d=REGION_ATTN_MIN_D,
                        stream_prefetch=bool(stream_prefetch), stream=bool(stream), blocked=bool(blocked))


# what Engine(threads > 1) runs by default on this target (recorded by the probe and sweeps)
ENGINE_POLICY = run_policy(PAR_MIN_WEIGHTS, (REGION_MIN_WEIGHTS, REGION_ITEMS_PER_THREAD))


def phases_bound(LI: np.ndarray) -> int:
    """Phases a token can take at most (counters to allocate): the embedding, per layer at
    most 7 for the mixer (an SSM's split scan adds one), 1 for its residual, 4 per shared
    expert and 6 for the routed experts (the router, the routing, then a down projection is
    one phase, split or not), the head's 2."""
    return 1 + sum(14 + 4 * int(n) for n in LI[:, L_NSH]) + 2


PEND_EO, PEND_X = 1, 2  # work deferred to the next single-item phase: acc += eo, x += acc


@numba.njit(cache=True, inline="always")
def settle(pend, x, acc, eo, D):
    """The deferred additions (``pend``: PEND_* bits), in the order ops.ffn_step makes them."""
    if pend & PEND_EO:
        for i in range(D):
            acc[i] += eo[i]
    if pend & PEND_X:
        for i in range(D):
            x[i] += acc[i]


@numba.njit(cache=True)
def mixer_phases(ctr, p, pend, buf, aux, G, Gs, rp, T, LI, l, eps, t, ssm_h, conv, kc, vc, work, iwork, scal):
    """The previous layer's deferred additions, then acc (D,) = Mixer_l(RMSNorm(x; norm1)) as
    ops.mixer_step (its residual is ffn_phases' first step)."""
    x, xn, acc, eo, uz, uc, dbc, dt, y, g, u, sc, pr, wk, xd, hd = ops.carve(work, G)
    xq, hq = ops.icarve(iwork, G)
    D, Di, N, R, K = G[G_D], G[G_DI], G[G_N], G[G_R], G[G_K]
    mine = solo(ctr, p)
    if mine:
        settle(pend, x, acc, eo, D)
        ops.rmsnorm(x, f32(buf, aux, T[l, F_NORM1], D), eps, xn)
        scal[S_MIX] = ops.quant(G, xn, xq, xd, eps)
    p = end_solo(ctr, p, mine)
    if LI[l, L_KIND] == KIND_SSM:
        si = LI[l, L_STATE]
        p = mat_phase(ctr, p, n_items(G, rp, 2 * Di, D), buf, aux, Gs, T[l, F_IN], T[l, F_IN_S], 2 * Di, D,
                      xq, scal[S_MIX], xd, uz, NO_ADDR, NO_ADDR, uz)
        mine = solo(ctr, p)
        if mine:
            cw = f32(buf, aux, T[l, F_CONV_W], K * Di).reshape(K, Di)
            ops.causal_conv(cw, f32(buf, aux, T[l, F_CONV_B], Di), conv[si], uz[:Di], uc)
            scal[S_MIX] = ops.quant(G, uc, xq, xd, eps)
        p = end_solo(ctr, p, mine)
        p = mat_phase(ctr, p, n_items(G, rp, R + 2 * N, Di), buf, aux, Gs, T[l, F_XP], T[l, F_XP_S], R + 2 * N,
                      Di, xq, scal[S_MIX], xd, dbc, NO_ADDR, NO_ADDR, dbc)
        ns = scan_items(G, Di, R, N)
        if ns > 1:  # channel ranges on every thread, then the output's quantization
            p = scan_phase(ctr, p, ns, buf, aux, G, T, l, ssm_h[si], dbc, uc, uz[Di:2 * Di], dt, y)
        mine = solo(ctr, p)
        if mine:
            if ns == 1:
                ops.scan_channels(buf, aux, G, T, l, ssm_h[si], dbc, uc, uz[Di:2 * Di], dt, y, ZERO, Di)
            scal[S_MIX] = ops.quant(G, y, xq, xd, eps)
        p = end_solo(ctr, p, mine)
        return mat_phase(ctr, p, n_items(G, rp, D, Di), buf, aux, Gs, T[l, F_OUT], T[l, F_OUT_S], D, Di,
                         xq, scal[S_MIX], xd, acc, NO_ADDR, NO_ADDR, acc)
    ai, W = LI[l, L_STATE], G[G_WIN]
    p = mat_phase(ctr, p, n_items(G, rp, 3 * D, D), buf, aux, Gs, T[l, F_IN], T[l, F_IN_S], 3 * D, D,
                  xq, scal[S_MIX], xd, uz, NO_ADDR, NO_ADDR, uz)
    na = G[G_ATTN_BLOCKS]  # region_items.attn_items, set at load: the caches' blocks of heads
    if na > 1:  # heads over the threads, then the output's quantization as one item
        p = attn_phase(ctr, p, na, uz, D, W, G[G_NH], kc[ai], vc[ai], t, sc, y)
    mine = solo(ctr, p)
    if mine:
        if na == 1:
            ops.attend(uz[:D], kc[ai], vc[ai], uz, D, W, G[G_NH], na, t, sc, y)
        scal[S_MIX] = ops.quant(G, y[:D], xq, xd, eps)
    p = end_solo(ctr, p, mine)
    return mat_phase(ctr, p, n_items(G, rp, D, D), buf, aux, Gs, T[l, F_OUT], T[l, F_OUT_S], D, D,
                     xq, scal[S_MIX], xd, acc, NO_ADDR, NO_ADDR, acc)


@numba.njit(cache=True)
def expert_phases(ctr, p, buf, aux, G, Gx, rp, ga, gsa, ua, usa, da, dsa, H, eps, work, iwork, scal):
    """eo (D,) = down(act(gate(xn), up(xn))) of one expert (a shared one, the dense MLP or a
    single chosen one; ``Gx``: the serial globals it runs with) whose input quant_phases left
    in xq / scal[S_FFN], as ops.gated_mlp: gate and up split in one phase, the activation
    and its quantization in one item, the down projection split (the activation-skip one
    over output segments, :func:`skip_phase`)."""
    x, xn, acc, eo, uz, uc, dbc, dt, y, g, u, sc, pr, wk, xd, hd = ops.carve(work, G)
    xq, hq = ops.icarve(iwork, G)
    D = G[G_D]
    p = mat_phase(ctr, p, n_items(G, rp, H, D), buf, aux, Gx, ga, gsa, H, D, xq, scal[S_FFN], xd, g, ua, usa, u)
    skip = G[G_KERNEL] == KERNEL_TERNARY and G[G_ACT_SKIP] != 0
    mine = solo(ctr, p)
    if mine:
        ops.gated_act(G[G_ACT], g, u, H)
        scal[S_HID] = ops.quant_hidden(G, g[:H], hq, hd, eps)
        if skip and not SKIP_SEGMENTS:  # the plain skip kernel has no segment form: in this item
            ops.down_proj(buf, aux, Gx, da, dsa, D, H, hq, scal[S_HID], hd, eo, NO_ADDR, ZERO)
    p = end_solo(ctr, p, mine)
    if skip and SKIP_SEGMENTS:
        nseg = (D + SEG_COLS - 1) // SEG_COLS  # items of whole output segments
        n = ONE if D * H < rp[RP_MIN_WEIGHTS] else max(ONE, min(G[G_THREADS] * rp[RP_ITEMS], nseg))
        return skip_phase(ctr, p, n, buf, aux, da, dsa, D, H, hq, scal[S_HID], eo)
    if not skip:
        p = mat_phase(ctr, p, n_items(G, rp, D, H), buf, aux, Gx, da, dsa, D, H, hq, scal[S_HID], hd, eo, NO_ADDR, NO_ADDR, eo)
    return p


@numba.njit(cache=True)
def ffn_phases(ctr, p, tid, buf, aux, G, Gs, Grs, rp, T, LI, l, eps, work, iwork, counts, last, scal):
    """x += acc (the mixer's output), then FFN_l(RMSNorm(x; norm2)) into acc as ops.ffn_step;
    returns (next phase, the additions left to the next single-item phase: PEND_*)."""
    x, xn, acc, eo, uz, uc, dbc, dt, y, g, u, sc, pr, wk, xd, hd = ops.carve(work, G)
    xq, hq = ops.icarve(iwork, G)
    D = G[G_D]
    has_ffn = T[l, F_NORM2] >= 0
    mine = solo(ctr, p)
    if mine:
        for i in range(D):
            x[i] += acc[i]
        if has_ffn:
            ops.rmsnorm(x, f32(buf, aux, T[l, F_NORM2], D), eps, xn)
            scal[S_FFN] = ops.quant(G, xn, xq, xd, eps)
            for i in range(D):
                acc[i] = 0.0
    p = end_solo(ctr, p, mine)
    if not has_ffn:
        return p, 0
    pend = ZERO
    H = LI[l, L_HSH]
    for s in range(LI[l, L_NSH]):
        mb, db = 2 * s * ops.mat_bytes(G, H, D), 2 * s * ops.down_bytes(G, D, H)
        mine = solo(ctr, p) if pend else False
        if mine:
            settle(pend, x, acc, eo, D)  # the previous shared expert's output
        if pend:
            p = end_solo(ctr, p, mine)
        p = expert_phases(ctr, p, buf, aux, G, Gs, rp, T[l, F_SG] + mb, T[l, F_SG_S] + 8 * s * H, T[l, F_SU] + mb,
                          T[l, F_SU_S] + 8 * s * H, T[l, F_SD] + db, T[l, F_SD_S] + 8 * s * D, H, eps, work,
                          iwork, scal)
        pend = PEND_EO
    mi = LI[l, L_MOE]
    if mi >= 0:
        E, He, k = LI[l, L_E], LI[l, L_HE], LI[l, L_TOPK]
        chosen = last[mi]
        together = G[G_MOE_SKIP] != 0 and k >= 2  # the chosen experts as items of one phase
        single = G[G_MOE_SKIP] != 0 and k == 1  # the one chosen expert's matrices split in row ranges
        nr = n_items(G, rp, E, D)  # the router's row ranges: a phase of their own when it splits
        if nr > 1:
            p = dense_phase(ctr, p, nr, buf, aux, G[G_ROUTER_KIND], T[l, F_ROUTER], T[l, F_ROUTER_S], E, D, xn, pr,
                            YES)  # reads xn only
        mine = solo(ctr, p)
        if mine:
            settle(pend, x, acc, eo, D)
            if nr == 1:
                ops.route(buf, aux, G, T, LI, l, xn, pr, chosen, wk)
            else:
                pick_experts(pr, E, k, chosen, wk)
            for j in range(k):
                counts[mi, chosen[j]] += 1
            if not (together or single):  # every expert (no MoE skip): in this item, in order
                ops.routed_sequential(buf, aux, G, Grs, T, l, chosen, wk, E, He, k, xq, scal[S_FFN], xd,
                                      g, u, hq, hd, eps, eo, acc)
        p = end_solo(ctr, p, mine)
        pend = ZERO
        if single:  # chosen is this layer's and stays until the next token: read after the routing phase
            e = chosen[0]
            mb, db = ops.routed_steps(Grs, T, l, He)
            p = expert_phases(ctr, p, buf, aux, G, Grs, rp, T[l, F_EG] + e * mb, T[l, F_EG_S] + 8 * e * He,
                              T[l, F_EU] + e * mb, T[l, F_EU_S] + 8 * e * He, T[l, F_ED] + e * db,
                              T[l, F_ED_S] + 8 * e * D, He, eps, work, iwork, scal)
            mine = solo(ctr, p)
            if mine:
                w = wk[0]  # as ops.routed_sequential
                for i in range(D):
                    acc[i] += w * eo[i]
            p = end_solo(ctr, p, mine)
        if together:
            eo_all, gs, us, hds, hqs = ops.carve_experts(work, iwork, G)
            p = experts_phase(ctr, p, tid, buf, aux, Grs, T, l, chosen, k, He, xq, scal[S_FFN], xd, eps,
                              eo_all, gs, us, hds, hqs)
            mine = solo(ctr, p)
            if mine:
                for j in range(k):  # same order and arithmetic as ops.ffn_step
                    w = wk[j]
                    for i in range(D):
                        acc[i] += w * eo_all[j, i]
            p = end_solo(ctr, p, mine)
    return p, pend | PEND_X


@numba.njit(cache=True)
def _token_body(tid, buf, aux, G, Gs, Grs, rp, T, LI, eps, token, t, ssm_h, conv, kc, vc, work, iwork,
                counts, last, logits, ctr, scal):
    """One thread's walk through the token's phases (every thread walks the same ones)."""
    D = G[G_D]
    x, xn, acc, eo = work[:D], work[D:2 * D], work[2 * D:3 * D], work[3 * D:4 * D]  # as ops.carve
    p, pend = ZERO, ZERO
    mine = solo(ctr, p)
    if mine:
        dense_row(buf, aux, G[G_EMBED_KIND], G[G_EMBED], G[G_EMBED_S], token, D, x)
    p = end_solo(ctr, p, mine)
    for l in range(G[G_NL]):
        p = mixer_phases(ctr, p, pend, buf, aux, G, Gs, rp, T, LI, l, eps, t, ssm_h, conv, kc, vc, work, iwork, scal)
        p, pend = ffn_phases(ctr, p, tid, buf, aux, G, Gs, Grs, rp, T, LI, l, eps, work, iwork, counts, last, scal)
    mine = solo(ctr, p)
    if mine:
        settle(pend, x, acc, eo, D)
        ops.rmsnorm(x, f32(buf, aux, G[G_NORM_F], D), eps, xn)
    p = end_solo(ctr, p, mine)
    p = dense_phase(ctr, p, n_items(G, rp, G[G_V], D), buf, aux, G[G_HEAD_KIND], G[G_HEAD], G[G_HEAD_S], G[G_V], D,
                    xn, logits, NO)
    if tid == 0:
        scal[scal.shape[0] - 1] = np.float32(p)  # phases used (tests check the bound)


@numba.njit(cache=True, parallel=True)
def token_step_region(buf, aux, G, T, LI, eps, token, ssm_h, conv, kc, vc, pos, work, iwork, counts, last,
                      logits, Gserial, rp, ctr, scal):
    """ops.token_step in one parallel region of G_THREADS threads; ``Gserial``: G with
    G_PAR = 0 in both rows, ``rp``: region parameters, ``ctr``: phase counters
    (tern.kernels.region, >= phases_bound phases), ``scal`` (float32, >= 4) scratch."""
    for i in range(ctr.shape[0]):
        ctr[i] = 0
    clock_start(ctr)  # the phase clock's start (compiled in with TERN_PHASE_CLOCK=1 only)
    t = pos[0]
    Grs = Gserial[ops.N_GLOBALS:2 * ops.N_GLOBALS]
    for tid in numba.prange(G[G_THREADS]):
        _token_body(np.int64(tid), buf, aux, G, Gserial, Grs, rp, T, LI, eps, token, t, ssm_h, conv, kc, vc, work, iwork,
                    counts, last, logits, ctr, scal)
    pos[0] += 1


drop_stale_cache(__file__, REGION_DEPS + ("region_items.py",), token_step_region)
