"""The packed model file: layout, streaming writer, validating memory-mapped reader,
``random_model`` (no torch) and ``export`` (from the torch model).

A packed file is a safetensors container (8-byte little-endian header length, a JSON
header, then the tensor bytes) written tensor by tensor, so a 10B-total model never sits
in RAM and fp32 weights are never materialized. Tensors, in :func:`tern.config.tensor_specs`
order, one ``TensorSpec`` each stored as:

- ternary groups (``ternary2`` / ``ternary_b3``): ``<name>.packed`` uint8 and
  ``<name>.scale`` float32 (one per output row: shape = spec shape without its last axis).
  Orientation ``rows``: one packed row per output row (lead..., rows, row_bytes(cols)).
  Orientation ``transposed`` (every ``down`` projection, for the activation-skip kernel):
  one packed row per input unit (lead..., cols, row_bytes(rows)). Layouts: tern.engine.packing.
- ``int8``: ``<name>.q`` int8 (spec shape) and ``<name>.scale`` float32 (rows,) with
  ``w ~= q * scale`` per row (symmetric absmax / 127).
- ``fp32`` / ``fp16`` / ``bf16``: ``<name>`` as is.
- ``__pad__.<k>`` uint8 filler tensors keep every tensor's data 64-byte aligned (safetensors
  allows no holes between tensors).

``__metadata__`` (strings): ``format`` = "tern.packed", ``version``, ``config`` (ModelConfig
JSON), ``packing`` (JSON: per spec name its format, orientation, rows, cols, row_bytes),
``tokenizer`` (JSON: name and sha256, or null), ``creator`` (JSON), ``crc32`` (JSON: per
stored tensor, of its bytes) and ``header_sha256`` (over everything else in the header, so
any flipped header byte is caught).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import mmap
import os
import struct
import sys
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .config import ModelConfig, TensorSpec, tensor_specs
from .records import git_commit

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


# ---- layout -----------------------------------------------------------------------------


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
    what the activation-skip kernel reads (tern.engine.kernels_ternary.ternary_matvec_skip)."""
    return spec.group in ("mlp", "shared", "experts") and spec.name.endswith((".down", ".down.weight"))


def _row_bytes(fmt: str, cols: int) -> int:
    from .engine.packing import ternary2_row_bytes, ternary_b3_row_bytes

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


# ---- header -----------------------------------------------------------------------------


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
    from . import __version__

    return {"tool": f"tern {__version__}", "function": function, "git_commit": git_commit(),
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **extra}


def default_tokenizer(cfg: ModelConfig) -> str | None:
    """The kit's default tokenizer name when its vocabulary size is the config's, else None
    (what a random model records when no tokenizer is given)."""
    try:
        from .tokenizer import DEFAULT_TOKENIZER, get_tokenizer

        return DEFAULT_TOKENIZER if get_tokenizer(DEFAULT_TOKENIZER).vocab_size == cfg.vocab_size else None
    except (ValueError, OSError, ImportError):
        return None


def tokenizer_identity(tokenizer: Any) -> dict[str, str] | None:
    """``{"name", "sha256"}`` of a tokenizer given as an object with ``name`` and ``hash``
    (tern.tokenizer), a dict with those keys, or a name (resolved with
    tern.tokenizer.get_tokenizer when it can be, else stored with an empty hash); None for None."""
    if tokenizer is None:
        return None
    if isinstance(tokenizer, str):
        try:
            from .tokenizer import get_tokenizer

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


# ---- streaming writer -------------------------------------------------------------------


class _PackedWriter:
    """Writes the container tensor by tensor into a temp file, then renames it over
    ``path`` (a reader never sees a half-written file). Use as a context manager."""

    def __init__(self, path: str | os.PathLike, cfg: ModelConfig, tokenizer: dict[str, str] | None,
                 creator: dict[str, Any]):
        self.path = Path(path)
        self.tensors, self.packing = file_layout(cfg)
        self.meta = _metadata(cfg, self.packing, tokenizer, creator)
        self.crcs: dict[str, int] = {}
        header, self.full, self.offs = _build_header(self.tensors, self.meta, self.crcs)
        self.header_len = len(header)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        self.f = os.fdopen(fd, "wb")
        self.f.write(struct.pack("<Q", self.header_len) + header)
        self._queue = iter(self.full)
        self._cur: StoredTensor | None = None
        self._cur_written = 0
        self._advance()

    def _advance(self) -> None:
        self._cur = next(self._queue, None)
        self._cur_written = 0
        while self._cur is not None and self._cur.role == "pad":
            data = bytes(self._cur.nbytes)
            self.crcs[self._cur.name] = zlib.crc32(data)
            self.f.write(data)
            self._cur = next(self._queue, None)

    def write(self, name: str, chunk: np.ndarray) -> None:
        """Append ``chunk`` (the next bytes of tensor ``name``, C order) to the file."""
        t = self._cur
        if t is None or t.name != name:
            raise RuntimeError(f"packed writer: expected tensor {t.name if t else None!r}, got {name!r}")
        want = _DTYPES[t.dtype][0]
        if chunk.dtype != want:
            raise RuntimeError(f"packed writer: {name} expects {want}, got {chunk.dtype}")
        data = np.ascontiguousarray(chunk).tobytes()
        self.crcs[name] = zlib.crc32(data, self.crcs.get(name, 0))
        self.f.write(data)
        self._cur_written += len(data)
        if self._cur_written > t.nbytes:
            raise RuntimeError(f"packed writer: {name} got {self._cur_written} bytes, expects {t.nbytes}")
        if self._cur_written == t.nbytes:
            self._advance()

    def close(self) -> Path:
        if self._cur is not None:
            raise RuntimeError(f"packed writer: tensor {self._cur.name} was not (fully) written")
        header, full, _ = _build_header(self.tensors, self.meta, self.crcs)
        assert len(header) == self.header_len and [t.name for t in full] == [t.name for t in self.full]
        self.f.seek(8)
        self.f.write(header)
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.tmp, 0o666 & ~umask)  # mkstemp made it private; a model file is not
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        self.f.close()
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)

    def __enter__(self) -> _PackedWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


def _write_ternary(w: _PackedWriter, spec: TensorSpec, pack: dict[str, Any],
                   blocks: Iterator[tuple[np.ndarray, np.ndarray]]) -> None:
    """Write a ternary spec from ``blocks`` of (wt int8 (r, cols), scale f32 (r,)) in row
    order over the flattened leading axes (for a transposed tensor: one matrix per block)."""
    from .engine.packing import pack_ternary2, pack_ternary_b3

    packer = pack_ternary2 if pack["format"] == "ternary2" else pack_ternary_b3
    scales = []
    for wt, s in blocks:
        if pack["orientation"] == "transposed":
            wt = np.ascontiguousarray(wt.T)  # (cols, rows): one packed row per input unit
        w.write(f"{spec.name}.packed", packer(wt))
        scales.append(s.astype(np.float32))
    w.write(f"{spec.name}.scale", np.concatenate(scales))


def _int8_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8: (q int8 (r, c), scale f32 (r,)) with x ~= q * scale."""
    amax = np.abs(x).max(axis=1).astype(np.float32)  # (r,)
    scale = np.where(amax > 0, amax / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    q = np.clip(np.rint(x / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def _write_dense(w: _PackedWriter, spec: TensorSpec, fmt: str, rows_iter: Iterator[np.ndarray]) -> None:
    """Write a non-ternary spec from fp32 row blocks (r, cols) (1-D tensors: one block)."""
    scales = []
    for x in rows_iter:
        x = np.asarray(x, dtype=np.float32)
        if fmt == "int8":
            q, s = _int8_rows(x)
            w.write(f"{spec.name}.q", q)
            scales.append(s)
        elif fmt == "fp32":
            w.write(spec.name, x.astype("<f4"))
        elif fmt == "fp16":
            w.write(spec.name, x.astype("<f2"))
        else:  # bf16, round to nearest even
            b = x.astype("<f4").view("<u4")
            w.write(spec.name, ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype("<u2"))
    if fmt == "int8":
        w.write(f"{spec.name}.scale", np.concatenate(scales))


def _row_blocks(n_rows: int, cols: int) -> Iterator[tuple[int, int]]:
    step = max(1, _CHUNK_ELEMS // max(cols, 1))
    for r0 in range(0, n_rows, step):
        yield r0, min(n_rows, r0 + step)


# ---- random_model -----------------------------------------------------------------------


def _random_aux(spec: TensorSpec, cfg: ModelConfig, rng: np.random.Generator) -> np.ndarray:
    """fp32 values of a norm / SSM aux / router tensor in sensible ranges."""
    leaf = spec.name.split(".")[-1]
    shape = spec.shape
    if spec.group == "norm":
        return np.ones(shape, np.float32)
    if spec.group == "router":
        return (rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(np.float32)
    if leaf == "A_log":  # Mamba init: A = -(1..N), so exp(dt * A) is in (0, 1)
        return np.broadcast_to(np.log(np.arange(1, shape[1] + 1, dtype=np.float32)), shape).copy()
    if leaf == "D":
        return np.ones(shape, np.float32)
    if ".conv." in spec.name:
        k = cfg.d_conv
        if leaf == "weight":
            return rng.uniform(-1 / math.sqrt(k), 1 / math.sqrt(k), shape).astype(np.float32)
        return rng.uniform(-0.1, 0.1, shape).astype(np.float32)
    if ".dt_proj." in spec.name:
        if leaf == "weight":  # small, so softplus stays near the bias
            return (rng.standard_normal(shape) * 0.1 / math.sqrt(shape[1])).astype(np.float32)
        dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), shape))  # log-uniform 0.001..0.1
        return (dt + np.log(-np.expm1(-dt))).astype(np.float32)  # inverse softplus
    raise ValueError(f"no random initialiser for {spec.name}")  # pragma: no cover


def random_model(cfg: ModelConfig, path: str | os.PathLike, seed: int = 0,
                 tokenizer: Any = None, progress: bool = True) -> Path:
    """Write a random packed model of ``cfg`` to ``path`` without torch, tensor by tensor.

    Ternary weights: uniform codes in {-1, 0, +1} with per-row scales ~ 1 / sqrt(2/3 * fan_in)
    (times 0.5 for residual-branch outputs), so activations keep a plausible size; norms 1;
    SSM aux parameters as Mamba initialises them; embedding N(0, 1) / sqrt(d_model) so tied
    logits have a spread of a few nats. Returns the path.
    """
    from tqdm import tqdm

    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"random_model needs a ModelConfig, got {type(cfg).__name__}")
    rng = np.random.default_rng(seed)
    specs = tensor_specs(cfg)
    with _PackedWriter(path, cfg, tokenizer_identity(tokenizer), _creator("random_model", seed=seed)) as w:
        for spec in tqdm(specs, desc="random model", unit="tensor", disable=not progress, file=sys.stderr):
            pack = w.packing[spec.name]
            fmt = pack["format"]
            cols = spec.shape[-1]
            if fmt in TERNARY_FORMATS:
                gain = 0.5 if spec.name.endswith(("down", "down.weight", "out_proj.weight")) else 1.0
                s0 = gain / math.sqrt(2 / 3 * cols)

                def blocks(spec=spec, s0=s0, cols=cols, pack=pack):
                    rows = spec.shape[-2]
                    n_mats = math.prod(spec.shape[:-2])
                    for _ in range(n_mats):
                        ranges = [(0, rows)] if pack["orientation"] == "transposed" else _row_blocks(rows, cols)
                        for r0, r1 in ranges:
                            wt = rng.integers(-1, 2, size=(r1 - r0, cols), dtype=np.int8)
                            yield wt, (s0 * rng.uniform(0.8, 1.2, r1 - r0)).astype(np.float32)

                _write_ternary(w, spec, pack, blocks())
            elif spec.group in ("embed", "head"):
                std = 1 / math.sqrt(cols)
                _write_dense(w, spec, fmt, (
                    (rng.standard_normal((r1 - r0, cols), dtype=np.float32) * np.float32(std))
                    for r0, r1 in _row_blocks(spec.shape[0], cols)))
            else:
                _write_dense(w, spec, fmt, iter([_random_aux(spec, cfg, rng)]))
        return w.close()


# ---- export from torch ------------------------------------------------------------------


def export(src: Any, path: str | os.PathLike, tokenizer: Any = None, progress: bool = True) -> Path:
    """Write the packed file of a torch model to ``path``.

    ``src``: a checkpoint path (loaded with tern.train.load_checkpoint), a ``(model, cfg)``
    pair, or a ``(state_dict, cfg)`` pair. Ternary groups are quantized exactly as BitLinear
    does (docs/MODEL.md: per-row absmean, round half to even), one tensor at a time.
    ``tokenizer``: name / identity dict / tokenizer object (default: the checkpoint's
    ``tokenizer`` entry of its train config when there is one).
    """
    from tqdm import tqdm

    from .engine.packing import quantize_weights

    state, cfg, tok = _load_source(src)
    if tokenizer is None:
        tokenizer = tok
    specs = tensor_specs(cfg)
    missing = [s.name for s in specs if s.name not in state]
    if missing:
        raise ValueError(f"export: state_dict lacks tensors {missing[:5]}{'...' if len(missing) > 5 else ''}")

    def tern(name: str, shape: tuple[int, ...]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        a = arr(name, shape).reshape(-1, shape[-2], shape[-1])  # (n, rows, cols), checked
        t = state[name]
        if not hasattr(t, "detach"):
            yield from (quantize_weights(m) for m in a)
            return
        import torch

        from .model.ternary import weight_ternary  # the model's own quantizer: bit-exact

        for m in torch.from_numpy(a):
            wt, s = weight_ternary(m)
            yield wt.to(torch.int8).numpy(), s.reshape(-1).numpy()

    def arr(name: str, shape: tuple[int, ...]) -> np.ndarray:
        t = state[name]
        a = t.detach().to("cpu").float().numpy() if hasattr(t, "detach") else np.asarray(t, np.float32)
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"export: {name} has shape {tuple(a.shape)}, config expects {shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"export: {name} has non-finite values")
        return np.ascontiguousarray(a, dtype=np.float32)

    with _PackedWriter(path, cfg, tokenizer_identity(tokenizer), _creator("export")) as w:
        for spec in tqdm(specs, desc="export", unit="tensor", disable=not progress, file=sys.stderr):
            pack = w.packing[spec.name]
            if pack["format"] in TERNARY_FORMATS:
                _write_ternary(w, spec, pack, tern(spec.name, spec.shape))
                continue
            a = arr(spec.name, spec.shape)
            if a.ndim >= 2:
                flat = a.reshape(-1, a.shape[-1])
                _write_dense(w, spec, pack["format"], (flat[r0:r1] for r0, r1 in _row_blocks(len(flat), a.shape[-1])))
            else:
                _write_dense(w, spec, pack["format"], iter([a]))
        return w.close()


def _load_source(src: Any) -> tuple[dict[str, Any], ModelConfig, Any]:
    if isinstance(src, (str, os.PathLike)):
        from .train import load_checkpoint

        model, cfg, train_cfg, _ = load_checkpoint(src)
        tok = getattr(train_cfg, "tokenizer", None)
        return model.state_dict(), cfg, tok if isinstance(tok, str) else None
    if isinstance(src, tuple) and len(src) == 2 and isinstance(src[1], ModelConfig):
        obj, cfg = src
        state = obj if isinstance(obj, dict) else obj.state_dict()
        return state, cfg, None
    raise ValueError("export: src must be a checkpoint path, (model, ModelConfig) or (state_dict, ModelConfig)")


# ---- reader / validator -----------------------------------------------------------------


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
        from .engine.packing import unpack_ternary2, unpack_ternary_b3

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


def read_header(path: str | os.PathLike) -> tuple[dict[str, Any], int]:
    """The parsed JSON header of a packed file and its length in bytes (ValueError when
    the file is not a readable safetensors container)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"packed model {path} does not exist")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: not a packed model (file of {size} bytes is too short)")
        (n,) = struct.unpack("<Q", head)
        if n < 2 or n > MAX_HEADER_BYTES or 8 + n > size:
            raise ValueError(f"{path}: not a packed model or truncated (header length {n} bytes, "
                             f"file {size} bytes)")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: corrupted header (not valid JSON: {e})") from None
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__"), dict):
        raise ValueError(f"{path}: header has no __metadata__ dict: not a tern packed model")
    return header, n


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
    creator = _meta_json(path, meta, "creator")
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
        if dt not in _DTYPES or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise ValueError(f"{path}: tensor {k} has bad dtype/shape {dt} {list(shape)}")
        if not (isinstance(b, int) and isinstance(end, int) and 0 <= b <= end):
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
    """Validate a packed file (ValueError naming the problem); returns a summary dict."""
    with load_packed(path, check=check) as m:
        return {"path": str(m.path), "config": m.cfg.to_dict(), "file_bytes": m.file_bytes,
                "tokenizer": m.tokenizer, "creator": m.creator, "check": check}


# ---- command line -----------------------------------------------------------------------

JSON_FIELDS = """\
  action: "export" | "random" | "validate"; path; file_bytes; seconds (wall time);
  config: ModelConfig fields; tokenizer: {name, sha256} or null; creator; check"""


def cli_configure(p: Any) -> None:
    p.add_argument("source", nargs="?", help="checkpoint to export (tern train's checkpoint.pt)")
    p.add_argument("out", nargs="?", help="packed model file to write")
    p.add_argument("--random", metavar="CONFIG",
                   help="write a random model of a preset or config JSON (no torch): tern export --random sandbox out.tern")
    p.add_argument("--seed", type=int, default=0, help="seed of --random")
    p.add_argument("--tokenizer", help="tokenizer name recorded in the file (default: the checkpoint's)")
    p.add_argument("--validate", metavar="FILE", help="validate a packed file and print its summary")
    p.add_argument("--check", choices=CHECKS, default="full",
                   help="validation depth: full (crc32 and ternary codes of every byte) or header")


def cli_run(args: Any) -> dict[str, Any]:
    import time

    from .config import load_config

    t0 = time.perf_counter()
    if args.validate:
        action, path = "validate", Path(args.validate)
    elif args.random:
        out = args.out or args.source
        if not out:
            raise ValueError("tern export --random CONFIG OUT: the output file is missing")
        action, cfg = "random", load_config(args.random)
        path = random_model(cfg, out, seed=args.seed, tokenizer=args.tokenizer or default_tokenizer(cfg))
    else:
        if not (args.source and args.out):
            raise ValueError("usage: tern export CHECKPOINT OUT | --random CONFIG OUT | --validate FILE")
        action = "export"
        path = export(args.source, args.out, tokenizer=args.tokenizer)
    summary = validate_packed(path, check=args.check)
    return {"action": action, **summary, "seconds": time.perf_counter() - t0}


def cli_render(r: dict[str, Any]) -> str:
    tok = r["tokenizer"]["name"] if r["tokenizer"] else "none"
    verb = {"validate": "valid", "random": "wrote random", "export": "exported"}[r["action"]]
    return (f"{verb}: {r['path']} ({r['file_bytes'] / 1e6:.2f} MB, config {r['config']['name']}, "
            f"tokenizer {tok}, {r['check']} check, {r['seconds']:.1f} s)")
