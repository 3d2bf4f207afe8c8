"""The validating, memory-mapped reader of packed model files."""

from __future__ import annotations

import json
import math
import mmap
import os
import stat
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tern.core.config import ModelConfig
from tern.packed.format import (
    _DTYPES,
    _PAD_PREFIX,
    ALIGN_BYTES,
    CHECKS,
    DENSE_FORMATS,
    FORMAT_NAME,
    FORMAT_VERSION,
    MAX_HEADER_BYTES,
    TERNARY_FORMATS,
    _header_digest,
    file_layout,
)

# what check="header" leaves unverified (load_packed)
HEADER_CHECK_SKIPS = ("tensor data crc32 (flipped bits in the weights)", "non-finite (NaN / inf) weights",
                      "invalid ternary codes")


@dataclass
class PackedModel:
    """A validated, memory-mapped packed file. ``tensors[name]`` are read-only numpy views
    into the file; ``buffer`` is the whole file as uint8 and ``offsets[name]`` each stored
    tensor's absolute byte offset in it (for the engine's flat tables)."""

    path: Path
    cfg: ModelConfig
    packing: dict[str, dict[str, Any]]
    tokenizer: dict[str, str] | None
    creator: dict[str, Any]
    tensors: dict[str, np.ndarray]
    offsets: dict[str, int]
    buffer: np.ndarray
    file_bytes: int
    _mmap: mmap.mmap | None = field(default=None, repr=False)

    def weight(self, name: str) -> np.ndarray:
        """Spec tensor ``name`` as fp32 (dense formats; int8 dequantized). Not for ternary."""
        p = self.packing[name]
        if p["format"] in TERNARY_FORMATS:
            raise ValueError(f"{name} is ternary; use ternary(name)")
        if p["format"] == "int8":
            return self.tensors[f"{name}.q"].astype(np.float32) * self.tensors[f"{name}.scale"][..., None]
        return to_float32(self.tensors[name], p["format"])

    def ternary(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Spec tensor ``name`` unpacked: (wt int8 spec shape, scale f32 spec shape[:-1])."""
        from tern.kernels.packing import unpack_ternary2, unpack_ternary_b3

        p = self.packing[name]
        unpack = unpack_ternary2 if p["format"] == "ternary2" else unpack_ternary_b3
        pk = self.tensors[f"{name}.packed"]
        lead = pk.shape[:-2]
        flat = pk.reshape(-1, *pk.shape[-2:])
        tr = p["orientation"] == "transposed"
        mats = [unpack(m, p["rows"] if tr else p["cols"]) for m in flat]
        wt = np.stack([m.T if tr else m for m in mats]).reshape(*lead, p["rows"], p["cols"])
        return wt, np.asarray(self.tensors[f"{name}.scale"])

    def close(self) -> None:
        self.tensors = {}
        self.buffer = np.empty(0, np.uint8)
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:  # views still alive elsewhere: the OS unmaps on collection
                pass
            self._mmap = None

    def __enter__(self) -> PackedModel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def to_float32(a: np.ndarray, fmt: str) -> np.ndarray:
    """fp32 copy of a stored dense tensor (bf16 stored as raw uint16 bits)."""
    if fmt == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def regular_file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read as a file ("does not exist", "is a directory, not a
    file", ...), or None when it is a regular file."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a device, pipe or socket)"
    return None


def read_header(path: str | os.PathLike) -> tuple[dict[str, Any], int]:
    """The parsed JSON header of a packed file and its length in bytes (FileNotFoundError
    when it does not exist; ValueError when it is not a regular file or not a readable
    safetensors container)."""
    path = Path(path)
    problem = regular_file_problem(path)
    if problem == "does not exist":
        raise FileNotFoundError(f"packed model {path} does not exist")
    if problem:
        raise ValueError(f"packed model {path} {problem}")
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"{path}: not a packed model (file of {size} bytes is too short)")
            (n,) = struct.unpack("<Q", head)
            if n < 2 or n > MAX_HEADER_BYTES or 8 + n > size:
                raise ValueError(f"{path}: not a packed model or truncated (header length {n} bytes, "
                                 f"file {size} bytes)")
            raw = f.read(n)
    except OSError as e:
        raise ValueError(f"packed model {path} cannot be read ({e.strerror or e})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: corrupted header (not valid JSON: {e})") from None
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__"), dict):
        raise ValueError(f"{path}: header has no __metadata__ dict: not a tern packed model")
    return header, n


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _meta_json(path: Path, meta: dict[str, Any], key: str) -> Any:
    if key not in meta or not isinstance(meta[key], str):
        raise ValueError(f"{path}: metadata lacks '{key}'")
    try:
        return json.loads(meta[key])
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: metadata '{key}' is not valid JSON ({e})") from None


def load_packed(path: str | os.PathLike, check: str = "full") -> PackedModel:
    """Open, validate and memory-map a packed model; ValueError naming any problem.

    ``check="header"`` verifies format, version, header checksum, config, every tensor's
    dtype/shape/packing against the config, data offsets inside the file and finite scales;
    ``"full"`` also verifies each tensor's crc32 and that every ternary code is valid (reads
    the whole file once).

    What ``"header"`` does NOT cover (:data:`HEADER_CHECK_SKIPS`): the tensor data itself.
    A flipped bit in the weights, NaN / inf weights and invalid ternary codes all pass it,
    and an engine on such a file decodes garbage. Use it only for a file that passed a full
    check before (e.g. re-opening a just-written file); ``tern generate`` and ``Engine``
    default to ``"full"``.
    """
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
    path = Path(path)
    header, n = read_header(path)
    meta = header["__metadata__"]
    if meta.get("format") != FORMAT_NAME:
        raise ValueError(f"{path}: format is {meta.get('format')!r}, expected {FORMAT_NAME!r}")
    if meta.get("version") != str(FORMAT_VERSION):
        raise ValueError(f"{path}: packed format version {meta.get('version')!r} is not supported "
                         f"(this tern reads version {FORMAT_VERSION})")
    if meta.get("header_sha256") != _header_digest(header):
        raise ValueError(f"{path}: header checksum mismatch (corrupted header)")
    try:
        cfg = ModelConfig.from_dict(_meta_json(path, meta, "config"))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: invalid config: {e}") from None
    try:
        expected, packing = file_layout(cfg)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    if _meta_json(path, meta, "packing") != packing:
        raise ValueError(f"{path}: per-tensor packing metadata does not match what this tern "
                         f"writes for the config")
    tokenizer = _meta_json(path, meta, "tokenizer")
    if tokenizer is not None and not (isinstance(tokenizer, dict) and isinstance(tokenizer.get("name"), str)
                                      and isinstance(tokenizer.get("sha256", ""), str)):
        raise ValueError(f"{path}: metadata 'tokenizer' must be null or {{name, sha256}} strings")
    creator = _meta_json(path, meta, "creator")
    if not isinstance(creator, dict):
        raise ValueError(f"{path}: metadata 'creator' is not a dict")
    crcs = _meta_json(path, meta, "crc32")

    size = path.stat().st_size
    data_start = 8 + n
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    names = {t.name for t in expected}
    missing = [t.name for t in expected if t.name not in entries]
    if missing:
        raise ValueError(f"{path}: missing tensor(s) {missing[:5]}")
    extra = [k for k in entries if k not in names and not k.startswith(_PAD_PREFIX)]
    if extra:
        raise ValueError(f"{path}: unexpected tensor(s) {extra[:5]}")
    spans = []
    for k, e in entries.items():
        try:
            dt, shape, (b, end) = e["dtype"], tuple(e["shape"]), e["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: malformed header entry for {k}") from None
        if not isinstance(dt, str) or dt not in _DTYPES or not all(_is_count(s) for s in shape):
            raise ValueError(f"{path}: tensor {k} has bad dtype/shape {dt!r} {list(shape)}")
        if not (_is_count(b) and _is_count(end) and b <= end):
            raise ValueError(f"{path}: tensor {k} has bad data offsets {e['data_offsets']}")
        if end - b != math.prod(shape) * _DTYPES[dt][1]:
            raise ValueError(f"{path}: tensor {k}: data offsets span {end - b} bytes, its shape "
                             f"{list(shape)} {dt} needs {math.prod(shape) * _DTYPES[dt][1]}")
        if data_start + end > size:
            raise ValueError(f"{path}: truncated file: tensor {k} ends at byte {data_start + end}, "
                             f"file has {size} bytes")
        if (data_start + b) % ALIGN_BYTES and end > b and not k.startswith(_PAD_PREFIX):
            raise ValueError(f"{path}: tensor {k} is not {ALIGN_BYTES}-byte aligned")
        spans.append((b, end, k))
    spans.sort()
    pos = 0
    for b, end, k in spans:
        if b != pos:
            raise ValueError(f"{path}: tensor {k} starts at {b}, expected {pos} (overlap or hole)")
        pos = end
    if data_start + pos != size:
        raise ValueError(f"{path}: file has {size - data_start - pos} bytes after the last tensor")
    for t in expected:
        e = entries[t.name]
        if e["dtype"] != t.dtype or tuple(e["shape"]) != t.shape:
            raise ValueError(f"{path}: tensor {t.name} is {e['dtype']} {e['shape']}, the config "
                             f"needs {t.dtype} {list(t.shape)}")

    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    buffer = np.frombuffer(mm, dtype=np.uint8)
    tensors: dict[str, np.ndarray] = {}
    offsets: dict[str, int] = {}
    for t in expected:
        b, end = entries[t.name]["data_offsets"]
        off = data_start + b
        offsets[t.name] = off
        np_dt = _DTYPES[t.dtype][0]
        tensors[t.name] = buffer[off:data_start + end].view(np_dt).reshape(t.shape)
    model = PackedModel(path, cfg, packing, tokenizer, creator, tensors, offsets, buffer, size, mm)
    try:
        _check_values(model, check, crcs, entries, data_start)
    except ValueError:
        model.close()
        raise
    return model


def _check_values(m: PackedModel, check: str, crcs: Any, entries: dict[str, Any], data_start: int) -> None:
    for name, p in m.packing.items():
        if p["format"] in TERNARY_FORMATS or p["format"] == "int8":
            s = m.tensors[f"{name}.scale"]
            if not np.all(np.isfinite(s)):
                raise ValueError(f"{m.path}: tensor {name} has non-finite scales")
    if check != "full":
        return
    if not isinstance(crcs, dict):
        raise ValueError(f"{m.path}: metadata crc32 is not a dict")
    for k, e in entries.items():
        b, end = e["data_offsets"]
        got = zlib.crc32(m.buffer[data_start + b:data_start + end])
        if f"{got:08x}" != crcs.get(k):
            raise ValueError(f"{m.path}: tensor {k} is corrupted (crc32 {got:08x}, header says {crcs.get(k)})")
    for name, p in m.packing.items():
        if p["format"] in TERNARY_FORMATS:
            if not codes_valid(m.tensors[f"{name}.packed"], p["format"]):
                raise ValueError(f"{m.path}: tensor {name} holds invalid {p['format']} codes")
        elif p["format"] in DENSE_FORMATS:
            if not np.all(np.isfinite(to_float32(m.tensors[name], p["format"]))):
                raise ValueError(f"{m.path}: tensor {name} has non-finite values")


def codes_valid(packed: np.ndarray, fmt: str) -> bool:
    """True when every byte of ``packed`` is a valid ``fmt`` byte (ternary2: no code 3;
    ternary_b3: byte <= 242)."""
    flat = packed.reshape(-1)
    step = 1 << 24
    for i in range(0, flat.size, step):
        b = flat[i:i + step]
        if fmt == "ternary_b3":
            if b.size and b.max() > 242:
                return False
        else:
            # a 2-bit code is 3 exactly when both its bits are set
            both = b & (b >> 1) & 0x55
            if both.any():
                return False
    return True


def validate_packed(path: str | os.PathLike, check: str = "full") -> dict[str, Any]:
    """Validate a packed file (ValueError naming the problem); returns a summary dict
    (``not_verified``: what the chosen check did not look at, empty for "full")."""
    with load_packed(path, check=check) as m:
        return {"path": str(m.path), "config": m.cfg.to_dict(), "file_bytes": m.file_bytes,
                "tokenizer": m.tokenizer, "creator": m.creator, "check": check,
                "not_verified": [] if check == "full" else list(HEADER_CHECK_SKIPS)}
