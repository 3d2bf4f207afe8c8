"""Plateaus of the bandwidth curve and the probe's tables and summaries."""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from tern.core.host_profile import BandwidthPoint, HostProfile
from tern.core.host_queries import engine_llc_bytes, llc_capacity_bytes
from tern.core.records import summarize
from tern.probe.bandwidth import format_bytes
from tern.probe.profile import LEVEL_NAMES


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
    from tern.core.host_queries import cache_capacity_bytes, cache_levels

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


def format_cache_table(profile: HostProfile) -> str:
    lines = [f"caches (source: {profile.cache_source})",
             f"{'level':<6} {'type':<12} {'size':>10} {'instances':>9} {'shared by':>9} {'total':>10}"]
    for c in profile.caches:
        lines.append(f"L{c.level:<5} {c.type:<12} {format_bytes(c.size_bytes):>10} {c.instances:>9} "
                     f"{c.shared_by:>9} {format_bytes(c.total_bytes):>10}")
    lines.append("(size per instance; shared by = logical CPUs sharing one instance)")
    eng, declared = engine_llc_bytes(profile), llc_capacity_bytes(profile, 1)
    if eng != declared:  # recorded by the probe: the read curve's VM slice
        lines.append(f"the engine streams pools past {format_bytes(eng)}: the read curve's last cache tier "
                     f"(the OS declares {format_bytes(declared)})")
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
        "compile_s": profile.host.get("probe_compile_s"),
        "engine_llc_bytes": profile.host.get("engine_llc_bytes"),
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
    h["probe_compile_s"] = profile.host.get("probe_compile_s")
    return h
