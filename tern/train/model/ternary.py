"""BitLinear: ternary weights with a per-row absmean scale, int8 per-token activations.

Exactly docs/MODEL.md ("BitLinear"). Weights ``W`` (out, in) stay latent fp32 during
training; the forward pass sees

    s_r = max(mean(|W[r, :]|), 1e-8)                    # (out,)  per output row
    Wt  = clamp(round(W / s_r), -1, 1)                   # ternary
    u   = x / sqrt(mean(x**2) + eps)                     # parameter-free RMS norm
    a   = max(max(|u|), 1e-5)                            # per token
    q   = clamp(round(u * 127 / a), -127, 127)           # int8
    y   = s_r * (a / 127) * (q @ Wt.T)

``round`` is round-half-to-even (``torch.round``). Training uses a straight-through
estimator for both roundings (the gradient of the quantizer is the identity), so the
latent weights and the normalised input get the gradient of a plain matmul with the
quantized operands. In eval mode the product is computed literally as an integer dot
product followed by the two scales, which is what the numba engine does.

CPU training (float32) takes the int8 codes from the fused quantizers (``quant_numba``)
and, in the default matmul mode "int8", computes the forward product of 2-D operands
exactly as eval does: ``torch._int_mm`` (int8 x int8 -> int32, VNNI), then
``(s_r * a / 127) * acc`` (~4x the fp32 matmul rate on AVX-512 VNNI). Its backward is
the fp32 STE backward of the dequantized product (``g @ (Wt * s)``, ``g.T @ (q * a/127)``),
bit-identical to mode "fp32", which multiplies the dequantized operands in fp32 (the
reference: same gradients given the same upstream gradient, forward equal up to fp32
rounding). Select with :func:`matmul_mode` (``TrainConfig.cpu_matmul``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from torch import nn

from tern.core.formats import get_format
from tern.train.config import CPU_BACKWARDS as BACKWARD_MODES
from tern.train.config import CPU_MATMULS as MATMUL_MODES

WEIGHT_SCALE_MIN = 1e-8
ACT_SCALE_MIN = 1e-5
QMAX = 127.0
_mode = {"matmul": "int8", "backward": "fp32"}


@contextlib.contextmanager
def matmul_mode(mode: str, backward: str = "fp32") -> Iterator[None]:
    """Within the block, CPU training BitLinear forwards use ``mode`` ("int8": exact int8
    product of the codes, the default; "fp32": dequantized fp32 product) and, in mode
    "int8", their backward products ``backward`` ("fp32", the default, or "bf16":
    :class:`tern.train.model.quant_numba.Int8MatmulSTE`)."""
    if mode not in MATMUL_MODES:
        raise ValueError(f"matmul mode must be one of {MATMUL_MODES}, got {mode!r}")
    if backward not in BACKWARD_MODES:
        raise ValueError(f"backward mode must be one of {BACKWARD_MODES}, got {backward!r}")
    before = dict(_mode)
    _mode.update(matmul=mode, backward=backward)
    try:
        yield
    finally:
        _mode.update(before)


class Operand(NamedTuple):
    """A prepared BitLinear operand: an input (..., n, in) or a weight (..., out, in).

    values: training: dequantized (straight-through gradient); eval: integer codes as
    float; full-precision formats: the tensor itself.
    scale: eval only: a (..., n, 1) or s (..., out, 1).
    codes, code_scale: CPU float32 training only: int8 codes of ``values`` and their row
    scales (a / 127 or s), ``values == codes * code_scale`` exactly."""

    values: torch.Tensor
    scale: torch.Tensor | None = None
    codes: torch.Tensor | None = None
    code_scale: torch.Tensor | None = None

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Operand:
        """``fn`` (a row gather, an index over experts) applied to every tensor."""
        return Operand(*(fn(t) if t is not None else None for t in self))

    def parts(self, fn: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]) -> list[Operand]:
        """``fn`` (split, unbind) applied to every tensor, regrouped into operands."""
        cut = [fn(t) if t is not None else None for t in self]
        return [Operand(*(c[i] if c is not None else None for c in cut)) for i in range(len(cut[0]))]


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Parameter-free RMS normalisation over the last axis: x / sqrt(mean(x**2) + eps)."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def weight_ternary(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ternary codes and per-row scales of ``w`` (..., out, in): (Wt (..., out, in), s (..., out, 1))."""
    s = w.abs().mean(-1, keepdim=True).clamp(min=WEIGHT_SCALE_MIN)  # (..., out, 1)
    wt = torch.round(w / s).clamp(-1, 1)  # (..., out, in)
    return wt, s


def act_int8(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Int8 codes (as float) and per-token scales of ``u`` (..., in): (q (..., in), a (..., 1))."""
    a = u.abs().amax(-1, keepdim=True).clamp(min=ACT_SCALE_MIN)  # (..., 1)
    q = torch.round(u * QMAX / a).clamp(-QMAX, QMAX)  # (..., in)
    return q, a


class _STEWeight(torch.autograd.Function):
    """Forward: Wt * s (dequantized ternary weight); backward: identity (STE)."""

    @staticmethod
    def forward(ctx, w):  # noqa: D102
        wt, s = weight_ternary(w)
        return wt * s

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        return g


class _STEAct(torch.autograd.Function):
    """Forward: q * a / 127 (dequantized int8 activation); backward: identity (STE)."""

    @staticmethod
    def forward(ctx, u):  # noqa: D102
        q, a = act_int8(u)
        return q * (a / QMAX)

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        return g


def quant_weight(w: torch.Tensor) -> torch.Tensor:
    """Dequantized ternary weight with a straight-through gradient (fused numba kernel on
    CPU float32, torch ops elsewhere)."""
    from tern.train.model import quant_numba

    if quant_numba.usable(w):
        return quant_numba.ste_weight_cpu(w)
    return _STEWeight.apply(w)


def quant_input(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS-normalised, int8-quantized (dequantized) input; straight-through rounding,
    the RMS normalisation is differentiated exactly (fused numba kernels on CPU float32)."""
    from tern.train.model import quant_numba

    if quant_numba.usable(x):
        return quant_numba.quant_input_cpu(x, eps)
    return _STEAct.apply(rms_normalize(x, eps))


def prepare_input(x: torch.Tensor, eps: float, training: bool, ternary: bool = True) -> Operand:
    """The quantized input of a BitLinear, computed once and shared by every matrix that
    reads the same x (gate and up, all experts of a layer).

    training: dequantized q * a / 127 with STE (plus the int8 codes on CPU float32); eval:
    q (..., in) integer codes as float and a (..., 1); ``ternary=False`` (a full-precision
    group format): x. Rows can be gathered (MoE dispatch, :meth:`Operand.map`) before
    :func:`qmatmul`."""
    if not ternary:
        return Operand(x)
    if training:
        from tern.train.model import quant_numba

        if quant_numba.usable(x):
            return _codes_operand(quant_numba.quant_input_codes_cpu(x, eps))
        return Operand(quant_input(x, eps))
    return Operand(*act_int8(rms_normalize(x, eps)))


def prepare_weight(w: torch.Tensor, training: bool, ternary: bool = True) -> Operand:
    """training: dequantized Wt * s with STE (plus the ternary codes as int8 and s on CPU
    float32); eval: Wt and s (..., out, 1); ``ternary=False``: w, a plain full-precision
    matrix."""
    if not ternary:
        return Operand(w)
    if training:
        from tern.train.model import quant_numba

        if quant_numba.usable(w):
            return _codes_operand(quant_numba.ste_weight_codes_cpu(w))
        return Operand(quant_weight(w))
    return Operand(*weight_ternary(w))


def _codes_operand(vcs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> Operand:
    values, codes, code_scale = vcs
    return Operand(values, None, codes, code_scale)


def qmatmul(xin: Operand, win: Operand) -> torch.Tensor:
    """BitLinear product of a prepared input (..., n, in) and a prepared weight (..., out, in)
    (leading axes batch, e.g. experts).

    Eval computes the literal inference form: an integer dot product, then the two scales
    ``s_r * (a / 127) * acc`` (exact in fp32 while in * 127 < 2**24). CPU training with
    codes and a 2-D weight does the same on the int8 codes in matmul mode "int8"."""
    x, a, xq, xc = xin
    w, s, wq, wc = win
    if xq is not None and wq is not None and wq.dim() == 2 and _mode["matmul"] == "int8":
        from tern.train.model.quant_numba import Int8MatmulSTE

        bf16 = _mode["backward"] == "bf16"
        if x.dim() == 2:
            return Int8MatmulSTE.apply(x, w, xq, xc, wq, wc, bf16)  # (n, out)
        lead, k = x.shape[:-1], x.shape[-1]
        y = Int8MatmulSTE.apply(x.reshape(-1, k), w, xq.reshape(-1, k), xc.reshape(-1, 1), wq, wc, bf16)
        return y.view(*lead, w.shape[0])  # (..., out)
    acc = _eval_int_product(x, w) if a is not None else None
    if acc is None:
        acc = x @ w.transpose(-1, -2)  # (..., out)
    if a is None:
        return acc
    return s.squeeze(-1).unsqueeze(-2) * (a / QMAX) * acc  # (..., 1, out) * (..., n, 1) * acc


def _eval_int_product(q: torch.Tensor, wt: torch.Tensor) -> torch.Tensor | None:
    """Eval's integer dot products q (..., n, in) @ Wt (out, in).T (integer codes held as
    float) by ``torch._int_mm`` (int8 x int8 -> int32, VNNI) on CPU: the same integers as
    the fp32 product (exact while in * 127 < 2**24), so the result is bit-identical to it.
    None where it does not apply (a batched weight, not CPU, small or odd
    shapes, under autograd): the caller multiplies in fp32."""
    k = q.shape[-1]
    if (wt.dim() != 2 or q.device.type != "cpu" or torch.is_grad_enabled() or k * 127 >= 2**24
            or q.dtype != torch.float32 or q.numel() // k <= 16 or k % 8 or wt.shape[0] % 8):
        return None
    acc = torch._int_mm(q.reshape(-1, k).to(torch.int8), wt.to(torch.int8).t())  # (n, out) int32
    return acc.to(torch.float32).view(*q.shape[:-1], wt.shape[0])


class _Bf16BackwardProduct(torch.autograd.Function):
    """y = x @ w.T in fp32 (the forward unchanged); the backward's two products take bf16
    operands (the upstream gradient, w and x each rounded to 8 significant bits) with fp32
    accumulation (AVX512-BF16 where the CPU has it), returned in fp32."""

    @staticmethod
    def forward(ctx, x, w):  # noqa: D102
        # x: (n, in); w: (out, in)
        ctx.save_for_backward(x, w)
        return x.mm(w.t())  # (n, out)

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        x, w = ctx.saved_tensors
        bf = torch.bfloat16
        gb = g.to(bf)  # (n, out)
        gx = gb.mm(w.to(bf)).float() if ctx.needs_input_grad[0] else None  # (n, in)
        gw = gb.t().mm(x.to(bf)).float() if ctx.needs_input_grad[1] else None  # (out, in)
        return gx, gw


def dense_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (..., in) @ w (out, in).T for the model's full-precision output head. In CPU float32
    training in matmul mode "int8" with the bf16 backward (:func:`matmul_mode`,
    ``TrainConfig.cpu_matmul`` / ``cpu_backward``) its two backward products run in bf16 as
    BitLinear's do (the forward stays fp32: the logits and the loss are unchanged);
    everywhere else, the "fp32" reference mode included, the plain fp32 product."""
    if (_mode["matmul"] == "int8" and _mode["backward"] == "bf16" and torch.is_grad_enabled()
            and (x.requires_grad or w.requires_grad)):
        from tern.train.model import quant_numba

        if quant_numba.usable(x, w):
            lead = x.shape[:-1]
            return _Bf16BackwardProduct.apply(x.reshape(-1, x.shape[-1]), w).view(*lead, w.shape[0])
    return x @ w.t()


def bitlinear(x: torch.Tensor, w: torch.Tensor, eps: float, training: bool,
              ternary: bool = True) -> torch.Tensor:
    """y = BitLinear(x; w): x (..., in), w (out, in) -> (..., out); with ``ternary=False``
    a plain full-precision product x @ w.T."""
    return qmatmul(prepare_input(x, eps, training, ternary), prepare_weight(w, training, ternary))


def is_ternary(fmt: str) -> bool:
    """Whether a weight format (tern.core.formats) makes its group's matrices BitLinear; other
    formats (fp32, fp16, bf16, int8, q4) train as full-precision matrices."""
    return get_format(fmt).ternary


class BitLinear(nn.Module):
    """A bias-free ternary linear layer (state_dict key: ``weight`` (out, in)); with
    ``ternary=False`` a plain full-precision one (for non-ternary group formats)."""

    def __init__(self, in_features: int, out_features: int, eps: float, init_std: float = 0.02,
                 ternary: bool = True):
        super().__init__()
        self.in_features, self.out_features, self.eps = in_features, out_features, eps
        self.ternary = ternary
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.normal_(self.weight, std=init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        return bitlinear(x, self.weight, self.eps, self.training, self.ternary)

    def extra_repr(self) -> str:
        kind = "ternary, int8 act" if self.ternary else "full precision"
        return f"in={self.in_features}, out={self.out_features}, {kind}"


class RMSNorm(nn.Module):
    """RMSNorm(x; g) = x / sqrt(mean(x**2) + eps) * g (state_dict key: ``weight`` (D,))."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., D)
        return rms_normalize(x, self.eps) * self.weight
