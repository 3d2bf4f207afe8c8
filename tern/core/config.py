"""ModelConfig: the one description of a model shared by roofline, torch model, exporter
and engine, plus the one place where parameters are counted.

The exact forward computation the config describes is written down in
``docs/MODEL.md``. :func:`tensor_specs` lists every stored tensor with its canonical
name, shape, group, pool and format; the torch model's ``state_dict`` keys and the packed
file's tensor names are these names, and :func:`param_counts` sums over this list.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from tern.core.formats import get_format, tensor_bytes

MIXERS = ("ssm", "attn")
ACTIVATIONS = ("drelu", "relu2", "silu")
# Groups of tensors; each has its own configurable weight format where it is a matrix.
GROUPS = ("embed", "head", "norm", "mixer", "mixer_aux", "mlp", "shared", "router", "experts")
POOLS = ("table", "resident", "streamed")
DT_FORMATS = ("fp32", "fp16")  # ModelConfig.dt_format; the other norm / SSM aux tensors are always fp32


def dataclass_from_dict(cls: Any, d: Any) -> Any:
    """``cls(**d)`` for a config dataclass, with a clear error for a non-dict or unknown keys."""
    if not isinstance(d, dict):
        raise ValueError(f"{cls.__name__} must be built from a dict, got {type(d).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys: {unknown}; known keys: {sorted(known)}")
    return cls(**d)


@dataclass(frozen=True)
class ModelConfig:
    """Shape and storage of a ternary hybrid SSM / attention / MoE language model.

    Sizes are counts (not bytes). Layers listed in ``attn_layers`` use sliding-window
    attention, all others the selective SSM. Layers in ``moe_layers`` use a mixture of
    ``n_shared`` always-on experts (hidden ``shared_hidden``) plus ``n_experts`` routed
    experts (hidden ``expert_hidden``, ``top_k`` chosen per token); the other layers use a
    dense gated MLP of hidden ``mlp_hidden`` (0: no MLP in that layer).
    """

    name: str = "custom"
    vocab_size: int = 1024
    d_model: int = 256
    n_layers: int = 4
    # mixers
    attn_layers: tuple[int, ...] = ()
    n_heads: int = 4
    attn_window: int = 128
    d_state: int = 16
    expand: int = 2
    d_conv: int = 4
    dt_rank: int = 0  # 0: ceil(d_model / 16)
    # feed-forward
    mlp_hidden: int = 512
    activation: str = "drelu"
    moe_layers: tuple[int, ...] = ()
    n_experts: int = 0
    top_k: int = 0
    expert_hidden: int = 0
    n_shared: int = 0
    shared_hidden: int = 0
    # storage formats per tensor group (norms and the other SSM aux params stay fp32)
    mixer_format: str = "ternary2"
    mlp_format: str = "ternary2"
    expert_format: str = "ternary2"
    embed_format: str = "fp32"
    head_format: str = "fp32"
    router_format: str = "fp32"  # fp32 | fp16 | bf16 | int8 (stored; routing math is fp32)
    dt_format: str = "fp32"  # the SSM dt projection's weights: fp32 | fp16 (stored; the scan's math is fp32)
    tie_embeddings: bool = True
    # bookkeeping
    max_seq_len: int = 256  # training context length (decode context is unbounded)
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        errors = []

        def pos(name: str, allow_zero: bool = False) -> None:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if allow_zero else 1):
                errors.append(f"{name} must be an integer {'>= 0' if allow_zero else '>= 1'}, got {v!r}")

        for n in ("vocab_size", "d_model", "n_layers", "n_heads", "attn_window", "d_state",
                  "expand", "d_conv", "max_seq_len"):
            pos(n)
        for n in ("dt_rank", "mlp_hidden", "n_experts", "top_k", "expert_hidden", "n_shared",
                  "shared_hidden"):
            pos(n, allow_zero=True)
        # tuples may arrive as lists from JSON
        for n in ("attn_layers", "moe_layers"):
            v = getattr(self, n)
            if isinstance(v, list):
                object.__setattr__(self, n, tuple(v))
            v = getattr(self, n)
            if not isinstance(v, tuple) or not all(isinstance(i, int) for i in v):
                errors.append(f"{n} must be a tuple of layer indices, got {v!r}")
            elif isinstance(self.n_layers, int):
                bad = [i for i in v if not 0 <= i < self.n_layers]
                if bad:
                    errors.append(f"{n} has indices outside 0..{self.n_layers - 1}: {bad}")
                if len(set(v)) != len(v):
                    errors.append(f"{n} has repeated layer indices: {v}")
        if not errors:
            if self.attn_layers and self.d_model % self.n_heads:
                errors.append(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
            if self.activation not in ACTIVATIONS:
                errors.append(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
            if self.moe_layers:
                if self.n_experts < 1 or self.expert_hidden < 1:
                    errors.append("moe_layers needs n_experts >= 1 and expert_hidden >= 1")
                if not 1 <= self.top_k <= max(self.n_experts, 1):
                    errors.append(f"top_k must be in 1..n_experts={self.n_experts}, got {self.top_k}")
                if self.n_shared and self.shared_hidden < 1:
                    errors.append("n_shared > 0 needs shared_hidden >= 1")
            for n in ("mixer_format", "mlp_format", "expert_format", "embed_format", "head_format",
                      "router_format"):
                try:
                    get_format(getattr(self, n))
                except ValueError as e:
                    errors.append(f"{n}: {e}")
            for n in ("embed_format", "head_format", "router_format"):
                if getattr(self, n) not in ("fp32", "fp16", "bf16", "int8"):
                    errors.append(f"{n} must be fp32, fp16, bf16 or int8, got {getattr(self, n)!r}")
            if self.dt_format not in DT_FORMATS:
                errors.append(f"dt_format must be one of {DT_FORMATS}, got {self.dt_format!r}")
            if self.tie_embeddings and self.head_format != self.embed_format:
                errors.append("tie_embeddings needs head_format == embed_format")
            if not (isinstance(self.norm_eps, float) and 0 < self.norm_eps < 1):
                errors.append(f"norm_eps must be a float in (0, 1), got {self.norm_eps!r}")
        if errors:
            raise ValueError(f"invalid ModelConfig {self.name!r}: " + "; ".join(errors))

    # ---- derived sizes -------------------------------------------------------------
    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def dt_rank_eff(self) -> int:
        return self.dt_rank or math.ceil(self.d_model / 16)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def mixer(self, layer: int) -> str:
        return "attn" if layer in self.attn_layers else "ssm"

    def is_moe(self, layer: int) -> bool:
        return layer in self.moe_layers

    # ---- (de)serialisation -----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["attn_layers"] = list(self.attn_layers)
        d["moe_layers"] = list(self.moe_layers)
        if d["dt_format"] == "fp32":  # the format before dt_format existed: configs (and their hashes) as they were
            del d["dt_format"]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        return dataclass_from_dict(cls, d)

    @classmethod
    def from_json(cls, s: str) -> ModelConfig:
        return cls.from_dict(json.loads(s))

    def replace(self, **overrides: Any) -> ModelConfig:
        """A copy with ``overrides`` applied (unknown keys are an error)."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig keys: {unknown}")
        return dataclasses.replace(self, **overrides)


# ---- tensors: the single source of names, shapes and pools ---------------------------
@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    group: str  # one of GROUPS
    pool: str  # "table" (embedding: one row per token), "resident", "streamed"
    format: str  # storage format name
    layer: int = -1  # -1 for embedding, final norm and head

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.format, self.shape)


def tensor_specs(cfg: ModelConfig) -> list[TensorSpec]:
    """Every stored tensor of the model, in canonical order (see docs/MODEL.md)."""
    D, V = cfg.d_model, cfg.vocab_size
    specs: list[TensorSpec] = [TensorSpec("embed.weight", (V, D), "embed", "table", cfg.embed_format)]

    def add(name: str, shape: tuple[int, ...], group: str, layer: int, pool: str = "resident",
            fmt: str | None = None) -> None:  # fmt: the group's format unless given
        fmt = fmt or {"mixer": cfg.mixer_format, "mlp": cfg.mlp_format, "shared": cfg.mlp_format,
                      "experts": cfg.expert_format, "router": cfg.router_format}.get(group, "fp32")
        specs.append(TensorSpec(name, shape, group, pool, fmt, layer))

    for i in range(cfg.n_layers):
        p = f"layers.{i}"
        add(f"{p}.norm1.weight", (D,), "norm", i)
        if cfg.mixer(i) == "ssm":
            Di, N, R, K = cfg.d_inner, cfg.d_state, cfg.dt_rank_eff, cfg.d_conv
            add(f"{p}.mixer.in_proj.weight", (2 * Di, D), "mixer", i)
            add(f"{p}.mixer.conv.weight", (Di, K), "mixer_aux", i)
            add(f"{p}.mixer.conv.bias", (Di,), "mixer_aux", i)
            add(f"{p}.mixer.x_proj.weight", (R + 2 * N, Di), "mixer", i)
            add(f"{p}.mixer.dt_proj.weight", (Di, R), "mixer_aux", i, fmt=cfg.dt_format)
            add(f"{p}.mixer.dt_proj.bias", (Di,), "mixer_aux", i)
            add(f"{p}.mixer.A_log", (Di, N), "mixer_aux", i)
            add(f"{p}.mixer.D", (Di,), "mixer_aux", i)
            add(f"{p}.mixer.out_proj.weight", (D, Di), "mixer", i)
        else:
            add(f"{p}.mixer.qkv.weight", (3 * D, D), "mixer", i)
            add(f"{p}.mixer.out_proj.weight", (D, D), "mixer", i)
        if cfg.is_moe(i):
            add(f"{p}.norm2.weight", (D,), "norm", i)
            add(f"{p}.ffn.router.weight", (cfg.n_experts, D), "router", i)
            if cfg.n_shared:
                S, Hs = cfg.n_shared, cfg.shared_hidden
                add(f"{p}.ffn.shared.gate", (S, Hs, D), "shared", i)
                add(f"{p}.ffn.shared.up", (S, Hs, D), "shared", i)
                add(f"{p}.ffn.shared.down", (S, D, Hs), "shared", i)
            E, He = cfg.n_experts, cfg.expert_hidden
            add(f"{p}.ffn.experts.gate", (E, He, D), "experts", i, "streamed")
            add(f"{p}.ffn.experts.up", (E, He, D), "experts", i, "streamed")
            add(f"{p}.ffn.experts.down", (E, D, He), "experts", i, "streamed")
        elif cfg.mlp_hidden:
            H = cfg.mlp_hidden
            add(f"{p}.norm2.weight", (D,), "norm", i)
            add(f"{p}.ffn.gate.weight", (H, D), "mlp", i)
            add(f"{p}.ffn.up.weight", (H, D), "mlp", i)
            add(f"{p}.ffn.down.weight", (D, H), "mlp", i)
    specs.append(TensorSpec("norm_f.weight", (D,), "norm", "resident", "fp32"))
    if not cfg.tie_embeddings:
        specs.append(TensorSpec("head.weight", (V, D), "head", "resident", cfg.head_format))
    return specs


@dataclass(frozen=True)
class PoolCounts:
    params: int = 0
    bytes: int = 0

    def __add__(self, o: PoolCounts) -> PoolCounts:
        return PoolCounts(self.params + o.params, self.bytes + o.bytes)


@dataclass(frozen=True)
class ParamCounts:
    """Parameter and byte counts of a model.

    total: every stored parameter. resident: read for every token (one embedding row,
    mixers, dense MLPs, shared experts, routers, norms, head). streamed: the routed
    experts of one token (top_k per MoE layer). active = resident + streamed.
    ``per_layer[i]`` holds the same split for layer i; ``state_bytes`` is the fp32
    recurrent decode state (SSM state + conv tail), and ``kv_bytes_per_position`` the
    attention cache growth per context position (up to the window).
    """

    total: PoolCounts
    resident: PoolCounts
    streamed: PoolCounts
    per_layer: tuple[dict[str, PoolCounts], ...] = field(repr=False)
    by_group: dict[str, PoolCounts] = field(repr=False)
    state_bytes: int = 0
    kv_bytes_per_position: int = 0
    expert_bytes_total: int = 0  # all routed experts: the streamed pool's working set

    @property
    def active(self) -> PoolCounts:
        return self.resident + self.streamed

    def kv_bytes(self, context: int, cfg: ModelConfig) -> int:
        """Attention cache bytes at ``context`` positions (capped by the window)."""
        return self.kv_bytes_per_position * min(max(context, 0), cfg.attn_window)

    def summary(self) -> dict[str, int]:
        return {
            "total_params": self.total.params, "total_bytes": self.total.bytes,
            "active_params": self.active.params, "active_bytes": self.active.bytes,
            "resident_params": self.resident.params, "resident_bytes": self.resident.bytes,
            "streamed_params": self.streamed.params, "streamed_bytes": self.streamed.bytes,
            "expert_bytes_total": self.expert_bytes_total, "state_bytes": self.state_bytes,
            "kv_bytes_per_position": self.kv_bytes_per_position,
        }


def param_counts(cfg: ModelConfig) -> ParamCounts:
    """Count parameters and bytes per pool, per layer and per group (see ParamCounts)."""
    total = resident = streamed = PoolCounts()
    per_layer = [dict(resident=PoolCounts(), streamed=PoolCounts(), total=PoolCounts())
                 for _ in range(cfg.n_layers)]
    by_group: dict[str, PoolCounts] = {}
    expert_bytes = 0
    for s in tensor_specs(cfg):
        full = PoolCounts(s.numel, s.nbytes)
        total = total + full
        by_group[s.group] = by_group.get(s.group, PoolCounts()) + full
        if s.pool == "table":
            # tied: the head reads the whole table every token (the embedding row is
            # part of the same parameters); untied: one embedding row per token
            rows = s.shape[0] if cfg.tie_embeddings else 1
            resident = resident + PoolCounts(rows * s.shape[1], tensor_bytes(s.format, (rows, s.shape[1])))
            continue
        if s.pool == "streamed":
            expert_bytes += full.bytes
            E = s.shape[0]
            one = PoolCounts(s.numel // E * cfg.top_k, tensor_bytes(s.format, (cfg.top_k, *s.shape[1:])))
            streamed = streamed + one
        else:
            one = full
            resident = resident + one
        if s.layer >= 0:
            pl = per_layer[s.layer]
            pl[s.pool] = pl[s.pool] + one
            pl["total"] = pl["total"] + full
    n_ssm = sum(cfg.mixer(i) == "ssm" for i in range(cfg.n_layers))
    state = n_ssm * cfg.d_inner * (cfg.d_state + cfg.d_conv - 1) * 4
    kv = len(cfg.attn_layers) * 2 * cfg.d_model * 4
    return ParamCounts(total, resident, streamed, tuple(per_layer), by_group, state, kv, expert_bytes)


# ---- presets ---------------------------------------------------------------------------
PRESETS: dict[str, ModelConfig] = {}


def _preset(cfg: ModelConfig) -> ModelConfig:
    PRESETS[cfg.name] = cfg
    return cfg


# ~8.3M total / ~4.8M active: the sandbox — Mamba-style SSM blocks, one sliding-window
# attention layer (window 128), granular MoE in every layer (16 experts x hidden 64,
# top-4) beside one shared expert.
SANDBOX = _preset(ModelConfig(
    name="sandbox", vocab_size=1024, d_model=256, n_layers=6, attn_layers=(3,), n_heads=4,
    attn_window=128, d_state=16, expand=2, d_conv=4, mlp_hidden=0, activation="drelu",
    moe_layers=tuple(range(6)), n_experts=16, top_k=4, expert_hidden=64, n_shared=1,
    shared_hidden=192,
))
# ~30M total / ~11M active: the model the reference project trained on 2x T4.
M30 = _preset(ModelConfig(
    name="30m", vocab_size=1024, d_model=384, n_layers=8, attn_layers=(4,), n_heads=6,
    attn_window=128, d_state=16, expand=2, d_conv=4, mlp_hidden=0, activation="drelu",
    moe_layers=tuple(range(8)), n_experts=18, top_k=2, expert_hidden=128, n_shared=1,
    shared_hidden=64, max_seq_len=512,
))
# Shape-only models for the roofline and engine sweeps: equal active params, 2x total.
M105 = _preset(ModelConfig(
    name="105m", vocab_size=1024, d_model=384, n_layers=8, attn_layers=(4,), n_heads=6,
    d_state=16, mlp_hidden=0, moe_layers=tuple(range(8)), n_experts=40, top_k=2,
    expert_hidden=256, n_shared=1, shared_hidden=256, router_format="int8",
))
M206 = _preset(M105.replace(name="206m", n_experts=83))
# ~10B total, shape only: a very wide granular MoE whose per-token bytes stay small.
M10B = _preset(ModelConfig(
    name="10b", vocab_size=32000, d_model=2048, n_layers=24, attn_layers=(6, 12, 18, 23),
    n_heads=16, attn_window=1024, d_state=16, mlp_hidden=0, moe_layers=tuple(range(24)),
    n_experts=122, top_k=4, expert_hidden=512, n_shared=1, shared_hidden=1024,
    embed_format="int8", head_format="int8", router_format="int8",
))


def get_preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}") from None


def load_config(spec: str, overrides: dict[str, Any] | None = None) -> ModelConfig:
    """A preset name, or a path to a JSON config file, with optional overrides."""
    import os

    if spec in PRESETS:
        cfg = PRESETS[spec]
    elif os.path.exists(spec):
        with open(spec, encoding="utf-8") as f:
            cfg = ModelConfig.from_dict(json.load(f))
    else:
        raise ValueError(f"{spec!r} is neither a preset ({', '.join(PRESETS)}) nor a config file")
    return cfg.replace(**overrides) if overrides else cfg
