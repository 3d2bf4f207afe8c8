"""Writing packed files tensor by tensor, and random_model (shape only, no torch)."""

from __future__ import annotations

import errno
import math
import os
import shutil
import struct
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tern.core.config import ModelConfig, TensorSpec, tensor_specs
from tern.packed.format import (
    _CHUNK_ELEMS,
    _DTYPES,
    TERNARY_FORMATS,
    StoredTensor,
    _build_header,
    _creator,
    _metadata,
    file_bytes,
    file_layout,
    packed_file_bytes,
    tokenizer_identity,
)


def size_text(n: float) -> str:
    """Bytes as a short decimal size: 2.52 GB, 309.2 MB (files, disk space)."""
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


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
        need = file_bytes(header, self.full)
        free = shutil.disk_usage(self.path.parent).free
        if need > free:  # say so now, not after minutes of writing a file that cannot fit
            raise OSError(errno.ENOSPC, f"{self.path.name} needs {size_text(need)} and {self.path.parent} has "
                                        f"{size_text(free)} free: free some space or write it elsewhere")
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
    from tern.kernels.packing import pack_ternary2, pack_ternary_b3

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


def random_model_bytes(cfg: ModelConfig, seed: int = 0, tokenizer: Any = None) -> int:
    """The size in bytes of the file :func:`random_model` writes for these arguments, without writing it."""
    return packed_file_bytes(cfg, tokenizer_identity(tokenizer), _creator("random_model", seed=seed))


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
