"""Step 5 — measure against prediction: the engine ladder, decode sweeps from cache-resident
to DRAM-bound, calibration checks, llama.cpp side by side (peers), bandwidth utilisation, quality against
decode speed (frontier) and their figures.

Public names are re-exported lazily (tern.core.lazy): ``from tern.measure import X`` imports only
the submodule defining X."""

from tern.core.lazy import lazy_exports

_EXPORTS = {
    "load_hosts": "hosts",
    "repredict": "hosts",
    "accuracy_report": "hosts",
    "verdict_text": "hosts",
    "save_host": "hosts",
    "hosts_report": "hosts",
    "plot_hosts": "plots_hosts",
    "BUDGETS": "sweep",
    "PeerShape": "peers",
    "SHAPES": "peers",
    "SweepPoint": "sweep",
    "accuracy": "sweep",
    "calibrate": "sweep",
    "decode_utilisation": "utilisation",
    "default_points": "sweep",
    "engine_bytes_per_token": "utilisation",
    "ensure_model": "sweep_models",
    "check_free_space": "sweep_models",
    "plan_models": "sweep_models",
    "fixed_active_family": "sweep",
    "fixed_total_family": "sweep",
    "frontier_arms": "frontier",
    "frontier_points": "frontier",
    "gguf_tensors": "peers_gguf",
    "ladder_headline": "ladder",
    "ladder_model": "ladder",
    "ladder_plot": "plots",
    "measure_in_subprocess": "sweep",
    "pair_summary": "sweep",
    "peers_rows": "plots_peers",
    "peers_table": "peers_table",
    "plot_fixed_active": "plots",
    "plot_fixed_total": "plots",
    "plot_frontier": "plots_frontier",
    "plot_peers": "plots_peers",
    "plot_ratios": "plots",
    "plot_utilisation": "plots_peers",
    "preset_points": "sweep",
    "render_ladder": "ladder",
    "render_peers": "peers_table",
    "render_rows": "sweep",
    "row_utilisation": "utilisation",
    "run_frontier": "frontier",
    "run_ladder": "ladder",
    "run_peers": "peers",
    "run_sweep": "sweep",
    "select_shapes": "peers",
    "write_gguf": "peers_gguf",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
