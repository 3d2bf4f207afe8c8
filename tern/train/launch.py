"""Launching training: presets with budgets, one process or torchrun DDP."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch  # noqa: E402

from tern.core.config import ModelConfig, load_config  # noqa: E402
from tern.core.records import atomic_write_json  # noqa: E402
from tern.train.config import TrainConfig  # noqa: E402
from tern.train.loop import RESULT_NAME, run_training


def launch_torchrun(model_cfg: ModelConfig, train_cfg: TrainConfig, out_dir: str | Path,
                    nproc: int | None = None, timeout_s: float | None = None) -> dict[str, Any]:
    """Run :func:`run_training` under torchrun with ``nproc`` processes (default: one per
    CUDA device, or 2 on CPU with gloo) and return rank 0's result (out_dir/result.json)."""
    import subprocess

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if nproc is None:
        nproc = torch.cuda.device_count() or 2
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    atomic_write_json(out / "model_config.json", model_cfg.to_dict())
    atomic_write_json(out / "train_config.json", train_cfg.to_dict())
    (out / RESULT_NAME).unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "tern.train.cli", "--model", str(out / "model_config.json"),
           "--train", str(out / "train_config.json"), "--out", str(out)]
    r = subprocess.run(cmd, timeout=timeout_s)
    if r.returncode != 0:
        raise RuntimeError(f"torchrun exited with code {r.returncode}: {' '.join(cmd)}")
    return json.loads((out / RESULT_NAME).read_text(encoding="utf-8"))


def preset_configs(preset: str = "sandbox", smoke: bool = False, minutes: float = 20.0,
                   **train_overrides: Any) -> tuple[ModelConfig, TrainConfig]:
    """The (ModelConfig, TrainConfig) the notebooks train: a ``minutes`` budget (> 0) with
    periodic validation, or with ``smoke`` a few steps on short sequences with a small
    validation subset (seconds on a CPU). A ``steps`` override replaces the time budget;
    zero is never "not given" (``minutes=0`` or ``steps=0`` is a ValueError)."""
    mcfg = load_config(preset)
    if smoke:
        kw: dict[str, Any] = dict(steps=3, batch_size=2, seq_len=64, warmup_steps=1, eval_every=3,
                                  eval_tokens=512, final_eval_tokens=2048, log_every=1)
    else:
        kw = dict(minutes=minutes, seq_len=min(256, mcfg.max_seq_len), eval_every=200, log_every=10)
    if "steps" in train_overrides and "minutes" not in train_overrides:
        kw.pop("minutes", None)
    elif "minutes" in train_overrides and "steps" not in train_overrides:
        kw.pop("steps", None)
    kw.update(train_overrides)
    return mcfg, TrainConfig.from_dict(kw)


def train_auto(model_cfg: ModelConfig, train_cfg: TrainConfig, out_dir: str | Path,
               progress: bool = True, data: Any = None) -> dict[str, Any]:
    """Several CUDA devices: :func:`launch_torchrun` with one process each (DDP, nccl, the
    default corpus source); otherwise :func:`run_training` in this process (``data``:
    an optional data source)."""
    n = torch.cuda.device_count() if train_cfg.device != "cpu" else 0
    if n > 1:
        if data is not None:
            raise ValueError("train_auto: a custom data source cannot be passed to torchrun processes")
        return launch_torchrun(model_cfg, train_cfg, out_dir, nproc=n)
    return run_training(model_cfg, train_cfg, out_dir, progress=progress, data=data)
