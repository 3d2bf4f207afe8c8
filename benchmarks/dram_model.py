"""A DRAM-bound model (~250 MB of 2-bit ternary active weights) decoded by the engine,
against the roofline's predictions from the probe's figures (issue: engine targets).

The model: the sweep's 30m budget (d_model 512, 6 layers, 3 MoE layers of hidden-4096
experts) with 64 experts, top-52 (~250 MB read per token). Built once by random_model
under <results>/models. Each thread count: warm-up 8 tokens, 5 repeats of 32 tokens in a
fresh subprocess (tern.measure.sweep.measure_in_subprocess: median, min, max, peak RSS).

Printed and appended as JSONL rows (tern.core.records.run_metadata + figures):
* ``bandwidth_roof_tok_per_s``: active bytes / the probe's read bandwidth at the model's
  working set, nothing else (the pure memory roof, uncalibrated);
* ``predicted_tok_per_s``: tern.predict.roofline.predict on the uncalibrated profile (with op
  costs in the profile: measured op costs + memory stall; see tern.predict.roofline);
* ``predicted_tok_per_s_same_run``: the same prediction with the profile's DRAM read
  bandwidth replaced by the read kernel's figure measured right before and right after
  this decode run (tern.core.host_queries.with_dram_bandwidth; the mean of the two) — on this VM
  the DRAM bandwidth moves between regimes over minutes, so the probe's figure may be
  stale when the model runs;
* the measured tok/s, the ratios, and the achieved GB/s of active weights.

    .venv/bin/python benchmarks/dram_model.py [--results results] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from tern.core.config import param_counts
from tern.core.host_profile import HostProfile
from tern.core.host_queries import bandwidth_gbps, with_dram_bandwidth
from tern.core.records import append_jsonl, run_metadata
from tern.measure.sweep import BUDGETS, SweepPoint, measure_in_subprocess
from tern.measure.sweep_models import ensure_model
from tern.predict.roofline import predict
from tern.probe.bandwidth import SweepBuffers, measure_point
from tern.probe.timing import TimingConfig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="results", help="results folder (host_profile.json, models/)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=52)
    args = ap.parse_args(argv)
    res = Path(args.results)
    host = HostProfile.load(res / "host_profile.json")
    host = replace(host, calibration={})  # the probe's figures only
    cfg = BUDGETS["30m"].replace(name="dram250", n_experts=args.experts, top_k=args.top_k)
    pc = param_counts(cfg)
    path = ensure_model(cfg, res / "models")
    out = res / "bench" / "dram_model.jsonl"
    ws = min(pc.total.bytes, 1 << 30)
    buffers = SweepBuffers(ws)
    timing = TimingConfig(min_time_s=0.2, repeats=3, warmup_s=0.1)

    def read_now(t: int) -> float:
        return measure_point("read", ws, t, buffers, timing)[0].gbps_median

    for t in args.threads:
        before = read_now(t)
        m = measure_in_subprocess(path, SweepPoint("dram_model", "dram250", cfg, t, tokens=32, repeats=5, warmup=8))
        after = read_now(t)
        p = predict(cfg, host, threads=t)
        p_now = predict(cfg, with_dram_bandwidth(host, t, (before + after) / 2), threads=t)
        roof = bandwidth_gbps(host, p.hot_bytes, t) * 1e9 / pc.active.bytes
        row = {**run_metadata(threads=t), "benchmark": "dram_model", "config": cfg.to_dict(),
               "active_bytes": pc.active.bytes, "total_bytes": pc.total.bytes,
               "tok_per_s": m["tok_per_s"], "tok_per_s_min": m["tok_per_s_min"],
               "tok_per_s_max": m["tok_per_s_max"], "repeats": m["repeats"], "peak_rss_bytes": m["peak_rss_bytes"],
               "bandwidth_roof_tok_per_s": roof, "ratio_to_bandwidth_roof": m["tok_per_s"] / roof,
               "predicted_tok_per_s": p.tok_per_s, "predicted_model": p.model,
               "ratio_to_prediction": m["tok_per_s"] / p.tok_per_s,
               "achieved_gbps": m["tok_per_s"] * pc.active.bytes / 1e9,
               "read_gbps_at_ws": bandwidth_gbps(host, p.hot_bytes, t),
               "read_gbps_same_run": [before, after], "predicted_tok_per_s_same_run": p_now.tok_per_s,
               "ratio_to_prediction_same_run": m["tok_per_s"] / p_now.tok_per_s}
        append_jsonl(out, row)
        print(json.dumps({k: row[k] for k in ("threads", "active_bytes", "tok_per_s", "bandwidth_roof_tok_per_s",
                                              "ratio_to_bandwidth_roof", "predicted_tok_per_s", "predicted_model",
                                              "ratio_to_prediction", "achieved_gbps", "read_gbps_at_ws",
                                              "read_gbps_same_run", "predicted_tok_per_s_same_run",
                                              "ratio_to_prediction_same_run")}))
    print(f"rows appended to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
