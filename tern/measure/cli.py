"""`tern bench`: decode benchmarks (ladder, sweep) from the command line."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tern.core.host_caches import usable_cpus
from tern.measure.frontier import JSON_FIELDS as FRONTIER_FIELDS
from tern.measure.hosts import drift_summary, drift_text
from tern.measure.ladder import render_ladder, run_ladder
from tern.measure.peers import JSON_FIELDS as PEERS_FIELDS
from tern.measure.peers import cli_configure_peers, cli_run_peers
from tern.measure.peers_table import render_peers
from tern.measure.sweep import (
    FULL_TIMING,
    accuracy,
    calibrate,
    default_points,
    pair_summary,
    preset_points,
    render_rows,
    run_sweep,
)
from tern.probe.bandwidth import read_reference
from tern.probe.curves import kernel_reference


def _configure_ladder(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="packed model file (default: the trained sandbox checkpoint "
                                   "under --results, exported; else a random sandbox model)")
    p.add_argument("--preset", default="sandbox", help="preset when no --model is given")
    p.add_argument("--results", default="results", help="results folder (rows: <results>/bench/ladder.jsonl)")
    p.add_argument("--tokens", type=int, default=64, help="timed tokens per repeat (default 64)")
    p.add_argument("--repeats", type=int, default=3, help="repeats per rung (default 3, median reported)")
    p.add_argument("--warmup", type=int, default=16, help="warm-up tokens before timing")
    p.add_argument("--bpb-tokens", type=int, default=4096, help="validation tokens scored per rung (0: skip)")
    p.add_argument("--threads", type=int, default=1, help="numba threads (1 is the reference figure)")
    p.add_argument("--quick", action="store_true", help="fewer tokens and BPB tokens (smoke runs)")
    p.add_argument("--no-record", action="store_true", help="do not append rows to ladder.jsonl")


def _run_ladder(args: argparse.Namespace) -> dict[str, Any]:
    tokens, bpb_tokens = args.tokens, args.bpb_tokens
    if args.quick:
        tokens, bpb_tokens = min(tokens, 32), min(bpb_tokens, 256)
    return run_ladder(args.model, args.results, args.preset, tokens=tokens, repeats=args.repeats,
                      warmup=args.warmup, bpb_tokens=bpb_tokens, threads=args.threads,
                      record=not args.no_record, command="tern " + " ".join(sys.argv[1:]))


# name -> (help, configure(parser), run(args) -> dict, render(dict) -> str)


JSON_FIELDS = """\
  ladder: bench, model, source, threads, speedup (last rung / baseline), overhead {step_s,
    njit_s, overhead_s, overhead_frac}, targets {..., speedup_met, tok_per_s_met},
    rows: [{rung, rung_index, kernel, act_skip, moe_skip, fused, tok_per_s {median, min,
    max, iqr, spread_rel, repeats}, us_per_token {...}, speedup_vs_baseline, bpb, bpb_tokens,
    host, cpu, threads, versions, git_commit, timestamp}]
  sweep: bench, records, host, calibration {per_token_overhead_s[_tN], bandwidth_efficiency[_tN]},
    points: [see tern.measure.sweep.JSON_FIELDS], accuracy {n, median_ratio, worst_ratio, within_25pct},
    host_drift {n, median_read_ratio, median_kernel_ratio, drifted, within_20pct_steady} or null,
    pair: [{threads, 105m_tok_per_s, 206m_tok_per_s, measured_ratio, ...}]
""" + PEERS_FIELDS + "\n" + FRONTIER_FIELDS


def cli_configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bench_command", metavar="<benchmark>", required=True)
    for name, (help_, configure, run, render) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print exactly one JSON object on stdout (logs go to stderr)")
        configure(sp)
        sp.set_defaults(_bench_run=run, _bench_render=render)


def cli_run(args: argparse.Namespace) -> dict[str, Any]:
    return args._bench_run(args)


def cli_render(result: dict[str, Any]) -> str:
    return SUBCOMMANDS[result["bench"]][3](result)


def cli_configure_sweep(p: Any) -> None:
    p.add_argument("--quick", action="store_true", help="a few small points (CI; seconds)")
    p.add_argument("--threads", type=int, nargs="*", default=None,
                   help="thread counts (default: 1 and all cores; --quick: 1)")
    p.add_argument("--results", default="results", help="results folder (default: results)")
    p.add_argument("--host", default=None, help="host profile JSON (default: <results>/host_profile.json)")
    p.add_argument("--no-calibrate", action="store_true",
                   help="use the profile's calibration as is (default: measure it first)")
    p.add_argument("--pair", action="store_true", help="also measure the 105m / 206m presets")
    p.add_argument("--per-matrix", action="store_true",
                   help="measure the points at threads > 1 with a parallel region per large matrix "
                        "(Engine(region=False)) instead of the default one region per token; each row "
                        "is predicted with the splits of the engine that measured it")
    p.add_argument("--no-keep-models", action="store_true",
                   help="delete each random model this sweep builds after its last point (needs disk for "
                        "the largest model only, not all of them; the next sweep builds them again)")
    p.add_argument("--no-host-check", action="store_true",
                   help="do not time the host's read rate and kernel speed before each point "
                        "(how far the host drifted from its probe)")


def cli_run_sweep(args: Any) -> dict[str, Any]:
    from tern.core.paths import results_dir
    from tern.predict.hosts import resolve_host

    threads = args.threads or ([1] if args.quick else sorted({1, usable_cpus()}))
    if any(t < 1 for t in threads):  # before any probing or model building
        raise ValueError(f"--threads must be >= 1, got {threads}")
    out = results_dir(args.results)
    host = resolve_host(args.host, results=out, probe_if_missing=True)
    cal: dict[str, float] = dict(host.calibration)
    if not args.no_calibrate:
        host, cal = calibrate(host, out / "models", threads=threads, quick=args.quick)
        host.save(out / "host_profile_calibrated.json")
    pts = default_points(quick=args.quick, threads=threads)
    if args.pair:
        pts += preset_points(threads=threads, **({"tokens": 16} if args.quick else {"tokens": 64, **FULL_TIMING}))
    if args.per_matrix:
        pts = [dataclasses.replace(q, region=False) for q in pts]
    records = out / "bench" / "sweep.jsonl"
    check = not args.no_host_check
    rows = run_sweep(pts, records, out / "models", host, read_now=read_reference if check else None,
                     kernel_now=kernel_reference if check else None, keep_models=not args.no_keep_models)
    swept = [r for r in rows if r["family"] != "preset"]
    return {"bench": "sweep", "records": str(records), "host": host.label, "calibration": cal,
            "points": rows, "accuracy": accuracy(swept), "host_drift": drift_summary(swept),
            "pair": pair_summary(rows)}


def cli_render_sweep(r: dict[str, Any]) -> str:
    acc = r["accuracy"]
    lines = [render_rows(r["points"]), "",
             f"calibration: {r['calibration']}",
             f"accuracy: {acc.get('n')} points, median measured/predicted {acc.get('median_ratio', 0):.3f}, "
             f"worst {acc.get('worst_ratio', 0):.3f}, within ±25 %: {acc.get('within_25pct', 0):.0%}"]
    drift = drift_text(r.get("host_drift")).strip()
    if drift:
        lines.append(drift)
    for p in r["pair"]:
        lines.append(f"105m vs 206m at {p['threads']} thread(s): {p['105m_tok_per_s']:.1f} vs "
                     f"{p['206m_tok_per_s']:.1f} tok/s (ratio {p['measured_ratio']:.3f})")
    lines.append(f"records: {r['records']}")
    return "\n".join(lines)


def cli_configure_hosts(p: Any) -> None:
    p.add_argument("--root", default=None, help="committed hosts folder (default: benchmarks/hosts)")
    p.add_argument("--save", metavar="LABEL", default=None,
                   help="commit this machine as LABEL: --profile and --rows are copied into ROOT/LABEL")
    p.add_argument("--profile", default="results/host_profile.json", help="profile to commit (with --save)")
    p.add_argument("--rows", default="results/bench/sweep.jsonl", help="sweep rows to commit (with --save)")
    p.add_argument("--note", default="", help="a note stored with the committed host")
    p.add_argument("--repeat-rows", default=None,
                   help="a second sweep of the same points (with --save): committed as the host's run-to-run spread")


def cli_run_hosts(args: Any) -> dict[str, Any]:
    from tern.measure.hosts import hosts_report, save_host

    saved = None
    if args.save:
        saved = str(save_host(args.save, args.profile, args.rows, root=args.root, note=args.note,
                              repeat_rows=args.repeat_rows))
    return {"bench": "hosts", "saved": saved, "hosts": hosts_report(args.root)}


def cli_render_hosts(r: dict[str, Any]) -> str:
    from tern.measure.hosts import render_hosts_report

    head = [f"committed {r['saved']}"] if r.get("saved") else []
    return "\n".join(head + [render_hosts_report(r["hosts"])])


def cli_configure_frontier(p: Any) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--minutes", type=float, help="wall-clock minutes of CPU training per arm and seed (default 3)")
    g.add_argument("--seconds", type=float, help="the same budget in seconds")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds (default 0)")
    p.add_argument("--threads", type=int, nargs="+", default=None,
                   help="decode thread counts timed (default: 1 and all cores)")
    p.add_argument("--arms", nargs="+", default=None, metavar="ARM",
                   help="a subset of: sandbox dense_fp32 dense_ternary coarse_moe fine_moe (default all)")
    p.add_argument("--results", default="results",
                   help="results folder (rows: <results>/bench/frontier.jsonl; runs: <results>/frontier/)")
    p.add_argument("--smoke", action="store_true",
                   help="a seconds-scale run: a small base config, 1 s per arm (unless a budget is given), "
                        "validation on 4,096 tokens, rows in frontier_smoke.jsonl")
    p.add_argument("--force", action="store_true", help="retrain arms already in the rows file")
    p.add_argument("--tokens", type=int, default=None, help="timed decode tokens per repeat (default 256; smoke 32)")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per thread count (default 7; smoke 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed decode tokens first (default 32; smoke 4)")
    p.add_argument("--train-threads", type=int, default=0, help="torch threads for training (0: torch's default)")
    p.add_argument("--from-rows", metavar="JSONL", default=None,
                   help="train nothing: table and figure from a rows file (e.g. benchmarks/frontier/frontier.jsonl)")
    p.add_argument("--figure", default=None,
                   help="where to save the figure (default: <results>/figures/frontier[_smoke].png)")


def cli_run_frontier(args: Any) -> dict[str, Any]:
    from tern.core.paths import results_dir
    from tern.core.records import read_jsonl
    from tern.measure.frontier import DEFAULT_BUDGET_S, SMOKE_BUDGET_S, result_from_rows, run_frontier
    from tern.measure.plots_frontier import plot_frontier

    for name in ("minutes", "seconds"):
        v = getattr(args, name)
        if v is not None and not (v > 0 and v != float("inf")):
            raise ValueError(f"--{name} must be a number > 0, got {v}")
    if args.train_threads < 0:
        raise ValueError(f"--train-threads must be >= 0, got {args.train_threads}")
    if args.from_rows:
        src = Path(args.from_rows)
        if not src.is_file():
            raise FileNotFoundError(f"no rows file {src}")
        r = result_from_rows(read_jsonl(src), src)
    else:
        budget = (args.seconds if args.seconds is not None else 60.0 * args.minutes if args.minutes is not None
                  else SMOKE_BUDGET_S if args.smoke else DEFAULT_BUDGET_S)
        r = run_frontier(args.results, budget, args.seeds, args.threads or sorted({1, usable_cpus()}),
                         args.arms, smoke=args.smoke, force=args.force, tokens=args.tokens,
                         repeats=args.repeats, warmup=args.warmup, train_threads=args.train_threads,
                         command="tern " + " ".join(sys.argv[1:]))
    fig_path = Path(args.figure) if args.figure else (
        results_dir(args.results) / "figures" / f"frontier{'_smoke' if r['smoke'] else ''}.png")
    if r["points"]:
        fig_path.parent.mkdir(parents=True, exist_ok=True)
        plot_frontier(r["rows"]).savefig(fig_path, dpi=120, bbox_inches="tight")
        r["figure"] = str(fig_path)
    return r


def cli_render_frontier(r: dict[str, Any]) -> str:
    from tern.measure.frontier import render_frontier

    return render_frontier(r)


SUBCOMMANDS: dict[str, tuple[str, Callable, Callable, Callable]] = {
    "ladder": ("ablation ladder: tok/s and BPB of each engine optimization on the sandbox",
               _configure_ladder, _run_ladder, render_ladder),
    "sweep": ("decode sweeps from cache-resident to DRAM-bound: measured vs predicted tok/s",
              cli_configure_sweep, cli_run_sweep, cli_render_sweep),
    "peers": ("tern's engine beside llama.cpp's llama-bench on models of the same dimensions: "
              "tok/s, GB/s end to end, fraction of read bandwidth",
              cli_configure_peers, cli_run_peers, render_peers),
    "hosts": ("committed hosts (benchmarks/hosts): every host's sweep predicted again from its own profile, "
              "probe only; --save commits this one",
              cli_configure_hosts, cli_run_hosts, cli_render_hosts),
    "frontier": ("quality against decode speed: the sandbox recipe and its ablations (dense fp32, dense "
                 "ternary, coarse MoE, fine MoE) trained for one CPU budget, validation BPB against "
                 "measured decode tok/s",
                 cli_configure_frontier, cli_run_frontier, cli_render_frontier),
}
