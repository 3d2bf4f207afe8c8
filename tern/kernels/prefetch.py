"""Software prefetch for the numba kernels, emitted as LLVM IR (``llvm.prefetch``: read,
into L1 and L2 or into L2 only). A hint only: it never faults, so an address past the end of a
row or of an array is harmless, and it changes no result.

* :func:`emit_prefetch` and :func:`prefetch_ahead`, for the row-dot intrinsics (ternary2
  rows: tern.kernels.simd; base-3 rows: tern.kernels.kernels_b3): each full block of a
  pass over ``nrows`` rows prefetches the same bytes of the next pass's rows, at least
  PREFETCH_MIN_BYTES on, into the cache level ROW_PREFETCH_LEVEL;
* :func:`prefetch_line`, the same hint as a numba intrinsic (the scattered rows of the
  activation-skip kernel, tern.kernels.kernels_ternary);
* :func:`prefetch_row` (with :func:`rows_ahead`), every line of a row some rows on, into L2
  for rows up to DENSE_L2_MAX_ROW_BYTES, else L1: the row-at-a-time kernels of the stored
  fp16 / bf16 / int8 tables (heads, routers, tern.kernels.kernels_stored). Not the fp32
  kernels: the hardware prefetcher already streams 4-byte rows, and the hint made them
  slower (below).
"""

from __future__ import annotations

import os

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# Measured on AMD EPYC Zen 5 (2 cores, 1 thread, ~200 MiB base-3 matrices, 4-row pass of
# tern.kernels.kernels_b3): without software prefetch 16-19 GB/s at 1,024 / 4,096 / 14,336
# columns; the next pass's rows or >= 4 KB ahead 24-36 GB/s (distances of 1-2 KB within a
# row helped less; measurements spread +-15 %). 8 KB against 4 KB, same host (session 12,
# `benchmarks/ternary_matvec.py --prefetch-distance 4096,8192`: both compiled in one process,
# runs interleaved; three runs): DRAM 4-row pass at 1 thread x1.22-1.30 at 256 B rows (1,024
# columns) and x1.09-1.13 at 512 B; longer rows, the one-row pass, L3-resident matrices and
# 2 threads (DRAM-bound at ~40 GB/s) alike within the runs' noise. Base-3 4-row pass, one-off
# same-process A/B: x0.97-1.20 (best at 410 B rows from DRAM). 12 and 16 KB were slower than
# 8 KB on scattered 128 KB expert matrices (past a small matrix's end the hint only wastes bandwidth).
PREFETCH_MIN_BYTES = 8192

PREFETCH_LEVELS = {"l1": 3, "l2": 2}  # cache level -> llvm.prefetch locality (x86 prefetcht0 / prefetcht1)


def prefetch_level_setting(text: str, var: str = "TERN_ROW_PREFETCH_LEVEL") -> str:
    """``"l1"`` or ``"l2"`` (case and spaces ignored), else a ValueError naming ``var``."""
    level = text.strip().lower()
    if level not in PREFETCH_LEVELS:
        raise ValueError(f"{var} must be 'l1' or 'l2', got {text!r}")
    return level


# Where the row passes' prefetch (emit_prefetch via tern.kernels.simd and tern.kernels.kernels_b3)
# puts the next pass's rows: L2 (prefetcht1). AMD EPYC Zen 4, 1 thread, 256 MiB from DRAM, 256 B -
# 3.5 KB rows: the 4-row pass read 23.8-25.7 GB/s into L2 (83-94 % of the read kernel) against
# 8.8-15.8 into L1 (benchmarks/README, "The row passes' prefetch into L2").
# TERN_ROW_PREFETCH_LEVEL=l1|l2 overrides it at import (compiled in: PREFETCH_STAMP keys the caches).
ROW_PREFETCH_LEVEL = prefetch_level_setting(os.environ.get("TERN_ROW_PREFETCH_LEVEL", "l2"))
ROW_LOCALITY = PREFETCH_LEVELS[ROW_PREFETCH_LEVEL]


def dense_l2_setting(text: str) -> int:
    """TERN_DENSE_PREFETCH_L2_MAX: a row length in bytes >= 0 (0: every dense row into L1)."""
    if not text.strip().isdigit():
        raise ValueError(f"TERN_DENSE_PREFETCH_L2_MAX must be a row length in bytes >= 0 (e.g. 2048), got {text!r}")
    return int(text)


# The dense row-at-a-time kernels (prefetch_row) put rows of at most this many bytes into L2
# (prefetcht1), longer ones into L1. AMD EPYC Zen 4, 1 thread, 131 MB from DRAM (benchmarks/
# dense_prefetch.py, GB/s into L1 -> into L2): fp16 1,024 columns (2 KB rows: the MoE peer's
# router) 22.1 -> 31.1, int8 1,024 / 2,048 (1 / 2 KB: the 10B pick's head) 15.8 -> 21.5 / 17.1
# -> 22.2; but fp16 2,048 (4 KB: the 1.1B peer's head) 23.4 -> 16.3 and fp16 4,096 15.8 -> 14.8.
DENSE_L2_MAX_ROW_BYTES = dense_l2_setting(os.environ.get("TERN_DENSE_PREFETCH_L2_MAX", "2048"))
# The engine's ternary row passes continue their prefetch past a matrix's end into the matrix it
# reads next (tern.kernels.kernels_ternary._chain_prefetch; tern.kernels.ops.bitlinear_then):
# TERN_CHAIN_PREFETCH=0 turns it off at import (the comparison arm of benchmarks/README's A/B).
def chain_setting(text: str) -> bool:
    """TERN_CHAIN_PREFETCH: ``"1"`` (on) or ``"0"`` (off), spaces ignored, else a ValueError naming it."""
    if text.strip() not in ("0", "1"):
        raise ValueError(f"TERN_CHAIN_PREFETCH must be 0 or 1, got {text!r}")
    return text.strip() == "1"


CHAIN_PREFETCH = chain_setting(os.environ.get("TERN_CHAIN_PREFETCH", "1"))
# the import-time settings of this module, in the cache stamps of modules that compile them in
PREFETCH_STAMP = f"row_prefetch_level={ROW_PREFETCH_LEVEL};dense_l2_max={DENSE_L2_MAX_ROW_BYTES};chain={CHAIN_PREFETCH}"

_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def emit_prefetch(builder, base, off, locality: int = 3) -> None:
    """Prefetch the cache line holding byte ``off`` (i64) of the i8 pointer ``base``; ``locality``
    3: into every level (x86 prefetcht0), 2: into L2 and out (prefetcht1)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
        ir.VoidType(), [ir.PointerType(_I8), _I32, _I32, _I32]), "llvm.prefetch.p0")
    builder.call(fn, [builder.gep(base, [off]), ir.Constant(_I32, 0), ir.Constant(_I32, locality),
                      ir.Constant(_I32, 1)])


def prefetch_ahead(builder, stride0, nrows: int, prefetch: int):
    """Prefetch distance (i64 bytes) of a pass over ``nrows`` rows ``stride0`` bytes apart:
    the same bytes of the next pass's rows (``nrows`` rows on), at least ``prefetch`` bytes."""
    ahead = builder.mul(stride0, ir.Constant(_I64, nrows))
    small = builder.icmp_signed("<", ahead, ir.Constant(_I64, prefetch))
    return builder.select(small, ir.Constant(_I64, prefetch), ahead)


def _line_prefetch(locality: int):
    """An intrinsic ``(arr, row, byte_off)``: prefetch the cache line holding byte ``byte_off`` of
    row ``row`` of a 2-D C-contiguous array (any dtype: the offset is in bytes), at ``locality``."""

    @intrinsic
    def prefetch(typingctx, arr, row, byte_off):
        if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.layout == "C"):
            return None
        sig = types.none(arr, types.int64, types.int64)

        def codegen(context, builder, signature, args):
            a = context.make_array(signature.args[0])(context, builder, args[0])
            r = context.cast(builder, args[1], signature.args[1], types.int64)
            off = context.cast(builder, args[2], signature.args[2], types.int64)
            stride0 = cgutils.unpack_tuple(builder, a.strides)[0]
            emit_prefetch(builder, builder.bitcast(a.data, ir.PointerType(_I8)), builder.add(builder.mul(r, stride0), off),
                          locality)
            return context.get_dummy_value()

        return sig, codegen

    return prefetch


prefetch_line = _line_prefetch(PREFETCH_LEVELS["l1"])  # into L1 (prefetcht0): the dense row-at-a-time kernels
# into L2 only (prefetcht1): the activation-skip kernel's scattered rows. AMD EPYC Zen 4, 1 thread, 256 MiB of
# 2048 x 2048 transposed matrices, a quarter of the rows read, one process, 5 rotating rounds (GB/s of the rows
# read, median): no prefetch 3.38, into L1 2 / 4 / 8 groups ahead 3.46 / 3.35 / 3.48, into L2 5.42 / 6.08 / 5.96
# (16 ahead: 5.68), identical outputs (benchmarks/skip_prefetch.py). Zen 4's L1 prefetches held
# its few L1 miss buffers; into L2 the scattered rows' misses overlap.
prefetch_line_l2 = _line_prefetch(PREFETCH_LEVELS["l2"])
LINE_PREFETCH = {"l1": prefetch_line, "l2": prefetch_line_l2}  # cache level -> the line intrinsic


def skip_prefetch_setting(text: str) -> tuple[int, str]:
    """``"GROUPS,LEVEL"`` (e.g. ``"4,l2"``; TERN_SKIP_PREFETCH) -> (groups >= 0, "l1" | "l2")."""
    parts = [p.strip().lower() for p in text.split(",")]
    if len(parts) != 2 or not parts[0].isdigit() or parts[1] not in PREFETCH_LEVELS:
        raise ValueError(f"TERN_SKIP_PREFETCH must be 'GROUPS,l1' or 'GROUPS,l2' (e.g. '4,l2'), got {text!r}")
    return int(parts[0]), parts[1]


CACHE_LINE_BYTES = 64


@njit(cache=True, inline="always")
def rows_ahead(W):
    """How many rows ahead a row-at-a-time kernel over the 2-D ``W`` prefetches: the first
    row at least PREFETCH_MIN_BYTES on (at least the next one)."""
    row_bytes = W.shape[1] * W.itemsize
    return max(1, (PREFETCH_MIN_BYTES + row_bytes - 1) // max(1, row_bytes))


@njit(cache=True, inline="always")
def row_into_l2(row_bytes, itemsize):
    """Does :func:`prefetch_row` put a row of ``row_bytes`` bytes of ``itemsize``-byte values
    into L2 (else into L1)? Rows of at most DENSE_L2_MAX_ROW_BYTES and int8 rows of any length."""
    return row_bytes <= DENSE_L2_MAX_ROW_BYTES or itemsize == 1


@njit(cache=True, inline="always")
def prefetch_row(W, r, stop):
    """Prefetch every cache line of row ``r`` of the 2-D C-contiguous ``W``; nothing when
    ``r >= stop`` (the end of the caller's rows); into L2 for rows of at most
    DENSE_L2_MAX_ROW_BYTES and for int8 rows of any length, else into L1. int8 rows longer than
    that went into L1 until session 38: AMD EPYC Zen 4, 1 thread, from DRAM (GB/s into L1 -> L2,
    one process, interleaved): the int8 head kernel over 4,096 x 2,560 rows (the d2560 10B picks'
    head) 10.6-11.4 -> 22.9-26.4, the int8 router over 128 x 2,560 8.7 -> 17.7; 1-2 KB rows
    were already in L2. The dense row-at-a-time kernels call it
    with ``r`` = the row being summed + :func:`rows_ahead`. Measured on the Intel Xeon VM
    (2,048 columns from DRAM, 1 thread, one process, interleaved runs, bit-identical
    results; GB/s without -> with, into L1, rows 4-8 KB ahead): fp16 (32,000 rows, 131 MB)
    10.7 -> 11.1-12.0; int8 (64,000 rows, 131 MB) 6.8 -> 12.8-13.4; fp32 (32,000 rows,
    262 MB) 13.3 -> 10.8-11.2, so the fp32 kernels do without it."""
    if r < stop:
        nbytes = W.shape[1] * W.itemsize
        if row_into_l2(nbytes, W.itemsize):
            for off in range(0, nbytes, CACHE_LINE_BYTES):
                prefetch_line_l2(W, r, off)
        else:
            for off in range(0, nbytes, CACHE_LINE_BYTES):
                prefetch_line(W, r, off)
