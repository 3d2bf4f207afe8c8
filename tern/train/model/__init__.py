"""The tern model in torch (docs/MODEL.md): BitLinear, SSM, sliding-window attention,
gated sparse MLP, granular MoE, the language model and generation."""

import tern as _tern

# The fused scan runs numba's OpenMP threads between torch's; GNU OpenMP threads that
# spin for long after each parallel region (the default) then steal the cores from each
# other: ~3x slower training measured on 2 cores. tern sets a short spin when imported
# (tern/__init__.py), which torch's pool reads only if torch was not imported first.
if _tern.OMP_SPIN_SET_TOO_LATE:
    import warnings as _warnings

    _warnings.warn("torch was imported before tern with the default OpenMP spin policy: "
                   "CPU training may be several times slower. Set GOMP_SPINCOUNT=20000 (or "
                   "OMP_WAIT_POLICY=PASSIVE) in the environment, or import tern first.",
                   RuntimeWarning, stacklevel=2)

from tern.train.model.generate import generate_ids, generate_torch
from tern.train.model.lm import TernLM, build_model

__all__ = ["TernLM", "build_model", "generate_ids", "generate_torch"]
