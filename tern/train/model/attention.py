"""Sliding-window causal attention without positional encoding (docs/MODEL.md).

Position t attends to positions max(0, t - W + 1) .. t; scores q.k / sqrt(head_dim),
softmax in fp32 (torch's fused causal attention when the window covers the sequence:
equal to the masked form up to fp32 rounding). Decode keeps a ring buffer of the last W keys and values
(state {"k": (B, W, H, hd), "v": (B, W, H, hd), "pos": int}).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tern.core.config import ModelConfig
from tern.train.model.ternary import BitLinear, is_ternary


def window_mask(n_q: int, n_k: int, window: int, offset: int = 0, device=None) -> torch.Tensor:
    """Boolean (n_q, n_k) mask, True where query i (at absolute position offset + i) may
    attend key j (absolute position j): offset + i - window < j <= offset + i."""
    qi = torch.arange(n_q, device=device).unsqueeze(1) + offset  # (n_q, 1)
    kj = torch.arange(n_k, device=device).unsqueeze(0)  # (1, n_k)
    return (kj <= qi) & (kj > qi - window)


class SlidingWindowAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, out_std: float = 0.02):
        super().__init__()
        D = cfg.d_model
        self.n_heads, self.head_dim, self.window = cfg.n_heads, cfg.head_dim, cfg.attn_window
        tern = is_ternary(cfg.mixer_format)
        self.qkv = BitLinear(D, 3 * D, cfg.norm_eps, ternary=tern)
        self.out_proj = BitLinear(D, D, cfg.norm_eps, init_std=out_std, ternary=tern)
        # fused causal attention (torch's SDPA kernel) when the window covers the whole
        # sequence; False: always the explicit masked softmax (the reference form)
        self.fused = True

    def _attend(self, q, k, v, mask):
        # q (B, H, Tq, hd), k/v (B, H, Tk, hd), mask (Tq, Tk) or (B, 1, 1, Tk) bool
        scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(self.head_dim)  # (B, H, Tq, Tk)
        scores = scores.masked_fill(~mask, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        return p.to(v.dtype) @ v  # (B, H, Tq, hd)

    def forward(self, x: torch.Tensor, state: dict | None = None,
                need_state: bool = True) -> tuple[torch.Tensor, dict | None]:
        """x (B, T, D) -> (out (B, T, D), ring-buffer state after the last position, or None
        without ``need_state``). ``state`` (from :meth:`init_state` or a previous call)
        continues a sequence."""
        nb, nt, D = x.shape
        H, hd, W = self.n_heads, self.head_dim, self.window
        q, k, v = self.qkv(x).view(nb, nt, 3, H, hd).unbind(2)  # (B, T, H, hd) each
        pos0 = 0
        if state is not None and state["pos"] > 0:
            pos0 = state["pos"]
            kc, vc, n_old = self._ordered_cache(state)  # (B, n_old, H, hd)
            k, v = torch.cat([kc, k], 1), torch.cat([vc, v], 1)
        else:
            n_old = 0
        if n_old == 0 and W >= nt and self.fused:  # the window holds the whole context: causal
            qf, kf, vf = (t.transpose(1, 2).float() for t in (q, k, v))  # (B, H, T, hd)
            o = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True).to(v.dtype)
        else:
            mask = window_mask(nt, n_old + nt, W, offset=n_old, device=x.device)
            o = self._attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
        out = self.out_proj(o.transpose(1, 2).reshape(nb, nt, D))
        return out, (self._state_from(k.detach(), v.detach(), pos0 + nt) if need_state else None)

    def _ordered_cache(self, state: dict):
        pos, W = state["pos"], self.window
        n = min(pos, W)
        idx = [(pos - n + i) % W for i in range(n)]  # oldest first
        return state["k"][:, idx], state["v"][:, idx], n

    def _state_from(self, k: torch.Tensor, v: torch.Tensor, pos: int) -> dict:
        # k, v: (B, n, H, hd) holding absolute positions pos - n .. pos - 1
        nb, n = k.shape[:2]
        st = self.init_state(nb, device=k.device, dtype=k.dtype)
        m = min(n, self.window)
        slots = [(pos - m + i) % self.window for i in range(m)]
        st["k"][:, slots], st["v"][:, slots] = k[:, n - m:], v[:, n - m:]
        st["pos"] = pos
        return st

    def init_state(self, batch: int, device=None, dtype=torch.float32) -> dict:
        shape = (batch, self.window, self.n_heads, self.head_dim)
        return {"k": torch.zeros(shape, device=device, dtype=dtype),
                "v": torch.zeros(shape, device=device, dtype=dtype), "pos": 0}

    def step(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One token: x (B, D) -> out (B, D); writes slot pos % W of the ring buffer."""
        nb, D = x.shape
        H, hd, W = self.n_heads, self.head_dim, self.window
        q, k, v = self.qkv(x).view(nb, 3, H, hd).unbind(1)  # (B, H, hd) each
        pos = state["pos"]
        kc, vc = state["k"].clone(), state["v"].clone()  # (B, W, H, hd)
        kc[:, pos % W], vc[:, pos % W] = k, v
        valid = torch.arange(W, device=x.device) < min(pos + 1, W)  # (W,) filled slots
        o = self._attend(q.unsqueeze(2), kc.transpose(1, 2), vc.transpose(1, 2), valid.view(1, 1, 1, W))
        out = self.out_proj(o.reshape(nb, D))
        return out, {"k": kc, "v": vc, "pos": pos + 1}
