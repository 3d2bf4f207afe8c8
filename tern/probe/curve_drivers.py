"""The kernel curves' numba drivers (tern.probe.curves): each op's cycle over a working set's
matrices runs inside numba, in a fixed random order, as the engine calls the kernels, and
:func:`setup_cycle` cuts one point's matrices out of the curve buffer."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numba
import numpy as np

from tern.core.host_queries import ROUTER_OP
from tern.kernels.cache_guard import drop_stale_cache
from tern.probe.curve_buffer import CurveBuffer
from tern.probe.op_drivers import engine_kernel_deps

SKIP_DENSITY = 0.25  # fraction of nonzero inputs of the skip kernel's curve
CURVE_OPS = ("ternary_matvec", "ternary_stream", "ternary_blocked", "ternary_skip", "int8_matvec", "fp32_matvec",
             "w16_matvec", ROUTER_OP)


# ---- numba drivers: the cycle over the matrices runs inside numba ---------------------------
def _drivers() -> dict[str, Callable]:
    from tern.kernels import kernels_blocked as kb
    from tern.kernels import kernels_dense as kd
    from tern.kernels import kernels_stored as ks
    from tern.kernels import kernels_ternary as kt
    from tern.kernels import ops

    @numba.njit(cache=True)
    def blocked(P, order, S, xq, out, passes, par):
        """P (k, blocks, bytes per block): every matrix once per pass in ``order``, chained as the engine's step."""
        xs = np.float32(0.01)
        n = order.shape[0]
        for _ in range(passes):
            for i in range(n):
                if par:
                    kb.blocked16_matvec_par(P[order[i]], S, xq, xs, out)
                else:
                    kb.blocked16_matvec_next(P[order[i]], S, xq, xs, out, True, P[order[(i + 1) % n]])

    @numba.njit(cache=True, parallel=True)
    def blocked_experts(P, order, S, xq, outs, passes):
        """Groups of ``outs.shape[0]`` blocked16 matrices at once, one per thread slot (nothing chained)."""
        xs = np.float32(0.01)
        slots = outs.shape[0]
        for _ in range(passes):
            for base in range(0, P.shape[0] - slots + 1, slots):
                for c in numba.prange(slots):
                    kb.blocked16_matvec_next(P[order[base + c]], S, xq, xs, outs[c], True, kt.NO_NEXT)

    @numba.njit(cache=True)
    def ternary(P, order, S, xq, out, passes, par, skip, stream, prefetch):
        """P (k, rows, row_bytes): every matrix once per pass, in ``order`` (``prefetch``: the
        streaming kernel's software prefetch)."""
        xs = np.float32(0.01)
        for _ in range(passes):
            for m in order:
                if skip and par:
                    kt.ternary_matvec_skip_par(P[m], S, xq, xs, out)
                elif skip:
                    kt.ternary_matvec_skip(P[m], S, xq, xs, out)
                elif stream and par:
                    kt.ternary_matvec_stream_par(P[m], S, xq, xs, out, prefetch)
                elif stream:
                    kt.ternary_matvec_stream(P[m], S, xq, xs, out, prefetch)
                elif par:
                    kt.ternary_matvec_par(P[m], S, xq, xs, out)
                else:
                    kt.ternary_matvec(P[m], S, xq, xs, out)

    @numba.njit(cache=True, parallel=True)
    def ternary_experts(P, order, S, xq, outs, passes, skip, stream, prefetch):
        """Groups of ``outs.shape[0]`` matrices at once, one per thread slot, each with the
        single-thread kernel (the engine's expert-parallel routed experts)."""
        xs = np.float32(0.01)
        slots = outs.shape[0]
        for _ in range(passes):
            for base in range(0, P.shape[0] - slots + 1, slots):
                for c in numba.prange(slots):
                    m = order[base + c]
                    if skip:
                        kt.ternary_matvec_skip(P[m], S, xq, xs, outs[c])
                    elif stream:
                        kt.ternary_matvec_stream(P[m], S, xq, xs, outs[c], prefetch)
                    else:
                        kt.ternary_matvec(P[m], S, xq, xs, outs[c])

    @numba.njit(cache=True)
    def int8(W, order, S, x, out, passes, par):
        for _ in range(passes):
            for m in order:
                if par:
                    ops.matvec_int8w_par(W[m], S, x, out)
                else:
                    ops.matvec_int8w(W[m], S, x, out)

    @numba.njit(cache=True)
    def router(W, order, S, x, out, passes):
        for _ in range(passes):
            for m in order:
                ks._router_int8(W[m], S, x, out)

    @numba.njit(cache=True)
    def fp32(W, order, x, out, passes, par):
        for _ in range(passes):
            for m in order:
                if par:
                    kd.matvec_fp32_parallel_nb(W[m], x, out)
                else:
                    kd.matvec_fp32_nb(W[m], x, out)

    @numba.njit(cache=True)
    def w16(W, order, x, out, passes, par):
        for _ in range(passes):
            for m in order:
                if par:
                    ks.matvec_w16_par(W[m], x, out, False)
                else:
                    ks.matvec_w16(W[m], x, out, False)

    drop_stale_cache(__file__, engine_kernel_deps(), ternary)
    return {"ternary": ternary, "ternary_experts": ternary_experts, "blocked": blocked,
            "blocked_experts": blocked_experts, "int8": int8, "router": router, "fp32": fp32, "w16": w16}


@lru_cache(maxsize=1)
def drivers() -> dict[str, Callable]:
    return _drivers()


def setup_cycle(op: str, split: str, threads: int, shape: tuple[int, int], n_mats: int, buf: CurveBuffer,
                rng: np.random.Generator, stream_prefetch: bool = True) -> Callable[[int], None]:
    """``run(passes)``: ``passes`` cycles over ``n_mats`` matrices of ``shape`` cut from ``buf``,
    in a random order drawn from ``rng``, each read by ``op``'s engine kernel as ``split`` on
    ``threads`` threads."""
    if op not in CURVE_OPS:  # before any prefix test below: "ternary_x" is no kernel
        raise ValueError(f"no working-set curve for op {op!r}; ops: {sorted(CURVE_OPS)}")
    d = drivers()
    f32 = np.float32
    r, c = shape
    par = split == "rows"
    order = rng.permutation(n_mats).astype(np.int64)  # routed experts come in no useful order
    if op == "ternary_blocked":
        from tern.kernels.kernels_blocked import blocked16_shape
        P = buf.view(np.uint8, (n_mats, *blocked16_shape(r, c)))
        xq, S = rng.integers(-127, 128, c).astype(np.int8), np.ones(r, f32)
        outs = np.zeros((threads, r), f32)  # an output per thread slot (serial: the first)
        if split == "experts":
            return lambda n: d["blocked_experts"](P, order, S, xq, outs, n)
        return lambda n: d["blocked"](P, order, S, xq, outs[0], n, par)
    if op.startswith("ternary"):
        rb = (c + 3) // 4
        P = buf.view(np.uint8, (n_mats, r, rb))
        skip, stream = op == "ternary_skip", op == "ternary_stream"
        if skip:  # (inputs r, outputs c): a quarter of the inputs nonzero, at random
            xq = np.where(rng.random(r) < SKIP_DENSITY, rng.integers(1, 128, r), 0).astype(np.int8)
            n_out = c
        else:
            xq = rng.integers(-127, 128, c).astype(np.int8)
            n_out = r
        S = np.ones(n_out, f32)
        if split == "experts":
            outs = np.zeros((threads, n_out), f32)
            return lambda n: d["ternary_experts"](P, order, S, xq, outs, n, skip, stream, stream_prefetch)
        out = np.zeros(n_out, f32)
        return lambda n: d["ternary"](P, order, S, xq, out, n, par, skip, stream, stream_prefetch)
    if op == "int8_matvec":
        W = buf.view(np.int8, (n_mats, r, c))
        S, x, out = np.ones(r, f32), rng.standard_normal(c).astype(f32), np.zeros(r, f32)
        return lambda n: d["int8"](W, order, S, x, out, n, par)
    if op == ROUTER_OP:
        W = buf.view(np.int8, (n_mats, r, c))
        S, x, out = np.full(r, 0.01, f32), rng.standard_normal(c).astype(f32), np.zeros(r, f32)
        return lambda n: d["router"](W, order, S, x, out, n)
    if op == "fp32_matvec":
        W = buf.view(np.float32, (n_mats, r, c))
        x, out = rng.standard_normal(c).astype(f32), np.zeros(r, f32)
        return lambda n: d["fp32"](W, order, x, out, n, par)
    if op == "w16_matvec":  # the buffer's bytes 0x30-0x3F read as fp16 bits are normal numbers (0.13-1.9)
        W = buf.view(np.uint16, (n_mats, r, c))
        x, out = rng.standard_normal(c).astype(f32), np.zeros(r, f32)
        return lambda n: d["w16"](W, order, x, out, n, par)
    raise AssertionError(f"setup_cycle: op {op!r} is in CURVE_OPS without a driver")
