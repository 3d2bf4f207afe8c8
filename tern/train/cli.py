"""`tern train`: train a model from the command line (and `python -m tern.train.cli` for torchrun)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch  # noqa: E402

from tern.core.config import ModelConfig, load_config  # noqa: E402
from tern.core.records import clean_stale_temps
from tern.packed.format import CHECKS, default_tokenizer
from tern.packed.reader import validate_packed
from tern.packed.writer import random_model
from tern.train.config import TrainConfig  # noqa: E402
from tern.train.export import export
from tern.train.loop import LOG_NAME, run_training

JSON_FIELDS = """\
  val_bpb: validation bits per byte (full split), val_nats_per_token
  train_tokens, steps, tokens_per_s (training only), train_s, wall_s, final_loss (nats/token)
  sparsity: [{layer, kind, zero_frac, shared_zero_frac}]  (fraction of exact zeros)
  expert_load: [{layer, max_over_mean, min_over_mean, dead_experts, counts}]
  evals: periodic validation rows; checkpoint: path; device; world_size; counts"""


DEFAULT_MINUTES = 20.0  # the budget when neither --steps, --minutes nor --train-set gives one

# flag -> (smallest value, what it must be); checked before the configs so the error names the flag
_FLAG_MINIMUMS = {"steps": (1, "an integer >= 1"), "seed": (0, "an integer >= 0"),
                  "batch_size": (1, "an integer >= 1"), "seq_len": (1, "an integer >= 1"),
                  "threads": (0, "an integer >= 0 (0: default)"), "eval_every": (0, "an integer >= 0")}


def _parse_overrides(items: list[str]) -> dict[str, Any]:
    out = {}
    for it in items or []:
        if "=" not in it:
            raise ValueError(f"--set expects key=value, got {it!r}")
        k, v = it.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def cli_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="sandbox", help="model preset or config JSON (default sandbox)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a ModelConfig field (JSON value), repeatable")
    p.add_argument("--train-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a TrainConfig field (JSON value), repeatable")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--minutes", type=float, help=f"time budget in minutes, > 0 (default {DEFAULT_MINUTES:g})")
    g.add_argument("--steps", type=int, help="optimizer steps, >= 1")
    p.add_argument("--seed", type=int, default=0, help="seed, >= 0 (default 0)")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: default)")
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--out", default="results/train", help="output folder (log, checkpoint, plots)")
    p.add_argument("--resume", help="checkpoint to continue from")
    p.add_argument("--no-progress", action="store_true")


def _check_flags(args: argparse.Namespace) -> None:
    """ValueError naming the flag of the first out-of-range value (zero is a value, not
    "not given": --steps 0 and --minutes 0 are errors)."""
    for name, (lo, what) in _FLAG_MINIMUMS.items():
        v = getattr(args, name, None)
        if v is not None and v < lo:
            raise ValueError(f"--{name.replace('_', '-')} must be {what}, got {v}")
    for name in ("minutes", "lr"):
        v = getattr(args, name, None)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"--{name} must be a number > 0, got {v}")


def configs_from_args(args: argparse.Namespace) -> tuple[ModelConfig, TrainConfig]:
    """(ModelConfig, TrainConfig) of `tern train`'s arguments. The budget is --steps or
    --minutes (or a --train-set steps=/minutes=), else DEFAULT_MINUTES."""
    _check_flags(args)
    mcfg = load_config(args.preset, _parse_overrides(args.set))
    kw: dict[str, Any] = {"seed": args.seed, "device": args.device, "threads": args.threads,
                          "eval_every": args.eval_every}
    for k in ("steps", "minutes", "batch_size", "seq_len", "lr"):
        if getattr(args, k) is not None:
            kw[k] = getattr(args, k)
    kw.update(_parse_overrides(args.train_set))
    if "steps" not in kw and "minutes" not in kw:
        kw["minutes"] = DEFAULT_MINUTES
    kw.setdefault("seq_len", min(TrainConfig.seq_len, mcfg.max_seq_len))
    return mcfg, TrainConfig.from_dict(kw)


def cli_run(args: argparse.Namespace) -> dict[str, Any]:
    mcfg, tc = configs_from_args(args)
    clean_stale_temps(args.out)  # temps of a killed earlier run's checkpoint writes (~100 MB each)
    res = run_training(mcfg, tc, args.out, progress=not args.no_progress, resume=args.resume)
    with contextlib.suppress(ValueError, ImportError):
        from tern.train.plots import plot_run

        res["plots"] = [str(p) for p in plot_run(Path(args.out) / LOG_NAME, args.out)]
    return res


def cli_render(r: dict[str, Any]) -> str:
    bpb = r.get("val_bpb")
    lines = [f"steps {r['steps']}, {r['train_tokens']:,} tokens, {r['tokens_per_s']:.0f} tok/s, "
             f"final loss {r['final_loss']:.4f} nats/token",
             f"val BPB {bpb:.4f}" if bpb is not None else "val BPB: n/a"]
    for s in r.get("sparsity", []):
        if s.get("zero_frac") is not None:
            lines.append(f"layer {s['layer']} {s['kind']}: {100 * s['zero_frac']:.1f} % zeros")
    for e in r.get("expert_load", []):
        lines.append(f"layer {e['layer']} experts: max/mean {e['max_over_mean']:.2f}, "
                     f"dead {e['dead_experts']}")
    lines.append(f"checkpoint: {r.get('checkpoint')}")
    return "\n".join(lines)


def _main(argv: list[str] | None = None) -> int:
    """torchrun entry: python -m tern.train.cli --model M.json --train T.json --out DIR."""
    p = argparse.ArgumentParser(prog="python -m tern.train.cli")
    p.add_argument("--model", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--resume")
    a = p.parse_args(argv)
    mcfg = load_config(a.model)
    tc = TrainConfig.from_dict(json.loads(Path(a.train).read_text(encoding="utf-8")))
    try:
        run_training(mcfg, tc, a.out, progress=True, resume=a.resume)
        if torch.distributed.is_initialized():
            # every rank tears the process group down together: a rank that destroyed it and
            # exited while rank 0 was still writing its results once aborted in gloo's
            # threads ("terminate called without an active exception", SIGABRT)
            torch.distributed.barrier()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(_main())


# ---- `tern export` --------------------------------------------------------------------------
EXPORT_JSON_FIELDS = """\
  action: "export" | "random" | "validate"; path; file_bytes; seconds (wall time);
  config: ModelConfig fields; tokenizer: {name, sha256} or null; creator; check;
  not_verified: what the check did not look at (--check header: the tensor data)"""


def export_configure(p: Any) -> None:
    p.add_argument("source", nargs="?", help="checkpoint to export (tern train's checkpoint.pt)")
    p.add_argument("out", nargs="?", help="packed model file to write")
    p.add_argument("--random", metavar="CONFIG",
                   help="write a random model of a preset or config JSON (no torch): tern export --random sandbox out.tern")
    p.add_argument("--seed", type=int, default=0, help="seed of --random")
    p.add_argument("--tokenizer", help="tokenizer name recorded in the file (default: the checkpoint's)")
    p.add_argument("--validate", metavar="FILE", help="validate a packed file and print its summary")
    p.add_argument("--check", choices=CHECKS, default="full",
                   help="validation depth: full (crc32 and ternary codes of every byte) or header "
                        "(structure only: flipped weight bits, NaN weights and invalid ternary "
                        "codes pass it)")


def export_run(args: Any) -> dict[str, Any]:
    import time

    from tern.core.config import load_config

    t0 = time.perf_counter()
    if args.seed < 0:
        raise ValueError(f"--seed must be an integer >= 0, got {args.seed}")
    if args.validate:
        action, path = "validate", Path(args.validate)
    elif args.random:
        out = args.out or args.source
        if not out:
            raise ValueError("tern export --random CONFIG OUT: the output file is missing")
        action, cfg = "random", load_config(args.random)
        path = random_model(cfg, out, seed=args.seed, tokenizer=args.tokenizer or default_tokenizer(cfg))
    else:
        if not (args.source and args.out):
            raise ValueError("usage: tern export CHECKPOINT OUT | --random CONFIG OUT | --validate FILE")
        action = "export"
        path = export(args.source, args.out, tokenizer=args.tokenizer)
    summary = validate_packed(path, check=args.check)
    return {"action": action, **summary, "seconds": time.perf_counter() - t0}


def export_render(r: dict[str, Any]) -> str:
    tok = r["tokenizer"]["name"] if r["tokenizer"] else "none"
    verb = {"validate": "valid", "random": "wrote random", "export": "exported"}[r["action"]]
    if r["action"] == "validate" and r.get("not_verified"):
        verb = "header valid"
    line = (f"{verb}: {r['path']} ({r['file_bytes'] / 1e6:.2f} MB, config {r['config']['name']}, "
            f"tokenizer {tok}, {r['check']} check, {r['seconds']:.1f} s)")
    if r.get("not_verified"):
        line += f"\nnot verified by the {r['check']} check: {'; '.join(r['not_verified'])} (use --check full)"
    return line


# `tern export` as a subcommand object (tern.cli: 'tern.train.cli:export_command')
export_command = SimpleNamespace(cli_configure=export_configure, cli_run=export_run, cli_render=export_render,
                       JSON_FIELDS=EXPORT_JSON_FIELDS)
