"""The engine's work per decoded token, counted from a ModelConfig, and its cost on a host.

:func:`work_inventory` lists, per pool (resident / streamed), how many calls, rows and
units of each engine operation one token runs (the op names and cost models of
tern.probe.ops); :func:`work_seconds` prices them with the host's measured
:class:`~tern.core.host_profile.OpCost` figures; tern.predict.stall prices what the same work
takes beyond that at a pool's working set. The roofline adds both (tern.predict.roofline,
"op-cost model").

Activation skip: the gated MLP's down projection reads only the rows of nonzero hidden
units, so its bytes and work scale with the fraction of nonzero hidden units. The inventory assumes :data:`HIDDEN_DENSITY` per activation: at random
initialisation (the sweep's random-weight models) dReLU = relu(g) * relu(u) is nonzero
for 1/4 of the units and ReLU² for 1/2; trained models are sparser (the sandbox reaches
76-84 % zeros), so for them this is conservative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from tern.core.config import ModelConfig
from tern.core.formats import get_format
from tern.core.host_profile import op_cost_for
from tern.core.host_queries import OP_WEIGHT_BYTES, ROUTER_OP
from tern.kernels.policy import (
    CURRENT_POLICY,
    REGION_ROW_ALIGN,
    SEGMENT_COLS,
    STREAM_MAX_ROW_BYTES,
    EnginePolicy,
    act_skip_applies,
    stream_row_bytes,
)
from tern.predict.phases import attn_split, region_phases, scan_split

# expected fraction of nonzero gated-MLP hidden units (see the module docstring)
HIDDEN_DENSITY = {"drelu": 0.25, "relu2": 0.5, "silu": 1.0}
PAR_SUFFIX = "@par"  # display form of a matvec split over threads (costed at the thread count)
EP_SUFFIX = "@ep"  # display form of routed-expert work run expert-parallel ("op@ep<k>")
REP_SUFFIX = "@rep"  # the same as items of the one-region step ("op@rep<k>")
IT_SUFFIX = "@it"  # display form of a matrix split into the one-region step's items ("op@it<blocks>")
SPLITS = ("serial", "rows", "experts", "region_experts", "items")
EXPERT_SPLITS = ("experts", "region_experts")


@dataclass(frozen=True)
class WorkKey:
    """One engine operation as the engine runs it at threads > 1.

    ``split``: ``"serial"`` — one thread runs it whatever the thread count; ``"rows"`` — the
    engine splits the matrix's rows over the threads (matrices of >= the policy's
    par_min_weights weights), so it is costed at the thread count; ``"experts"`` — a token's ``experts``
    chosen routed experts run expert-parallel, each on one thread with the single-thread
    kernels (tern.kernels.ops.experts_parallel): costed at 1 thread and divided by
    ``experts / ceil(experts / threads)``. The one-region step (tern.kernels.ops_region):
    ``"region_experts"`` — the same, as items of one phase (no parallel region of their
    own); ``"items"`` — the matrix split into row ranges of whole blocks (``experts``: how
    many blocks it has, 0 = any number), one range per thread, each run by the
    single-thread kernel while the others run theirs: costed at 1 thread, the call term
    paid once per matrix, the rest divided by ``n / ceil(n / threads)`` (n: the blocks, or
    the thread count). Printed as ``op``, ``op@par``, ``op@ep<k>``, ``op@rep<k>`` or
    ``op@it[<blocks>]``."""

    op: str
    split: str = "serial"
    experts: int = 0

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"WorkKey split must be one of {SPLITS}, got {self.split!r}")
        if self.split == "items":
            if self.experts < 0:
                raise ValueError(f"WorkKey {self.op!r}: an items block count must be >= 0 (0: any)")
        elif (self.split in EXPERT_SPLITS) != (self.experts > 0):
            raise ValueError(f"WorkKey {self.op!r}: experts > 0 exactly when split is one of {EXPERT_SPLITS}")

    def priced_at(self, threads: int) -> tuple[int, float]:
        """(thread count its op cost is taken at, divisor of that cost) at ``threads``."""
        if self.split in EXPERT_SPLITS or self.split == "items":
            n = self.experts or threads
            return 1, n / math.ceil(n / threads)
        return (threads if self.split == "rows" else 1), 1.0

    def __str__(self) -> str:
        if self.split in EXPERT_SPLITS:
            return f"{self.op}{EP_SUFFIX if self.split == 'experts' else REP_SUFFIX}{self.experts}"
        if self.split == "items":
            return f"{self.op}{IT_SUFFIX}{self.experts or ''}"
        return self.op + PAR_SUFFIX if self.split == "rows" else self.op

    @classmethod
    def parse(cls, text: str) -> WorkKey:
        """The key printed as ``text`` (see the class docstring)."""
        for suffix, split in ((EP_SUFFIX, "experts"), (REP_SUFFIX, "region_experts"), (IT_SUFFIX, "items")):
            if suffix in text:
                op, k = text.split(suffix)
                return cls(op, split, int(k) if k else 0)
        if text.endswith(PAR_SUFFIX):
            return cls(text[:-len(PAR_SUFFIX)], "rows")
        return cls(text)


class OpWork(NamedTuple):
    """How much of one operation a token runs: the terms of its fitted cost
    (:class:`~tern.core.host_profile.OpCost`: call + row x rows + unit x units + tail x tails
    + input x inputs)."""

    calls: float = 0.0
    rows: float = 0.0
    units: float = 0.0  # weights for matvecs, elements for vector work
    tails: float = 0.0  # rows whose last ternary segment is partial (columns not a multiple of 256)
    inputs: float = 0.0  # inputs the skip kernel lists (every hidden unit, zero or not)


Work = dict[WorkKey, OpWork]  # one pool's work per token


class WorkInventory(NamedTuple):
    """One token's engine work per pool, and the bytes the activation skip leaves unread."""

    resident: Work
    streamed: Work
    resident_skipped_bytes: float
    streamed_skipped_bytes: float


def add_work(work: Work, key: WorkKey | str, calls: float, rows: float, units: float, tails: float = 0.0,
             inputs: float = 0.0) -> None:
    key = WorkKey(key) if isinstance(key, str) else key
    w = work.get(key, OpWork())
    work[key] = OpWork(w.calls + calls, w.rows + rows, w.units + units, w.tails + tails, w.inputs + inputs)


# ops priced with another op's cost when a profile predates them (same kernel family; the int8
# router's: the head's matvec, its curves and the fp32 table's bytes, roofline.router_table_bytes;
# fp16 / bf16 matrices: the fp32 matvec's cost a weight, its curves at their bytes, curve_stall)
COST_FALLBACK = {"ternary_stream": "ternary_matvec", "ternary_blocked": "ternary_matvec", ROUTER_OP: "int8_matvec",
                 "w16_matvec": "fp32_matvec"}


def priced_op(host: Any, op: str) -> str:
    """The op whose cost prices ``op`` on ``host``: its own if timed, else its :data:`COST_FALLBACK`."""
    return COST_FALLBACK[op] if op in COST_FALLBACK and op_cost_for(host.op_costs, op, 1) is None else op


def _matvec_op(fmt: str, cols: int = 0, stream_rb: int = 0, blocked: bool = False) -> str:
    f = get_format(fmt)
    if f.ternary:
        if blocked:  # the blocked16 layout: one pass for every row-oriented ternary matrix
            return "ternary_blocked"
        stream = stream_rb and stream_rb <= (cols + 3) // 4 <= STREAM_MAX_ROW_BYTES
        return "ternary_stream" if stream else "ternary_matvec"
    if fmt == "int8":
        return "int8_matvec"
    return "w16_matvec" if f.bits_per_weight == 16 else "fp32_matvec"  # fp16 / bf16: 2 bytes a weight


def _key(op: str, weights: int, ep: int = 0, policy: EnginePolicy = CURRENT_POLICY, cap: int = 0) -> WorkKey:
    """The key of an op: expert-parallel over ``ep`` chosen experts (ep > 0), else split over
    threads when the engine (``policy``) splits a matrix of that many weights (the one-region
    step: into items, at most ``cap`` of them where the matrix has only so many pieces)."""
    if ep:
        return WorkKey(op, "region_experts" if policy.region else "experts", ep)
    if policy.region:
        return WorkKey(op, "items", cap) if 0 < weights and weights >= policy.region_min_weights else WorkKey(op)
    return WorkKey(op, "rows") if 0 < weights and weights >= policy.par_min_weights else WorkKey(op)


def experts_parallel(cfg: ModelConfig, policy: EnginePolicy = CURRENT_POLICY) -> int:
    """k when the engine runs a token's k chosen experts expert-parallel with threads > 1
    (the rule of tern.kernels.ops.experts_parallel: k >= 2 and at least
    ``policy.par_min_weights`` weights of chosen experts per layer; the one-region step:
    k >= 2 at any size), else 0."""
    k = cfg.top_k
    if policy.region:
        return k if k >= 2 else 0
    return k if k >= 2 and 3 * k * cfg.expert_hidden * cfg.d_model >= policy.par_min_weights else 0


def _matvec(work: Work, fmt: str, rows: int, cols: int, n: float = 1.0, stream_rb: int = 0, ep: int = 0,
            policy: EnginePolicy = CURRENT_POLICY, serial: bool = False, op: str | None = None) -> None:
    """``op``: the op that prices it where not the format's matvec (the int8 router's kernel)."""
    tails = n * rows if get_format(fmt).ternary and cols % SEGMENT_COLS else 0.0
    cap = -(-rows // REGION_ROW_ALIGN)  # the one-region step's items are whole 16-row blocks
    add_work(work, _key(op or _matvec_op(fmt, cols, stream_rb, policy.blocked), 0 if serial else rows * cols, ep, policy, cap),
         n, n * rows, n * rows * cols, tails)


def _gated_mlp(work: Work, cfg: ModelConfig, fmt: str, hidden: int, n: float, stream_rb: int = 0,
               ep: int = 0, policy: EnginePolicy = CURRENT_POLICY) -> float:
    """``n`` experts (or MLPs) of ``hidden`` units (``ep``: run expert-parallel, see
    :func:`experts_parallel`); returns the down-projection bytes the activation skip
    leaves unread. The engine's default runs the skip kernel only for activations with exact
    zeros (tern.kernels.policy.act_skip_applies); a SiLU down projection is a row matvec."""
    D = cfg.d_model
    _matvec(work, fmt, hidden, D, 2 * n, stream_rb, ep, policy)  # gate and up
    add_work(work, _key("vector", 0, ep, policy), n, 0, n * hidden)  # activation + quantization of the hidden vector
    rho = HIDDEN_DENSITY.get(cfg.activation, 1.0)
    f = get_format(fmt)
    if f.ternary and act_skip_applies(cfg.activation):
        tails = n * rho * hidden if D % SEGMENT_COLS else 0.0  # nonzero inputs over a partial output segment
        segments = -(-D // SEGMENT_COLS)  # the one-region step splits it over output segments (SIMD form)
        split = 0 if policy.region and not (policy.region_skip_split and segments > 1) else hidden * D
        add_work(work, _key("ternary_skip", split, ep, policy, segments), n, n * D, n * rho * hidden * D,
             tails, n * hidden)  # rows: the D outputs; inputs: every hidden unit is listed
        return (1.0 - rho) * n * hidden * D * f.bits_per_weight / 8
    _matvec(work, fmt, D, hidden, n, stream_rb, ep, policy)
    return 0.0


def work_inventory(cfg: ModelConfig, context: int | None = None, llc_bytes: int | None = None,
                   policy: EnginePolicy = CURRENT_POLICY) -> WorkInventory:
    """(resident work, streamed work, resident bytes skipped, streamed bytes skipped) of one
    token at ``context`` cached attention positions (None: a full window); ``llc_bytes``
    decides which matrices the engine streams (:func:`stream_row_bytes`), ``policy`` which
    it splits over threads."""
    ctx = cfg.attn_window if context is None else context
    D, Di, N, R = cfg.d_model, cfg.d_inner, cfg.d_state, cfg.dt_rank_eff
    srb, srb_routed = stream_row_bytes(cfg, llc_bytes, policy.stream)
    res: Work = {}
    st: Work = {}
    skip_res = skip_st = 0.0
    add_work(res, "vector", 1, 0, D)  # embedding row (int8 rows are scaled)
    for layer in range(cfg.n_layers):
        add_work(res, "vector", 1, 0, D)  # RMSNorm + quantization of the mixer input
        if cfg.mixer(layer) == "ssm":
            _matvec(res, cfg.mixer_format, 2 * Di, D, 1, srb, policy=policy)  # in_proj
            add_work(res, "vector", 3, 0, (cfg.d_conv + 2) * Di)  # conv + two quantizations
            _matvec(res, cfg.mixer_format, R + 2 * N, Di, 1, srb, policy=policy)  # x_proj
            # dt projection (Di x R) + scan (Di x N) + channels; split over channels by the one-region step
            scan = WorkKey("ssm_step", "items") if scan_split(cfg, policy) else WorkKey("ssm_step")
            add_work(res, scan, 1, Di * R, Di * N, Di)
            _matvec(res, cfg.mixer_format, D, Di, 1, srb, policy=policy)  # out_proj
        else:
            _matvec(res, cfg.mixer_format, 3 * D, D, 1, srb, policy=policy)  # q, k, v
            pos = min(ctx, cfg.attn_window)
            # units: position x d_model; tails: x heads. Split by the one-region step in items of whole heads
            attn = WorkKey("attention", "items", cfg.n_heads) if attn_split(cfg, policy) else WorkKey("attention")
            add_work(res, attn, 1, 0, pos * D, pos * cfg.n_heads)
            add_work(res, "vector", 1, 0, D)
            _matvec(res, cfg.mixer_format, D, D, 1, srb, policy=policy)  # out
        if cfg.is_moe(layer):
            add_work(res, "vector", 1, 0, D)
            if cfg.n_shared:
                skip_res += _gated_mlp(res, cfg, cfg.mlp_format, cfg.shared_hidden, cfg.n_shared, srb, policy=policy)
            # router logits (fp32 math; split by the one-region step where EnginePolicy.region_router_split):
            # int8 rows by the router kernel (op router_int8) where EnginePolicy.router_int8, else an fp32 table;
            # fp16 / bf16 rows as stored (the w16 matvec)
            router_fmt = ("int8" if policy.router_int8 else "fp32") if cfg.router_format == "int8" else cfg.router_format
            _matvec(res, router_fmt, cfg.n_experts, D, policy=policy,
                    serial=not (policy.region and policy.region_router_split),
                    op=ROUTER_OP if router_fmt == "int8" else None)
            add_work(res, "vector", 1, 0, cfg.n_experts)  # softmax + top-k
            skip_st += _gated_mlp(st, cfg, cfg.expert_format, cfg.expert_hidden, cfg.top_k, srb_routed,
                                  experts_parallel(cfg, policy), policy)
        elif cfg.mlp_hidden:
            add_work(res, "vector", 1, 0, D)
            skip_res += _gated_mlp(res, cfg, cfg.mlp_format, cfg.mlp_hidden, 1, srb, policy=policy)
    add_work(res, "vector", 1, 0, D)  # final norm
    head_fmt = cfg.embed_format if cfg.tie_embeddings else cfg.head_format
    _matvec(res, head_fmt, cfg.vocab_size, D, policy=policy)
    if policy.region:  # entering the token's region once, then its phases (threads > 1 only)
        add_work(res, WorkKey(REGION_PHASE, "rows"), 1, 0,
             region_phases(cfg, policy.region_skip_split, policy.region_router_split, policy.region_min_weights,
                           policy.region_scan_split, policy.region_attn_split, policy.region_attn_min_d))
    return WorkInventory(res, st, skip_res, skip_st)


REGION_PHASE = "region_phase"  # tern.probe.ops: a region entered (call) and its phases (units)


def parallel_byte_share(work: Work, threads: int) -> float:
    """Fraction of the weight bytes of ``work`` that ops split over threads read (the rest
    one thread reads alone, at one thread's bandwidth); 1.0 at one thread or with no
    weight bytes."""
    if threads <= 1:
        return 1.0
    par = total = 0.0
    for key, w in work.items():
        t, divisor = key.priced_at(threads)
        b = w.units * OP_WEIGHT_BYTES.get(key.op, 0.0)
        total += b
        if t > 1 or divisor > 1:
            par += b
    return par / total if total else 1.0


def work_breakdown(work: Work, host: Any, threads: int = 1) -> dict[str, float] | None:
    """Seconds per op (parallel matvecs folded into their op) of ``work`` on ``host`` (a
    HostProfile with op_costs) at ``threads``; None when the profile lacks a cost for any
    op in it."""
    out: dict[str, float] = {}
    for key, (calls, rows, units, tails, inputs) in work.items():
        op = key.op
        if op == REGION_PHASE and threads <= 1:  # one thread runs the plain step: no region
            continue
        t, divisor = key.priced_at(threads)
        cost = op_cost_for(host.op_costs, op, t)
        if cost is None and op in COST_FALLBACK:
            cost = op_cost_for(host.op_costs, COST_FALLBACK[op], t)
        if cost is None:
            return None
        if key.split == "items" and threads > 1:  # each item pays the call (and the skip kernel's listing of
            calls, inputs = calls * divisor, inputs * divisor  # every input: tern.kernels.region_items.skip_phase)
        out[op] = out.get(op, 0.0) + cost.seconds(calls, rows, units, tails, inputs) / divisor
    return out


def work_seconds(work: Work, host: Any, threads: int = 1) -> float | None:
    """Total seconds of :func:`work_breakdown` (None when a cost is missing)."""
    b = work_breakdown(work, host, threads)
    return None if b is None else sum(b.values())
