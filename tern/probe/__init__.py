"""Step 1 — probe the host: caches, read bandwidth against working set, kernel throughput
and the engine's op costs -> HostProfile (`tern probe`).

Public names are re-exported lazily (tern.core.lazy): ``from tern.probe import X`` imports only
the submodule defining X."""

from tern.core.lazy import lazy_exports

_EXPORTS = {
    "Calibrated": "timing",
    "SweepBuffers": "bandwidth",
    "TimingConfig": "timing",
    "calibrate_point": "bandwidth",
    "check_threads": "bandwidth",
    "compile_kernels": "bandwidth",
    "default_thread_counts": "profile",
    "detect_plateaus": "plateaus",
    "format_bytes": "bandwidth",
    "format_cache_table": "plateaus",
    "format_kernel_table": "plateaus",
    "format_plateau_table": "plateaus",
    "measure_kernels": "kernel_table",
    "measure_op_costs": "ops",
    "measure_point": "bandwidth",
    "numba_threads": "bandwidth",
    "plateau_table": "plateaus",
    "plot_bandwidth": "plots",
    "probe_config": "profile",
    "probe_headlines": "plateaus",
    "probe_summary": "plateaus",
    "quick_profile": "profile",
    "registered_kernels": "kernel_table",
    "run_probe": "profile",
    "timed_runs": "timing",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
