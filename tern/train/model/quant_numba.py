"""Fused BitLinear quantizers for CPU training (numba): one kernel per tensor instead of
a chain of torch elementwise ops, with the same math as ``ternary.py``:

- :func:`ste_weight_cpu`: Wt * s per output row (absmean scale, round half to even),
  straight-through gradient;
- :func:`quant_input_cpu`: parameter-free RMS normalisation then per-token absmax int8
  (dequantized), straight-through rounding and the exact RMS-norm gradient
  ``g_x = (g - u * mean(g * u)) / sqrt(mean(x**2) + eps)``.

Rows are independent, so results do not depend on the thread count. The row sums run under
reassociating fast-math, so the compiler picks their order: a freshly compiled kernel and
numba's cache-loaded copy of it may differ by an ulp (seen: one _wquant scale of 24 rows).
Writing the order out (8 explicit lanes, no reassociation) made them agree but cost 10 % of
a gate-scale training step (137 -> 151 ms, e8 arm, 3 interleaved rounds, Intel Xeon VM), so
tests compare these kernels up to rounding, never by seed-picked bits.
Divisions become multiplications by reciprocals (the eval path in ``ternary.py`` stays
literal), so a value on a rounding boundary may round differently from eval mode.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from tern.kernels.cache_guard import drop_stale_cache
from tern.kernels.kernels_stored import _u32_as_f32
from tern.kernels.quant import abs_bits

# fast-math without reassociation: keeps the round-to-nearest-even trick below intact
_NOREASSOC = {"nnan", "ninf", "nsz", "arcp", "contract", "afn"}
_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: (v + M) - M rounds |v| < 2**22 half to even


@njit(fastmath=_NOREASSOC, cache=True)
def _round_rows(x, k, scale, lo, hi, out, codes, r):
    # codes[r] = rint(clamp(x[r] * k[r], lo, hi)) (int8), out[r] = codes[r] * scale[r]
    # (vectorisable, unlike np.rint)
    kr, sr = k[r], scale[r]
    for c in range(x.shape[1]):
        v = min(max(x[r, c] * kr, lo), hi)
        q = (v + _MAGIC) - _MAGIC
        codes[r, c] = np.int8(q)
        out[r, c] = q * sr


@njit(parallel=True, fastmath=True, cache=True)
def _wquant(w, out, codes, scale):
    # w, out, codes: (R, C); scale: (R,). Per row: s = max(mean|w|, 1e-8);
    # codes = clamp(rint(w / s), -1, 1); out = codes * s
    rows, cols = w.shape
    k = np.empty(rows, np.float32)
    for r in prange(rows):
        acc = np.float32(0.0)
        for c in range(cols):
            acc += abs(w[r, c])
        s = max(acc / np.float32(cols), np.float32(1e-8))
        k[r] = np.float32(1.0) / s
        scale[r] = s
        _round_rows(w, k, scale, np.float32(-1.0), np.float32(1.0), out, codes, r)


@njit(fastmath=True, cache=True)
def _sumsq_absmax_bits(x, r):
    # row r of a float32 x: (sum of squares, the bits of max |x| as an unsigned integer:
    # tern.kernels.quant.abs_bits, an integer max that vectorises; one pass for both)
    ss = np.float32(0.0)
    mb = np.int64(0)
    for c in range(x.shape[1]):
        v = x[r, c]
        ss += v * v
        b = np.int64(abs_bits(v))  # 64-bit lanes: the vector shape (and so the order of ss) it was committed with
        mb = b if b > mb else mb
    return ss, mb


@njit(fastmath=True, cache=True)
def _int8_row(x, eps, out, den, codes, scale, k, r):
    # row r of x: den = sqrt(mean(x**2) + eps); codes = int8 of x / den;
    # scale = a / 127; out = codes * scale (dequantized). Multiplies by reciprocals
    # (training only: the eval path in ternary.py is literal). k: (R,) float32 scratch.
    cols = x.shape[1]
    ss, mb = _sumsq_absmax_bits(x, r)
    mx = _u32_as_f32(np.uint32(mb))  # max |x|
    d = np.sqrt(ss / np.float32(cols) + eps)
    den[r] = d
    a = max(mx / d, np.float32(1e-5))  # max |u|
    k[r] = np.float32(127.0) / (a * d)  # x -> u * 127 / a
    scale[r] = a / np.float32(127.0)
    _round_rows(x, k, scale, np.float32(-127.0), np.float32(127.0), out, codes, r)


@njit(parallel=True, fastmath=True, cache=True)
def _aquant(x, eps, out, den, codes, scale):
    # x, out, codes: (R, C); den, scale: (R,): every row through _int8_row
    k = np.empty(x.shape[0], np.float32)
    for r in prange(x.shape[0]):
        _int8_row(x, eps, out, den, codes, scale, k, r)


@njit(fastmath=True, cache=True)
def _rms_bwd_row(x, den, g, gx, r):
    # RMS-norm backward of row r with a straight-through quantizer:
    # gx = (g - u * mean(g * u)) / den, u = x / den
    cols = x.shape[1]
    inv = np.float32(1.0) / den[r]
    dot = np.float32(0.0)
    for c in range(cols):
        dot += g[r, c] * x[r, c]
    m = dot * inv / np.float32(cols)  # mean(g * u)
    for c in range(cols):
        gx[r, c] = (g[r, c] - x[r, c] * inv * m) * inv


@njit(parallel=True, fastmath=True, cache=True)
def _aquant_bwd(x, den, g, gx):
    for r in prange(x.shape[0]):
        _rms_bwd_row(x, den, g, gx, r)


@njit(parallel=True, fastmath=_NOREASSOC, cache=True)
def _scale_acc(acc, cx, s, y):
    # acc: (R, C) int32 integer dot products; cx: (R,) row scales a / 127; s: (C,) weight
    # row scales. y = (s * cx) * acc, the order of ternary.qmatmul's eval form.
    rows, cols = acc.shape
    for r in prange(rows):
        cr = cx[r]
        for c in range(cols):
            y[r, c] = (s[c] * cr) * np.float32(acc[r, c])


def _rows(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().reshape(-1, t.shape[-1]).numpy()


class _WeightQ(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w):  # noqa: D102
        out = torch.empty(w.shape, dtype=torch.float32)
        codes = torch.empty(w.shape, dtype=torch.int8)
        scale = torch.empty(w.shape[:-1] + (1,), dtype=torch.float32)
        _wquant(_rows(w), out.view(-1, w.shape[-1]).numpy(), codes.view(-1, w.shape[-1]).numpy(),
                scale.view(-1).numpy())
        ctx.mark_non_differentiable(codes, scale)
        return out, codes, scale

    @staticmethod
    def backward(ctx, g, _gc, _gs):  # noqa: D102
        return g


class _InputQ(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, eps):  # noqa: D102
        xr = _rows(x)
        out = torch.empty(x.shape, dtype=torch.float32)
        codes = torch.empty(x.shape, dtype=torch.int8)
        scale = torch.empty(x.shape[:-1] + (1,), dtype=torch.float32)
        den = torch.empty(xr.shape[0], dtype=torch.float32)
        _aquant(xr, np.float32(eps), out.view(-1, x.shape[-1]).numpy(), den.numpy(),
                codes.view(-1, x.shape[-1]).numpy(), scale.view(-1).numpy())
        ctx.save_for_backward(x, den)
        ctx.mark_non_differentiable(codes, scale)
        return out, codes, scale

    @staticmethod
    def backward(ctx, g, _gc, _gs):  # noqa: D102
        x, den = ctx.saved_tensors
        gx = torch.empty(x.shape, dtype=torch.float32)
        _aquant_bwd(_rows(x), den.numpy(), _rows(g), gx.view(-1, x.shape[-1]).numpy())
        return gx, None


class Int8MatmulSTE(torch.autograd.Function):
    """y = (s * c) * (q @ Wt.T) from the int8 codes by an exact int32 product
    (``torch._int_mm``); the backward is the fp32 STE backward of the dequantized product
    ``x @ w.T`` (x = q * c, w = Wt * s), so the latents get the same gradients.

    With ``bf16`` the backward factors the scales out of the operands, whose codes are
    exact in bf16 (|q| <= 127, Wt in {-1, 0, 1}): ``g_x = bf16(g * s.T) @ Wt``,
    ``g_w = bf16(g * c).T @ q``, accumulated in fp32 by oneDNN (AVX512-BF16 where the CPU
    has it) and returned in bf16: what changes is the rounding of ``g * s`` / ``g * c`` and
    of the two products to 8 significant bits (relative 2**-9 each)."""

    @staticmethod
    def forward(ctx, x, w, q, c, wt, s, bf16=False):  # noqa: D102
        # x, q: (n, in); c: (n, 1); w, wt: (out, in); s: (out, 1)
        acc = torch._int_mm(q, wt.t())  # (n, out) int32, exact while in * 127 < 2**31
        y = torch.empty(acc.shape, dtype=torch.float32)
        _scale_acc(acc.numpy(), c.reshape(-1).numpy(), s.reshape(-1).numpy(), y.numpy())
        ctx.bf16 = bool(bf16)
        ctx.save_for_backward(*((q, c, wt, s) if bf16 else (x, w)))
        return y

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        gx = gw = None
        if ctx.bf16:
            q, c, wt, s = ctx.saved_tensors
            bf = torch.bfloat16
            if ctx.needs_input_grad[0]:
                gx = (g * s.reshape(1, -1)).to(bf).mm(wt.to(bf)).float()  # (n, in)
            if ctx.needs_input_grad[1]:
                gw = (g * c.reshape(-1, 1)).t().to(bf).mm(q.to(bf)).float()  # (out, in)
            return gx, gw, None, None, None, None, None
        x, w = ctx.saved_tensors
        gx = g.mm(w) if ctx.needs_input_grad[0] else None  # (n, in): autograd's mm backward
        gw = x.t().mm(g).t() if ctx.needs_input_grad[1] else None  # (out, in)
        return gx, gw, None, None, None, None, None


def usable(*ts: torch.Tensor) -> bool:
    """Whether the fused CPU kernels apply to tensors ``ts``: all CPU float32, not under
    autocast (the one test every fused training kernel of tern.train.model uses)."""
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in ts)
            and not torch.is_autocast_enabled("cpu"))


def ste_weight_codes_cpu(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w (..., out, in) -> (Wt * s with STE gradient, Wt int8 (..., out, in), s (..., out, 1))."""
    return _WeightQ.apply(w)


def quant_input_codes_cpu(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (..., in) -> (q * a / 127 with STE rounding and exact RMS-norm gradient,
    q int8 (..., in), a / 127 (..., 1))."""
    return _InputQ.apply(x, eps)


def ste_weight_cpu(w: torch.Tensor) -> torch.Tensor:
    return ste_weight_codes_cpu(w)[0]


def quant_input_cpu(x: torch.Tensor, eps: float) -> torch.Tensor:
    return quant_input_codes_cpu(x, eps)[0]


# numba cache hygiene: the cached kernels above embed tern.kernels' absmax bits and bit casts
drop_stale_cache(__file__, ("../../kernels/quant.py", "../../kernels/kernels_stored.py"), _aquant)
