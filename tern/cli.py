"""`tern` command line: one subcommand per concern, each living in its own module.

A subcommand module (or an object in one: ``module:object``) provides
    cli_configure(parser)      add its arguments (and nested subcommands)
    cli_run(args) -> dict      do the work; progress and logs go to stderr
    cli_render(result) -> str  optional human-readable form of the result
    JSON_FIELDS: str           optional description of the result's fields (shown in --help)
With ``--json`` the result is printed to stdout as exactly one JSON object. Modules are
imported only when their subcommand runs, so ``tern --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

# name -> (module[:object], one-line help). Keep in pipeline order. The module (or the object
# in it) provides cli_configure / cli_run and optionally cli_render / JSON_FIELDS.
COMMANDS: dict[str, tuple[str, str]] = {
    "probe": ("tern.probe.cli", "measure caches, bandwidth against working set and kernel roofs -> host_profile.json"),
    "presets": ("tern.core.cli", "list model presets with their parameter and byte counts"),
    "predict": ("tern.predict.cli", "two-pool roofline: predicted decode tok/s of a config on a host, and why"),
    "design": ("tern.predict.cli:design_command", "design search: active budget and configs reaching a target tok/s"),
    "data": ("tern.data.cli", "shipped corpus and tokenizers: stats, encode/decode, BPB of xz"),
    "train": ("tern.train.cli", "train a model (CPU/CUDA/torchrun DDP): val BPB, tok/s, sparsity, expert load"),
    "export": ("tern.train.cli:export_command", "packed model files: export a checkpoint, write a random model, validate"),
    "generate": ("tern.run.cli", "stream text from a packed model with the numba engine"),
    "bench": ("tern.measure.cli", "decode benchmarks of the numba engine (ladder: tok/s and BPB per optimization)"),
    "gate": ("tern.decide.cli", "pre-registered A/B gates over seeds: run, list verdicts, show, plot"),
    "report": ("tern.report.cli", "run the numbered notebooks into one self-contained HTML report"),
}


def load_command(spec: str):
    """The module or object of a COMMANDS spec ``"package.module[:object]"``."""
    modname, _, attr = spec.partition(":")
    mod = importlib.import_module(modname)
    return getattr(mod, attr) if attr else mod


def _build_parser(selected: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tern",
        description="tern: predict, train, run and measure CPU-first ternary / MoE / SSM "
                    "language models. Every subcommand that reports figures takes --json.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from tern import __version__

    parser.add_argument("--version", action="version", version=f"tern {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, (modname, help_) in COMMANDS.items():
        if name != selected:
            sub.add_parser(name, help=help_, add_help=False)
            continue
        mod = load_command(modname)
        fields = getattr(mod, "JSON_FIELDS", "")
        p = sub.add_parser(
            name, help=help_, description=help_,
            epilog=("--json output fields:\n" + fields) if fields else None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("--json", action="store_true",
                       help="print exactly one JSON object on stdout (logs go to stderr)")
        mod.cli_configure(p)
        p.set_defaults(_module=mod)
    return parser


def render_default(result: Any) -> str:
    return json.dumps(result, indent=2, sort_keys=True, default=str)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in argv if not a.startswith("-")), None)
    parser = _build_parser(selected if selected in COMMANDS else None)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 0
    mod = args._module
    try:
        result = mod.cli_run(args)
    except (ValueError, OSError) as e:  # bad input, or the system refused (no space, no permission): no traceback
        print(f"tern {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tern {args.command}: interrupted", file=sys.stderr)
        return 130
    if result is None:
        return 0
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(result, sort_keys=True, default=str) + "\n")
    else:
        render = getattr(mod, "cli_render", render_default)
        print(render(result))
    exit_code = getattr(mod, "cli_exit", None)  # a command whose result can say it failed
    return exit_code(result) if exit_code else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
