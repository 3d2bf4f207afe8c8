"""tern.data: the shipped corpus, its fixed split, tokenizers, cached token arrays, and
the one place where bits per byte is computed.

    tok = get_tokenizer("bpe1024")             # or "bpe4096", "byte"
    train = load_tokens("train", tok)           # (N,) uint16, cached in data/cache/
    val_bpb(nll_fn, tok, seq_len=256)           # {"bpb", "nats", "tokens", "bytes", ...}

A split's token array is its documents in order, each followed by the separator token
``tok.eot_id`` (the text ``"\\x1e"``), so ``tok.decode(load_tokens(s, tok)) ==
split_text(s)``. Bits per byte is always per UTF-8 byte of the text that was scored.
Corpus and split: :mod:`tern.data.corpus`; tokenizers: :mod:`tern.data.tokenizer`; provenance:
``data/README.md``.
"""

from __future__ import annotations

import io
import lzma
import math
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tern.core.records import atomic_write_bytes
from tern.data.corpus import (
    XZ_PRESET,
    load_corpus,
    sha256_bytes,
)
from tern.data.tokenizer import DEFAULT_TOKENIZER, TOKENIZERS, Tokenizer, get_tokenizer

CACHE_VERSION = 1
NLLFn = Callable[[np.ndarray, np.ndarray], float]


def _log(msg: str) -> None:
    print(f"[tern.data] {msg}", file=sys.stderr)


# ---- token arrays -----------------------------------------------------------------------


def load_tokens(split: str, tokenizer: str | Tokenizer = DEFAULT_TOKENIZER,
                root: str | os.PathLike | None = None) -> np.ndarray:
    """Token ids of a split, shape (n_tokens,), uint16: each document's tokens then
    ``eot_id``. Cached in ``<data>/cache/`` under a key of the corpus file, the split file
    and the tokenizer's hash, so any change to them retokenizes."""
    corpus = load_corpus(root)
    tok = get_tokenizer(tokenizer, root)
    docs = corpus.docs(split)  # validates the split name
    key = sha256_bytes(f"v{CACHE_VERSION}:{corpus.key}:{split}:{tok.hash}".encode())[:16]
    cache = corpus.root / "cache"
    path = cache / f"{split}-{tok.name}-{key}.npy"
    if path.exists():
        arr = np.load(path, allow_pickle=False)
        if arr.dtype == np.uint16 and arr.ndim == 1:
            return arr
        _log(f"ignoring malformed cache file {path}")
    if tok.vocab_size > 65536:
        raise ValueError(f"{tok.name}: vocab {tok.vocab_size} does not fit uint16")
    _log(f"tokenizing {split} ({len(docs)} documents) with {tok.name}")
    from tqdm import tqdm

    parts = [tok.encode_docs([d.text for d in docs[i:i + 8]])
             for i in tqdm(range(0, len(docs), 8), desc=f"tokenize {split}", unit="8 docs",
                           file=sys.stderr, leave=False)]
    arr = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)  # (n_tokens,)
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    atomic_write_bytes(path, buf.getvalue())
    for old in cache.glob(f"{split}-{tok.name}-*.npy"):  # stale keys: a changed corpus
        if old != path:
            old.unlink(missing_ok=True)
    return arr


# ---- bits per byte ----------------------------------------------------------------------


def bits_per_byte(total_nats: float, text_bytes: int) -> float:
    """Bits per UTF-8 byte: ``total_nats / (ln 2 * text_bytes)``, where ``total_nats`` is
    the summed negative log-likelihood (natural log) of the scored tokens and
    ``text_bytes`` the UTF-8 bytes of exactly the text those tokens spell."""
    total_nats = float(total_nats)
    if not math.isfinite(total_nats) or total_nats < 0:
        raise ValueError(f"total_nats must be a finite number >= 0, got {total_nats}")
    if int(text_bytes) != text_bytes or text_bytes <= 0:
        raise ValueError(f"text_bytes must be a positive integer, got {text_bytes}")
    return total_nats / (math.log(2) * int(text_bytes))


def val_windows(seq_len: int, tokenizer: str | Tokenizer = DEFAULT_TOKENIZER,
                max_tokens: int | None = None, batch_size: int = 16,
                root: str | os.PathLike | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The (inputs, targets) batches :func:`val_bpb` scores, each (B, T) int64.

    The validation tokens are preceded by one ``eot_id`` (as if a previous document had
    just ended) and cut into non-overlapping windows of ``seq_len`` targets; a window's
    inputs are its targets shifted right by one, so its first target is conditioned on
    one token and every validation token is a target exactly once. Full windows come in
    batches of ``batch_size``; a shorter last window comes alone."""
    if int(seq_len) != seq_len or seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len}")
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
    tok = get_tokenizer(tokenizer, root)
    tokens = load_tokens("val", tok, root)  # (N,)
    n = _scored_tokens(len(tokens), max_tokens)
    stream = np.concatenate([[tok.eot_id], tokens[:n]]).astype(np.int64)  # (n + 1,)
    n_full = n // seq_len
    for b in range(0, n_full, batch_size):
        rows = range(b, min(b + batch_size, n_full))
        x = np.stack([stream[r * seq_len:(r + 1) * seq_len] for r in rows])  # (B, T)
        y = np.stack([stream[r * seq_len + 1:(r + 1) * seq_len + 1] for r in rows])  # (B, T)
        yield x, y
    if n % seq_len:
        s = n_full * seq_len
        yield stream[None, s:n], stream[None, s + 1:n + 1]  # (1, n - s) each


def _scored_tokens(n_val: int, max_tokens: int | None) -> int:
    if max_tokens is None:
        return n_val
    if int(max_tokens) != max_tokens or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer or None, got {max_tokens}")
    return min(n_val, int(max_tokens))


def val_bpb(nll_fn: NLLFn, tokenizer: str | Tokenizer = DEFAULT_TOKENIZER, seq_len: int = 256,
            max_tokens: int | None = None, batch_size: int = 16,
            root: str | os.PathLike | None = None, progress: bool = True) -> dict[str, Any]:
    """Bits per byte of a model over the validation split (or its first ``max_tokens``
    tokens, a quick estimate).

    ``nll_fn(x, y)`` gets int64 arrays (B, T) from :func:`val_windows` and returns the
    summed negative log-likelihood in nats of every ``y[b, t]`` given ``x[b, :t + 1]``,
    each row an independent sequence from an empty state (e.g. torch:
    ``F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum")``).
    Windows do not overlap, so the figure depends on ``seq_len`` (reported with it).

    Returns ``bpb`` (bits per UTF-8 byte), ``nats``, ``tokens`` (scored), ``bytes``
    (UTF-8 bytes of exactly the scored text; the whole split when ``complete``),
    ``bits_per_token``, ``seq_len``, ``windows``, ``complete``, ``tokenizer`` and
    ``tokenizer_sha256``."""
    tok = get_tokenizer(tokenizer, root)
    tokens = load_tokens("val", tok, root)  # (N,)
    n = _scored_tokens(len(tokens), max_tokens)
    from tqdm import tqdm

    nats, windows = 0.0, 0
    total = -(-n // seq_len) if seq_len >= 1 else 0
    bar = tqdm(total=total, desc=f"val bpb ({tok.name}, T={seq_len})", unit="win", file=sys.stderr,
               disable=not progress, leave=False)
    for x, y in val_windows(seq_len, tok, max_tokens=n, batch_size=batch_size, root=root):
        v = float(nll_fn(x, y))
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"nll_fn returned {v} for a batch of shape {x.shape}; it must return "
                             f"the summed negative log-likelihood in nats (finite, >= 0)")
        nats += v
        windows += x.shape[0]
        bar.update(x.shape[0])
    bar.close()
    n_bytes = int(tok.token_bytes()[tokens[:n]].sum())
    return {
        "bpb": bits_per_byte(nats, n_bytes),
        "nats": nats,
        "tokens": n,
        "bytes": n_bytes,
        "bits_per_token": nats / math.log(2) / n,
        "seq_len": int(seq_len),
        "windows": windows,
        "complete": n == len(tokens),
        "tokenizer": tok.name,
        "tokenizer_sha256": tok.hash,
    }


# ---- online corpora ---------------------------------------------------------------------

ONLINE_CORPORA = {
    "tinystories": {"path": "roneneldan/TinyStories", "field": "text",
                    "splits": {"train": "train", "val": "validation"}},
}


class OnlineCorpusError(RuntimeError):
    """An online corpus cannot be loaded here (no `datasets` package, or no network)."""


def load_online_corpus(name: str = "tinystories", split: str = "train", max_docs: int | None = None,
                       cache_dir: str | os.PathLike | None = None) -> list[str]:
    """Documents of an online corpus through the Hugging Face ``datasets`` library
    (imported only here; ``pip install "tern[online]"``), for Kaggle / Colab users. With
    ``max_docs`` it streams only that many. Offline, or without ``datasets``, it raises
    :class:`OnlineCorpusError` saying so; the shipped corpus stays the default."""
    if name not in ONLINE_CORPORA:
        raise ValueError(f"unknown online corpus {name!r}; known: {sorted(ONLINE_CORPORA)}")
    spec = ONLINE_CORPORA[name]
    if split not in spec["splits"]:
        raise ValueError(f"{name}: split must be one of {sorted(spec['splits'])}, got {split!r}")
    if max_docs is not None and (int(max_docs) != max_docs or max_docs < 1):
        raise ValueError(f"max_docs must be a positive integer or None, got {max_docs}")
    hint = ("The shipped corpus works offline: tern.data.load_tokens('train') / split_text('val').")
    try:
        import datasets
    except ImportError as e:
        raise OnlineCorpusError(
            f"load_online_corpus({name!r}) needs the `datasets` package, which is not installed: "
            f"pip install 'tern[online]' (or pip install datasets), with network access. {hint}") from e
    try:
        ds = datasets.load_dataset(spec["path"], split=spec["splits"][split], cache_dir=cache_dir,
                                   streaming=max_docs is not None)
        docs = []
        for row in ds:
            docs.append(row[spec["field"]])
            if max_docs is not None and len(docs) >= max_docs:
                break
    except Exception as e:  # datasets raises many types for a missing network / hub
        raise OnlineCorpusError(
            f"could not load {name!r} ({spec['path']}, split {spec['splits'][split]!r}) through "
            f"`datasets`: {type(e).__name__}: {e}. Is this machine offline? {hint}") from e
    return docs


# ---- statistics and CLI -----------------------------------------------------------------


def xz_bits_per_byte(text: str) -> float:
    """Size of ``text`` compressed by xz -9e (``lzma`` preset 9 | extreme, .xz container),
    in bits per UTF-8 byte: a reference point for model BPB."""
    raw = text.encode("utf-8")
    return 8 * len(lzma.compress(raw, preset=XZ_PRESET)) / len(raw)


def corpus_stats(tokenizers: tuple[str, ...] = TOKENIZERS, root: str | os.PathLike | None = None) -> dict:
    """Corpus and split sizes, tokenizer compression (bytes per token) on both splits,
    and xz -9e bits per byte of the validation text."""
    corpus = load_corpus(root)
    manifest_file = corpus.root / "corpus" / "corpus.jsonl.xz"
    out: dict[str, Any] = {
        "corpus_docs": len(corpus.documents),
        "corpus_groups": len({d.group for d in corpus.documents}),
        "corpus_text_bytes": sum(d.n_bytes for d in corpus.documents),
        "corpus_file_bytes": manifest_file.stat().st_size,
        "corpus_sha256": corpus.corpus_sha256,
        "corpus_text_sha256": corpus.text_sha256,
        "sources": {},
        "tokenizers": {},
    }
    for d in corpus.documents:
        s = out["sources"].setdefault(d.source, {"docs": 0, "text_bytes": 0})
        s["docs"] += 1
        s["text_bytes"] += d.n_bytes
    texts = {s: corpus.text(s) for s in ("train", "val")}
    for s, t in texts.items():
        out[f"{s}_docs"] = len(corpus.docs(s))
        out[f"{s}_text_bytes"] = len(t.encode("utf-8"))
        out[f"{s}_text_sha256"] = sha256_bytes(t.encode("utf-8"))
    for name in tokenizers:
        tok = get_tokenizer(name, root)
        row: dict[str, Any] = {"vocab_size": tok.vocab_size, "sha256": tok.hash, "eot_id": tok.eot_id}
        for s in ("train", "val"):
            n = len(load_tokens(s, tok, root))
            row[f"{s}_tokens"] = n
            row[f"{s}_bytes_per_token"] = out[f"{s}_text_bytes"] / n
        out["tokenizers"][name] = row
    _log("compressing the validation text with xz -9e")
    out["val_xz_bits_per_byte"] = xz_bits_per_byte(texts["val"])
    return out


