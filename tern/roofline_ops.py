"""The engine's work per decoded token, counted from a ModelConfig, and its cost on a host.

:func:`work_inventory` lists, per pool (resident / streamed), how many calls, rows and
units of each engine operation one token runs (the op names and cost models of
tern.probe_ops); :func:`work_seconds` prices them with the host's measured
:class:`~tern.host_profile.OpCost` figures. The roofline adds the result to the memory
time (tern.roofline, "op-cost model").

Activation skip: the gated MLP's down projection reads only the rows of nonzero hidden
units, so its bytes and work scale with the fraction of nonzero hidden units. The inventory assumes :data:`HIDDEN_DENSITY` per activation: at random
initialisation (the sweep's random-weight models) dReLU = relu(g) * relu(u) is nonzero
for 1/4 of the units and ReLU² for 1/2; trained models are sparser (the sandbox reaches
76-84 % zeros), so for them this is conservative.
"""

from __future__ import annotations

import math
from typing import Any

from .config import ModelConfig, param_counts
from .formats import get_format
from .host_profile import op_cost_for

# expected fraction of nonzero gated-MLP hidden units (see the module docstring)
HIDDEN_DENSITY = {"drelu": 0.25, "relu2": 0.5, "silu": 1.0}
PAR_MIN_WEIGHTS = 1 << 20  # with threads > 1 the engine splits matrices of at least this many weights
# Ternary matrices whose pool comes from DRAM and whose packed rows hold STREAM_MIN_ROW_BYTES
# .. STREAM_MAX_ROW_BYTES bytes (1,280 .. 16,384 columns) run the streaming kernel (one row
# per pass, one sequential read stream; tern.engine.kernels_ternary._rows_stream). Measured
# on Zen 4 at >= 256 MiB (benchmarks/ternary_matvec.py --row-length, 1 thread): at 128-256 B
# rows both forms read 20-24 GB/s; from 320 B to 4 KB the 4-row pass falls to 7-17 GB/s
# while one row per pass reads 17-29; from 6 KB rows on the activation vector (>= 24 KB)
# no longer stays in L1 beside the stream and the one-row pass drops to 10-12 GB/s
# against 16-19 for the 4-row pass, which reuses each activation load 4 times.
STREAM_MIN_ROW_BYTES = 320
STREAM_MAX_ROW_BYTES = 4096
PAR_SUFFIX = "@par"  # work key of a matvec split over threads (costed at the thread count)
# work key of routed-expert work the engine runs expert-parallel (threads > 1): each chosen
# expert on one thread with the single-thread kernels (tern.engine.ops.experts_parallel);
# "op@ep<k>" is costed at 1 thread and divided by k / ceil(k / threads)
EP_SUFFIX = "@ep"

Work = dict[str, list[float]]  # op key -> [calls, rows, units, rows with a partial last segment]
SEGMENT_COLS = 256  # columns per segment of the ternary2 layout (tern.engine.packing)


def _add(work: Work, op: str, calls: float, rows: float, units: float, tails: float = 0.0) -> None:
    w = work.setdefault(op, [0.0, 0.0, 0.0, 0.0])
    w[0] += calls
    w[1] += rows
    w[2] += units
    w[3] += tails


# ops priced with another op's cost when a profile predates them (same kernel family)
COST_FALLBACK = {"ternary_stream": "ternary_matvec"}


def stream_row_bytes(cfg: ModelConfig, llc_bytes: int | None) -> tuple[int, int]:
    """(resident, routed): the smallest packed ternary row, in bytes, that each pool reads
    with the streaming kernel, 0 for none. A pool streams once its working set cannot stay
    in the last-level cache of ``llc_bytes`` (None / 0: unknown, no streaming): the
    resident pool when its bytes exceed it, the routed experts when resident bytes plus
    all experts do. The engine (tern.engine.decode) and the roofline both use this."""
    if not llc_bytes:
        return 0, 0
    pc = param_counts(cfg)
    res = STREAM_MIN_ROW_BYTES if pc.resident.bytes > llc_bytes else 0
    routed = (STREAM_MIN_ROW_BYTES if pc.expert_bytes_total
              and pc.resident.bytes + pc.expert_bytes_total > llc_bytes else 0)
    return res, routed


def _matvec_op(fmt: str, cols: int = 0, stream_rb: int = 0) -> str:
    f = get_format(fmt)
    if f.ternary:
        stream = stream_rb and stream_rb <= (cols + 3) // 4 <= STREAM_MAX_ROW_BYTES
        return "ternary_stream" if stream else "ternary_matvec"
    return "int8_matvec" if fmt == "int8" else "fp32_matvec"


def _key(op: str, weights: int, ep: int = 0) -> str:
    """The work key of an op: expert-parallel over ``ep`` chosen experts (ep > 0), else
    costed at the thread count when the engine splits the matrix."""
    if ep:
        return f"{op}{EP_SUFFIX}{ep}"
    return op + PAR_SUFFIX if weights >= PAR_MIN_WEIGHTS else op


def parse_key(key: str, threads: int) -> tuple[str, int, float]:
    """(op, threads its cost is taken at, divisor of that cost) of a work key."""
    if EP_SUFFIX in key:
        op, k = key.split(EP_SUFFIX)
        return op, 1, int(k) / math.ceil(int(k) / threads)
    if key.endswith(PAR_SUFFIX):
        return key[:-len(PAR_SUFFIX)], threads, 1.0
    return key, 1, 1.0


def experts_parallel(cfg: ModelConfig) -> int:
    """k when the engine runs a token's k chosen experts expert-parallel with threads > 1
    (the rule of tern.engine.ops.experts_parallel: k >= 2 and at least PAR_MIN_WEIGHTS
    weights of chosen experts per layer), else 0."""
    k = cfg.top_k
    return k if k >= 2 and 3 * k * cfg.expert_hidden * cfg.d_model >= PAR_MIN_WEIGHTS else 0


def _matvec(work: Work, fmt: str, rows: int, cols: int, n: float = 1.0, stream_rb: int = 0, ep: int = 0) -> None:
    tails = n * rows if get_format(fmt).ternary and cols % SEGMENT_COLS else 0.0
    _add(work, _key(_matvec_op(fmt, cols, stream_rb), rows * cols, ep), n, n * rows, n * rows * cols, tails)


def _gated_mlp(work: Work, cfg: ModelConfig, fmt: str, hidden: int, n: float, stream_rb: int = 0,
               ep: int = 0) -> float:
    """``n`` experts (or MLPs) of ``hidden`` units (``ep``: run expert-parallel, see
    :func:`experts_parallel`); returns the down-projection bytes the activation skip
    leaves unread."""
    D = cfg.d_model
    _matvec(work, fmt, hidden, D, 2 * n, stream_rb, ep)  # gate and up
    _add(work, _key("vector", 0, ep), n, 0, n * hidden)  # activation + quantization of the hidden vector
    rho = HIDDEN_DENSITY.get(cfg.activation, 1.0)
    f = get_format(fmt)
    if f.ternary:
        _add(work, _key("ternary_skip", hidden * D, ep), n, n * D, n * rho * hidden * D)  # rows: the D outputs
        return (1.0 - rho) * n * hidden * D * f.bits_per_weight / 8
    _matvec(work, fmt, D, hidden, n, stream_rb, ep)
    return 0.0


def work_inventory(cfg: ModelConfig, context: int | None = None,
                   llc_bytes: int | None = None) -> tuple[Work, Work, float, float]:
    """(resident work, streamed work, resident bytes skipped, streamed bytes skipped) of one
    token at ``context`` cached attention positions (None: a full window); ``llc_bytes``
    decides which matrices the engine streams (:func:`stream_row_bytes`)."""
    ctx = cfg.attn_window if context is None else context
    D, Di, N, R = cfg.d_model, cfg.d_inner, cfg.d_state, cfg.dt_rank_eff
    srb, srb_routed = stream_row_bytes(cfg, llc_bytes)
    res: Work = {}
    st: Work = {}
    skip_res = skip_st = 0.0
    _add(res, "vector", 1, 0, D)  # embedding row (int8 rows are scaled)
    for layer in range(cfg.n_layers):
        _add(res, "vector", 1, 0, D)  # RMSNorm + quantization of the mixer input
        if cfg.mixer(layer) == "ssm":
            _matvec(res, cfg.mixer_format, 2 * Di, D, 1, srb)  # in_proj
            _add(res, "vector", 3, 0, (cfg.d_conv + 2) * Di)  # conv + two quantizations
            _matvec(res, cfg.mixer_format, R + 2 * N, Di, 1, srb)  # x_proj
            _add(res, "ssm_step", 1, Di * R, Di * N)  # dt projection (Di x R) + scan (Di x N)
            _matvec(res, cfg.mixer_format, D, Di, 1, srb)  # out_proj
        else:
            _matvec(res, cfg.mixer_format, 3 * D, D, 1, srb)  # q, k, v
            _add(res, "attention", 1, 0, min(ctx, cfg.attn_window) * D)
            _add(res, "vector", 1, 0, D)
            _matvec(res, cfg.mixer_format, D, D, 1, srb)  # out
        if cfg.is_moe(layer):
            _add(res, "vector", 1, 0, D)
            if cfg.n_shared:
                skip_res += _gated_mlp(res, cfg, cfg.mlp_format, cfg.shared_hidden, cfg.n_shared, srb)
            _matvec(res, "fp32", cfg.n_experts, D)  # router logits (fp32 math)
            _add(res, "vector", 1, 0, cfg.n_experts)  # softmax + top-k
            skip_st += _gated_mlp(st, cfg, cfg.expert_format, cfg.expert_hidden, cfg.top_k, srb_routed,
                                  experts_parallel(cfg))
        elif cfg.mlp_hidden:
            _add(res, "vector", 1, 0, D)
            skip_res += _gated_mlp(res, cfg, cfg.mlp_format, cfg.mlp_hidden, 1, srb)
    _add(res, "vector", 1, 0, D)  # final norm
    head_fmt = cfg.embed_format if cfg.tie_embeddings else cfg.head_format
    _matvec(res, head_fmt, cfg.vocab_size, D)
    return res, st, skip_res, skip_st


# weight bytes read per unit of each matrix op (units are weights; the others read state)
WEIGHT_BYTES_PER_UNIT = {"ternary_matvec": 0.25, "ternary_stream": 0.25, "ternary_skip": 0.25,
                         "int8_matvec": 1.0, "fp32_matvec": 4.0}


def parallel_byte_share(work: Work, threads: int) -> float:
    """Fraction of the weight bytes of ``work`` that ops split over threads read (the rest
    one thread reads alone, at one thread's bandwidth); 1.0 at one thread or with no
    weight bytes."""
    if threads <= 1:
        return 1.0
    par = total = 0.0
    for key, (_, _, units, _) in work.items():
        op, t, divisor = parse_key(key, threads)
        b = units * WEIGHT_BYTES_PER_UNIT.get(op, 0.0)
        total += b
        if t > 1 or divisor > 1:
            par += b
    return par / total if total else 1.0


def work_breakdown(work: Work, host: Any, threads: int = 1) -> dict[str, float] | None:
    """Seconds per op (parallel matvecs folded into their op) of ``work`` on ``host`` (a
    HostProfile with op_costs) at ``threads``; None when the profile lacks a cost for any
    op in it."""
    out: dict[str, float] = {}
    for key, (calls, rows, units, tails) in work.items():
        op, t, divisor = parse_key(key, threads)
        cost = op_cost_for(host.op_costs, op, t)
        if cost is None and op in COST_FALLBACK:
            cost = op_cost_for(host.op_costs, COST_FALLBACK[op], t)
        if cost is None:
            return None
        out[op] = out.get(op, 0.0) + cost.seconds(calls, rows, units, tails) / divisor
    return out


def work_seconds(work: Work, host: Any, threads: int = 1) -> float | None:
    """Total seconds of :func:`work_breakdown` (None when a cost is missing)."""
    b = work_breakdown(work, host, threads)
    return None if b is None else sum(b.values())


def time_breakdown(cfg: ModelConfig, host: Any, threads: int = 1, context: int | None = None) -> dict[str, float]:
    """Predicted seconds per token by component: each op's compute (both pools), the
    memory stall of each pool, and the per-token overhead (tern.roofline.predict's split;
    the values sum to its s_per_token). Needs a profile with op costs."""
    from .roofline import engine_llc_bytes, predict

    if not host.op_costs:
        raise ValueError(f"host profile {host.label!r} has no engine op costs: run `tern probe`")
    p = predict(cfg, host, threads, context)
    res, st, _, _ = work_inventory(cfg, p.context, engine_llc_bytes(host))
    out: dict[str, float] = {}
    for w in (res, st):
        for op, sec in (work_breakdown(w, host, threads) or {}).items():
            out[op] = out.get(op, 0.0) + sec
    out["stall (resident)"] = p.resident.stall_s
    out["stall (streamed)"] = p.streamed.stall_s
    out["overhead"] = p.overhead_s
    return out
