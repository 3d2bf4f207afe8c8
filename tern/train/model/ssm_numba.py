"""The SSM mixer's element-wise work around its matrices, fused for CPU training (numba).

The dt projection and its softplus (:func:`dt_proj_softplus`)::

    dt[i, d] = softplus(b[d] + sum_r x[i, r] * w[d, r])        # x (n, R), w (Di, R)

R = dt_rank is narrow (4-32), where torch's matmul runs its forward and two backward
products at a few GFLOP/s (gate-scale SSM, 1,024 x 8 -> 256: ~1.0 ms a layer for the
three products on one Zen 4 core, and the softplus another ~0.6 ms); here the forward is
one pass over the rows with the softplus applied in place, the backward one pass for the
input gradient and one per fixed block of 128 rows for the weight and bias gradients.

The skip term and the output gate (:func:`skip_gate`)::

    o[i, d] = (y[i, d] + D[d] * u[i, d]) * silu(z[i, d])

one pass forward and one backward instead of torch's five element-wise passes and their
backward (~1.1 ms a gate-scale layer).

Partial sums over rows (the weight, bias and D gradients) are kept per fixed block of
rows and added in block order afterwards: deterministic for any thread count. softplus is
the decode engine's (``tern.kernels.ssm_step``), the sigmoid ``tern.kernels.fastmath``'s:
vectorisable, relative error < 3e-7 + 1.2e-7 |x| against torch's. Eval and the one-token
step keep the torch forms.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from tern.kernels.fastmath import fsigmoid
from tern.kernels.ssm_step import softplus  # the decode engine's: the same rounding

_BLOCK = 128  # rows per partial sum of the weight / bias gradients


@njit(parallel=True, fastmath=True, cache=True)
def _fwd(x, w_t, b, pre, out):
    # x: (n, R); w_t: (R, Di); b: (Di,); pre, out: (n, Di)
    n, r = x.shape
    di = w_t.shape[1]
    for i in prange(n):
        pi = pre[i]
        for d in range(di):
            pi[d] = b[d]
        for k in range(r):
            xk = x[i, k]
            wk = w_t[k]
            for d in range(di):
                pi[d] += xk * wk[d]
        oi = out[i]
        for d in range(di):
            oi[d] = softplus(pi[d])


@njit(parallel=True, fastmath=True, cache=True)
def _bwd(x, w_t, pre, g, gx, gw_part, gb_part):
    # g: (n, Di) upstream; gx: (n, R); gw_part: (blocks, R, Di); gb_part: (blocks, Di)
    n, r = x.shape
    di = w_t.shape[1]
    nblk = gb_part.shape[0]
    for blk in prange(nblk):
        gp = np.empty(di, np.float32)
        gwb = gw_part[blk]
        gbb = gb_part[blk]
        for k in range(r):
            for d in range(di):
                gwb[k, d] = 0.0
        for d in range(di):
            gbb[d] = 0.0
        for i in range(blk * _BLOCK, min((blk + 1) * _BLOCK, n)):
            gi = g[i]
            pi = pre[i]
            for d in range(di):
                v = gi[d] * fsigmoid(pi[d])  # d softplus / d pre
                gp[d] = v
                gbb[d] += v
            for k in range(r):
                wk = w_t[k]
                xk = x[i, k]
                acc = np.float32(0.0)
                gwk = gwb[k]
                for d in range(di):
                    acc += gp[d] * wk[d]
                    gwk[d] += xk * gp[d]
                gx[i, k] = acc


class _DtProjSoftplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):  # noqa: D102
        lead = x.shape[:-1]
        x2 = x.detach().reshape(-1, x.shape[-1]).contiguous()  # (n, R)
        w_t = w.detach().t().contiguous()  # (R, Di)
        pre = torch.empty(x2.shape[0], w.shape[0], dtype=torch.float32)  # (n, Di)
        out = torch.empty_like(pre)
        _fwd(x2.numpy(), w_t.numpy(), b.detach().contiguous().numpy(), pre.numpy(), out.numpy())
        ctx.save_for_backward(x2, w_t, pre)
        ctx.lead = lead
        return out.view(*lead, w.shape[0])

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        x2, w_t, pre = ctx.saved_tensors
        n, r = x2.shape
        di = w_t.shape[1]
        nblk = -(-n // _BLOCK)
        gx = torch.empty(n, r, dtype=torch.float32)
        gw = torch.empty(nblk, r, di, dtype=torch.float32)
        gb = torch.empty(nblk, di, dtype=torch.float32)
        _bwd(x2.numpy(), w_t.numpy(), pre.numpy(), g.reshape(n, di).contiguous().numpy(), gx.numpy(),
             gw.numpy(), gb.numpy())
        return gx.view(*ctx.lead, r), gw.sum(0).t(), gb.sum(0)


@njit(parallel=True, fastmath=True, cache=True)
def _gate_fwd(y, u, z, dsk, out):
    # y, u, z, out: (n, Di); dsk: (Di,)
    n, di = y.shape
    for i in prange(n):
        for d in range(di):
            zv = z[i, d]
            out[i, d] = (y[i, d] + dsk[d] * u[i, d]) * (zv * fsigmoid(zv))


@njit(parallel=True, fastmath=True, cache=True)
def _gate_bwd(y, u, z, dsk, g, gy, gu, gz, gd_part):
    # g: (n, Di) upstream; gy, gu, gz: (n, Di); gd_part: (blocks, Di)
    n, di = y.shape
    nblk = gd_part.shape[0]
    for blk in prange(nblk):
        gdb = gd_part[blk]
        for d in range(di):
            gdb[d] = 0.0
        for i in range(blk * _BLOCK, min((blk + 1) * _BLOCK, n)):
            for d in range(di):
                zv = z[i, d]
                sg = fsigmoid(zv)
                uv = u[i, d]
                v = y[i, d] + dsk[d] * uv
                gv = g[i, d] * (zv * sg)
                gy[i, d] = gv
                gu[i, d] = gv * dsk[d]
                gdb[d] += gv * uv
                gz[i, d] = g[i, d] * v * (sg * (np.float32(1.0) + zv * (np.float32(1.0) - sg)))


class _SkipGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, u, z, dsk):  # noqa: D102
        shape = y.shape
        y2, u2, z2 = (t.detach().reshape(-1, shape[-1]).contiguous() for t in (y, u, z))  # (n, Di)
        dsk = dsk.detach().contiguous()
        out = torch.empty(y2.shape, dtype=torch.float32)
        _gate_fwd(y2.numpy(), u2.numpy(), z2.numpy(), dsk.numpy(), out.numpy())
        ctx.save_for_backward(y2, u2, z2, dsk)
        ctx.shape = shape
        return out.view(shape)

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        y2, u2, z2, dsk = ctx.saved_tensors
        n, di = y2.shape
        gy, gu, gz = torch.empty_like(y2), torch.empty_like(y2), torch.empty_like(y2)
        gd = torch.empty(-(-n // _BLOCK), di, dtype=torch.float32)
        _gate_bwd(y2.numpy(), u2.numpy(), z2.numpy(), dsk.numpy(), g.reshape(n, di).contiguous().numpy(),
                  gy.numpy(), gu.numpy(), gz.numpy(), gd.numpy())
        shape = ctx.shape
        return gy.view(shape), gu.view(shape), gz.view(shape), gd.sum(0)


def dt_proj_softplus(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """softplus(x @ w.T + b): x (..., R), w (Di, R), b (Di,) -> (..., Di); differentiable in
    all three (CPU float32)."""
    if w.dim() != 2 or x.shape[-1] != w.shape[1] or tuple(b.shape) != (w.shape[0],):
        raise ValueError(f"dt_proj_softplus: x (..., R), w (Di, R), b (Di,) expected, got "
                         f"{tuple(x.shape)}, {tuple(w.shape)}, {tuple(b.shape)}")
    return _DtProjSoftplus.apply(x, w, b)


def skip_gate(y: torch.Tensor, u: torch.Tensor, z: torch.Tensor, dsk: torch.Tensor) -> torch.Tensor:
    """(y + D * u) * silu(z): y, u, z (..., Di), dsk = D (Di,) -> (..., Di); differentiable
    in all four (CPU float32)."""
    if not (y.shape == u.shape == z.shape) or tuple(dsk.shape) != (y.shape[-1],):
        raise ValueError(f"skip_gate: y, u, z of one shape (..., Di) and D (Di,) expected, got "
                         f"{tuple(y.shape)}, {tuple(u.shape)}, {tuple(z.shape)}, {tuple(dsk.shape)}")
    return _SkipGate.apply(y, u, z, dsk)
