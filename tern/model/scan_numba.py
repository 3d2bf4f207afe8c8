"""Fused selective-scan kernels (numba, CPU) for training and parallel evaluation.

The recurrence of docs/MODEL.md for one SSM layer, over a whole sequence:

    h_t = exp(dt_t * A) * h_{t-1} + (dt_t * u_t) * B_t        # (Di, N) per batch row
    y_t = h_t @ C_t                                           # (Di,)  (D * u is added outside)

The kernels never materialise (B, T, Di, N) tensors: each (batch, channel) pair keeps its
N-vector state in registers, so memory traffic is that of the (B, T, Di) / (B, T, N)
inputs. Work is split over (batch, channel) pairs (forward) or (batch, channel group)
pairs (backward), every reduction runs in a fixed order, so results are bit-identical
across runs and thread counts. ``exp`` of the (non-positive) decay argument uses a
vectorisable polynomial with a relative error below 2e-7 (numba has no vector libm
here); the torch step form uses ``torch.exp``, and both agree to float tolerance.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

_LOG2E = np.float32(1.4426950408889634)
_LN2 = 0.6931471805599453


@njit(inline="always", fastmath=True, cache=True)
def fexp_nonpos(x):
    """exp(x) for float32 x <= 0 (clamped below at 2**-126); relative error < 2e-7."""
    y = max(np.float32(x * _LOG2E), np.float32(-126.0))
    k = np.floor(y + np.float32(0.5))
    f = (y - k) * np.float32(_LN2)  # |f| <= ln2 / 2
    # Taylor series of exp(f) to degree 7 (remainder < 3e-9 on |f| <= 0.347)
    p = np.float32(1.0 / 5040.0)
    p = p * f + np.float32(1.0 / 720.0)
    p = p * f + np.float32(1.0 / 120.0)
    p = p * f + np.float32(1.0 / 24.0)
    p = p * f + np.float32(1.0 / 6.0)
    p = p * f + np.float32(0.5)
    p = p * f + np.float32(1.0)
    p = p * f + np.float32(1.0)
    scale = (np.int32(k) + np.int32(127)) << 23
    return p * np.int32(scale).view(np.float32)


@njit(parallel=True, fastmath=True, cache=True)
def _scan_fwd(u, dt, A, Bm, Cm, h0, y, hT):
    # u, dt, y: (B, T, Di); A: (Di, N); Bm, Cm: (B, T, N); h0, hT: (B, Di, N)
    nb, nt, di = u.shape
    n = A.shape[1]
    for job in prange(nb * di):
        b = job // di
        d = job % di
        h = h0[b, d].copy()  # (N,)
        for t in range(nt):
            dtv = dt[b, t, d]
            xv = dtv * u[b, t, d]
            acc = np.float32(0.0)
            for k in range(n):
                h[k] = fexp_nonpos(dtv * A[d, k]) * h[k] + xv * Bm[b, t, k]
                acc += h[k] * Cm[b, t, k]
            y[b, t, d] = acc
        hT[b, d, :] = h


@njit(parallel=True, fastmath=True, cache=True)
def _scan_bwd(u, dt, A, Bm, Cm, h0, gy, group, gu, gdt, gA_part, gB_part, gC_part):
    # gu, gdt: (B, T, Di); gA_part: (B, Di, N); gB_part, gC_part: (G, B, T, N)
    nb, nt, di = u.shape
    n = A.shape[1]
    ng = gB_part.shape[0]
    for job in prange(nb * ng):
        b = job // ng
        g = job % ng
        hs = np.empty((nt + 1, n), np.float32)  # hs[t + 1] = h_t of this channel, hs[0] = h0
        dec = np.empty((nt, n), np.float32)  # decays exp(dt_t * A)
        gh = np.empty(n, np.float32)
        for d in range(g * group, min((g + 1) * group, di)):
            # recompute the forward states of channel d
            for k in range(n):
                hs[0, k] = h0[b, d, k]
            for t in range(nt):
                dtv = dt[b, t, d]
                xv = dtv * u[b, t, d]
                for k in range(n):
                    a = fexp_nonpos(dtv * A[d, k])
                    dec[t, k] = a
                    hs[t + 1, k] = a * hs[t, k] + xv * Bm[b, t, k]
            for k in range(n):
                gh[k] = 0.0
            # reverse sweep
            for t in range(nt - 1, -1, -1):
                gyv = gy[b, t, d]
                dtv = dt[b, t, d]
                uv = u[b, t, d]
                xv = dtv * uv
                gx = np.float32(0.0)
                gdta = np.float32(0.0)
                for k in range(n):
                    ghk = gh[k] + gyv * Cm[b, t, k]
                    gC_part[g, b, t, k] += gyv * hs[t + 1, k]
                    gB_part[g, b, t, k] += ghk * xv
                    gx += ghk * Bm[b, t, k]
                    gda = ghk * hs[t, k] * dec[t, k]  # d/d(dt * A)
                    gdta += gda * A[d, k]
                    gA_part[b, d, k] += gda * dtv
                    gh[k] = ghk * dec[t, k]
                gu[b, t, d] = gx * dtv
                gdt[b, t, d] = gx * uv + gdta


_BWD_GROUP = 64  # channels per backward job


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


class NumbaScan(torch.autograd.Function):
    """Differentiable fused scan (CPU float32). Gradients flow to u, dt, A, B and C; the
    initial state h0 is treated as a constant."""

    @staticmethod
    def forward(ctx, u, dt, A, Bm, Cm, h0):  # noqa: D102
        nb, nt, di = u.shape
        y = torch.empty(nb, nt, di, dtype=torch.float32)
        hT = torch.empty(nb, di, A.shape[1], dtype=torch.float32)
        args = [_np(t) for t in (u, dt, A, Bm, Cm, h0)]
        _scan_fwd(*args, y.numpy(), hT.numpy())
        ctx.save_for_backward(u, dt, A, Bm, Cm, h0)
        ctx.mark_non_differentiable(hT)
        return y, hT

    @staticmethod
    def backward(ctx, gy, _ghT):  # noqa: D102
        u, dt, A, Bm, Cm, h0 = ctx.saved_tensors
        nb, nt, di = u.shape
        n = A.shape[1]
        ng = -(-di // _BWD_GROUP)
        gu = torch.empty_like(u)
        gdt = torch.empty_like(dt)
        gA = torch.zeros(nb, di, n)
        gB = torch.zeros(ng, nb, nt, n)
        gC = torch.zeros(ng, nb, nt, n)
        _scan_bwd(*(_np(t) for t in (u, dt, A, Bm, Cm, h0, gy)), _BWD_GROUP,
                  gu.numpy(), gdt.numpy(), gA.numpy(), gB.numpy(), gC.numpy())
        return gu, gdt, gA.sum(0), gB.sum(0), gC.sum(0), None


def numba_scan(u, dt, A, Bm, Cm, h0):
    """y (B, T, Di), h_T (B, Di, N) of the selective scan (CPU float32 tensors)."""
    return NumbaScan.apply(u, dt, A, Bm, Cm, h0)
