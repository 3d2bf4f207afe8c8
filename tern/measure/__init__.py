"""Step 5 — measure against prediction: the engine ladder, decode sweeps from cache-resident
to DRAM-bound, calibration checks and their figures.

Public names are re-exported lazily (tern.core.lazy): ``from tern.measure import X`` imports only
the submodule defining X."""

from tern.core.lazy import lazy_exports

_EXPORTS = {
    "BUDGETS": "sweep",
    "SweepPoint": "sweep",
    "accuracy": "sweep",
    "calibrate": "sweep",
    "default_points": "sweep",
    "ensure_model": "sweep",
    "fixed_active_family": "sweep",
    "fixed_total_family": "sweep",
    "ladder_headline": "ladder",
    "ladder_model": "ladder",
    "ladder_plot": "plots",
    "measure_in_subprocess": "sweep",
    "pair_summary": "sweep",
    "plot_fixed_active": "plots",
    "plot_fixed_total": "plots",
    "plot_ratios": "plots",
    "preset_points": "sweep",
    "render_ladder": "ladder",
    "render_rows": "sweep",
    "run_ladder": "ladder",
    "run_sweep": "sweep",
    "time_steps": "ladder",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
