"""The tern model in torch (docs/MODEL.md): BitLinear, SSM, sliding-window attention,
gated sparse MLP, granular MoE, the language model and generation."""

from .generate import generate_ids, generate_torch
from .lm import TernLM, build_model

__all__ = ["TernLM", "build_model", "generate_ids", "generate_torch"]
