"""Fused selective-scan kernels (numba, CPU) for training and parallel evaluation.

The recurrence of docs/MODEL.md for one SSM layer, over a whole sequence:

    h_t = exp(dt_t * A) * h_{t-1} + (dt_t * u_t) * B_t        # (Di, N) per batch row
    y_t = h_t @ C_t                                           # (Di,)  (D * u is added outside)

The kernels never materialise (B, T, Di, N) tensors: each (batch, channel) pair keeps its
N-vector state in registers, so memory traffic is that of the (B, T, Di) / (B, T, N)
inputs. Work is split over (batch, channel) pairs (forward) or (batch, channel group)
pairs (backward), each job reduces on its own, so results are bit-identical across runs
of one compiled kernel and across thread counts. Under fast-math the compiler orders the
16-lane sums: a fresh compile and numba's cached copy may differ in the last bits of the
backward (seen on the A and dt gradients; fixing the order cost 17 % of the scan).
``exp`` of the (non-positive) decay argument uses a vectorisable polynomial with a
relative error below 2e-7 + 1.2e-7 |x| (numba has no vector libm here); the torch step form uses
``torch.exp``, and both agree to float tolerance.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from tern.kernels.fastmath import fexp_nonpos  # shared with the decode engine


@njit(parallel=True, fastmath=True, cache=True)
def _scan_fwd(u, dt, A, Bm, Cm, h0, y, hT):
    # u, dt, y: (B, T, Di); A: (Di, NC, 16); Bm, Cm: (B, T, NC, 16); h0, hT: (B, Di, NC, 16).
    # State lanes are independent, so blocks of 16 lanes run one after the other (y summed).
    nb, nt, di = u.shape
    nc = A.shape[1]
    for job in prange(nb * di):
        b = job // di
        d = job % di
        h = np.empty(16, np.float32)
        a = np.empty(16, np.float32)
        for c in range(nc):
            for k in range(16):
                h[k] = h0[b, d, c, k]
                a[k] = A[d, c, k]
            for t in range(nt):
                dtv = dt[b, t, d]
                xv = dtv * u[b, t, d]
                acc = np.float32(0.0)
                for k in range(16):
                    hv = fexp_nonpos(dtv * a[k]) * h[k] + xv * Bm[b, t, c, k]
                    h[k] = hv
                    acc += hv * Cm[b, t, c, k]
                y[b, t, d] = acc if c == 0 else y[b, t, d] + acc
            for k in range(16):
                hT[b, d, c, k] = h[k]


@njit(parallel=True, fastmath=True, cache=True)
def _scan_bwd(u, dt, A, Bm, Cm, h0, gy, group, gu, gdt, gA_part, gB_part, gC_part):
    # gu, gdt: (B, T, Di); gA_part: (B, Di, NC, 16); gB_part, gC_part: (G, B, T, NC, 16)
    nb, nt, di = u.shape
    nc = A.shape[1]
    ng = gB_part.shape[0]
    for job in prange(nb * ng):
        b = job // ng
        g = job % ng
        hs = np.empty((nt + 1, 16), np.float32)  # hs[t + 1] = h_t of 16 lanes, hs[0] = h0
        dec = np.empty((nt, 16), np.float32)  # decays exp(dt_t * A)
        gh = np.empty(16, np.float32)
        ga = np.empty(16, np.float32)
        a = np.empty(16, np.float32)
        for d in range(g * group, min((g + 1) * group, di)):
            for c in range(nc):
                for k in range(16):
                    hs[0, k] = h0[b, d, c, k]
                    a[k] = A[d, c, k]
                    gh[k] = 0.0
                    ga[k] = 0.0
                for t in range(nt):  # recompute the forward states
                    dtv = dt[b, t, d]
                    xv = dtv * u[b, t, d]
                    for k in range(16):
                        e = fexp_nonpos(dtv * a[k])
                        dec[t, k] = e
                        hs[t + 1, k] = e * hs[t, k] + xv * Bm[b, t, c, k]
                for tt in range(nt):  # reverse sweep (a forward range vectorises better)
                    t = nt - 1 - tt
                    gyv = gy[b, t, d]
                    dtv = dt[b, t, d]
                    uv = u[b, t, d]
                    xv = dtv * uv
                    gx = np.float32(0.0)
                    gdta = np.float32(0.0)
                    for k in range(16):
                        ghk = gh[k] + gyv * Cm[b, t, c, k]
                        gC_part[g, b, t, c, k] += gyv * hs[t + 1, k]
                        gB_part[g, b, t, c, k] += ghk * xv
                        gx += ghk * Bm[b, t, c, k]
                        gda = ghk * hs[t, k] * dec[t, k]  # d/d(dt * A)
                        gdta += gda * a[k]
                        ga[k] += gda * dtv
                        gh[k] = ghk * dec[t, k]
                    if c == 0:
                        gu[b, t, d] = gx * dtv
                        gdt[b, t, d] = gx * uv + gdta
                    else:
                        gu[b, t, d] += gx * dtv
                        gdt[b, t, d] += gx * uv + gdta
                for k in range(16):
                    gA_part[b, d, c, k] = ga[k]


_BWD_GROUP = 64  # channels per backward job


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


def _pad_state(t: torch.Tensor) -> torch.Tensor:
    """Zero-pad the state axis (last) to a multiple of 16: padded lanes have A = B = C = 0,
    so their state stays 0 and they add nothing to y."""
    pad = (-t.shape[-1]) % 16
    return torch.nn.functional.pad(t, (0, pad)) if pad else t


def _blocks(t: torch.Tensor) -> torch.Tensor:
    """(..., N) -> (..., N / 16, 16) after padding: kernels index [.., c, k] with loop
    variables only, so numba emits no wrap-around checks and the k-loop vectorises."""
    t = _pad_state(t)
    return t.reshape(*t.shape[:-1], t.shape[-1] // 16, 16)


class NumbaScan(torch.autograd.Function):
    """Differentiable fused scan (CPU float32). Gradients flow to u, dt, A, B and C; the
    initial state h0 is treated as a constant. The state axis is zero-padded to a multiple
    of 16 for the kernels."""

    @staticmethod
    def forward(ctx, u, dt, A, Bm, Cm, h0):  # noqa: D102
        n0 = A.shape[1]
        A, Bm, Cm, h0 = (_blocks(t.detach()) for t in (A, Bm, Cm, h0))
        nb, nt, di = u.shape
        y = torch.empty(nb, nt, di, dtype=torch.float32)
        hT = torch.empty(h0.shape, dtype=torch.float32)  # (B, Di, NC, 16)
        args = [_np(t) for t in (u, dt, A, Bm, Cm, h0)]
        _scan_fwd(*args, y.numpy(), hT.numpy())
        ctx.save_for_backward(u, dt, A, Bm, Cm, h0)
        ctx.n0 = n0
        hT = hT.flatten(-2)[..., :n0].contiguous()
        ctx.mark_non_differentiable(hT)
        return y, hT

    @staticmethod
    def backward(ctx, gy, _ghT):  # noqa: D102
        u, dt, A, Bm, Cm, h0 = ctx.saved_tensors
        nb, nt, di = u.shape
        nc = A.shape[1]
        ng = -(-di // _BWD_GROUP)
        gu = torch.empty_like(u)
        gdt = torch.empty_like(dt)
        gA = torch.empty(nb, di, nc, 16)  # every element written by the kernel
        gB = torch.zeros(ng, nb, nt, nc, 16)
        gC = torch.zeros(ng, nb, nt, nc, 16)
        _scan_bwd(*(_np(t) for t in (u, dt, A, Bm, Cm, h0, gy)), _BWD_GROUP,
                  gu.numpy(), gdt.numpy(), gA.numpy(), gB.numpy(), gC.numpy())
        n0 = ctx.n0
        gA, gB, gC = (t.sum(0).flatten(-2)[..., :n0] for t in (gA, gB, gC))
        return gu, gdt, gA, gB, gC, None


def numba_scan(u, dt, A, Bm, Cm, h0):
    """y (B, T, Di), h_T (B, Di, N) of the selective scan (CPU float32 tensors)."""
    return NumbaScan.apply(u, dt, A, Bm, Cm, h0)
