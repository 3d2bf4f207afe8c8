"""`tern gate`: run, plan, list and show pre-registered gates."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tern.decide.harness import plan, run_gate
from tern.decide.registry import (
    default_registry,
    format_table,
    format_verdict,
    list_gates,
    registry_to_show,
    shipped_registry,
    show_gate,
)
from tern.decide.spec import load_gate
from tern.decide.workers import DEFAULT_WORKERS

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
  list: {registry, registry_source ("given" | "local" | "shipped": which registry was read),
        gates: [{gate, gate_hash, verdict, rule, metric, comparisons:
        [{b, a, n, mean_delta, se_delta, z, verdict}], runs_done, runs_total, timestamp}]}
  show: {registry, registry_source, gate, gate_hash, verdict record (as run) or null,
        runs: [gate_run rows]}
  plan: {plans: [{gate, gate_hash, rule, k_sigma, power, z_power, metric, seeds,
        tokens_per_run: {arm: n}, tokens_per_param: {arm: x}, spread_basis, token_exponent,
        token_scaling, seed_scaling, comparisons: [{b, a, spread, n_spread, sd_delta,
        spread_tokens, observed_delta, se_at_gate, mde_at_gate, target_effect, target_basis,
        seeds_needed, tokens_needed}], seeds_needed, arms_cost: {arm: {tokens, tok_per_s,
        eval_s, n, source, run_s}}, teachers_cost: {name: (the same)}, workers, cpu_wall_s, cpu_wall_s_needed, gpu_tok_per_s,
        gpu_measured: {arm: {tok_per_s, eval_s, concurrent, total_tok_per_s, n, gpu}} or null,
        gpu_wall_s, gpu_wall_s_needed}]} (seconds; null where unknown)
  plot: {figures: [png paths]}"""


def cli_configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="gate_cmd", metavar="<run|plan|list|show|plot>", required=True)
    r = sub.add_parser("run", help="run (or resume) a gate file and append its verdict")
    r.add_argument("files", nargs="+", metavar="file",
                   help="gate TOML file(s), run one after the other (e.g. gates/*.toml)")
    r.add_argument("--dry-run", action="store_true", help="validate and list the runs; train nothing")
    r.add_argument("--work-dir", default=None, help="teacher checkpoints (default: next to the registry)")
    r.add_argument("--quiet", action="store_true", help="no progress output")
    r.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                   help=f"runs side by side in a local process pool (default {DEFAULT_WORKERS}: "
                        "measured best on the 2-core reference host); with --dask: LocalCluster size")
    r.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run on an existing Dask cluster (tcp://host:8786); the registry and "
                        "--work-dir must be on a file system its workers share")
    r.add_argument("--dask", action="store_true",
                   help="run on a local Dask cluster of --workers processes (pip install 'tern[dist]')")
    _configure_plan(sub)
    sub.add_parser("list", help="verdict table of every gate in the registry")
    s = sub.add_parser("show", help="one gate: verdict, pre-registration, per-seed results")
    s.add_argument("name")
    pl = sub.add_parser("plot", help="forest plot of all verdicts and the capacity-scaling plot")
    pl.add_argument("--out", default=None, help="folder for the PNGs (default: next to the registry)")
    pl.add_argument("--capacity-gate", default="capacity_scaling",
                    help="gate whose arms make the capacity-scaling plot")
    for q in (r, sub.choices["plan"], sub.choices["list"], s, pl):
        q.add_argument("--registry", default=None,
                       help="registry JSONL (default: results/gates/registry.jsonl; `list` and "
                            "`show` fall back to the shipped gates/registry.jsonl when that one "
                            "is missing or empty)")
        # also accepted after the nested command (`tern gate list --json`)
        q.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print exactly one JSON object on stdout (logs go to stderr)")


def cli_run(args: argparse.Namespace) -> dict[str, Any]:
    registry = Path(args.registry) if args.registry else default_registry()
    if args.gate_cmd == "run":
        specs = [load_gate(f) for f in args.files]  # all validated before anything trains
        if args.dry_run:
            return {"command": "dry-run", "plans": [plan(s, registry) for s in specs]}
        sched = args.scheduler or ("local" if args.dask else None)
        return {"command": "run", "verdicts": [run_gate(s, registry, work_dir=args.work_dir,
                                                        progress=not args.quiet, workers=args.workers,
                                                        scheduler=sched) for s in specs]}
    if args.gate_cmd == "plan":
        from tern.decide.planning import plan_files

        return {"command": "plan", "plans": plan_files(
            args.files, args.registry, speed=args.speed, pilot_steps=args.pilot_steps,
            workers=args.workers, power=args.power, effect=args.effect,
            token_exponent=args.token_exponent, gpu_tok_per_s=args.gpu_tok_per_s)}
    if args.gate_cmd in ("list", "show"):
        registry, source = _registry_to_read(args.registry)
        if args.gate_cmd == "list":
            return {"command": "list", "registry": str(registry), "registry_source": source,
                    "gates": list_gates(registry)}
        return {"command": "show", "registry": str(registry), "registry_source": source,
                **show_gate(registry, args.name)}
    from tern.decide.plots import plot_registry

    out = Path(args.out) if args.out else registry.parent
    return {"command": "plot", "figures": [str(p) for p in
                                           plot_registry(registry, out, args.capacity_gate)]}


def _configure_plan(sub: Any) -> None:
    q = sub.add_parser("plan", help="power before running: MDE at the gate's seeds, seeds / tokens "
                                    "needed, wall time here (and on a GPU: a rate you give or measured rows)")
    q.add_argument("files", nargs="+", metavar="file", help="gate TOML file(s)")
    q.add_argument("--power", type=float, default=None, help="power of the MDE (default: the gate's "
                   "[plan] power, else 0.8)")
    q.add_argument("--effect", type=float, default=None, help="effect to detect, metric units "
                   "(default: the gate's [plan] effect, the margin of a margin rule, else the observed Δ)")
    q.add_argument("--token-exponent", type=float, default=None, help="assume se ∝ tokens^-γ "
                   "(default: unknown — spread carried unchanged, no token count derived)")
    q.add_argument("--gpu-tok-per-s", type=float, default=None,
                   help="a training rate measured on your GPU (tok/s); wins over --speed rows measured there")
    q.add_argument("--speed", default=None, help="JSONL of train_speed rows (benchmarks/"
                   "gate_train_speed.py): measured rates that win over the registry's; rows measured "
                   "with --device cuda give the GPU wall time")
    q.add_argument("--workers", type=int, default=1, help="runs side by side (rates as measured so)")
    q.add_argument("--pilot-steps", type=int, default=None, help="no spread in the registry: run a "
                   "pilot of this many steps first (3 seeds, into --registry)")


def _registry_to_read(given: str | None) -> tuple[Path, str]:
    """(registry, source) for the read-only commands: ``--registry`` as given; else the
    results folder's registry when it holds records ("local"), else the shipped
    gates/registry.jsonl ("shipped", when present: a fresh clone has run no gate)."""
    if given:
        return Path(given), "given"
    reg = registry_to_show(default_registry(), ran_here=False)
    return reg, "shipped" if reg == shipped_registry() else "local"


def _where(result: dict[str, Any]) -> str:
    words = {"given": "", "local": " (this machine's results)",
             "shipped": f" (shipped with tern; {default_registry()} is missing or empty)"}
    return f"registry: {result['registry']}{words[result['registry_source']]}"


def cli_render(result: dict[str, Any]) -> str:
    cmd = result.pop("command")
    if cmd == "list":
        return (f"{_where(result)}\n{format_table(result['gates'])}" if result["gates"]
                else f"no gates in {result['registry']}")
    if cmd == "run":
        return "\n\n".join(format_verdict(v) for v in result["verdicts"])
    if cmd == "show":
        if result["verdict"]:
            return f"{_where(result)}\n{format_verdict(result['verdict'])}"
        return (f"{_where(result)}\ngate {result['gate']} [{result['gate_hash'][:12]}]: no verdict yet, "
                f"{len(result['runs'])} run(s) finished")
    if cmd == "plan":
        from tern.decide.planning import format_plan

        return "\n\n".join(format_plan(p) for p in result["plans"])
    if cmd == "dry-run":
        lines = [f"gate {p['gate']} [{p['gate_hash'][:12]}]: {p['runs_total']} runs "
                 f"({p['runs_done']} already done), {p['train_tokens_per_run']:,} train tokens per "
                 f"arm run, {p['train_tokens_total']:,} in all arm runs; teacher steps "
                 f"{p['teacher_steps'] or 'none'}" for p in result["plans"]]
        total = sum(p["train_tokens_total"] for p in result["plans"])
        return "\n".join(lines + [f"all arm runs: {total:,} train tokens (teachers not included)"])
    return "\n".join(result["figures"])
