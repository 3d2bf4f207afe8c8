"""Where results go: the repo checkout a package was imported from and the results folder."""

from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path | None:
    """The tern checkout this package was imported from (None for a site install)."""
    root = Path(__file__).resolve().parents[2]  # tern/core/paths.py -> the checkout
    return root if (root / "pyproject.toml").exists() else None


def results_dir(results: str | os.PathLike = "results") -> Path:
    """The results folder: an absolute path as given; a relative one against the tern
    checkout when there is one, else against the working directory. Created if missing."""
    p = Path(results)
    if not p.is_absolute():
        p = (repo_root() or Path.cwd()) / p
    p.mkdir(parents=True, exist_ok=True)
    return p
