"""Fused MoE combine for CPU training and evaluation (numba).

After the experts ran on the assignments sorted by expert, every token sums its ``k``
expert outputs weighted by the router weights:

    out[t] = sum_j w[t, j] * y_sorted[pos[t * k + j]]        # pos: inverse of ``order``

:func:`combine` does this in one pass (the torch form is an index_copy into (n, k, D), a
broadcast multiply and a sum, each a full pass, and its backward as many again); its
backward is one pass for the expert outputs' gradient
``g_y[i] = w.flat[order[i]] * g_out[order[i] // k]`` and one for the router weights'
``g_w[t, j] = g_out[t] . y_sorted[pos[t * k + j]]``. Sums run over j (or d) in a fixed
order, so results are deterministic and independent of the thread count.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange


@njit(parallel=True, fastmath=True, cache=True)
def _combine_fwd(y, w, pos, out):
    # y: (m, D) sorted by expert; w: (n, k); pos: (n * k,) sorted row of assignment t * k + j
    n, k = w.shape
    dm = y.shape[1]
    for t in prange(n):
        for d in range(dm):
            out[t, d] = 0.0
        for j in range(k):
            wj = w[t, j]
            r = pos[t * k + j]
            for d in range(dm):
                out[t, d] += wj * y[r, d]


@njit(parallel=True, fastmath=True, cache=True)
def _combine_bwd(y, w, pos, g, gy, gw):
    # g: (n, D) upstream; gy: (m, D); gw: (n, k)
    n, k = w.shape
    dm = y.shape[1]
    for t in prange(n):
        for j in range(k):
            r = pos[t * k + j]
            wj = w[t, j]
            acc = np.float32(0.0)
            for d in range(dm):
                gv = g[t, d]
                acc += gv * y[r, d]
                gy[r, d] = wj * gv
            gw[t, j] = acc


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, w, pos):  # noqa: D102
        y, w = y.detach().contiguous(), w.detach().contiguous()
        out = torch.empty(w.shape[0], y.shape[1], dtype=torch.float32)
        _combine_fwd(y.numpy(), w.numpy(), pos.numpy(), out.numpy())
        ctx.save_for_backward(y, w, pos)
        return out

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        y, w, pos = ctx.saved_tensors
        gy, gw = torch.empty_like(y), torch.empty_like(w)
        _combine_bwd(y.numpy(), w.numpy(), pos.numpy(), g.contiguous().numpy(), gy.numpy(), gw.numpy())
        return gy, gw, None


def usable(*ts: torch.Tensor) -> bool:
    """Whether the fused kernels apply: CPU float32 tensors, not under autocast."""
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in ts)
            and not torch.is_autocast_enabled("cpu"))


def combine(y_sorted: torch.Tensor, w: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """out (n, D) = sum_j w[t, j] * y_sorted[row of assignment (t, j)]: y_sorted (n * k, D)
    the expert outputs in sorted order, w (n, k) router weights, order (n * k,) the flat
    assignment index (t * k + j) of every sorted row (a permutation). Differentiable in
    y_sorted and w."""
    pos = torch.empty_like(order)
    pos[order] = torch.arange(order.numel(), dtype=order.dtype)  # (n * k,) inverse permutation
    return _Combine.apply(y_sorted, w, pos)
