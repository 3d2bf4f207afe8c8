"""`tern gate`: run, plan, list and show pre-registered gates."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tern.decide.harness import plan, run_gate
from tern.decide.registry import default_registry, format_table, format_verdict, list_gates, show_gate
from tern.decide.spec import load_gate

JSON_FIELDS = """\
  every object has command ("run" | "dry-run" | "list" | "show" | "plot")
  run:  {verdicts: [one verdict record per gate file, in order]}; a verdict record is
        {record: "gate_verdict", gate, gate_hash, verdict
        ("pass" | "fail" | "inconclusive"), metric, rule: {text, kind, op, margin, k_sigma},
        comparisons: [{b, a, n, mean_delta, sd_delta, se_delta, z, lo, hi, verdict, reason,
        per_seed: [{seed, a, b, delta}]}], arms: {arm: {n, mean, se, per_seed: {seed: value},
        total_params, active_params, recorded: {metric: mean}}}, runs_reused, runs_trained,
        registry, content (the gate file), run_metadata}
        (--dry-run: {plans: [{gate, gate_hash, runs: [{arm, seed, done}], runs_total,
        runs_done, train_tokens_per_run, train_tokens_total, teacher_steps}]})
  list: {registry, gates: [{gate, gate_hash, verdict, rule, metric, comparisons:
        [{b, a, n, mean_delta, se_delta, z, verdict}], runs_done, runs_total, timestamp}]}
  show: {gate, gate_hash, verdict record (as run) or null, runs: [gate_run rows]}
  plot: {figures: [png paths]}"""


def cli_configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="gate_cmd", metavar="<run|list|show|plot>", required=True)
    r = sub.add_parser("run", help="run (or resume) a gate file and append its verdict")
    r.add_argument("files", nargs="+", metavar="file",
                   help="gate TOML file(s), run one after the other (e.g. gates/*.toml)")
    r.add_argument("--dry-run", action="store_true", help="validate and list the runs; train nothing")
    r.add_argument("--work-dir", default=None, help="teacher checkpoints (default: next to the registry)")
    r.add_argument("--quiet", action="store_true", help="no progress output")
    sub.add_parser("list", help="verdict table of every gate in the registry")
    s = sub.add_parser("show", help="one gate: verdict, pre-registration, per-seed results")
    s.add_argument("name")
    pl = sub.add_parser("plot", help="forest plot of all verdicts and the capacity-scaling plot")
    pl.add_argument("--out", default=None, help="folder for the PNGs (default: next to the registry)")
    pl.add_argument("--capacity-gate", default="capacity_scaling",
                    help="gate whose arms make the capacity-scaling plot")
    for q in (r, sub.choices["list"], s, pl):
        q.add_argument("--registry", default=None,
                       help="registry JSONL (default: results/gates/registry.jsonl)")
        # also accepted after the nested command (`tern gate list --json`)
        q.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print exactly one JSON object on stdout (logs go to stderr)")


def cli_run(args: argparse.Namespace) -> dict[str, Any]:
    registry = Path(args.registry) if args.registry else default_registry()
    if args.gate_cmd == "run":
        specs = [load_gate(f) for f in args.files]  # all validated before anything trains
        if args.dry_run:
            return {"command": "dry-run", "plans": [plan(s, registry) for s in specs]}
        return {"command": "run", "verdicts": [run_gate(s, registry, work_dir=args.work_dir,
                                                        progress=not args.quiet) for s in specs]}
    if args.gate_cmd == "list":
        return {"command": "list", "registry": str(registry), "gates": list_gates(registry)}
    if args.gate_cmd == "show":
        return {"command": "show", **show_gate(registry, args.name)}
    from tern.decide.plots import plot_registry

    out = Path(args.out) if args.out else registry.parent
    return {"command": "plot", "figures": [str(p) for p in
                                           plot_registry(registry, out, args.capacity_gate)]}


def cli_render(result: dict[str, Any]) -> str:
    cmd = result.pop("command")
    if cmd == "list":
        return format_table(result["gates"]) if result["gates"] else f"no gates in {result['registry']}"
    if cmd == "run":
        return "\n\n".join(format_verdict(v) for v in result["verdicts"])
    if cmd == "show":
        if result["verdict"]:
            return format_verdict(result["verdict"])
        return (f"gate {result['gate']} [{result['gate_hash'][:12]}]: no verdict yet, "
                f"{len(result['runs'])} run(s) finished")
    if cmd == "dry-run":
        lines = [f"gate {p['gate']} [{p['gate_hash'][:12]}]: {p['runs_total']} runs "
                 f"({p['runs_done']} already done), {p['train_tokens_per_run']:,} train tokens per "
                 f"arm run, {p['train_tokens_total']:,} in all arm runs; teacher steps "
                 f"{p['teacher_steps'] or 'none'}" for p in result["plans"]]
        total = sum(p["train_tokens_total"] for p in result["plans"])
        return "\n".join(lines + [f"all arm runs: {total:,} train tokens (teachers not included)"])
    return "\n".join(result["figures"])
