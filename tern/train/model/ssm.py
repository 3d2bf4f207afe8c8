"""Mamba-1 style selective diagonal SSM mixer (docs/MODEL.md, "SSM mixer").

Parallel form for training / prompt processing (:meth:`SSMMixer.forward`, chunked or
fused scan from ``scan``) and an O(1)-state one-token form for decoding
(:meth:`SSMMixer.step`); the two agree to float tolerance.
Decode state per layer: ``h`` (B, Di, N) fp32 and ``conv`` (B, Di, K-1), the last K-1
inputs of the causal convolution. CPU training runs the convolution + SiLU as one fused
kernel (``conv_numba``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tern.core.config import ModelConfig
from tern.train.model.scan import selective_scan
from tern.train.model.ternary import BitLinear, is_ternary


def _fused_training(param: torch.Tensor, *ts: torch.Tensor) -> bool:
    """Whether this call trains ``param`` with a fused numba kernel: gradients on, ``param``
    trainable and every tensor CPU float32 outside autocast (quant_numba.usable)."""
    if not (torch.is_grad_enabled() and param.requires_grad):
        return False
    from tern.train.model import quant_numba

    return quant_numba.usable(param, *ts)


class _Conv(nn.Module):
    """Causal depthwise convolution parameters: weight (Di, K), bias (Di,)."""

    def __init__(self, channels: int, k: int):
        super().__init__()
        bound = 1 / math.sqrt(k)
        self.weight = nn.Parameter(torch.empty(channels, k).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(channels).uniform_(-bound, bound))


class _DtProj(nn.Module):
    """fp32 projection dtl (R,) -> dt pre-activation (Di,): weight (Di, R), bias (Di,)."""

    def __init__(self, rank: int, channels: int, dt_min: float = 1e-3, dt_max: float = 0.1):
        super().__init__()
        std = rank ** -0.5
        self.weight = nn.Parameter(torch.empty(channels, rank).uniform_(-std, std))
        # Mamba init: softplus(bias) log-uniform in [dt_min, dt_max]
        dt = torch.exp(torch.rand(channels) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        self.bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus


class SSMMixer(nn.Module):
    def __init__(self, cfg: ModelConfig, out_std: float = 0.02):
        super().__init__()
        D, Di, N, R, K = cfg.d_model, cfg.d_inner, cfg.d_state, cfg.dt_rank_eff, cfg.d_conv
        self.d_inner, self.d_state, self.dt_rank, self.d_conv = Di, N, R, K
        eps, tern = cfg.norm_eps, is_ternary(cfg.mixer_format)
        self.in_proj = BitLinear(D, 2 * Di, eps, ternary=tern)
        self.conv = _Conv(Di, K)
        self.x_proj = BitLinear(Di, R + 2 * N, eps, ternary=tern)
        self.dt_proj = _DtProj(R, Di)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32)).repeat(Di, 1))
        self.D = nn.Parameter(torch.ones(Di))
        self.out_proj = BitLinear(Di, D, eps, init_std=out_std, ternary=tern)
        self.scan_impl = "auto"

    def _proj(self, uc: torch.Tensor):
        # uc: (..., Di) -> dt (..., Di), B (..., N), C (..., N)
        dbc = self.x_proj(uc)  # (..., R + 2N)
        dtl, Bm, Cm = torch.split(dbc, [self.dt_rank, self.d_state, self.d_state], dim=-1)
        w, b = self.dt_proj.weight, self.dt_proj.bias
        if _fused_training(w, dtl, b):  # CPU float32 training: one fused kernel
            from tern.train.model import ssm_numba

            return ssm_numba.dt_proj_softplus(dtl, w, b), Bm, Cm  # (..., Di)
        dt = F.softplus(F.linear(dtl, w, b))  # (..., Di)
        return dt, Bm, Cm

    def forward(self, x: torch.Tensor, state: dict | None = None,
                need_state: bool = True) -> tuple[torch.Tensor, dict | None]:
        """x (B, T, D) -> (out (B, T, D), final decode state or None without ``need_state``).
        ``state`` continues a sequence."""
        nb, nt, _ = x.shape
        K = self.d_conv
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (B, T, Di) each
        tail = state["conv"] if state is not None else u.new_zeros(nb, self.d_inner, K - 1)
        uc = self._conv(u, tail)  # (B, T, Di)
        dt, Bm, Cm = self._proj(uc)
        A = -torch.exp(self.A_log)  # (Di, N)
        h0 = state["h"] if state is not None else None
        f32 = [t.float().contiguous() for t in (uc, dt, Bm, Cm)]  # the scan runs in fp32 (autocast)
        y, hT = selective_scan(f32[0], f32[1], A, f32[2], f32[3], h0,
                               impl=self.scan_impl)  # (B, T, Di), (B, Di, N)
        out = self.out_proj(self._skip_gate(y, uc, z))  # (B, T, D)
        if not need_state:
            return out, None
        last = torch.cat([tail, u.transpose(1, 2)], dim=2)[:, :, nt:]  # (B, Di, K-1) last inputs
        return out, {"h": hT.detach(), "conv": last.detach()}

    def _skip_gate(self, y: torch.Tensor, uc: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """(y + D * uc) * silu(z), all (B, T, Di); one fused kernel when training on CPU float32."""
        if _fused_training(self.D, y, uc, z):
            from tern.train.model import ssm_numba

            return ssm_numba.skip_gate(y, uc, z, self.D)
        return (y + self.D * uc) * F.silu(z)

    def _conv(self, u: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
        """silu(causal depthwise conv) of u (B, T, Di) after the K-1 inputs ``tail``
        (B, Di, K-1) -> (B, T, Di); fused numba kernels when training on CPU float32 (eval
        keeps torch's conv1d, whose rounding the one-token step form follows closely)."""
        w, bias = self.conv.weight, self.conv.bias
        if _fused_training(w, u, tail, bias):
            from tern.train.model import conv_numba

            return conv_numba.causal_conv_silu(u, tail, w, bias)
        upad = torch.cat([tail, u.transpose(1, 2)], dim=2)  # (B, Di, K-1+T)
        uc = F.conv1d(upad, w.unsqueeze(1), bias, groups=self.d_inner)
        return F.silu(uc).transpose(1, 2).contiguous()

    def init_state(self, batch: int, device=None) -> dict:
        return {"h": torch.zeros(batch, self.d_inner, self.d_state, device=device),
                "conv": torch.zeros(batch, self.d_inner, self.d_conv - 1, device=device)}

    def step(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One token: x (B, D) -> out (B, D); state {"h": (B, Di, N), "conv": (B, Di, K-1)}."""
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (B, Di)
        win = torch.cat([state["conv"], u.unsqueeze(-1)], dim=-1)  # (B, Di, K)
        uc = F.silu((win * self.conv.weight).sum(-1) + self.conv.bias)  # (B, Di)
        dt, Bm, Cm = self._proj(uc)  # (B, Di), (B, N), (B, N)
        A = -torch.exp(self.A_log)  # (Di, N)
        h = torch.exp(dt.unsqueeze(-1) * A) * state["h"] + (dt * uc).unsqueeze(-1) * Bm.unsqueeze(1)
        y = (h @ Cm.unsqueeze(-1)).squeeze(-1) + self.D * uc  # (B, Di)
        out = self.out_proj(y * F.silu(z))  # (B, D)
        return out, {"h": h, "conv": win[:, :, 1:]}
