"""Fused causal depthwise convolution + SiLU of the SSM mixer for CPU (numba).

    pre[b, t, d] = bias[d] + sum_k w[d, k] * x[b, t - K + 1 + k, d]      # x[b, s<0] = tail
    uc = silu(pre)

on the (B, T, Di) layout the mixer works in (one copy prepends the tail), so the torch
form's transposes and the conv1d's contiguous copies disappear. The backward
gives the input, weight and bias gradients (the tail, a detached decode state, gets none),
each batch row in its own job with per-row partial sums for w and bias reduced in a fixed
order afterwards: deterministic for any thread count. The sigmoid (the vectorisable
``tern.kernels.fastmath.fsigmoid``) is kept for the backward. The kernels take the weight
transposed, (K, Di), so every inner loop over channels reads with unit stride and
vectorises: at the gate-4 shape (B 8, T 128, Di 256, K 4, 1 thread, AMD EPYC Zen 4) the
(Di, K) form's strided reads cost forward + backward 2.0 ms a layer against 0.73 now,
bit-identical (session 41, 9 interleaved rounds).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from tern.kernels.fastmath import fsigmoid


@njit(parallel=True, fastmath=True, cache=True)
def _fwd(xp, wt, bias, pre, sig, out):
    # xp: (B, K-1+T, Di) tail then x; pre, sig, out: (B, T, Di); wt: (K, Di) (w transposed:
    # the d loops read it with unit stride and vectorise); bias: (Di,)
    nb, nt, di = pre.shape
    kk = wt.shape[0]
    for b in prange(nb):
        for t in range(nt):
            for d in range(di):
                pre[b, t, d] = bias[d]
            for k in range(kk):
                for d in range(di):
                    pre[b, t, d] += wt[k, d] * xp[b, t + k, d]
            for d in range(di):
                p = pre[b, t, d]
                sg = fsigmoid(p)
                sig[b, t, d] = sg
                out[b, t, d] = p * sg


@njit(parallel=True, fastmath=True, cache=True)
def _bwd(xp, wt, pre, sig, g, gx, gw_part, gb_part):
    # g, gx: (B, T, Di); wt: (K, Di); gw_part: (B, K, Di); gb_part: (B, Di)
    nb, nt, di = pre.shape
    kk = wt.shape[0]
    for b in prange(nb):
        gp = np.empty((nt, di), np.float32)
        for d in range(di):
            gb_part[b, d] = 0.0
        for k in range(kk):
            for d in range(di):
                gw_part[b, k, d] = 0.0
        for t in range(nt):
            for d in range(di):
                sg = sig[b, t, d]
                v = g[b, t, d] * sg * (np.float32(1.0) + pre[b, t, d] * (np.float32(1.0) - sg))
                gp[t, d] = v
                gb_part[b, d] += v
            for k in range(kk):
                for d in range(di):
                    gw_part[b, k, d] += gp[t, d] * xp[b, t + k, d]
        for s in range(nt):
            for d in range(di):
                gx[b, s, d] = 0.0
            for k in range(kk):
                t = s + kk - 1 - k
                if t < nt:
                    for d in range(di):
                        gx[b, s, d] += wt[k, d] * gp[t, d]


class _ConvSilu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tail, w, bias):  # noqa: D102
        xp = torch.cat([tail.detach().transpose(1, 2), x.detach()], 1)  # (B, K-1+T, Di)
        wt, bias = w.detach().t().contiguous(), bias.detach().contiguous()  # (K, Di), (Di,)
        pre = torch.empty(x.shape, dtype=torch.float32)
        sig, out = torch.empty_like(pre), torch.empty_like(pre)
        _fwd(xp.numpy(), wt.numpy(), bias.numpy(), pre.numpy(), sig.numpy(), out.numpy())
        ctx.save_for_backward(xp, wt, pre, sig)
        return out

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        xp, wt, pre, sig = ctx.saved_tensors
        nb, _, di = pre.shape
        gx = torch.empty_like(pre)
        gw = torch.empty(nb, wt.shape[0], di, dtype=torch.float32)  # (B, K, Di)
        gb = torch.empty(nb, di, dtype=torch.float32)
        _bwd(xp.numpy(), wt.numpy(), pre.numpy(), sig.numpy(), g.contiguous().numpy(), gx.numpy(),
             gw.numpy(), gb.numpy())
        return gx, None, gw.sum(0).t(), gb.sum(0)


def causal_conv_silu(x: torch.Tensor, tail: torch.Tensor, w: torch.Tensor,
                     bias: torch.Tensor) -> torch.Tensor:
    """silu(causal depthwise conv): x (B, T, Di), tail (B, Di, K-1) the inputs before x
    (a constant), w (Di, K), bias (Di,) -> (B, T, Di); differentiable in x, w and bias."""
    ok = x.dim() == 3 and w.dim() == 2 and tuple(bias.shape) == (x.shape[2],)
    if not (ok and w.shape[0] == x.shape[2] and w.shape[1] >= 1
            and tuple(tail.shape) == (x.shape[0], x.shape[2], w.shape[1] - 1)):
        raise ValueError(f"causal_conv_silu: x (B, T, Di), tail (B, Di, K-1), w (Di, K), bias (Di,) expected, "
                         f"got {tuple(x.shape)}, {tuple(tail.shape)}, {tuple(w.shape)}, {tuple(bias.shape)}")
    return _ConvSilu.apply(x, tail, w, bias)
