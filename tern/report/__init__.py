"""The walk-through: notebook helpers and the self-contained HTML report.

Public names are re-exported lazily (tern.core.lazy): ``from tern.report import X`` imports only
the submodule defining X."""

from tern.core.lazy import lazy_exports

_EXPORTS = {
    "INSTALL_CELL": "notebook",
    "detect_env": "notebook",
    "list_notebooks": "build",
    "load_headlines": "notebook",
    "run_report": "build",
    "save_headline": "notebook",
    "setup": "notebook",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
