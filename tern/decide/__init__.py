"""Step 6 — decide: pre-registered A/B gates over seeds (spec, statistics, registry, harness, figures).

Public names are re-exported lazily (tern.core.lazy): ``from tern.decide import X`` imports only
the submodule defining X."""

from tern.core.lazy import lazy_exports

_EXPORTS = {
    "GateSpec": "spec",
    "combine": "stats",
    "compare": "stats",
    "gate_headlines": "registry",
    "latest_verdicts": "registry",
    "list_gates": "registry",
    "load_gate": "spec",
    "plan": "harness",
    "plan_gate": "planning",
    "plot_registry": "plots",
    "read_registry": "registry",
    "registry_report": "registry",
    "registry_to_show": "registry",
    "run_gate": "harness",
    "shipped_gates": "registry",
    "show_gate": "registry",
    "smoke_gate_file": "harness",
    "verdict_record": "harness",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
