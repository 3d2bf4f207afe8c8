"""Fused gated activation + BitLinear input quantization for CPU training (numba).

The hidden units of a gated FFN, ``h = act(g, u)`` with ``[g | u] = gu`` (gate rows then
up rows of one product, ``mlp.activation``), feed the down projection, whose input is
RMS-normalised and int8-quantized (``ternary.prepare_input``). In training the torch form
is a chain of element-wise ops whose backward slices and zero-fills the (n, 2H) gradient;
:func:`gated_act_quant` does the forward in one pass over each row and the backward
(straight-through rounding, exact RMS-norm and activation gradients) in another:

    g_h  = (g_q - h * mean(g_q * h) / den**2) / den           # den = sqrt(mean(h**2) + eps)
    drelu: g_g = g_h * relu(u) * [g > 0]       g_u = g_h * relu(g) * [u > 0]
    relu2: g_g = g_h * 2 relu(g) * u           g_u = g_h * relu(g)**2
    silu:  g_g = g_h * u * sig(g) (1 + g (1 - sig(g)))        g_u = g_h * silu(g)

Rows are independent and reduced in a fixed order: deterministic for any thread count.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from tern.kernels.cache_guard import drop_stale_cache
from tern.train.model.quant_numba import _int8_row, _rms_bwd_row

ACTS = {"drelu": 0, "relu2": 1, "silu": 2}


@njit(fastmath=True, cache=True, inline="always")
def _act(act, g, u):
    if act == 0:
        return max(g, np.float32(0.0)) * max(u, np.float32(0.0))
    if act == 1:
        r = max(g, np.float32(0.0))
        return r * r * u
    return g / (np.float32(1.0) + np.exp(-g)) * u


@njit(parallel=True, fastmath=True, cache=True)
def _fwd(gu, act, eps, h, out, codes, scale, den):
    # gu: (R, 2H); h, out, codes: (R, H); scale, den: (R,)
    rows, hid = h.shape
    k = np.empty(rows, np.float32)
    for r in prange(rows):
        for c in range(hid):
            h[r, c] = _act(act, gu[r, c], gu[r, hid + c])
        _int8_row(h, eps, out, den, codes, scale, k, r)


@njit(parallel=True, fastmath=True, cache=True)
def _bwd(gu, act, h, den, g, gh, ggu):
    # g: (R, H) gradient of the dequantized output; gh: (R, H) scratch; ggu: (R, 2H)
    rows, hid = h.shape
    for r in prange(rows):
        _rms_bwd_row(h, den, g, gh, r)
        for c in range(hid):
            ghc = gh[r, c]
            gv = gu[r, c]
            uv = gu[r, hid + c]
            if act == 0:
                ggu[r, c] = ghc * max(uv, np.float32(0.0)) if gv > 0 else np.float32(0.0)
                ggu[r, hid + c] = ghc * max(gv, np.float32(0.0)) if uv > 0 else np.float32(0.0)
            elif act == 1:
                rg = max(gv, np.float32(0.0))
                ggu[r, c] = ghc * np.float32(2.0) * rg * uv
                ggu[r, hid + c] = ghc * rg * rg
            else:
                sg = np.float32(1.0) / (np.float32(1.0) + np.exp(-gv))
                ggu[r, c] = ghc * uv * sg * (np.float32(1.0) + gv * (np.float32(1.0) - sg))
                ggu[r, hid + c] = ghc * gv * sg


class _GatedActQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gu, act, eps):  # noqa: D102
        lead, two_h = gu.shape[:-1], gu.shape[-1]
        gr = gu.detach().contiguous().reshape(-1, two_h)  # (R, 2H)
        hid = two_h // 2
        h = torch.empty(gr.shape[0], hid, dtype=torch.float32)
        out = torch.empty_like(h)
        codes = torch.empty(h.shape, dtype=torch.int8)
        scale = torch.empty(h.shape[0], 1, dtype=torch.float32)
        den = torch.empty(h.shape[0], dtype=torch.float32)
        _fwd(gr.numpy(), act, np.float32(eps), h.numpy(), out.numpy(), codes.numpy(),
             scale.view(-1).numpy(), den.numpy())
        ctx.save_for_backward(gr, h, den)
        ctx.act, ctx.shape = act, gu.shape
        ctx.mark_non_differentiable(codes, scale)
        return out.view(*lead, hid), codes.view(*lead, hid), scale.view(*lead, 1)

    @staticmethod
    def backward(ctx, g, _gc, _gs):  # noqa: D102
        gr, h, den = ctx.saved_tensors
        ggu, gh = torch.empty_like(gr), torch.empty_like(h)
        _bwd(gr.numpy(), ctx.act, h.numpy(), den.numpy(), g.contiguous().reshape(h.shape).numpy(),
             gh.numpy(), ggu.numpy())
        return ggu.view(ctx.shape), None, None


def gated_act_quant(gu: torch.Tensor, act: str, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """gu (..., 2H) (gate then up) -> (q * a / 127 of h = act(g, u) with straight-through
    rounding and exact gradients, q int8 (..., H), a / 127 (..., 1))."""
    if act not in ACTS:
        raise ValueError(f"unknown activation {act!r}; expected one of {sorted(ACTS)}")
    if gu.shape[-1] % 2:
        raise ValueError(f"gu must hold gate and up halves (even last axis), got {tuple(gu.shape)}")
    return _GatedActQuant.apply(gu, ACTS[act], eps)


# numba cache hygiene: the cached kernels above embed quant_numba's row quantizer (and what it embeds)
drop_stale_cache(__file__, ("quant_numba.py", "../../kernels/quant.py", "../../kernels/kernels_stored.py"), _fwd)
