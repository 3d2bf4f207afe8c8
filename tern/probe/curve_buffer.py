"""The weight bytes every probe curve reads (tern.probe.curves): one buffer, filled once,
mapped from a file as the engine maps a model file, or anonymous memory where the disk has
no room for it."""
from __future__ import annotations

import errno
import mmap
import os
import shutil
import tempfile
import warnings

import numpy as np

from tern.core.host_caches import MIB

BACKINGS = ("file", "anonymous")
DISK_HEADROOM_BYTES = 512 * MIB  # free disk the curve file leaves to everything else
_FILL_CHUNK = 64 * MIB


class CurveBuffer:
    """One buffer of weight bytes reused by every curve (filled once: untouched pages of a
    fresh allocation would all map to the zero page and read from cache). Bytes 0x30-0x3F
    keep fp32 views normal numbers (no denormal slow paths) and are valid int8 weights;
    the ternary kernels' time does not depend on the codes.

    ``backing="file"`` (default) maps the bytes from a file read-only, as the engine maps a
    model file (tern.packed.reader): page-cache pages of 4 KiB. An anonymous numpy array
    (``"anonymous"``) gets transparent huge pages here (numpy asks for them on large
    arrays), and its DRAM-bound matvecs measured up to ~18 % faster than the engine's on a
    file of the same bytes. The file is unlinked as soon as it is mapped, so no temp file
    outlives the probe. Where the temp directory has less than the buffer plus
    :data:`DISK_HEADROOM_BYTES` free, or the disk fills while writing, the buffer falls
    back to anonymous memory with a warning (``self.backing`` says which was used)."""

    def __init__(self, max_bytes: int, seed: int = 0, backing: str = "file") -> None:
        if backing not in BACKINGS:
            raise ValueError(f"curve buffer backing must be one of {BACKINGS}, got {backing!r}")
        if max_bytes < 1:
            raise ValueError(f"curve buffer needs at least 1 byte, got {max_bytes}")
        rng = np.random.default_rng(seed)
        if backing == "file":
            tmp = tempfile.gettempdir()
            free = shutil.disk_usage(tmp).free
            if free < max_bytes + DISK_HEADROOM_BYTES:
                _warn_anonymous(max_bytes, tmp, f"only {free / MIB:,.0f} MiB free")
            else:
                try:
                    self._mmap = _mapped_random_file(max_bytes, rng, tmp)
                except OSError as e:
                    if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    _warn_anonymous(max_bytes, tmp, "the disk filled while writing it")
                    rng = np.random.default_rng(seed)
                else:
                    self.backing = "file"
                    self.data = np.frombuffer(self._mmap, dtype=np.uint8)
                    return
        self.backing = "anonymous"
        self.data = rng.integers(0x30, 0x40, size=max_bytes, dtype=np.uint8)

    def view(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if n > self.data.size:
            raise ValueError(f"curve buffer of {self.data.size} B is smaller than the {n} B asked for")
        return self.data[:n].view(dtype).reshape(shape)


def _mapped_random_file(max_bytes: int, rng: np.random.Generator, directory: str) -> mmap.mmap:
    """Random bytes 0x30-0x3F written to a temp file in ``directory``, mapped read-only; the
    file is unlinked whatever happens."""
    fd, path = tempfile.mkstemp(prefix="tern-curves-", suffix=".bin", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            for start in range(0, max_bytes, _FILL_CHUNK):
                n = min(_FILL_CHUNK, max_bytes - start)
                f.write(rng.integers(0x30, 0x40, size=n, dtype=np.uint8).tobytes())
        with open(path, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    finally:
        os.unlink(path)


def _warn_anonymous(max_bytes: int, directory: str, why: str) -> None:
    warnings.warn(f"no room for the probe's {max_bytes / MIB:,.0f} MiB curve file in {directory} ({why}): "
                  "its curves read anonymous memory instead, whose DRAM-bound matvecs measured up to ~18 % "
                  "faster than the engine's on a mapped model file; free disk space (or set TMPDIR) and "
                  "probe again for the file-backed figures", RuntimeWarning, stacklevel=3)
