"""The packed model file's format: constants, tensor layout and the header (see
tern.packed for the full description)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tern.core.config import ModelConfig, TensorSpec, tensor_specs
from tern.core.records import git_commit

FORMAT_NAME = "tern.packed"


FORMAT_VERSION = 1


ALIGN_BYTES = 64  # every tensor's data starts at a multiple of this (file offset)


MAX_HEADER_BYTES = 100 * 2**20


TERNARY_FORMATS = ("ternary2", "ternary_b3")


DENSE_FORMATS = ("fp32", "fp16", "bf16")


STORABLE_FORMATS = TERNARY_FORMATS + DENSE_FORMATS + ("int8",)


CHECKS = ("full", "header")


_PAD_PREFIX = "__pad__."


_CHUNK_ELEMS = 1 << 22  # weights generated / converted per chunk while writing


# safetensors dtype -> (numpy dtype, bytes per element)
_DTYPES: dict[str, tuple[np.dtype, int]] = {
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),  # raw bfloat16 bits; to_float32() converts
    "I8": (np.dtype("i1"), 1),
    "U8": (np.dtype("u1"), 1),
}


_DENSE_DTYPE = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of the safetensors container."""

    name: str
    dtype: str  # safetensors dtype: F32 F16 BF16 I8 U8
    shape: tuple[int, ...]
    spec: str  # the TensorSpec name it belongs to ("" for padding)
    role: str  # "packed", "scale", "q", "weight" or "pad"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _DTYPES[self.dtype][1]


def is_transposed(spec: TensorSpec) -> bool:
    """Down projections are stored transposed (one packed row per hidden unit), which is
    what the activation-skip kernel reads (tern.kernels.kernels_ternary.ternary_matvec_skip)."""
    return spec.group in ("mlp", "shared", "experts") and spec.name.endswith((".down", ".down.weight"))


def _row_bytes(fmt: str, cols: int) -> int:
    from tern.kernels.packing import ternary2_row_bytes, ternary_b3_row_bytes

    return ternary2_row_bytes(cols) if fmt == "ternary2" else ternary_b3_row_bytes(cols)


def spec_packing(spec: TensorSpec) -> dict[str, Any]:
    """How one TensorSpec is stored (the ``packing`` metadata entry of the file)."""
    fmt = spec.format
    if fmt not in STORABLE_FORMATS:
        raise ValueError(f"tensor {spec.name}: format {fmt!r} cannot be stored in a packed file "
                         f"(supported: {', '.join(STORABLE_FORMATS)})")
    cols = spec.shape[-1]
    rows = spec.shape[-2] if len(spec.shape) > 1 else 1  # output rows of one matrix
    p: dict[str, Any] = {"format": fmt, "orientation": "rows", "rows": rows, "cols": cols}
    if fmt in TERNARY_FORMATS:
        if len(spec.shape) < 2:
            raise ValueError(f"tensor {spec.name}: ternary format needs a matrix, got shape {spec.shape}")
        if is_transposed(spec):
            p["orientation"] = "transposed"
            p["row_bytes"] = _row_bytes(fmt, rows)
        else:
            p["row_bytes"] = _row_bytes(fmt, cols)
    elif fmt == "int8" and len(spec.shape) < 2:
        raise ValueError(f"tensor {spec.name}: int8 format needs a matrix, got shape {spec.shape}")
    return p


def file_layout(cfg: ModelConfig) -> tuple[list[StoredTensor], dict[str, dict[str, Any]]]:
    """The stored tensors (without padding) and the packing entry per spec of ``cfg``."""
    out: list[StoredTensor] = []
    packing: dict[str, dict[str, Any]] = {}
    for s in tensor_specs(cfg):
        p = spec_packing(s)
        packing[s.name] = p
        lead, rows_shape = s.shape[:-2], s.shape[:-1]
        if p["format"] in TERNARY_FORMATS:
            stored_rows = p["cols"] if p["orientation"] == "transposed" else p["rows"]
            out.append(StoredTensor(f"{s.name}.packed", "U8", (*lead, stored_rows, p["row_bytes"]),
                                    s.name, "packed"))
            out.append(StoredTensor(f"{s.name}.scale", "F32", rows_shape, s.name, "scale"))
        elif p["format"] == "int8":
            out.append(StoredTensor(f"{s.name}.q", "I8", s.shape, s.name, "q"))
            out.append(StoredTensor(f"{s.name}.scale", "F32", rows_shape, s.name, "scale"))
        else:
            out.append(StoredTensor(s.name, _DENSE_DTYPE[p["format"]], s.shape, s.name, "weight"))
    return out, packing


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _header_digest(header: dict[str, Any]) -> str:
    h = dict(header)
    meta = dict(h["__metadata__"])
    meta.pop("header_sha256", None)
    h["__metadata__"] = meta
    return hashlib.sha256(_canonical(h)).hexdigest()


def _build_header(tensors: list[StoredTensor], meta: dict[str, str],
                  crcs: dict[str, int]) -> tuple[bytes, list[StoredTensor], dict[str, tuple[int, int]]]:
    """Header bytes (padded so data starts aligned), the tensor list with padding tensors,
    and the data offsets (relative to the data start). Its length does not depend on
    the crc values (fixed-width hex), so the header can be rewritten in place."""
    def offsets_and_pads(hdr_len: int) -> tuple[list[StoredTensor], dict[str, tuple[int, int]]]:
        data_start = 8 + hdr_len
        full: list[StoredTensor] = []
        offs: dict[str, tuple[int, int]] = {}
        pos = 0
        for t in tensors:
            gap = (-(data_start + pos)) % ALIGN_BYTES
            if gap:
                pad = StoredTensor(f"{_PAD_PREFIX}{len(full)}", "U8", (gap,), "", "pad")
                full.append(pad)
                offs[pad.name] = (pos, pos + gap)
                pos += gap
            full.append(t)
            offs[t.name] = (pos, pos + t.nbytes)
            pos += t.nbytes
        return full, offs

    def encode(full: list[StoredTensor], offs: dict[str, tuple[int, int]]) -> bytes:
        m = dict(meta)
        m["crc32"] = json.dumps({t.name: f"{crcs.get(t.name, 0):08x}" for t in full}, sort_keys=True)
        h: dict[str, Any] = {"__metadata__": m}
        for t in full:
            h[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": list(offs[t.name])}
        m["header_sha256"] = _header_digest(h)
        return json.dumps(h, sort_keys=True).encode("utf-8")

    # The padding depends on the header length and vice versa: iterate to a fixed point
    # with a header length rounded up to ALIGN_BYTES (space-padded JSON).
    hdr_len = ALIGN_BYTES - 8
    for _ in range(16):
        full, offs = offsets_and_pads(hdr_len)
        raw = encode(full, offs)
        need = -(-(len(raw) + 8) // ALIGN_BYTES) * ALIGN_BYTES - 8
        if need == hdr_len:
            return raw + b" " * (hdr_len - len(raw)), full, offs
        hdr_len = need
    raise RuntimeError("packed header layout did not converge")  # pragma: no cover


def _metadata(cfg: ModelConfig, packing: dict[str, Any], tokenizer: dict[str, str] | None,
              creator: dict[str, Any]) -> dict[str, str]:
    return {
        "format": FORMAT_NAME,
        "version": str(FORMAT_VERSION),
        "config": cfg.to_json(),
        "packing": json.dumps(packing, sort_keys=True),
        "tokenizer": json.dumps(tokenizer, sort_keys=True),
        "creator": json.dumps(creator, sort_keys=True),
    }


def _creator(function: str, **extra: Any) -> dict[str, Any]:
    from tern import __version__

    return {"tool": f"tern {__version__}", "function": function, "git_commit": git_commit(),
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **extra}


def packed_file_bytes(cfg: ModelConfig, tokenizer: dict[str, str] | None, creator: dict[str, Any]) -> int:
    """Bytes of the packed file of ``cfg`` written with this metadata: the length word, the
    header and the data with its alignment pads (the crcs are fixed-width hex: their values
    do not change the length)."""
    tensors, packing = file_layout(cfg)
    header, full, _ = _build_header(tensors, _metadata(cfg, packing, tokenizer, creator), {})
    return file_bytes(header, full)


def file_bytes(header: bytes, full: list[StoredTensor]) -> int:
    """Bytes of a packed file: its 8-byte header length, the header and the data (``full``: with the pads)."""
    return 8 + len(header) + sum(t.nbytes for t in full)


def default_tokenizer(cfg: ModelConfig) -> str | None:
    """The kit's default tokenizer name when its vocabulary size is the config's, else None
    (what a random model records when no tokenizer is given)."""
    try:
        from tern.data.tokenizer import DEFAULT_TOKENIZER, get_tokenizer

        return DEFAULT_TOKENIZER if get_tokenizer(DEFAULT_TOKENIZER).vocab_size == cfg.vocab_size else None
    except (ValueError, OSError, ImportError):
        return None


def tokenizer_identity(tokenizer: Any) -> dict[str, str] | None:
    """``{"name", "sha256"}`` of a tokenizer given as an object with ``name`` and ``hash``
    (tern.data.tokenizer), a dict with those keys, or a name (resolved with
    tern.data.tokenizer.get_tokenizer when it can be, else stored with an empty hash); None for None."""
    if tokenizer is None:
        return None
    if isinstance(tokenizer, str):
        try:
            from tern.data.tokenizer import get_tokenizer

            tokenizer = get_tokenizer(tokenizer)
        except (ValueError, OSError, ImportError):
            return {"name": tokenizer, "sha256": ""}
    if isinstance(tokenizer, dict):
        if not isinstance(tokenizer.get("name"), str):
            raise ValueError(f"tokenizer identity needs a 'name' string, got {tokenizer!r}")
        return {"name": tokenizer["name"], "sha256": str(tokenizer.get("sha256", ""))}
    name, digest = getattr(tokenizer, "name", None), getattr(tokenizer, "hash", "")
    if not isinstance(name, str) or not isinstance(digest, str):
        raise ValueError(f"cannot tell the name and hash of tokenizer {tokenizer!r}")
    return {"name": name, "sha256": digest}
