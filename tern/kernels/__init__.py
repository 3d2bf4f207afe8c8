"""numba kernels: weight packing, SIMD row dots, ternary / int8 / fp matvecs, the fused
per-token ops, activation quantization, and the engine's dispatch policy (tern.kernels.policy)
that the predictor reads to price the same choices.

Public names are re-exported lazily (tern.core.lazy): ``from tern.kernels import X`` imports only
the submodule defining X."""

from tern.core.lazy import lazy_exports

_EXPORTS = {
    "HAS_VBMI": "simd",
    "PAR_MIN_WEIGHTS": "policy",
    "ROW_DOT_ISA": "simd",
    "SEGMENT_COLS": "policy",
    "b3_direct": "policy",
    "b3_mode": "policy",
    "b3_matvec": "kernels_b3",
    "b3_matvec_checked": "kernels_b3",
    "b3_permute": "kernels_b3",
    "STREAM_MAX_ROW_BYTES": "policy",
    "STREAM_MIN_ROW_BYTES": "policy",
    "drop_stale_cache": "cache_guard",
    "expand_b3_to_ternary2": "packing",
    "fexp_nonpos": "fastmath",
    "pack_ternary2": "packing",
    "pack_ternary_b3": "packing",
    "quantize_act": "quant",
    "quantize_weights": "packing",
    "random_ternary2": "packing",
    "stream_row_bytes": "policy",
    "ternary2_row_bytes": "packing",
    "ternary_b3_row_bytes": "packing",
    "ternary_matvec": "kernels_ternary",
    "unpack_ternary2": "packing",
    "unpack_ternary_b3": "packing",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
