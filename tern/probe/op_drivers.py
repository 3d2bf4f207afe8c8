"""The probe's op-cost drivers (tern.probe.ops): each engine operation's repetition loop
compiled in numba, so no Python call sits in the timed path, and the engine kernel files
whose changes invalidate their cached code."""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np

from tern.kernels.cache_guard import drop_stale_cache


def _drivers():
    from tern.kernels import kernels_blocked as kb
    from tern.kernels import kernels_dense as kd
    from tern.kernels import kernels_stored as ks
    from tern.kernels import kernels_ternary as kt
    from tern.kernels import ops
    from tern.kernels.quant import quantize_act
    from tern.kernels.region import claim, finish, wait_done

    @numba.njit(cache=True)
    def ternary(P, S, xq, out, count, par, skip, stream, prefetch):
        """skip: P is the transposed (inputs, outputs) layout of the activation skip;
        stream: the one-row-per-pass kernel (``prefetch``: its software prefetch)."""
        xs = np.float32(0.01)
        for _ in range(count):
            if skip and par:
                kt.ternary_matvec_skip_par(P, S, xq, xs, out)
            elif skip:
                kt.ternary_matvec_skip(P, S, xq, xs, out)
            elif stream and par:
                kt.ternary_matvec_stream_par(P, S, xq, xs, out, prefetch)
            elif stream:
                kt.ternary_matvec_stream(P, S, xq, xs, out, prefetch)
            elif par:
                kt.ternary_matvec_par(P, S, xq, xs, out)
            else:
                kt.ternary_matvec(P, S, xq, xs, out)

    @numba.njit(cache=True)
    def blocked(P, S, xq, out, count, par):
        """P: a blocked16 matrix (blocks, bytes per block), as the engine runs it (no next matrix)."""
        xs = np.float32(0.01)
        for _ in range(count):
            if par:
                kb.blocked16_matvec_par(P, S, xq, xs, out)
            else:
                kb.blocked16_matvec_next(P, S, xq, xs, out, True, kt.NO_NEXT)

    @numba.njit(cache=True)
    def int8(W, S, x, out, count, par):
        for _ in range(count):
            if par:
                ops.matvec_int8w_par(W, S, x, out)
            else:
                ops.matvec_int8w(W, S, x, out)

    @numba.njit(cache=True)
    def router(Wq, sc, xn, out, count):
        for _ in range(count):
            ks._router_int8(Wq, sc, xn, out)

    @numba.njit(cache=True)
    def fp32(W, x, out, count, par):
        for _ in range(count):
            if par:
                kd.matvec_fp32_parallel_nb(W, x, out)
            else:
                kd.matvec_fp32_nb(W, x, out)

    @numba.njit(cache=True)
    def w16(W, x, out, count, par):
        for _ in range(count):
            if par:
                ks.matvec_w16_par(W, x, out, False)
            else:
                ks.matvec_w16(W, x, out, False)

    @numba.njit(cache=True)
    def ssm(dtw, dtb, AT, Dp, hT, dbc, uc, z, dt, y, count):
        for _ in range(count):
            ops.selective_scan_step(dtw, dtb, AT, Dp, hT, dbc, uc, z, dt, y, 0, dt.shape[0])

    @numba.njit(cache=True)
    def attn(uz, kc, vc, D, W, nh, t, sc, y, count):
        for _ in range(count):
            ops.attend(uz[:D], kc, vc, uz, D, W, nh, np.int64(1), t, sc, y)

    @numba.njit(cache=True)
    def vector(x, g, xn, xq, count):
        s = np.float32(0.0)
        for _ in range(count):
            ops.rmsnorm(x, g, np.float32(1e-5), xn)
            s += quantize_act(xn, xq, np.float32(1e-5))
        return s

    @numba.njit(cache=True, parallel=True)
    def _region(ctr, n_phases, threads):
        for i in range(ctr.shape[0]):  # as ops_region.token_step_region: reset, one region ...
            ctr[i] = 0
        for _tid in numba.prange(threads):  # ... whose threads walk the phases together
            for p in range(n_phases):
                mine = claim(ctr, p) == 0
                if mine:
                    finish(ctr, p)
                wait_done(ctr, p, 1)

    @numba.njit(cache=True)
    def region(ctr, n_phases, threads, count):
        for _ in range(count):
            _region(ctr, n_phases, threads)

    # the cached drivers embed the engine's kernels: drop them when those files changed
    drop_stale_cache(__file__, engine_kernel_deps(), ternary)
    return {"ternary": ternary, "blocked": blocked, "int8": int8, "router": router, "fp32": fp32, "w16": w16, "ssm": ssm,
            "attn": attn, "vector": vector, "region": region}


# the engine files whose code the cached drivers embed (tern.kernels.cache_guard)
ENGINE_KERNEL_DEPS = tuple(f"../kernels/{f}" for f in ("kernels_ternary.py", "kernels_blocked.py", "simd.py",
                                              "ops.py", "quant.py", "kernels_dense.py", "fastmath.py", "kernels_b3.py",
                                              "kernels_stored.py", "prefetch.py", "region.py", "routing.py",
                                              "ssm_step.py", "kernels_unpack.py", "attention.py", "cache_guard.py"))


def engine_kernel_deps() -> tuple[str, ...]:
    """ENGINE_KERNEL_DEPS plus the import-time settings compiled into those kernels
    (tern.kernels.kernels_ternary.COMPILED_SETTINGS, tern.kernels.region.REGION_STAMP): what a
    cached driver's stamp hashes."""
    from tern.kernels import kernels_ternary as kt
    from tern.kernels.region import REGION_STAMP

    return ENGINE_KERNEL_DEPS + (kt.COMPILED_SETTINGS, REGION_STAMP)


_DRIVERS: dict[str, Callable] | None = None


def drivers() -> dict[str, Callable]:
    global _DRIVERS
    if _DRIVERS is None:
        _DRIVERS = _drivers()
    return _DRIVERS


