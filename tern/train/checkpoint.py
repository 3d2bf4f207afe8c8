"""Training checkpoints: one torch file of plain tensors and JSON-able values, loaded with
``torch.load(weights_only=True)`` (never unpickled), written atomically, versioned.

Content: ``format`` ("tern-checkpoint"), ``version``, ``model_config`` and
``train_config`` (JSON strings), ``model`` (state_dict in tensor_specs order),
``optimizer`` / ``scaler`` state, and ``state`` (step, train tokens, elapsed seconds,
torch / CUDA RNG states, running loss window) - everything a resumed run needs to
continue exactly like an uninterrupted one.

Integrity (version 2): ``checksums`` holds the crc32 of every tensor's bytes, keyed by its
path in the file (``model/embed.weight``, ``optimizer/state/0/exp_avg``, ``state/rng_cpu``),
and one crc32 over every other value (configs, counters, optimizer settings). Every load
(:func:`read_checkpoint`, hence ``--resume``, ``tern export``, distillation teachers)
recomputes them; a mismatch is a ValueError naming the tensor and the file. A version-1
checkpoint (written before checksums existed) is still read, with a warning that its
content cannot be verified: it is the user's training time, and the format is otherwise
unchanged; re-saving it (e.g. resuming it for a step) adds the checksums.
"""

from __future__ import annotations

import io
import json
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any

import torch

from tern.core.config import ModelConfig, tensor_specs
from tern.core.records import atomic_write_bytes
from tern.packed.reader import regular_file_problem
from tern.train.config import TrainConfig

FORMAT = "tern-checkpoint"
VERSION = 2  # 2: per-tensor checksums
READABLE_VERSIONS = (1, 2)  # 1: no checksums (read with a warning)
CHECKSUMS = "checksums"


def _crc32(t: torch.Tensor) -> str:
    """crc32 (8 hex digits) of a tensor's bytes in C order."""
    b = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return f"{zlib.crc32(b):08x}"


def content_checksums(blob: dict[str, Any]) -> dict[str, Any]:
    """``{"tensors": {path: crc32}, "values": crc32}`` of a checkpoint's content (everything
    but its ``checksums`` entry): each tensor by its path in the nested dicts and lists,
    the other values (their paths and reprs, in order) in one checksum."""
    tensors: dict[str, str] = {}
    values: list[tuple[str, str]] = []

    def walk(x: Any, at: str) -> None:
        if isinstance(x, torch.Tensor):
            tensors[at] = _crc32(x)
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{at}/{k}" if at else str(k))
        elif isinstance(x, (list, tuple)):
            values.append((at, f"{type(x).__name__}[{len(x)}]"))
            for i, v in enumerate(x):
                walk(v, f"{at}/{i}")
        else:
            values.append((at, repr(x)))

    walk({k: v for k, v in blob.items() if k != CHECKSUMS}, "")
    return {"tensors": tensors, "values": f"{zlib.crc32(json.dumps(values).encode('utf-8')):08x}"}


def _verify(path: Path, blob: dict[str, Any]) -> None:
    """ValueError naming the first tensor (or the other content) whose checksum differs."""
    stored = blob.get(CHECKSUMS)
    if (not isinstance(stored, dict) or not isinstance(stored.get("tensors"), dict)
            or not isinstance(stored.get("values"), str)):
        raise ValueError(f"checkpoint {path}: checksums missing or malformed (corrupted file)")
    got = content_checksums(blob)
    for name, crc in got["tensors"].items():
        want = stored["tensors"].get(name)
        if want != crc:
            raise ValueError(f"checkpoint {path}: tensor {name} is corrupted (crc32 {crc}, "
                             f"stored {want})" if want is not None else
                             f"checkpoint {path}: tensor {name} has no stored checksum (corrupted file)")
    lost = sorted(set(stored["tensors"]) - set(got["tensors"]))
    if lost:
        raise ValueError(f"checkpoint {path}: tensor {lost[0]} is missing (corrupted file)")
    if got["values"] != stored["values"]:
        raise ValueError(f"checkpoint {path}: its configs / counters / optimizer settings are "
                         f"corrupted (crc32 {got['values']}, stored {stored['values']})")


def save_checkpoint(path: str | Path, model: torch.nn.Module, model_cfg: ModelConfig,
                    train_cfg: TrainConfig, state: dict[str, Any],
                    optimizer: torch.optim.Optimizer | None = None,
                    scaler: Any = None) -> Path:
    """Write a checkpoint atomically (temp file + rename, stale temps of interrupted
    writes in the folder removed: tern.core.records.clean_stale_temps) with the checksums
    of its content, and return its path."""
    blob = {
        "format": FORMAT, "version": VERSION,
        "model_config": model_cfg.to_json(), "train_config": train_cfg.to_json(),
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "state": state,
    }
    blob[CHECKSUMS] = content_checksums(blob)
    buf = io.BytesIO()
    torch.save(blob, buf)
    return atomic_write_bytes(path, buf.getvalue())


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The validated raw content of a checkpoint (configs parsed); ValueError when the file
    is missing or not a regular file, corrupt (a checksum differs: the message names the
    tensor), of another format or version, or its tensors do not match its model config.
    A version-1 checkpoint has no checksums: it is read with a warning (module docstring)."""
    path = Path(path)
    problem = regular_file_problem(path)
    if problem:
        raise ValueError(f"checkpoint {path} {problem}")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError, KeyError,
            AttributeError, TypeError) as e:
        raise ValueError(f"checkpoint {path} is corrupt or not a torch file: {e}") from None
    except Exception as e:  # e.g. pickle.UnpicklingError for foreign objects
        raise ValueError(f"checkpoint {path} cannot be loaded safely: {e}") from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise ValueError(f"{path} is not a tern checkpoint (format field missing or wrong)")
    if type(blob.get("version")) is not int or blob["version"] not in READABLE_VERSIONS:
        raise ValueError(f"checkpoint {path} has version {blob.get('version')!r}; this tern reads "
                         f"versions {READABLE_VERSIONS}")
    try:
        mcfg = ModelConfig.from_dict(json.loads(blob["model_config"]))
        tcfg = TrainConfig.from_dict(json.loads(blob["train_config"]))
    except (KeyError, TypeError, json.JSONDecodeError, ValueError) as e:
        raise ValueError(f"checkpoint {path}: bad configuration: {e}") from None
    sd = blob.get("model")
    if not isinstance(sd, dict):
        raise ValueError(f"checkpoint {path}: no model tensors")
    want = [(s.name, s.shape) for s in tensor_specs(mcfg)]
    have = [(k, tuple(v.shape)) for k, v in sd.items()]
    if sorted(want) != sorted(have):
        missing = sorted({n for n, _ in want} - {n for n, _ in have})
        extra = sorted({n for n, _ in have} - {n for n, _ in want})
        bad = [n for (n, s) in want if n in sd and tuple(sd[n].shape) != s]
        raise ValueError(f"checkpoint {path}: tensors do not match its model config "
                         f"(missing {missing[:5]}, unexpected {extra[:5]}, wrong shape {bad[:5]})")
    if blob["version"] == 1:
        warnings.warn(f"checkpoint {path} was written by an older tern (version 1, no checksums): "
                      f"its content cannot be verified", stacklevel=2)
    else:
        _verify(path, blob)
    blob["model_config"], blob["train_config"] = mcfg, tcfg
    return blob


def load_checkpoint(path: str | Path):
    """(model in eval mode on CPU, model_cfg, train_cfg, state) from a checkpoint."""
    from tern.train.model.lm import build_model

    blob = read_checkpoint(path)
    model = build_model(blob["model_config"], seed=None)
    model.load_state_dict(blob["model"])
    model.eval()
    return model, blob["model_config"], blob["train_config"], blob["state"]
