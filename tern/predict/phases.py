"""How many phases the one-region step (tern.kernels.ops_region) walks per token, and which
SSM scans it splits over channels: counted from a ModelConfig for the predictor
(tern.predict.inventory prices the phases; the engine records the count it used, and the
tests hold the two equal)."""

from __future__ import annotations

from tern.core.config import ModelConfig
from tern.core.formats import get_format
from tern.kernels.policy import (
    REGION_ATTN_MIN_D,
    REGION_MIN_WEIGHTS,
    REGION_ROW_ALIGN,
    REGION_SCAN_ALIGN,
    REGION_SCAN_MIN_WEIGHTS,
    EnginePolicy,
    act_skip_applies,
)


def _scan_splits(cfg: ModelConfig) -> bool:
    """Is ``cfg``'s SSM scan big enough for the one-region step to split it over channels at
    2 threads (tern.kernels.region_items.scan_items, the same rule: REGION_SCAN_MIN_WEIGHTS
    of Di x (dt_rank + d_state), and at least two REGION_SCAN_ALIGN-channel ranges)?"""
    return (cfg.d_inner // REGION_SCAN_ALIGN >= 2
            and cfg.d_inner * (cfg.dt_rank_eff + cfg.d_state) >= REGION_SCAN_MIN_WEIGHTS)


def scan_split(cfg: ModelConfig, policy: EnginePolicy) -> bool:
    """Does the engine of ``policy`` split ``cfg``'s SSM scans over channels at threads > 1?"""
    return policy.region and policy.region_scan_split and _scan_splits(cfg)


def _attn_splits(cfg: ModelConfig, min_d: int = REGION_ATTN_MIN_D) -> bool:
    """Does a one-region step that splits attention from d_model ``min_d`` split ``cfg``'s heads
    over threads at 2 threads (tern.kernels.region_items.attn_items, the same rule: today's engine
    from REGION_ATTN_MIN_D, >= 2 heads)?"""
    return cfg.d_model >= min_d and cfg.n_heads >= 2


def attn_split(cfg: ModelConfig, policy: EnginePolicy) -> bool:
    """Does the engine of ``policy`` split ``cfg``'s attention heads over threads at threads > 1?"""
    return policy.region and policy.region_attn_split and _attn_splits(cfg, policy.region_attn_min_d)


def region_phases(cfg: ModelConfig, skip_split: bool, router_split: bool = False,
                  min_weights: int = REGION_MIN_WEIGHTS, scan: bool = False, attn: bool = False,
                  attn_min_d: int = REGION_ATTN_MIN_D) -> int:
    """Phases one token walks in the one-region step (tern.kernels.ops_region; it records
    the count it used, and the tests hold the two equal): the embedding; per layer the
    mixer's (an SSM 6, 7 when ``scan`` and the engine splits its scan: :func:`scan_split`;
    attention 4, 5 when ``attn`` and the engine splits its heads from d_model ``attn_min_d``:
    :func:`attn_split`) and the FFN input's norm; per gated MLP gate + up, its
    activation and, unless the activation skip runs inside that item (its plain form,
    ``skip_split`` False), the down projection; a MoE layer's router (``router_split``: a
    phase when it splits, at least ``min_weights`` weights and 17 rows) and routing, then its one chosen
    expert's MLP and the weighted add, or the chosen experts as one phase and their sum;
    a settle between shared experts; the final norm and the head."""
    def mlp(fmt: str) -> int:
        inside = get_format(fmt).ternary and act_skip_applies(cfg.activation) and not skip_split
        return 2 if inside else 3

    ssm = 6 + int(scan and _scan_splits(cfg))
    att = 4 + int(attn and _attn_splits(cfg, attn_min_d))
    n = 1
    for layer in range(cfg.n_layers):
        n += (ssm if cfg.mixer(layer) == "ssm" else att) + 1
        if cfg.is_moe(layer):
            n += cfg.n_shared * mlp(cfg.mlp_format) + max(cfg.n_shared - 1, 0) + 1
            n += int(router_split and cfg.n_experts * cfg.d_model >= min_weights and cfg.n_experts > REGION_ROW_ALIGN)
            n += (mlp(cfg.expert_format) + 1) if cfg.top_k == 1 else 2  # top-1: its MLP + the add
        elif cfg.mlp_hidden:
            n += mlp(cfg.mlp_format)
    return n + 2
