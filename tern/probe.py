"""`tern probe`: measure the host — caches, bandwidth against working set, kernel roofs.

    profile = run_probe(probe_config(quick=True))      # -> HostProfile (saved with out=...)
    plateau_table(profile)                             # {threads: {"L1": GB/s, ..., "DRAM": GB/s}}
    plateau_spread(profile)                            # ... and the slowest / fastest run of each

Caches come from ``/sys`` (:mod:`tern.probe_caches`), bandwidth from numba read / copy /
triad kernels swept over working sets (:mod:`tern.probe_bandwidth`), kernel throughput
from the matvec registry (:mod:`tern.kernel_bench`). All figures: GB/s = 1e9 bytes/s,
G ops/s with a multiply-add counted as 2 ops.

Spread: a shared VM drifts between bandwidth regimes over tens of seconds. The sweep
takes each curve's repeats in rounds (every point once per round), so each point's runs
sample the whole sweep; each point keeps its slowest and fastest run, and the plateaus
report that range and how many seconds their runs spanned.

Threads: numba's OpenMP layer with libgomp's default wait policy (spin, then sleep) made
every parallel call cost ~50 ms on a busy 2-core VM; with ``OMP_WAIT_POLICY=PASSIVE`` it
cost ~0.3 ms. The probe does not change that process-wide setting; it records it in
``host["threading_env"]``. Set it before Python starts when the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .host_profile import BandwidthPoint, HostProfile, KernelThroughput
from .probe_bandwidth import KERNELS, SweepConfig, default_max_ws_bytes, format_bytes
from .probe_caches import Topology, detect_caches, read_topology
from .probe_timing import TimingConfig
from .records import run_metadata, summarize

DEFAULT_OUT = "results/host_profile.json"
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
             "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "asimd", "asimddp", "sve")
LEVEL_NAMES = ("L1", "L2", "L3", "L4")
THREADING_ENV = ("NUMBA_THREADING_LAYER", "NUMBA_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
                 "OMP_NUM_THREADS")


# ---- configuration ------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeConfig:
    sweep: SweepConfig
    kernel_names: tuple[str, ...] | None = None  # None: every registered kernel
    kernel_sizes: tuple[tuple[int, int], ...] = ((1024, 1024),)  # (rows, cols)
    kernel_timing: TimingConfig = field(default_factory=TimingConfig)
    quick: bool = False
    sys_root: str = "/sys"
    op_costs: bool = True  # time the engine's operations (tern.probe_ops) for the roofline

    def __post_init__(self) -> None:
        for r, c in self.kernel_sizes:
            if r < 1 or c < 1:
                raise ValueError(f"kernel size {r} x {c} must be positive")


def default_thread_counts() -> tuple[int, ...]:
    """(1, all CPUs this process may use), or (1,) on a one-CPU machine."""
    from .probe_bandwidth import max_threads

    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        n = os.cpu_count() or 1
    n = max(1, min(n, max_threads()))
    return (1,) if n == 1 else (1, n)


def probe_config(quick: bool = False, thread_counts: tuple[int, ...] | None = None,
                 llc_bytes: int | None = None, kernels: tuple[str, ...] | None = None,
                 sys_root: str = "/sys") -> ProbeConfig:
    """The quick (< 20 s on a 2-core VM: read kernel only, 2 points per octave, 20 ms
    runs, up to 4 x LLC) or full (< 3 min: read at 4 points per octave, copy and triad at
    2, 100 ms runs, up to max(4 x LLC, 512 MiB)) probe; 3 repeats each, taken in rounds."""
    threads = tuple(thread_counts or default_thread_counts())
    if llc_bytes is None:
        caches, source = detect_caches(sys_root)
        llc_bytes = HostProfile("caches only", False, {}, caches, source, ()).llc_bytes
    max_ws = default_max_ws_bytes(llc_bytes, quick)
    avail = _available_ram_bytes()
    if max_ws > avail // 4:  # never let the sweep's buffer push the machine into swap
        print(f"tern probe: largest working set capped at a quarter of available RAM "
              f"({format_bytes(avail // 4)} instead of {format_bytes(max_ws)})", file=sys.stderr)
        max_ws = max(64 * 1024 * 1024, avail // 4)
    if quick:
        t = TimingConfig(min_time_s=0.02, repeats=3, warmup_s=0.005, max_calibration_s=0.06)
        sweep = SweepConfig(max_ws_bytes=max_ws, points_per_octave=2, kernels=kernels or ("read",),
                            thread_counts=threads, timing=t)
        return ProbeConfig(sweep=sweep, kernel_timing=t, quick=True, sys_root=sys_root)
    # read at 4 points per octave; copy and triad at 2 keep the full probe under 3 min
    sweep = SweepConfig(max_ws_bytes=max_ws, points_per_octave=4, stream_points_per_octave=2,
                        kernels=kernels or KERNELS,
                        thread_counts=threads, timing=TimingConfig(min_time_s=0.1, repeats=3, warmup_s=0.01))
    return ProbeConfig(sweep=sweep, kernel_sizes=((1024, 1024), (4096, 4096)), sys_root=sys_root)


def _available_ram_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


# ---- host facts ---------------------------------------------------------------------------


def cpu_facts() -> dict[str, Any]:
    """Model name, vendor, architecture and ISA flags from py-cpuinfo (its cache fields
    are ignored: see tern.probe_caches)."""
    import cpuinfo

    info = cpuinfo.get_cpu_info()
    flags = sorted(info.get("flags", []))
    return {
        "cpu_model": info.get("brand_raw") or platform.processor() or platform.machine(),
        "cpu_vendor": info.get("vendor_id_raw", ""),
        "arch": info.get("arch", platform.machine()),
        "isa": {f: f in flags for f in ISA_FLAGS},
        "cpu_flags": flags,
    }


def host_facts(thread_counts: tuple[int, ...], topo: Topology) -> dict[str, Any]:
    import numba
    import psutil

    facts = run_metadata(threads=max(thread_counts))
    facts.update(cpu_facts())
    facts.update({
        "physical_cores": psutil.cpu_count(logical=False) or topo.physical_cores,
        "logical_cpus": psutil.cpu_count(logical=True) or topo.logical_cpus,
        "ram_bytes": int(psutil.virtual_memory().total),
        "os": platform.platform(),
        "thread_counts": list(thread_counts),
        "numba_num_threads": int(numba.config.NUMBA_NUM_THREADS),
        # thread wake-up cost depends on these (e.g. libgomp's default spin-then-sleep)
        "threading_env": {k: os.environ.get(k) for k in THREADING_ENV},
    })
    return facts


# ---- the probe ----------------------------------------------------------------------------


def run_probe(config: ProbeConfig | None = None, out: str | os.PathLike | None = None,
              progress: bool = True) -> HostProfile:
    """Measure this host and return its HostProfile (saved atomically to ``out`` if given)."""
    import numba

    from . import kernel_bench
    from .probe_bandwidth import read_kernel_simd, sweep

    config = config or probe_config()
    t0 = time.perf_counter()
    topo = read_topology(config.sys_root)
    caches, source = detect_caches(config.sys_root, topology=topo)
    sc = config.sweep
    points = sweep(sc, progress=progress)
    kernels: list[KernelThroughput] = []
    if config.kernel_names != ():
        kernels = kernel_bench.measure_kernels(config.kernel_names, config.kernel_sizes,
                                               sc.thread_counts, config.kernel_timing, progress)
    op_costs = []
    if config.op_costs:
        from .probe_ops import measure_op_costs

        op_costs = measure_op_costs(sc.thread_counts, quick=config.quick, progress=progress,
                                    timing=config.kernel_timing if config.quick else None)
    host = host_facts(sc.thread_counts, topo or Topology(os.cpu_count() or 1, os.cpu_count() or 1))
    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel has run
        layer = "none"
    host.update({
        "numba_threading_layer": layer,
        "read_kernel_simd": read_kernel_simd(),
        "probe_mode": "quick" if config.quick else "full",
        "sweep": {"min_ws_bytes": sc.min_ws_bytes, "max_ws_bytes": sc.max_ws_bytes,
                  "points_per_octave": sc.points_per_octave,
                  "stream_points_per_octave": sc.stream_points_per_octave or sc.points_per_octave,
                  "min_time_s": sc.timing.min_time_s,
                  "repeats": sc.timing.repeats, "warmup_s": sc.timing.warmup_s,
                  "repeat_order": "rounds"},  # each curve's repeats interleaved, see sweep()
        "probe_wall_s": round(time.perf_counter() - t0, 2),
    })
    profile = HostProfile(label=f"measured on {host['host']}", measured=True, host=host,
                          caches=caches, cache_source=source, bandwidth=tuple(points),
                          kernels=tuple(kernels), op_costs=tuple(op_costs))
    if out is not None:
        profile.save(out)
    return profile


def quick_profile(out: str | os.PathLike | None = None, progress: bool = True) -> HostProfile:
    """A quick probe of this machine (what tern.roofline runs when no profile exists)."""
    return run_probe(probe_config(quick=True), out=out, progress=progress)


# ---- plateaus -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plateau:
    name: str  # "L1", "L2", "L3", "DRAM"
    threads: int
    kernel: str
    gbps: float | None  # median of the per-point medians in the window (None: no points)
    lo_bytes: int  # the window: working sets in (lo_bytes, hi_bytes]
    hi_bytes: int | None  # None: unbounded (DRAM)
    points: int  # curve points inside the window
    # spread over every timed run of those points (None / 0: the points carry no runs,
    # e.g. a reference curve or a version-1 profile)
    gbps_min: float | None = None  # slowest run, GB/s
    gbps_max: float | None = None  # fastest run, GB/s
    runs: int = 0  # timed runs behind gbps_min .. gbps_max
    span_s: float | None = None  # first to last run start, s (how long the runs sampled)

    def spread_text(self) -> str:
        """'54.5 GB/s (34.1–58.4 over 6 runs of 2 points, spread over 90 s)'."""
        if self.gbps is None:
            return "-"
        text = f"{self.gbps:.1f} GB/s"
        if self.runs and self.gbps_min is not None and self.gbps_max is not None:
            text += (f" ({self.gbps_min:.1f}\u2013{self.gbps_max:.1f} over {self.runs} runs of "
                     f"{self.points} point{'s' if self.points != 1 else ''}")
            if self.span_s is None:
                text += ")"
            else:
                text += f", spread over {self.span_s:.{0 if self.span_s >= 10 else 1}f} s)"
        return text


def _plateau(name: str, threads: int, kernel: str, pts: list[BandwidthPoint], lo: int,
             hi: int | None) -> Plateau:
    """Plateau of the curve points ``pts`` inside one window."""
    gbps = statistics.median(p.gbps_median for p in pts) if pts else None
    runs = [g for p in pts for g in p.runs_gbps]  # GB/s of every timed run
    if not runs:
        return Plateau(name, threads, kernel, gbps, lo, hi, len(pts))
    s = summarize(runs)
    starts = [t for p in pts for t in p.runs_at_s]
    span = max(starts) - min(starts) if starts else None
    return Plateau(name, threads, kernel, gbps, lo, hi, len(pts), gbps_min=s["min"],
                   gbps_max=s["max"], runs=int(s["repeats"]), span_s=span)


def detect_plateaus(profile: HostProfile, threads: int, kernel: str = "read") -> list[Plateau]:
    """GB/s on each level of the hierarchy for one curve.

    A level's window holds working sets comfortably inside it: above twice the capacity
    of the level below and at most half of its own capacity (capacities as the
    ``threads`` threads see them, one core each: private caches add up, a shared one
    counts once per instance in use). DRAM is every working set >= 4 x the total
    last-level cache. When a window is empty, the points between the two capacities are
    used instead. The plateau is the median of the points' median GB/s; its spread is
    the slowest and fastest of all their timed runs, and how long those runs took."""
    from .roofline import cache_capacity_bytes, cache_levels

    curve = profile.curve(threads, kernel)

    def window(lo: int, hi: float | None) -> list[BandwidthPoint]:
        return [p for p in curve
                if p.working_set_bytes > lo and (hi is None or p.working_set_bytes <= hi)]

    out = []
    prev_cap = 0
    for c in cache_levels(profile):
        cap = cache_capacity_bytes(profile, c.level, threads) or c.size_bytes
        lo, hi = 2 * prev_cap, cap // 2
        pts = window(lo, hi) if lo < hi else []
        if not pts:
            lo, hi = prev_cap, cap
            pts = window(lo, hi)
        name = LEVEL_NAMES[c.level - 1] if c.level <= len(LEVEL_NAMES) else f"L{c.level}"
        out.append(_plateau(name, threads, kernel, pts, lo, hi))
        prev_cap = max(prev_cap, cap)
    llc = profile.llc_bytes or prev_cap
    lo = 4 * llc
    pts = window(lo - 1, None)
    if not pts:
        lo = 2 * llc
        pts = window(lo - 1, None)
    out.append(_plateau("DRAM", threads, kernel, pts, lo - 1, None))
    return out


def plateau_table(profile: HostProfile, kernel: str = "read") -> dict[int, dict[str, float | None]]:
    """{threads: {"L1": GB/s, "L2": ..., "DRAM": ...}} for every measured thread count."""
    return {t: {p.name: p.gbps for p in detect_plateaus(profile, t, kernel)}
            for t in profile.thread_counts(kernel)}


# ---- tables -------------------------------------------------------------------------------


def format_cache_table(profile: HostProfile) -> str:
    lines = [f"caches (source: {profile.cache_source})",
             f"{'level':<6} {'type':<12} {'size':>10} {'instances':>9} {'shared by':>9} {'total':>10}"]
    for c in profile.caches:
        lines.append(f"L{c.level:<5} {c.type:<12} {format_bytes(c.size_bytes):>10} {c.instances:>9} "
                     f"{c.shared_by:>9} {format_bytes(c.total_bytes):>10}")
    lines.append("(size per instance; shared by = logical CPUs sharing one instance)")
    return "\n".join(lines)


def format_plateau_table(profile: HostProfile, kernel: str = "read") -> str:
    names: list[str] = []
    for t in profile.thread_counts(kernel):
        for p in detect_plateaus(profile, t, kernel):
            if p.name not in names:
                names.append(p.name)
    lines = [f"{kernel} bandwidth plateaus, GB/s (median of the points inside each level)",
             f"{'threads':>7} " + " ".join(f"{n:>8}" for n in names)]
    for t, row in plateau_table(profile, kernel).items():
        lines.append(f"{t:>7} " + " ".join(
            f"{row[n]:>8.1f}" if row.get(n) is not None else f"{'-':>8}" for n in names))
    for t in profile.thread_counts(kernel):
        dram = detect_plateaus(profile, t, kernel)[-1]
        if dram.runs:  # measured runs: show how far apart the slowest and fastest were
            lines.append(f"DRAM, {t} thread{'s' if t > 1 else ''}: {dram.spread_text()}")
    return "\n".join(lines)


def plateau_spread(profile: HostProfile, kernel: str = "read") -> dict[int, dict[str, dict[str, Any]]]:
    """{threads: {level: {gbps (median of point medians), gbps_min, gbps_max (slowest and
    fastest run), runs, points, span_s}}}; min / max / span None without recorded runs."""
    return {t: {p.name: {"gbps": p.gbps, "gbps_min": p.gbps_min, "gbps_max": p.gbps_max,
                         "runs": p.runs, "points": p.points, "span_s": p.span_s}
                for p in detect_plateaus(profile, t, kernel)}
            for t in profile.thread_counts(kernel)}


def format_kernel_table(profile: HostProfile) -> str:
    lines = [f"{'kernel':<16} {'threads':>7} {'rows x cols':>12} {'Gops/s':>8} {'best':>8} {'GB/s w':>8}"]
    for k in profile.kernels:
        lines.append(f"{k.kernel:<16} {k.threads:>7} {f'{k.rows}x{k.cols}':>12} "
                     f"{k.gops_median:>8.1f} {k.gops_best:>8.1f} {k.gbps_median:>8.1f}")
    lines.append("(Gops/s median and best; a multiply-add = 2 ops; GB/s w = weight bytes read per s)")
    return "\n".join(lines)


def probe_summary(profile: HostProfile, path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The figures `tern probe --json` prints (see JSON_FIELDS)."""
    return {
        "profile_path": str(path) if path is not None else None,
        "cpu_model": profile.host.get("cpu_model"),
        "mode": profile.host.get("probe_mode"),
        "cache_source": profile.cache_source,
        "caches": [{"level": c.level, "type": c.type, "size_bytes": c.size_bytes,
                    "instances": c.instances, "shared_by": c.shared_by} for c in profile.caches],
        "llc_bytes": profile.llc_bytes,
        "read_kernel_simd": profile.host.get("read_kernel_simd"),
        "plateaus_gbps": {str(t): row for t, row in plateau_table(profile).items()},
        "plateau_spread": {str(t): row for t, row in plateau_spread(profile).items()},
        "kernels": [{"kernel": k.kernel, "threads": k.threads, "rows": k.rows, "cols": k.cols,
                     "gops_median": k.gops_median, "gbps_median": k.gbps_median}
                    for k in profile.kernels],
        "op_costs": [asdict(c) for c in profile.op_costs],
        "wall_s": profile.host.get("probe_wall_s"),
    }


def probe_headlines(profile: HostProfile) -> dict[str, Any]:
    """Headline figures of a profile (units in the keys), for notebook 01 and the report."""
    h: dict[str, Any] = {"cpu_model": profile.host.get("cpu_model"),
                         "probe_mode": profile.host.get("probe_mode"),
                         "cache_source": profile.cache_source, "llc_bytes": profile.llc_bytes}
    for t, row in plateau_table(profile).items():
        for level, gbps in row.items():
            if gbps is not None:
                h[f"read_{level}_{t}t_gbps"] = round(gbps, 1)
        dram = detect_plateaus(profile, t)[-1]
        if dram.runs and dram.gbps_min is not None and dram.gbps_max is not None:
            h[f"read_DRAM_{t}t_gbps_min"] = round(dram.gbps_min, 1)  # slowest timed run
            h[f"read_DRAM_{t}t_gbps_max"] = round(dram.gbps_max, 1)  # fastest timed run
            h[f"read_DRAM_{t}t_runs"] = dram.runs
            if dram.span_s is not None:
                h[f"read_DRAM_{t}t_span_s"] = round(dram.span_s, 1)
    for k in profile.kernels:
        h[f"{k.kernel}_{k.rows}x{k.cols}_{k.threads}t_gops"] = round(k.gops_median, 1)
    h["probe_wall_s"] = profile.host.get("probe_wall_s")
    return h


# ---- CLI ----------------------------------------------------------------------------------

JSON_FIELDS = """\
  profile_path: where host_profile.json was saved;  cpu_model;  mode: quick|full
  cache_source: /sys, getconf, sysctl, default (joined with + when mixed)
  caches: [{level, type, size_bytes (one instance), instances, shared_by (logical CPUs)}]
  llc_bytes: total last-level cache;  read_kernel_simd: zmm|ymm|xmm|scalar
  plateaus_gbps: {threads: {L1, L2, L3, DRAM: read GB/s (1e9 B/s) or null}}
  plateau_spread: {threads: {level: {gbps, gbps_min, gbps_max (slowest / fastest timed run),
                   runs, points, span_s (first to last run start; runs are interleaved)}}}
  kernels: [{kernel, threads, rows, cols, gops_median (multiply-add = 2 ops), gbps_median (weights)}]
  op_costs: [{op, threads, call_s, row_s, unit_s (seconds: call + row x rows + unit x units),
             samples, max_rel_err}]: engine operation costs the roofline prices work with
  wall_s: probe wall time in seconds"""


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
                   help="2 points per octave, 20 ms runs, read kernel only, up to 4x LLC (~20 s)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"where to save the profile (default {DEFAULT_OUT})")
    p.add_argument("--threads", type=_thread_list, default=None,
                   help="comma-separated thread counts (default: 1 and all CPUs)")
    p.add_argument("--no-op-costs", action="store_true",
                   help="skip timing the engine's operations (the roofline then uses its plain model)")
    p.add_argument("--kernels", default=None,
                   help=f"bandwidth kernels, comma-separated from {','.join(KERNELS)} "
                        "(default: read for --quick, all for full)")


def cli_run(args: argparse.Namespace) -> dict[str, Any]:
    kernels = tuple(k.strip() for k in args.kernels.split(",")) if args.kernels else None
    if kernels:
        bad = [k for k in kernels if k not in KERNELS]
        if bad:
            raise ValueError(f"unknown bandwidth kernel(s) {bad}; choose from {list(KERNELS)}")
    cfg = probe_config(quick=args.quick, thread_counts=args.threads, kernels=kernels)
    if args.no_op_costs:
        cfg = replace(cfg, op_costs=False)
    print(f"tern probe ({'quick' if args.quick else 'full'}): {cfg.sweep.n_points()} bandwidth points, "
          f"{format_bytes(cfg.sweep.min_ws_bytes)} .. {format_bytes(cfg.sweep.max_ws_bytes)}, "
          f"threads {list(cfg.sweep.thread_counts)}", file=sys.stderr)
    out = Path(args.out)
    profile = run_probe(cfg, out=out)
    return probe_summary(profile, out)


def cli_render(result: dict[str, Any]) -> str:
    prof = HostProfile.load(result["profile_path"])
    parts = [f"{result['cpu_model']} ({result['mode']} probe, {result['wall_s']} s; "
             f"read kernel uses {result['read_kernel_simd']})",
             format_cache_table(prof), format_plateau_table(prof), format_kernel_table(prof)]
    if prof.op_costs:
        from .probe_ops import render_costs

        parts.append("engine op costs (seconds = call + row x rows + unit x units + tail x partial rows)\n"
                     + render_costs(prof.op_costs))
    parts += [f"saved {result['profile_path']}"]
    return "\n\n".join(parts)

