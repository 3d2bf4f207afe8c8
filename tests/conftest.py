"""Shared test fixtures: the small model shapes several stages test against.

Tests import the constants (``from conftest import SMALL``) where a shape is needed at
collection time (parametrize, module-level fixtures), or take the fixtures of the same name.
Shapes whose parameter / byte counts a test checks by hand (tests/core/test_config.py,
tests/predict/test_roofline.py, tests/measure/test_sweep.py) stay next to those numbers.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tern.core.config import ModelConfig

# every feature at once, small enough for exact torch-vs-engine comparisons: SSM + attention
# (window 8), a dense MLP layer and two MoE layers with a shared expert, odd sizes (97, 48)
SMALL = ModelConfig(name="small", vocab_size=97, d_model=48, n_layers=3, attn_layers=(1,), n_heads=4,
                    attn_window=8, d_state=8, mlp_hidden=40, moe_layers=(1, 2), n_experts=5, top_k=2,
                    expert_hidden=24, n_shared=1, shared_hidden=20)

# the training tests' model: MoE in every layer, a 32-token context, trains in well under a second
TRAIN_TINY = ModelConfig(name="tiny", vocab_size=64, d_model=32, n_layers=2, attn_layers=(1,), n_heads=2,
                         attn_window=8, d_state=4, mlp_hidden=0, moe_layers=(0, 1), n_experts=4, top_k=2,
                         expert_hidden=16, n_shared=1, shared_hidden=16, max_seq_len=32)


@pytest.fixture(scope="session", autouse=True)
def private_engine_tuning(tmp_path_factory):
    """Tests never read or write this user's engine tuning file (tern.core.engine_tuning):
    TERN_TUNING_FILE points into a session temp folder (subprocesses inherit it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TERN_TUNING_FILE", str(tmp_path_factory.mktemp("tuning") / "engine_tuning.json"))
        yield


@pytest.fixture(scope="session")
def small_cfg() -> ModelConfig:
    return SMALL


@pytest.fixture(scope="session")
def train_tiny_cfg() -> ModelConfig:
    return TRAIN_TINY


def engine_logits(eng, tokens) -> np.ndarray:
    """(T, V) float32: the logits an engine gives after each of ``tokens``, from a reset state."""
    eng.reset()
    return np.stack([eng.step(int(t)) for t in tokens])


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    """A random-weight packed file of SMALL (seed 5), one per test module."""
    from tern.packed.writer import random_model

    return random_model(SMALL, tmp_path_factory.mktemp("small") / "small.tern", seed=5, progress=False)


def assert_one_line_error(err: str, *needles: str) -> None:
    """``err`` (a command's stderr) is exactly one line, no traceback, holding every needle."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(n in lines[0] for n in needles), (needles, err)


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py imported as module ``name``, registered in sys.modules so numba's
    cache entries name an importable module (the script runs under the same name; an
    unregistered module is cached as '<dynamic>', unloadable)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
