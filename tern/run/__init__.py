"""Step 4 — run: the numba decode Engine over a packed file, and `tern generate`.

Public names are re-exported lazily (tern.core.lazy): ``from tern.run import X`` imports only
the submodule defining X."""

from tern.core.lazy import lazy_exports

_EXPORTS = {
    "Engine": "engine",
    "time_in_numba": "timing",
    "time_njit": "timing",
    "time_steps": "timing",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
