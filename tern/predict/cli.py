"""`tern predict`: the two-pool prediction of a config on a host."""

from __future__ import annotations

import argparse
from types import SimpleNamespace
from typing import Any

from tern.core.config import load_config
from tern.core.formats import FORMATS
from tern.predict.design import budgets_by_threads, render_budgets
from tern.predict.hosts import resolve_host
from tern.predict.roofline import POLICIES, PoolPrediction, Prediction, predict
from tern.predict.tables import render_prediction

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
    if min(args.threads) < 1:
        raise ValueError(f"--threads must be integers >= 1, got {args.threads}")
    if args.context is not None and args.context < 0:
        raise ValueError(f"--context must be an integer >= 0, got {args.context}")
    host = resolve_host(args.host, reference=args.reference)  # a bad --host file: named in the error
    preds = [predict(load_config(c), host, t, args.context, args.fmt, args.policy).to_dict()
             for c in args.config for t in args.threads]
    return {"predictions": preds}


def cli_render(result: dict[str, Any]) -> str:
    out = []
    for d in result["predictions"]:
        d = dict(d, resident=PoolPrediction(**d["resident"]), streamed=PoolPrediction(**d["streamed"]))
        out.append(render_prediction(Prediction(**d)))
    return "\n\n".join(out)


# ---- `tern design` --------------------------------------------------------------------------
DESIGN_JSON_FIELDS = """\
  budgets: [{threads, target_tok_per_s, total_params, format, active_bytes_max,
             active_params_max, bandwidth_gbps, n_candidates, config, config_active_params,
             config_total_params, config_tok_per_s}]
  host_label: the profile used"""


def design_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", type=float, default=100.0, help="tok/s to reach (default 100)")
    p.add_argument("--total", type=float, default=10e9, help="total params (default 10e9)")
    p.add_argument("--format", dest="fmt", default="ternary2", choices=sorted(FORMATS))
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--host", default=None,
                   help="host profile JSON (default: results/host_profile.json, else the reference PC)")
    p.add_argument("--reference", action="store_true", help="use the bundled reference PC profile")
    p.add_argument("--ram-gb", type=float, default=None, help="RAM to fit in, GB (default: the host's)")
    p.add_argument("--no-search", action="store_true", help="only the analytic budget")


def design_run(args: argparse.Namespace) -> dict[str, Any]:
    host = resolve_host(args.host, reference=args.reference)
    ram = int(args.ram_gb * 1e9) if args.ram_gb else None
    bs = budgets_by_threads(host, args.target, args.total, args.fmt, tuple(args.threads),
                            space=False if args.no_search else None, ram_bytes=ram)
    return {"host_label": host.label, "budgets": [b.row() | {"notes": list(b.notes)} for b in bs],
            "text": render_budgets(bs)}


def design_render(result: dict[str, Any]) -> str:
    return result["text"]


# `tern design` as a subcommand object (tern.cli: 'tern.predict.cli:design_command')
design_command = SimpleNamespace(cli_configure=design_configure, cli_run=design_run, cli_render=design_render,
                       JSON_FIELDS=DESIGN_JSON_FIELDS)
