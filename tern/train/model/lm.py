"""The tern language model in torch, built from a ModelConfig (docs/MODEL.md, "Whole model").

    x = embed.weight[token]
    for layer i: x = x + Mixer_i(RMSNorm(x; norm1)); x = x + FFN_i(RMSNorm(x; norm2))
    logits = Head(RMSNorm(x; norm_f))              # Head = embed.weight when tied

``state_dict()`` keys and shapes are exactly ``tern.core.config.tensor_specs(cfg)``.
``forward`` runs whole sequences (training, prompts); ``step`` decodes one token per
batch row with the O(1) SSM state and the attention ring buffer.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from tern.core.config import ModelConfig, tensor_specs
from tern.train.model.attention import SlidingWindowAttention
from tern.train.model.mlp import GatedMLP
from tern.train.model.moe import MoE
from tern.train.model.ssm import SSMMixer
from tern.train.model.ternary import RMSNorm, dense_product


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, i: int):
        super().__init__()
        out_std = 0.02 / math.sqrt(2 * cfg.n_layers)
        self.norm1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mixer = (SlidingWindowAttention(cfg, out_std) if cfg.mixer(i) == "attn"
                      else SSMMixer(cfg, out_std))
        self.ffn: nn.Module | None = None
        if cfg.is_moe(i) or cfg.mlp_hidden:
            self.norm2 = RMSNorm(cfg.d_model, cfg.norm_eps)  # registered first: canonical order
            self.ffn = MoE(cfg, out_std) if cfg.is_moe(i) else GatedMLP(cfg, out_std)

    def forward(self, x: torch.Tensor, state: dict | None = None,
                need_state: bool = True) -> tuple[torch.Tensor, dict | None]:
        m, new_state = self.mixer(self.norm1(x), state, need_state)  # (B, T, D)
        x = x + m
        if self.ffn is not None:
            x = x + self.ffn(self.norm2(x))
        return x, new_state

    def step(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        m, new_state = self.mixer.step(self.norm1(x), state)  # (B, D)
        x = x + m
        if self.ffn is not None:
            x = x + self.ffn(self.norm2(x).unsqueeze(1)).squeeze(1)
        return x, new_state


class TernLM(nn.Module):
    def __init__(self, cfg: ModelConfig, seed: int | None = None):
        super().__init__()
        if seed is not None:
            torch.manual_seed(seed)
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm_f = RMSNorm(cfg.d_model, cfg.norm_eps)
        if not cfg.tie_embeddings:
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            nn.init.normal_(self.head.weight, std=0.02)

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """The parameters in the canonical order and names of ``tensor_specs(cfg)``."""
        sd = super().state_dict(prefix=prefix, keep_vars=keep_vars)
        ordered = OrderedDict((prefix + s.name, sd[prefix + s.name]) for s in tensor_specs(self.cfg))
        if len(ordered) != len(sd):
            extra = sorted(set(sd) - set(ordered))
            raise RuntimeError(f"model tensors not in tensor_specs: {extra}")
        ordered._metadata = getattr(sd, "_metadata", None)
        if destination is not None:
            destination.update(ordered)
            return destination
        return ordered

    def head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.cfg.tie_embeddings else self.head.weight  # (V, D)

    def _check_tokens(self, tokens: torch.Tensor) -> None:
        if tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"token ids must be int32/int64, got {tokens.dtype}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.cfg.vocab_size):
            raise ValueError(f"token ids must be in 0..{self.cfg.vocab_size - 1}")

    def forward(self, tokens: torch.Tensor, state: list[dict] | None = None,
                return_state: bool = False):
        """tokens (B, T) -> logits (B, T, V) [, decode state after the last position].
        ``state`` (from :meth:`init_state` or a previous call) continues sequences.
        After a training-mode call, :meth:`aux_losses` holds the MoE losses."""
        if tokens.dim() != 2:
            raise ValueError(f"forward expects tokens of shape (B, T), got {tuple(tokens.shape)}")
        self._check_tokens(tokens)
        x = self.embed(tokens.long())  # (B, T, D)
        states = []
        for i, layer in enumerate(self.layers):
            x, st = layer(x, state[i] if state is not None else None, return_state)
            states.append(st)
        logits = dense_product(self.norm_f(x), self.head_weight())  # (B, T, V)
        return (logits, states) if return_state else logits

    def aux_losses(self) -> dict[str, torch.Tensor]:
        """Mean over MoE layers of the balance and z losses of the last training forward."""
        aux = [layer.ffn.aux for layer in self.layers if isinstance(layer.ffn, MoE) and layer.ffn.aux]
        if not aux:
            z = torch.zeros((), device=self.embed.weight.device)
            return {"balance": z, "z": z}
        return {k: torch.stack([a[k] for a in aux]).mean() for k in ("balance", "z")}

    def init_state(self, batch: int) -> list[dict]:
        dev = self.embed.weight.device
        return [layer.mixer.init_state(batch, device=dev) for layer in self.layers]

    @torch.no_grad()
    def step(self, token_ids: torch.Tensor, state: list[dict]) -> tuple[torch.Tensor, list[dict]]:
        """One decode step: token_ids (B,) -> (logits (B, V), new state)."""
        if token_ids.dim() != 1:
            raise ValueError(f"step expects token ids of shape (B,), got {tuple(token_ids.shape)}")
        self._check_tokens(token_ids)
        if len(state) != len(self.layers):
            raise ValueError(f"state has {len(state)} layers, the model {len(self.layers)}")
        x = self.embed(token_ids.long())  # (B, D)
        new = []
        for layer, st in zip(self.layers, state, strict=True):
            x, s2 = layer.step(x, st)
            new.append(s2)
        return self.norm_f(x) @ self.head_weight().t(), new

    # ---- statistics ---------------------------------------------------------------------
    def reset_stats(self) -> None:
        for layer in self.layers:
            f = layer.ffn
            if f is None:
                continue
            f.stats.reset()
            if isinstance(f, MoE):
                f.shared_stats.reset()
                f.load.reset()

    def sparsity(self) -> list[dict]:
        """Per layer: fraction of exact zeros in FFN hidden activations since reset_stats()."""
        out = []
        for i, layer in enumerate(self.layers):
            f = layer.ffn
            row = {"layer": i, "kind": "none" if f is None else ("moe" if isinstance(f, MoE) else "mlp")}
            if f is not None:
                row["zero_frac"] = f.stats.fraction
                if isinstance(f, MoE):
                    row["shared_zero_frac"] = f.shared_stats.fraction
            out.append(row)
        return out

    def expert_load(self) -> list[dict]:
        """Per MoE layer: assignments per expert, max/mean, min/mean and dead experts."""
        return [{"layer": i, **layer.ffn.load.summary()} for i, layer in enumerate(self.layers)
                if isinstance(layer.ffn, MoE)]


def build_model(cfg: ModelConfig, seed: int | None = 0, device: str | torch.device | None = None) -> TernLM:
    """A freshly initialised model (deterministic for a given seed)."""
    if device is not None and torch.device(device).type == "meta":
        with torch.device("meta"):
            return TernLM(cfg)
    m = TernLM(cfg, seed=seed)
    return m.to(device) if device is not None else m
