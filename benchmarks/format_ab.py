"""Decode speed of one config stored two ways: the same model with one ModelConfig field changed
(e.g. the SSM dt projections in fp16 instead of fp32), measured in alternating worker processes.

    flock /tmp/tern-cpu.lock .venv/bin/python benchmarks/format_ab.py \
        --configs d2560-L8-E256k4-h640 d2048-L12-E64k1-h2048 --field dt_format --values fp32 fp16 \
        --threads 1 2 --rounds 4 --out benchmarks/dt_format/LABEL.jsonl

Each config name is a point of the 10B design space (tern.predict.toward_10b.TEN_B_SPACE:
``d{d_model}-L{layers}-E{experts}k{top_k}-h{expert_hidden}``) or a preset
(tern.core.config.get_preset). Its random packed model (tern.measure.sweep_models.ensure_model, in
``--models``) is written once per value. Every round runs each (config, threads) pair's
values one after the other, in a fresh ``tern.measure.sweep_worker`` process each (the
sweep's own timing: warm-up 16, 5 samples of >= 0.25 s of 64-token runs), the order
reversed every other round, so a drifting shared VM moves both arms alike. One JSONL row per
(config, value, threads) at the end: the per-round tok/s, their median and spread
(tern.core.records.summarize), bytes read per token (the file's active bytes) and
tern.core.records.run_metadata; a table of the medians and their ratio to the first value.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from tqdm import tqdm

from tern.core.config import ModelConfig, get_preset, param_counts
from tern.core.records import append_jsonl, run_metadata, summarize
from tern.measure.sweep import FULL_TIMING, SweepPoint, measure_in_subprocess
from tern.measure.sweep_models import ensure_model
from tern.predict.toward_10b import TEN_B_SPACE

_SPACE_NAME = re.compile(r"d(\d+)-L(\d+)-E(\d+)k(\d+)-h(\d+)")


def config_named(name: str) -> ModelConfig:
    """A TEN_B_SPACE point from its name, else a preset; a ValueError naming both forms."""
    m = _SPACE_NAME.fullmatch(name)
    if m:
        return TEN_B_SPACE.make(*(int(g) for g in m.groups()))
    try:
        return get_preset(name)
    except (KeyError, ValueError) as e:
        raise ValueError(f"config {name!r} is neither d<D>-L<layers>-E<experts>k<top_k>-h<hidden> nor a preset") from e


def measure(path: Path, cfg: ModelConfig, threads: int) -> float:
    """tok/s of the packed model of ``cfg`` at ``path`` in a fresh sweep worker (the sweep's full timing)."""
    return float(measure_in_subprocess(path, SweepPoint("format_ab", cfg.name, cfg, threads, **FULL_TIMING))["tok_per_s"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", required=True, help="TEN_B_SPACE names or presets")
    ap.add_argument("--field", required=True, help="the ModelConfig field that differs, e.g. dt_format")
    ap.add_argument("--values", nargs=2, required=True, help="its two values (the first is the baseline)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--models", default="results/models", help="folder of the random packed models")
    ap.add_argument("--out", required=True, help="JSONL rows are appended here")
    a = ap.parse_args(argv)
    if a.rounds < 1 or any(t < 1 for t in a.threads):
        ap.error("--rounds and --threads must be >= 1")
    try:
        arms = {(c, v): config_named(c).replace(**{a.field: v}) for c in a.configs for v in a.values}
    except ValueError as e:
        ap.error(str(e))
    Path(a.models).mkdir(parents=True, exist_ok=True)
    files = {k: ensure_model(cfg, Path(a.models)) for k, cfg in arms.items()}
    tps: dict[tuple[str, str, int], list[float]] = {}
    runs = [(c, t) for c in a.configs for t in a.threads]
    with tqdm(total=a.rounds * len(runs) * 2, desc="format A/B", unit="run") as bar:
        for r in range(a.rounds):
            for c, t in runs:
                for v in (a.values if r % 2 == 0 else a.values[::-1]):
                    bar.set_postfix_str(f"round {r + 1} {c} {a.field}={v} t{t}")
                    tps.setdefault((c, v, t), []).append(measure(files[(c, v)], arms[(c, v)], t))
                    bar.update()
    print(f"{'config':26s} thr  " + "  ".join(f"{v:>10s}" for v in a.values) + "   ratio  (tok/s, medians of rounds)")
    for c, t in runs:
        meds = []
        for v in a.values:
            s = summarize(tps[(c, v, t)])
            meds.append(s["median"])
            append_jsonl(a.out, {"record": "format_ab", "config": arms[(c, v)].to_dict(), "name": c, "field": a.field,
                                 "value": v, "baseline": a.values[0], "rounds_tok_per_s": tps[(c, v, t)],
                                 "tok_per_s": s, "active_bytes": param_counts(arms[(c, v)]).active.bytes,
                                 **run_metadata(t)})
        print(f"{c:26s} {t:3d}  " + "  ".join(f"{m:10.1f}" for m in meds) + f"   {meds[1] / meds[0]:.3f}")
    print(f"rows appended to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
