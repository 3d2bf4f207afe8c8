"""This machine's engine choices: what the probe measured the faster of same-sum kernel
forms to be, for the engine to follow.

Two choices, each per thread count (``{"1": false, "2": true}``), and one size:

* ``stream_prefetch``: does the streaming (one row per pass) ternary kernel issue software
  prefetch? From DRAM it helped on AMD Zen 5 (16.2 -> 18.8 GB/s at 1 thread) and hurt on AMD
  Zen 4 at 1 thread (4-19 % slower at 256 B - 1.4 KB rows, prefetch into L1) but not at 2;
* ``stream``: do the long rows (320 B - 4 KB) of DRAM-resident pools run that streaming kernel
  at all, or the 4-row pass (tern.kernels.policy.stream_row_bytes)? With the row passes'
  prefetch into L2 the 4-row pass read DRAM at 83-94 % of the read kernel's rate on Zen 4
  at 1 thread, faster than the stream (benchmarks/README, "The row passes' prefetch into L2").
* ``llc_bytes``: the last-level cache the streaming rule compares the pools with, where the
  probe's read curve shows the cache much smaller than the OS declares (a VM's slice of a
  large shared L3: tern.core.host_queries.measured_llc_bytes); absent, the OS's size.

``tern probe`` times the three forms at each thread count on the host it runs on
(tern.probe.stream_prefetch), writes the choices here, and the engine's defaults
(``Engine(stream="auto", stream_prefetch="auto")``) read the entries of its thread count
(:func:`for_threads`). Without a file, or on a CPU the file does not know, the engine streams
and prefetches (:data:`DEFAULT_STREAM`, :data:`DEFAULT_STREAM_PREFETCH`: what every engine
before the choices did).

The file is small JSON, one entry per CPU (:func:`cpu_key`: vendor, family, model,
stepping and model name, so a home directory shared by different machines keeps each
one's choice): ``$TERN_TUNING_FILE``, else ``$XDG_CACHE_HOME/tern/engine_tuning.json``,
else ``~/.cache/tern/engine_tuning.json``. It is versioned and checksummed, written
atomically; a file that fails validation is ignored with a warning (the defaults apply),
never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import warnings
from pathlib import Path
from typing import Any

from tern.core.records import atomic_write_json

FORMAT = "tern-engine-tuning"
VERSION = 1
DEFAULT_STREAM_PREFETCH = True
DEFAULT_STREAM = True
CHOICES = ("stream_prefetch", "stream")  # each {threads (str): bool}; a plain bool (every thread count) is read too


class TuningFileWarning(UserWarning):
    """The engine tuning file could not be used (the defaults apply)."""


def tuning_path() -> Path:
    """Where this user's tuning file lives (see the module docstring)."""
    env = os.environ.get("TERN_TUNING_FILE", "").strip()
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "tern" / "engine_tuning.json"


def cpu_key(cpuinfo_path: str | os.PathLike = "/proc/cpuinfo") -> str:
    """Vendor, family, model, stepping and model name of the first CPU in ``/proc/cpuinfo``,
    joined by ``|`` (elsewhere: the platform's machine and processor strings); with numba
    compiling for another CPU (``NUMBA_CPU_NAME``, e.g. an AVX2-only target on this one) that
    target too: its kernels are other code, so it keeps a choice of its own."""
    target = os.environ.get("NUMBA_CPU_NAME", "").strip()
    if target:
        feats = hashlib.sha256(os.environ.get("NUMBA_CPU_FEATURES", "").strip().encode()).hexdigest()[:8]
        target = f"|numba={target}:{feats}"
    fields = {"vendor_id": "", "cpu family": "", "model": "", "stepping": "", "model name": ""}
    try:
        with open(cpuinfo_path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break  # the end of the first processor's block
                k, _, v = line.partition(":")
                if k.strip() in fields:
                    fields[k.strip()] = v.strip()
    except OSError:
        pass
    if not any(fields.values()):
        return f"{platform.machine()}|{platform.processor()}{target}"
    return "|".join(fields.values()) + target


def _checksum(cpus: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(cpus, sort_keys=True).encode()).hexdigest()


def _validate_entry(key: str, entry: Any) -> None:
    if not isinstance(entry, dict):
        raise ValueError(f"entry for {key!r} must be an object, got {type(entry).__name__}")
    for name in CHOICES:
        v = entry.get(name, True)
        ok = isinstance(v, bool) or (isinstance(v, dict) and v and all(
            isinstance(t, str) and t.isdigit() and int(t) >= 1 and isinstance(b, bool) for t, b in v.items()))
        if not ok:
            raise ValueError(f"{key!r}: {name} must be true / false or {{threads: true / false}}, got {v!r}")
    llc = entry.get("llc_bytes")
    if llc is not None and not (isinstance(llc, int) and not isinstance(llc, bool) and llc > 0):
        raise ValueError(f"{key!r}: llc_bytes must be a positive number of bytes, got {llc!r}")


def for_threads(choice: bool | dict[str, bool] | None, threads: int, default: bool = DEFAULT_STREAM_PREFETCH) -> bool:
    """A choice at ``threads``: a plain bool as is; per thread count, the entry of the
    largest measured count <= ``threads`` (else the smallest measured); None: ``default``."""
    if choice is None:
        return default
    if isinstance(choice, bool):
        return choice
    counts = sorted(int(t) for t in choice)
    below = [t for t in counts if t <= threads]
    return bool(choice[str(below[-1] if below else counts[0])])


def read_tuning_file(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Every CPU's entry of the tuning file at ``path``; ValueError naming the problem when
    it is not a valid tuning file (FileNotFoundError when there is none)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file")
    if d.get("version") != VERSION:
        raise ValueError(f"{path}: version {d.get('version')!r}, this tern reads version {VERSION}")
    cpus = d.get("cpus")
    if not isinstance(cpus, dict):
        raise ValueError(f"{path}: 'cpus' must be an object")
    if d.get("sha256") != _checksum(cpus):
        raise ValueError(f"{path}: checksum mismatch (edited or truncated)")
    for key, entry in cpus.items():
        _validate_entry(key, entry)
    return cpus


def load_tuning(path: str | os.PathLike | None = None, key: str | None = None) -> dict[str, Any]:
    """This CPU's entry ({} when there is no file or no entry). A file that fails
    validation is ignored with a :class:`TuningFileWarning`."""
    path = tuning_path() if path is None else Path(path)
    try:
        cpus = read_tuning_file(path)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warnings.warn(f"engine tuning file ignored, defaults apply: {e}", TuningFileWarning, stacklevel=2)
        return {}
    return dict(cpus.get(cpu_key() if key is None else key, {}))


def save_tuning(entry: dict[str, Any], path: str | os.PathLike | None = None, key: str | None = None) -> Path:
    """Write ``entry`` (the :data:`CHOICES` plus any measurement notes) as this CPU's,
    keeping other CPUs' entries of a valid file; atomic. Returns the path."""
    path = tuning_path() if path is None else Path(path)
    key = cpu_key() if key is None else key
    _validate_entry(key, entry)
    try:
        cpus = read_tuning_file(path)
    except (OSError, ValueError):
        cpus = {}  # none yet, or an invalid one: replaced
    cpus = {**cpus, key: entry}
    return atomic_write_json(path, {"format": FORMAT, "version": VERSION, "cpus": cpus, "sha256": _checksum(cpus)})


def tuning_choices(threads: int = 1, path: str | os.PathLike | None = None) -> dict[str, Any]:
    """Every choice of this CPU at ``threads`` from one read of the file: ``{"stream": do
    DRAM-resident pools' long rows run the streaming kernel (else the 4-row pass),
    "stream_prefetch": does that kernel prefetch, "llc_bytes": the last-level cache the
    streaming rule assumes}``; the probe's (:func:`for_threads`), else
    :data:`DEFAULT_STREAM` / :data:`DEFAULT_STREAM_PREFETCH` / None (the OS's size)."""
    entry = load_tuning(path)
    return {"stream": for_threads(entry.get("stream"), threads, DEFAULT_STREAM),
            "stream_prefetch": for_threads(entry.get("stream_prefetch"), threads, DEFAULT_STREAM_PREFETCH),
            "llc_bytes": entry.get("llc_bytes")}


def llc_bytes_here(tuned: dict[str, Any] | None = None) -> int:
    """The last-level cache the engine's rules assume on this machine (``tuned``: a
    :func:`tuning_choices` already read): the probe's ``llc_bytes``, else the OS's size."""
    from tern.core.host_caches import host_llc_bytes

    v = (tuning_choices() if tuned is None else tuned).get("llc_bytes")
    return int(v or host_llc_bytes())


def stream_prefetch_choice(threads: int = 1, path: str | os.PathLike | None = None) -> bool:
    """Does the streaming kernel prefetch on this CPU at ``threads``? (:func:`tuning_choices`)"""
    return tuning_choices(threads, path)["stream_prefetch"]


def stream_choice(threads: int = 1, path: str | os.PathLike | None = None) -> bool:
    """Do DRAM-resident pools' long rows stream on this CPU at ``threads``? (:func:`tuning_choices`)"""
    return tuning_choices(threads, path)["stream"]
