"""The tern model in torch (docs/MODEL.md): BitLinear, SSM, sliding-window attention,
gated sparse MLP, granular MoE, the language model and generation."""

import os as _os
import sys as _sys

# The fused scan runs numba's OpenMP threads between torch's; GNU OpenMP threads that
# spin for long after each parallel region (the default) then steal the cores from each
# other: ~3x slower training measured on 2 cores. A short spin fixes it. Only effective
# when set before torch / numba load libgomp; an explicit user setting wins.
if "torch" in _sys.modules and not ({"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"} & set(_os.environ)):
    import warnings as _warnings

    _warnings.warn("torch was imported before tern.train.model with the default OpenMP spin policy: "
                   "CPU training may be several times slower. Set GOMP_SPINCOUNT=20000 (or "
                   "OMP_WAIT_POLICY=PASSIVE) in the environment, or import tern first.",
                   RuntimeWarning, stacklevel=2)
_os.environ.setdefault("GOMP_SPINCOUNT", "20000")  # as tern/__init__.py

from tern.train.model.generate import generate_ids, generate_torch  # noqa: E402
from tern.train.model.lm import TernLM, build_model  # noqa: E402

__all__ = ["TernLM", "build_model", "generate_ids", "generate_torch"]
