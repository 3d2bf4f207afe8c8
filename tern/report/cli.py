"""`tern report`: run the notebooks into one self-contained report folder."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from tern.report.build import REPORT_DEFAULT_PARAMS, parse_params, run_report

JSON_FIELDS = """\
  out_dir: report folder; index: path of index.html; smoke: bool; wall_s: total seconds
  notebooks: [{name, status ("ok" | "failed" | "skipped"), wall_s, html, error}]
  headlines: {notebook: {figure_name_with_unit: value}}"""


def cli_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="report", help="report folder (default: ./report)")
    p.add_argument("--smoke", action="store_true", help="run every notebook in SMOKE mode (fast)")
    p.add_argument("--only", default=None,
                   help="comma-separated notebook numbers or names, e.g. 01,02")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per cell (default 3600)")
    p.add_argument("--clean", action="store_true", help="delete the report folder first")
    p.add_argument("--no-disk-check", action="store_true",
                   help="do not refuse to start when the disk looks too small for the random models "
                        "notebooks 06 and 08 write (planned and checked before the first notebook runs)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                   help="set a notebook parameter where a notebook declares it, e.g. -p MINUTES=20 "
                        f"(defaults here: {REPORT_DEFAULT_PARAMS})")


def cli_run(args: argparse.Namespace) -> dict[str, Any]:
    if args.clean and Path(args.out).exists():
        shutil.rmtree(args.out)
    only = args.only.split(",") if args.only else None
    return run_report(args.out, smoke=args.smoke, only=only, timeout_s=args.timeout,
                      params={**REPORT_DEFAULT_PARAMS, **parse_params(args.param)},
                      check_disk=not args.no_disk_check)


def cli_render(result: dict[str, Any]) -> str:
    lines = [f"{r['name']:<28} {r['status']:<7} {r['wall_s']:8.1f} s  {r['error'] or ''}"
             for r in result["notebooks"]]
    lines.append(f"report: {result['index']}  ({result['wall_s']:.0f} s)")
    return "\n".join(lines)


def cli_exit(result: dict[str, Any]) -> int:
    """1 when a notebook failed (the report is still written, with the failure in it), else 0."""
    return 1 if any(r["status"] == "failed" for r in result["notebooks"]) else 0
