"""The random packed models a decode measurement runs: named by their config's hash, built
once (:func:`ensure_model`), and the disk they take checked before the first one is built.

A full sweep writes ~10 GB of random packed models (its largest two ~2.2 GB each) and notebook
08 one more of ~2.5 GB; a Kaggle working folder holds 20 GB. Each model is written only when
its first point is measured, so without a check a small disk fills part-way through a
sweep, minutes in. :func:`plan_models` lists the models a set of points would write (those
not on disk yet) with their exact file sizes (tern.packed.writer.random_model_bytes), and
:func:`check_free_space` refuses up front, with the figures, when they cannot fit. With
``keep_models=False`` (``tern bench sweep --no-keep-models``) the sweep deletes each model it
built once its last point is measured, so it needs room for the largest model only.
"""

from __future__ import annotations

import errno
import hashlib
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tern.core.config import ModelConfig
from tern.packed.writer import random_model, random_model_bytes, size_text

HEADROOM_BYTES = 256 * 2**20  # left free beyond the models (the rows, a temp file, the system)


def model_hash(cfg: ModelConfig) -> str:
    """12 hex digits of the config's JSON: the random model's file name (tern.measure.sweep)."""
    return hashlib.sha256(cfg.to_json().encode()).hexdigest()[:12]


def model_path(cfg: ModelConfig, models_dir: str | Path) -> Path:
    """Where the random packed model of ``cfg`` lives in ``models_dir`` (named by its hash)."""
    return Path(models_dir) / f"{cfg.name}-{model_hash(cfg)}.tern"


@dataclass(frozen=True)
class ModelsPlan:
    """The models a measurement will write: (path, bytes) of each one not on disk yet, in
    the order they are first needed."""

    models_dir: Path
    to_write: tuple[tuple[Path, int], ...]

    @property
    def total_bytes(self) -> int:
        return sum(b for _, b in self.to_write)

    @property
    def largest_bytes(self) -> int:
        return max((b for _, b in self.to_write), default=0)

    def need_bytes(self, keep_models: bool = True) -> int:
        """Disk the models take at their peak: all of them, or (``keep_models=False``: each
        deleted after its last point) the largest one."""
        return self.total_bytes if keep_models else self.largest_bytes


def ensure_model(cfg: ModelConfig, models_dir: str | Path) -> Path:
    """The random packed model for ``cfg`` (built once, reused by hash)."""
    path = model_path(cfg, models_dir)
    if not path.exists():
        random_model(cfg, path, seed=0)
    return path


def plan_models(configs: Iterable[ModelConfig], models_dir: str | Path) -> ModelsPlan:
    """The models of ``configs`` (duplicates once) that are not in ``models_dir`` yet."""
    seen: set[Path] = set()
    out: list[tuple[Path, int]] = []
    for cfg in configs:
        p = model_path(cfg, models_dir)
        if p in seen or p.exists():
            continue
        seen.add(p)
        out.append((p, random_model_bytes(cfg, seed=0)))
    return ModelsPlan(Path(models_dir), tuple(out))


def free_bytes(folder: str | Path) -> int:
    """Free bytes on the file system that holds ``folder`` (or its nearest existing parent)."""
    p = Path(folder).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def check_free_space(plan: ModelsPlan, keep_models: bool = True, what: str = "the sweep",
                     headroom_bytes: int = HEADROOM_BYTES, hint: str | None = None) -> None:
    """Raise OSError(ENOSPC) saying what is needed, what is free and (``hint``, else the
    sweep's options) what to do, when the models of ``plan`` (with ``headroom_bytes`` to
    spare) do not fit on their disk."""
    need = plan.need_bytes(keep_models)
    if not need:
        return
    free = free_bytes(plan.models_dir)
    if need + headroom_bytes <= free:
        return
    n = len(plan.to_write)
    held = (f"{n} random model{'s' if n != 1 else ''} ({size_text(plan.total_bytes)})" if keep_models
            else f"its largest random model ({size_text(plan.largest_bytes)}; each is deleted after its points)")
    hint = hint or ("free some space, point the results folder at a larger disk, or measure with keep_models=False "
            "(tern bench sweep --no-keep-models), which needs only the largest model"
            if keep_models and n > 1 else "free some space or point the results folder at a larger disk")
    raise OSError(errno.ENOSPC, f"{what} writes {held} into {plan.models_dir}, which has {size_text(free)} free "
                                f"(keeping {size_text(headroom_bytes)} spare): {hint}")
