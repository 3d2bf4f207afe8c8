"""`tern presets`: the model presets and their counted parameters and bytes."""

from __future__ import annotations

import argparse
from typing import Any

from tern.core.config import PRESETS, load_config, param_counts

JSON_FIELDS = """\
  presets: {name: {config: ModelConfig fields,
                   counts: total/active/resident/streamed _params and _bytes,
                   expert_bytes_total, state_bytes, kv_bytes_per_position}}"""


def cli_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", help="presets or config JSON files (default: all presets)")


def cli_run(args: argparse.Namespace) -> dict[str, Any]:
    names = args.names or list(PRESETS)
    out = {}
    for n in names:
        cfg = load_config(n)
        out[cfg.name] = {"config": cfg.to_dict(), "counts": param_counts(cfg).summary()}
    return {"presets": out}


def cli_render(result: dict[str, Any]) -> str:
    lines = [f"{'preset':<10} {'total':>10} {'active':>10} {'resident':>10} {'streamed':>10}"
             f" {'total MB':>9} {'active MB':>9}"]
    for name, r in result["presets"].items():
        c = r["counts"]
        lines.append(
            f"{name:<10} {c['total_params'] / 1e6:9.2f}M {c['active_params'] / 1e6:9.2f}M "
            f"{c['resident_params'] / 1e6:9.2f}M {c['streamed_params'] / 1e6:9.2f}M "
            f"{c['total_bytes'] / 1e6:9.1f} {c['active_bytes'] / 1e6:9.2f}")
    lines.append("(params in millions; MB = 1e6 bytes as stored in each preset's formats)")
    return "\n".join(lines)
