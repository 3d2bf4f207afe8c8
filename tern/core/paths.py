"""Where things are: the checkout a package was imported from, the folders the kit ships
(``data/``, ``gates/``, ``notebooks/``) and the results folder.

A checkout reads its shipped folders in place. A site install (a wheel, an sdist or a git
URL: ``pip install`` builds a wheel) carries copies of them as package data under
``tern/_shipped/`` (``setup.py`` copies them there at build time), so the notebooks, the
corpus, the tokenizers and the gate files work without the source tree.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # tern/
SHIPPED_DIR = PACKAGE_DIR / "_shipped"  # a site install's copy of data/, gates/, notebooks/
SHIPPED_FOLDERS = ("data", "gates", "notebooks")


@lru_cache(maxsize=1)
def repo_root() -> Path | None:
    """The tern checkout this package was imported from (None for a site install)."""
    root = PACKAGE_DIR.parent
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return root if 'name = "tern"' in text else None  # not some other project's pyproject


def shipped_candidates(name: str) -> list[Path]:
    """Where a shipped folder can be, in the order :func:`shipped_dir` looks."""
    if name not in SHIPPED_FOLDERS:
        raise ValueError(f"unknown shipped folder {name!r}; one of {SHIPPED_FOLDERS}")
    root = repo_root()
    return ([root / name] if root else []) + [SHIPPED_DIR / name]


def shipped_dir(name: str) -> Path:
    """A folder the kit ships (``"data"``, ``"gates"`` or ``"notebooks"``): the checkout's
    when the package was imported from one, else the installed package data. Raises
    FileNotFoundError naming every place it looked when there is none."""
    places = shipped_candidates(name)
    for p in places:
        if p.is_dir():
            return p
    raise FileNotFoundError(f"no shipped {name}/ folder: looked at {', '.join(map(str, places))} "
                            f"(reinstall tern from a wheel, an sdist or a checkout)")


def results_dir(results: str | os.PathLike = "results") -> Path:
    """The results folder: an absolute path as given; a relative one against the tern
    checkout when there is one, else against the working directory. Created if missing."""
    p = Path(results)
    if not p.is_absolute():
        p = (repo_root() or Path.cwd()) / p
    p.mkdir(parents=True, exist_ok=True)
    return p
