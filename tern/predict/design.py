"""Design search: which models decode at a target tok/s on a host, within its RAM?

:func:`search` enumerates real :class:`~tern.core.config.ModelConfig` objects (d_model,
layers, routed experts, top-k, expert hidden) over a :class:`SearchSpace`, predicts each
with :func:`tern.predict.roofline.predict`, keeps those that reach the target and fit in RAM,
and ranks them by total params. :func:`active_budget_for` answers the direct question:
for a model of N total params in a format, how many bytes (and params) may a token read
to reach the target, and which searched config of about that total comes closest.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any

from tern.core.config import DT_FORMATS, ModelConfig
from tern.core.formats import get_format
from tern.core.host_profile import HostProfile
from tern.predict.pools import two_pool_from_params
from tern.predict.roofline import Prediction, predict, predict_pools


@dataclass(frozen=True)
class SearchSpace:
    """The grid the search enumerates; every combination is one ModelConfig.

    Backbone recipe: SSM layers with a sliding-window attention layer every
    ``attn_every`` layers (heads of ``head_dim``), an MoE in every layer with
    ``n_shared`` shared experts of hidden ``shared_ratio * d_model``, expert hidden
    ``ratio * d_model`` for each ratio in ``expert_hidden_ratio``; tied embeddings in
    ``embed_format``, routers in ``router_format``, the SSM dt projections in ``dt_format`` (the
    format under search applies to the linear layers)."""

    d_model: tuple[int, ...] = (1024, 1536, 2048, 2560, 3072)
    n_layers: tuple[int, ...] = (12, 16, 24, 32)
    n_experts: tuple[int, ...] = (32, 64, 128, 256)
    top_k: tuple[int, ...] = (1, 2, 4, 8)
    expert_hidden_ratio: tuple[float, ...] = (0.25, 0.5, 1.0)
    n_shared: int = 1
    shared_ratio: float = 0.5
    vocab_size: int = 32000
    attn_every: int = 6
    attn_window: int = 1024
    head_dim: int = 128
    d_state: int = 16
    embed_format: str = "int8"
    router_format: str = "int8"
    dt_format: str = "fp32"  # the SSM dt projections' weights (ModelConfig.dt_format)

    def __post_init__(self) -> None:
        for n in ("d_model", "n_layers", "n_experts", "top_k"):
            v = getattr(self, n)
            if not v or not all(isinstance(i, int) and i >= 1 for i in v):
                raise ValueError(f"SearchSpace.{n} must be a non-empty tuple of integers >= 1, got {v!r}")
        if not self.expert_hidden_ratio or not all(r > 0 for r in self.expert_hidden_ratio):
            raise ValueError(f"SearchSpace.expert_hidden_ratio must be ratios > 0, got {self.expert_hidden_ratio!r}")
        if any(d % self.head_dim for d in self.d_model):
            raise ValueError(f"every d_model must be a multiple of head_dim {self.head_dim}")
        if self.attn_every < 1 or self.n_shared < 0 or self.shared_ratio < 0:
            raise ValueError("attn_every must be >= 1, n_shared and shared_ratio >= 0")
        get_format(self.embed_format)
        if self.dt_format not in DT_FORMATS:
            raise ValueError(f"SearchSpace.dt_format must be one of {DT_FORMATS}, got {self.dt_format!r}")

    def configs(self, fmt: str = "ternary2"):
        """Yield every valid ModelConfig of the grid with linear layers in ``fmt``."""
        get_format(fmt)
        for d in self.d_model:
            for L in self.n_layers:
                for E in self.n_experts:
                    for k in self.top_k:
                        if k > E:
                            continue
                        for r in self.expert_hidden_ratio:
                            yield self.make(d, L, E, k, max(1, round(r * d)), fmt)

    @property
    def size(self) -> int:
        n = sum(1 for E in self.n_experts for k in self.top_k if k <= E)
        return len(self.d_model) * len(self.n_layers) * n * len(self.expert_hidden_ratio)

    def make(self, d_model: int, n_layers: int, n_experts: int, top_k: int, expert_hidden: int,
             fmt: str = "ternary2") -> ModelConfig:
        attn = tuple(range(self.attn_every - 1, n_layers, self.attn_every))
        shared = max(1, round(self.shared_ratio * d_model)) if self.n_shared else 0
        return ModelConfig(
            name=f"d{d_model}-L{n_layers}-E{n_experts}k{top_k}-h{expert_hidden}",
            vocab_size=self.vocab_size, d_model=d_model, n_layers=n_layers, attn_layers=attn,
            n_heads=d_model // self.head_dim, attn_window=self.attn_window, d_state=self.d_state,
            mlp_hidden=0, moe_layers=tuple(range(n_layers)), n_experts=n_experts, top_k=top_k,
            expert_hidden=expert_hidden, n_shared=self.n_shared, shared_hidden=shared,
            mixer_format=fmt, mlp_format=fmt, expert_format=fmt, embed_format=self.embed_format,
            head_format=self.embed_format, router_format=self.router_format, dt_format=self.dt_format,
        )


@dataclass(frozen=True)
class Candidate:
    config: ModelConfig
    prediction: Prediction
    ram_needed_bytes: int  # weights + recurrent state + attention cache

    @property
    def total_params(self) -> int:
        return self.prediction.total_params

    @property
    def active_params(self) -> int:
        return self.prediction.active_params

    @property
    def tok_per_s(self) -> float:
        return self.prediction.tok_per_s

    def row(self) -> dict[str, Any]:
        c = self.config
        return {"name": c.name, "d_model": c.d_model, "n_layers": c.n_layers, "n_experts": c.n_experts,
                "top_k": c.top_k, "expert_hidden": c.expert_hidden, "total_params": self.total_params,
                "active_params": self.active_params, "active_bytes": self.prediction.active_bytes,
                "ram_needed_bytes": self.ram_needed_bytes, "tok_per_s": self.tok_per_s,
                "bound": self.prediction.bound}


def host_ram_bytes(host: HostProfile) -> int:
    """RAM of the host: the profile's ``host["ram_bytes"]``, else this machine's."""
    v = host.host.get("ram_bytes") if isinstance(host.host, dict) else None
    if isinstance(v, (int, float)) and v > 0:
        return int(v)
    import psutil

    return int(psutil.virtual_memory().total)


def search(host: HostProfile, target_tok_per_s: float, ram_bytes: int | None = None,
           fmt: str = "ternary2", threads: int = 1, space: SearchSpace | None = None,
           context: int | None = None, policy: str = "reuse",
           total_params_range: tuple[float, float] | None = None,
           progress: bool = False) -> list[Candidate]:
    """Configs of ``space`` predicted at >= ``target_tok_per_s`` that fit ``ram_bytes``
    (default: the host's RAM), ranked by total params (then tok/s), largest first.
    ``total_params_range`` (lo, hi) keeps only totals inside it."""
    if not (target_tok_per_s > 0 and math.isfinite(target_tok_per_s)):
        raise ValueError(f"target_tok_per_s must be > 0, got {target_tok_per_s!r}")
    space = space or SearchSpace()
    ram = host_ram_bytes(host) if ram_bytes is None else int(ram_bytes)
    if ram <= 0:
        raise ValueError(f"ram_bytes must be > 0, got {ram_bytes!r}")
    lo, hi = total_params_range or (0, math.inf)
    it = space.configs(fmt)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, total=space.size, desc="design search", unit="config", file=sys.stderr)
    out = []
    for cfg in it:
        p = predict(cfg, host, threads, context, policy=policy)
        need = p.total_bytes + p.state_bytes + p.kv_bytes
        if p.tok_per_s >= target_tok_per_s and need <= ram and lo <= p.total_params <= hi:
            out.append(Candidate(cfg, p, need))
    out.sort(key=lambda c: (-c.total_params, -c.tok_per_s))
    return out


@dataclass(frozen=True)
class Budget:
    """How many bytes a token may read to decode at the target, for one thread count."""

    target_tok_per_s: float
    total_params: float
    fmt: str
    threads: int
    host_label: str
    active_bytes_max: int  # bytes read per token (weights, state and cache) at the target
    active_params_max: int  # the same as weights in ``fmt`` (no state or cache)
    bandwidth_gbps: float  # bandwidth the streamed pool gets at that budget
    config: ModelConfig | None  # the searched config of ~total_params with most active params
    prediction: Prediction | None
    n_candidates: int  # searched configs of ~total_params that reach the target
    notes: tuple[str, ...] = field(default=())

    def row(self) -> dict[str, Any]:
        return {"threads": self.threads, "target_tok_per_s": self.target_tok_per_s,
                "total_params": self.total_params, "format": self.fmt,
                "active_bytes_max": self.active_bytes_max, "active_params_max": self.active_params_max,
                "bandwidth_gbps": self.bandwidth_gbps, "n_candidates": self.n_candidates,
                "config": self.config.name if self.config else None,
                "config_active_params": self.prediction.active_params if self.prediction else None,
                "config_total_params": self.prediction.total_params if self.prediction else None,
                "config_tok_per_s": self.prediction.tok_per_s if self.prediction else None}


def active_budget_for(host: HostProfile, target_tok_per_s: float, total_params: float,
                      fmt: str = "ternary2", threads: int = 1, resident_fraction: float = 0.75,
                      policy: str = "reuse", space: SearchSpace | None = None,
                      tolerance: float = 0.2, ram_bytes: int | None = None) -> Budget:
    """The largest active bytes / params per token that reach ``target_tok_per_s`` for a
    model of ``total_params`` total in ``fmt``, and the searched config that uses most.

    The budget comes from the abstract two-pool model (every weight in ``fmt``, a
    ``resident_fraction`` of the active bytes resident), by bisection on the active bytes
    (tok/s falls monotonically with them). The config comes from :func:`search`
    restricted to totals within ``total_params * (1 ± tolerance)``; ``space=False``
    skips the search."""
    f = get_format(fmt)
    if not (total_params > 0 and 0 <= resident_fraction <= 1 and tolerance >= 0):
        raise ValueError("total_params must be > 0, resident_fraction in 0..1, tolerance >= 0")

    def pred(active: float) -> Prediction:
        pools = two_pool_from_params(total_params, active, f.bits_per_weight,
                                     resident_params=resident_fraction * active, fmt=fmt)
        return predict_pools(pools, host, threads, policy)

    lo, hi = 1.0, float(total_params)  # active params
    notes = []
    if pred(lo).tok_per_s < target_tok_per_s:
        hi = 0.0
        notes.append("the target is out of reach even at one active parameter (overhead)")
    elif pred(hi).tok_per_s >= target_tok_per_s:
        lo = hi
        notes.append("every parameter may be active (a dense model reaches the target)")
    else:
        for _ in range(60):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if pred(mid).tok_per_s >= target_tok_per_s else (lo, mid)
            if hi / lo < 1 + 1e-6:
                break
    active = lo if hi else 0.0
    p = pred(active) if active else None
    best, n = None, 0
    if space is False:
        notes.append("config search skipped")
    else:
        cands = search(host, target_tok_per_s, ram_bytes, fmt, threads, space or SearchSpace(), None, policy,
                       (total_params / (1 + tolerance), total_params * (1 + tolerance)))
        n = len(cands)
        if cands:
            best = max(cands, key=lambda c: (c.active_params, c.tok_per_s))
        else:
            notes.append(f"no searched config within ±{tolerance:.0%} of the total reaches the target")
    return Budget(target_tok_per_s, total_params, fmt, threads, host.label,
                  int(p.active_bytes) if p else 0, int(active), p.streamed.bandwidth_gbps if p else 0.0,
                  best.config if best else None, best.prediction if best else None, n, tuple(notes))


def budgets_by_threads(host: HostProfile, target_tok_per_s: float, total_params: float,
                       fmt: str = "ternary2", threads: tuple[int, ...] = (1,), **kw: Any) -> list[Budget]:
    """:func:`active_budget_for` at each thread count: the 'with how many threads' answer."""
    return [active_budget_for(host, target_tok_per_s, total_params, fmt, t, **kw) for t in threads]


def render_budgets(budgets: list[Budget]) -> str:
    if not budgets:
        return "(no budgets)"
    b0 = budgets[0]
    lines = [f"{b0.total_params / 1e9:.3g}B total in {b0.fmt} at {b0.target_tok_per_s:g} tok/s on "
             f"{b0.host_label}",
             f"  {'thr':>3} {'max MB/token':>12} {'max active':>11} {'GB/s':>7} {'found':>5}  best config "
             f"(total, active, tok/s)"]
    for b in budgets:
        cfg = "-"
        if b.config is not None and b.prediction is not None:
            q = b.prediction
            cfg = (f"{b.config.name} ({q.total_params / 1e9:.2f}B, {q.active_params / 1e6:.0f}M, "
                   f"{q.tok_per_s:.0f})")
        lines.append(f"  {b.threads:>3} {b.active_bytes_max / 1e6:>12.1f} {b.active_params_max / 1e6:>10.0f}M "
                     f"{b.bandwidth_gbps:>7.1f} {b.n_candidates:>5}  {cfg}")
        lines += [f"      note: {n}" for n in b.notes]
    lines.append("  max MB/token: bytes read per token (weights, state, cache); max active: the same as "
                 "weights in the format")
    return "\n".join(lines)


def headlines(rows: list[dict[str, Any]], budgets: dict[str, list[Budget]]) -> dict[str, float]:
    """Headline figures (name with unit -> value) from :func:`tern.predict.tables.predict_table`
    rows and {host key: budgets}: predicted tok/s per preset, host and threads, and the
    active budget (MB per token) per host and threads."""
    out: dict[str, float] = {}
    for r in rows:
        key = r["host"].lower().replace(" ", "_")
        out[f"{r['config']}_{key}_{r['threads']}t_tok_per_s"] = round(float(r["tok_per_s"]), 1)
    for key, bs in budgets.items():
        k = key.lower().replace(" ", "_")
        for b in bs:
            tag = f"{b.total_params / 1e9:g}b_{b.target_tok_per_s:g}tps_{k}_{b.threads}t"
            out[f"{tag}_active_budget_mb"] = round(b.active_bytes_max / 1e6, 1)
    return out


# ---- CLI: tern design --------------------------------------------------------------------


