"""Cache hierarchy and CPU topology of a host, read from ``/sys`` first.

``/sys/devices/system/cpu/cpu*/cache/index*`` describes every cache instance a logical
CPU sees: ``size`` is the size of ONE instance and ``shared_cpu_list`` the logical CPUs
sharing it, so the number of distinct ``shared_cpu_list`` values of a (level, type) is
the number of instances. The root (``/sys``) is a parameter so tests can point at
fixture trees.

Where ``/sys`` lacks entries (some VMs, macOS) the missing levels come from a fallback,
in order: ``getconf`` (glibc, from CPUID; sizes only), ``sysctl`` (macOS), then a
conservative default. :func:`detect_caches` says which source(s) it used. py-cpuinfo's
cache fields are deliberately not used: on AMD it reports the per-core L2 as "L3", and
through lscpu it returns totals rather than per-instance sizes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tern.core.host_profile import CacheLevel

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# Used only when no other source knows a level: a typical desktop core of the last decade.
DEFAULT_SIZES_BYTES = {(1, "Data"): 32 * KIB, (1, "Instruction"): 32 * KIB,
                       (2, "Unified"): 512 * KIB, (3, "Unified"): 8 * MIB}

_CPU_DIR = re.compile(r"^cpu(\d+)$")
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)i?B?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Topology:
    logical_cpus: int  # logical CPUs (hardware threads) the tree lists
    physical_cores: int  # distinct (package, core) pairs; = logical_cpus when unknown

    @property
    def threads_per_core(self) -> int:
        return max(1, self.logical_cpus // max(1, self.physical_cores))


def parse_size_bytes(text: str) -> int:
    """'32K' -> 32768, '16384K' -> 16 MiB, '1M', '512 KiB', '4096' (bytes)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"cannot parse cache size {text!r}")
    mult = {"": 1, "K": KIB, "M": MIB, "G": 1024 * MIB}[m.group(2).upper()]
    return int(m.group(1)) * mult


def parse_cpu_list(text: str) -> frozenset[int]:
    """'0-2,6-8' -> {0, 1, 2, 6, 7, 8}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"cannot parse CPU list {text!r}") from None
        if b < a:
            raise ValueError(f"cannot parse CPU list {text!r} (range {part!r} is reversed)")
        cpus.update(range(a, b + 1))
    return frozenset(cpus)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _cpu_dirs(sys_root: str | os.PathLike) -> list[tuple[int, Path]]:
    base = Path(sys_root) / "devices" / "system" / "cpu"
    if not base.is_dir():
        return []
    out = []
    for p in base.iterdir():
        m = _CPU_DIR.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out)


def read_topology(sys_root: str | os.PathLike = "/sys") -> Topology | None:
    """Logical CPUs and physical cores from ``cpu*/topology`` (None when the tree has no
    CPUs). Without topology files every logical CPU counts as a core."""
    cpus = _cpu_dirs(sys_root)
    if not cpus:
        return None
    cores = set()
    for idx, d in cpus:
        core, pkg = _read(d / "topology" / "core_id"), _read(d / "topology" / "physical_package_id")
        cores.add((pkg, core) if core is not None else ("cpu", idx))
    return Topology(logical_cpus=len(cpus), physical_cores=len(cores))


def read_sys_caches(sys_root: str | os.PathLike = "/sys") -> list[CacheLevel]:
    """Every (level, type) whose size ``/sys`` reports, with its instances and sharing.
    Entries without a readable level, type or size are skipped (see :func:`detect_caches`
    for the fallback)."""
    # (level, type) -> {size_bytes, {shared cpu set, ...}}
    seen: dict[tuple[int, str], tuple[int, set[frozenset[int]]]] = {}
    for idx, cpu_dir in _cpu_dirs(sys_root):
        cache_dir = cpu_dir / "cache"
        if not cache_dir.is_dir():
            continue
        for ix in sorted(cache_dir.glob("index*")):
            level, ctype, size = _read(ix / "level"), _read(ix / "type"), _read(ix / "size")
            if not (level and ctype and size):
                continue
            try:
                lvl, nbytes = int(level), parse_size_bytes(size)
            except ValueError:
                continue
            shared_text = _read(ix / "shared_cpu_list")
            shared = parse_cpu_list(shared_text) if shared_text else frozenset({idx})
            key = (lvl, ctype)
            prev = seen.get(key)
            if prev is None:
                seen[key] = (nbytes, {shared})
            else:
                # heterogeneous parts (big.LITTLE): keep the largest instance size
                seen[key] = (max(prev[0], nbytes), prev[1] | {shared})
    out = []
    for (lvl, ctype), (nbytes, groups) in sorted(seen.items()):
        out.append(CacheLevel(level=lvl, type=ctype, size_bytes=nbytes, instances=len(groups),
                              shared_by=max(len(g) for g in groups)))
    return out


# ---- fallbacks: each returns {(level, type): size_bytes} for what it knows ---------------

Runner = Callable[[Sequence[str]], str | None]


def _run(cmd: Sequence[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def getconf_sizes(run: Runner = _run) -> dict[tuple[int, str], int]:
    """Sizes glibc derives from CPUID (``getconf LEVEL1_DCACHE_SIZE`` ...). Sizes only,
    and the L3 may be the whole package's rather than one instance's."""
    names = {(1, "Data"): "LEVEL1_DCACHE_SIZE", (1, "Instruction"): "LEVEL1_ICACHE_SIZE",
             (2, "Unified"): "LEVEL2_CACHE_SIZE", (3, "Unified"): "LEVEL3_CACHE_SIZE",
             (4, "Unified"): "LEVEL4_CACHE_SIZE"}
    out = {}
    for key, name in names.items():
        text = run(["getconf", name])
        if text and text.strip().isdigit() and int(text) > 0:
            out[key] = int(text)
    return out


def sysctl_sizes(run: Runner = _run) -> dict[tuple[int, str], int]:
    """macOS: ``sysctl hw.l1dcachesize`` ... (performance cores where the split exists)."""
    names = {(1, "Data"): ("hw.perflevel0.l1dcachesize", "hw.l1dcachesize"),
             (1, "Instruction"): ("hw.perflevel0.l1icachesize", "hw.l1icachesize"),
             (2, "Unified"): ("hw.perflevel0.l2cachesize", "hw.l2cachesize"),
             (3, "Unified"): ("hw.perflevel0.l3cachesize", "hw.l3cachesize")}
    out = {}
    for key, candidates in names.items():
        for name in candidates:
            text = run(["sysctl", "-n", name])
            if text and text.strip().isdigit() and int(text) > 0:
                out[key] = int(text)
                break
    return out


def default_sizes(run: Runner = _run) -> dict[tuple[int, str], int]:
    return dict(DEFAULT_SIZES_BYTES)


FALLBACKS: dict[str, Callable[..., dict[tuple[int, str], int]]] = {
    "getconf": getconf_sizes, "sysctl": sysctl_sizes, "default": default_sizes}


def _assumed_level(level: int, ctype: str, size: int, topo: Topology) -> CacheLevel:
    """A fallback size with assumed sharing: L1/L2 private to a core, L3+ one instance
    shared by every logical CPU."""
    if level <= 2:
        return CacheLevel(level, ctype, size, instances=topo.physical_cores,
                          shared_by=topo.threads_per_core)
    return CacheLevel(level, ctype, size, instances=1, shared_by=topo.logical_cpus)


def detect_caches(sys_root: str | os.PathLike = "/sys",
                  fallbacks: Sequence[str] = ("getconf", "sysctl", "default"),
                  topology: Topology | None = None,
                  run: Runner = _run) -> tuple[tuple[CacheLevel, ...], str]:
    """Cache levels and the source(s) they came from.

    ``/sys`` is used for every level it reports. When it lacks the L1 data cache or has
    no unified level >= 2, the missing levels (L1d, L2, L3) come from the first fallback
    that knows them; their sharing is assumed (see :func:`_assumed_level`). The source
    string is '/sys' when nothing was filled in, else e.g. '/sys+default' or 'getconf'.
    Fallback names: 'getconf', 'sysctl', 'default' (tests pass only 'default' so the
    real machine does not leak into a fixture tree).
    """
    unknown = [f for f in fallbacks if f not in FALLBACKS]
    if unknown:
        raise ValueError(f"unknown cache fallback(s) {unknown}; choose from {sorted(FALLBACKS)}")
    topo = topology or read_topology(sys_root) or _host_topology()
    levels = {(c.level, c.type): c for c in read_sys_caches(sys_root)}
    sources = ["/sys"] if levels else []
    wanted = [(1, "Data"), (2, "Unified"), (3, "Unified")]
    has_l1d = (1, "Data") in levels
    has_upper = any(lvl >= 2 and t == "Unified" for lvl, t in levels)
    missing = [k for k in wanted if k not in levels] if not (has_l1d and has_upper) else []
    for name in fallbacks:
        if not missing:
            break
        sizes = FALLBACKS[name](run=run)
        used = False
        for key in list(missing):
            if key in sizes:
                levels[key] = _assumed_level(key[0], key[1], sizes[key], topo)
                missing.remove(key)
                used = True
        if used:
            sources.append(name)
    caches = tuple(sorted(levels.values(), key=lambda c: (c.level, c.type)))
    return caches, "+".join(sources) or "none"


def usable_cpus() -> int:
    """Logical CPUs this process may run on: its affinity mask (a container's or taskset's
    cpuset), not the machine's count, which would oversubscribe a slice (os.cpu_count() on a
    16-CPU machine pinned to 2 says 16). macOS has no affinity call: its CPU count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


def _host_topology() -> Topology:
    """psutil's view of this machine (used when the /sys tree has no CPU entries)."""
    import psutil

    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    return Topology(logical_cpus=logical, physical_cores=physical)


def host_llc_bytes(sys_root: str | os.PathLike = "/sys", fallbacks: Sequence[str] = ("getconf", "sysctl")) -> int:
    """Bytes of one instance of this machine's last-level cache (0 when unknown): what the
    decode engine's streaming rule compares a model's pools with (tern.predict.inventory)."""
    caches, _ = detect_caches(sys_root, fallbacks)
    top = [c for c in caches if c.type in ("Unified", "Data")]
    return max(top, key=lambda c: (c.level, c.size_bytes)).size_bytes if top else 0
