"""`tern probe`: measure this host into a HostProfile."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from tern.core.host_profile import HostProfile
from tern.core.records import check_writable
from tern.probe.bandwidth import KERNELS, format_bytes
from tern.probe.plateaus import format_cache_table, format_kernel_table, format_plateau_table, probe_summary
from tern.probe.profile import DEFAULT_OUT, probe_config, run_probe
from tern.probe.timing import noted_compile_s

JSON_FIELDS = """\
  profile_path: where host_profile.json was saved;  cpu_model;  mode: quick|full
  cache_source: /sys, getconf, sysctl, default (joined with + when mixed)
  caches: [{level, type, size_bytes (one instance), instances, shared_by (logical CPUs)}]
  llc_bytes: total last-level cache;  read_kernel_simd: zmm|ymm|xmm|scalar
  engine_llc_bytes: the last-level cache the engine's streaming rule assumes on this machine (the read
                    curve's last cache tier where it is under half the declared one, else the declared)
  plateaus_gbps: {threads: {L1, L2, L3, DRAM: read GB/s (1e9 B/s) or null}}
  plateau_spread: {threads: {level: {gbps, gbps_min, gbps_max (slowest / fastest timed run),
                   runs, points, span_s (first to last run start; runs are interleaved)}}}
  kernels: [{kernel, threads, rows, cols, gops_median (multiply-add = 2 ops), gbps_median (weights)}]
  op_costs: [{op, threads, call_s, row_s, unit_s (seconds: call + row x rows + unit x units),
             samples, max_rel_err}]: engine operation costs the roofline prices work with
  wall_s: probe wall time in seconds
  compile_s: the part of wall_s numba spent compiling kernels (first run on a machine, or after an
             engine change; ~0 once numba's cache is warm); null in profiles written before it was kept
  stream_prefetch: {choice: {threads: prefetch or not}, off_over_on: {threads: ratio}, stream: {threads:
                   stream DRAM long rows, or the 4-row pass}, rows_over_stream: {threads: ratio}, tuning_path:
                   where the engine reads the choices (null with --no-tuning)}; absent with --no-op-costs"""


def _thread_list(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threads wants comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"--threads wants integers >= 1, got {text!r}")
    return tuple(sorted(set(vals)))


def cli_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="2 points per octave, 20 ms runs, read kernel only, up to 4x LLC; the engine kernels' "
                        "curves at fewer working sets and row lengths, one thread only (~25-30 s)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"where to save the profile (default {DEFAULT_OUT})")
    p.add_argument("--threads", type=_thread_list, default=None,
                   help="comma-separated thread counts (default: 1 and all CPUs)")
    p.add_argument("--no-op-costs", action="store_true",
                   help="skip timing the engine's operations (the roofline then uses its plain model)")
    p.add_argument("--no-tuning", action="store_true",
                   help="do not write the streaming kernel's prefetch choice to the engine tuning file "
                        "(tern.core.engine_tuning; the engine then keeps its earlier choice or the default)")
    p.add_argument("--kernels", default=None,
                   help=f"bandwidth kernels, comma-separated from {','.join(KERNELS)} "
                        "(default: read for --quick, all for full)")


def cli_run(args: argparse.Namespace) -> dict[str, Any]:
    kernels = tuple(k.strip() for k in args.kernels.split(",")) if args.kernels else None
    if kernels:
        bad = [k for k in kernels if k not in KERNELS]
        if bad:
            raise ValueError(f"unknown bandwidth kernel(s) {bad}; choose from {list(KERNELS)}")
    out = check_writable(args.out)  # before minutes of measuring, not after
    cfg = probe_config(quick=args.quick, thread_counts=args.threads, kernels=kernels)
    if args.no_op_costs:
        cfg = replace(cfg, op_costs=False)
    print(f"tern probe ({'quick' if args.quick else 'full'}): {cfg.sweep.n_points()} bandwidth points, "
          f"{format_bytes(cfg.sweep.min_ws_bytes)} .. {format_bytes(cfg.sweep.max_ws_bytes)}, "
          f"threads {list(cfg.sweep.thread_counts)}", file=sys.stderr)
    profile = run_probe(cfg, out=out, tuning=not args.no_tuning)
    summary = probe_summary(profile, out)
    ab = profile.host.get("stream_prefetch")
    if ab is not None:
        summary["stream_prefetch"] = {"choice": ab["stream_prefetch"], "off_over_on": ab["off_over_on"],
                                      "stream": ab["stream"], "rows_over_stream": ab["rows_over_stream"],
                                      "tuning_path": ab["tuning_path"]}
    return summary


def _compile_note(result: dict[str, Any]) -> str:
    """', N s of it numba compiling ...' when compiling took a noticeable share (a fresh machine)."""
    c = noted_compile_s(result.get("compile_s"))
    if c is None:
        return ""
    return f", {c:.0f} s of it numba compiling the kernels once: cached for the next runs"


def cli_render(result: dict[str, Any]) -> str:
    prof = HostProfile.load(result["profile_path"])
    parts = [f"{result['cpu_model']} ({result['mode']} probe, {result['wall_s']} s{_compile_note(result)}; "
             f"read kernel uses {result['read_kernel_simd']})",
             format_cache_table(prof), format_plateau_table(prof), format_kernel_table(prof)]
    if prof.op_costs:
        from tern.probe.ops import render_costs

        parts.append("engine op costs (seconds = call + row x rows + unit x units + tail x partial rows"
                     " + input x inputs the skip kernel lists)\n"
                     + render_costs(prof.op_costs))
    if prof.op_curves:
        from tern.probe.curves import render_curves

        parts.append("engine kernels from L2 to DRAM (ns per weight byte read, at each working set)\n"
                     + render_curves(list(prof.op_curves)))
    if prof.row_curves:
        from tern.probe.row_curves import render_row_curves

        parts.append("the row passes' DRAM stall per byte against row length (x the kernel curve's row length)\n"
                     + render_row_curves(list(prof.row_curves)))
    if "core_round_trip" in prof.host:
        from tern.probe.placement import describe_round_trip

        parts.append(describe_round_trip(prof.host["core_round_trip"]))
    if prof.engine_runs:
        from tern.probe.engine_runs import render_engine_runs

        parts.append("the engine on small cache-resident models, us per token (each model's fastest round; "
                     "spread: its slowest round over it)\n" + render_engine_runs(prof.engine_runs))
    sp = result.get("stream_prefetch")
    if sp is not None:
        ratios = ", ".join(f"{t} thread(s) x{r:.3f} -> {'on' if sp['choice'][t] else 'off'}"
                           for t, r in sp["off_over_on"].items())
        forms = ", ".join(f"{t} thread(s) x{r:.3f} -> {'stream' if sp['stream'][t] else '4-row pass'}"
                          for t, r in sp["rows_over_stream"].items())
        parts.append(f"streaming kernel from DRAM, speed without / with software prefetch: {ratios}\n"
                     f"DRAM long rows, 4-row pass / the stream: {forms}"
                     + (f" (engine tuning saved to {sp['tuning_path']})" if sp["tuning_path"]
                        else " (not saved: --no-tuning)"))
    parts += [f"saved {result['profile_path']}"]
    return "\n\n".join(parts)
