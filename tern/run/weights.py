"""Where the engine's weights live: the memory-mapped file, or a copy in anonymous memory
backed by transparent huge pages; and the buffer of tensors it derives at load (:class:`AuxBuffer`).

A memory-mapped file is read through 4 KiB page-cache pages: every 4 KiB of weights costs a
TLB entry, and a token sweeping hundreds of MB misses the TLB on every page. Anonymous
memory advised with ``MADV_HUGEPAGE`` is mapped in 2 MiB pages (when the kernel's
transparent huge pages are ``always`` or ``madvise``), 512 times fewer. Measured on AMD EPYC
(2 cores, THP ``madvise``; benchmarks/op_breakdown.py --compare "weights=map" "weights=copy",
same run, medians of 5): the 1.1B peers shape decodes 41.1 -> 49.6 tok/s at 1 thread and
71.8 -> 82.9 at 2; its 131 MB fp16 head alone reads in 5.9 ms from the file mapping and
4.8 ms from the copy.
The copy costs load time (one pass over the file) and resident memory (the file's size,
beside the page cache the kernel may reclaim); tern.kernels.policy.copy_weights decides.
"""

from __future__ import annotations

import mmap
import re
from typing import Any

import numpy as np

from tern.kernels.kernels_blocked import pack_blocked16
from tern.kernels.packing import expand_b3_to_ternary2, pack_ternary2, pack_ternary_b3

HUGE_PAGE = 2 * 2**20  # x86-64 transparent huge page
_COPY_CHUNK = 64 * 2**20  # bytes copied per step (keeps the page cache readahead streaming)


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo in bytes; None where it cannot be read (not Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def huge_page_buffer(n: int) -> np.ndarray:
    """A writable uint8 array of ``n`` bytes in an anonymous mapping advised for transparent
    huge pages (``MADV_HUGEPAGE`` where the platform has it), starting on a 2 MiB boundary;
    zero-filled, its pages resident only once written. The mapping lives as long as the array."""
    mm = mmap.mmap(-1, int(n) + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # THP disabled or unsupported: plain pages, still a valid buffer
            pass
    whole = np.frombuffer(mm, np.uint8)  # keeps mm alive
    off = (-whole.ctypes.data) % HUGE_PAGE
    return whole[off:off + int(n)]


def huge_page_copy(src: np.ndarray, skip: list[tuple[int, int]] | tuple = ()) -> np.ndarray:
    """A read-only uint8 copy of ``src`` in a :func:`huge_page_buffer`, but for the byte ranges
    ``[start, stop)`` of ``skip`` (what the engine never reads from the file: matrices it re-packed
    into its aux buffer): those stay zero, their pages never written nor resident (but where they share
    a 2 MiB page with copied bytes)."""
    n = int(src.size)
    out = huge_page_buffer(n)
    flat = src.reshape(-1)
    start = 0
    for lo, hi in sorted(skip) + [(n, n)]:
        if not 0 <= lo <= hi <= n:
            raise ValueError(f"skip range [{lo}, {hi}) is not inside the {n} B source")
        for i in range(start, lo, _COPY_CHUNK):
            out[i:min(i + _COPY_CHUNK, lo)] = flat[i:min(i + _COPY_CHUNK, lo)]
        start = max(start, hi)
    out.flags.writeable = False  # the same numba type as the read-only file mapping
    return out


def experts_together(mats: list[np.ndarray], n_experts: int) -> np.ndarray:
    """One flat uint8 array of each routed expert's matrices back to back, expert after expert, from
    ``mats`` (the gate, up and down tensors, each holding ``n_experts`` equal matrices, expert-major): a
    token then reads each chosen expert as one run instead of three runs in three tensors (tern.run.engine's
    experts="together"; measured in benchmarks/README.md, "Each expert's matrices together")."""
    parts = []
    for m in mats:
        b = np.ascontiguousarray(m).reshape(-1).view(np.uint8)
        if n_experts < 1 or b.size % n_experts:
            raise ValueError(f"a {b.size} B expert tensor does not split into {n_experts} equal matrices")
        parts.append(b.reshape(n_experts, -1))
    return np.concatenate(parts, axis=1).reshape(-1)


def tensor_ranges(model, names) -> list[tuple[int, int]]:
    """The ``[start, stop)`` byte ranges in ``model``'s file (tern.packed.reader.PackedModel) of its
    stored tensors ``names``."""
    return [(model.offsets[k], model.offsets[k] + model.tensors[k].nbytes) for k in names]


def mapping_stats(a: np.ndarray) -> dict[str, Any]:
    """{"rss_bytes", "huge_page_bytes"} of the memory mapping holding ``a``'s first byte
    (/proc/self/smaps: Rss, AnonHugePages + FilePmdMapped); empty where it cannot be read."""
    addr = a.ctypes.data
    try:
        with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return {}
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        lo, _, rest = block.partition("-")
        try:
            start, end = int(lo, 16), int(rest.split(" ", 1)[0], 16)
        except ValueError:
            continue
        if start <= addr < end:
            kb = {k: int(v) for k, v in re.findall(r"^(\w+):\s+(\d+) kB", block, re.M)}
            return {"rss_bytes": kb.get("Rss", 0) * 1024,
                    "huge_page_bytes": (kb.get("AnonHugePages", 0) + kb.get("FilePmdMapped", 0)) * 1024}
    return {}


class AuxBuffer:
    """The engine's derived tensors (tern.run.engine: dequantized fp32 matrices, row-oriented
    copies, ...), concatenated 64-byte aligned into one read-only buffer, the ``aux`` of
    tern.kernels.ops."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.size = 0

    def add(self, a: np.ndarray) -> int:
        """Queue ``a`` (C order); returns its address (aux buffer, see tern.kernels.ops)."""
        b = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        off = self.size
        self.parts.append(b)
        pad = (-b.size) % 64
        if pad:
            self.parts.append(np.zeros(pad, np.uint8))
        self.size += b.size + pad
        return off * 2 + 1

    def build(self) -> np.ndarray:
        """The parts in one read-only buffer: on transparent huge pages from HUGE_PAGE bytes (the
        engine's re-packed matrices are read every token, as the file's are), each part released
        once copied (peak memory: the parts plus the largest one)."""
        if not self.parts:
            out = np.zeros(64, np.uint8)
        elif self.size < HUGE_PAGE:
            out = np.concatenate(self.parts)
        else:
            out, off = huge_page_buffer(self.size), 0
            parts, self.parts = self.parts, []
            for i, b in enumerate(parts):
                out[off:off + b.size] = b
                off += b.size
                parts[i] = b = None  # released as copied
        out.flags.writeable = False  # same numba type as the read-only file buffer
        return out


def kernel_matrix(model, name: str, orientation: str, b3: bool, blocked: bool) -> np.ndarray | None:
    """A ternary BitLinear tensor of ``model`` (tern.packed.reader.PackedModel) in the layout the
    engine's kernel reads: None when that is the file's own bytes, else the flat array to put in
    aux: ternary2 rows in ``orientation`` (b3 expanded, or re-packed from the weights), base-3 rows
    (``b3``), or ``blocked`` (tern.kernels.kernels_blocked: each matrix, one per expert, in its own
    16-row blocks, tern.kernels.ops.mat_bytes apart)."""
    p = model.packing[name]
    if p["orientation"] == orientation and p["format"] == ("ternary_b3" if b3 else "ternary2") and not blocked:
        return None
    cols = p["rows"] if orientation == "transposed" else p["cols"]
    if p["orientation"] == orientation and not b3:  # ternary2 as stored, or b3 expanded to it
        pk = model.tensors[f"{name}.packed"]
        flat = pk.reshape(-1, pk.shape[-1])
        if p["format"] != "ternary2":
            flat = expand_b3_to_ternary2(np.ascontiguousarray(flat), cols)
    else:
        wt, _ = model.ternary(name)  # (..., rows, cols)
        if orientation == "transposed":
            wt = np.swapaxes(wt, -1, -2)
        flat = (pack_ternary_b3 if b3 else pack_ternary2)(np.ascontiguousarray(wt).reshape(-1, wt.shape[-1]))
    if blocked:
        flat = np.concatenate([pack_blocked16(m, cols) for m in flat.reshape(-1, p["rows"], flat.shape[-1])])
    return flat
