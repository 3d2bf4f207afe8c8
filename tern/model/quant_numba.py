"""Fused BitLinear quantizers for CPU training (numba): one kernel per tensor instead of
a chain of torch elementwise ops, with the same math as ``ternary.py``:

- :func:`ste_weight_cpu`: Wt * s per output row (absmean scale, round half to even),
  straight-through gradient;
- :func:`quant_input_cpu`: parameter-free RMS normalisation then per-token absmax int8
  (dequantized), straight-through rounding and the exact RMS-norm gradient
  ``g_x = (g - u * mean(g * u)) / sqrt(mean(x**2) + eps)``.

Rows are independent and each is reduced in a fixed order, so results are deterministic.
Divisions become multiplications by reciprocals (the eval path in ``ternary.py`` stays
literal), so a value on a rounding boundary may round differently from eval mode.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

# fast-math without reassociation: keeps the round-to-nearest-even trick below intact
_NOREASSOC = {"nnan", "ninf", "nsz", "arcp", "contract", "afn"}
_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: (v + M) - M rounds |v| < 2**22 half to even


@njit(fastmath=_NOREASSOC, cache=True)
def _round_rows(x, k, scale, lo, hi, out, r):
    # out[r] = rint(clamp(x[r] * k[r], lo, hi)) * scale[r]  (vectorisable, unlike np.rint)
    kr, sr = k[r], scale[r]
    for c in range(x.shape[1]):
        v = min(max(x[r, c] * kr, lo), hi)
        out[r, c] = ((v + _MAGIC) - _MAGIC) * sr


@njit(parallel=True, fastmath=True, cache=True)
def _wquant(w, out):
    # w, out: (R, C); per row: s = max(mean|w|, 1e-8); out = clamp(rint(w / s), -1, 1) * s
    rows, cols = w.shape
    k = np.empty(rows, np.float32)
    scale = np.empty(rows, np.float32)
    for r in prange(rows):
        acc = np.float32(0.0)
        for c in range(cols):
            acc += abs(w[r, c])
        s = max(acc / np.float32(cols), np.float32(1e-8))
        k[r] = np.float32(1.0) / s
        scale[r] = s
        _round_rows(w, k, scale, np.float32(-1.0), np.float32(1.0), out, r)


@njit(parallel=True, fastmath=True, cache=True)
def _aquant(x, eps, out, den):
    # x, out: (R, C); den: (R,) = sqrt(mean(x**2) + eps); out = dequantized int8 of x / den.
    # Multiplies by reciprocals (training only: the eval path in ternary.py is literal).
    rows, cols = x.shape
    k = np.empty(rows, np.float32)
    scale = np.empty(rows, np.float32)
    for r in prange(rows):
        ss = np.float32(0.0)
        mx = np.float32(0.0)
        for c in range(cols):
            ss += x[r, c] * x[r, c]
            mx = max(mx, abs(x[r, c]))
        d = np.sqrt(ss / np.float32(cols) + eps)
        den[r] = d
        a = max(mx / d, np.float32(1e-5))  # max |u|
        k[r] = np.float32(127.0) / (a * d)  # x -> u * 127 / a
        scale[r] = a / np.float32(127.0)
        _round_rows(x, k, scale, np.float32(-127.0), np.float32(127.0), out, r)


@njit(parallel=True, fastmath=True, cache=True)
def _aquant_bwd(x, den, g, gx):
    # RMS-norm backward with a straight-through quantizer: gx = (g - u * mean(g * u)) / den
    rows, cols = x.shape
    for r in prange(rows):
        inv = np.float32(1.0) / den[r]
        dot = np.float32(0.0)
        for c in range(cols):
            dot += g[r, c] * x[r, c]
        m = dot * inv / np.float32(cols)  # mean(g * u)
        for c in range(cols):
            gx[r, c] = (g[r, c] - x[r, c] * inv * m) * inv


def _rows(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().reshape(-1, t.shape[-1]).numpy()


class _WeightQ(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w):  # noqa: D102
        out = torch.empty(w.shape, dtype=torch.float32)
        _wquant(_rows(w), out.view(-1, w.shape[-1]).numpy())
        return out

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        return g


class _InputQ(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, eps):  # noqa: D102
        xr = _rows(x)
        out = torch.empty(x.shape, dtype=torch.float32)
        den = torch.empty(xr.shape[0], dtype=torch.float32)
        _aquant(xr, np.float32(eps), out.view(-1, x.shape[-1]).numpy(), den.numpy())
        ctx.save_for_backward(x, den)
        return out

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        x, den = ctx.saved_tensors
        gx = torch.empty(x.shape, dtype=torch.float32)
        _aquant_bwd(_rows(x), den.numpy(), _rows(g), gx.view(-1, x.shape[-1]).numpy())
        return gx, None


def usable(t: torch.Tensor) -> bool:
    """Whether the fused CPU kernels apply (CPU float32, not under autocast)."""
    return t.device.type == "cpu" and t.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")


def ste_weight_cpu(w: torch.Tensor) -> torch.Tensor:
    return _WeightQ.apply(w)


def quant_input_cpu(x: torch.Tensor, eps: float) -> torch.Tensor:
    return _InputQ.apply(x, eps)
