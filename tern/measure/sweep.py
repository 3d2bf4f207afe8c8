"""Decode sweeps: measured tok/s against the roofline's prediction, from cache-resident to
DRAM-bound models (random weights from ``random_model``; no training needed).

Families
- ``fixed_active``: one active budget, total grown by adding routed experts (the knee:
  tok/s falls while the working set leaves the cache, then follows only the router bytes).
- ``fixed_total``: one expert pool, active grown through top-k.

Each point runs in a fresh subprocess (``python -m tern.measure.sweep_worker``) so its peak RSS is its own;
models are cached by config hash under ``models_dir``. Rows are appended to a JSONL file as each point finishes,
so an interrupted sweep resumes and a larger sweep reuses every finished point (same key: config, threads, ...).
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tern.core.config import ModelConfig, param_counts
from tern.core.host_caches import usable_cpus
from tern.core.host_profile import HostProfile, op_curve_for
from tern.core.records import append_jsonl, read_jsonl, run_metadata
from tern.kernels.policy import LAYOUT_MODES, EnginePolicy
from tern.measure.sweep_models import check_free_space, ensure_model, model_path, plan_models
from tern.predict.roofline import stream_prefetch_mismatch
from tern.probe.bandwidth import ReadNow, read_reference
from tern.probe.core_latency import round_trip_ns
from tern.probe.curves import kernel_reference
from tern.probe.placement import RoundTripNow
from tern.probe.profile import engine_policy

# Engine/measurement protocol version: bump when the measurement changes meaning.
MEASURE_VERSION = 3  # 3: streaming kernel for long DRAM rows, unmasked 128-column tails; 2: expert-parallel engine (threads > 1); rows of older engines are not reused

JSON_FIELDS = """\
  records: path of the JSONL file; host: host profile label
  points: [{key, family, budget, name, threads, total_params, active_params, total_bytes, active_bytes,
            file_bytes, tok_per_s (median), tok_per_s_min, tok_per_s_max, repeats, tokens, peak_rss_bytes,
            predicted_tok_per_s, ratio (measured/predicted), predicted_bound, predicted_model (op-cost | roofline),
            predicted_compute_s, predicted_stall_s, predicted_overhead_s (seconds per token), read_same_run
            {gbps_median, ...} and host_read_ratio (the read rate timed before the point over the profile's at its
            total bytes), kernel_same_run {seconds_per_call, ...} and host_kernel_ratio (the 4-row ternary pass's
            speed then over the profile's), core_round_trip_ns (threads > 1: the threads' round trip), reused}]
  accuracy: {n, median_ratio, worst_ratio, within_25pct (fraction)}"""


# ---- families -------------------------------------------------------------------------------
# Active budgets; int8 routers and tied embedding / head, so the streamed experts and mixers dominate the bytes.
BUDGETS: dict[str, ModelConfig] = {
    "4m": ModelConfig(
        name="sweep-4m", vocab_size=1024, d_model=256, n_layers=4, attn_layers=(2,), n_heads=4,
        mlp_hidden=0, moe_layers=(1, 3), n_experts=1, top_k=1, expert_hidden=2048,
        embed_format="int8", head_format="int8", router_format="int8"),
    "30m": ModelConfig(
        name="sweep-30m", vocab_size=1024, d_model=512, n_layers=6, attn_layers=(3,), n_heads=8,
        mlp_hidden=0, moe_layers=(1, 3, 5), n_experts=1, top_k=1, expert_hidden=4096,
        embed_format="int8", head_format="int8", router_format="int8"),
}
# Coarse experts (hidden 2048 / 4096, top-1): a router costs E x D bytes per MoE layer (~1.33/hidden of the expert
# bytes in int8), so at 2 GB total only large experts keep it small. Granular experts are studied by the gates.


def experts_for_total_bytes(base: ModelConfig, total_bytes: float) -> int:
    """Routed experts per layer that bring ``base`` to about ``total_bytes`` packed."""
    one, two = (param_counts(base.replace(n_experts=max(base.top_k, 1) + i)) for i in (0, 1))
    extra = max(total_bytes - one.total.bytes, 0)
    return max(base.top_k, int(round(max(base.top_k, 1) + extra / (two.total.bytes - one.total.bytes))))


def fixed_active_family(budget: str, max_total_bytes: float = 2.2e9,
                        points_per_octave: float = 1.0) -> list[ModelConfig]:
    """Configs with the budget's active params and totals from the smallest (top_k
    experts) up to ``max_total_bytes``, about ``points_per_octave`` per doubling."""
    base = _budget(budget)
    lo = param_counts(base.replace(n_experts=base.top_k)).total.bytes
    n = max(int(round(points_per_octave * max(1.0, math.log2(max_total_bytes / lo)))), 1)
    out, seen = [], set()
    for i in range(n + 1):
        tb = lo * (max_total_bytes / lo) ** (i / n)
        e = experts_for_total_bytes(base, tb)
        if e not in seen:
            seen.add(e)
            out.append(base.replace(name=f"{base.name}-e{e}", n_experts=e))
    return out


def fixed_total_family(budget: str, n_experts: int = 64, top_ks: Iterable[int] = (1, 2, 4, 8, 16)
                       ) -> list[ModelConfig]:
    """Configs sharing one expert pool (``n_experts`` per layer) with growing top-k."""
    base = _budget(budget)
    return [base.replace(name=f"{base.name}-e{n_experts}-k{k}", n_experts=n_experts, top_k=k)
            for k in top_ks if k <= n_experts]


def _budget(name: str) -> ModelConfig:
    try:
        return BUDGETS[name]
    except KeyError:
        raise ValueError(f"unknown sweep budget {name!r}; budgets: {', '.join(BUDGETS)}") from None


# ---- points ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepPoint:
    family: str  # "fixed_active" | "fixed_total" | "preset"
    budget: str
    config: ModelConfig
    threads: int
    tokens: int = 64
    repeats: int = 3
    warmup: int = 16
    min_time_s: float = 0.0  # each sample repeats its run of ``tokens`` until it timed this long
    region: bool = True  # the engine's one-region step (its default; False: Engine(region=False)); threads > 1
    layout: str = "auto"  # Engine(layout=...): its default, rows as stored, or "blocked16" (tern.kernels.kernels_blocked)

    def __post_init__(self) -> None:
        if self.threads < 1 or self.tokens < 1 or self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"bad sweep point settings: threads={self.threads}, "
                             f"tokens={self.tokens}, repeats={self.repeats}, warmup={self.warmup}")
        if not (isinstance(self.min_time_s, (int, float)) and 0 <= self.min_time_s <= 60):
            raise ValueError(f"sweep point min_time_s must be seconds in [0, 60], got {self.min_time_s!r}")
        if not isinstance(self.region, bool) or self.layout not in LAYOUT_MODES:
            raise ValueError(f"sweep point region must be a bool, layout one of {LAYOUT_MODES}: {self.region!r}, {self.layout!r}")

    @property
    def key(self) -> str:
        spec = {"config": self.config.to_dict(), "threads": self.threads, "tokens": self.tokens,
                "repeats": self.repeats, "warmup": self.warmup, "v": MEASURE_VERSION}
        if self.min_time_s:  # keys of points measured before samples had a minimum time stay valid
            spec["min_time_s"] = float(self.min_time_s)
        if self.region and self.threads > 1:  # likewise (one thread runs the plain step either way)
            spec["region"] = True
        spec.update({"layout": self.layout} if self.layout != "rows" else {})  # likewise (rows: the engine before "auto")
        blob = json.dumps(spec, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# A full sweep's samples: 5 per point, each >= 0.25 s of decoding (a 64-token run of the small models
# lasts 5-30 ms: one hiccup of a shared VM decided a sample, e.g. 621 / 1,411 / 1,790 tok/s).
FULL_TIMING = {"repeats": 5, "min_time_s": 0.25}


def default_points(quick: bool = False, threads: Iterable[int] | None = None) -> list[SweepPoint]:
    """The sweep the notebooks and `tern bench sweep` run (``quick``: a few small points)."""
    if threads is None:
        threads = (1,) if quick else sorted({1, usable_cpus()})
    pts: list[SweepPoint] = []
    for t in threads:
        if quick:
            for cfg in fixed_active_family("4m", max_total_bytes=6e6, points_per_octave=0.5):
                pts.append(SweepPoint("fixed_active", "4m", cfg, t, tokens=16, repeats=3, warmup=4))
            continue
        for b in BUDGETS:
            for cfg in fixed_active_family(b):
                pts.append(SweepPoint("fixed_active", b, cfg, t, **FULL_TIMING))
        for cfg in fixed_total_family("30m"):
            pts.append(SweepPoint("fixed_total", "30m", cfg, t, **FULL_TIMING))
    return pts


# ---- measuring ------------------------------------------------------------------------------

Measure = Callable[[Path, SweepPoint], dict[str, Any]]


def measure_in_subprocess(path: Path, point: SweepPoint, timeout_s: float = 1800, cwd: Path | None = None,
                          env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the decode measurement in a fresh interpreter (own peak RSS) in ``cwd`` with ``env``
    (benchmarks/code_ab.py: another checkout's ``tern`` and numba cache); returns its JSON."""
    cmd = [sys.executable, "-m", "tern.measure.sweep_worker", str(path), "--threads", str(point.threads),
           "--tokens", str(point.tokens), "--repeats", str(point.repeats), "--warmup", str(point.warmup),
           "--min-time-s", repr(float(point.min_time_s)), "--region" if point.region else "--no-region",
           "--layout", point.layout]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=cwd, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"sweep worker failed for {path.name} ({point.threads} threads):\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def predicted(cfg: ModelConfig, host: HostProfile, threads: int,
              engine_policy: EnginePolicy | None = None, tokens: int | None = None) -> dict[str, Any]:
    """The prediction beside a measured point: at the mean context of a run of ``tokens``
    decoded from a reset (tern.predict.pools.decoded_context; None: a full window)."""
    from tern.predict.pools import decoded_context
    from tern.predict.roofline import predict

    p = predict(cfg, host, threads=threads, context=decoded_context(tokens, cfg.attn_window),
                engine_policy=engine_policy)
    return {"predicted_tok_per_s": p.tok_per_s, "predicted_bound": p.bound,
            "hot_bytes": p.hot_bytes, "predicted_model": p.model,
            "predicted_compute_s": p.resident.compute_s + p.streamed.compute_s,
            "predicted_stall_s": p.resident.stall_s + p.streamed.stall_s,
            "predicted_overhead_s": p.overhead_s}


KernelNow = Callable[[int, int, int], dict]  # (threads, rows, cols) -> tern.probe.curves.kernel_reference's dict


def host_now(host: HostProfile, working_set_bytes: int, threads: int, read_now: ReadNow | None,
             kernel_now: KernelNow | None = None,
             round_trip_now: RoundTripNow | None = None) -> dict[str, Any]:
    """The host timed right before a sweep point, against its probe: the read kernel at the
    point's working set (``read_now``; {read_same_run, host_read_ratio}: now / at the probe)
    and the engine's 4-row ternary pass on cache-resident matrices (``kernel_now``, with
    the shape of the profile's curve; {kernel_same_run, host_kernel_ratio}: speed now /
    at the probe); at threads > 1 ``round_trip_now``'s ``core_round_trip_ns`` (where the threads'
    cores sit: tern.probe.core_latency). None skips each. A ratio away from 1: the host runs faster or
    slower than when probed (a shared VM drifts), moving measured / predicted with no fault of the model."""
    out: dict[str, Any] = {}
    if threads > 1 and round_trip_now is not None:
        out["core_round_trip_ns"] = round_trip_now()
    if read_now is not None:
        ref = read_now(max(int(working_set_bytes), 4096), threads)
        out.update(read_same_run=dict(ref), host_read_ratio=None)
        if host.thread_counts():
            then = host.bandwidth_at(working_set_bytes, threads)
            out["host_read_ratio"] = ref["gbps_median"] / then if then > 0 else None
    curve = op_curve_for(host.op_curves, "ternary_matvec", "serial" if threads == 1 else "experts", threads)
    if kernel_now is not None and curve is not None:
        ref = kernel_now(curve.threads, curve.rows, curve.cols)
        then = curve.seconds_at(ref["working_set_bytes"])
        out.update(kernel_same_run=dict(ref), host_kernel_ratio=then / ref["seconds_per_call"])
    return out


def run_sweep(points: list[SweepPoint], records: str | Path, models_dir: str | Path,
              host: HostProfile, measure: Measure = measure_in_subprocess,
              progress: bool = True, keep_models: bool = True,
              read_now: ReadNow | None = read_reference,
              kernel_now: KernelNow | None = kernel_reference,
              round_trip_now: RoundTripNow | None = round_trip_ns) -> list[dict[str, Any]]:
    """Measure every point not already in ``records``; returns all points' rows in order. Before each measured
    point :func:`host_now` times the host (``read_now``, ``kernel_now``, ``round_trip_now``; None skips each).
    The models the points need are checked against the free disk before the first is built
    (tern.measure.sweep_models: OSError ENOSPC with the figures); ``keep_models=False`` deletes each
    model this call built once its last point is measured (room for the largest one only)."""
    from tqdm.auto import tqdm

    records, models_dir = Path(records), Path(models_dir)
    done = {r["key"]: r for r in read_jsonl(records) if r.get("kind") == "sweep_point"}
    rows, warned = [], False
    todo = [p for p in points if p.key not in done]
    plan = plan_models((p.config for p in todo), models_dir)
    check_free_space(plan, keep_models)
    built = {path for path, _ in plan.to_write}
    last_use = {model_path(p.config, models_dir): p.key for p in todo}
    bar = tqdm(total=len(todo), desc="sweep", unit="point", file=sys.stderr, disable=not progress)
    for p in points:
        if p.key in done:  # the measurement is reused; the prediction is this host's, now
            row = {**done[p.key], **predicted(p.config, host, p.threads, EnginePolicy.of_record(done[p.key]), p.tokens),
                   "host_label": host.label, "reused": True}
            row["ratio"] = row["tok_per_s"] / row["predicted_tok_per_s"]
            rows.append(row)
            continue
        bar.set_postfix_str(f"{p.config.name} t{p.threads}")
        path = ensure_model(p.config, models_dir)
        pc = param_counts(p.config)
        now = host_now(host, pc.total.bytes, p.threads, read_now, kernel_now, round_trip_now)
        t0 = time.perf_counter()
        m = measure(path, p)
        policy = EnginePolicy.of_record(m) if "engine_policy" in m else engine_policy()  # what the engine split
        note = stream_prefetch_mismatch(host, p.threads, policy)
        if note and not warned:  # once a sweep
            warned = True
            print(f"sweep: {note}", file=sys.stderr)
        row = {
            "kind": "sweep_point", "key": p.key, "family": p.family, "budget": p.budget,
            "name": p.config.name, "config": p.config.to_dict(), "threads": p.threads,
            "total_params": pc.total.params, "active_params": pc.active.params,
            "total_bytes": pc.total.bytes, "active_bytes": pc.active.bytes,
            "resident_bytes": pc.resident.bytes, "streamed_bytes": pc.streamed.bytes,
            "file_bytes": path.stat().st_size, "tokens": p.tokens, "warmup": p.warmup,
            "min_time_s": p.min_time_s,
            **{k: m[k] for k in ("tok_per_s", "tok_per_s_min", "tok_per_s_max", "repeats",
                                 "samples_tok_per_s", "runs_per_sample", "peak_rss_bytes") if k in m},
            **now,
            **predicted(p.config, host, p.threads, policy, p.tokens), "host_label": host.label,
            "engine_policy": policy.to_dict(),  # what the measuring engine split over threads
            "measure_wall_s": time.perf_counter() - t0, **run_metadata(p.threads),
        }
        row["ratio"] = row["tok_per_s"] / row["predicted_tok_per_s"]
        append_jsonl(records, row)
        rows.append({**row, "reused": False})
        if not keep_models and path in built and last_use[path] == p.key:
            path.unlink(missing_ok=True)
        bar.update(1)
    bar.close()
    return rows


def accuracy(rows: list[dict[str, Any]]) -> dict[str, float]:
    import statistics

    ratios = [r["ratio"] for r in rows]
    if not ratios:
        return {"n": 0}
    return {"n": len(ratios), "median_ratio": statistics.median(ratios),
            "worst_ratio": max(ratios, key=lambda x: abs(x - 1.0)),
            "within_25pct": sum(abs(x - 1) <= 0.25 for x in ratios) / len(ratios)}


def preset_points(names: Iterable[str] = ("105m", "206m"), threads: Iterable[int] = (1,),
                  tokens: int = 64, repeats: int = 3, warmup: int = 16,
                  min_time_s: float = 0.0) -> list[SweepPoint]:
    """Points for named presets (e.g. the 105M / 206M pair with equal active params)."""
    from tern.core.config import get_preset

    return [SweepPoint("preset", n, get_preset(n), t, tokens, repeats, warmup, min_time_s)
            for t in threads for n in names]


def pair_summary(rows: list[dict[str, Any]], a: str = "105m", b: str = "206m") -> list[dict[str, Any]]:
    """Per thread count: measured and predicted tok/s of presets ``a`` and ``b`` and the
    measured ratio b/a (1.0 = equal speed at twice the total)."""
    out = []
    for t in sorted({r["threads"] for r in rows if r["family"] == "preset"}):
        ra = next((r for r in rows if r["family"] == "preset" and r["budget"] == a and r["threads"] == t), None)
        rb = next((r for r in rows if r["family"] == "preset" and r["budget"] == b and r["threads"] == t), None)
        if ra and rb:
            out.append({"threads": t, f"{a}_tok_per_s": ra["tok_per_s"], f"{b}_tok_per_s": rb["tok_per_s"],
                        f"{a}_predicted": ra["predicted_tok_per_s"], f"{b}_predicted": rb["predicted_tok_per_s"],
                        "measured_ratio": rb["tok_per_s"] / ra["tok_per_s"],
                        f"{a}_total_params": ra["total_params"], f"{b}_total_params": rb["total_params"]})
    return out


def render_rows(rows: list[dict[str, Any]]) -> str:
    """A text table of sweep points: predicted, measured, ratio, peak RSS, the threads' round trip
    (ns) and the host timed beside each point against its probe (read rate / kernel speed, now
    over then); "-" where not timed."""
    lines = [f"{'point':<24} {'thr':>3} {'total MB':>9} {'active MB':>9} {'pred tok/s':>10} {'meas tok/s':>10} "
             f"{'ratio':>6} {'bound':>7} {'RSS MiB':>8} {'trip ns':>7} {'host read/kernel':>16}"]
    for r in rows:
        now = "/".join(f"{r[k]:.2f}" if isinstance(r.get(k), (int, float)) else "-"
                       for k in ("host_read_ratio", "host_kernel_ratio"))
        trip = f"{r['core_round_trip_ns']:.0f}" if isinstance(r.get("core_round_trip_ns"), (int, float)) else "-"
        lines.append(f"{r['name'][:24]:<24} {r['threads']:>3} {r['total_bytes'] / 1e6:9.1f} "
                     f"{r['active_bytes'] / 1e6:9.2f} {r['predicted_tok_per_s']:10.1f} "
                     f"{r['tok_per_s']:10.1f} {r['ratio']:6.2f} {r['predicted_bound']:>7} "
                     f"{r.get('peak_rss_bytes', 0) / 2**20:8.0f} {trip:>7} {now:>16}")
    return "\n".join(lines)


# ---- per-host calibration: a tiny model (negligible bytes and ops) gives the fixed per-token overhead,
# a DRAM-bound one (~80 MB per token) the fraction of read bandwidth the engine attains (tern.predict.roofline).
CALIBRATION_TINY = ModelConfig(name="calib-tiny", vocab_size=256, d_model=64, n_layers=1,
                               mlp_hidden=64, n_heads=2)


def calibration_points(threads: int = 1, quick: bool = False) -> list[SweepPoint]:
    """The tiny (overhead) and DRAM-bound (bandwidth) calibration points; ``quick`` uses a
    ~40 MB model instead of ~300 MB (smoke runs: not DRAM-bound on large caches)."""
    dram = fixed_total_family("30m", n_experts=8 if quick else 64, top_ks=(8 if quick else 16,))[0]
    return [SweepPoint("calibration", "tiny", CALIBRATION_TINY, threads, tokens=256, repeats=5),
            SweepPoint("calibration", "dram", dram, threads, tokens=8 if quick else 32, repeats=3,
                       warmup=2 if quick else 8)]


def calibrate(host: HostProfile, models_dir: str | Path, threads: Iterable[int] = (1,),
              measure: Measure = measure_in_subprocess, quick: bool = False
              ) -> tuple[HostProfile, dict[str, float]]:
    """Measure the engine's per-token overhead and bandwidth efficiency on this host and
    return (host with ``calibration`` filled, the figures). With kernel curves in the profile
    (version 3) the kernels' DRAM rates are measured, so the efficiency stays 1.0 and only
    the residual per-token overhead is checked. Keys per thread count t:
    ``per_token_overhead_s_t{t}``, ``bandwidth_efficiency_t{t}``; the plain keys hold t=1."""
    from dataclasses import replace

    from tern.predict.pools import decoded_context
    from tern.predict.roofline import predict

    bare = replace(host, calibration={})
    cal: dict[str, float] = {}
    for t in threads:
        tiny_pt, dram_pt = calibration_points(t, quick)
        m_tiny = measure(ensure_model(tiny_pt.config, Path(models_dir)), tiny_pt)
        ctx = decoded_context(tiny_pt.tokens, tiny_pt.config.attn_window)  # as the point decoded
        over = max(0.0, 1.0 / m_tiny["tok_per_s"] - predict(tiny_pt.config, bare, threads=t, context=ctx).s_per_token)
        if host.op_curves:  # the kernels' own DRAM rates are measured: no efficiency to fit
            eff = 1.0
        else:
            m_dram = measure(ensure_model(dram_pt.config, Path(models_dir)), dram_pt)
            eff = solve_efficiency(dram_pt.config, bare, t, over, 1.0 / m_dram["tok_per_s"])
        if eff >= EFFICIENCY_RANGE[1] and not host.op_curves:
            print(f"calibration ({t} threads): the engine streamed faster than the profile's read "
                  f"bandwidth allows; bandwidth efficiency capped at {EFFICIENCY_RANGE[1]} (re-run "
                  f"`tern probe` if the machine's bandwidth changed)", file=sys.stderr)
        cal[f"per_token_overhead_s_t{t}"] = over
        cal[f"bandwidth_efficiency_t{t}"] = eff
        if t == 1:
            cal["per_token_overhead_s"], cal["bandwidth_efficiency"] = over, eff
    return replace(host, calibration={**host.calibration, **cal}), cal


# The calibration clamps the fitted bandwidth efficiency here: the engine cannot stream
# faster than the probe's read kernel, so a fit above 1 means the profile's bandwidth figure
# is below what the machine gives now (e.g. a VM whose 2-thread DRAM bandwidth changes
# between regimes over minutes): it is reported and the profile's figure is trusted as is.
EFFICIENCY_RANGE = (0.05, 1.0)


def solve_efficiency(cfg: ModelConfig, host: HostProfile, threads: int, overhead_s: float,
                     measured_s_per_token: float) -> float:
    """The bandwidth efficiency at which the prediction of ``cfg`` (with ``overhead_s``)
    takes ``measured_s_per_token``: bisection in log space (predicted time falls as the
    efficiency rises), clamped to :data:`EFFICIENCY_RANGE`."""
    from dataclasses import replace

    from tern.core.host_queries import engine_llc_bytes
    from tern.predict.pools import two_pool
    from tern.predict.roofline import host_engine_policy, predict_pools, router_table_bytes

    policy = host_engine_policy(host)  # what predict(cfg, host, ...) prices, built once
    pools = two_pool(cfg, cfg.attn_window, engine_llc_bytes(host), policy, router_table_bytes(host, policy))

    def s_per_token(eff: float) -> float:
        cal = {f"per_token_overhead_s_t{threads}": overhead_s, f"bandwidth_efficiency_t{threads}": eff}
        return predict_pools(pools, replace(host, calibration=cal), threads, context=cfg.attn_window).s_per_token

    lo, hi = EFFICIENCY_RANGE
    if s_per_token(hi) >= measured_s_per_token:
        return hi
    if s_per_token(lo) <= measured_s_per_token:
        return lo
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if s_per_token(mid) > measured_s_per_token:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


# ---- `tern bench sweep` -------------------------------------------------------------------


