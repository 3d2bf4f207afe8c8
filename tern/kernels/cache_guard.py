"""numba compile and cache hygiene. numba keys a module's on-disk cache on that file only, yet the
kernels and intrinsics it calls from other files are compiled into its cached code. After
one of those files changes, the cache would keep running the old code. :func:`drop_stale_cache`
removes a module's cache entries when any dependency's content changed since they were
written (a marker file beside them holds the dependencies' hash).

Compiles: a literal argument (``-1``, ``0``, ``False``) in a call from one njit function to
another makes numba compile the callee again, specialised on that value, beside its int64 /
bool form (and everything it calls); so do a ``prange`` index (uint64 after the parfor pass),
an omitted default and a variable first assigned a literal. The engine's per-token calls pass
:data:`NO_ADDR`, :data:`ZERO`, :data:`ONE`, :data:`NO` / :data:`YES` (numpy scalars: typed
int64 / bool) and ``np.int64(tid)`` instead; tests/kernels/test_compile_once.py checks their
call sites. A cold compile of the 28M peer's engine took 173 s before, 126 s after
(benchmarks/compile_time.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

NO_ADDR = np.int64(-1)  # "no matrix here": no next matrix to prefetch, no second matrix in a phase
ZERO, ONE = np.int64(0), np.int64(1)
NO, YES = np.bool_(False), np.bool_(True)


def deps_stamp(module_file: str, deps: Sequence[str]) -> str:
    """sha256 of the dependency files (paths relative to ``module_file``'s folder)."""
    here = Path(module_file).resolve().parent
    h = hashlib.sha256()
    for d in deps:
        try:
            h.update((here / d).read_bytes())
        except OSError:
            h.update(d.encode())
    return h.hexdigest()


def drop_stale_cache(module_file: str, deps: Sequence[str], cached_fn: Callable) -> bool:
    """Delete ``module_file``'s numba cache entries unless they were written with the same
    ``deps`` content; ``cached_fn``: any ``cache=True`` function of that module (locates the
    cache folder). True when entries were dropped."""
    try:
        cache_dir = Path(cached_fn._cache._cache_path)  # numba's FunctionCache location
    except AttributeError:  # pragma: no cover - numba internals moved: nothing to guard
        return False
    stem = Path(module_file).stem
    marker = cache_dir / f"{stem}.deps"
    stamp = deps_stamp(module_file, deps)
    try:
        if marker.read_text() == stamp:
            return False
    except OSError:
        pass
    try:
        for f in cache_dir.glob(f"{stem}.*.nb[ic]"):
            f.unlink()
        cache_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(stamp)
    except OSError:  # read-only install: numba then caches elsewhere or not at all
        return False
    return True
