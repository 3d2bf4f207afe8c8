"""Queries that only read a HostProfile: cache levels and capacities, the bandwidth at a
working set, the kernel roof of a format, calibration keys."""

from __future__ import annotations

import math
from dataclasses import replace

from tern.core.formats import get_format
from tern.core.host_profile import BandwidthPoint, CacheLevel, HostProfile

CALIBRATION_KEYS = ("per_token_overhead_s", "bandwidth_efficiency")


# kernel name prefixes (as the probe names kernels) that can run each format family
_KERNEL_PREFIXES = {
    "ternary": ("ternary", "tq", "lut", "i2"),
    "int8": ("int8",),
    "q4": ("q4", "int8"),
    "float": ("fp32",),
}


def _family(fmt: str) -> str:
    f = get_format(fmt)
    if f.ternary:
        return "ternary"
    return {"int8": "int8", "q4": "q4"}.get(fmt, "float")


def cache_levels(host: HostProfile) -> list[CacheLevel]:
    """Data/unified caches, one per level, innermost first."""
    return [c for lv in sorted({c.level for c in host.caches}) if (c := host.cache(lv)) is not None]


def cache_capacity_bytes(host: HostProfile, level: int, threads: int = 1) -> int | None:
    """Bytes of cache ``level`` usable by ``threads`` threads pinned one per core, packed
    from core 0 (None when the level is unknown)."""
    c = host.cache(level)
    if c is None:
        return None
    l1 = host.cache(1)
    smt = max(1, l1.shared_by) if l1 is not None else 1
    cores_per_instance = max(1, c.shared_by // smt)
    used = min(c.instances, max(1, math.ceil(threads / cores_per_instance)))
    return c.size_bytes * used


def llc_capacity_bytes(host: HostProfile, threads: int = 1) -> int:
    """Last-level cache bytes usable at ``threads`` (0 when no cache is known)."""
    levels = cache_levels(host)
    return (cache_capacity_bytes(host, levels[-1].level, threads) or 0) if levels else 0


def engine_llc_bytes(host: HostProfile) -> int:
    """The last-level cache one core sees: what the engine's streaming rule compares the
    pools with (tern.kernels.policy.stream_row_bytes; the engine reads the same size from
    the OS, tern.run.engine)."""
    return llc_capacity_bytes(host, 1)


def memory_roof(host: HostProfile, working_set_bytes: float, threads: int = 1) -> str:
    """"L1", "L2", "L3"... for the innermost cache the working set fits, else "DRAM"."""
    for c in cache_levels(host):
        cap = cache_capacity_bytes(host, c.level, threads)
        if cap and working_set_bytes <= cap:
            return f"L{c.level}"
    return "DRAM"


def bandwidth_gbps(host: HostProfile, working_set_bytes: float, threads: int = 1) -> float:
    """Read GB/s at a working set: the host's interpolated curve, lifted to its
    non-increasing envelope (a working set never reads slower than any larger measured
    one). The envelope removes timer noise at tiny sizes and keeps every prediction
    monotone in bytes."""
    bw = host.bandwidth_at(working_set_bytes, threads)
    avail = host.thread_counts()
    t = min(avail, key=lambda a: (abs(a - threads), -a))
    right = [p.gbps_median for p in host.curve(t) if p.working_set_bytes >= working_set_bytes]
    return max([bw, *right])


def with_dram_bandwidth(host: HostProfile, threads: int, gbps: float) -> HostProfile:
    """``host`` with the beyond-LLC part of its read curve at ``threads`` scaled so that its
    largest working set reads ``gbps``: a DRAM figure measured again beside a decode run
    (on shared VMs the DRAM bandwidth moves between regimes over minutes, so the probe's
    figure can be stale by the time a model runs). Cache-resident points are kept."""
    if not (gbps > 0 and math.isfinite(gbps)):
        raise ValueError(f"gbps must be a positive number, got {gbps!r}")
    avail = host.thread_counts()
    if not avail:
        raise ValueError(f"host profile {host.label!r} has no read-bandwidth curve")
    t = min(avail, key=lambda a: (abs(a - threads), -a))
    llc = llc_capacity_bytes(host, t)
    far = host.curve(t)[-1]
    f = gbps / far.gbps_median

    def scaled(p: BandwidthPoint) -> BandwidthPoint:
        if p.kernel != "read" or p.threads != t or p.working_set_bytes <= llc:
            return p
        return replace(p, gbps_best=p.gbps_best * f, gbps_median=p.gbps_median * f,
                       gbps_min=None if p.gbps_min is None else p.gbps_min * f,
                       runs_gbps=tuple(g * f for g in p.runs_gbps))

    return replace(host, bandwidth=tuple(scaled(p) for p in host.bandwidth))


def kernel_gops_for(host: HostProfile, fmt: str, threads: int = 1) -> float | None:
    """Best measured kernel throughput (Gops/s, multiply-add = 2) able to run ``fmt``
    (``"fp32"`` also stands for element-wise work) with at most ``threads`` threads (an
    engine may always use fewer; when no figure is at or below ``threads``, the nearest
    thread count); None when the profile has none."""
    prefixes = _KERNEL_PREFIXES[_family(fmt)]
    rows = [k for k in host.kernels if k.kernel.startswith(prefixes) and k.gops_median > 0]
    if not rows:
        return None
    usable = [k for k in rows if k.threads <= threads]
    if not usable:
        t = min({k.threads for k in rows}, key=lambda a: (abs(a - threads), -a))
        usable = [k for k in rows if k.threads == t]
    return max(k.gops_median for k in usable)


def calibration(host: HostProfile, threads: int = 1) -> tuple[float, float]:
    """(per_token_overhead_s, bandwidth_efficiency) from the profile, validated. A key
    suffixed ``_t{threads}`` (measured at that thread count) wins over the plain key."""
    cal = host.calibration or {}
    over = float(cal.get(f"per_token_overhead_s_t{threads}", cal.get("per_token_overhead_s", 0.0)))
    eff = float(cal.get(f"bandwidth_efficiency_t{threads}", cal.get("bandwidth_efficiency", 1.0)))
    if not (math.isfinite(over) and over >= 0):
        raise ValueError(f"calibration per_token_overhead_s must be >= 0 s, got {over!r}")
    if not (math.isfinite(eff) and 0 < eff <= 1.5):
        raise ValueError(f"calibration bandwidth_efficiency must be in (0, 1.5], got {eff!r}")
    return over, eff
