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
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

# ---- atomic writes ----------------------------------------------------------------------


STALE_TEMP_S = 3600.0  # a temp file untouched this long is an interrupted write, whoever wrote it

# temp names: .<target>.tern-<host tag>-<pid>.<8 random chars>.tmp (this tern), and
# .<target>.<8 random chars>.tmp (older tern versions and tempfile.mkstemp writers)
_TEMP_RE = re.compile(r"^\..+\.tern-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)\.[a-z0-9_]{8}\.tmp$")
_OLD_TEMP_RE = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")


def _host_tag() -> str:
    return f"{zlib.crc32(socket.gethostname().encode('utf-8', 'replace')):08x}"


def temp_prefix(path: str | os.PathLike) -> str:
    """The ``tempfile.mkstemp`` prefix of an atomic write of ``path``: it names this host and
    process, so :func:`clean_stale_temps` can tell an interrupted write from a live one."""
    return f".{Path(path).name}.tern-{_host_tag()}-{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) is not a probe on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists, owned by someone else
        return True
    return True


def clean_stale_temps(folder: str | os.PathLike, max_age_s: float = STALE_TEMP_S) -> list[Path]:
    """Remove the temp files that interrupted atomic writes (a SIGKILL, a power cut) left in
    ``folder``; returns the removed paths. A temp file is stale when the process named in
    its name (:func:`temp_prefix`) is no longer running on this host, or when it has not
    been modified for ``max_age_s`` seconds (temps of other hosts and of older tern
    versions: by age only). A live writer keeps its temp: its process exists and each
    write refreshes the modification time. Never raises: a file that cannot be removed
    or examined is left alone."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    now, host = time.time(), _host_tag()
    for e in entries:
        m = _TEMP_RE.match(e.name)
        if m is None and not _OLD_TEMP_RE.match(e.name):
            continue
        try:
            if not e.is_file(follow_symlinks=False):
                continue
            stale = now - e.stat(follow_symlinks=False).st_mtime > max_age_s
            if not stale and m is not None and m["host"] == host:
                stale = int(m["pid"]) != os.getpid() and not _pid_alive(int(m["pid"]))
            if stale:
                os.unlink(e.path)
                removed.append(Path(e.path))
        except OSError:
            continue
    return removed


def _new_file_mode(path: Path) -> int:
    """The permissions ``path`` keeps (its own when it exists) or a new file gets under this
    process's umask; a temp file is created 0600, and a rename would keep that."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        mask = os.umask(0o022)
        os.umask(mask)
        return 0o666 & ~mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temp file in the same folder and a rename; the
    file gets the permissions a plain write would give it (an existing file's are kept).
    Stale temp files of earlier interrupted writes in that folder are removed first
    (:func:`clean_stale_temps`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(path.parent)
    mode = _new_file_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def check_writable(path: str | os.PathLike) -> Path:
    """``path`` if a file can be written there (its folder is created if missing and a
    throw-away file made and removed in it), else ValueError naming the path and the reason:
    commands that measure for minutes call it before measuring, not at the end."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"cannot write {path}: it is a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise ValueError(f"cannot write {path}: {e.strerror or e}") from None
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


# ---- metadata ---------------------------------------------------------------------------


@lru_cache(maxsize=1)
def git_commit() -> str:
    """Commit of the tern checkout (with ``+dirty`` if modified), or 'unknown'."""
    return checkout_commit(Path(__file__).resolve().parents[2])


def checkout_commit(root: str | Path) -> str:
    """Commit checked out at ``root`` (with ``+dirty`` if its tracked files differ), or 'unknown'
    (the benchmarks that compare checkouts tag their rows with it)."""
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
