"""`tern bench`: decode benchmarks of the numba Engine, recorded as JSONL rows.

    tern bench ladder [--model FILE.tern] [--preset sandbox] [--tokens 64] [--repeats 3] [--quick]

Sub-benchmarks register in :data:`SUBCOMMANDS` (name -> help, configure, run, render), so
``tern bench <name>`` gets its own arguments; every one returns a dict with ``bench`` set
to its name and writes rows under ``<results>/bench/``.

The ablation ladder times one model at each rung of :data:`LADDER` (same run, rungs
interleaved so machine load hits all alike): tok/s (median of repeats, each ``tokens``
steps after a reset and a warm-up), the validation BPB through that rung (all rungs
compute the same model, so they must agree), and the per-token Python overhead of
``Engine.step`` over the bare numba call.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from tern.core.records import append_jsonl, run_metadata, summarize
from tern.run.timing import time_njit, time_steps  # noqa: F401  (the ladder's timers)

# rung name -> Engine options (each adds one optimization to the one before)
LADDER: list[tuple[str, dict[str, Any]]] = [
    ("baseline fp32", dict(kernel="fp32", act_skip=False, moe_skip=False, fused=False)),
    ("+ ternary kernel", dict(kernel="ternary", act_skip=False, moe_skip=False, fused=False)),
    ("+ activation skip", dict(kernel="ternary", act_skip=True, moe_skip=False, fused=False)),
    ("+ MoE skip", dict(kernel="ternary", act_skip=True, moe_skip=True, fused=False)),
    ("+ fused per-token loop", dict(kernel="ternary", act_skip=True, moe_skip=True, fused=True)),
]
TARGET_SPEEDUP = 6.0  # issue 6: the full ladder vs the baseline engine, same run
TARGET_TOK_PER_S = 4000.0  # issue 6: sandbox, one thread


def _log(msg: str) -> None:
    print(f"[tern bench] {msg}", file=sys.stderr)


# ---- model resolution ------------------------------------------------------------------------


def ladder_model(results: str | Path = "results", preset: str = "sandbox", seed: int = 0,
                 progress: bool = True) -> tuple[Path, str]:
    """The packed model the ladder times and where it came from: the exported checkpoint of
    ``<results>/train_<preset>/checkpoint.pt`` when training left one (re-exported when the
    checkpoint is newer), else a random model of the preset (with the default tokenizer
    when the vocabularies match). Files live in ``<results>/bench/``."""
    from tern.core.config import get_preset
    from tern.core.paths import results_dir
    from tern.packed.format import default_tokenizer
    from tern.packed.writer import random_model
    from tern.train.export import export

    out = results_dir(results)
    ckpt = out / f"train_{preset}" / "checkpoint.pt"
    if ckpt.is_file():
        path = out / "bench" / f"{preset}_trained.tern"
        if not path.is_file() or path.stat().st_mtime < ckpt.stat().st_mtime:
            _log(f"exporting {ckpt} -> {path}")
            export(ckpt, path, progress=progress)
        return path, f"trained checkpoint {ckpt}"
    cfg = get_preset(preset)
    path = out / "bench" / f"{preset}_random_seed{seed}.tern"
    if not path.is_file():
        _log(f"no trained {preset} checkpoint under {out}: writing a random model {path}")
        random_model(cfg, path, seed=seed, tokenizer=default_tokenizer(cfg), progress=progress)
    return path, f"random model (seed {seed}) of preset {preset}"


# ---- measurements ------------------------------------------------------------------------------


def bench_tokens(n: int, vocab_size: int, tokenizer: str | None) -> np.ndarray:
    """A fixed token stream to feed: the start of the validation split when the tokenizer
    is known (so MoE routing and activation sparsity look like real text), else random ids."""
    if tokenizer:
        try:
            from tern.data.tokens import load_tokens

            toks = load_tokens("val", tokenizer)[:n].astype(np.int64)
            if len(toks) == n and toks.max() < vocab_size:
                return toks
        except (ValueError, OSError):
            pass
    return np.random.default_rng(0).integers(0, vocab_size, n)


def python_overhead(engine: Any, tokens: np.ndarray, repeats: int = 5) -> dict[str, Any]:
    """Per-token Python overhead of ``step()``: median over repeats of (step time - bare
    numba call time), in seconds, with both medians."""
    step_s, njit_s = [], []
    for _ in range(repeats):
        step_s.append(time_steps(engine, tokens))
        njit_s.append(time_njit(engine, tokens))
    s, n = float(np.median(step_s)), float(np.median(njit_s))
    return {"step_s": s, "njit_s": n, "overhead_s": s - n, "overhead_frac": (s - n) / s}


def run_ladder(model: str | Path | None = None, results: str | Path = "results", preset: str = "sandbox",
               tokens: int = 64, repeats: int = 3, warmup: int = 16, bpb_tokens: int = 4096,
               seq_len: int = 128, threads: int = 1, record: bool = True,
               progress: bool = True, command: str | None = None) -> dict[str, Any]:
    """Time and score every rung of :data:`LADDER` on one model (see the module doc).
    Returns {"bench": "ladder", "model", "source", "rows": [...], "overhead": {...},
    "speedup", "targets"}; rows are appended to ``<results>/bench/ladder.jsonl``."""
    from tqdm import tqdm

    from tern.core.paths import results_dir
    from tern.run.engine import Engine

    if tokens < 1 or repeats < 1 or warmup < 0 or bpb_tokens < 0:
        raise ValueError("tokens and repeats must be >= 1, warmup and bpb_tokens >= 0")
    if model is None:
        path, source = ladder_model(results, preset, progress=progress)
    else:
        path, source = Path(model), f"file {model}"
    engines = [(name, Engine(path, threads=threads, **kw)) for name, kw in LADDER]
    cfg = engines[0][1].cfg
    tok = (engines[0][1].model.tokenizer or {}).get("name")
    stream = bench_tokens(warmup + tokens, cfg.vocab_size, tok)
    for _, eng in engines:  # compile (cached) and warm caches
        time_steps(eng, stream[:max(warmup, 1)])
    samples: dict[str, list[float]] = {name: [] for name, _ in engines}
    bar = tqdm(total=repeats * len(engines), desc="ladder timing", unit="run", file=sys.stderr,
               disable=not progress)
    for _ in range(repeats):  # interleaved: load changes hit every rung alike
        for name, eng in engines:
            samples[name].append(1.0 / time_steps(eng, stream[warmup:]))
            bar.update()
    bar.close()
    overhead = python_overhead(engines[-1][1], stream[warmup:], repeats=max(3, repeats))
    bpbs: dict[str, float | None] = {}
    if bpb_tokens and tok:
        from tern.data.tokens import val_bpb

        for name, eng in engines:
            bpbs[name] = val_bpb(eng.nll_sum, tok, seq_len=seq_len, max_tokens=bpb_tokens,
                                 progress=progress)["bpb"]
    meta = run_metadata(threads)
    meta["run_id"] = f"{meta['timestamp']}-{uuid.uuid4().hex[:8]}"  # groups this run's rows
    base = float(np.median(samples[engines[0][0]]))
    rows = []
    for i, (name, eng) in enumerate(engines):
        tps = summarize(samples[name])
        rows.append({
            **meta, "bench": "ladder", "rung": name, "rung_index": i, **eng.describe(),
            "model_source": source, "tokens_per_repeat": int(tokens), "warmup_tokens": int(warmup),
            "tok_per_s": tps, "us_per_token": summarize([1e6 / x for x in samples[name]]),
            "speedup_vs_baseline": tps["median"] / base,
            "bpb": bpbs.get(name), "bpb_tokens": int(bpb_tokens) if bpbs else 0, "bpb_seq_len": int(seq_len),
            "command": command,
        })
    rows[-1]["python_overhead"] = overhead
    if record:
        append_jsonl(results_dir(results) / "bench" / "ladder.jsonl", rows)
    top = rows[-1]
    return {"bench": "ladder", "model": str(path), "source": source, "threads": threads, "rows": rows,
            "overhead": overhead, "speedup": top["speedup_vs_baseline"],
            "targets": {"speedup_vs_baseline": TARGET_SPEEDUP, "tok_per_s": TARGET_TOK_PER_S,
                        "speedup_met": top["speedup_vs_baseline"] >= TARGET_SPEEDUP,
                        "tok_per_s_met": top["tok_per_s"]["median"] >= TARGET_TOK_PER_S}}


def render_ladder(r: dict[str, Any]) -> str:
    lines = [f"ablation ladder: {r['source']} ({r['model']}), {r['threads']} thread(s)",
             f"{'rung':<24} {'tok/s':>8} {'spread':>7} {'us/tok':>8} {'speedup':>8} {'BPB':>9}"]
    for row in r["rows"]:
        t = row["tok_per_s"]
        bpb = f"{row['bpb']:.5f}" if row["bpb"] is not None else "-"
        lines.append(f"{row['rung']:<24} {t['median']:8.0f} {t['spread_rel']:6.0%} "
                     f"{row['us_per_token']['median']:8.1f} {row['speedup_vs_baseline']:7.2f}x {bpb:>9}")
    o = r["overhead"]
    lines.append(f"per-token Python overhead of step(): {o['overhead_s'] * 1e6:.1f} us "
                 f"({o['overhead_frac']:.1%} of {o['step_s'] * 1e6:.1f} us)")
    tg = r["targets"]
    lines.append(f"targets: >= {tg['speedup_vs_baseline']:.0f}x baseline: {'met' if tg['speedup_met'] else 'NOT met'}; "
                 f">= {tg['tok_per_s']:.0f} tok/s: {'met' if tg['tok_per_s_met'] else 'NOT met'}")
    return "\n".join(lines)


# ---- command line ------------------------------------------------------------------------------


def ladder_headline(result: dict[str, Any]) -> dict[str, Any]:
    """The figures notebook 05 reports (units in the keys) from a :func:`run_ladder` result."""
    rows = result["rows"]
    return {
        "model_source": result["source"], "threads": result["threads"],
        "baseline_tok_per_s": rows[0]["tok_per_s"]["median"],
        "ladder_tok_per_s": rows[-1]["tok_per_s"]["median"],
        "ladder_speedup_x": result["speedup"],
        "python_overhead_us_per_token": result["overhead"]["overhead_s"] * 1e6,
        "bpb_per_rung": [r["bpb"] for r in rows],
        "measured_on": rows[0]["cpu"],
    }
