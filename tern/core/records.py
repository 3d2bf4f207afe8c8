"""Run metadata, JSONL benchmark records, robust summaries and atomic writes.

Every benchmark row carries :func:`run_metadata` (host, threads, library versions, git
commit, timestamp) plus its own ``repeats``, ``median`` and spread, so a figure is never
a bare number and every plot can be regenerated from rows.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

# ---- atomic writes ----------------------------------------------------------------------


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temp file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


# ---- metadata ---------------------------------------------------------------------------


@lru_cache(maxsize=1)
def git_commit() -> str:
    """Commit of the tern checkout (with ``+dirty`` if modified), or 'unknown'."""
    root = Path(__file__).resolve().parents[2]  # the checkout
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        if not sha:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("numpy", "numba", "torch", "tern"):
        m = sys.modules.get(mod)
        if m is None and mod in ("numpy", "tern"):
            m = __import__(mod)
        if m is not None:
            out[mod] = getattr(m, "__version__", "unknown")
    return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_metadata(threads: int | None = None) -> dict[str, Any]:
    """Host, thread count, versions, git commit and UTC timestamp for a record."""
    return {
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "threads": threads,
        "versions": library_versions(),
        "git_commit": git_commit(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


# ---- summaries --------------------------------------------------------------------------


def summarize(samples: Sequence[float]) -> dict[str, float | int]:
    """Median, min, max, interquartile range and relative spread of repeated samples."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("summarize needs at least one sample")
    n = len(xs)
    med = statistics.median(xs)
    q1, q3 = (statistics.quantiles(xs, n=4, method="inclusive")[::2] if n > 1 else (xs[0], xs[0]))
    return {
        "repeats": n,
        "median": med,
        "min": xs[0],
        "max": xs[-1],
        "iqr": q3 - q1,
        "spread_rel": (xs[-1] - xs[0]) / med if med else 0.0,
    }


# ---- JSONL ------------------------------------------------------------------------------


def append_jsonl(path: str | os.PathLike, rows: dict[str, Any] | Iterable[dict[str, Any]]) -> None:
    """Append row(s) to a JSONL file, one complete line per write, fsynced."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(rows, dict):
        rows = [rows]
    data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    with open(path, "a", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a torn last line (interrupted write) is skipped, other bad
    lines are an error naming the line."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines):
                continue
            raise ValueError(f"{path}:{i}: not a JSON line ({e})") from None
    return rows
