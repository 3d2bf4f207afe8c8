"""Toward 10B: pick a ~10B-total ternary MoE that the roofline says reaches a target tok/s
on a host, build it with ``random_model`` and measure it (notebook 08).

The search space keeps the per-token fixed costs small, because at 100 tok/s a token may
read only ~1/100 of the bandwidth: the BPE-4096 vocabulary (int8 tied embedding/head,
8 MiB per token instead of 65 MiB for a 32k vocabulary), int8 routers, and few
sliding-window attention layers with a 256-position window (the fp32 cache of a 1024
window costs 8 KiB x d_model per attention layer per token), and the SSM dt projections in fp16
(ModelConfig.dt_format: at d_model 2048-2560 their fp32 weights are ~13 % of a token's bytes;
fp16 moved the logits by ~1e-6 of their range in tests/run/test_engine.py and decoded 7-14 %
faster on the Zen 4 VM, benchmarks/format_ab.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from tern.core.config import ModelConfig
from tern.core.host_profile import HostProfile
from tern.predict.design import Candidate, SearchSpace, search
from tern.predict.roofline import predict

TEN_B_SPACE = SearchSpace(
    d_model=(1024, 1536, 2048, 2560), n_layers=(8, 12, 16, 24), n_experts=(64, 128, 256, 512),
    top_k=(1, 2, 4, 8), expert_hidden_ratio=(0.25, 0.5, 1.0), vocab_size=4096, attn_every=8,
    attn_window=256, embed_format="int8", router_format="int8", dt_format="fp16",
)


def pick_10b(host: HostProfile, target_tok_per_s: float = 100.0, threads: int | tuple[int, ...] = 1,
             total_params: float = 10e9, tolerance: float = 0.1, margin: float = 1.1,
             space: SearchSpace = TEN_B_SPACE) -> tuple[Candidate, int, bool]:
    """The searched config of ``total_params`` (± ``tolerance``) with the most active params
    whose predicted tok/s is at least ``margin`` x the target (the margin absorbs the
    roofline's error), over the given thread count(s). Returns (candidate, threads, True);
    when no config qualifies, the fastest config in the range, its best thread count and
    False, so the caller can show which roof stops it."""
    if not 0 < tolerance < 1 or margin < 1:
        raise ValueError(f"need 0 < tolerance < 1 and margin >= 1, got {tolerance}, {margin}")
    ts = (threads,) if isinstance(threads, int) else tuple(threads)
    if not ts or any(t < 1 for t in ts):
        raise ValueError(f"threads must be >= 1, got {threads!r}")
    lo, hi = total_params * (1 - tolerance), total_params * (1 + tolerance)
    # one prediction per (config in range, thread count); then qualify or fall back
    every = [(c, t) for t in ts for c in search(host, 1e-9, threads=t, space=space,
                                                 total_params_range=(lo, hi))]
    if not every:
        raise ValueError(f"the search space has no config of {total_params / 1e9:.1f}B (±{tolerance:.0%})"
                         " that fits this host's RAM")
    ok = [(c, t) for c, t in every if c.tok_per_s >= target_tok_per_s * margin]
    if ok:
        c, t = max(ok, key=lambda ct: (ct[0].active_params, ct[0].tok_per_s))
        return c, t, True
    c, t = max(every, key=lambda ct: ct[0].tok_per_s)
    return c, t, False


def scaled_down(cfg: ModelConfig, factor: int = 64) -> ModelConfig:
    """The same recipe with ``factor`` x fewer routed experts (at least top_k): a small
    stand-in for smoke runs that keeps the per-token shape."""
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    return replace(cfg, name=f"{cfg.name}-div{factor}", n_experts=max(cfg.top_k, cfg.n_experts // factor))


def roof_table(cfg: ModelConfig, hosts: dict[str, HostProfile], threads: dict[str, list[int]],
               target_tok_per_s: float = 100.0) -> list[dict[str, Any]]:
    """Predicted tok/s and the roof that stops each pool, per host and thread count;
    ``shortfall`` is the fraction of ``target_tok_per_s`` missing (0 when reached)."""
    rows = []
    for label, host in hosts.items():
        for t in threads[label]:
            p = predict(cfg, host, threads=t)
            rows.append({"host": label, "threads": t, "predicted_tok_per_s": p.tok_per_s,
                         "bound": p.bound, "resident_bytes": p.resident.bytes_per_token,
                         "resident_bound": p.resident.bound, "resident_s": p.resident.time_s,
                         "streamed_bytes": p.streamed.bytes_per_token,
                         "streamed_bound": p.streamed.bound, "streamed_s": p.streamed.time_s,
                         "overhead_s": p.overhead_s,
                         "shortfall": max(0.0, 1.0 - p.tok_per_s / target_tok_per_s)
                         if math.isfinite(p.tok_per_s) else 0.0})
    return rows
