"""The two-pool roofline: batch-1 decode tok/s of a model on a host, and why.

Per decoded token the engine reads two pools of bytes (see ``docs`` in ARCHITECTURE.md):

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
thread count only (tern.sweep.calibrate measures them).

Op-cost model (used when the host profile carries measured engine op costs,
``HostProfile.op_costs`` from tern.probe_ops, and the pools come from a ModelConfig):
each pool's time is ``compute_s + stall_s``. ``compute_s`` prices the engine's work per
token (tern.roofline_ops.work_inventory: every matvec with its shape, the SSM scan,
attention over the cached window, norms and activation quantization, routing, the
head) with the costs the probe timed on cache-resident data; ``stall_s`` is the extra time
the pool's bytes take because they come from further out than those timings' data:
``bytes x max(0, 1 / bw(working set) - 1 / bw(OP_COST_WORKING_SET))``. Compute and memory
stalls are added, not overlapped: on one core the engine does not hide DRAM latency
behind its arithmetic (the bare ternary kernel streams a 256 MiB matrix at 59 % of the
read bandwidth on this kit's 2-core VM, which the sum predicts within a few percent and
``max`` misses by 40 %). With threads > 1 only the bytes of ops the engine splits over
threads (large matrices, expert-parallel experts) stream at the thread count's bandwidth;
the rest one thread reads alone, at one thread's (tern.roofline_ops.parallel_byte_share).
Bytes skipped by the activation skip
(tern.roofline_ops.HIDDEN_DENSITY) are not read. Without op costs (an old profile, the
reference PC) the plain roofline below applies.

Compute roof: ops per token over the best measured kernel of the format's family
(``ternary_*`` for ternary formats, ``int8_*``, ``q4_*``, ``fp32_*`` for float formats and
element-wise work) at no more than the requested threads. Ops of a family without a
kernel figure in the profile (``HostProfile.kernels``) get no compute roof: predictions
are then memory-roof upper bounds for them.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .config import ModelConfig, load_config, param_counts
from .formats import FORMATS, get_format
from .host_profile import BandwidthPoint, CacheLevel, HostProfile
from .roofline_ops import parallel_byte_share, work_inventory, work_seconds

POLICIES = ("reuse", "whole")
OP_COST_WORKING_SET = 256 * 1024  # bytes: the op costs were timed on data about this size (L2)
CALIBRATION_KEYS = ("per_token_overhead_s", "bandwidth_efficiency")
REFERENCE_PATH = Path(__file__).resolve().parent / "reference" / "ryzen_3600x.json"
REFERENCE_LABEL = "reference: Ryzen 5 3600X (published figures, not measured here)"
# kernel name prefixes (as the probe names kernels) that can run each format family
_KERNEL_PREFIXES = {
    "ternary": ("ternary", "tq", "lut", "i2"),
    "int8": ("int8",),
    "q4": ("q4", "int8"),
    "float": ("fp32",),
}


# ---- the two pools of one model --------------------------------------------------------
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
    # engine work per token (tern.roofline_ops.work_inventory; empty: not counted) and the
    # bytes per token the activation skip is expected to leave unread
    resident_work: dict[str, list[float]] = field(default_factory=dict)
    streamed_work: dict[str, list[float]] = field(default_factory=dict)
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


def _family(fmt: str) -> str:
    f = get_format(fmt)
    if f.ternary:
        return "ternary"
    return {"int8": "int8", "q4": "q4"}.get(fmt, "float")


def two_pool(cfg: ModelConfig, context: int | None = None, llc_bytes: int | None = None) -> TwoPool:
    """The pools of ``cfg`` at ``context`` positions of attention cache (None: a full
    window, the steady state of a long generation); ``llc_bytes`` (see
    :func:`engine_llc_bytes`) decides which matrices the engine streams. Counts come from
    :func:`tern.config.param_counts`; ops count 2 per weight read (multiply-add), plus
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
    res_work, st_work, skip_res, skip_st = work_inventory(cfg, context, llc_bytes)
    return TwoPool(cfg.name, pc.resident.bytes, pc.streamed.bytes, pc.expert_bytes_total,
                   pc.state_bytes, pc.kv_bytes(context, cfg), pc.total.bytes, pc.total.params,
                   pc.active.params, res_ops, st_ops, res_work, st_work,
                   min(skip_res, pc.resident.bytes), min(skip_st, pc.streamed.bytes))


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


# ---- host queries ------------------------------------------------------------------------
def cache_levels(host: HostProfile) -> list[CacheLevel]:
    """Data/unified caches, one per level, innermost first."""
    return [c for lv in sorted({c.level for c in host.caches}) if (c := host.cache(lv)) is not None]


def cache_capacity_bytes(host: HostProfile, level: int, threads: int = 1) -> int | None:
    """Bytes of cache ``level`` usable by ``threads`` threads pinned one per core, packed
    from core 0 (None when the level is unknown)."""
    c = host.cache(level)
    if c is None:
        return None
    l1 = host.cache(1)
    smt = max(1, l1.shared_by) if l1 is not None else 1
    cores_per_instance = max(1, c.shared_by // smt)
    used = min(c.instances, max(1, math.ceil(threads / cores_per_instance)))
    return c.size_bytes * used


def llc_capacity_bytes(host: HostProfile, threads: int = 1) -> int:
    """Last-level cache bytes usable at ``threads`` (0 when no cache is known)."""
    levels = cache_levels(host)
    return (cache_capacity_bytes(host, levels[-1].level, threads) or 0) if levels else 0


def engine_llc_bytes(host: HostProfile) -> int:
    """The last-level cache one core sees: what the engine's streaming rule compares the
    pools with (tern.roofline_ops.stream_row_bytes; the engine reads the same size from
    the OS, tern.engine.decode)."""
    return llc_capacity_bytes(host, 1)


def memory_roof(host: HostProfile, working_set_bytes: float, threads: int = 1) -> str:
    """"L1", "L2", "L3"... for the innermost cache the working set fits, else "DRAM"."""
    for c in cache_levels(host):
        cap = cache_capacity_bytes(host, c.level, threads)
        if cap and working_set_bytes <= cap:
            return f"L{c.level}"
    return "DRAM"


def bandwidth_gbps(host: HostProfile, working_set_bytes: float, threads: int = 1) -> float:
    """Read GB/s at a working set: the host's interpolated curve, lifted to its
    non-increasing envelope (a working set never reads slower than any larger measured
    one). The envelope removes timer noise at tiny sizes and keeps every prediction
    monotone in bytes."""
    bw = host.bandwidth_at(working_set_bytes, threads)
    avail = host.thread_counts()
    t = min(avail, key=lambda a: (abs(a - threads), -a))
    right = [p.gbps_median for p in host.curve(t) if p.working_set_bytes >= working_set_bytes]
    return max([bw, *right])


def with_dram_bandwidth(host: HostProfile, threads: int, gbps: float) -> HostProfile:
    """``host`` with the beyond-LLC part of its read curve at ``threads`` scaled so that its
    largest working set reads ``gbps``: a DRAM figure measured again beside a decode run
    (on shared VMs the DRAM bandwidth moves between regimes over minutes, so the probe's
    figure can be stale by the time a model runs). Cache-resident points are kept."""
    if not (gbps > 0 and math.isfinite(gbps)):
        raise ValueError(f"gbps must be a positive number, got {gbps!r}")
    avail = host.thread_counts()
    if not avail:
        raise ValueError(f"host profile {host.label!r} has no read-bandwidth curve")
    t = min(avail, key=lambda a: (abs(a - threads), -a))
    llc = llc_capacity_bytes(host, t)
    far = host.curve(t)[-1]
    f = gbps / far.gbps_median

    def scaled(p: BandwidthPoint) -> BandwidthPoint:
        if p.kernel != "read" or p.threads != t or p.working_set_bytes <= llc:
            return p
        return replace(p, gbps_best=p.gbps_best * f, gbps_median=p.gbps_median * f,
                       gbps_min=None if p.gbps_min is None else p.gbps_min * f,
                       runs_gbps=tuple(g * f for g in p.runs_gbps))

    return replace(host, bandwidth=tuple(scaled(p) for p in host.bandwidth))


def kernel_gops_for(host: HostProfile, fmt: str, threads: int = 1) -> float | None:
    """Best measured kernel throughput (Gops/s, multiply-add = 2) able to run ``fmt``
    (``"fp32"`` also stands for element-wise work) with at most ``threads`` threads (an
    engine may always use fewer; when no figure is at or below ``threads``, the nearest
    thread count); None when the profile has none."""
    prefixes = _KERNEL_PREFIXES[_family(fmt)]
    rows = [k for k in host.kernels if k.kernel.startswith(prefixes) and k.gops_median > 0]
    if not rows:
        return None
    usable = [k for k in rows if k.threads <= threads]
    if not usable:
        t = min({k.threads for k in rows}, key=lambda a: (abs(a - threads), -a))
        usable = [k for k in rows if k.threads == t]
    return max(k.gops_median for k in usable)


def calibration(host: HostProfile, threads: int = 1) -> tuple[float, float]:
    """(per_token_overhead_s, bandwidth_efficiency) from the profile, validated. A key
    suffixed ``_t{threads}`` (measured at that thread count) wins over the plain key."""
    cal = host.calibration or {}
    over = float(cal.get(f"per_token_overhead_s_t{threads}", cal.get("per_token_overhead_s", 0.0)))
    eff = float(cal.get(f"bandwidth_efficiency_t{threads}", cal.get("bandwidth_efficiency", 1.0)))
    if not (math.isfinite(over) and over >= 0):
        raise ValueError(f"calibration per_token_overhead_s must be >= 0 s, got {over!r}")
    if not (math.isfinite(eff) and 0 < eff <= 1.5):
        raise ValueError(f"calibration bandwidth_efficiency must be in (0, 1.5], got {eff!r}")
    return over, eff


# ---- prediction --------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolPrediction:
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


def predict_pools(pools: TwoPool, host: HostProfile, threads: int = 1, policy: str = "reuse",
                  context: int | None = None) -> Prediction:
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
    ws = {"resident": pools.footprint_bytes if policy == "reuse" else hot, "streamed": hot}
    nbytes = {"resident": pools.resident_bytes + pools.state_bytes + pools.kv_bytes,
              "streamed": pools.streamed_bytes}
    ops = {"resident": pools.resident_ops, "streamed": pools.streamed_ops}
    work = {"resident": pools.resident_work, "streamed": pools.streamed_work}
    read = {"resident": nbytes["resident"] - pools.resident_skipped_bytes,
            "streamed": nbytes["streamed"] - pools.streamed_skipped_bytes}
    work_s = {name: work_seconds(w, host, threads) for name, w in work.items()} if host.op_costs else {}
    op_model = bool(pools.resident_work) and bool(work_s) and None not in work_s.values()
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
            stall_s = read[name] * (share * max(0.0, 1.0 / (bw * 1e9) - 1.0 / (ref_bw * 1e9))
                                    + (1.0 - share) * max(0.0, 1.0 / (bw_1 * 1e9) - 1.0 / (ref_bw_1 * 1e9)))
            mem_s = read[name] * (share / (bw * 1e9) + (1.0 - share) / (bw_1 * 1e9))
            bw = read[name] / mem_s / 1e9 if mem_s > 0 else bw  # the effective mix
            comp_s = work_s[name]
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
            fmt: str | None = None, policy: str = "reuse") -> Prediction:
    """Predicted batch-1 decode tok/s of ``cfg`` on ``host`` with a per-pool breakdown.

    ``context``: attention positions cached (None: a full window). ``fmt``: override the
    format of every linear layer (see :func:`with_format`). ``policy``: "reuse" or "whole"
    working sets (module docstring)."""
    if fmt is not None:
        cfg = with_format(cfg, fmt)
    ctx = cfg.attn_window if context is None else context
    return predict_pools(two_pool(cfg, ctx, engine_llc_bytes(host)), host, threads, policy, ctx)


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
    tern.formats), total = ``total_over_active`` x active (1.0: dense)."""
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


# ---- the reference PC ----------------------------------------------------------------------
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
# Ryzen 5 3600X: figures from ../shared/SEED_NOTES.md ("published") and estimates.
REFERENCE_FIGURES = {
    "l1d_bytes": 32 * KIB,  # published, per core
    "l2_bytes": 512 * KIB,  # published, per core
    "l3_bytes": 16 * MIB,  # published, per 3-core complex (2 complexes)
    "l1_read_gbps_per_core": 200.0,  # estimate: 2 x 32 B loads/cycle at ~4 GHz = 256 GB/s peak, ~80 %
    "l2_read_gbps_per_core": 120.0,  # estimate: 32 B/cycle from L2 at ~4 GHz = 128 GB/s peak
    "l3_read_gbps_1t": 100.0,  # published: ~88-116 GB/s while L3 resident (single thread)
    "dram_read_gbps_1t": 28.0,  # published: ~28 GB/s from DRAM (single thread)
    "dram_read_gbps_max": 40.0,  # estimate: ~78 % of the 51.2 GB/s dual-channel DDR4-3200 peak
    "ram_bytes": 32 * GIB,  # assumption (not published): a 32 GiB desktop
}
REFERENCE_ESTIMATES = (
    "L1 and L2 read bandwidth (from load ports x ~4 GHz, ~80-95 % of peak)",
    "multi-thread cache bandwidth (single-thread figure scaled linearly per core)",
    "multi-thread DRAM bandwidth (28 GB/s at 1 thread rising to ~40 GB/s at >= 3 threads)",
    "shape of each knee (log-linear from one level's capacity to twice it)",
    "ram_bytes (32 GiB assumed)",
)


def _reference_curve(threads: int) -> list[BandwidthPoint]:
    f = REFERENCE_FIGURES
    t = threads
    c1, c2 = f["l1d_bytes"] * t, f["l2_bytes"] * t
    c3 = f["l3_bytes"] * min(2, math.ceil(t / 3))
    l1, l2 = f["l1_read_gbps_per_core"] * t, f["l2_read_gbps_per_core"] * t
    l3 = f["l3_read_gbps_1t"] * t
    dram = min(f["dram_read_gbps_max"],
               f["dram_read_gbps_1t"] + (f["dram_read_gbps_max"] - f["dram_read_gbps_1t"]) * (t - 1) / 2)
    pts = [(4 * KIB, l1), (c1, l1), (2 * c1, l2), (c2, l2), (2 * c2, l3), (c3, l3), (2 * c3, dram),
           (4 * GIB, dram)]
    return [BandwidthPoint("read", t, int(ws), gbps, gbps, 0) for ws, gbps in pts]


def build_reference_profile() -> HostProfile:
    """The reference PC (Ryzen 5 3600X) as a HostProfile, from :data:`REFERENCE_FIGURES`.

    Read-bandwidth curves for 1..6 threads: a plateau per level up to its capacity at that
    thread count, a log-linear fall to the next level's plateau at twice the capacity, DRAM
    beyond twice the usable L3 (16 MiB at 1-3 threads, 32 MiB at 4-6: threads packed per
    3-core complex). No kernel figures (no compute roof) and no calibration: predictions
    on it are memory-roof upper bounds. ``repeats`` is 0 on every point: not measured.
    """
    f = REFERENCE_FIGURES
    caches = (CacheLevel(1, "Data", f["l1d_bytes"], 6, 2), CacheLevel(1, "Instruction", 32 * KIB, 6, 2),
              CacheLevel(2, "Unified", f["l2_bytes"], 6, 2), CacheLevel(3, "Unified", f["l3_bytes"], 2, 6))
    host = {
        "cpu_model": "AMD Ryzen 5 3600X (Zen 2, AVX2, no AVX-512 / VNNI)",
        "physical_cores": 6, "logical_cpus": 12, "memory": "DDR4-3200 dual channel (51.2 GB/s peak)",
        "ram_bytes": f["ram_bytes"], "source": "published figures collected in SEED_NOTES.md",
        "figures": {k: v for k, v in f.items()}, "estimates": list(REFERENCE_ESTIMATES),
    }
    pts = tuple(p for t in range(1, 7) for p in _reference_curve(t))
    return HostProfile(REFERENCE_LABEL, False, host, caches, "published", pts)


def write_reference_profile(path: str | Path = REFERENCE_PATH) -> Path:
    """Regenerate the bundled JSON from :func:`build_reference_profile` (atomic)."""
    build_reference_profile().save(path)
    return Path(path)


def load_reference_profile() -> HostProfile:
    """The bundled reference-PC profile (tern/reference/ryzen_3600x.json)."""
    return HostProfile.load(REFERENCE_PATH)


def resolve_host(path: str | Path | None = None, results: str | Path | None = "results",
                 reference: bool = False, probe_if_missing: bool = False) -> HostProfile:
    """The profile to predict for: ``path`` if given; else ``<results>/host_profile.json``
    when present; else a quick probe (only with ``probe_if_missing`` and when tern.probe is
    available); else the reference PC. Says which on stderr."""
    if reference:
        return load_reference_profile()
    if path is not None:
        return HostProfile.load(path)
    if results is not None:
        from .notebook import results_dir

        p = Path(results) if Path(results).is_absolute() else results_dir(results)
        cand = p / "host_profile.json"
        if cand.exists():
            print(f"host profile: {cand}", file=sys.stderr)
            return HostProfile.load(cand)
    if probe_if_missing:
        prof = _quick_probe()
        if prof is not None:
            return prof
    print(f"no host profile found (run `tern probe`); using the {REFERENCE_LABEL}", file=sys.stderr)
    return load_reference_profile()


def _quick_probe() -> HostProfile | None:
    """A quick probe of this machine through tern.probe, or None when unavailable."""
    try:
        from . import probe
    except ImportError:
        return None
    for name in ("quick_profile", "probe_quick"):
        fn = getattr(probe, name, None)
        if fn is not None:
            return fn()
    fn = getattr(probe, "probe", None)
    if fn is None:
        return None
    try:
        return fn(quick=True)
    except TypeError:
        return None


# ---- tables ----------------------------------------------------------------------------------
def hosts_for_comparison(host: HostProfile) -> dict[str, HostProfile]:
    """{"your machine": host, "reference PC": the bundled reference} (only the reference
    when ``host`` is the reference itself)."""
    ref = load_reference_profile()
    return {"reference PC": ref} if host == ref else {"your machine": host, "reference PC": ref}


def thread_choices(host: HostProfile) -> tuple[int, ...]:
    """1 and the largest thread count the profile measured."""
    return tuple(sorted({1, max(host.thread_counts() or [1])}))


def predict_table(configs: list[ModelConfig], hosts: dict[str, HostProfile],
                  threads: tuple[int, ...] | None = None, context: int | None = None,
                  policy: str = "reuse") -> list[dict[str, Any]]:
    """One row per (config, host, threads): tok/s, bytes and bound per pool. ``threads``
    None: :func:`thread_choices` of each host."""
    rows = []
    for cfg in configs:
        for label, host in hosts.items():
            for t in threads or thread_choices(host):
                p = predict(cfg, host, t, context, policy=policy)
                rows.append({"config": cfg.name, "host": label, "threads": t, "tok_per_s": p.tok_per_s,
                             "active_bytes": p.active_bytes, "hot_bytes": p.hot_bytes,
                             "resident_bound": p.resident.bound, "streamed_bound": p.streamed.bound,
                             "bound": p.bound})
    return rows


def render_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'config':<10} {'host':<12} {'thr':>3} {'tok/s':>10} {'active MB':>10} {'hot MB':>9} "
             f"{'resident':>9} {'streamed':>9}"]
    for r in rows:
        lines.append(f"{r['config']:<10} {r['host'][:12]:<12} {r['threads']:>3} {r['tok_per_s']:>10.1f} "
                     f"{r['active_bytes'] / 1e6:>10.2f} {r['hot_bytes'] / 1e6:>9.1f} "
                     f"{r['resident_bound']:>9} {r['streamed_bound']:>9}")
    return "\n".join(lines)


def render_prediction(p: Prediction) -> str:
    """The breakdown table of one prediction."""
    lines = [f"{p.config} on {p.host_label}", f"  threads {p.threads} (bandwidth curve: {p.curve_threads}), "
             f"context {p.context}, policy {p.policy}, usable LLC {p.llc_bytes / MIB:.1f} MiB",
             f"  {'pool':<9} {'MB/token':>9} {'ws MB':>9} {'GB/s':>8} {'mem us':>9} {'Gops':>8} "
             f"{'comp us':>9} {'stall us':>9} {'time us':>9} {'bound':>8}"]
    for q in (p.resident, p.streamed):
        lines.append(f"  {q.name:<9} {q.bytes_per_token / 1e6:>9.3f} {q.working_set_bytes / 1e6:>9.2f} "
                     f"{q.bandwidth_gbps:>8.1f} {q.memory_s * 1e6:>9.1f} {q.ops_per_token / 1e9:>8.3f} "
                     f"{q.compute_s * 1e6:>9.1f} {q.stall_s * 1e6:>9.1f} {q.time_s * 1e6:>9.1f} {q.bound:>8}")
    lines.append(f"  overhead {p.overhead_s * 1e6:.1f} us; state {p.state_bytes / 1e6:.3f} MB, "
                 f"kv {p.kv_bytes / 1e6:.3f} MB, total weights {p.total_bytes / 1e6:.1f} MB")
    how = ("op-cost model: time = measured op costs + memory stall" if p.model == "op-cost"
           else "roofline: time = max(memory, compute)")
    lines.append(f"  => {p.tok_per_s:.1f} tok/s ({p.s_per_token * 1e6:.1f} us/token), bound: {p.bound} ({how})")
    return "\n".join(lines)


# ---- CLI: tern predict --------------------------------------------------------------------
JSON_FIELDS = """\
  predictions: [Prediction: config, host_label, threads, curve_threads, context, policy,
                tok_per_s, s_per_token, overhead_s, state_bytes, kv_bytes, active_bytes,
                total_bytes, active_params, total_params, hot_bytes, llc_bytes, bound,
                model ("op-cost" | "roofline"),
                resident / streamed: {bytes_per_token, working_set_bytes, bandwidth_gbps, stall_s,
                memory_s, ops_per_token, compute_s, time_s, bound}]"""


def cli_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", nargs="+", default=["sandbox"],
                   help="presets or config JSON files (default: sandbox)")
    p.add_argument("--host", default=None,
                   help="host profile JSON (default: results/host_profile.json, else the reference PC)")
    p.add_argument("--reference", action="store_true", help="use the bundled reference PC profile")
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--context", type=int, default=None,
                   help="attention positions cached (default: a full window)")
    p.add_argument("--format", dest="fmt", default=None, choices=sorted(FORMATS),
                   help="override the format of every linear layer")
    p.add_argument("--policy", default="reuse", choices=POLICIES, help="working-set policy")


def cli_run(args: argparse.Namespace) -> dict[str, Any]:
    host = resolve_host(args.host, reference=args.reference)
    preds = [predict(load_config(c), host, t, args.context, args.fmt, args.policy).to_dict()
             for c in args.config for t in args.threads]
    return {"predictions": preds}


def cli_render(result: dict[str, Any]) -> str:
    out = []
    for d in result["predictions"]:
        d = dict(d, resident=PoolPrediction(**d["resident"]), streamed=PoolPrediction(**d["streamed"]))
        out.append(render_prediction(Prediction(**d)))
    return "\n\n".join(out)


if __name__ == "__main__":  # pragma: no cover - regenerate the bundled reference profile
    print(write_reference_profile())
