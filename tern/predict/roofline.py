"""The two-pool roofline: batch-1 decode tok/s of a model on a host, and why.

Per decoded token the engine reads two pools of bytes (docs/LAYOUT.md, "the two-pool model"):

* **resident** — weights used for every token (embedding row or the tied table the head
  reads, mixers, dense MLPs, shared experts, routers, norms, head) plus the recurrent
  state and the attention cache at the current context;
* **streamed** — the routed experts picked for this token (``top_k`` per MoE layer).

Time per token = sum over pools of ``max(bytes / bandwidth(working set), ops / kernel
throughput)`` + a fixed per-token overhead (the plain roofline), or of ``measured op costs
+ memory stalls`` when the host profile has engine op costs (the op-cost model, below). Bandwidth is read off the host's measured
read-bandwidth-vs-working-set curve (:meth:`HostProfile.bandwidth_at`, through its
non-increasing envelope, :func:`bandwidth_gbps`) for the thread count asked for (nearest
measured count).

Working sets (``policy``), the choice that places the knee:

* ``"reuse"`` (default) — each pool is costed at its LRU *reuse distance*: the bytes
  touched between two reads of the same byte. A resident byte is read again one token
  later, after one token's footprint (resident + streamed + state + kv), so the resident
  pool runs at the bandwidth of that footprint. A routed expert is read again only after
  about ``n_experts / top_k`` tokens, during which routing (i.i.d. across tokens, as the
  reference project observed) touches nearly every expert, so its reuse distance is the
  whole hot model (resident + all experts + state + kv). Both pools share one cache; this
  is how LRU shares it. The knee — tok/s against total params at fixed active params —
  therefore sits where the *whole* working set leaves the last-level cache, and past it
  only the streamed pool drops to DRAM bandwidth while the resident core stays cached
  (the two-pool design of the reference project).
* ``"whole"`` — pessimistic: both pools at the whole-model working set (streaming
  experts evict the resident core, as a cache with poor replacement would).

The roof that bounds a pool is named from the cache level its working set fits in
(``L1``, ``L2``, ``L3``, else ``DRAM``), or ``compute`` when ops / kernel throughput
exceeds the memory time. A level's capacity at ``t`` threads counts the instances that
``t`` threads pinned compactly (one per core, core 0 first) can use.

Calibration keys read from ``HostProfile.calibration`` (measured by the engine and sweep
benchmarks; absent means the default):

* ``per_token_overhead_s`` (default 0.0): fixed seconds per token (dispatch, sampling,
  Python), added once per token;
* ``bandwidth_efficiency`` (default 1.0): fraction of the measured read bandwidth the
  engine attains (well-tuned engines reach ~0.75–0.95).

Either key suffixed ``_t<threads>`` (e.g. ``per_token_overhead_s_t2``) applies to that
thread count only (tern.measure.sweep.calibrate measures them).

Op-cost model (used when the host profile carries measured engine op costs,
``HostProfile.op_costs`` from tern.probe.ops, and the pools come from a ModelConfig):
each pool's time is ``compute_s + stall_s``. ``compute_s`` prices the engine's work per
token (tern.predict.inventory.work_inventory: every matvec with its shape, the SSM scan,
attention over the cached window, norms and activation quantization, routing, the
head) with the costs the probe timed on cache-resident data; ``stall_s`` is the extra time
the pool's bytes take because they come from further out than those timings' data.

How the engine's kernels overlap arithmetic with a memory stream differs from host to
host, so it is measured, not assumed (profile version 3, ``HostProfile.op_curves`` from
tern.probe.curves): each matvec kernel is timed over cycles of matrices from L2-sized to
DRAM-sized working sets, at one thread and run the way the engine runs it with more
threads (rows split, or experts in parallel). A matvec's per-weight cost at the pool's
working set is its cache-resident cost times the measured slowdown there
(tern.predict.stall.curve_stall), the row passes' stall scaled by their matrix's row length
as the probe measured it (profile version 5: tern.probe.row_curves). Bytes no kernel curve covers (recurrent state,
attention cache, element-wise work) stall as the plain read kernel's do:
``bytes x max(0, 1 / bw(working set) - 1 / bw(OP_COST_WORKING_SET))``; with threads > 1
only the bytes of ops the engine splits over threads stream at the thread count's
bandwidth, the rest at one thread's (tern.predict.inventory.parallel_byte_share).
Profiles without kernel curves (versions 1 and 2) price every byte that way: compute and
stall added, not overlapped, which held on the AMD host the kit was built on and
mispredicts hosts that hide part of the stall.
Bytes skipped by the activation skip
(tern.predict.inventory.HIDDEN_DENSITY) are not read. Without op costs (an old profile, the
reference PC) the plain roofline below applies.

Compute roof: ops per token over the best measured kernel of the format's family
(``ternary_*`` for ternary formats, ``int8_*``, ``q4_*``, ``fp32_*`` for float formats and
element-wise work) at no more than the requested threads. Ops of a family without a
kernel figure in the profile (``HostProfile.kernels``) get no compute roof: predictions
are then memory-roof upper bounds for them.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from tern.core.config import ModelConfig
from tern.core.engine_tuning import for_threads
from tern.core.formats import get_format
from tern.core.host_caches import GIB, KIB
from tern.core.host_profile import BandwidthPoint, CacheLevel, HostProfile
from tern.core.host_queries import (
    ROUTER_OP,
    bandwidth_gbps,
    calibration,
    engine_llc_bytes,
    kernel_gops_for,
    llc_capacity_bytes,
    memory_roof,
)
from tern.kernels.policy import EnginePolicy
from tern.predict.inventory import (
    parallel_byte_share,
    priced_op,
    work_breakdown,
    work_inventory,
    work_seconds,
)
from tern.predict.pools import TwoPool, decoded_context, two_pool, two_pool_from_params
from tern.predict.stall import curve_stall

POLICIES = ("reuse", "whole")
OP_COST_WORKING_SET = 256 * 1024  # bytes: the op costs were timed on data about this size (L2)


# ---- prediction --------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolPrediction:
    """One pool's share of a token: its bytes, the working set they are read at, the
    bandwidth that set gets on the host, and the time (memory, compute, stall) they cost.
    Times in seconds per token, bytes per token, GB/s = 1e9 B/s."""

    name: str  # "resident" or "streamed"
    bytes_per_token: int
    working_set_bytes: int
    bandwidth_gbps: float  # read bandwidth used (after bandwidth_efficiency), GB/s = 1e9 B/s
    memory_s: float  # bytes / bandwidth
    ops_per_token: float
    compute_s: float  # ops / kernel throughput (0 when the profile has no kernel figures)
    time_s: float  # roofline: max(memory_s, compute_s); op-cost model: compute_s + stall_s
    bound: str  # "L1" / "L2" / "L3" / "DRAM" / "compute" ("-" for an empty pool)
    stall_s: float = 0.0  # op-cost model: memory time beyond what the op timings include


@dataclass(frozen=True)
class Prediction:
    """Predicted batch-1 decode speed of one model on one host at one thread count, with
    the parts it is made of: both pools, the per-token overhead, the bytes and params per
    token and in total, and what bounds it. ``s_per_token`` = resident.time_s +
    streamed.time_s + overhead_s; ``tok_per_s`` = 1 / s_per_token. JSON-able (to_dict)."""

    config: str
    host_label: str
    threads: int
    curve_threads: int  # the measured thread count whose bandwidth curve was used
    context: int | None
    policy: str
    tok_per_s: float
    s_per_token: float
    resident: PoolPrediction
    streamed: PoolPrediction
    overhead_s: float
    state_bytes: int
    kv_bytes: int
    active_bytes: int  # weight bytes per token (resident + streamed)
    total_bytes: int  # all stored weight bytes
    active_params: int
    total_params: int
    hot_bytes: int  # whole working set: resident + all experts + state + kv
    llc_bytes: int  # last-level cache usable at these threads
    bound: str  # the largest contributor: a pool's bound, or "overhead"
    model: str = "roofline"  # "op-cost" when the host's measured engine op costs priced the work

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_ENGINE_CONTEXT: dict[tuple[int, int], tuple[tuple, tuple[float, float]]] = {}


def host_engine_policy(host: HostProfile) -> EnginePolicy:
    """The engine the host's probe ran (its profile's record; LEGACY_POLICY without one):
    what a prediction for that host prices unless told otherwise."""
    return EnginePolicy.of_record(host.host)


def router_table_bytes(host: HostProfile, engine_policy: EnginePolicy) -> bool:
    """Count int8 routers at 4 bytes a weight (tern.predict.pools.two_pool's ``router_table``)?
    Where the engine read them as an fp32 table (engines before EnginePolicy.router_int8), and
    for profiles that did not time the engine's router kernel (op ``router_int8``, probes
    before session 34): those priced the router with the int8 head's kernel plus the table's 3
    more bytes a weight, which stood in for the router kernel's slower rows, and keep that
    pricing (so their committed figures stay as they were)."""
    return not engine_policy.router_int8 or priced_op(host, ROUTER_OP) != ROUTER_OP


def curves_stream_prefetch(host: HostProfile, threads: int) -> bool:
    """The streaming-kernel prefetch ``host``'s curves were timed with at ``threads``: its
    probe's choice (tern.probe.stream_prefetch), else its engine_policy's (older profiles: on)."""
    ab = host.host.get("stream_prefetch")
    return for_threads(ab.get("stream_prefetch") if isinstance(ab, dict) else None, threads,
                       host_engine_policy(host).stream_prefetch)


def stream_prefetch_mismatch(host: HostProfile, threads: int, policy: EnginePolicy) -> str | None:
    """What is wrong when an engine at ``threads`` ran its streaming kernel unlike ``host``'s
    curves timed it (predictions of its DRAM-bound pools then price the other form); None if not."""
    timed = curves_stream_prefetch(host, threads)
    if policy.stream_prefetch == timed:
        return None
    return (f"the engine ran its streaming kernel with prefetch {'on' if policy.stream_prefetch else 'off'} at "
            f"{threads} thread(s) but {host.label}'s curves timed it {'on' if timed else 'off'}: predictions of "
            f"DRAM-bound points may be off; `tern probe` on this machine measures both and sets the engine's "
            f"choice (tern.core.engine_tuning)")


def expert_items_seconds(work: dict, host: HostProfile, threads: int) -> float:
    """Op-cost seconds of ``work``'s chosen experts run as items of one phase of the
    one-region step (WorkKey split "region_experts"; 0 at one thread). Each thread runs its
    items with the single-thread kernels, one after another as a single-thread token runs its
    experts, so the predictor prices them at one thread's engine-context factor, not at the
    thread count's, which the context models' split matrices and phase waits set (session 31,
    Intel Xeon VM: 1.19 at 1 thread against 1.39 at 2, and 64 experts of 4096 x 512 at top-8 /
    top-16 ran 1.17 / 1.23x their 2-thread predictions with the 2-thread factor on them)."""
    items = expert_items(work, threads)
    return (work_seconds(items, host, threads) or 0.0) if items else 0.0


def expert_items(work: dict, threads: int) -> dict:
    """The part of ``work`` that :func:`expert_items_seconds` prices (none at one thread)."""
    return {k: v for k, v in work.items() if k.split == "region_experts"} if threads > 1 else {}


def engine_context(host: HostProfile, threads: int = 1) -> tuple[float, float]:
    """(per-token overhead in s, engine-context factor) from the probe's engine runs
    (tern.probe.engine_runs) at the thread count nearest ``threads``: the overhead is the
    median of ``step_s - loop_s`` (Python and the call into numba); the factor the median
    of ``(loop_s - predicted stall) / predicted op-cost compute`` of the same models — how
    much longer the ops take in a token than alone; at threads > 1 over the compute other than
    the chosen experts' items, which are taken out at one thread's factor
    (:func:`expert_items_seconds`). (0, 1) without engine runs."""
    runs = host.engine_runs
    if not runs or not host.op_costs:
        return 0.0, 1.0
    key = (id(runs), threads)
    hit = _ENGINE_CONTEXT.get(key)
    if hit is not None and hit[0] is runs:
        return hit[1]
    t = min({r.threads for r in runs}, key=lambda a: (abs(a - threads), -a))
    mine = [r for r in runs if r.threads == t]
    overhead = statistics.median(max(0.0, r.step_s - r.loop_s) for r in mine)
    factors = []
    llc, measured_by = engine_llc_bytes(host), host_engine_policy(host)  # the probe's runs: its engine
    items_factor = engine_context(host, 1)[1] if t > 1 else 1.0  # expert_items_seconds' factor
    for r in mine:
        cfg = ModelConfig.from_dict(r.config)
        ctx = decoded_context(r.tokens, cfg.attn_window)  # each run decodes from a reset
        pools = two_pool(cfg, ctx, llc, measured_by, router_table_bytes(host, measured_by))
        p = predict_pools(pools, host, t, _engine=(0.0, 1.0))
        items = sum(expert_items_seconds(w, host, t) for w in (pools.resident_work, pools.streamed_work))
        compute = p.resident.compute_s + p.streamed.compute_s - items
        stall = p.resident.stall_s + p.streamed.stall_s
        if compute > 0:
            factors.append(max(0.5, (r.loop_s - stall - items * items_factor) / compute))
    result = (overhead, statistics.median(factors) if factors else 1.0)
    _ENGINE_CONTEXT[key] = (runs, result)
    return result


def predict_pools(pools: TwoPool, host: HostProfile, threads: int = 1, policy: str = "reuse",
                  context: int | None = None, _engine: tuple[float, float] | None = None) -> Prediction:
    """Predict decode speed of ``pools`` on ``host`` (see the module docstring)."""
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    avail = host.thread_counts()
    if not avail:
        raise ValueError(f"host profile {host.label!r} has no read-bandwidth curve")
    curve_t = min(avail, key=lambda a: (abs(a - threads), -a))
    overhead_s, eff = calibration(host, threads)
    hot = pools.hot_bytes
    engine_overhead_s, ctx_factor = _engine if _engine is not None else (0.0, 1.0)
    items_factor = ctx_factor  # the chosen experts' items (expert_items_seconds): one thread's factor
    ws = {"resident": pools.footprint_bytes if policy == "reuse" else hot, "streamed": hot}
    nbytes = {"resident": pools.resident_bytes + pools.state_bytes + pools.kv_bytes,
              "streamed": pools.streamed_bytes}
    ops = {"resident": pools.resident_ops, "streamed": pools.streamed_ops}
    work = {"resident": pools.resident_work, "streamed": pools.streamed_work}
    read = {"resident": nbytes["resident"] - pools.resident_skipped_bytes,
            "streamed": nbytes["streamed"] - pools.streamed_skipped_bytes}
    work_s = {name: work_seconds(w, host, threads) for name, w in work.items()} if host.op_costs else {}
    op_model = bool(pools.resident_work) and bool(work_s) and None not in work_s.values()
    if _engine is None and op_model:
        engine_overhead_s, ctx_factor = engine_context(host, threads)
        items_factor = engine_context(host, 1)[1]
    items_s = {name: expert_items_seconds(w, host, threads) if op_model else 0.0 for name, w in work.items()}
    overhead_s += engine_overhead_s
    ref_bw = bandwidth_gbps(host, OP_COST_WORKING_SET, threads) if op_model else 0.0
    out = {}
    eff_1 = calibration(host, 1)[1] if op_model and threads > 1 else eff
    ref_bw_1 = bandwidth_gbps(host, OP_COST_WORKING_SET, 1) if op_model else 0.0
    for name in ("resident", "streamed"):
        bw = bandwidth_gbps(host, ws[name], threads) * eff
        stall_s = 0.0
        if op_model:
            # bytes of ops split over threads stream at the thread count's bandwidth, the
            # rest at one thread's (one core reads them while the other waits)
            share = parallel_byte_share(work[name], threads)
            bw_1 = bandwidth_gbps(host, ws[name], 1) * eff_1
            per_byte = (share * max(0.0, 1.0 / (bw * 1e9) - 1.0 / (ref_bw * 1e9))
                        + (1.0 - share) * max(0.0, 1.0 / (bw_1 * 1e9) - 1.0 / (ref_bw_1 * 1e9)))
            measured = curve_stall(work[name], host, threads, ws[name])
            if measured is None:  # no kernel curves: every byte stalls as the read kernel's do
                stall_s = read[name] * per_byte
            else:  # the matvecs as their own kernels measured; state, caches and the rest as reads
                extra_s, covered = measured
                stall_s = extra_s + max(read[name] - covered, 0.0) * per_byte
            mem_s = read[name] * (share / (bw * 1e9) + (1.0 - share) / (bw_1 * 1e9))
            bw = read[name] / mem_s / 1e9 if mem_s > 0 else bw  # the effective mix
            comp_s = (work_s[name] - items_s[name]) * ctx_factor + items_s[name] * items_factor
            time_s = comp_s + stall_s
        else:
            mem_s = nbytes[name] / (bw * 1e9)
            comp_s = 0.0
            for fmt, n in ops[name].items():
                g = kernel_gops_for(host, fmt, threads)
                if g:
                    comp_s += n / (g * 1e9)
            time_s = max(mem_s, comp_s)
        n_ops = float(sum(ops[name].values()))
        if nbytes[name] == 0:
            bound = "-"
        elif comp_s > (stall_s if op_model else mem_s):
            bound = "compute"
        else:
            bound = memory_roof(host, ws[name], threads)
        out[name] = PoolPrediction(name, int(nbytes[name]), int(ws[name]), bw, mem_s, n_ops, comp_s,
                                   time_s, bound, stall_s)
    s = out["resident"].time_s + out["streamed"].time_s + overhead_s
    top = max(out.values(), key=lambda p: p.time_s)
    return Prediction(
        pools.name, host.label, threads, curve_t, context, policy, 1.0 / s, s, out["resident"],
        out["streamed"], overhead_s, int(pools.state_bytes), int(pools.kv_bytes),
        int(pools.resident_bytes + pools.streamed_bytes), int(pools.total_bytes), int(pools.active_params),
        int(pools.total_params), int(hot),
        llc_capacity_bytes(host, threads), "overhead" if overhead_s > top.time_s else top.bound,
        "op-cost" if op_model else "roofline")


def with_format(cfg: ModelConfig, fmt: str) -> ModelConfig:
    """``cfg`` with every linear-layer group (mixer, MLP, shared, experts) in ``fmt``;
    embedding, head, norms, routers and SSM aux parameters keep their formats."""
    get_format(fmt)
    return cfg.replace(mixer_format=fmt, mlp_format=fmt, expert_format=fmt)


def predict(cfg: ModelConfig, host: HostProfile, threads: int = 1, context: int | None = None,
            fmt: str | None = None, policy: str = "reuse",
            engine_policy: EnginePolicy | None = None) -> Prediction:
    """Predicted batch-1 decode tok/s of ``cfg`` on ``host`` with a per-pool breakdown.

    ``context``: attention positions cached (None: a full window). ``fmt``: override the
    format of every linear layer (see :func:`with_format`). ``policy``: "reuse" or "whole"
    working sets (module docstring). ``engine_policy``: the engine's thread splitting (a
    measured row's own to re-predict it: EnginePolicy.of_record); default: the engine the
    host's probe ran (its profile's record: an older profile prices the per-matrix step,
    whose cost it measured; a profile without a record, LEGACY_POLICY)."""
    if engine_policy is None:
        engine_policy = host_engine_policy(host)
    if fmt is not None:
        cfg = with_format(cfg, fmt)
    ctx = cfg.attn_window if context is None else context
    return predict_pools(two_pool(cfg, ctx, engine_llc_bytes(host), engine_policy,
                                  router_table_bytes(host, engine_policy)), host, threads, policy, ctx)


# ---- sweeps (the data behind the plots and the explorer) -----------------------------------
def synthetic_profile(llc_bytes: int, cache_gbps: float, dram_gbps: float, threads: int = 1,
                      label: str = "synthetic two-plateau host") -> HostProfile:
    """A host with one cache level (L3 of ``llc_bytes``) read at ``cache_gbps`` and DRAM at
    ``dram_gbps`` beyond twice the LLC (log-linear knee in between); for what-if plots, the
    explorer and tests. Not measured."""
    if not (llc_bytes > 0 and cache_gbps > 0 and dram_gbps > 0):
        raise ValueError("llc_bytes, cache_gbps and dram_gbps must be > 0")
    pts = [(min(4 * KIB, llc_bytes), cache_gbps), (llc_bytes, cache_gbps), (2 * llc_bytes, dram_gbps),
           (max(4 * GIB, 4 * llc_bytes), dram_gbps)]
    bw = tuple(BandwidthPoint("read", threads, int(ws), g, g, 0) for ws, g in pts)
    return HostProfile(label, False, {}, (CacheLevel(3, "Unified", int(llc_bytes), 1, max(1, threads)),),
                       "synthetic", bw)


def sweep_total(host: HostProfile, active_params: float, totals: list[float], bits_per_weight: float = 2.0,
                resident_fraction: float = 0.7, threads: int = 1, fmt: str | None = None,
                policy: str = "reuse") -> list[Prediction]:
    """tok/s against total params at fixed active params (the knee): the resident core is
    ``resident_fraction`` of the active params, the rest of the total is routed experts."""
    res = resident_fraction * active_params
    return [predict_pools(two_pool_from_params(t, active_params, bits_per_weight, resident_params=res,
                                               name=f"total {t:.3g}", fmt=fmt), host, threads, policy)
            for t in totals if t >= active_params]


def sweep_active(host: HostProfile, actives: list[float], fmt: str = "ternary2", threads: int = 1,
                 total_over_active: float = 1.0, resident_fraction: float = 0.7,
                 policy: str = "reuse") -> list[Prediction]:
    """tok/s against active params for one weight format (bits per weight from
    tern.core.formats), total = ``total_over_active`` x active (1.0: dense)."""
    if total_over_active < 1:
        raise ValueError(f"total_over_active must be >= 1, got {total_over_active!r}")
    bits = get_format(fmt).bits_per_weight
    res = 1.0 if total_over_active == 1 else resident_fraction
    return [predict_pools(two_pool_from_params(a * total_over_active, a, bits, resident_params=res * a,
                                               name=f"{fmt} {a:.3g}", fmt=fmt), host, threads, policy)
            for a in actives]


def feasibility_grid(host: HostProfile, total_params: float, actives: list[float],
                     threads: list[int], fmt: str = "ternary2", resident_fraction: float = 0.75,
                     policy: str = "reuse") -> list[list[float]]:
    """Predicted tok/s, one row per thread count, one column per active-param count, for
    a model of ``total_params`` total in ``fmt`` (abstract two-pool model)."""
    bits = get_format(fmt).bits_per_weight
    return [[predict_pools(two_pool_from_params(total_params, a, bits, resident_params=resident_fraction * a,
                                                fmt=fmt), host, t, policy).tok_per_s for a in actives]
            for t in threads]


# ---- where a token's time goes ---------------------------------------------------------------
def time_breakdown(cfg: ModelConfig, host: Any, threads: int = 1, context: int | None = None) -> dict[str, float]:
    """Predicted seconds per token by component: each op's compute (both pools), the
    memory stall of each pool, and the per-token overhead (tern.predict.roofline.predict's split;
    the values sum to its s_per_token). Needs a profile with op costs."""
    if not host.op_costs:
        raise ValueError(f"host profile {host.label!r} has no engine op costs: run `tern probe`")
    p = predict(cfg, host, threads, context)
    res, st, _, _ = work_inventory(cfg, p.context, engine_llc_bytes(host), host_engine_policy(host))
    # each op's compute in a token: its op cost times the engine-context factor predict_pools applies
    op_cost = p.model == "op-cost"
    ctx, items_ctx = (engine_context(host, threads)[1], engine_context(host, 1)[1]) if op_cost else (1.0, 1.0)
    out: dict[str, float] = {}
    for w in (res, st):
        items = expert_items(w, threads)
        for part, factor in (({k: v for k, v in w.items() if k not in items}, ctx), (items, items_ctx)):
            for op, sec in (work_breakdown(part, host, threads) or {}).items():
                out[op] = out.get(op, 0.0) + sec * factor
    out["stall (resident)"] = p.resident.stall_s
    out["stall (streamed)"] = p.streamed.stall_s
    out["overhead"] = p.overhead_s
    return out


