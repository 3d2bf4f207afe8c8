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


def test_train_modules_agree_with_the_package():
    # tern.train sets it too (for a process that reaches them first by another route): one value
    import tern.train.loop  # noqa: F401
    import tern.train.model  # noqa: F401

    text = "".join(open(m.__file__).read() for m in (sys.modules["tern.train.loop"], sys.modules["tern.train.model"]))
    assert '"GOMP_SPINCOUNT", "20000"' in text and '"GOMP_SPINCOUNT", "2000"' not in text
