"""The SSM layer's per-token element math of the decode engine (docs/MODEL.md): SiLU, softplus as
torch computes it, the depthwise causal conv step and the selective-scan step, on contiguous
float32 vectors so LLVM vectorises every loop. tern.kernels.ops calls them (and re-exports
them); the one-region step (tern.kernels.ops_region, region_items) splits the scan's channels."""

from __future__ import annotations

import numba
import numpy as np

from tern.kernels.cache_guard import drop_stale_cache
from tern.kernels.fastmath import fexp_nonpos
from tern.kernels.kernels_dense import COLUMN_BLOCK, block_matvec
from tern.kernels.kernels_stored import JIT

ONE, ZERO = np.float32(1.0), np.float32(0.0)


@numba.njit(inline="always", **JIT)
def silu(v):
    """v * sigmoid(v), with the vectorisable exp of non-positive arguments."""
    e = fexp_nonpos(-abs(v))  # exp(-|v|)
    r = ONE / (ONE + e)
    return v * (r if v >= ZERO else e * r)


@numba.njit(inline="always", **JIT)
def softplus(v):
    """log(1 + exp(v)) as torch computes it (v above 20 passes through):
    max(v, 0) + log1p(exp(-|v|)), log1p(z) = 2 atanh(z / (2 + z)) by its series (z <= 1)."""
    z = fexp_nonpos(-abs(v))
    s = z / (np.float32(2.0) + z)  # <= 1/3
    s2 = s * s
    p = np.float32(1.0 / 17.0)
    p = p * s2 + np.float32(1.0 / 15.0)
    p = p * s2 + np.float32(1.0 / 13.0)
    p = p * s2 + np.float32(1.0 / 11.0)
    p = p * s2 + np.float32(1.0 / 9.0)
    p = p * s2 + np.float32(1.0 / 7.0)
    p = p * s2 + np.float32(1.0 / 5.0)
    p = p * s2 + np.float32(1.0 / 3.0)
    p = p * s2 + ONE
    r = max(v, ZERO) + np.float32(2.0) * s * p
    return v if v > np.float32(20.0) else r


@numba.njit(**JIT)
def causal_conv(cw, cb, tail, u, uc):
    """uc = silu(depthwise causal conv of u over time + bias); shifts u into ``tail``.
    cw (K, Di) (the stored (Di, K) transposed), tail (K-1, Di): inputs t-K+1 .. t-1."""
    K, Di = cw.shape
    for i in range(Di):
        uc[i] = cw[K - 1, i] * u[i]
    for j in range(K - 1):
        for i in range(Di):
            uc[i] += cw[j, i] * tail[j, i]
    for i in range(Di):
        uc[i] = silu(uc[i] + cb[i])
    for j in range(K - 2):
        tail[j, :] = tail[j + 1, :]
    if K > 1:
        tail[K - 2, :] = u


@numba.njit(**JIT)
def selective_scan_step(dtw, dtb, AT, Dp, hT, dbc, uc, z, dt, y, i0, i1):
    """One selective-scan step (docs/MODEL.md) of channels i0..i1-1 (0, Di: all; the one-region
    step splits them at multiples of COLUMN_BLOCK), on contiguous views so every loop vectorises:
    dt = softplus(dt_proj.weight @ dtl + bias); h = exp(dt A) h + (dt uc) B; y = (h @ C + D uc) * silu(z).
    dtw is the (Di, R) projection in column blocks (tern.kernels.kernels_dense.column_blocks: (ceil(Di / 64),
    R, 64), re-packed at load), float32 or uint16 holding fp16 (ModelConfig.dt_format; widened exactly):
    one sequential stream with no lane sums (its dots as stored, one per channel, took most of the step:
    benchmarks/README, "The scan's dt projection in column blocks"). AT, hT (N, Di)."""
    N, R, m = AT.shape[0], dtw.shape[1], i1 - i0
    dtv, yv, ucv = dt[i0:i1], y[i0:i1], uc[i0:i1]  # (a 2-D column slice or a loop from i0 > 0: 3-4x slower)
    acc = np.empty(COLUMN_BLOCK, np.float32)
    for blk in range(i0 // COLUMN_BLOCK, (i1 + COLUMN_BLOCK - 1) // COLUMN_BLOCK):
        block_matvec(dtw, blk, dbc, acc)
        for i in range(max(i0, blk * COLUMN_BLOCK), min(i1, (blk + 1) * COLUMN_BLOCK)):
            dt[i] = dtb[i] + acc[i - blk * COLUMN_BLOCK]
    Dv = Dp[i0:i1]
    for i in range(m):
        dtv[i] = softplus(dtv[i])
        yv[i] = Dv[i] * ucv[i]
    for n in range(N):
        b, c, a, h = dbc[R + n], dbc[R + N + n], AT[n, i0:i1], hT[n, i0:i1]
        for i in range(m):
            hv = fexp_nonpos(dtv[i] * a[i]) * h[i] + (dtv[i] * ucv[i]) * b
            h[i] = hv
            yv[i] += hv * c
    zv = z[i0:i1]
    for i in range(m):
        yv[i] = yv[i] * silu(zv[i])


drop_stale_cache(__file__, ("fastmath.py", "kernels_stored.py", "kernels_dense.py"), causal_conv)  # numba cache hygiene
