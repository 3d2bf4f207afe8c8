"""Random-weight llama-architecture GGUF files with a tern ModelConfig's dimensions, for
llama.cpp's ``llama-bench`` beside tern's engine (``tern bench peers``).

One ModelConfig describes both files, so "the same dimensions" holds by construction:

- every layer attention (``attn_layers`` covering all layers), no SSM layers;
- a dense SiLU gated MLP (``mlp_hidden``) in every layer, or a Mixtral-style MoE in every
  layer (``n_experts`` x ``expert_hidden``, top ``top_k``, no shared experts);
- ternary matrices (ternary2 / ternary_b3 in tern) are written as TQ2_0 (2.0625 bits per weight;
  TQ1_0, 1.6875 bits, as an option); tern's dense formats map to GGUF types: fp16 -> F16,
  bf16 -> BF16, fp32 -> F32, int8 -> Q8_0 (embedding, head, router); norms are F32.

Grouped-query attention (``n_kv_heads`` below ``n_heads``) exists only on the GGUF side:
tern's ModelConfig has no such option, so such a pair is compared per byte read.

Weights are random: each ternary block holds random valid codes (every 2-bit field of TQ2_0
uniform on {-1, 0, +1}, every base-3 digit of TQ1_0 likewise) and the row scale
1/sqrt(cols) as its fp16 ``d`` - the bytes ``gguf.quants.quantize`` writes for a random
ternary matrix, generated directly (gguf-py's quantizer runs at ~45 M weights/s, minutes
for a 10B model); tests check that the blocks round-trip through gguf-py's quantizer.
Dense tensors are normal(0, 1/sqrt(d_model)); gguf-py quantizes the Q8_0 ones.

The dummy tokenizer is a SentencePiece ("llama") vocabulary of the model's size: <unk>,
<s>, </s>, the 256 byte tokens and filler pieces; llama-bench feeds random token ids and
never tokenizes text, but llama.cpp's loader reads the vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tern.core.config import ModelConfig
from tern.packed.format import TERNARY_FORMATS

BODY_QTYPES = ("TQ2_0", "TQ1_0")
DENSE_QTYPES = {"fp16": "F16", "bf16": "BF16", "fp32": "F32", "int8": "Q8_0"}
GGUF_WRITER_VERSION = 1  # bump when the files written change
ROPE_FREQ_BASE = 10000.0
_CHUNK_WEIGHTS = 1 << 24  # weights generated per chunk (bounded memory for 10B models)


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise ValueError("writing GGUF files needs the gguf package: pip install 'tern[peers]' "
                         "(or pip install 'gguf>=0.10')") from None
    return gguf


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the GGUF: ``shape`` in numpy order (outermost first, the ggml ne
    reversed), ``qtype`` a GGMLQuantizationType name, ``pool`` as tern counts it
    (table: one row read per token; streamed: top_k of n_experts read per token)."""

    name: str
    shape: tuple[int, ...]
    qtype: str
    pool: str = "resident"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        block, size = _gguf().GGML_QUANT_SIZES[_gguf().GGMLQuantizationType[self.qtype]]
        return self.numel // block * size


def check_peer_config(cfg: ModelConfig) -> None:
    """Raise ValueError (one line, every reason) unless ``cfg`` has a llama equivalent."""
    why = []
    if sorted(cfg.attn_layers) != list(range(cfg.n_layers)):
        why.append("every layer must be attention (attn_layers covering all layers; llama has no SSM)")
    if cfg.activation != "silu":
        why.append(f"activation must be silu (llama's gated MLP), got {cfg.activation}")
    if cfg.moe_layers:
        if sorted(cfg.moe_layers) != list(range(cfg.n_layers)):
            why.append("MoE must be in every layer (Mixtral-style) or in none")
        if cfg.n_shared:
            why.append("shared experts have no llama equivalent (n_shared must be 0)")
        if cfg.expert_format not in TERNARY_FORMATS:
            why.append(f"expert_format must be ternary, got {cfg.expert_format}")
    elif not cfg.mlp_hidden:
        why.append("needs a dense MLP (mlp_hidden > 0) or MoE in every layer")
    for f in ("mixer_format", "mlp_format"):
        if getattr(cfg, f) not in TERNARY_FORMATS:
            why.append(f"{f} must be ternary, got {getattr(cfg, f)}")
    if why:
        raise ValueError(f"config {cfg.name!r} has no llama.cpp equivalent: " + "; ".join(why))


def gguf_tensors(cfg: ModelConfig, body: str = "TQ2_0", n_kv_heads: int | None = None) -> list[GGUFTensor]:
    """The llama-architecture tensor list of ``cfg`` (llama.cpp's names and order)."""
    check_peer_config(cfg)
    if body not in BODY_QTYPES:
        raise ValueError(f"body type must be one of {BODY_QTYPES}, got {body!r}")
    D, V, hd = cfg.d_model, cfg.vocab_size, cfg.head_dim
    kv = _kv_heads(cfg, n_kv_heads)
    emb, head, router = (DENSE_QTYPES[cfg.embed_format], DENSE_QTYPES[cfg.head_format],
                         DENSE_QTYPES[cfg.router_format])
    out = [GGUFTensor("token_embd.weight", (V, D), emb, "table")]
    for i in range(cfg.n_layers):
        b = f"blk.{i}"
        out += [GGUFTensor(f"{b}.attn_norm.weight", (D,), "F32"),
                GGUFTensor(f"{b}.attn_q.weight", (D, D), body),
                GGUFTensor(f"{b}.attn_k.weight", (kv * hd, D), body),
                GGUFTensor(f"{b}.attn_v.weight", (kv * hd, D), body),
                GGUFTensor(f"{b}.attn_output.weight", (D, D), body),
                GGUFTensor(f"{b}.ffn_norm.weight", (D,), "F32")]
        if cfg.moe_layers:
            E, H = cfg.n_experts, cfg.expert_hidden
            out += [GGUFTensor(f"{b}.ffn_gate_inp.weight", (E, D), router),
                    GGUFTensor(f"{b}.ffn_gate_exps.weight", (E, H, D), body, "streamed"),
                    GGUFTensor(f"{b}.ffn_down_exps.weight", (E, D, H), body, "streamed"),
                    GGUFTensor(f"{b}.ffn_up_exps.weight", (E, H, D), body, "streamed")]
        else:
            H = cfg.mlp_hidden
            out += [GGUFTensor(f"{b}.ffn_gate.weight", (H, D), body),
                    GGUFTensor(f"{b}.ffn_down.weight", (D, H), body),
                    GGUFTensor(f"{b}.ffn_up.weight", (H, D), body)]
    out.append(GGUFTensor("output_norm.weight", (D,), "F32"))
    if not cfg.tie_embeddings:
        out.append(GGUFTensor("output.weight", (V, D), head))
    _check_blocks(out)
    return out


def _kv_heads(cfg: ModelConfig, n_kv_heads: int | None) -> int:
    kv = cfg.n_heads if n_kv_heads is None else n_kv_heads
    if not isinstance(kv, int) or kv < 1 or cfg.n_heads % kv:
        raise ValueError(f"n_kv_heads must divide n_heads={cfg.n_heads}, got {n_kv_heads!r}")
    return kv


def _check_blocks(tensors: list[GGUFTensor]) -> None:
    g = _gguf()
    for t in tensors:
        block = g.GGML_QUANT_SIZES[g.GGMLQuantizationType[t.qtype]][0]
        if t.shape[-1] % block:
            raise ValueError(f"{t.name}: rows of {t.shape[-1]} weights are not a multiple of "
                             f"{t.qtype}'s {block}-weight block (choose d_model / hidden sizes that are)")


def gguf_byte_counts(cfg: ModelConfig, tensors: list[GGUFTensor]) -> dict[str, int]:
    """Total bytes and parameters of the tensors, and those one decoded token reads (the
    active path: one embedding row, every resident tensor, top_k of n_experts of each
    expert tensor; a tied head reads the whole table)."""
    out = dict.fromkeys(("total_bytes", "total_params", "active_bytes", "active_params"), 0)
    for t in tensors:
        rows = 1 if t.pool == "table" and not cfg.tie_embeddings else (
            cfg.top_k if t.pool == "streamed" else t.shape[0])
        out["total_bytes"] += t.nbytes
        out["total_params"] += t.numel
        out["active_bytes"] += t.nbytes // t.shape[0] * rows
        out["active_params"] += t.numel // t.shape[0] * rows
    return out


def gguf_key(cfg: ModelConfig, body: str = "TQ2_0", n_kv_heads: int | None = None) -> str:
    """A short hash naming the GGUF of (cfg, body, n_kv_heads) in a cache folder."""
    blob = json.dumps({"config": cfg.to_dict(), "body": body, "kv": n_kv_heads, "v": GGUF_WRITER_VERSION},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# ---- random blocks ---------------------------------------------------------------------------


def _trit_bytes(digits: int, shift: int) -> np.ndarray:
    """Every valid byte of ``digits`` ternary codes: 2-bit fields (TQ2_0, shift 2) or the
    base-3 fixed point TQ1_0 stores (shift 0: ceil(v * 256 / 243), v = the digits read as a
    base-3 number scaled to 5 digits)."""
    codes = np.arange(3 ** digits)
    if shift:
        out = np.zeros_like(codes)
        for k in range(digits):
            out |= (codes // 3 ** k % 3) << (shift * k)
        return out.astype(np.uint8)
    v = codes * 3 ** (5 - digits)
    return ((v * 256 + 242) // 243).astype(np.uint8)


def random_ternary_blocks(qtype: str, rows: int, cols: int, rng: np.random.Generator,
                          scale: float | None = None) -> np.ndarray:
    """(rows, cols / 256 * block bytes) uint8: random ternary rows in TQ2_0 or TQ1_0 blocks,
    every code uniform on {-1, 0, +1}, ``d`` = ``scale`` (default 1 / sqrt(cols))."""
    if qtype not in BODY_QTYPES:
        raise ValueError(f"qtype must be one of {BODY_QTYPES}, got {qtype!r}")
    if cols % 256:
        raise ValueError(f"{qtype} rows must be a multiple of 256 weights, got {cols}")
    nb = rows * (cols // 256)
    d = np.full((nb, 1), scale if scale is not None else 1.0 / math.sqrt(cols), np.float16).view(np.uint8)
    if qtype == "TQ2_0":  # 64 bytes of four 2-bit codes, then d
        qs = _trit_bytes(4, 2)[rng.integers(0, 81, size=(nb, 64), dtype=np.uint8)]
    else:  # 48 bytes of five base-3 digits, 4 bytes of four, then d
        qs = np.concatenate([_trit_bytes(5, 0)[rng.integers(0, 243, size=(nb, 48), dtype=np.uint8)],
                             _trit_bytes(4, 0)[rng.integers(0, 81, size=(nb, 4), dtype=np.uint8)]], axis=1)
    return np.concatenate([qs, d], axis=1).reshape(rows, -1)


def _random_tensor(t: GGUFTensor, rng: np.random.Generator, d_model: int) -> np.ndarray:
    """The bytes of ``t`` (numpy array in the layout GGUFWriter stores)."""
    g = _gguf()
    if t.qtype == "F32":  # norms
        return np.ones(t.shape, np.float32)
    cols = t.shape[-1]
    rows = t.numel // cols
    step = max(1, _CHUNK_WEIGHTS // cols)
    parts = []
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        if t.qtype in BODY_QTYPES:
            parts.append(random_ternary_blocks(t.qtype, n, cols, rng))
            continue
        x = rng.standard_normal((n, cols), dtype=np.float32) * np.float32(1.0 / math.sqrt(d_model))
        q = g.quants.quantize(x, g.GGMLQuantizationType[t.qtype])
        parts.append(q.view(np.uint8) if t.qtype in ("Q8_0", "BF16") else q)
    data = np.concatenate(parts, axis=0)
    return data.reshape(*t.shape[:-1], data.shape[-1])


# ---- writing --------------------------------------------------------------------------------


def _dummy_vocab(V: int) -> tuple[list[str], list[int]]:
    """SentencePiece pieces and token types (1 normal, 2 unknown, 3 control, 6 byte)."""
    pieces, types = ["<unk>", "<s>", "</s>"], [2, 3, 3]
    if V >= 3 + 256:
        pieces += [f"<0x{b:02X}>" for b in range(256)]
        types += [6] * 256
    pieces += [f"t{i}" for i in range(V - len(pieces))]
    types += [1] * (V - len(types))
    return pieces[:V], types[:V]


def write_gguf(cfg: ModelConfig, path: str | os.PathLike, body: str = "TQ2_0",
               n_kv_heads: int | None = None, seed: int = 0, progress: bool = False) -> Path:
    """Write the random llama GGUF of ``cfg`` to ``path`` (temp file + rename); returns it."""
    g = _gguf()
    tensors = gguf_tensors(cfg, body, n_kv_heads)
    if cfg.vocab_size < 3:
        raise ValueError("the dummy vocabulary needs vocab_size >= 3 (<unk>, <s>, </s>)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    rng = np.random.default_rng(seed)
    w = g.GGUFWriter(str(tmp), "llama")
    try:
        w.add_name(cfg.name)
        w.add_context_length(cfg.attn_window)
        w.add_embedding_length(cfg.d_model)
        w.add_block_count(cfg.n_layers)
        w.add_feed_forward_length(cfg.expert_hidden if cfg.moe_layers else cfg.mlp_hidden)
        w.add_head_count(cfg.n_heads)
        w.add_head_count_kv(_kv_heads(cfg, n_kv_heads))
        w.add_rope_dimension_count(cfg.head_dim)
        w.add_rope_freq_base(ROPE_FREQ_BASE)
        w.add_layer_norm_rms_eps(cfg.norm_eps)
        w.add_vocab_size(cfg.vocab_size)
        if cfg.moe_layers:
            w.add_expert_count(cfg.n_experts)
            w.add_expert_used_count(cfg.top_k)
        w.add_file_type(g.LlamaFileType[f"MOSTLY_{body}"])
        pieces, types = _dummy_vocab(cfg.vocab_size)
        w.add_tokenizer_model("llama")
        w.add_token_list(pieces)
        w.add_token_scores([0.0] * len(pieces))
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        for t in tensors:
            qt = g.GGMLQuantizationType[t.qtype]
            if t.qtype in ("F32", "F16"):
                dtype = np.float32 if t.qtype == "F32" else np.float16
                w.add_tensor_info(t.name, t.shape, np.dtype(dtype), t.nbytes)
            else:
                byte_shape = g.quant_shape_to_byte_shape(t.shape, qt)
                w.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), t.nbytes, raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for i, t in enumerate(tensors):
            if progress:
                print(f"\rgguf {path.name}: tensor {i + 1}/{len(tensors)}", end="", file=sys.stderr)
            w.write_tensor_data(_random_tensor(t, rng, cfg.d_model))
        if progress:
            print(file=sys.stderr)
        w.close()
        os.replace(tmp, path)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise
    return path


def ensure_gguf(cfg: ModelConfig, models_dir: str | os.PathLike, body: str = "TQ2_0",
                n_kv_heads: int | None = None, progress: bool = False) -> Path:
    """The cached GGUF of (cfg, body, n_kv_heads) under ``models_dir`` (written once)."""
    path = Path(models_dir) / f"{cfg.name}-{gguf_key(cfg, body, n_kv_heads)}.gguf"
    if not path.exists():
        Path(str(path) + ".tmp").unlink(missing_ok=True)  # a stale temp file of an interrupted write
        write_gguf(cfg, path, body, n_kv_heads, progress=progress)
    return path
