"""Step 3 — train: the torch model (model/), the training loop (CPU / CUDA / torchrun DDP),
checkpoints, distillation, and export of a checkpoint to a packed file.

Public names are re-exported lazily (tern.core.lazy): ``from tern.train import X`` imports only
the submodule defining X."""

from tern.core.lazy import lazy_exports

_EXPORTS = {
    "TernLM": "model.lm",
    "TrainConfig": "config",
    "build_model": "model.lm",
    "generate_ids": "model.generate",
    "generate_torch": "model.generate",
    "launch_torchrun": "launch",
    "load_checkpoint": "checkpoint",
    "make_nll_fn": "loop",
    "plot_run": "plots",
    "preset_configs": "launch",
    "read_checkpoint": "checkpoint",
    "run_distill": "distill",
    "run_training": "loop",
    "save_checkpoint": "checkpoint",
    "train_auto": "launch",
    "train_headline": "loop",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
