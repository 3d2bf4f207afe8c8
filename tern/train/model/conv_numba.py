"""Fused causal depthwise convolution + SiLU of the SSM mixer for CPU (numba).

    pre[b, t, d] = bias[d] + sum_k w[d, k] * x[b, t - K + 1 + k, d]      # x[b, s<0] = tail
    uc = silu(pre)

on the (B, T, Di) layout the mixer works in (one copy prepends the tail), so the torch
form's transposes and the conv1d's contiguous copies disappear. The backward
gives the input, weight and bias gradients (the tail, a detached decode state, gets none),
each batch row in its own job with per-row partial sums for w and bias reduced in a fixed
order afterwards: deterministic for any thread count. The sigmoid (the vectorisable
``tern.kernels.fastmath.fsigmoid``) is kept for the backward.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from tern.kernels.fastmath import fsigmoid


@njit(parallel=True, fastmath=True, cache=True)
def _fwd(xp, w, bias, pre, sig, out):
    # xp: (B, K-1+T, Di) tail then x; pre, sig, out: (B, T, Di); w: (Di, K); bias: (Di,)
    nb, nt, di = pre.shape
    kk = w.shape[1]
    for b in prange(nb):
        for t in range(nt):
            for d in range(di):
                pre[b, t, d] = bias[d]
            for k in range(kk):
                for d in range(di):
                    pre[b, t, d] += w[d, k] * xp[b, t + k, d]
            for d in range(di):
                p = pre[b, t, d]
                sg = fsigmoid(p)
                sig[b, t, d] = sg
                out[b, t, d] = p * sg


@njit(parallel=True, fastmath=True, cache=True)
def _bwd(xp, w, pre, sig, g, gx, gw_part, gb_part):
    # g, gx: (B, T, Di); gw_part: (B, Di, K); gb_part: (B, Di)
    nb, nt, di = pre.shape
    kk = w.shape[1]
    for b in prange(nb):
        gp = np.empty((nt, di), np.float32)
        for d in range(di):
            gb_part[b, d] = 0.0
            for k in range(kk):
                gw_part[b, d, k] = 0.0
        for t in range(nt):
            for d in range(di):
                sg = sig[b, t, d]
                v = g[b, t, d] * sg * (np.float32(1.0) + pre[b, t, d] * (np.float32(1.0) - sg))
                gp[t, d] = v
                gb_part[b, d] += v
            for k in range(kk):
                for d in range(di):
                    gw_part[b, d, k] += gp[t, d] * xp[b, t + k, d]
        for s in range(nt):
            for d in range(di):
                gx[b, s, d] = 0.0
            for k in range(kk):
                t = s + kk - 1 - k
                if t < nt:
                    for d in range(di):
                        gx[b, s, d] += w[d, k] * gp[t, d]


class _ConvSilu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tail, w, bias):  # noqa: D102
        xp = torch.cat([tail.detach().transpose(1, 2), x.detach()], 1)  # (B, K-1+T, Di)
        w, bias = w.detach().contiguous(), bias.detach().contiguous()
        pre = torch.empty(x.shape, dtype=torch.float32)
        sig, out = torch.empty_like(pre), torch.empty_like(pre)
        _fwd(xp.numpy(), w.numpy(), bias.numpy(), pre.numpy(), sig.numpy(), out.numpy())
        ctx.save_for_backward(xp, w, pre, sig)
        return out

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        xp, w, pre, sig = ctx.saved_tensors
        nb, _, di = pre.shape
        gx = torch.empty_like(pre)
        gw = torch.empty(nb, di, w.shape[1], dtype=torch.float32)
        gb = torch.empty(nb, di, dtype=torch.float32)
        _bwd(xp.numpy(), w.numpy(), pre.numpy(), sig.numpy(), g.contiguous().numpy(), gx.numpy(),
             gw.numpy(), gb.numpy())
        return gx, None, gw.sum(0), gb.sum(0)


def causal_conv_silu(x: torch.Tensor, tail: torch.Tensor, w: torch.Tensor,
                     bias: torch.Tensor) -> torch.Tensor:
    """silu(causal depthwise conv): x (B, T, Di), tail (B, Di, K-1) the inputs before x
    (a constant), w (Di, K), bias (Di,) -> (B, T, Di); differentiable in x, w and bias."""
    return _ConvSilu.apply(x, tail, w, bias)
