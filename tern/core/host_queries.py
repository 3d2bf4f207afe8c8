"""Queries that only read a HostProfile: cache levels and capacities, the bandwidth at a
working set, the kernel roof of a format, calibration keys."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from tern.core.formats import get_format
from tern.core.host_profile import BandwidthPoint, CacheLevel, HostProfile, OpCurve, op_curve_for

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
    pools with (tern.kernels.policy.stream_row_bytes). A profile whose probe chose it records
    it (``host["engine_llc_bytes"]``, :func:`measured_llc_bytes` or the declared size; the
    probe hands the same figure to the engine through tern.core.engine_tuning); an older
    profile, whose engine read the OS's size, gets that declared size."""
    v = host.host.get("engine_llc_bytes") if isinstance(host.host, dict) else None
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return v
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


# ---- the row passes' stall against row length (profile row_curves, tern.probe.row_curves) ----
ROW_CURVE_OPS = ("ternary_matvec", "ternary_stream")  # the 4-row pass and the streaming pass
# the engine's int8 router kernel (kernels_stored._router_int8): the op name of its probe cost and
# curve (tern.probe.ops / curves) and of its work in the predictor (tern.predict.inventory)
ROUTER_OP = "router_int8"
# weight bytes each matrix op reads per weight (its units): what the probe's curves time
# (tern.probe.curves) and what the predictor prices (tern.predict.inventory / stall) — one table
OP_WEIGHT_BYTES = {"ternary_matvec": 0.25, "ternary_stream": 0.25, "ternary_skip": 0.25, "ternary_blocked": 0.25,
                   "int8_matvec": 1.0, ROUTER_OP: 1.0, "fp32_matvec": 4.0, "w16_matvec": 2.0}


def stall_per_byte(curve: OpCurve) -> float:
    """Seconds per weight byte a two-point row curve's matrices take from DRAM beyond their
    cache-resident time (its last working set against its first; ternary2: cols / 4 B a row)."""
    return (curve.seconds[-1] - curve.seconds[0]) / (curve.rows * ((curve.cols + 3) // 4))


def row_stall_ratios(curves: list[OpCurve] | tuple[OpCurve, ...], ref_row_bytes: int) -> list[tuple[int, float]] | None:
    """[(row bytes, stall per byte over the stall at ``ref_row_bytes``), ...] of the row curves
    of one pass, split and thread count, row lengths in order; None without a positive stall
    at the reference length (nothing to scale)."""
    pts = sorted(((c.cols + 3) // 4, stall_per_byte(c)) for c in curves)
    ref = [s for rb, s in pts if rb == ref_row_bytes]
    if not ref or ref[0] <= 0:
        return None
    return [(rb, max(s, 0.0) / ref[0]) for rb, s in pts]


def row_stall_factor(host: HostProfile, op: str, threads: int, row_bytes: float, split: str = "experts") -> float:
    """How many times the stall per byte of ``op``'s kernel curve a matrix of ``row_bytes``
    packed bytes a row pays (the profile's row curves at the thread count nearest
    ``threads``: "serial" at one; beyond it ``split``, "experts" (single-thread calls on
    different matrices at once: expert-parallel experts) or "rows" (one matrix's rows over
    the threads: the one-region step's items, the parallel kernel), else the other; linear
    in row bytes between measured lengths, held beyond them). 1.0 without row curves or a
    non-positive stall at the curve's row length, and for the 4-row pass
    ("ternary_matvec") at rows no longer than its curve's: the curves' row-heavy shape
    prices shorter rows."""
    main = op_curve_for(host.op_curves, op, "serial", 1)
    curves = [c for c in getattr(host, "row_curves", ()) if c.op == op]
    if threads <= 1:
        rows = [c for c in curves if c.split == "serial"]
    else:
        rows = ([c for c in curves if c.split == split]
                or [c for c in curves if c.split in ("experts", "rows") and c.split != split])
    if main is None or not rows:
        return 1.0
    ref_rb = (main.cols + 3) // 4
    if op == "ternary_matvec" and row_bytes <= ref_rb:
        return 1.0
    t = min({c.threads for c in rows}, key=lambda a: (abs(a - threads), -a))
    ratios = row_stall_ratios([c for c in rows if c.threads == t], ref_rb)
    if ratios is None:
        return 1.0
    return float(np.interp(row_bytes, [rb for rb, _ in ratios], [f for _, f in ratios]))


# ---- effective tiers: read off the measured curve, /sys sizes only a hint --------------------
@dataclass(frozen=True)
class Tier:
    """One level of the memory hierarchy as the read curve shows it: working sets up to
    ``size_bytes`` read at about ``gbps`` (GB/s = 1e9 B/s). The last tier (DRAM) has no
    upper end (``size_bytes`` 0)."""

    name: str
    size_bytes: int
    gbps: float


FLAT_SLOPE = 0.12  # |d log2(GB/s) / d log2(bytes)| below this is a plateau (< ~9 % per octave)
MERGE_WITHIN = 0.15  # neighbouring plateaus closer than this in GB/s are one tier


def effective_tiers(host: HostProfile, threads: int = 1, kernel: str = "read") -> list[Tier]:
    """The tiers of the measured read curve at ``threads``.

    A plateau is a run of points spanning at least an octave where the (3-point median
    smoothed) rate changes less than FLAT_SLOPE per octave; neighbouring plateaus within
    MERGE_WITHIN of each other are one tier; a tier ends where the curve falls through the
    geometric mean of its rate and the next tier's. A VM's slice of a large shared L3
    shows up as the small, slow tier it is, whatever /sys says. A tier is named after the
    largest declared cache level (/sys, at these threads) of at most twice its size that an
    earlier tier has not taken — L1 and L2 that read alike are one tier, "L2" — else after
    the next level number; the last, unbounded tier is DRAM."""
    avail = host.thread_counts(kernel)
    if not avail:
        return []
    t = min(avail, key=lambda a: (abs(a - threads), -a))
    pts = host.curve(t, kernel)
    xs = [math.log2(p.working_set_bytes) for p in pts]
    raw = [math.log2(p.gbps_median) for p in pts]
    ys = [sorted(raw[max(0, i - 1): i + 2])[len(raw[max(0, i - 1): i + 2]) // 2] for i in range(len(raw))]
    n = len(xs)
    if n < 3:
        return [Tier("L1" if n else "DRAM", 0, 2 ** ys[0] if n else 0.0)]
    flat = []
    for i in range(n):
        a, b = max(0, i - 1), min(n - 1, i + 1)
        flat.append(abs((ys[b] - ys[a]) / (xs[b] - xs[a])) < FLAT_SLOPE)
    runs: list[list[int]] = []
    for i in range(n):
        if flat[i] and runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        elif flat[i]:
            runs.append([i])
    runs = [r for r in runs if xs[r[-1]] - xs[r[0]] >= 1.0 or r[-1] == n - 1] or [list(range(n))]
    plateaus: list[tuple[list[int], float]] = []
    for r in runs:
        rate = sorted(ys[i] for i in r)[len(r) // 2]
        if plateaus and abs(2 ** (rate - plateaus[-1][1]) - 1) < MERGE_WITHIN:
            merged = plateaus[-1][0] + r
            plateaus[-1] = (merged, sorted(ys[i] for i in merged)[len(merged) // 2])
        else:
            plateaus.append((r, rate))
    out = []
    hints = [(c.level, cache_capacity_bytes(host, c.level, t) or 0) for c in cache_levels(host)]
    last_level = 0
    for k, (r, rate) in enumerate(plateaus):
        size = 0
        if k + 1 < len(plateaus):
            mid = (rate + plateaus[k + 1][1]) / 2
            i = r[-1]
            while i + 1 < n and ys[i + 1] >= mid:
                i += 1
            if i + 1 < n:  # interpolate the crossing between points i and i + 1
                f = (ys[i] - mid) / (ys[i] - ys[i + 1]) if ys[i] != ys[i + 1] else 0.5
                size = int(2 ** (xs[i] + f * (xs[i + 1] - xs[i])))
            else:
                size = int(2 ** xs[-1])
        if k == len(plateaus) - 1 and k > 0:
            out.append(Tier("DRAM", size, 2 ** rate))
            continue
        # named after the largest declared level it covers (two caches that read alike are
        # one tier: a 2 MiB tier at L1's rate is "L2"), else the next number
        fits = [lv for lv, cap in hints if lv > last_level and 0 < cap <= 2 * size]
        last_level = max(fits, default=last_level + 1)
        out.append(Tier(f"L{last_level}", size, 2 ** rate))
    return out


def effective_llc_bytes(host: HostProfile, threads: int = 1) -> int:
    """Size of the last cache tier the measured read curve shows (0: no cliff measured)."""
    caches = [t for t in effective_tiers(host, threads) if t.size_bytes > 0]
    return caches[-1].size_bytes if caches else 0


# A measured last cache tier under this share of the declared one is a VM's slice of a large
# shared L3 (the Intel Xeon VM: /sys 480 MiB, a ~100 MiB tier at 29 GB/s, then DRAM at 19).
VM_SLICE_SHARE = 0.5


def measured_llc_bytes(host: HostProfile) -> int:
    """The last-level cache the engine should assume on this host, from the measured read
    curve at 1 thread: the last cache tier (:func:`effective_tiers`) when it is named after
    the declared last level and holds under VM_SLICE_SHARE of it — a pool past that tier
    reads at DRAM's rate even though /sys calls it cached; 0 otherwise (the declared size
    applies: the curve agrees with it, shows no such tier, or the profile is not measured)."""
    levels = cache_levels(host)
    if not (host.measured and levels):
        return 0
    declared = llc_capacity_bytes(host, 1)
    caches = [t for t in effective_tiers(host, 1) if t.name != "DRAM" and t.size_bytes > 0]
    if not caches or caches[-1].name != f"L{levels[-1].level}":
        return 0
    size = caches[-1].size_bytes
    return size if 0 < size < VM_SLICE_SHARE * declared else 0


def cache_marks(host: HostProfile, threads: int = 1) -> list[tuple[str, int]]:
    """(name, bytes) of every cache tier the measured read curve shows at ``threads``
    (:func:`effective_tiers`), where figures mark "the cliff"; the declared capacities
    (/sys, or a reference host's published sizes) when the profile is not measured or its
    curve shows no cliff."""
    marks = [(t.name, t.size_bytes) for t in effective_tiers(host, threads) if t.size_bytes > 0] \
        if host.measured else []  # a reference profile's curve is drawn from its declared caches
    if marks:
        return marks
    return [(f"L{c.level}", cap) for c in cache_levels(host)
            if (cap := cache_capacity_bytes(host, c.level, threads))]
