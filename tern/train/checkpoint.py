"""Training checkpoints: one torch file of plain tensors and JSON-able values, loaded with
``torch.load(weights_only=True)`` (never unpickled), written atomically, versioned.

Content: ``format`` ("tern-checkpoint"), ``version``, ``model_config`` and
``train_config`` (JSON strings), ``model`` (state_dict in tensor_specs order),
``optimizer`` / ``scaler`` state, and ``state`` (step, train tokens, elapsed seconds,
torch / CUDA RNG states, running loss window) - everything a resumed run needs to
continue exactly like an uninterrupted one.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import torch

from tern.core.config import ModelConfig, tensor_specs
from tern.core.records import atomic_write_bytes
from tern.train.config import TrainConfig

FORMAT = "tern-checkpoint"
VERSION = 1


def save_checkpoint(path: str | Path, model: torch.nn.Module, model_cfg: ModelConfig,
                    train_cfg: TrainConfig, state: dict[str, Any],
                    optimizer: torch.optim.Optimizer | None = None,
                    scaler: Any = None) -> Path:
    """Write a checkpoint atomically (temp file + rename) and return its path."""
    blob = {
        "format": FORMAT, "version": VERSION,
        "model_config": model_cfg.to_json(), "train_config": train_cfg.to_json(),
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "state": state,
    }
    buf = io.BytesIO()
    torch.save(blob, buf)
    return atomic_write_bytes(path, buf.getvalue())


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The validated raw content of a checkpoint (configs parsed); ValueError when the file
    is missing, corrupt, of another format or version, or its tensors do not match its
    model config."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint {path} does not exist")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError, KeyError,
            AttributeError, TypeError) as e:
        raise ValueError(f"checkpoint {path} is corrupt or not a torch file: {e}") from None
    except Exception as e:  # e.g. pickle.UnpicklingError for foreign objects
        raise ValueError(f"checkpoint {path} cannot be loaded safely: {e}") from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise ValueError(f"{path} is not a tern checkpoint (format field missing or wrong)")
    if blob.get("version") != VERSION:
        raise ValueError(f"checkpoint {path} has version {blob.get('version')!r}; this tern reads "
                         f"version {VERSION}")
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
