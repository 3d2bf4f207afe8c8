"""`tern data`: the shipped corpus and tokenizers from the command line."""

from __future__ import annotations

import argparse
import re
from typing import Any

from tern.data.tokenizer import DEFAULT_TOKENIZER, TOKENIZERS, get_tokenizer
from tern.data.tokens import corpus_stats

JSON_FIELDS = """\
  stats:  corpus_docs, corpus_groups (near-copy groups), corpus_text_bytes, corpus_file_bytes
          (compressed), corpus_sha256, corpus_text_sha256, sources {name: {docs, text_bytes}},
          train_/val_ docs, text_bytes, text_sha256 (split text incl. separators),
          tokenizers {name: {vocab_size, sha256, eot_id, train_/val_ tokens, bytes_per_token}},
          val_xz_bits_per_byte (xz -9e of the validation text, bits per UTF-8 byte)
  encode: tokenizer, ids, tokens, text_bytes, bytes_per_token
  decode: tokenizer, text"""


def cli_configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="data_cmd", metavar="<action>")
    st = sub.add_parser("stats", help="corpus, split, tokenizer compression, xz bits per byte (default)")
    st.add_argument("--tokenizers", nargs="+", default=list(TOKENIZERS), choices=TOKENIZERS)
    en = sub.add_parser("encode", help="token ids of a text")
    en.add_argument("text")
    en.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, choices=TOKENIZERS)
    de = sub.add_parser("decode", help="text of token ids")
    de.add_argument("ids", nargs="+", help="token ids (separated by spaces or commas)")
    de.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, choices=TOKENIZERS)
    for sp in (st, en, de):  # so that `tern data <action> ... --json` works too
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print exactly one JSON object on stdout (logs go to stderr)")


def cli_run(args: argparse.Namespace) -> dict[str, Any]:
    cmd = getattr(args, "data_cmd", None) or "stats"
    if cmd == "stats":
        return {"action": "stats", **corpus_stats(tuple(getattr(args, "tokenizers", TOKENIZERS)))}
    tok = get_tokenizer(args.tokenizer)
    if cmd == "encode":
        ids = tok.encode(args.text)
        n = len(args.text.encode("utf-8"))
        return {"action": "encode", "tokenizer": tok.name, "ids": ids, "tokens": len(ids),
                "text_bytes": n, "bytes_per_token": n / len(ids) if ids else None}
    try:
        ids = [int(x) for x in re.split(r"[,\s]+", " ".join(args.ids).strip()) if x]
    except ValueError:
        raise ValueError(f"token ids must be integers, got {' '.join(args.ids)!r}") from None
    return {"action": "decode", "tokenizer": tok.name, "text": tok.decode(ids)}


def cli_render(r: dict[str, Any]) -> str:
    if r["action"] == "encode":
        return f"{r['tokens']} {r['tokenizer']} tokens for {r['text_bytes']} bytes: {r['ids']}"
    if r["action"] == "decode":
        return r["text"]
    lines = [
        f"corpus: {r['corpus_docs']} documents in {r['corpus_groups']} near-copy groups, "
        f"{r['corpus_text_bytes'] / 1e6:.2f} MB of text ({r['corpus_file_bytes'] / 1e6:.2f} MB as .xz)",
        *(f"  {k:<12} {v['docs']:4d} docs {v['text_bytes'] / 1e6:7.2f} MB" for k, v in r["sources"].items()),
        f"split: train {r['train_text_bytes'] / 1e6:.2f} MB / {r['train_docs']} docs, "
        f"val {r['val_text_bytes'] / 1e6:.3f} MB / {r['val_docs']} docs",
        f"{'tokenizer':<10} {'vocab':>6} {'train tokens':>13} {'B/token':>8} {'val tokens':>11} {'B/token':>8}",
    ]
    for name, t in r["tokenizers"].items():
        lines.append(f"{name:<10} {t['vocab_size']:6d} {t['train_tokens']:13,d} {t['train_bytes_per_token']:8.3f}"
                     f" {t['val_tokens']:11,d} {t['val_bytes_per_token']:8.3f}")
    lines.append(f"xz -9e on the validation text: {r['val_xz_bits_per_byte']:.4f} bits/byte")
    return "\n".join(lines)
