"""Where a decoded token's time goes, measured: the engine's token step re-run with a cycle
counter read between its operations (issue 16: "a per-op time breakdown of a DRAM-bound
token").

``timed_token_step`` is tern.kernels.ops.token_step with ``llvm.readcyclecounter`` (rdtsc
on x86) read around every operation; it calls the engine's own per-op functions on the
engine's own buffers and computes the same logits bit for bit (tested:
tests/measure/test_peers_op_breakdown.py). Operations are grouped into categories
(:data:`CATEGORIES`): the matrix kernels (mixer projections, dense-MLP / expert gate+up and
down, router, head) and everything beyond them (embedding row, norms, activation
quantizers, attention, SSM conv and scan, activation, residual adds; the head's category holds
the final norm of one vector too). With threads > 1 the
expert-parallel region of a MoE layer is one category (its gate, up and down run inside it),
and the breakdown times the engine with ``region=False`` (a parallel region per matrix: the
default one-region step, tern.kernels.ops_region, has no per-op timers; ``--compare`` times it).

Per thread count, in one process: a warm-up, then ``--repeats`` interleaved runs of
``--tokens`` tokens each of (a) ``Engine.step`` (end to end, with the Python call),
(b) the bare numba ``token_step`` (no Python checks) and (c) the instrumented step; each
category's seconds per token is the median over repeats. The instrumented total against (b)
is the timers' own cost; (a) minus (b) is the Python per-token cost. One JSONL row per thread
count (<results>/bench/op_breakdown.jsonl: tern.core.records.run_metadata, medians, spread, and
the bandwidth utilisation of Engine.step: tern.measure.utilisation, against <results>/host_profile.json;
at threads > 1 ``core_round_trip_ns``, the threads' cache-line round trip timed first: tern.probe.core_latency).

    .venv/bin/python benchmarks/op_breakdown.py [--model FILE.tern] [--threads 1 2]

Default model: the ~250 MB-active DRAM-bound model of benchmarks/dram_model.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numba
import numpy as np

from tern.core.config import param_counts
from tern.core.records import append_jsonl, run_metadata, summarize
from tern.kernels import ops
from tern.kernels.cache_guard import NO_ADDR, ZERO, drop_stale_cache
from tern.kernels.region import cycles, cycles_per_second

CATEGORIES = ("embed", "norm", "quantize", "mixer matvec", "attention", "ssm conv", "ssm scan", "router",
              "ffn gate+up matvec", "activation", "ffn down matvec", "experts (parallel region)",
              "residual", "head matvec")
MATRIX = ("mixer matvec", "router", "ffn gate+up matvec", "ffn down matvec", "experts (parallel region)",
          "head matvec")
(C_EMBED, C_NORM, C_QUANT, C_MIX, C_ATTN, C_CONV, C_SCAN, C_ROUTER, C_GATEUP, C_ACT, C_DOWN, C_EXPAR,
 C_RESID, C_HEAD) = range(len(CATEGORIES))


@numba.njit(cache=True)
def _lap(t0, acc, cat):
    t = cycles()
    acc[cat] += t - t0
    return t


@numba.njit(cache=True)
def _gated_mlp(buf, aux, G, ga, gsa, ua, usa, da, dsa, H, xq, xs, xd, g, u, hq, hd, eps, out, acc, t):
    """ops.gated_mlp with laps: gate+up, activation, quantize, down."""
    D = G[ops.G_D]
    ops.bitlinear(buf, aux, G, ga, gsa, H, D, xq, xs, xd, g)
    ops.bitlinear(buf, aux, G, ua, usa, H, D, xq, xs, xd, u)
    t = _lap(t, acc, C_GATEUP)
    ops.gated_act(G[ops.G_ACT], g, u, H)
    t = _lap(t, acc, C_ACT)
    hs = ops.quant(G, g[:H], hq, hd, eps)
    t = _lap(t, acc, C_QUANT)
    ops.down_proj(buf, aux, G, da, dsa, D, H, hq, hs, hd, out, NO_ADDR, ZERO)
    return _lap(t, acc, C_DOWN)


@numba.njit(cache=True)
def _mixer(buf, aux, G, T, LI, l, eps, ssm_h, conv, kc, vc, pos, work, iwork, acc, t):
    """ops.mixer_step (and ssm_mixer / attn_mixer) with laps."""
    x, xn, out, eo, uz, uc, dbc, dt, y, g, u, sc, pr, wk, xd, hd = ops.carve(work, G)
    xq, hq = ops.icarve(iwork, G)
    D, Di, N, R, K, W = G[ops.G_D], G[ops.G_DI], G[ops.G_N], G[ops.G_R], G[ops.G_K], G[ops.G_WIN]
    ops.rmsnorm(x, ops.f32(buf, aux, T[l, ops.F_NORM1], D), eps, xn)
    t = _lap(t, acc, C_NORM)
    si = LI[l, ops.L_STATE]
    xs = ops.quant(G, xn, xq, xd, eps)
    t = _lap(t, acc, C_QUANT)
    if LI[l, ops.L_KIND] == ops.KIND_SSM:
        ops.bitlinear(buf, aux, G, T[l, ops.F_IN], T[l, ops.F_IN_S], 2 * Di, D, xq, xs, xd, uz)
        t = _lap(t, acc, C_MIX)
        cw = ops.f32(buf, aux, T[l, ops.F_CONV_W], K * Di).reshape(K, Di)
        ops.causal_conv(cw, ops.f32(buf, aux, T[l, ops.F_CONV_B], Di), conv[si], uz[:Di], uc)
        t = _lap(t, acc, C_CONV)
        xs = ops.quant(G, uc, xq, xd, eps)
        t = _lap(t, acc, C_QUANT)
        ops.bitlinear(buf, aux, G, T[l, ops.F_XP], T[l, ops.F_XP_S], R + 2 * N, Di, xq, xs, xd, dbc)
        t = _lap(t, acc, C_MIX)
        ops.scan_channels(buf, aux, G, T, l, ssm_h[si], dbc, uc, uz[Di:2 * Di], dt, y, 0, Di)
        t = _lap(t, acc, C_SCAN)
        xs = ops.quant(G, y, xq, xd, eps)
        t = _lap(t, acc, C_QUANT)
        ops.bitlinear(buf, aux, G, T[l, ops.F_OUT], T[l, ops.F_OUT_S], D, Di, xq, xs, xd, out)
        t = _lap(t, acc, C_MIX)
    else:
        ops.bitlinear(buf, aux, G, T[l, ops.F_IN], T[l, ops.F_IN_S], 3 * D, D, xq, xs, xd, uz)
        t = _lap(t, acc, C_MIX)
        ops.attend(uz[:D], kc[si], vc[si], uz, D, W, G[ops.G_NH], G[ops.G_ATTN_BLOCKS], pos[0], sc, y)
        t = _lap(t, acc, C_ATTN)
        xs = ops.quant(G, y[:D], xq, xd, eps)
        t = _lap(t, acc, C_QUANT)
        ops.bitlinear(buf, aux, G, T[l, ops.F_OUT], T[l, ops.F_OUT_S], D, D, xq, xs, xd, out)
        t = _lap(t, acc, C_MIX)
    for i in range(D):
        x[i] += out[i]
    return _lap(t, acc, C_RESID)


@numba.njit(cache=True)
def _ffn(buf, aux, G, T, LI, l, eps, work, iwork, counts, last, acc, t):
    """ops.ffn_step with laps (shared / dense MLP and routed experts via _gated_mlp)."""
    if T[l, ops.F_NORM2] < 0:
        return t
    x, xn, sacc, eo, uz, uc, dbc, dt, y, g, u, sc, pr, wk, xd, hd = ops.carve(work, G)
    xq, hq = ops.icarve(iwork, G)
    D = G[ops.G_D]
    ops.rmsnorm(x, ops.f32(buf, aux, T[l, ops.F_NORM2], D), eps, xn)
    t = _lap(t, acc, C_NORM)
    xs = ops.quant(G, xn, xq, xd, eps)
    t = _lap(t, acc, C_QUANT)
    for i in range(D):
        sacc[i] = 0.0
    H = LI[l, ops.L_HSH]
    for s in range(LI[l, ops.L_NSH]):
        mb, db = 2 * s * ops.mat_bytes(G, H, D), 2 * s * ops.down_bytes(G, D, H)
        t = _gated_mlp(buf, aux, G, T[l, ops.F_SG] + mb, T[l, ops.F_SG_S] + 8 * s * H, T[l, ops.F_SU] + mb,
                       T[l, ops.F_SU_S] + 8 * s * H, T[l, ops.F_SD] + db, T[l, ops.F_SD_S] + 8 * s * D, H,
                       xq, xs, xd, g, u, hq, hd, eps, eo, acc, t)
        for i in range(D):
            sacc[i] += eo[i]
        t = _lap(t, acc, C_RESID)
    mi = LI[l, ops.L_MOE]
    if mi >= 0:
        H, k = LI[l, ops.L_HE], LI[l, ops.L_TOPK]
        chosen = last[mi]
        ops.route(buf, aux, G, T, LI, l, xn, pr, chosen, wk)
        for j in range(k):
            counts[mi, chosen[j]] += 1
        t = _lap(t, acc, C_ROUTER)
        if ops.experts_parallel(G, k, H):
            eo_all, gs, us, hds, hqs = ops.carve_experts(work, iwork, G)
            Gs = ops.routed_globals(G).copy()
            Gs[ops.G_PAR] = 0
            ops.routed_experts_par(buf, aux, Gs, T, l, chosen, k, H, xq, xs, xd, eps, eo_all, gs, us, hds, hqs)
            t = _lap(t, acc, C_EXPAR)
            for j in range(k):
                w = wk[j]
                for i in range(D):
                    sacc[i] += w * eo_all[j, i]
            t = _lap(t, acc, C_RESID)
        else:
            Gr = ops.routed_globals(G)
            mb, db = ops.routed_steps(G, T, l, H)
            for j in range(k):  # chosen is ascending: the engine's order (MoE skip; breakdown checks it)
                e, w = chosen[j], wk[j]
                t = _gated_mlp(buf, aux, Gr, T[l, ops.F_EG] + e * mb, T[l, ops.F_EG_S] + 8 * e * H,
                               T[l, ops.F_EU] + e * mb, T[l, ops.F_EU_S] + 8 * e * H, T[l, ops.F_ED] + e * db,
                               T[l, ops.F_ED_S] + 8 * e * D, H, xq, xs, xd, g, u, hq, hd, eps, eo, acc, t)
                for i in range(D):
                    sacc[i] += w * eo[i]
                t = _lap(t, acc, C_RESID)
    for i in range(D):
        x[i] += sacc[i]
    return _lap(t, acc, C_RESID)


@numba.njit(cache=True)
def timed_token_step(buf, aux, G, T, LI, eps, token, ssm_h, conv, kc, vc, pos, work, iwork, counts,
                     last, logits, acc):
    """ops.token_step, adding each category's cycles to ``acc`` (len(CATEGORIES),) int64."""
    t = cycles()
    ops.embed_step(buf, aux, G, token, work)
    t = _lap(t, acc, C_EMBED)
    for l in range(G[ops.G_NL]):
        t = _mixer(buf, aux, G, T, LI, l, eps, ssm_h, conv, kc, vc, pos, work, iwork, acc, t)
        t = _ffn(buf, aux, G, T, LI, l, eps, work, iwork, counts, last, acc, t)
    ops.head_step(buf, aux, G, T, eps, work, iwork, logits)  # final norm (one vector) + head matvec
    _lap(t, acc, C_HEAD)
    pos[0] += 1


# The engine files compiled into this module's cached code, found where the imported tern lives
# (not beside this script: run against another checkout or a site install, the guard must hash
# the code it compiled in; a stale cache here once timed the wrong dt layout as a 38 ms scan).
_DEPS = tuple(str(Path(ops.__file__).resolve().parent / f) if f.endswith(".py") else f  # files; compiled-in settings
              for f in ("ops.py", "region.py") + ops._DEPS)
drop_stale_cache(__file__, _DEPS, timed_token_step)


# ---- driving it ------------------------------------------------------------------------------


def timed_tokens(engine, tokens: np.ndarray, acc: np.ndarray) -> float:
    """Seconds per token of the instrumented step over ``tokens`` after a reset; adds cycles to ``acc``."""
    engine.reset()
    if numba.get_num_threads() != engine.threads:
        numba.set_num_threads(engine.threads)
    before, after = engine._before, engine._after
    t0 = time.perf_counter()
    for tok in tokens:
        timed_token_step(*before, int(tok), *after, acc)
    return (time.perf_counter() - t0) / len(tokens)


def breakdown(engine, tokens: int = 32, repeats: int = 5, warmup: int = 8, seed: int = 0) -> dict:
    """Per-category seconds per token (median over repeats), the end-to-end, bare and
    instrumented token times, and their spreads (see the module docstring)."""
    from tern.measure.ladder import time_njit, time_steps

    if not engine.moe_skip or not engine.fused or engine.region:
        raise ValueError("the breakdown instruments the per-matrix token step: moe_skip=True, fused=True, "
                         "region=False (at 1 thread the default engine runs that step)")
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, engine.cfg.vocab_size, size=warmup + tokens)
    hz = cycles_per_second()
    acc = np.zeros(len(CATEGORIES), np.int64)
    time_steps(engine, stream[:max(warmup, 1)])
    timed_tokens(engine, stream[:max(warmup, 1)], acc)
    per: dict[str, list[float]] = {c: [] for c in CATEGORIES}
    step, bare, inst = [], [], []
    for _ in range(repeats):  # interleaved: machine load hits all three alike
        step.append(time_steps(engine, stream[warmup:]))
        bare.append(time_njit(engine, stream[warmup:]))
        acc[:] = 0
        inst.append(timed_tokens(engine, stream[warmup:], acc))
        for i, c in enumerate(CATEGORIES):
            per[c].append(acc[i] / hz / tokens)
    med = {c: summarize(v)["median"] for c, v in per.items()}
    s_step, s_bare, s_inst = summarize(step), summarize(bare), summarize(inst)
    matrix = sum(med[c] for c in MATRIX)
    return {"cycles_per_second": hz, "s_per_token": med,
            "share_of_step": {c: v / s_step["median"] for c, v in med.items()},
            "matrix_s": matrix, "beyond_matrix_s": sum(med.values()) - matrix,
            "python_s": s_step["median"] - s_bare["median"],
            "timer_overhead_s": s_inst["median"] - s_bare["median"],
            "step_s": s_step, "bare_s": s_bare, "instrumented_s": s_inst}


def parse_variant(text: str) -> dict:
    """Engine keyword arguments from ``"act_skip=False,stream=off"`` (True / False / integers
    converted; "" is the default engine)."""
    kw: dict = {}
    for part in filter(None, text.split(",")):
        key, sep, val = part.partition("=")
        if not sep:
            raise ValueError(f"engine variant {part!r}: expected key=value")
        kw[key.strip()] = {"True": True, "False": False}.get(val, int(val) if val.lstrip("-").isdigit() else val)
    return kw


def compare_engines(path, variants: list[str], threads: int, tokens: int = 32, repeats: int = 5,
                    warmup: int = 8, seed: int = 0) -> tuple:
    """Same-run A/B of engine variants (``parse_variant`` strings) on one model file at
    ``threads``: each variant's load seconds, then ``repeats`` rounds of ``Engine.step``
    over ``tokens`` tokens, the variants in a rotating order each round (machine load hits
    all alike); medians per variant, speed-up against the first, and whether every logit
    of the warm-up and timed tokens equals the first variant's (bit for bit).
    Returns (the model's ModelConfig, one dict per variant)."""
    from tern.run.engine import Engine
    from tern.run.timing import time_steps
    from tern.run.weights import mapping_stats

    rng = np.random.default_rng(seed)
    stream = rng.integers(0, 2**31 - 1, size=warmup + tokens)
    engines, loads = [], []
    for v in variants:
        t0 = time.perf_counter()
        engines.append(Engine(path, threads=threads, **parse_variant(v)))
        loads.append(time.perf_counter() - t0)
    stream %= engines[0].cfg.vocab_size
    ref = None
    same = []
    for eng in engines:  # warm-up (compiles, faults pages in) and the exactness check
        eng.reset()
        logits = np.stack([eng.step(int(t)) for t in stream])  # (warmup + tokens, V)
        ref = logits if ref is None else ref
        same.append(bool(np.array_equal(logits, ref)))
    times: list[list[float]] = [[] for _ in engines]
    for r in range(repeats):
        for i in range(len(engines)):
            j = (i + r) % len(engines)
            times[j].append(time_steps(engines[j], stream[warmup:]))
    base = summarize(times[0])["median"]
    cfg = engines[0].cfg
    rows = []
    for v, eng, load, ok, ts in zip(variants, engines, loads, same, times, strict=True):
        s = summarize(ts)
        rows.append({"variant": v, "engine": eng.describe(), "load_s": load, "identical_logits": ok,
                     "weights_mapping": mapping_stats(eng.buf),
                     "step_s": s, "tok_per_s": 1.0 / s["median"], "speedup_vs_first": base / s["median"]})
        eng.close()
    return cfg, rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="results", help="results folder (models/, bench/op_breakdown.jsonl)")
    ap.add_argument("--model", default=None, help="packed model (default: the dram_model.py model)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--compare", nargs="+", default=None, metavar="KEY=VAL[,KEY=VAL]",
                    help="instead of the breakdown: same-run A/B of these Engine variants ('' = default), "
                         "rows in <results>/bench/engine_ab.jsonl")
    args = ap.parse_args(argv)
    from tern.core.host_profile import HostProfile
    from tern.measure.sweep import BUDGETS
    from tern.measure.sweep_models import ensure_model
    from tern.measure.utilisation import decode_utilisation
    from tern.probe.bandwidth import read_reference
    from tern.probe.core_latency import round_trip_ns
    from tern.run.engine import Engine

    res = Path(args.results)
    profile = res / "host_profile.json"
    host = HostProfile.load(profile) if profile.exists() else None
    path = Path(args.model) if args.model else ensure_model(
        BUDGETS["30m"].replace(name="dram250", n_experts=64, top_k=52), res / "models")
    if args.compare:
        for t in args.threads:
            trip = round_trip_ns() if t > 1 else None  # where the threads sit (tern.probe.core_latency)
            cfg, rows = compare_engines(path, args.compare, t, args.tokens, args.repeats, args.warmup)
            pc = param_counts(cfg)
            now = read_reference(pc.total.bytes, t)  # the read rate right after the runs
            for row in rows:
                row.update({**run_metadata(threads=t), "benchmark": "engine_ab", "model": str(path),
                            "tokens": args.tokens, "repeats": args.repeats, "warmup": args.warmup,
                            "active_bytes": pc.active.bytes, "core_round_trip_ns": trip})
                row.update(decode_utilisation(row["tok_per_s"], pc.active.bytes, pc.total.bytes, t, host, now))
                append_jsonl(res / "bench" / "engine_ab.jsonl", row)
                print(json.dumps({"threads": t, "variant": row["variant"], "tok_per_s": round(row["tok_per_s"], 2),
                                  "spread_rel": round(row["step_s"]["spread_rel"], 3),
                                  "speedup_vs_first": round(row["speedup_vs_first"], 3),
                                  "identical_logits": row["identical_logits"], "load_s": round(row["load_s"], 2),
                                  **{k: round(v / 2**20) for k, v in row["weights_mapping"].items()},
                                  "gbps_end_to_end": row["gbps_end_to_end"],
                                  "bandwidth_fraction": row["bandwidth_fraction"],
                                  "fraction_of_read_now": round(row["bandwidth_fraction_same_run"], 3),
                                  "core_round_trip_ns": trip}), flush=True)
        return 0
    for t in args.threads:
        eng = Engine(path, threads=t, region=False)  # the step timed_token_step instruments
        trip = round_trip_ns() if t > 1 else None
        b = breakdown(eng, args.tokens, args.repeats, args.warmup)
        pc = param_counts(eng.cfg)
        now = read_reference(pc.total.bytes, t)  # the read rate right after the runs
        row = {**run_metadata(threads=t), "benchmark": "op_breakdown", "model": str(path),
               "config": eng.cfg.to_dict(), "engine": eng.describe(), "active_bytes": pc.active.bytes,
               "total_bytes": pc.total.bytes, "tokens": args.tokens, "repeats": args.repeats,
               "warmup": args.warmup, "tok_per_s": 1.0 / b["step_s"]["median"], "core_round_trip_ns": trip, **b}
        row.update(decode_utilisation(row["tok_per_s"], pc.active.bytes, pc.total.bytes, t, host, now))
        append_jsonl(res / "bench" / "op_breakdown.jsonl", row)
        print(json.dumps({"threads": t, "tok_per_s": row["tok_per_s"], "core_round_trip_ns": trip,
                          "step_ms": b["step_s"]["median"] * 1e3,
                          "gbps_end_to_end": row["gbps_end_to_end"], "bandwidth_fraction": row["bandwidth_fraction"],
                          "read_now_gbps": row["read_same_run"]["gbps_median"],
                          "fraction_of_read_now": row["bandwidth_fraction_same_run"],
                          "python_ms": b["python_s"] * 1e3, "timer_overhead_ms": b["timer_overhead_s"] * 1e3,
                          "ms_per_token": {c: round(v * 1e3, 4) for c, v in b["s_per_token"].items() if v},
                          "share": {c: round(v, 4) for c, v in b["share_of_step"].items() if v}}))
        eng.close()
    print(f"rows appended to {res / 'bench' / 'op_breakdown.jsonl'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    # run as the module "op_breakdown" (as the tests import it): numba's cached kernels record
    # their module's name and re-import it on load, and "__main__" would not be this file then
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import op_breakdown

    sys.exit(op_breakdown.main())
