"""`tern generate`: stream text from a packed model with the numba Engine.

    tern generate --model model.tern --prompt "Once upon a time" -n 100 --temperature 0.8

The tokenizer is the one named in the file's metadata (``--tokenizer`` overrides). Text
streams to stdout as it is generated; timing goes to stderr. With ``--json`` nothing
streams and one object is printed at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from typing import Any

JSON_FIELDS = """\
  text: generated text (prompt excluded), prompt, token_ids (generated), prompt_tokens,
  generated_tokens, tok_per_s (generation only, prompt excluded), prefill_s, decode_s,
  model, tokenizer, threads, region, layout, experts, seed, temperature, top_k, top_p, repetition_penalty"""


def cli_configure(p: argparse.ArgumentParser) -> None:
    from tern.kernels.policy import EXPERTS_MODES, LAYOUT_MODES

    p.add_argument("--model", required=True, help="packed model file (tern export)")
    p.add_argument("--prompt", default="", help="prompt text (default: the document separator)")
    p.add_argument("-n", type=int, default=100, help="tokens to generate (default 100)")
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="0: off (default 40)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (default 1: off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="CTRL-style, 1: off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="numba threads")
    p.add_argument("--per-matrix", action="store_true",
                   help="with --threads > 1: a parallel region per large matrix instead of the default "
                        "one region per token (the same text; the default is faster on small models)")
    p.add_argument("--layout", choices=LAYOUT_MODES, default="auto",
                   help="ternary matrices in memory: rows as stored, or re-packed at load into 16-row blocks "
                        "read as one stream (faster; the same text); auto (default): blocked16 on CPUs with AVX-512")
    p.add_argument("--experts", choices=EXPERTS_MODES, default="auto",
                   help="routed experts in memory: each expert's gate, up and down back to back (together: one run "
                        "per chosen expert, the same text) or three tensors as stored (apart); auto (default): "
                        "together where the experts stream from DRAM")
    p.add_argument("--tokenizer", help="tokenizer name (default: the one the file names)")


def _check_args(args: argparse.Namespace) -> None:
    """ValueError naming the flag of a bad value, before the model loads."""
    for flag, v, lo in (("-n", args.n, 0), ("--seed", args.seed, 0), ("--threads", args.threads, 1)):
        if v < lo:
            raise ValueError(f"{flag} must be an integer >= {lo}, got {v}")
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # argv bytes that are not UTF-8 arrive surrogate-escaped
        bad = args.prompt[e.start].encode("utf-8", "surrogateescape")
        raise ValueError(f"--prompt is not valid UTF-8 text (byte 0x{bad.hex()} at character "
                         f"{e.start}); pass UTF-8") from None


def cli_run(args: argparse.Namespace) -> dict[str, Any]:
    from tern.data.tokenizer import get_tokenizer
    from tern.run.engine import Engine, PastMaxSeqLenWarning

    _check_args(args)
    # the full check (crc32, ternary codes, finite weights) of every byte: a header-only
    # check lets a corrupted file decode garbage (tern.packed.reader.load_packed)
    eng = Engine(args.model, threads=args.threads, check="full", region=False if args.per_matrix else "auto",
                 layout=args.layout, experts=args.experts)
    name = args.tokenizer or (eng.model.tokenizer or {}).get("name")
    if not name:
        raise ValueError(f"{args.model} names no tokenizer; pass --tokenizer")
    tok = get_tokenizer(name)
    want = (eng.model.tokenizer or {}).get("sha256")
    if want and tok.hash != want and not args.tokenizer:
        raise ValueError(f"tokenizer {name} here has sha256 {tok.hash[:12]}..., the model was "
                         f"exported with {want[:12]}...; pass --tokenizer to override")
    if tok.vocab_size != eng.cfg.vocab_size:  # refused before decoding: ids one side cannot read
        raise ValueError(f"tokenizer {name} has {tok.vocab_size} tokens, the model {eng.cfg.vocab_size}: pass the "
                         f"tokenizer the model was trained with")
    prompt_ids = tok.encode(args.prompt) if args.prompt else [tok.eot_id]
    if len(prompt_ids) + args.n > eng.cfg.max_seq_len:
        print(f"[tern generate] note: {len(prompt_ids)} prompt + {args.n} generated tokens exceed the "
              f"model's max_seq_len {eng.cfg.max_seq_len}, the longest context it was trained on "
              f"(decoding continues; quality past it is not measured)", file=sys.stderr)
    stream = not getattr(args, "json", False)
    ids: list[int] = []
    printed = ""
    t0 = time.perf_counter()
    t_first = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PastMaxSeqLenWarning)  # said above, in one line
        for t in eng.generate(prompt_ids, args.n, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, repetition_penalty=args.repetition_penalty, seed=args.seed):
            if t_first is None:
                t_first = time.perf_counter()
            ids.append(t)
            if stream:
                text = tok.decode(ids)
                if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
                    sys.stdout.write(text[len(printed):])
                    sys.stdout.flush()
                    printed = text
    t_end = time.perf_counter()
    text = tok.decode(ids)
    if stream:
        sys.stdout.write(text[len(printed):])
        sys.stdout.flush()
    prefill = (t_first or t_end) - t0
    decode = t_end - (t_first or t_end)
    result = {
        "text": text, "prompt": args.prompt, "token_ids": ids, "prompt_tokens": len(prompt_ids),
        "generated_tokens": len(ids), "prefill_s": prefill, "decode_s": decode,
        "tok_per_s": (len(ids) - 1) / decode if len(ids) > 1 and decode > 0 else None,
        "model": str(args.model), "tokenizer": name, "threads": args.threads, "region": eng.region, "layout": eng.layout,
        "experts": eng.experts,
        "seed": args.seed,
        "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
        "repetition_penalty": args.repetition_penalty,
    }
    tps = result["tok_per_s"]
    print(f"\n[tern generate] {len(ids)} tokens, {tps:.0f} tok/s" if tps else
          f"\n[tern generate] {len(ids)} tokens", file=sys.stderr)
    return result


def cli_render(result: dict[str, Any]) -> str:
    return ""  # the text was streamed; the final newline ends it
