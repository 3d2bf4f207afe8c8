"""The shipped corpus, its fixed split, the trained BPE tokenizers, token arrays and bits per byte.

Public names are re-exported lazily (tern.core.lazy): ``from tern.data import X`` imports only
the submodule defining X."""

from tern.core.lazy import lazy_exports

_EXPORTS = {
    "DEFAULT_TOKENIZER": "tokenizer",
    "Document": "corpus",
    "OnlineCorpusError": "tokens",
    "TOKENIZERS": "tokenizer",
    "bits_per_byte": "tokens",
    "corpus_stats": "tokens",
    "data_dir": "corpus",
    "get_tokenizer": "tokenizer",
    "load_corpus": "corpus",
    "load_online_corpus": "tokens",
    "load_tokens": "tokens",
    "sha256_bytes": "corpus",
    "sha256_file": "corpus",
    "split_bytes": "corpus",
    "split_text": "corpus",
    "val_bpb": "tokens",
    "xz_bits_per_byte": "tokens",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
