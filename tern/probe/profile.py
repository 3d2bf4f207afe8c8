"""`tern probe`: measure the host — caches, bandwidth against working set, kernel roofs.

    profile = run_probe(probe_config(quick=True))      # -> HostProfile (saved with out=...)
    plateau_table(profile)                             # {threads: {"L1": GB/s, ..., "DRAM": GB/s}}
    plateau_spread(profile)                            # ... and the slowest / fastest run of each

Caches come from ``/sys`` (:mod:`tern.core.host_caches`), bandwidth from numba read / copy /
triad kernels swept over working sets (:mod:`tern.probe.bandwidth`), kernel throughput
from the matvec registry (:mod:`tern.probe.kernel_table`). All figures: GB/s = 1e9 bytes/s,
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

import os
import platform
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

from tern.core.engine_tuning import for_threads, llc_bytes_here, save_tuning
from tern.core.host_caches import Topology, detect_caches, read_topology, usable_cpus
from tern.core.host_profile import HostProfile, KernelThroughput
from tern.core.host_queries import measured_llc_bytes
from tern.core.records import run_metadata
from tern.kernels.policy import EnginePolicy
from tern.probe.bandwidth import KERNELS, SweepConfig, default_max_ws_bytes, format_bytes
from tern.probe.timing import CompileClock, TimingConfig

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
    op_costs: bool = True  # time the engine's operations (tern.probe.ops) for the roofline
    op_curves: bool = True  # time the engine's matvecs from L2 to DRAM (tern.probe.curves)
    row_curves: bool = True  # and the row passes against row length (tern.probe.row_curves)
    engine_runs: bool = True  # time the engine itself on small models (tern.probe.engine_runs)

    def __post_init__(self) -> None:
        for r, c in self.kernel_sizes:
            if r < 1 or c < 1:
                raise ValueError(f"kernel size {r} x {c} must be positive")


def kernels_of_the_engine() -> tuple[str, ...]:
    """The kernel-table entries a quick probe times: the engine's default ternary variant
    (tern.kernels.kernels_ternary.DEFAULT_VARIANT on this CPU) and its int8 / fp32
    matvecs; the full probe times every registered kernel (the other ternary variants
    are comparisons, and only the plain roofline reads the table)."""
    from tern.kernels.kernels_ternary import DEFAULT_VARIANT

    return (f"ternary_{DEFAULT_VARIANT}", "int8_matvec", "fp32_matvec")


def default_thread_counts() -> tuple[int, ...]:
    """(1, all CPUs this process may use), or (1,) on a one-CPU machine."""
    from tern.probe.bandwidth import max_threads

    n = max(1, min(usable_cpus(), max_threads()))
    return (1,) if n == 1 else (1, n)


def probe_config(quick: bool = False, thread_counts: tuple[int, ...] | None = None,
                 llc_bytes: int | None = None, kernels: tuple[str, ...] | None = None,
                 sys_root: str = "/sys") -> ProbeConfig:
    """The quick (read kernel only, 2 points per octave, 20 ms runs, up to 4 x LLC; the
    engine's own kernels only in the kernel table: 15.5 s on the 2-core Zen 5 VM with a
    warm numba cache, ~40 s when an engine change makes numba compile again) or full (< 3 min: read at 4 points per octave, copy and triad at
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
        return ProbeConfig(sweep=sweep, kernel_names=kernels_of_the_engine(), kernel_timing=t, quick=True,
                           sys_root=sys_root)
    # read (the decode roof) at 4 points per octave; copy and triad, drawn but never priced, at 1:
    # at 2 they were half of the bandwidth stage, 109 of a 223 s probe on the Intel Xeon VM (s30)
    sweep = SweepConfig(max_ws_bytes=max_ws, points_per_octave=4, stream_points_per_octave=1,
                        kernels=kernels or KERNELS,
                        thread_counts=threads, timing=TimingConfig(min_time_s=0.1, repeats=3, warmup_s=0.01))
    return ProbeConfig(sweep=sweep, kernel_sizes=((1024, 1024), (4096, 4096)), sys_root=sys_root)


def _available_ram_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


# ---- host facts ---------------------------------------------------------------------------


def cpu_facts() -> dict[str, Any]:
    """Model name, vendor, family / model / stepping numbers, architecture and ISA flags
    from py-cpuinfo (its cache fields are ignored: see tern.core.host_caches). The numbers
    tell apart hosts that a VM names alike ("AMD EPYC": family 25 is Zen 3/4, 26 Zen 5)."""
    import cpuinfo

    info = cpuinfo.get_cpu_info()
    flags = sorted(info.get("flags", []))
    return {
        "cpu_model": info.get("brand_raw") or platform.processor() or platform.machine(),
        "cpu_vendor": info.get("vendor_id_raw", ""),
        "cpu_family": info.get("family"),
        "cpu_model_number": info.get("model"),
        "cpu_stepping": info.get("stepping"),
        "arch": info.get("arch", platform.machine()),
        "isa": {f: f in flags for f in ISA_FLAGS},
        "cpu_flags": flags,
    }


def engine_policy(stream_prefetch: bool = True, stream: bool = True) -> EnginePolicy:
    """The engine the probe's engine runs time (tern.kernels.ops_region.ENGINE_POLICY:
    imported here, not at module load, since it compiles numba code), with the DRAM rows' form
    and the streaming kernel's prefetch the probe chose (tern.probe.stream_prefetch) at its
    largest thread count."""
    from tern.kernels.ops_region import ENGINE_POLICY

    return replace(ENGINE_POLICY, stream_prefetch=bool(stream_prefetch), stream=bool(stream))


def host_facts(thread_counts: tuple[int, ...], topo: Topology, stream_prefetch: bool = True,
               stream: bool = True) -> dict[str, Any]:
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
        "engine_policy": engine_policy(stream_prefetch, stream).to_dict(),  # the engine the profile's engine runs measured
    })
    return facts


# ---- the probe ----------------------------------------------------------------------------


def run_probe(config: ProbeConfig | None = None, out: str | os.PathLike | None = None,
              progress: bool = True, tuning: bool = True) -> HostProfile:
    """Measure this host and return its HostProfile (saved atomically to ``out`` if given).
    ``tuning``: save the DRAM rows' choices (stream or 4-row pass, the stream's prefetch) for
    this CPU where the engine reads them (tern.core.engine_tuning; its path goes into ``host["stream_prefetch"]``).
    ``host["probe_compile_s"]``: the part of ``probe_wall_s`` numba spent compiling (:class:`CompileClock`)."""
    config = config or probe_config()
    with CompileClock() as compiling:
        profile = _measure(config, out, progress, tuning, compiling)
    if out is not None:
        profile.save(out)
    return profile


def _measure(config: ProbeConfig, out: str | os.PathLike | None, progress: bool, tuning: bool,
             compiling: CompileClock) -> HostProfile:
    import numba

    from tern.probe import kernel_table as kernel_bench
    from tern.probe.bandwidth import read_kernel_simd, sweep

    t0 = time.perf_counter()
    topo = read_topology(config.sys_root)
    caches, source = detect_caches(config.sys_root, topology=topo)
    sc = config.sweep
    points = sweep(sc, progress=progress)
    kernels: list[KernelThroughput] = []
    if config.kernel_names != ():
        kernels = kernel_bench.measure_kernels(config.kernel_names, config.kernel_sizes,
                                               sc.thread_counts, config.kernel_timing, progress)
    op_costs, stream_pf, runs = [], None, None
    try:
        if config.op_costs:  # the streaming kernel's prefetch first: the engine's ops are timed as it will run
            from tern.probe.ops import measure_op_costs
            from tern.probe.stream_prefetch import measure_stream_prefetch

            stream_pf = measure_stream_prefetch(sc.thread_counts, quick=config.quick, progress=progress)
            if config.engine_runs:  # rounds spread over the rest of the probe (tern.probe.engine_runs)
                from tern.probe.engine_runs import EngineRunRounds

                runs = EngineRunRounds(sc.thread_counts, repeats=3 if config.quick else 5,
                                       stream_prefetch=stream_pf["stream_prefetch"], stream=stream_pf["stream"])
                runs.round(progress)
            op_costs = measure_op_costs(sc.thread_counts, quick=config.quick, progress=progress,
                                        timing=config.kernel_timing if config.quick else None,
                                        stream_prefetch=stream_pf["stream_prefetch"])
            if runs is not None and not config.quick:
                runs.round(progress)
        op_curves = []
        if config.op_curves and config.op_costs:
            from tern.probe.curves import measure_op_curves

            op_curves = measure_op_curves(sc.thread_counts, quick=config.quick, progress=progress,
                                          max_bytes=max(sc.max_ws_bytes, 256 * 1024 * 1024),
                                          timing=config.kernel_timing if config.quick else None,
                                          stream_prefetch=stream_pf["stream_prefetch"])
        row_curves = []
        if config.op_curves and config.op_costs and config.row_curves:
            from tern.probe.row_curves import measure_row_curves

            row_curves = measure_row_curves(sc.thread_counts, quick=config.quick, progress=progress,
                                            timing=config.kernel_timing if config.quick else None,
                                            stream_prefetch=stream_pf["stream_prefetch"])
        if runs is not None:
            runs.round(progress)
        engine_runs = [] if runs is None else runs.runs()
    finally:
        if runs is not None:
            runs.close()
    most = max(sc.thread_counts)  # the profile's engine_policy: the choices at the largest thread count
    host = host_facts(sc.thread_counts, topo or Topology(os.cpu_count() or 1, os.cpu_count() or 1),
                      stream_prefetch=for_threads(None if stream_pf is None else stream_pf["stream_prefetch"], most),
                      stream=for_threads(None if stream_pf is None else stream_pf["stream"], most))
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
        # of which numba compiling (a fresh machine or an engine change; 0 with a warm cache)
        "probe_compile_s": round(compiling.seconds, 2),
    })
    if most > 1:  # where the threads' cores sit (tern.probe.core_latency): it moves every 2-thread figure
        from tern.probe.core_latency import measure_round_trip

        host["core_round_trip"] = measure_round_trip()
    # the LLC the engine's streaming rule assumes: a VM's slice of a large shared L3 as the curve shows it
    llc = measured_llc_bytes(HostProfile("curve", True, host, caches, source, tuple(points)))
    if stream_pf is not None:
        host["stream_prefetch"] = stream_pf  # the A/B and its choice per thread count (engine_policy: the largest)
        stream_pf["tuning_path"] = str(save_tuning({
            "stream_prefetch": stream_pf["stream_prefetch"], "off_over_on": stream_pf["off_over_on"],
            "stream": stream_pf["stream"], "rows_over_stream": stream_pf["rows_over_stream"],
            **({"llc_bytes": llc} if llc else {}),
            "profile": None if out is None else str(out), "timestamp": host.get("timestamp")})) if tuning else None
    host["engine_llc_bytes"] = llc_bytes_here()  # what this machine's engine now assumes (tern.core.host_queries)
    profile = HostProfile(label=f"measured on {host['host']}", measured=True, host=host,
                          caches=caches, cache_source=source, bandwidth=tuple(points),
                          kernels=tuple(kernels), op_costs=tuple(op_costs),
                          op_curves=tuple(op_curves), engine_runs=tuple(engine_runs), row_curves=tuple(row_curves))
    return profile


def quick_profile(out: str | os.PathLike | None = None, progress: bool = True) -> HostProfile:
    """A quick probe of this machine (what tern.predict.roofline runs when no profile exists;
    it leaves the engine's tuning as it is)."""
    return run_probe(probe_config(quick=True), out=out, progress=progress, tuning=False)


# ---- CLI ----------------------------------------------------------------------------------


