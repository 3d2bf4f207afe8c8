"""TrainConfig (frozen, validated) and the learning-rate / weight-decay schedules."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

SCHEDULES = ("cosine", "two_stage", "constant")
DEVICES = ("auto", "cpu", "cuda")
CPU_MATMULS = ("int8", "fp32")  # BitLinear forward products in CPU training (tern.train.model.ternary)
CPU_BACKWARDS = ("auto", "fp32", "bf16")  # BitLinear backward products in CPU training (int8 mode)


@dataclass(frozen=True)
class TrainConfig:
    """How to train a model. Budget: ``steps`` (> 0) or ``minutes`` (> 0), exactly one.

    ``batch_size`` is the global batch in sequences per optimizer step (split evenly over
    DDP ranks); ``seq_len`` tokens per sequence. Schedules (``progress`` p in [0, 1] is
    step / steps, or elapsed / minutes for a time budget):
    - "cosine": linear warm-up over ``warmup_steps``, then cosine from ``lr`` to
      ``lr * min_lr_frac``; weight decay constant.
    - "two_stage" (BitNet b1.58): warm-up, constant ``lr`` until p = ``stage2_at``, then the
      LR drops to ``lr * stage2_lr_frac`` and decays linearly to ``lr * min_lr_frac``;
      weight decay is switched off in stage two.
    - "constant": warm-up, then ``lr``.
    Periodic validation (every ``eval_every`` steps, 0: never) uses the first
    ``eval_tokens`` tokens of the validation split; the final one uses ``final_eval_tokens``
    (0: the full split). ``balance_weight`` and ``z_weight`` scale the MoE losses.
    ``cpu_matmul`` (CPU float32 training): "int8" computes BitLinear forward products
    exactly from the int8 codes (``torch._int_mm``), "fp32" multiplies the dequantized
    operands in fp32; both have the same fp32 straight-through backward
    (``tern.train.model.ternary``). ``cpu_backward`` (int8 mode only): "fp32" or "bf16":
    the two backward products of a 2-D BitLinear take the exact ternary / int8 codes in
    bf16 and the upstream gradient times the row scales rounded to bf16 (fp32
    accumulation, the product rounded to bf16): gradients within bf16 rounding
    (tern.train.model.quant_numba.Int8MatmulSTE), and so do the two backward products of
    the fp32 output head (its operands rounded to bf16; tern.train.model.ternary.dense_product:
    the forward, the logits and the loss stay fp32); "auto" (default): "bf16" where the CPU
    has AVX512-BF16, else "fp32" (tern.train.environment.resolve_cpu_backward; gate-scale
    A/B and quality in gates/v2/README.md).
    """

    steps: int = 0
    minutes: float = 0.0
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    min_lr_frac: float = 0.1
    warmup_steps: int = 50
    schedule: str = "cosine"
    stage2_at: float = 0.5
    stage2_lr_frac: float = 0.4
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    tokenizer: str = "bpe1024"
    device: str = "auto"
    amp: bool = True  # CUDA only: bf16 autocast, or fp16 + GradScaler where bf16 is missing
    compile: bool = False  # CUDA only: torch.compile (it cannot trace the CPU step's numba kernels)
    threads: int = 0  # CPU threads for torch and numba; 0: leave the defaults
    eval_every: int = 0
    eval_tokens: int = 65536
    final_eval_tokens: int = 0
    balance_weight: float = 0.01
    z_weight: float = 0.001
    log_every: int = 10
    ckpt_every: int = 0  # steps between checkpoints (0: only at the end)
    scan_impl: str = "auto"  # "auto" | "numba" | "torch"
    cpu_matmul: str = "int8"  # "int8" | "fp32"
    cpu_backward: str = "auto"  # "auto" | "fp32" | "bf16"

    def __post_init__(self) -> None:
        errors = []

        def check(name: str, ok: bool, what: str) -> None:
            if not ok:
                errors.append(f"{name} must be {what}, got {getattr(self, name)!r}")

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        for n in ("steps", "warmup_steps", "seed", "threads", "eval_every", "eval_tokens",
                  "final_eval_tokens", "log_every", "ckpt_every"):
            check(n, is_int(getattr(self, n)) and getattr(self, n) >= 0, "an integer >= 0")
        for n in ("batch_size", "seq_len"):
            check(n, is_int(getattr(self, n)) and getattr(self, n) >= 1, "an integer >= 1")
        for n in ("minutes", "weight_decay", "grad_clip", "balance_weight", "z_weight"):
            check(n, is_num(getattr(self, n)) and getattr(self, n) >= 0, "a number >= 0")
        check("lr", is_num(self.lr) and self.lr > 0, "a number > 0")
        for n in ("min_lr_frac", "stage2_lr_frac", "stage2_at", "beta1", "beta2"):
            check(n, is_num(getattr(self, n)) and 0 <= getattr(self, n) <= 1, "in [0, 1]")
        check("schedule", self.schedule in SCHEDULES, f"one of {SCHEDULES}")
        check("device", self.device in DEVICES, f"one of {DEVICES}")
        check("scan_impl", self.scan_impl in ("auto", "numba", "torch"), "'auto', 'numba' or 'torch'")
        check("cpu_matmul", self.cpu_matmul in CPU_MATMULS, f"one of {CPU_MATMULS}")
        check("cpu_backward", self.cpu_backward in CPU_BACKWARDS, f"one of {CPU_BACKWARDS}")
        check("tokenizer", isinstance(self.tokenizer, str) and self.tokenizer, "a tokenizer name")
        for n in ("amp", "compile"):
            check(n, isinstance(getattr(self, n), bool), "a bool")
        if not errors and (self.steps > 0) == (self.minutes > 0):
            errors.append(f"exactly one budget is needed: steps > 0 or minutes > 0 "
                          f"(got steps={self.steps}, minutes={self.minutes})")
        if errors:
            raise ValueError("invalid TrainConfig: " + "; ".join(errors))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        from tern.core.config import dataclass_from_dict

        return dataclass_from_dict(cls, d)

    def replace(self, **overrides: Any) -> TrainConfig:
        return TrainConfig.from_dict({**self.to_dict(), **overrides})


def schedule(tc: TrainConfig, step: int, progress: float) -> tuple[float, float]:
    """(learning rate, weight decay) for optimizer step ``step`` (0-based) at ``progress``."""
    p = min(max(progress, 0.0), 1.0)
    if tc.warmup_steps and step < tc.warmup_steps:
        warm = (step + 1) / tc.warmup_steps
    else:
        warm = 1.0
    lo = tc.lr * tc.min_lr_frac
    wd = tc.weight_decay
    if tc.schedule == "cosine":
        lr = lo + (tc.lr - lo) * 0.5 * (1 + math.cos(math.pi * p))
    elif tc.schedule == "two_stage":
        if p < tc.stage2_at:
            lr = tc.lr
        else:
            hi = tc.lr * tc.stage2_lr_frac
            q = (p - tc.stage2_at) / max(1.0 - tc.stage2_at, 1e-12)
            lr = hi + (lo - hi) * q
            wd = 0.0
    else:
        lr = tc.lr
    return lr * warm, wd
