"""Tokenizers: byte-level BPE (vocab 1024 default, 4096) trained on the train split and
shipped in ``data/tokenizers/``, and a plain byte tokenizer (vocab 256).

Every tokenizer is lossless: ``decode(encode(text)) == text`` for any text, and the
document separator ``"\\x1e"`` is one token (``eot_id``). A shipped BPE file is a
versioned JSON wrapper ``{"format": "tern-tokenizer", "version", "name", "vocab_size",
"train_text_sha256", "tokenizer": <tokenizers library JSON>}``; nothing trains at import.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from tern.core.records import atomic_write_text
from tern.data.corpus import DOC_SEP, data_dir, sha256_bytes

TOKENIZER_FORMAT = "tern-tokenizer"
TOKENIZER_VERSION = 1
BPE_VOCABS = {"bpe1024": 1024, "bpe4096": 4096}
TOKENIZERS = (*BPE_VOCABS, "byte")
DEFAULT_TOKENIZER = "bpe1024"


class Tokenizer:
    """Common interface: ``name``, ``vocab_size``, ``hash`` (sha256 hex identifying the
    exact mapping), ``eot_id`` (the document separator token), ``encode``, ``decode``,
    ``encode_docs`` and ``token_bytes``."""

    name: str
    vocab_size: int
    hash: str
    eot_id: int

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def encode_docs(self, docs: list[str]) -> np.ndarray:
        """Tokens of ``"".join(d + DOC_SEP for d in docs)``: each document's tokens
        followed by ``eot_id``. Shape (n_tokens,), uint16."""
        parts = []
        for ids in self._encode_many(docs):
            parts.append(np.asarray(ids, dtype=np.uint16))  # (n_doc_tokens,)
            parts.append(np.array([self.eot_id], dtype=np.uint16))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)

    def _encode_many(self, docs: list[str]) -> list[list[int]]:
        return [self.encode(d) for d in docs]

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes each token stands for. Shape (vocab_size,), int64; the bytes of a
        token sequence's text are ``token_bytes()[ids].sum()``."""
        raise NotImplementedError

    def _check_ids(self, ids) -> list[int]:
        ids = [int(i) for i in (ids.tolist() if isinstance(ids, np.ndarray) else ids)]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"{self.name}: token ids must be in [0, {self.vocab_size}), got {bad[:5]}")
        return ids

    def __repr__(self) -> str:
        return f"<Tokenizer {self.name} vocab {self.vocab_size} sha256 {self.hash[:12]}>"


class ByteTokenizer(Tokenizer):
    """One token per UTF-8 byte (vocab 256); the separator is byte 0x1e. Decoding a byte
    sequence that is not valid UTF-8 (a model's sample) replaces the bad bytes with U+FFFD."""

    def __init__(self) -> None:
        self.name = "byte"
        self.vocab_size = 256
        self.hash = sha256_bytes(b"tern byte tokenizer v1: token = UTF-8 byte")
        self.eot_id = ord(DOC_SEP)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(self._check_ids(ids)).decode("utf-8", errors="replace")

    def encode_docs(self, docs: list[str]) -> np.ndarray:
        raw = "".join(d + DOC_SEP for d in docs).encode("utf-8")
        return np.frombuffer(raw, dtype=np.uint8).astype(np.uint16)  # (n_bytes,)

    def token_bytes(self) -> np.ndarray:
        return np.ones(256, dtype=np.int64)


class BPETokenizer(Tokenizer):
    """Byte-level BPE from a shipped tern tokenizer file (see module docstring)."""

    def __init__(self, path: str | os.PathLike) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"tokenizer file {path} is missing; rebuild with "
                                    f"`python data/build_corpus.py --tokenizers --write`")
        raw = path.read_bytes()
        obj = json.loads(raw)
        if obj.get("format") != TOKENIZER_FORMAT or obj.get("version") != TOKENIZER_VERSION:
            raise ValueError(f"{path}: not a {TOKENIZER_FORMAT} v{TOKENIZER_VERSION} file")
        self._tok = HFTokenizer.from_str(json.dumps(obj["tokenizer"]))
        self.name = obj["name"]
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        if self.vocab_size != obj["vocab_size"]:
            raise ValueError(f"{path}: vocab has {self.vocab_size} tokens, header says {obj['vocab_size']}")
        eot = self._tok.token_to_id(DOC_SEP)
        if eot is None:
            raise ValueError(f"{path}: no document separator token")
        self.eot_id = eot
        self.hash = sha256_bytes(raw)
        self.train_text_sha256 = obj.get("train_text_sha256", "")

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def _encode_many(self, docs: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(docs, add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._tok.decode(self._check_ids(ids), skip_special_tokens=False)

    def token_bytes(self) -> np.ndarray:
        # a byte-level token is written with one character per byte; the separator is 1 byte
        out = np.zeros(self.vocab_size, dtype=np.int64)  # (V,)
        for i in range(self.vocab_size):
            tok = self._tok.id_to_token(i)
            out[i] = len(tok.encode("utf-8")) if tok == DOC_SEP else len(tok)
        return out


def get_tokenizer(name: str = DEFAULT_TOKENIZER, root: str | os.PathLike | None = None) -> Tokenizer:
    """``"bpe1024"`` (default), ``"bpe4096"`` or ``"byte"``; BPE files come from
    ``data/tokenizers/<name>.json`` (cached per file state)."""
    if isinstance(name, Tokenizer):
        return name
    if name == "byte":
        return ByteTokenizer()
    if name not in BPE_VOCABS:
        raise ValueError(f"unknown tokenizer {name!r}; choose one of {TOKENIZERS}")
    path = (data_dir(root) / "tokenizers" / f"{name}.json").resolve()
    stamp = (path.stat().st_mtime_ns, path.stat().st_size) if path.exists() else None
    return _load_bpe(path, stamp)


@lru_cache(maxsize=8)
def _load_bpe(path: Path, stamp) -> BPETokenizer:
    return BPETokenizer(path)


def train_bpe(train_text: str, vocab_size: int, path: str | os.PathLike, name: str | None = None) -> Path:
    """Train byte-level BPE on ``train_text`` (documents separated by DOC_SEP, which is
    added as a special token) and write a tern tokenizer file. Used by the build script."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import __version__ as hf_version
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ValueError(f"BPE vocab_size must exceed 256 (bytes + separator), got {vocab_size}")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[DOC_SEP],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    docs = [d for d in train_text.split(DOC_SEP) if d]
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise ValueError(f"training produced {tok.get_vocab_size()} tokens, wanted {vocab_size} "
                         f"(too little training text?)")
    obj = {
        "format": TOKENIZER_FORMAT,
        "version": TOKENIZER_VERSION,
        "name": name or f"bpe{vocab_size}",
        "vocab_size": vocab_size,
        "train_text_sha256": sha256_bytes(train_text.encode("utf-8")),
        "trained_with": f"tokenizers {hf_version}",
        "tokenizer": json.loads(tok.to_str()),
    }
    path = Path(path)
    atomic_write_text(path, json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
    return path
