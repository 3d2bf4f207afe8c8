"""Per-token numba operations of the decode engine: exactly docs/MODEL.md, one token.

All weights are read from two flat read-only uint8 buffers: ``buf`` (the memory-mapped
packed file) and ``aux`` (tensors the engine derives at load: fp32 dequantized matrices of
the baseline rung, row-oriented copies of the down projections, A = -exp(A_log), ...).
A tensor is named by an *address* ``byte_offset * 2 + buffer_id`` (0: buf, 1: aux); the
per-layer table ``T`` (n_layers, N_FIELDS) holds the addresses (-1: absent), ``LI``
(n_layers, N_LINTS) the per-layer integers and ``G`` the global integers (sizes, flags,
head/embedding addresses). Index constants below name the columns.

Scratch lives in one float32 ``work`` and one int8 ``iwork`` array (carved by
:func:`carve`), the recurrent state in ``ssm_h`` (n_ssm, N, Di) (transposed), ``conv`` (n_ssm, K-1, Di),
``kc`` / ``vc`` (n_attn, window x d_model) (blocks of heads, each slot-major: tern.kernels.attention) and ``pos`` (1,) (tokens seen), so a token allocates
nothing. :func:`token_step` is the fused per-token loop; :func:`embed_step`,
:func:`mixer_step`, :func:`ffn_step` and :func:`head_step` are the same work called one
layer at a time from Python (the unfused rung of the ladder).
"""

from __future__ import annotations

import numba
import numpy as np

from tern.kernels.activation import ACT_DRELU, ACT_RELU2, ACT_SILU, gated_act  # noqa: F401  (also this module's API)
from tern.kernels.attention import SCORE_PAD, attend, attend_block  # noqa: F401  (also this module's API)
from tern.kernels.cache_guard import NO_ADDR, ZERO, drop_stale_cache
from tern.kernels.kernels_b3 import b3_matvec_xp, b3_matvec_xp_par, b3_permute
from tern.kernels.kernels_blocked import blocked16_dims, blocked16_matvec_next, blocked16_matvec_par
from tern.kernels.kernels_dense import COLUMN_BLOCK, matvec_fp32_nb, matvec_fp32_parallel_nb
from tern.kernels.kernels_stored import (  # noqa: F401  (u8, f32, matvec_int8w*: also this module's API)
    DENSE_FP16,
    FASTMATH,
    JIT,
    dense_matvec,
    dense_row,
    f32,
    matvec_int8w,
    matvec_int8w_par,
    router_logits,
    u8,
)
from tern.kernels.kernels_ternary import (
    COMPILED_SETTINGS,
    ROW_PREFETCH,
    ternary_matvec_next,
    ternary_matvec_par,
    ternary_matvec_skip,
    ternary_matvec_skip_par,
    ternary_matvec_stream_par,
)
from tern.kernels.prefetch import CHAIN_PREFETCH
from tern.kernels.quant import quantize_act
from tern.kernels.routing import pick_experts
from tern.kernels.ssm_step import causal_conv, selective_scan_step, silu, softplus  # noqa: F401  (also this module's API)

# ---- table columns ----------------------------------------------------------------------
# T: per-layer tensor addresses
F_NORM1, F_NORM2 = 0, 1
F_IN, F_IN_S = 2, 3  # SSM in_proj / attention qkv
F_CONV_W, F_CONV_B, F_XP, F_XP_S, F_DT_W, F_DT_B, F_A, F_D = 4, 5, 6, 7, 8, 9, 10, 11
F_OUT, F_OUT_S = 12, 13  # out_proj (both mixers)
F_ROUTER = 14
F_SG, F_SG_S, F_SU, F_SU_S, F_SD, F_SD_S = 15, 16, 17, 18, 19, 20  # shared experts / dense MLP
F_EG, F_EG_S, F_EU, F_EU_S, F_ED, F_ED_S = 21, 22, 23, 24, 25, 26  # routed experts
F_ROUTER_S = 27  # row scales of an int8 router (-1: none)
F_E_STEP = 28  # address step from one routed expert to the next when each one's gate, up, down lie together (-1: apart)
N_FIELDS = 29
# LI: per-layer integers
L_KIND, L_STATE, L_NSH, L_HSH, L_MOE, L_E, L_HE, L_TOPK = 0, 1, 2, 3, 4, 5, 6, 7
N_LINTS = 8
KIND_SSM, KIND_ATTN = 0, 1
# G: global integers
G_D, G_DI, G_N, G_R, G_K, G_V, G_WIN, G_NH, G_NL = 0, 1, 2, 3, 4, 5, 6, 7, 8
G_HMAX, G_EMAX, G_ACT = 9, 10, 11
G_KERNEL, G_ACT_SKIP, G_MOE_SKIP, G_PAR = 12, 13, 14, 15
# G_*_KIND: the stored dtype of the embedding / head / routers (kernels_stored.DENSE_*)
G_EMBED, G_EMBED_S, G_HEAD, G_HEAD_S, G_HEAD_KIND, G_NORM_F, G_EMBED_KIND = 16, 17, 18, 19, 20, 21, 22
G_PAR_MIN = 23  # weights a matrix needs before it is split over threads
G_THREADS, G_TOPK_MAX = 24, 25  # threads (expert-parallel scratch slots), largest top_k
# ternary matrices with packed rows of G_STREAM_RB .. G_STREAM_RB_MAX bytes use the streaming
# (one row per pass) kernel; G_STREAM_RB 0: none. The threshold is per pool
# (tern.kernels.policy.stream_row_bytes): G holds two rows of N_GLOBALS, built once at load —
# row 0 for everything, row 1 (routed_globals) the same with the routed experts' threshold.
G_STREAM_RB, G_STREAM_RB_MAX = 26, 27
G_ROUTER_KIND = 28
# G_B3 1: every row-oriented ternary matrix is in the base-3 layout (5 weights per byte,
# tern.kernels.kernels_b3; quant then also writes the permuted activations those kernels
# read into the xd scratch); 0: ternary2 (the engine's b3 option, tern.run.engine)
G_B3, G_STREAM_PF = 29, 30  # G_STREAM_PF 1: the streaming kernel prefetches (EnginePolicy.stream_prefetch)
G_DT_KIND = 31  # the SSM dt projections' stored dtype (ModelConfig.dt_format): DENSE_FP32 or DENSE_FP16
# G_BLOCKED 1: every row-oriented ternary2 matrix is in the blocked16 layout (16 rows one stream,
# tern.kernels.kernels_blocked; the engine's layout option); 0: rows as stored
G_BLOCKED = 32
G_ATTN_BLOCKS = 33  # blocks of whole heads each attention cache is kept in (tern.kernels.attention)
N_GLOBALS = 34
B3_PAD = 80  # float32 entries xd / hd have beyond their widest input: the permuted b3 activations' padding
KERNEL_FP32, KERNEL_TERNARY = 0, 1

# ---- buffer access: u8, f32 (kernels_stored) ------------------------------------------------


@numba.njit(cache=True, inline="always")
def mat_bytes(G, rows, cols):
    """Bytes of one (rows, cols) matrix in the engine's kernel format (fp32, ternary2 or b3)."""
    if G[G_KERNEL] == KERNEL_FP32:
        return rows * cols * 4
    if G[G_B3]:
        return rows * ((cols + 4) // 5)
    if G[G_BLOCKED]:
        nb, bb = blocked16_dims(rows, cols)
        return nb * bb
    return rows * ((cols + 3) // 4)


# ---- scratch ------------------------------------------------------------------------------


@numba.njit(cache=True)
def base_work_sizes(G):
    """(float32, int8) lengths :func:`carve` and :func:`icarve` use; the expert-parallel
    scratch of :func:`carve_experts` follows them."""
    D, Di, N, R = G[G_D], G[G_DI], G[G_N], G[G_R]
    H, E, W = G[G_HMAX], G[G_EMAX], G[G_WIN]
    wide = max(D, max(Di, H))
    return 4 * D + max(2 * Di, 3 * D) + Di + (R + 2 * N) + 2 * Di + 2 * H + G[G_NH] * (W + SCORE_PAD) + 2 * E + wide + H + 2 * B3_PAD, wide + H


@numba.njit(cache=True)
def experts_work_size(G):
    """float32 length of :func:`carve_experts`' scratch: K outputs, P slots of g, u, hd."""
    D, H, P, K = G[G_D], G[G_HMAX], G[G_THREADS], G[G_TOPK_MAX]
    return K * D + 3 * P * H + P * B3_PAD


def work_sizes(G: np.ndarray) -> tuple[int, int]:
    """Lengths of the float32 and int8 scratch arrays the per-token step carves."""
    nf, ni = (int(v) for v in base_work_sizes(G))
    P, H = int(G[G_THREADS]), int(G[G_HMAX])
    if P > 1:  # expert-parallel scratch (carve_experts; hq in iwork)
        nf += int(experts_work_size(G))
        ni += P * H
    return nf, ni


@numba.njit(cache=True)
def carve(work, G):
    """Named float32 scratch views of ``work`` (see work_sizes)."""
    D, Di, N, R = G[G_D], G[G_DI], G[G_N], G[G_R]
    H, E, W = G[G_HMAX], G[G_EMAX], G[G_WIN]
    big = max(2 * Di, 3 * D)
    wide = max(D, max(Di, H))
    o = 0
    x = work[o:o + D]
    o += D
    xn = work[o:o + D]
    o += D
    acc = work[o:o + D]
    o += D
    eo = work[o:o + D]
    o += D
    uz = work[o:o + big]
    o += big
    uc = work[o:o + Di]
    o += Di
    dbc = work[o:o + R + 2 * N]
    o += R + 2 * N
    dt = work[o:o + Di]
    o += Di
    y = work[o:o + Di]
    o += Di
    g = work[o:o + H]
    o += H
    u = work[o:o + H]
    o += H
    sc = work[o:o + G[G_NH] * (W + SCORE_PAD)]  # every head's attention scores (tern.kernels.attention)
    o += G[G_NH] * (W + SCORE_PAD)
    pr = work[o:o + E]
    o += E
    wk = work[o:o + E]
    o += E
    xd = work[o:o + wide + B3_PAD]
    o += wide + B3_PAD
    hd = work[o:o + H + B3_PAD]
    return x, xn, acc, eo, uz, uc, dbc, dt, y, g, u, sc, pr, wk, xd, hd


@numba.njit(cache=True)
def carve_experts(work, iwork, G):
    """Expert-parallel scratch after carve's and icarve's: eo_all (K, D) one output per
    chosen expert, and per thread slot g, u, hd (P, H) float32 and hq (P, H) int8."""
    D, H, P, K = G[G_D], G[G_HMAX], G[G_THREADS], G[G_TOPK_MAX]
    o, oi = base_work_sizes(G)
    eo_all = work[o:o + K * D].reshape(K, D)
    o += K * D
    gs = work[o:o + P * H].reshape(P, H)
    o += P * H
    us = work[o:o + P * H].reshape(P, H)
    o += P * H
    hds = work[o:o + P * (H + B3_PAD)].reshape(P, H + B3_PAD)
    hqs = iwork[oi:oi + P * H].reshape(P, H)
    return eo_all, gs, us, hds, hqs


@numba.njit(cache=True)
def icarve(iwork, G):
    """int8 scratch: xq (widest input) and hq (hidden units)."""
    wide = max(G[G_D], max(G[G_DI], G[G_HMAX]))
    return iwork[:wide], iwork[wide:wide + G[G_HMAX]]


# ---- elementwise ------------------------------------------------------------------------


@numba.njit(**JIT)
def rmsnorm(x, g, eps, out):
    """out = x / sqrt(mean(x**2) + eps) * g (mean accumulated in float64)."""
    n = x.shape[0]
    ss = 0.0
    for i in range(n):
        v = np.float64(x[i])
        ss += v * v
    rms = np.float32(np.sqrt(np.float32(np.float32(ss / n) + np.float32(eps))))
    for i in range(n):
        out[i] = np.float32(x[i] / rms) * g[i]


@numba.njit(cache=True, inline="always")
def b3_act_len(cols):
    """kernels_b3.b3_act_len: 320 permuted activations per 64 packed bytes of a row."""
    return 320 * ((((cols + 4) // 5) + 63) // 64)


@numba.njit(cache=True)
def quant(G, x, xq, xd, eps):
    """BitLinear activation quantization of ``x`` into ``xq``; returns the scale. Also writes
    what the matrix kernel multiplies into ``xd``: in the fp32 rung the dequantized activation
    ``xd = xq * scale``, with b3 matrices (G_B3) the permuted activations of
    tern.kernels.kernels_b3.b3_permute in xd's bytes."""
    n = x.shape[0]
    xs = quantize_act(x, xq[:n], eps)
    if G[G_KERNEL] == KERNEL_FP32:
        for i in range(n):
            xd[i] = np.float32(xq[i]) * xs
    elif G[G_B3]:
        xp = xd.view(np.int8)
        b3_permute(xq[:n], xp[:b3_act_len(n)])
    return xs


@numba.njit(cache=True)
def quant_hidden(G, h, hq, hd, eps):
    """quant for the hidden units of a gated MLP: the activation-skip down projection reads
    hq as it is, so with b3 matrices (G_B3) the permuted copy is not written then."""
    if G[G_B3] and G[G_ACT_SKIP]:
        return quantize_act(h, hq[:h.shape[0]], eps)
    return quant(G, h, hq, hd, eps)


# ---- matrices ------------------------------------------------------------------------------


@numba.njit(cache=True, inline="always")
def routed_globals(G):
    """The globals the routed experts run with (G's second row: their stream threshold)."""
    return G[N_GLOBALS:2 * N_GLOBALS]


@numba.njit(cache=True, inline="always")
def par(G, n_weights):
    """Split this matrix over threads? Only with threads > 1 and at least G_PAR_MIN weights:
    a parallel region costs microseconds (far more on a busy machine), more than a small
    matvec. Per-row arithmetic is the same either way, so results do not change."""
    return G[G_PAR] != 0 and n_weights >= G[G_PAR_MIN]


@numba.njit(cache=True)
def bitlinear(buf, aux, G, w_addr, s_addr, rows, cols, xq, xs, xd, out):
    """out (rows,) = W (rows, cols) @ quantized activation (xq, xs) — ternary2 kernel, b3
    kernel (G_B3: on the permuted activations quant wrote into xd), or the dequantized fp32
    matrix times xd in the fp32 rung."""
    bitlinear_then(buf, aux, G, w_addr, s_addr, rows, cols, xq, xs, xd, out, NO_ADDR, ZERO)


@numba.njit(cache=True)
def bitlinear_then(buf, aux, G, w_addr, s_addr, rows, cols, xq, xs, xd, out, nxt_addr, nxt_bytes):
    """:func:`bitlinear`, then the matrix of ``nxt_bytes`` bytes at ``nxt_addr`` (-1: none) is
    read: the single-thread ternary2 passes prefetch its start as they near their own end
    (kernels_ternary.ternary_matvec_next; prefetch.CHAIN_PREFETCH). Same sums."""
    if G[G_KERNEL] == KERNEL_FP32:
        W = f32(buf, aux, w_addr, rows * cols).reshape(rows, cols)
        if par(G, rows * cols):
            matvec_fp32_parallel_nb(W, xd[:cols], out[:rows])
        else:
            matvec_fp32_nb(W, xd[:cols], out[:rows])
        return
    if G[G_B3]:  # base-3 rows and the activations quant permuted into xd (one pass order)
        rb = (cols + 4) // 5
        P = u8(buf, aux, w_addr, rows * rb).reshape(rows, rb)
        xp = xd.view(np.int8)[:b3_act_len(cols)]
        if par(G, rows * cols):
            b3_matvec_xp_par(P, f32(buf, aux, s_addr, rows), xp, xs, out[:rows])
        else:
            b3_matvec_xp(P, f32(buf, aux, s_addr, rows), xp, xs, out[:rows])
        return
    n = nxt_bytes if CHAIN_PREFETCH and nxt_addr >= 0 else 0
    nxt = u8(buf, aux, max(nxt_addr, 0), n).reshape(1, n)  # the one-thread passes prefetch on into it
    if G[G_BLOCKED]:  # 16-row blocks, one stream each (kernels_blocked); same sums
        nb, bb = blocked16_dims(rows, cols)
        P = u8(buf, aux, w_addr, nb * bb).reshape(nb, bb)
        if par(G, rows * cols):
            blocked16_matvec_par(P, f32(buf, aux, s_addr, rows), xq[:cols], xs, out[:rows])
        else:
            blocked16_matvec_next(P, f32(buf, aux, s_addr, rows), xq[:cols], xs, out[:rows], True, nxt)
        return
    rb = (cols + 3) // 4
    P = u8(buf, aux, w_addr, rows * rb).reshape(rows, rb)
    S = f32(buf, aux, s_addr, rows)
    stream = G[G_STREAM_RB] != 0 and G[G_STREAM_RB] <= rb <= G[G_STREAM_RB_MAX]  # same sums either way
    if par(G, rows * cols):
        if stream:
            ternary_matvec_stream_par(P, S, xq[:cols], xs, out[:rows], G[G_STREAM_PF] != 0)
        else:
            ternary_matvec_par(P, S, xq[:cols], xs, out[:rows])
    else:
        ternary_matvec_next(P, S, xq[:cols], xs, out[:rows], stream, G[G_STREAM_PF] != 0 if stream else ROW_PREFETCH, nxt)


@numba.njit(cache=True)
def down_proj(buf, aux, G, w_addr, s_addr, D, H, hq, hs, hd, out, nxt_addr, nxt_bytes):
    """out (D,) = down (D, H) @ h: with activation skip the transposed layout and
    ternary_matvec_skip (columns of zero hidden units untouched), else a plain matvec
    (:func:`bitlinear_then`: ``nxt_addr`` / ``nxt_bytes``, the matrix read next; NO_ADDR: none)."""
    if G[G_KERNEL] == KERNEL_TERNARY and G[G_ACT_SKIP]:
        rb = (D + 3) // 4
        P = u8(buf, aux, w_addr, H * rb).reshape(H, rb)
        if par(G, D * H):
            ternary_matvec_skip_par(P, f32(buf, aux, s_addr, D), hq[:H], hs, out[:D])
        else:
            ternary_matvec_skip(P, f32(buf, aux, s_addr, D), hq[:H], hs, out[:D])
    else:
        bitlinear_then(buf, aux, G, w_addr, s_addr, D, H, hq, hs, hd, out, nxt_addr, nxt_bytes)


@numba.njit(cache=True)
def down_bytes(G, D, H):
    if G[G_KERNEL] == KERNEL_TERNARY and G[G_ACT_SKIP]:
        return H * ((D + 3) // 4)
    return mat_bytes(G, D, H)


@numba.njit(cache=True, inline="always")
def routed_steps(G, T, l, H):
    """(gate and up, down) address steps from routed expert e of layer l to e + 1: one step for all three
    where the engine keeps each expert's gate, up and down together (``T[l, F_E_STEP]``, its experts="together":
    a token reads each chosen expert as one run), else each tensor's own matrix size (experts="apart")."""
    if T[l, F_E_STEP] >= 0:
        return T[l, F_E_STEP], T[l, F_E_STEP]
    return 2 * mat_bytes(G, H, G[G_D]), 2 * down_bytes(G, G[G_D], H)


@numba.njit(cache=True)
def gated_mlp(buf, aux, G, ga, gsa, ua, usa, da, dsa, H, xq, xs, xd, g, u, hq, hd, eps, out, nxt_addr):
    """out (D,) = down(act(gate(x), up(x))) for one expert whose input is already quantized
    (xq, xs, xd). Uses g, u, hd (H,) and hq (H,) as scratch. Each matrix's pass prefetches the
    start of the next (:func:`bitlinear_then`); the down projection's, ``nxt_addr``'s: the
    gate of the expert read next (NO_ADDR: none)."""
    D = G[G_D]
    bitlinear_then(buf, aux, G, ga, gsa, H, D, xq, xs, xd, g, ua, mat_bytes(G, H, D))
    bitlinear_then(buf, aux, G, ua, usa, H, D, xq, xs, xd, u, da, down_bytes(G, D, H))
    gated_act(G[G_ACT], g, u, H)
    hs = quant_hidden(G, g[:H], hq, hd, eps)
    down_proj(buf, aux, G, da, dsa, D, H, hq, hs, hd, out, nxt_addr, mat_bytes(G, H, D))


# ---- mixers ------------------------------------------------------------------------------


@numba.njit(cache=True)
def scan_channels(buf, aux, G, T, l, hT, dbc, uc, z, dt, y, c0, c1):
    """selective_scan_step of layer l's channels c0..c1-1 on its tensors: the dt projection (Di, R)
    in column blocks, re-packed at load (fp32, or fp16 by G_DT_KIND), A as -exp(A_log) transposed at load (N, Di)."""
    Di, N, R, nb = G[G_DI], G[G_N], G[G_R], (G[G_DI] + COLUMN_BLOCK - 1) // COLUMN_BLOCK
    dtb, Dp = f32(buf, aux, T[l, F_DT_B], Di), f32(buf, aux, T[l, F_D], Di)
    AT = f32(buf, aux, T[l, F_A], N * Di).reshape(N, Di)
    if G[G_DT_KIND] == DENSE_FP16:
        dtw16 = u8(buf, aux, T[l, F_DT_W], 2 * nb * R * COLUMN_BLOCK).view(np.uint16).reshape(nb, R, COLUMN_BLOCK)
        selective_scan_step(dtw16, dtb, AT, Dp, hT, dbc, uc, z, dt, y, c0, c1)
    else:
        dtw = f32(buf, aux, T[l, F_DT_W], nb * R * COLUMN_BLOCK).reshape(nb, R, COLUMN_BLOCK)
        selective_scan_step(dtw, dtb, AT, Dp, hT, dbc, uc, z, dt, y, c0, c1)


@numba.njit(cache=True)
def ssm_mixer(buf, aux, G, T, l, si, eps, ssm_h, conv, xn, xq, uz, uc, dbc, dt, y, xd, out):
    """Selective SSM step of layer l (state index si): out (D,) from xn (D,)."""
    D, Di, N, R, K = G[G_D], G[G_DI], G[G_N], G[G_R], G[G_K]
    xs = quant(G, xn, xq, xd, eps)
    bitlinear_then(buf, aux, G, T[l, F_IN], T[l, F_IN_S], 2 * Di, D, xq, xs, xd, uz, T[l, F_XP], mat_bytes(G, R + 2 * N, Di))
    cw = f32(buf, aux, T[l, F_CONV_W], K * Di).reshape(K, Di)  # transposed at load
    cb = f32(buf, aux, T[l, F_CONV_B], Di)
    causal_conv(cw, cb, conv[si], uz[:Di], uc)
    xs = quant(G, uc, xq, xd, eps)
    bitlinear_then(buf, aux, G, T[l, F_XP], T[l, F_XP_S], R + 2 * N, Di, xq, xs, xd, dbc, T[l, F_OUT], mat_bytes(G, D, Di))
    scan_channels(buf, aux, G, T, l, ssm_h[si], dbc, uc, uz[Di:2 * Di], dt, y, ZERO, Di)
    xs = quant(G, y, xq, xd, eps)
    bitlinear(buf, aux, G, T[l, F_OUT], T[l, F_OUT_S], D, Di, xq, xs, xd, out)


@numba.njit(**JIT)
def attn_mixer(buf, aux, G, T, l, ai, eps, t, kc, vc, xn, xq, uz, y, sc, xd, out):
    """Sliding-window attention step of layer l (cache index ai) at position t."""
    D, W = G[G_D], G[G_WIN]
    xs = quant(G, xn, xq, xd, eps)
    bitlinear_then(buf, aux, G, T[l, F_IN], T[l, F_IN_S], 3 * D, D, xq, xs, xd, uz, T[l, F_OUT], mat_bytes(G, D, D))
    attend(uz[:D], kc[ai], vc[ai], uz, D, W, G[G_NH], G[G_ATTN_BLOCKS], t, sc, y)
    xs = quant(G, y[:D], xq, xd, eps)
    bitlinear(buf, aux, G, T[l, F_OUT], T[l, F_OUT_S], D, D, xq, xs, xd, out)


# ---- per-layer steps (called from Python in the unfused rung, from token_step fused) -----


@numba.njit(cache=True)
def embed_step(buf, aux, G, token, work):
    """x = embedding row of ``token`` (fp32, fp16 / bf16 widened, or int8 row times its scale)."""
    dense_row(buf, aux, G[G_EMBED_KIND], G[G_EMBED], G[G_EMBED_S], token, G[G_D], work[:G[G_D]])


@numba.njit(cache=True)
def mixer_step(buf, aux, G, T, LI, l, eps, ssm_h, conv, kc, vc, pos, work, iwork):
    """x += Mixer_l(RMSNorm(x; norm1)) for layer l."""
    x, xn, acc, eo, uz, uc, dbc, dt, y, g, u, sc, pr, wk, xd, hd = carve(work, G)
    xq, hq = icarve(iwork, G)
    D = G[G_D]
    rmsnorm(x, f32(buf, aux, T[l, F_NORM1], D), eps, xn)
    if LI[l, L_KIND] == KIND_SSM:
        ssm_mixer(buf, aux, G, T, l, LI[l, L_STATE], eps, ssm_h, conv, xn, xq, uz, uc, dbc, dt,
                  y, xd, acc)
    else:
        attn_mixer(buf, aux, G, T, l, LI[l, L_STATE], eps, pos[0], kc, vc, xn, xq, uz, y, sc,
                   xd, acc)
    for i in range(D):
        x[i] += acc[i]


@numba.njit(**JIT)
def route(buf, aux, G, T, LI, l, xn, pr, chosen, weights):
    """MoE routing of layer l (fp32, docs/MODEL.md): softmax over router logits, the top_k
    largest probabilities (ties: lower index), renormalised weights. Writes chosen (top_k,)
    in ascending expert order and their weights."""
    D, E, k = G[G_D], LI[l, L_E], LI[l, L_TOPK]
    router_logits(buf, aux, G[G_ROUTER_KIND], T[l, F_ROUTER], T[l, F_ROUTER_S], E, D, xn, pr)
    pick_experts(pr, E, k, chosen, weights)


@numba.njit(cache=True, parallel=True)
def routed_experts_par(buf, aux, Gs, T, l, chosen, k, H, xq, xs, xd, eps, eo_all, gs, us, hds, hqs):
    """eo_all[j] (D,) = expert chosen[j]'s output for j < k, the experts split over the
    thread slots (slot c takes j = c, c + P, ...), each expert on one thread with the
    single-thread kernels (``Gs``: G with G_PAR = 0), so every output is bit-identical to
    the sequential path's."""
    D = Gs[G_D]
    P = gs.shape[0]
    mb, db = routed_steps(Gs, T, l, H)
    for c in numba.prange(P):
        for j in range(c, k, P):
            e = chosen[j]
            gated_mlp(buf, aux, Gs, T[l, F_EG] + e * mb, T[l, F_EG_S] + 8 * e * H,
                      T[l, F_EU] + e * mb, T[l, F_EU_S] + 8 * e * H, T[l, F_ED] + e * db,
                      T[l, F_ED_S] + 8 * e * D, H, xq, xs, xd, gs[c], us[c], hqs[c], hds[c], eps, eo_all[j],
                      T[l, F_EG] + chosen[j + P] * mb if j + P < k else NO_ADDR)  # this slot's next expert's gate


@numba.njit(cache=True, inline="always")
def experts_parallel(G, k, H):
    """Split the routed experts over threads (one parallel region per layer instead of one
    per matrix)? With threads > 1, the MoE skip, >= 2 chosen experts and at least
    G_PAR_MIN weights of chosen experts in all."""
    return G[G_PAR] != 0 and G[G_MOE_SKIP] != 0 and k >= 2 and 3 * k * H * G[G_D] >= G[G_PAR_MIN]


@numba.njit(cache=True)
def ffn_step(buf, aux, G, T, LI, l, eps, work, iwork, counts, last):
    """x += FFN_l(RMSNorm(x; norm2)): the shared experts (or the dense MLP, stored as one
    shared expert) always, then the top_k routed experts (MoE skip) or every expert with
    weight zero for those not chosen (masked). Records the choice in counts / last."""
    if T[l, F_NORM2] < 0:
        return
    x, xn, acc, eo, uz, uc, dbc, dt, y, g, u, sc, pr, wk, xd, hd = carve(work, G)
    xq, hq = icarve(iwork, G)
    D = G[G_D]
    rmsnorm(x, f32(buf, aux, T[l, F_NORM2], D), eps, xn)
    xs = quant(G, xn, xq, xd, eps)
    for i in range(D):
        acc[i] = 0.0
    H = LI[l, L_HSH]
    for s in range(LI[l, L_NSH]):
        mb, db = 2 * s * mat_bytes(G, H, D), 2 * s * down_bytes(G, D, H)
        gated_mlp(buf, aux, G, T[l, F_SG] + mb, T[l, F_SG_S] + 8 * s * H, T[l, F_SU] + mb,
                  T[l, F_SU_S] + 8 * s * H, T[l, F_SD] + db, T[l, F_SD_S] + 8 * s * D, H,
                  xq, xs, xd, g, u, hq, hd, eps, eo, NO_ADDR)
        for i in range(D):
            acc[i] += eo[i]
    mi = LI[l, L_MOE]
    if mi >= 0:
        E, H, k = LI[l, L_E], LI[l, L_HE], LI[l, L_TOPK]
        chosen = last[mi]
        route(buf, aux, G, T, LI, l, xn, pr, chosen, wk)
        for j in range(k):
            counts[mi, chosen[j]] += 1
        if experts_parallel(G, k, H):
            eo_all, gs, us, hds, hqs = carve_experts(work, iwork, G)
            Gs = routed_globals(G).copy()
            Gs[G_PAR] = 0
            routed_experts_par(buf, aux, Gs, T, l, chosen, k, H, xq, xs, xd, eps, eo_all, gs, us, hds, hqs)
            for j in range(k):  # same order and arithmetic as the sequential loop below
                w = wk[j]
                for i in range(D):
                    acc[i] += w * eo_all[j, i]
        else:
            routed_sequential(buf, aux, G, routed_globals(G), T, l, chosen, wk, E, H, k, xq, xs, xd,
                              g, u, hq, hd, eps, eo, acc)
    for i in range(D):
        x[i] += acc[i]


@numba.njit(cache=True)
def routed_sequential(buf, aux, G, Gr, T, l, chosen, wk, E, H, k, xq, xs, xd, g, u, hq, hd, eps, eo, acc):
    """acc (D,) += the routed experts of layer l one after another (``Gr``: the globals they
    run with): the chosen ones (MoE skip) or every expert, weight 0 for those not chosen."""
    D = G[G_D]
    mb, db = routed_steps(G, T, l, H)
    j = 0
    for e in range(E):
        w = np.float32(0.0)
        if j < k and chosen[j] == e:
            w = wk[j]
            j += 1
        elif G[G_MOE_SKIP]:
            continue
        gated_mlp(buf, aux, Gr, T[l, F_EG] + e * mb, T[l, F_EG_S] + 8 * e * H,
                  T[l, F_EU] + e * mb, T[l, F_EU_S] + 8 * e * H, T[l, F_ED] + e * db,
                  T[l, F_ED_S] + 8 * e * D, H, xq, xs, xd, g, u, hq, hd, eps, eo,
                  T[l, F_EG] + chosen[j] * mb if G[G_MOE_SKIP] and j < k else NO_ADDR)  # the next chosen one's gate
        for i in range(D):
            acc[i] += w * eo[i]


@numba.njit(cache=True)
def head_step(buf, aux, G, T, eps, work, iwork, logits):
    """logits (V,) = Head(RMSNorm(x; norm_f))."""
    x, xn = work[:G[G_D]], work[G[G_D]:2 * G[G_D]]
    D, V = G[G_D], G[G_V]
    rmsnorm(x, f32(buf, aux, G[G_NORM_F], D), eps, xn)
    dense_matvec(buf, aux, G[G_HEAD_KIND], G[G_HEAD], G[G_HEAD_S], V, D, xn, logits, par(G, V * D))


@numba.njit(cache=True)
def token_step(buf, aux, G, T, LI, eps, token, ssm_h, conv, kc, vc, pos, work, iwork, counts,
               last, logits):
    """The fused per-token loop: embed, every layer's mixer and FFN, head; pos += 1."""
    embed_step(buf, aux, G, token, work)
    for l in range(G[G_NL]):
        mixer_step(buf, aux, G, T, LI, l, eps, ssm_h, conv, kc, vc, pos, work, iwork)
        ffn_step(buf, aux, G, T, LI, l, eps, work, iwork, counts, last)
    head_step(buf, aux, G, T, eps, work, iwork, logits)
    pos[0] += 1


_DEPS = ("kernels_ternary.py", "kernels_b3.py", "kernels_blocked.py", "simd.py", "quant.py", "kernels_dense.py", "fastmath.py", "kernels_stored.py", "prefetch.py",
         "routing.py", "ssm_step.py", "kernels_unpack.py", "cache_guard.py", "attention.py", "region.py", "activation.py",
         COMPILED_SETTINGS)  # constants compiled in
drop_stale_cache(__file__, _DEPS, token_step)  # numba cache hygiene (tern.kernels.cache_guard)
