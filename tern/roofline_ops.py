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

from typing import Any

from .config import ModelConfig
from .formats import get_format
from .host_profile import op_cost_for

# expected fraction of nonzero gated-MLP hidden units (see the module docstring)
HIDDEN_DENSITY = {"drelu": 0.25, "relu2": 0.5, "silu": 1.0}
PAR_MIN_WEIGHTS = 1 << 20  # with threads > 1 the engine splits matrices of at least this many weights
PAR_SUFFIX = "@par"  # work key of a matvec split over threads (costed at the thread count)

Work = dict[str, list[float]]  # op (+ PAR_SUFFIX) -> [calls, rows, units]


def _add(work: Work, op: str, calls: float, rows: float, units: float) -> None:
    w = work.setdefault(op, [0.0, 0.0, 0.0])
    w[0] += calls
    w[1] += rows
    w[2] += units


def _matvec_op(fmt: str) -> str:
    f = get_format(fmt)
    if f.ternary:
        return "ternary_matvec"
    return "int8_matvec" if fmt == "int8" else "fp32_matvec"


def _key(op: str, weights: int) -> str:
    """The work key of a matrix op: costed at the thread count when the engine splits it."""
    return op + PAR_SUFFIX if weights >= PAR_MIN_WEIGHTS else op


def _matvec(work: Work, fmt: str, rows: int, cols: int, n: float = 1.0) -> None:
    _add(work, _key(_matvec_op(fmt), rows * cols), n, n * rows, n * rows * cols)


def _gated_mlp(work: Work, cfg: ModelConfig, fmt: str, hidden: int, n: float) -> float:
    """``n`` experts (or MLPs) of ``hidden`` units; returns the down-projection bytes the
    activation skip leaves unread."""
    D = cfg.d_model
    _matvec(work, fmt, hidden, D, 2 * n)  # gate and up
    _add(work, "vector", n, 0, n * hidden)  # activation + quantization of the hidden vector
    rho = HIDDEN_DENSITY.get(cfg.activation, 1.0)
    f = get_format(fmt)
    if f.ternary:
        _add(work, _key("ternary_skip", hidden * D), n, n * D, n * rho * hidden * D)  # rows: the D outputs
        return (1.0 - rho) * n * hidden * D * f.bits_per_weight / 8
    _matvec(work, fmt, D, hidden, n)
    return 0.0


def work_inventory(cfg: ModelConfig, context: int | None = None) -> tuple[Work, Work, float, float]:
    """(resident work, streamed work, resident bytes skipped, streamed bytes skipped) of one
    token at ``context`` cached attention positions (None: a full window)."""
    ctx = cfg.attn_window if context is None else context
    D, Di, N, R = cfg.d_model, cfg.d_inner, cfg.d_state, cfg.dt_rank_eff
    res: Work = {}
    st: Work = {}
    skip_res = skip_st = 0.0
    _add(res, "vector", 1, 0, D)  # embedding row (int8 rows are scaled)
    for layer in range(cfg.n_layers):
        _add(res, "vector", 1, 0, D)  # RMSNorm + quantization of the mixer input
        if cfg.mixer(layer) == "ssm":
            _matvec(res, cfg.mixer_format, 2 * Di, D)  # in_proj
            _add(res, "vector", 3, 0, (cfg.d_conv + 2) * Di)  # conv + two quantizations
            _matvec(res, cfg.mixer_format, R + 2 * N, Di)  # x_proj
            _add(res, "ssm_scan", 1, Di, Di * N)
            _matvec(res, cfg.mixer_format, D, Di)  # out_proj
        else:
            _matvec(res, cfg.mixer_format, 3 * D, D)  # q, k, v
            _add(res, "attention", 1, 0, min(ctx, cfg.attn_window) * D)
            _add(res, "vector", 1, 0, D)
            _matvec(res, cfg.mixer_format, D, D)  # out
        if cfg.is_moe(layer):
            _add(res, "vector", 1, 0, D)
            if cfg.n_shared:
                skip_res += _gated_mlp(res, cfg, cfg.mlp_format, cfg.shared_hidden, cfg.n_shared)
            _matvec(res, "fp32", cfg.n_experts, D)  # router logits (fp32 math)
            _add(res, "vector", 1, 0, cfg.n_experts)  # softmax + top-k
            skip_st += _gated_mlp(st, cfg, cfg.expert_format, cfg.expert_hidden, cfg.top_k)
        elif cfg.mlp_hidden:
            _add(res, "vector", 1, 0, D)
            skip_res += _gated_mlp(res, cfg, cfg.mlp_format, cfg.mlp_hidden, 1)
    _add(res, "vector", 1, 0, D)  # final norm
    head_fmt = cfg.embed_format if cfg.tie_embeddings else cfg.head_format
    _matvec(res, head_fmt, cfg.vocab_size, D)
    return res, st, skip_res, skip_st


def work_breakdown(work: Work, host: Any, threads: int = 1) -> dict[str, float] | None:
    """Seconds per op (parallel matvecs folded into their op) of ``work`` on ``host`` (a
    HostProfile with op_costs) at ``threads``; None when the profile lacks a cost for any
    op in it."""
    out: dict[str, float] = {}
    for key, (calls, rows, units) in work.items():
        op, par = (key[:-len(PAR_SUFFIX)], True) if key.endswith(PAR_SUFFIX) else (key, False)
        cost = op_cost_for(host.op_costs, op, threads if par else 1)
        if cost is None:
            return None
        out[op] = out.get(op, 0.0) + cost.seconds(calls, rows, units)
    return out


def work_seconds(work: Work, host: Any, threads: int = 1) -> float | None:
    """Total seconds of :func:`work_breakdown` (None when a cost is missing)."""
    b = work_breakdown(work, host, threads)
    return None if b is None else sum(b.values())


def time_breakdown(cfg: ModelConfig, host: Any, threads: int = 1, context: int | None = None) -> dict[str, float]:
    """Predicted seconds per token by component: each op's compute (both pools), the
    memory stall of each pool, and the per-token overhead (tern.roofline.predict's split;
    the values sum to its s_per_token). Needs a profile with op costs."""
    from .roofline import predict

    if not host.op_costs:
        raise ValueError(f"host profile {host.label!r} has no engine op costs: run `tern probe`")
    p = predict(cfg, host, threads, context)
    res, st, _, _ = work_inventory(cfg, p.context)
    out: dict[str, float] = {}
    for w in (res, st):
        for op, sec in (work_breakdown(w, host, threads) or {}).items():
            out[op] = out.get(op, 0.0) + sec
    out["stall (resident)"] = p.resident.stall_s
    out["stall (streamed)"] = p.streamed.stall_s
    out["overhead"] = p.overhead_s
    return out
