"""Where a training run executes: the torchrun environment, the device, autocast and the
loss scaler, weight-decay groups, and the CPU determinism mode."""

from __future__ import annotations

import contextlib
import os

import torch  # noqa: E402

from tern.train.config import TrainConfig  # noqa: E402


def dist_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun's environment; (0, 1, 0) without it."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError as e:
        raise ValueError(f"bad torchrun environment (RANK/WORLD_SIZE/LOCAL_RANK): {e}") from None
    return rank, world, local


def training_device(tc: TrainConfig, local_rank: int) -> torch.device:
    if tc.device == "cpu" or (tc.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("device='cuda' requested but CUDA is not available")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def amp_and_scaler(tc: TrainConfig, dev: torch.device):
    """(autocast dtype or None, GradScaler or None) on CUDA: bf16 where supported, else fp16
    + scaler. None on CPU: bf16 matmuls measured no faster there once the casts are paid."""
    if dev.type != "cuda" or not tc.amp:
        return None, None
    if torch.cuda.is_bf16_supported():
        return torch.bfloat16, None
    return torch.float16, torch.amp.GradScaler("cuda")


def param_groups(model: torch.nn.Module, wd: float) -> list[dict]:
    """Weight decay on matrices (BitLinear latents, experts, embedding, router); none on
    norms, biases, A_log, D and the convolution."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.ndim >= 2 and not name.endswith(("A_log", "conv.weight")):
            decay.append(p)
        else:
            no_decay.append(p)
    return [{"params": decay, "weight_decay": wd, "decays": True},
            {"params": no_decay, "weight_decay": 0.0, "decays": False}]


def make_optimizer(model: torch.nn.Module, tc: TrainConfig, dev: torch.device) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`, the fused single-kernel form on CPU and CUDA: the
    same update as the default (foreach) form up to fp32 rounding
    (tests/train/test_fast_paths.py); its share of a step: benchmarks/gate_train_speed.py
    ``--profile``."""
    return torch.optim.AdamW(param_groups(model, tc.weight_decay), lr=tc.lr, betas=(tc.beta1, tc.beta2),
                             fused=dev.type in ("cpu", "cuda") or None)


def resolve_cpu_backward(tc: TrainConfig) -> str:
    """``tc.cpu_backward`` with "auto" resolved: "bf16" where torch reports AVX512-BF16 on
    this CPU (bf16 products run natively there), "fp32" elsewhere."""
    if tc.cpu_backward != "auto":
        return tc.cpu_backward
    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return "bf16" if probe is not None and probe() else "fp32"


@contextlib.contextmanager
def cpu_training_mode(tc: TrainConfig, dev: torch.device):
    """On CPU: deterministic algorithms, without the NaN fill of every fresh tensor that
    torch adds in that mode (~2 % of a sandbox step; every kernel here writes all of its
    outputs), and BitLinear products in ``tc.cpu_matmul`` / ``tc.cpu_backward``. All restored on exit."""
    from torch.utils import deterministic

    from tern.train.model.ternary import matmul_mode

    det_before = torch.are_deterministic_algorithms_enabled()
    fill_before = deterministic.fill_uninitialized_memory
    if dev.type == "cpu":
        torch.use_deterministic_algorithms(True)
        deterministic.fill_uninitialized_memory = False
    try:
        with matmul_mode(tc.cpu_matmul, resolve_cpu_backward(tc)):
            yield
    finally:
        torch.use_deterministic_algorithms(det_before)
        deterministic.fill_uninitialized_memory = fill_before
