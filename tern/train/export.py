"""The packed model file: layout, streaming writer, validating memory-mapped reader,
``random_model`` (no torch) and ``export`` (from the torch model).

A packed file is a safetensors container (8-byte little-endian header length, a JSON
header, then the tensor bytes) written tensor by tensor, so a 10B-total model never sits
in RAM and fp32 weights are never materialized. Tensors, in :func:`tern.core.config.tensor_specs`
order, one ``TensorSpec`` each stored as:

- ternary groups (``ternary2`` / ``ternary_b3``): ``<name>.packed`` uint8 and
  ``<name>.scale`` float32 (one per output row: shape = spec shape without its last axis).
  Orientation ``rows``: one packed row per output row (lead..., rows, row_bytes(cols)).
  Orientation ``transposed`` (every ``down`` projection, for the activation-skip kernel):
  one packed row per input unit (lead..., cols, row_bytes(rows)). Layouts: tern.kernels.packing.
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

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tern.core.config import ModelConfig, tensor_specs
from tern.packed.format import TERNARY_FORMATS, _creator, tokenizer_identity
from tern.packed.writer import _PackedWriter, _row_blocks, _write_dense, _write_ternary

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

    from tern.kernels.packing import quantize_weights

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

        from tern.train.model.ternary import weight_ternary  # the model's own quantizer: bit-exact

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
        from tern.train.checkpoint import load_checkpoint

        model, cfg, train_cfg, _ = load_checkpoint(src)
        tok = getattr(train_cfg, "tokenizer", None)
        return model.state_dict(), cfg, tok if isinstance(tok, str) else None
    if isinstance(src, tuple) and len(src) == 2 and isinstance(src[1], ModelConfig):
        obj, cfg = src
        state = obj if isinstance(obj, dict) else obj.state_dict()
        return state, cfg, None
    raise ValueError("export: src must be a checkpoint path, (model, ModelConfig) or (state_dict, ModelConfig)")


# ---- command line -----------------------------------------------------------------------


