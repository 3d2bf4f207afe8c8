"""Hosts to predict for: the reference PC (published figures, not measured here) and
resolve_host (a profile file, the results folder, or a quick probe)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from tern.core.host_caches import GIB, KIB, MIB
from tern.core.host_profile import BandwidthPoint, CacheLevel, HostProfile

REFERENCE_PATH = Path(__file__).resolve().parent / "reference" / "ryzen_3600x.json"


REFERENCE_LABEL = "reference: Ryzen 5 3600X (published figures, not measured here)"


# Ryzen 5 3600X: figures from ../shared/SEED_NOTES.md ("published") and estimates.
REFERENCE_FIGURES = {
    "l1d_bytes": 32 * KIB,  # published, per core
    "l2_bytes": 512 * KIB,  # published, per core
    "l3_bytes": 16 * MIB,  # published, per 3-core complex (2 complexes)
    "l1_read_gbps_per_core": 200.0,  # estimate: 2 x 32 B loads/cycle at ~4 GHz = 256 GB/s peak, ~80 %
    "l2_read_gbps_per_core": 120.0,  # estimate: 32 B/cycle from L2 at ~4 GHz = 128 GB/s peak
    "l3_read_gbps_1t": 100.0,  # published: ~88-116 GB/s while L3 resident (single thread)
    "dram_read_gbps_1t": 28.0,  # published: ~28 GB/s from DRAM (single thread)
    "dram_read_gbps_max": 40.0,  # estimate: ~78 % of the 51.2 GB/s dual-channel DDR4-3200 peak
    "ram_bytes": 32 * GIB,  # assumption (not published): a 32 GiB desktop
}


REFERENCE_ESTIMATES = (
    "L1 and L2 read bandwidth (from load ports x ~4 GHz, ~80-95 % of peak)",
    "multi-thread cache bandwidth (single-thread figure scaled linearly per core)",
    "multi-thread DRAM bandwidth (28 GB/s at 1 thread rising to ~40 GB/s at >= 3 threads)",
    "shape of each knee (log-linear from one level's capacity to twice it)",
    "ram_bytes (32 GiB assumed)",
)


def _reference_curve(threads: int) -> list[BandwidthPoint]:
    f = REFERENCE_FIGURES
    t = threads
    c1, c2 = f["l1d_bytes"] * t, f["l2_bytes"] * t
    c3 = f["l3_bytes"] * min(2, math.ceil(t / 3))
    l1, l2 = f["l1_read_gbps_per_core"] * t, f["l2_read_gbps_per_core"] * t
    l3 = f["l3_read_gbps_1t"] * t
    dram = min(f["dram_read_gbps_max"],
               f["dram_read_gbps_1t"] + (f["dram_read_gbps_max"] - f["dram_read_gbps_1t"]) * (t - 1) / 2)
    pts = [(4 * KIB, l1), (c1, l1), (2 * c1, l2), (c2, l2), (2 * c2, l3), (c3, l3), (2 * c3, dram),
           (4 * GIB, dram)]
    return [BandwidthPoint("read", t, int(ws), gbps, gbps, 0) for ws, gbps in pts]


def build_reference_profile() -> HostProfile:
    """The reference PC (Ryzen 5 3600X) as a HostProfile, from :data:`REFERENCE_FIGURES`.

    Read-bandwidth curves for 1..6 threads: a plateau per level up to its capacity at that
    thread count, a log-linear fall to the next level's plateau at twice the capacity, DRAM
    beyond twice the usable L3 (16 MiB at 1-3 threads, 32 MiB at 4-6: threads packed per
    3-core complex). No kernel figures (no compute roof) and no calibration: predictions
    on it are memory-roof upper bounds. ``repeats`` is 0 on every point: not measured.
    """
    f = REFERENCE_FIGURES
    caches = (CacheLevel(1, "Data", f["l1d_bytes"], 6, 2), CacheLevel(1, "Instruction", 32 * KIB, 6, 2),
              CacheLevel(2, "Unified", f["l2_bytes"], 6, 2), CacheLevel(3, "Unified", f["l3_bytes"], 2, 6))
    host = {
        "cpu_model": "AMD Ryzen 5 3600X (Zen 2, AVX2, no AVX-512 / VNNI)",
        "physical_cores": 6, "logical_cpus": 12, "memory": "DDR4-3200 dual channel (51.2 GB/s peak)",
        "ram_bytes": f["ram_bytes"], "source": "published figures collected in SEED_NOTES.md",
        "figures": {k: v for k, v in f.items()}, "estimates": list(REFERENCE_ESTIMATES),
    }
    pts = tuple(p for t in range(1, 7) for p in _reference_curve(t))
    return HostProfile(REFERENCE_LABEL, False, host, caches, "published", pts)


def write_reference_profile(path: str | Path = REFERENCE_PATH) -> Path:
    """Regenerate the bundled JSON from :func:`build_reference_profile` (atomic)."""
    build_reference_profile().save(path)
    return Path(path)


def load_reference_profile() -> HostProfile:
    """The bundled reference-PC profile (tern/reference/ryzen_3600x.json)."""
    return HostProfile.load(REFERENCE_PATH)


def resolve_host(path: str | Path | None = None, results: str | Path | None = "results",
                 reference: bool = False, probe_if_missing: bool = False) -> HostProfile:
    """The profile to predict for: ``path`` if given; else ``<results>/host_profile.json``
    when present; else a quick probe (only with ``probe_if_missing`` and when tern.probe is
    available); else the reference PC. Says which on stderr."""
    if reference:
        return load_reference_profile()
    if path is not None:
        return HostProfile.load(path)
    if results is not None:
        from tern.core.paths import results_dir

        p = Path(results) if Path(results).is_absolute() else results_dir(results)
        cand = p / "host_profile.json"
        if cand.exists():
            print(f"host profile: {cand}", file=sys.stderr)
            return HostProfile.load(cand)
    if probe_if_missing:
        prof = _quick_probe()
        if prof is not None:
            return prof
    print(f"no host profile found (run `tern probe`); using the {REFERENCE_LABEL}", file=sys.stderr)
    return load_reference_profile()


def _quick_probe() -> HostProfile | None:
    """A quick probe of this machine through tern.probe, or None when unavailable."""
    try:
        from tern.probe import profile as probe
    except ImportError:
        return None
    for name in ("quick_profile", "probe_quick"):
        fn = getattr(probe, name, None)
        if fn is not None:
            return fn()
    fn = getattr(probe, "probe", None)
    if fn is None:
        return None
    try:
        return fn(quick=True)
    except TypeError:
        return None


def hosts_for_comparison(host: HostProfile) -> dict[str, HostProfile]:
    """{"your machine": host, "reference PC": the bundled reference} (only the reference
    when ``host`` is the reference itself)."""
    ref = load_reference_profile()
    return {"reference PC": ref} if host == ref else {"your machine": host, "reference PC": ref}


def thread_choices(host: HostProfile) -> tuple[int, ...]:
    """1 and the largest thread count the profile measured."""
    return tuple(sorted({1, max(host.thread_counts() or [1])}))


if __name__ == "__main__":  # pragma: no cover - regenerate the bundled reference profile
    print(write_reference_profile())
