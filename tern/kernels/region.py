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
"""

from __future__ import annotations

import platform

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

STRIDE = 8  # int64 counters per phase: 64 bytes, one cache line each
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def _int64_1d(arr) -> bool:
    return isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.int64 and arr.layout == "C"


def _item_ptr(context, builder, signature, args):
    """Pointer to element args[1] of the array args[0] (an intrinsic's first two arguments)."""
    a = context.make_array(signature.args[0])(context, builder, args[0])
    i = context.cast(builder, args[1], signature.args[1], types.int64)
    return cgutils.get_item_pointer(context, builder, signature.args[0], a, [i])


@intrinsic
def atomic_add(typingctx, arr, idx, val):
    """arr[idx] += val atomically (seq_cst); returns the value before. ``arr`` int64 1-D C."""
    if not _int64_1d(arr):
        return None
    sig = types.int64(arr, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        v = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw("add", _item_ptr(context, builder, signature, args), v, "seq_cst")

    return sig, codegen


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


@numba.njit(cache=True, inline="always")
def claim(ctr, p):
    """The next unclaimed item of phase ``p`` (items are 0, 1, ...; >= the phase's count: none left)."""
    return atomic_add(ctr, p * STRIDE, 1)


@numba.njit(cache=True, inline="always")
def finish(ctr, p):
    """Count one item of phase ``p`` done (after its stores)."""
    atomic_add(ctr, p * STRIDE + 1, 1)


@numba.njit(cache=True)
def wait_done(ctr, p, n):
    """Spin until ``n`` items of phase ``p`` are done."""
    while atomic_load(ctr, p * STRIDE + 1) < n:
        spin_pause()


def phase_counters(n_phases: int) -> np.ndarray:
    """Zeroed counters for ``n_phases`` phases (reset before every region)."""
    if n_phases < 1:
        raise ValueError(f"n_phases must be >= 1, got {n_phases}")
    return np.zeros(n_phases * STRIDE, dtype=np.int64)
