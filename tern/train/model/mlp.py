"""Gated MLP (docs/MODEL.md, "Gated MLP and experts") and its activation sparsity.

    g = gate(x); u = up(x); h = act(g, u); out = down(h)       # gate/up/down BitLinear
    drelu: relu(g) * relu(u)   relu2: relu(g)**2 * u   silu: silu(g) * u

drelu and relu2 give exact zeros in ``h``; :class:`ZeroStats` counts them per layer in
eval-mode forwards (validation), so training steps pay nothing for it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tern.core.config import ModelConfig
from tern.train.model.ternary import Operand, is_ternary, prepare_input, prepare_weight, qmatmul


def activation(name: str, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    if name == "drelu":
        return F.relu(g) * F.relu(u)
    if name == "relu2":
        return F.relu(g).square() * u
    if name == "silu":
        return F.silu(g) * u
    raise ValueError(f"unknown activation {name!r}; expected drelu, relu2 or silu")


class ZeroStats:
    """Running count of exact zeros in hidden activations (not part of the state_dict)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.zeros = 0
        self.total = 0

    def add(self, h: torch.Tensor) -> None:
        self.zeros += int((h.detach() == 0).sum())
        self.total += h.numel()

    @property
    def fraction(self) -> float | None:
        return self.zeros / self.total if self.total else None


def gated_ffn(xin, gate_up, down, hidden: int, act: str, eps: float, training: bool,
              ternary: bool, stats: ZeroStats | None = None,
              valid: torch.Tensor | None = None) -> torch.Tensor:
    """One gated MLP on a prepared input: xin (n, D), gate_up (2H, D) (gate rows then up
    rows; per-row scales make the concatenation exact) and down (D, H), all prepared by
    ``ternary.prepare_*``; leading axes batch (experts: (E, n, D) with (E, 2H, D) weights).
    ``valid`` (bool, the leading shape of the rows) marks real rows for the zero count.
    Returns (..., n, D)."""
    gu = qmatmul(xin, gate_up)  # (..., n, 2H)
    if training and ternary:
        from tern.train.model import ffn_numba, quant_numba

        if quant_numba.usable(gu):  # CPU: activation and quantization fused, one pass each way
            v, q, c = ffn_numba.gated_act_quant(gu, act, eps)  # (..., n, H), ..., (..., n, 1)
            return qmatmul(Operand(v, None, q, c), down)  # (n, D)
    h = activation(act, gu[..., :hidden], gu[..., hidden:])  # (..., n, H)
    if stats is not None and not training:  # measured in eval passes: no per-step cost
        stats.add(h if valid is None else h[valid])
    return qmatmul(prepare_input(h, eps, training, ternary), down)  # (n, D)


class _GateUpDown(nn.Module):
    def __init__(self, hidden: int, d_model: int, out_std: float):
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)
        for lin, std in ((self.gate, 0.02), (self.up, 0.02), (self.down, out_std)):
            nn.init.normal_(lin.weight, std=std)


class GatedMLP(_GateUpDown):
    """Dense gated MLP; state_dict keys gate.weight (H, D), up.weight (H, D), down.weight (D, H)."""

    def __init__(self, cfg: ModelConfig, out_std: float = 0.02):
        super().__init__(cfg.mlp_hidden, cfg.d_model, out_std)
        self.hidden, self.act, self.eps = cfg.mlp_hidden, cfg.activation, cfg.norm_eps
        self.ternary = is_ternary(cfg.mlp_format)
        self.stats = ZeroStats()
        self.aux: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # (n, D)
        tr, tern = self.training, self.ternary
        gate_up = prepare_weight(torch.cat([self.gate.weight, self.up.weight], 0), tr, tern)  # (2H, D)
        out = gated_ffn(prepare_input(x2, self.eps, tr, tern), gate_up,
                        prepare_weight(self.down.weight, tr, tern), self.hidden, self.act, self.eps,
                        tr, tern, self.stats)
        return out.view(shape)
