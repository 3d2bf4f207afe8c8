"""Work phases inside one numba parallel region (the engine's per-token region,
tern.kernels.ops_region): atomic counters, claimed work items and the wait between phases.

A token is a fixed sequence of *phases* (an RMSNorm, a matrix, an attention step, ...);
phase ``p`` owns two int64 counters in ``ctr``, a cache line apart from the next phase's:
``ctr[p * STRIDE]`` counts claims, ``ctr[p * STRIDE + 1]`` finished items. Every thread of
the region walks the same sequence; in each phase it claims items (:func:`claim`: an
atomic fetch-and-add) until none is left, runs each one and counts it done
(:func:`finish`), then waits until all the phase's items are done (:func:`wait_done`).

Why claims rather than "thread i takes item i": numba does not promise that the
iterations of a ``prange`` run on distinct, concurrently running threads. With claims
nothing waits for a thread that has not arrived: whichever threads are running take
every item between them (one thread alone takes them all), and a thread waits only for
items some running thread has claimed. A thread that falls behind finds the phases it
missed fully claimed and done and passes through them. So the phase sequence must not
depend on data written during the token (it depends on the model's tables only), and an
item reads its inputs inside the phase, where no thread can have moved on to overwrite them.

Ordering: the counters are sequentially consistent read-modify-writes and an acquire load,
so an item's plain stores are visible to every thread that has seen the phase done.

Phase clock (a diagnostic, off by default): with ``TERN_PHASE_CLOCK=1`` at import the region
step is compiled to keep the CPU's cycle counter when a token's region starts
(``ctr[CLOCK_START]``) and, per phase, when its last item finished (``ctr[p * STRIDE +
CLOCK_END]``, an atomic max over the finishing threads); :func:`phase_clock` reads them back
after a token. benchmarks/region_phases.py times the one-region step's phases with it. The
setting is part of the numba cache stamps (:data:`REGION_STAMP`), so a clocked build never
runs from an unclocked cache or the other way round.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

STRIDE = 8  # int64 counters per phase: 64 bytes, one cache line each
CLOCK_END = 2  # with the phase clock: slot of a phase's end cycle (slots 0 / 1: claims / done)
CLOCK_START = STRIDE - 1  # with the phase clock: the region's start cycle (phase 0's last slot)
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def phase_clock_setting(text: str) -> bool:
    """TERN_PHASE_CLOCK: ``"1"`` (compile the phase clock in) or ``"0"`` (off), spaces ignored,
    else a ValueError naming it."""
    if text.strip() not in ("0", "1"):
        raise ValueError(f"TERN_PHASE_CLOCK must be 0 or 1, got {text!r}")
    return text.strip() == "1"


PHASE_CLOCK = phase_clock_setting(os.environ.get("TERN_PHASE_CLOCK", "0"))
# the import-time setting compiled into the region step, in the cache stamps of the modules that embed it
REGION_STAMP = f"phase_clock={PHASE_CLOCK}"


def _int64_1d(arr) -> bool:
    return isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.int64 and arr.layout == "C"


def _item_ptr(context, builder, signature, args):
    """Pointer to element args[1] of the array args[0] (an intrinsic's first two arguments)."""
    a = context.make_array(signature.args[0])(context, builder, args[0])
    i = context.cast(builder, args[1], signature.args[1], types.int64)
    return cgutils.get_item_pointer(context, builder, signature.args[0], a, [i])


def _atomic_rmw(arr, op: str):
    """The (signature, codegen) of ``arr[idx] = op(arr[idx], val)`` done atomically (seq_cst),
    returning the value before; None (no match) unless ``arr`` is int64 1-D C."""
    if not _int64_1d(arr):
        return None
    sig = types.int64(arr, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        v = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw(op, _item_ptr(context, builder, signature, args), v, "seq_cst")

    return sig, codegen


@intrinsic
def atomic_add(typingctx, arr, idx, val):
    """arr[idx] += val atomically (seq_cst); returns the value before. ``arr`` int64 1-D C."""
    return _atomic_rmw(arr, "add")


@intrinsic
def atomic_load(typingctx, arr, idx):
    """arr[idx] read atomically (acquire). ``arr`` int64 1-D C."""
    if not _int64_1d(arr):
        return None
    sig = types.int64(arr, types.int64)

    def codegen(context, builder, signature, args):
        return builder.load_atomic(_item_ptr(context, builder, signature, args), "acquire", 8)

    return sig, codegen


@intrinsic
def spin_pause(typingctx):
    """The spin-wait hint (x86 ``pause``; nothing elsewhere)."""
    sig = types.none()

    def codegen(context, builder, signature, args):
        if _X86:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def cycles(typingctx):
    """The CPU's cycle counter (``llvm.readcyclecounter``: rdtsc on x86; 0 where the target has none)."""
    sig = types.int64()

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])

    return sig, codegen


@numba.njit(cache=True)
def cycles_now():
    """:func:`cycles` from Python."""
    return cycles()


def cycles_per_second(seconds: float = 0.2) -> float:
    """The cycle counter's rate, against time.perf_counter over ``seconds`` (busy, so the core
    stays awake)."""
    cycles_now()
    t0, c0 = time.perf_counter(), cycles_now()
    while time.perf_counter() - t0 < seconds:
        pass
    return (cycles_now() - c0) / (time.perf_counter() - t0)


@intrinsic
def atomic_max(typingctx, arr, idx, val):
    """arr[idx] = max(arr[idx], val) atomically (seq_cst, signed); returns the value before. ``arr`` int64 1-D C."""
    return _atomic_rmw(arr, "max")


@numba.njit(cache=True, inline="always")
def item_rows(rows, n, i, align):
    """Rows [r0, r1) of work item i of n (contiguous, ``align``-aligned; the last may be short or
    empty): how a phase's rows, output segments, channels or heads are shared out."""
    per = ((rows + n - 1) // n + align - 1) // align * align
    r0 = min(rows, i * per)
    return r0, min(rows, r0 + per)


@numba.njit(cache=True, inline="always")
def claim(ctr, p):
    """The next unclaimed item of phase ``p`` (items are 0, 1, ...; >= the phase's count: none left)."""
    return atomic_add(ctr, p * STRIDE, 1)


@numba.njit(cache=True, inline="always")
def finish(ctr, p):
    """Count one item of phase ``p`` done (after its stores); with the phase clock, its
    finishing cycle too."""
    atomic_add(ctr, p * STRIDE + 1, 1)
    if PHASE_CLOCK:
        atomic_max(ctr, p * STRIDE + CLOCK_END, cycles())


@numba.njit(cache=True, inline="always")
def clock_start(ctr):
    """With the phase clock: the region's start cycle (after the counters' reset)."""
    if PHASE_CLOCK:
        ctr[CLOCK_START] = cycles()


@numba.njit(cache=True)
def wait_done(ctr, p, n):
    """Spin until ``n`` items of phase ``p`` are done."""
    while atomic_load(ctr, p * STRIDE + 1) < n:
        spin_pause()


def thread_count_reader() -> Callable[[], int]:
    """A function returning numba's thread count for the calling thread, without the two locks
    ``numba.get_num_threads()`` takes on every call: the threading layer's own getter (a ctypes
    function numba sets up when it launches its threads), else ``numba.get_num_threads`` itself.
    In a decode loop the public call cost ~10 us a token at 1 thread and ~5 at 2 (Intel Xeon VM,
    28M peer: after a token the caches hold weights, not Python), the getter ~1.5 us
    (tern.run.engine reads it before every token)."""
    numba.get_num_threads()  # launches the threading layer (it defines the getter)
    from numba.np.ufunc import parallel

    fast = getattr(parallel, "_get_num_threads", None)
    return fast if callable(fast) else numba.get_num_threads


def phase_counters(n_phases: int) -> np.ndarray:
    """Zeroed counters for ``n_phases`` phases (reset before every region)."""
    if n_phases < 1:
        raise ValueError(f"n_phases must be >= 1, got {n_phases}")
    return np.zeros(n_phases * STRIDE, dtype=np.int64)


def phase_clock(ctr: np.ndarray, n_phases: int) -> tuple[np.ndarray, np.ndarray]:
    """After a token of the clocked region step: each phase's cycles from the previous phase's
    end (the first: from the region's start) and its items done (1: a single-item phase).
    Raises if the region step was compiled without the clock (TERN_PHASE_CLOCK=1 at import)."""
    if not PHASE_CLOCK:
        raise RuntimeError("the phase clock is off: set TERN_PHASE_CLOCK=1 before tern is imported")
    if not (isinstance(n_phases, (int, np.integer)) and 1 <= n_phases <= ctr.shape[0] // STRIDE):
        raise ValueError(f"n_phases must be in 1..{ctr.shape[0] // STRIDE} (the counters' phases), got {n_phases!r}")
    ends = ctr[CLOCK_END:n_phases * STRIDE:STRIDE] - ctr[CLOCK_START]  # (n_phases,) cycles since the start
    if ends.min() < 0:
        raise ValueError("phase clock: a phase ended before the region started (counters not from one clocked token)")
    return np.diff(ends, prepend=0), ctr[1:n_phases * STRIDE:STRIDE].copy()
