"""Importing tern sets libgomp's idle spin (GOMP_SPINCOUNT) before any OpenMP pool starts,
and keeps a value the user set (tern/__init__.py says why 20,000)."""

from __future__ import annotations

import os
import subprocess
import sys


def _spin_after_import(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if env_value is not None:
        env["GOMP_SPINCOUNT"] = env_value
    code = "import os, tern; print(os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_import_sets_the_spin_count_and_keeps_the_users():
    assert _spin_after_import(None) == "20000"
    assert _spin_after_import("123") == "123"


def _import_warnings(code: str, **env_set: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(env_set)
    out = subprocess.run([sys.executable, "-W", "always::RuntimeWarning", "-c", code], env=env,
                         capture_output=True, text=True, check=True)
    return out.stderr


def test_torch_imported_before_tern_is_warned_once_the_training_model_loads():
    """torch's libgomp reads the spin when torch loads: imported before tern (and no policy of the
    user's), tern's value comes too late for torch's pool, and tern.train.model says so."""
    late = "import torch, tern.train.model"
    assert "torch was imported before tern" in _import_warnings(late)
    assert "torch was imported before tern" not in _import_warnings(late, GOMP_SPINCOUNT="777")
    assert "torch was imported before tern" not in _import_warnings(late, OMP_WAIT_POLICY="PASSIVE")
    assert "torch was imported before tern" not in _import_warnings("import tern.train.model, torch")


def test_one_place_sets_the_spin():
    """tern/__init__.py alone sets it (every tern module imports the package first)."""
    import tern.train.loop  # noqa: F401
    import tern.train.model  # noqa: F401

    for m in ("tern.train.loop", "tern.train.model"):
        assert "GOMP_SPINCOUNT\", \"2" not in open(sys.modules[m].__file__).read(), m
