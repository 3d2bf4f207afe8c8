"""Step 2 — predict decode tok/s: the two-pool model, the engine work inventory, reference
hosts, the design search, the 10B pick, the explorer widget and the roofline figures.

Public names are re-exported lazily (tern.core.lazy): ``from tern.predict import X`` imports only
the submodule defining X."""

from tern.core.lazy import lazy_exports

_EXPORTS = {
    "OpWork": "inventory",
    "PoolPrediction": "roofline",
    "Prediction": "roofline",
    "TwoPool": "pools",
    "WorkInventory": "inventory",
    "WorkKey": "inventory",
    "active_budget_for": "design",
    "budgets_by_threads": "design",
    "explore": "widgets",
    "explorer": "widgets",
    "feasibility_grid": "roofline",
    "headlines": "design",
    "hosts_for_comparison": "hosts",
    "load_reference_profile": "hosts",
    "pick_10b": "toward_10b",
    "plot_feasibility": "plots",
    "plot_formats": "plots",
    "plot_knee": "plots",
    "plot_presets": "plots",
    "plot_time_breakdown": "plots",
    "predict": "roofline",
    "predict_pools": "roofline",
    "predict_table": "tables",
    "render_budgets": "design",
    "render_prediction": "tables",
    "render_table": "tables",
    "resolve_host": "hosts",
    "roof_table": "toward_10b",
    "scaled_down": "toward_10b",
    "search": "design",
    "sweep_active": "roofline",
    "sweep_total": "roofline",
    "synthetic_profile": "roofline",
    "thread_choices": "hosts",
    "time_breakdown": "roofline",
    "two_pool": "pools",
    "two_pool_from_params": "pools",
    "with_format": "roofline",
    "work_inventory": "inventory",
    "work_seconds": "inventory",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
