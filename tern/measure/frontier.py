"""Quality against decode speed: the sandbox recipe and its ablations at one CPU budget.

    tern bench frontier --minutes 3 --threads 1 2        # rows: <results>/bench/frontier.jsonl

Every arm is derived from one base config (:data:`tern.core.config.SANDBOX` by default) by
:func:`frontier_arms` and trains for the same **wall-clock seconds** of CPU training (the
trainer's time budget, ``TrainConfig.minutes``; the final validation on the full fixed
split comes after the budget), on the same data, seeds and tokenizer. Each trained arm is
then exported to a packed ``.tern`` file and its decode speed measured with the numba
:class:`~tern.run.engine.Engine` on the start of the validation text (the ladder's token
stream): a warm-up, then ``repeats`` runs of ``tokens`` steps per thread count,
interleaved over the thread counts; the median tok/s is reported with its spread.

The arms (equal **active** params within :data:`ACTIVE_TOLERANCE` of the base):

- ``sandbox``: the recipe itself (granular MoE + shared expert, ternary weights);
- ``dense_ternary``: no MoE, a dense MLP of hidden = the base's active FFN hidden
  (top_k x expert_hidden + n_shared x shared_hidden), ternary;
- ``dense_fp32``: the same shape with fp32 mixer and MLP weights (no quantization). The
  engine decodes ternary matrices only, so its speed is timed on a shape-identical ternary
  twin (random weights) with the engine's ``kernel="fp32"``: every matrix dequantized to
  fp32, dense fp32 matvecs: the bytes and work of an fp32 model. Its quality is the
  trained fp32 model's;
- ``coarse_moe``: :data:`GRANULARITY` x fewer, x wider routed experts, top_k / GRANULARITY;
- ``fine_moe``: GRANULARITY x more, x narrower routed experts, top_k x GRANULARITY.
  Both keep the shared expert, the routed hidden per token and the total routed hidden.

Rows (one per arm, seed and thread count, see :data:`JSON_FIELDS`) are appended as a run
finishes each arm; an arm whose key (arm, seed, budget, config hash) is already in the rows
file at every thread count asked for is read back, not retrained, unless ``force``.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tern.core.config import SANDBOX, ModelConfig, param_counts
from tern.core.records import append_jsonl, read_jsonl, run_metadata, summarize

ARM_NAMES = ("sandbox", "dense_fp32", "dense_ternary", "coarse_moe", "fine_moe")
GRANULARITY = 4  # coarse: 4x fewer, 4x wider experts; fine: 4x more, 4x narrower (top_k alike)
ACTIVE_TOLERANCE = 0.025  # |active - base active| / base active: the routers (E x d_model fp32 per layer) differ
ROWS_NAME, SMOKE_ROWS_NAME = "frontier.jsonl", "frontier_smoke.jsonl"
DEFAULT_BUDGET_S, SMOKE_BUDGET_S = 180.0, 1.0  # wall-clock seconds of CPU training per arm and seed
TIMED_ENGINE = dict(act_skip="auto", moe_skip=True, fused=True)  # the engine's defaults, best rung

# --smoke: the same rules on a small base (seconds per arm, a quick validation estimate)
SMOKE_BASE = SANDBOX.replace(name="sandbox-smoke", d_model=64, n_layers=2, attn_layers=(1,), n_heads=2,
                             moe_layers=(0, 1),
                             n_experts=16, top_k=4, expert_hidden=64, shared_hidden=192, max_seq_len=64)

JSON_FIELDS = """\
  frontier: bench, records, figure, budget_s, seeds, threads, smoke, trained (arms trained now),
    reused (arms read back), rows: [{kind "frontier_point", key, arm, label, note, seed, threads,
    config, total_params, active_params, total_bytes, active_bytes, file_bytes, budget_s,
    train {train_tokens, steps, tokens_per_s, train_s, wall_s, final_loss, torch_threads},
    val_bpb, val_tokens, val_scope ("full" | "first N tokens"), timed_model ("exported" |
    "shape twin, fp32 kernel"), engine {...}, tok_per_s {median, min, max, iqr, spread_rel,
    repeats}, us_per_token {...}, tokens_per_repeat, warmup_tokens, smoke, run_id, host, cpu,
    versions, git_commit, timestamp, command}],
    points: [{arm, label, threads, val_bpb, val_bpb_se, seeds, tok_per_s (median), tok_per_s_iqr_rel,
    tok_per_s_spread_rel ((max - min) / median), train_tokens, total_params, active_params, pareto}]"""


@dataclass(frozen=True)
class Arm:
    """One architecture of the frontier: its config, how its decode speed is timed, and
    the property that tells it apart from the base."""
    name: str
    label: str
    config: ModelConfig
    note: str
    kernel: str = "ternary"  # the Engine kernel its speed is timed with
    twin: ModelConfig | None = None  # timed on this ternary shape twin (fp32 weights: the engine reads ternary)
    counts: dict[str, int] = field(default_factory=dict, compare=False)


def _dense(base: ModelConfig, hidden: int, **kw: Any) -> ModelConfig:
    return base.replace(moe_layers=(), n_experts=0, top_k=0, expert_hidden=0, n_shared=0,
                        shared_hidden=0, mlp_hidden=hidden, **kw)


def frontier_arms(base: ModelConfig = SANDBOX, granularity: int = GRANULARITY) -> list[Arm]:
    """The five arms of :data:`ARM_NAMES` derived from ``base`` (a MoE config in every
    layer with top_k and expert_hidden divisible by ``granularity``); see the module doc."""
    g = granularity
    if not base.moe_layers or len(base.moe_layers) != base.n_layers or base.mlp_hidden:
        raise ValueError(f"the frontier base must be a MoE in every layer without dense MLPs, got {base.name!r}")
    if g < 2 or base.top_k % g or base.expert_hidden % g or base.n_experts % g:
        raise ValueError(f"granularity {g} must divide top_k {base.top_k}, expert_hidden "
                         f"{base.expert_hidden} and n_experts {base.n_experts}")
    E, k, h = base.n_experts, base.top_k, base.expert_hidden
    hidden = k * h + base.n_shared * base.shared_hidden  # FFN hidden units a token uses
    n = base.name
    dense_t = _dense(base, hidden, name=f"{n}-dense_ternary")
    arms = [
        Arm("sandbox", f"{n}: MoE {E}x{h} top-{k} + shared", base.replace(name=f"{n}-sandbox"),
            "the recipe itself"),
        Arm("dense_fp32", f"dense fp32 MLP {hidden}", _dense(base, hidden, name=f"{n}-dense_fp32",
                                                          mixer_format="fp32", mlp_format="fp32"),
            "no MoE, fp32 mixer and MLP weights; speed timed on its ternary shape twin with the fp32 kernel",
            kernel="fp32", twin=dense_t.replace(name=f"{n}-dense_fp32-twin")),
        Arm("dense_ternary", f"dense ternary MLP {hidden}", dense_t, "no MoE, ternary weights"),
        Arm("coarse_moe", f"coarse MoE {E // g}x{h * g} top-{k // g} + shared",
            base.replace(name=f"{n}-coarse_moe", n_experts=E // g, expert_hidden=h * g, top_k=k // g),
            f"{g}x fewer, {g}x wider experts"),
        Arm("fine_moe", f"fine MoE {E * g}x{h // g} top-{k * g} + shared",
            base.replace(name=f"{n}-fine_moe", n_experts=E * g, expert_hidden=h // g, top_k=k * g),
            f"{g}x more, {g}x narrower experts"),
    ]
    out = []
    for a in arms:
        c = param_counts(a.config)
        out.append(Arm(a.name, a.label, a.config, a.note, a.kernel, a.twin, {
            "total_params": c.total.params, "active_params": c.active.params,
            "total_bytes": c.total.bytes, "active_bytes": c.active.bytes}))
    return out


def config_hash(cfg: ModelConfig) -> str:
    return hashlib.sha256(cfg.to_json().encode()).hexdigest()[:10]


def arm_key(arm: Arm, seed: int, budget_s: float) -> str:
    """What a finished run is found by: arm, seed, budget and the exact config."""
    return f"{arm.name}|seed{seed}|{budget_s:g}s|{config_hash(arm.config)}"


# ---- one arm -------------------------------------------------------------------------------


def _log(msg: str) -> None:
    print(f"[tern bench frontier] {msg}", file=sys.stderr)


def train_arm(arm: Arm, seed: int, budget_s: float, out: Path, *, train_threads: int = 0,
              final_eval_tokens: int = 0, warmup_steps: int = 50, progress: bool = True) -> dict[str, Any]:
    """Train one arm for ``budget_s`` wall-clock seconds into ``out``; the trainer's result."""
    from tern.train.config import TrainConfig
    from tern.train.loop import run_training

    tc = TrainConfig(minutes=budget_s / 60.0, seed=seed, threads=train_threads, device="cpu",
                     seq_len=min(TrainConfig.seq_len, arm.config.max_seq_len),
                     final_eval_tokens=final_eval_tokens, warmup_steps=warmup_steps)
    return run_training(arm.config, tc, out, progress=progress)


def packed_model(arm: Arm, seed: int, ckpt: Path, path: Path, progress: bool = True) -> tuple[Path, str]:
    """The file the arm's speed is timed on and what it is: the exported checkpoint, or for
    an fp32 arm its random ternary shape twin (timed with the fp32 kernel)."""
    from tern.packed.format import default_tokenizer
    from tern.packed.writer import random_model
    from tern.train.export import export

    if arm.twin is not None:
        return (random_model(arm.twin, path, seed=seed, tokenizer=default_tokenizer(arm.twin), progress=False),
                "shape twin, fp32 kernel")
    return export(ckpt, path, progress=progress), "exported"


def time_arm(path: Path, kernel: str, threads: Sequence[int], tokens: int, repeats: int,
             warmup: int) -> dict[int, dict[str, Any]]:
    """Decode tok/s per thread count: one engine per count on the validation text's start,
    a warm-up each, then ``repeats`` rounds over the counts (interleaved, so load changes
    hit all alike). {threads: {"samples": [tok/s...], "engine": describe()}}."""
    from tern.measure.ladder import bench_tokens
    from tern.run.engine import Engine
    from tern.run.timing import time_steps

    engines = {t: Engine(path, threads=t, kernel=kernel, **TIMED_ENGINE) for t in threads}
    first = next(iter(engines.values()))
    stream = bench_tokens(warmup + tokens, first.cfg.vocab_size, (first.model.tokenizer or {}).get("name"))
    for eng in engines.values():
        time_steps(eng, stream[:max(warmup, 1)])
    samples: dict[int, list[float]] = {t: [] for t in engines}
    for _ in range(repeats):
        for t, eng in engines.items():
            samples[t].append(1.0 / time_steps(eng, stream[warmup:]))
    out = {t: {"samples": samples[t], "engine": eng.describe()} for t, eng in engines.items()}
    for eng in engines.values():
        eng.close()
    return out


def measure_arm(arm: Arm, seed: int, budget_s: float, results: Path, *, threads: Sequence[int],
                tokens: int, repeats: int, warmup: int, train_threads: int = 0, final_eval_tokens: int = 0,
                warmup_steps: int = 50, smoke: bool = False, command: str | None = None,
                progress: bool = True) -> list[dict[str, Any]]:
    """Train, export and time one arm: its rows, one per thread count."""
    import torch

    from tern.core.records import clean_stale_temps

    run_dir = results / "frontier" / ("smoke" if smoke else "runs") / f"{arm.name}_seed{seed}"
    clean_stale_temps(run_dir)  # temps of a killed earlier run's checkpoint writes
    t0 = time.perf_counter()
    res = train_arm(arm, seed, budget_s, run_dir, train_threads=train_threads,
                    final_eval_tokens=final_eval_tokens, warmup_steps=warmup_steps, progress=progress)
    torch_threads = torch.get_num_threads()
    path, timed = packed_model(arm, seed, Path(res["checkpoint"]), run_dir / f"{arm.name}.tern", progress)
    timing = time_arm(path, arm.kernel, threads, tokens, repeats, warmup)
    meta = run_metadata()
    meta["run_id"] = f"{meta['timestamp']}-{uuid.uuid4().hex[:8]}"
    train = {k: res.get(k) for k in ("train_tokens", "steps", "tokens_per_s", "train_s", "wall_s", "final_loss")}
    train["torch_threads"] = torch_threads
    load = res.get("expert_load") or []
    train["dead_experts"] = sum(int(e.get("dead_experts", 0)) for e in load)
    train["expert_max_over_mean"] = max((float(e["max_over_mean"]) for e in load
                                          if e.get("max_over_mean") is not None), default=None)
    rows = []
    for t, tm in timing.items():
        tps = summarize(tm["samples"])
        rows.append({
            **meta, "threads": t, "kind": "frontier_point", "bench": "frontier", "key": arm_key(arm, seed, budget_s),
            "arm": arm.name, "label": arm.label, "note": arm.note, "seed": seed, "config": arm.config.to_dict(),
            **arm.counts, "file_bytes": tm["engine"]["file_bytes"], "budget_s": budget_s, "train": train,
            "val_bpb": res.get("val_bpb"), "val_tokens": res.get("val_tokens"),
            "val_scope": f"first {final_eval_tokens} tokens" if final_eval_tokens else "full",
            "timed_model": timed, "engine": tm["engine"], "tok_per_s": tps,
            "us_per_token": summarize([1e6 / x for x in tm["samples"]]),
            "tokens_per_repeat": tokens, "warmup_tokens": warmup, "smoke": smoke, "command": command,
            "arm_seconds": time.perf_counter() - t0,
        })
    return rows


# ---- the frontier ---------------------------------------------------------------------------


def run_frontier(results: str | Path = "results", budget_s: float = DEFAULT_BUDGET_S, seeds: Sequence[int] = (0,),
                 threads: Sequence[int] = (1, 2), arms: Sequence[str] | None = None, *, smoke: bool = False,
                 force: bool = False, base: ModelConfig | None = None, tokens: int | None = None,
                 repeats: int | None = None, warmup: int | None = None, train_threads: int = 0,
                 progress: bool = True, command: str | None = None) -> dict[str, Any]:
    """Train, export and time every arm x seed not already in the rows file (module doc).
    ``smoke``: :data:`SMOKE_BASE`, a validation estimate on 4,096 tokens, short timing,
    rows in ``frontier_smoke.jsonl``. Returns {"bench": "frontier", "records", "rows",
    "points", "trained", "reused", ...}."""
    from tqdm.auto import tqdm

    from tern.core.paths import results_dir

    if not (budget_s > 0) or budget_s != budget_s or budget_s == float("inf"):
        raise ValueError(f"the training budget must be a number of seconds > 0, got {budget_s}")
    if not seeds or any(not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds must be integers >= 0, got {list(seeds)}")
    if not threads or any(not isinstance(t, int) or t < 1 for t in threads):
        raise ValueError(f"threads must be integers >= 1, got {list(threads)}")
    import numba

    if max(threads) > numba.config.NUMBA_NUM_THREADS:
        raise ValueError(f"threads {max(threads)} exceeds numba's {numba.config.NUMBA_NUM_THREADS} threads")
    tokens = tokens or (32 if smoke else 256)
    repeats = repeats or (2 if smoke else 7)
    warmup = warmup if warmup is not None else (4 if smoke else 32)
    if tokens < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"need tokens >= 1, repeats >= 1, warmup >= 0; got {tokens}, {repeats}, {warmup}")
    all_arms = frontier_arms(base or (SMOKE_BASE if smoke else SANDBOX))
    names = list(arms) if arms else list(ARM_NAMES)
    unknown = [a for a in names if a not in ARM_NAMES]
    if unknown:
        raise ValueError(f"unknown arms {unknown}; arms: {', '.join(ARM_NAMES)}")
    chosen = [a for a in all_arms if a.name in names]
    out = results_dir(results)
    records = out / "bench" / (SMOKE_ROWS_NAME if smoke else ROWS_NAME)
    timed = {(r["key"], r["threads"]) for r in read_jsonl(records) if r.get("kind") == "frontier_point"}

    def done(a: Arm, s: int) -> bool:  # every thread count asked for is in the rows already
        return not force and all((arm_key(a, s, budget_s), t) in timed for t in threads)

    todo = [(a, s) for s in seeds for a in chosen if not done(a, s)]
    trained, reused = [], [f"{a.name}/seed{s}" for s in seeds for a in chosen if done(a, s)]
    bar = tqdm(total=len(todo), desc="frontier arms", unit="arm", file=sys.stderr, disable=not progress)
    for a, s in todo:
        bar.set_postfix_str(f"{a.name} seed {s}")
        _log(f"{a.name} (seed {s}): training {budget_s:g} s, then export and decode timing")
        rows = measure_arm(a, s, budget_s, out, threads=threads, tokens=tokens, repeats=repeats, warmup=warmup,
                           train_threads=train_threads, final_eval_tokens=4096 if smoke else 0,
                           warmup_steps=2 if smoke else 50, smoke=smoke, command=command,
                           progress=progress)
        append_jsonl(records, rows)  # one write per arm: a killed run loses at most the arm in progress
        trained.append(f"{a.name}/seed{s}")
        bar.update()
    bar.close()
    keys = {arm_key(a, s, budget_s) for a in chosen for s in seeds}
    rows = latest_rows([r for r in read_jsonl(records) if r.get("key") in keys])
    return {"bench": "frontier", "records": str(records), "budget_s": budget_s, "seeds": list(seeds),
            "threads": list(threads), "smoke": smoke, "trained": trained, "reused": reused,
            "rows": rows, "points": frontier_points(rows)}


def latest_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest row of each (key, threads): a --force re-run supersedes older ones."""
    last: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        if r.get("kind") == "frontier_point":
            last[(r["key"], r["threads"])] = r
    return list(last.values())


def frontier_points(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per (arm, threads): mean val BPB over seeds (± its standard error, None for
    one seed), median of the per-seed median tok/s, and whether the point is on the Pareto
    front of its thread count (no other arm both faster and lower in BPB)."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in latest_rows(rows):
        if r.get("val_bpb") is not None:
            groups.setdefault((r["arm"], r["threads"]), []).append(r)
    order = {a: i for i, a in enumerate(ARM_NAMES)}
    pts = []
    for (arm, t), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], order.get(kv[0][0], 99))):
        bpbs = [r["val_bpb"] for r in rs]
        se = statistics.stdev(bpbs) / len(bpbs) ** 0.5 if len(bpbs) > 1 else None
        pts.append({"arm": arm, "label": rs[0]["label"], "threads": t, "val_bpb": statistics.fmean(bpbs),
                    "val_bpb_se": se, "seeds": sorted(r["seed"] for r in rs),
                    "tok_per_s": statistics.median(r["tok_per_s"]["median"] for r in rs),
                    "tok_per_s_spread_rel": max(r["tok_per_s"]["spread_rel"] for r in rs),
                    "tok_per_s_iqr_rel": max(r["tok_per_s"].get("iqr", 0.0) / r["tok_per_s"]["median"] for r in rs),
                    "train_tokens": statistics.fmean(r["train"]["train_tokens"] for r in rs),
                    "total_params": rs[0]["total_params"], "active_params": rs[0]["active_params"]})
    for p in pts:
        p["pareto"] = not any(q is not p and q["threads"] == p["threads"] and q["tok_per_s"] >= p["tok_per_s"]
                              and q["val_bpb"] <= p["val_bpb"]
                              and (q["tok_per_s"] > p["tok_per_s"] or q["val_bpb"] < p["val_bpb"])
                              for q in pts)
    return pts


def result_from_rows(rows: list[dict[str, Any]], records: str | Path) -> dict[str, Any]:
    """A :func:`run_frontier`-shaped result of rows read back (nothing trained)."""
    rows = latest_rows(rows)
    if not rows:
        raise ValueError(f"{records} holds no frontier rows")
    return {"bench": "frontier", "records": str(records), "budget_s": rows[0]["budget_s"],
            "seeds": sorted({r["seed"] for r in rows}), "threads": sorted({r["threads"] for r in rows}),
            "smoke": bool(rows[0].get("smoke")), "trained": [],
            "reused": sorted({f"{r['arm']}/seed{r['seed']}" for r in rows}), "rows": rows,
            "points": frontier_points(rows)}


def frontier_to_show(results: str | Path = "results", smoke: bool = False,
                     progress: bool = True) -> dict[str, Any] | None:
    """What notebook 07 shows: with ``smoke`` the smoke frontier, run (or resumed) into
    ``results``; else the rows measured into ``<results>/bench/frontier.jsonl`` when there
    are any, else the committed ``benchmarks/frontier/frontier.jsonl`` (a checkout only);
    None when neither exists (the frontier has not been measured)."""
    from tern.core.paths import results_dir

    if smoke:
        return run_frontier(results, budget_s=SMOKE_BUDGET_S, threads=[1], smoke=True, progress=progress)
    mine = results_dir(results) / "bench" / ROWS_NAME
    for path in (mine, committed_rows_path()):
        rows = read_jsonl(path) if path is not None else []
        if latest_rows(rows):
            return result_from_rows(rows, path)
    return None


def committed_rows_path() -> Path | None:
    """``benchmarks/frontier/frontier.jsonl`` of the checkout (None in a site install or when absent)."""
    from tern.core.paths import repo_root

    root = repo_root()
    p = None if root is None else root / "benchmarks" / "frontier" / ROWS_NAME
    return p if p is not None and p.is_file() else None


def render_frontier(r: dict[str, Any]) -> str:
    lines = [f"quality against decode speed: {r['budget_s']:g} s of CPU training per arm, seeds {r['seeds']}"
             + (" (smoke)" if r.get("smoke") else ""),
             f"{'arm':<14} {'thr':>3} {'total':>7} {'active':>7} {'tokens':>9} {'val BPB':>8} "
             f"{'tok/s':>8} {'IQR':>5} {'range':>6}  pareto"]
    for p in r["points"]:
        lines.append(f"{p['arm']:<14} {p['threads']:>3} {p['total_params'] / 1e6:6.2f}M {p['active_params'] / 1e6:6.2f}M "
                     f"{p['train_tokens']:9,.0f} {p['val_bpb']:8.4f} {p['tok_per_s']:8.0f} "
                     f"{p['tok_per_s_iqr_rel']:5.1%} {p['tok_per_s_spread_rel']:5.0%}  {'*' if p['pareto'] else ''}")
    lines.append(f"trained now: {', '.join(r['trained']) or 'none'}; read back: {', '.join(r['reused']) or 'none'}")
    lines.append(f"records: {r['records']}" + (f"; figure: {r['figure']}" if r.get("figure") else ""))
    return "\n".join(lines)
