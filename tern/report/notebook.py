"""Helpers the numbered notebooks share: environment detection and the results folder.

Each notebook's first cell installs tern if needed, then calls :func:`setup`; its
papermill ``parameters`` cell sets ``SMOKE`` and ``RESULTS``; it writes everything it
produces under :func:`results_dir` (RESULTS) so later notebooks and ``tern report`` can
read it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tern.core.host_caches import usable_cpus

# The set-up cell every notebook starts with (tests/report/test_notebooks.py checks that each
# notebook's first code cell is exactly this). It runs before tern is importable, so it may
# use the standard library only; tests/report/test_install_cell.py runs it with fake upload
# folders, environment variables and a stand-in pip.
INSTALL_CELL = '''\
# Set-up: install tern if it is not importable (Kaggle / Colab), then describe the machine.
import glob, importlib, importlib.util, os, subprocess, sys

def tern_source(env=os.environ, places=("/kaggle/input", ".", "/content")):
    # what to pip-install: $TERN_SRC (a path, a wheel or a git URL), else an uploaded wheel
    if env.get("TERN_SRC"):
        return env["TERN_SRC"]
    for place in places:
        wheels = [w for d in ("", "*", "*/*") for w in glob.glob(os.path.join(place, d, "tern-*.whl"))]
        if wheels:
            return max(wheels, key=os.path.getmtime)
    raise RuntimeError("tern is not installed. Upload the tern wheel (tern-*.whl: run `pip wheel "
                       "--no-deps -w dist .` in a tern checkout) to this folder, /content (Colab) or a "
                       "Kaggle dataset (Add Input), or set os.environ['TERN_SRC'] to a checkout path, "
                       "a wheel or a git URL of the kit; then run this cell again.")

if importlib.util.find_spec("tern") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", tern_source()], check=True)
    importlib.invalidate_caches()
from tern.report.notebook import setup
ENV = setup()'''


@dataclass(frozen=True)
class NotebookEnv:
    threads: int  # logical CPUs this process may use
    gpus: int  # CUDA devices visible to torch (0 when torch or CUDA is missing)
    gpu_name: str
    platform: str  # "kaggle", "colab" or "local"

    def __str__(self) -> str:
        gpu = f"{self.gpus} x {self.gpu_name}" if self.gpus else "no GPU"
        return f"tern on {self.platform}: {self.threads} CPU thread(s), {gpu}"


def detect_env() -> NotebookEnv:
    threads = usable_cpus()
    gpus, name = 0, ""
    if "torch" in sys.modules or _importable("torch"):
        import torch

        if torch.cuda.is_available():
            gpus = torch.cuda.device_count()
            name = torch.cuda.get_device_name(0)
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ or os.path.exists("/kaggle"):
        plat = "kaggle"
    elif "COLAB_RELEASE_TAG" in os.environ or "google.colab" in sys.modules:
        plat = "colab"
    else:
        plat = "local"
    return NotebookEnv(threads, gpus, name, plat)


def _importable(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def setup() -> NotebookEnv:
    """Detect threads and GPUs, select the non-interactive-safe matplotlib defaults and
    print one line describing the machine."""
    env = detect_env()
    print(env)
    return env


def save_headline(out: str | os.PathLike, notebook: str, figures: dict) -> Path:
    """Record a notebook's headline figures (name -> value with units in the key, e.g.
    ``{"dram_read_1t_gbps": 38.2}``) as ``OUT/headlines/<notebook>.json``; ``tern report``
    puts them on its index page. Values must be JSON-serialisable."""
    import json

    from tern.core.records import atomic_write_text

    p = Path(out) / "headlines" / f"{notebook}.json"
    atomic_write_text(p, json.dumps(figures, indent=1, sort_keys=True, default=float) + "\n")
    return p


def load_headlines(out: str | os.PathLike) -> dict[str, dict]:
    """All headline files under ``OUT/headlines`` keyed by notebook name."""
    import json

    d = Path(out) / "headlines"
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(d.glob("*.json"))}
