"""The two pools of one model: resident and streamed params, bytes and working sets."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from tern.core.config import ModelConfig, param_counts, tensor_specs
from tern.core.formats import tensor_bytes
from tern.kernels.policy import B3_MODES, CURRENT_POLICY, EnginePolicy, b3_direct
from tern.predict.inventory import Work, work_inventory


@dataclass(frozen=True)
class TwoPool:
    """Bytes and ops per decoded token of the two pools, plus the streamed pool's
    working set. ``*_ops`` map a weight format (or ``"fp32"`` for element-wise work) to
    ops per token (a multiply-add counts 2); an empty map skips the compute roof."""

    name: str
    resident_bytes: int  # weights read every token
    streamed_bytes: int  # routed experts of one token
    expert_bytes_total: int  # all routed experts: the streamed pool's reuse set
    state_bytes: int = 0  # recurrent state read per token
    kv_bytes: int = 0  # attention cache read per token at the current context
    total_bytes: int = 0  # every stored weight byte (RAM footprint of the weights)
    total_params: int = 0
    active_params: int = 0
    resident_ops: dict[str, float] = field(default_factory=dict)
    streamed_ops: dict[str, float] = field(default_factory=dict)
    # engine work per token (tern.predict.inventory.work_inventory; empty: not counted) and the
    # bytes per token the activation skip is expected to leave unread
    resident_work: Work = field(default_factory=dict)
    streamed_work: Work = field(default_factory=dict)
    resident_skipped_bytes: float = 0.0
    streamed_skipped_bytes: float = 0.0

    def __post_init__(self) -> None:
        for n in ("resident_bytes", "streamed_bytes", "expert_bytes_total", "state_bytes",
                  "kv_bytes", "total_bytes", "total_params", "active_params", "resident_skipped_bytes",
                  "streamed_skipped_bytes"):
            v = getattr(self, n)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"TwoPool {self.name!r}: {n} must be a finite number >= 0, got {v!r}")
        if self.streamed_bytes > self.expert_bytes_total:
            raise ValueError(f"TwoPool {self.name!r}: streamed_bytes {self.streamed_bytes} exceeds "
                             f"expert_bytes_total {self.expert_bytes_total}")
        if self.resident_skipped_bytes > self.resident_bytes or self.streamed_skipped_bytes > self.streamed_bytes:
            raise ValueError(f"TwoPool {self.name!r}: skipped bytes exceed the pool's bytes")
        if self.resident_bytes + self.streamed_bytes <= 0:
            raise ValueError(f"TwoPool {self.name!r}: no bytes are read per token")

    @property
    def footprint_bytes(self) -> int:
        """Distinct bytes touched by one token (the resident pool's reuse distance)."""
        return self.resident_bytes + self.streamed_bytes + self.state_bytes + self.kv_bytes

    @property
    def hot_bytes(self) -> int:
        """The whole hot model: resident core + all experts + state + kv."""
        return self.resident_bytes + self.expert_bytes_total + self.state_bytes + self.kv_bytes


def decoded_context(tokens: int | None, window: int) -> int | None:
    """Mean attention positions per token of a run of ``tokens`` decoded from a reset state
    with a window of ``window``: token i (from 0) attends over min(i + 1, window) cached
    positions, and a token's attention time and cache bytes are linear in them, so the run's
    mean time per token is the time at this mean (rounded to a whole position). What a
    prediction compared with such a run must price (tern.measure.sweep and the probe's engine
    runs decode 64 / 128 tokens from a reset; a full window is the steady state of a long
    generation, the default of :func:`two_pool`). ``tokens`` None (a row that does not say):
    None, which every prediction reads as a full window."""
    if tokens is None:
        return None
    for name, v in (("tokens", tokens), ("window", window)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    n = min(tokens, window)  # tokens 0 .. n-1 see 1 .. n positions, the rest a full window
    total = n * (n + 1) // 2 + (tokens - n) * window
    return (2 * total + tokens) // (2 * tokens)  # round half up


def two_pool(cfg: ModelConfig, context: int | None = None, llc_bytes: int | None = None,
             engine_policy: EnginePolicy = CURRENT_POLICY, router_table: bool | None = None) -> TwoPool:
    """The pools of ``cfg`` at ``context`` positions of attention cache (None: a full
    window, the steady state of a long generation); ``llc_bytes`` (see
    :func:`engine_llc_bytes`) decides which matrices the engine streams, ``engine_policy``
    which it splits over threads (a measured row's own: EnginePolicy.of_record); ``router_table``:
    count int8 routers at 4 bytes a weight (None: where the engine read them as an fp32 table,
    engines before EnginePolicy.router_int8; tern.predict.roofline.router_table_bytes also for
    profiles that priced them so). Counts come from
    :func:`tern.core.config.param_counts`; ops count 2 per weight read (multiply-add), plus
    the SSM scan (~6 fp32 ops per state element) and attention over the window."""
    if context is None:
        context = cfg.attn_window
    if not isinstance(context, int) or context < 0:
        raise ValueError(f"context must be an integer >= 0, got {context!r}")
    pc = param_counts(cfg)
    g = {k: v.params for k, v in pc.by_group.items()}
    res_ops: dict[str, float] = {}

    def add(fmt: str, ops: float) -> None:
        if ops:
            res_ops[fmt] = res_ops.get(fmt, 0.0) + ops

    add(cfg.mixer_format, 2.0 * g.get("mixer", 0))
    add(cfg.mlp_format, 2.0 * (g.get("mlp", 0) + g.get("shared", 0)))
    head_fmt, head_params = ((cfg.embed_format, g.get("embed", 0)) if cfg.tie_embeddings
                             else (cfg.head_format, g.get("head", 0)))
    add(head_fmt, 2.0 * head_params)
    n_ssm = sum(cfg.mixer(i) == "ssm" for i in range(cfg.n_layers))
    n_attn = cfg.n_layers - n_ssm
    window = min(context, cfg.attn_window)
    add(cfg.router_format, 2.0 * g.get("router", 0))
    add("fp32", 2.0 * (g.get("mixer_aux", 0) + g.get("norm", 0))
        + 6.0 * n_ssm * cfg.d_inner * cfg.d_state + 4.0 * n_attn * cfg.d_model * window)
    st_ops = {cfg.expert_format: 2.0 * pc.streamed.params} if pc.streamed.params else {}
    if engine_policy.blocked and b3_read_as_stored(cfg, "auto", llc_bytes):  # layout "auto" then reads rows
        engine_policy = replace(engine_policy, blocked=False)
    res_work, st_work, skip_res, skip_st = work_inventory(cfg, context, llc_bytes, engine_policy)
    table = (not engine_policy.router_int8) if router_table is None else router_table
    extra_res, extra_st = engine_extra_bytes(cfg, llc_bytes=llc_bytes, router_int8=not table)
    return TwoPool(cfg.name, pc.resident.bytes + extra_res, pc.streamed.bytes + extra_st, pc.expert_bytes_total,
                   pc.state_bytes, pc.kv_bytes(context, cfg), pc.total.bytes, pc.total.params,
                   pc.active.params, res_ops, st_ops, res_work, st_work,
                   min(skip_res, pc.resident.bytes), min(skip_st, pc.streamed.bytes))


def b3_read_as_stored(cfg: ModelConfig, b3: str = "auto", llc_bytes: int | None = None) -> bool:
    """Does the engine (its ``b3`` option; "auto": tern.kernels.policy.b3_direct with ``llc_bytes``) read
    ``cfg``'s base-3 matrices as stored? False for a model without any."""
    if "ternary_b3" not in (cfg.mixer_format, cfg.mlp_format, cfg.expert_format):  # no base-3 group: none
        return False
    return any(s.format == "ternary_b3" for s in tensor_specs(cfg)) and (
        b3 == "direct" or (b3 == "auto" and b3_direct(cfg, llc_bytes)))


def engine_extra_bytes(cfg: ModelConfig, dense16: str = "direct", b3: str = "auto",
                       llc_bytes: int | None = None, router_int8: bool = True) -> tuple[int, int]:
    """(resident, streamed) bytes per token the engine reads beyond the file's active bytes
    (tern.core.config.param_counts), where tern.run.engine converts at load: int8 routers
    are read as stored by today's engine (``router_int8``, EnginePolicy.router_int8: a row at
    a time dequantized into an L1 scratch row) and as an fp32 table by engines before it
    (``router_int8=False``: 3 more bytes a weight), base-3 ternary matrices as
    ternary2 unless the engine reads them as stored (``b3``: the engine's option, "auto"
    resolved with the last-level cache of ``llc_bytes`` as tern.kernels.policy.b3_direct
    does), and with ``dense16="expand"`` (the engine's option; default "direct" reads
    them as stored) fp16 / bf16 embedding and head rows and routers as fp32."""
    if b3 not in B3_MODES:
        raise ValueError(f"b3 must be one of {B3_MODES}, got {b3!r}")
    expand = dense16 == "expand"
    res = st = 0
    specs = tensor_specs(cfg)
    b3_stored = b3_read_as_stored(cfg, b3, llc_bytes)
    for s in specs:
        if s.group in ("embed", "head") and s.format in ("fp16", "bf16") and expand:
            V, D = s.shape
            if s.group == "head":
                res += V * D * 2  # the whole head at 4 bytes, not 2
            elif cfg.tie_embeddings:  # the head reads the table at 4 bytes; the row its own copy
                res += V * D * 2 + D * 4
            else:
                res += D * 2  # one row at 4 bytes, not 2
        elif s.group == "router" and ((s.format == "int8" and not router_int8)
                                      or (expand and s.format in ("fp16", "bf16"))):
            res += s.numel * 4 - tensor_bytes(s.format, s.shape)
        elif s.format == "ternary_b3" and not b3_stored:
            grow = tensor_bytes("ternary2", s.shape) - tensor_bytes(s.format, s.shape)
            if s.pool == "streamed":
                st += round(cfg.top_k / s.shape[0] * grow)
            else:
                res += grow
    return res, st


def two_pool_from_params(total_params: float, active_params: float, bits_per_weight: float,
                         n_experts: int | None = None, top_k: int | None = None,
                         resident_params: float | None = None, name: str = "abstract",
                         fmt: str | None = None) -> TwoPool:
    """An abstract two-pool model (no ModelConfig): every weight at ``bits_per_weight``.

    Give either ``n_experts`` and ``top_k`` (then all experts X and resident R solve
    R + X = total, R + X * top_k / n_experts = active) or ``resident_params`` directly.
    ``fmt`` names the kernel family for the compute roof (None: memory roofs only).
    """
    if not (total_params > 0 and active_params > 0 and bits_per_weight > 0):
        raise ValueError("total_params, active_params and bits_per_weight must be > 0")
    if active_params > total_params * (1 + 1e-9):
        raise ValueError(f"active_params {active_params:.4g} exceeds total_params {total_params:.4g}")
    if resident_params is None:
        if not n_experts or not top_k or not 1 <= top_k <= n_experts:
            raise ValueError("give resident_params, or n_experts >= top_k >= 1")
        if top_k == n_experts:
            if not math.isclose(total_params, active_params, rel_tol=1e-9):
                raise ValueError("top_k == n_experts makes every expert active: total must equal active")
            experts = 0.0
        else:
            experts = (total_params - active_params) / (1 - top_k / n_experts)
        resident_params = total_params - experts
        if resident_params < 0:
            raise ValueError(
                f"{n_experts} experts with top-{top_k} cannot reach total {total_params:.3g} at "
                f"active {active_params:.3g}: the experts alone would be {experts:.3g} params; "
                "use more experts or a smaller top-k")
    if not 0 <= resident_params <= active_params * (1 + 1e-9):
        raise ValueError(f"resident_params must be in 0..active_params, got {resident_params:.4g}")
    bpw = bits_per_weight / 8
    streamed = max(active_params - resident_params, 0.0)
    experts = total_params - resident_params
    ops_r = {fmt: 2.0 * resident_params} if fmt else {}
    ops_s = {fmt: 2.0 * streamed} if fmt and streamed else {}
    return TwoPool(name, math.ceil(resident_params * bpw), math.ceil(streamed * bpw), math.ceil(experts * bpw),
                   0, 0, round(total_params * bpw), round(total_params), round(active_params), ops_r, ops_s)
