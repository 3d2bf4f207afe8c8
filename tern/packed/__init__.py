"""The packed model file: format (layout and header), streaming writer and random_model,
and the validating memory-mapped reader.

Public names are re-exported lazily (tern.core.lazy): ``from tern.packed import X`` imports only
the submodule defining X."""

from tern.core.lazy import lazy_exports

_EXPORTS = {
    "CHECKS": "format",
    "PackedModel": "reader",
    "TERNARY_FORMATS": "format",
    "codes_valid": "reader",
    "default_tokenizer": "format",
    "file_layout": "format",
    "load_packed": "reader",
    "random_model": "writer",
    "read_header": "reader",
    "to_float32": "reader",
    "tokenizer_identity": "format",
    "validate_packed": "reader",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
