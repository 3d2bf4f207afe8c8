"""The memory side of the op-cost model: how much longer than on cache-resident data the
engine's matvecs take at a pool's working set, read off the host's measured kernel curves
(tern.probe.curves). tern.predict.inventory counts the work; this prices its stall;
tern.predict.roofline adds both."""

from __future__ import annotations

from typing import Any

import numpy as np

from tern.core.host_profile import op_cost_for, op_curve_for, op_curve_pair, op_curve_trio
from tern.core.host_queries import OP_WEIGHT_BYTES, ROUTER_OP, ROW_CURVE_OPS, row_stall_factor
from tern.predict.inventory import COST_FALLBACK, Work, WorkKey, add_work, priced_op


def _curve_split(key: WorkKey, threads: int) -> str:
    """The measured curve split that prices ``key`` at ``threads``: one-region items run as
    concurrent single-thread calls, as the expert-parallel ones ("experts" curves)."""
    if threads <= 1:
        return "serial"
    return "experts" if key.split in ("items", "region_experts") else key.split


def _serial_reference(key: WorkKey, threads: int) -> bool:
    """Is ``key``'s curve read against the single-thread curve (expert-parallel work: each
    group of the "experts" curves starts a parallel region, which the per-matrix step's
    expert-parallel layers pay too) rather than against its own cache-resident start?"""
    return key.split == "experts" and threads > 1


def _curve_slowdown(host: Any, key: WorkKey, threads: int, ws: float) -> float | None:
    """How many times longer than on cache-resident data each weight of ``key``'s op takes
    at working set ``ws``, from the profile's measured kernel curves (None: no curve).
    The curve's fixed part per call (the op cost's call and per-row terms at the curve's
    shape) is taken out first, so only the per-weight part scales."""
    split = _curve_split(key, threads)
    curve = op_curve_for(host.op_curves, key.op, split, threads)
    if curve is None:
        return None
    ref = op_curve_for(host.op_curves, key.op, "serial", 1) if _serial_reference(key, threads) else curve
    if ref is None:
        return None
    t_cost, _ = key.priced_at(threads)
    cost = op_cost_for(host.op_costs, key.op, t_cost)
    rows = curve.cols if key.op == "ternary_skip" else curve.rows  # the skip's rows are its outputs
    t_ref = ref.seconds[0]
    fixed = 0.0 if cost is None else min(cost.call_s + cost.row_s * rows, 0.5 * t_ref)
    return max(curve.seconds_at(ws) - fixed, 0.0) / (t_ref - fixed)


def _per_call_at(pair: tuple[Any, Any], ws: float, weights: float, first: bool = False) -> float:
    """Seconds per call of a matrix reading ``weights`` weights at working set ``ws``,
    linear in the weights read through the two measured shapes of ``pair`` (``first``: at
    each curve's smallest, cache-resident working set)."""
    w_s, w_l = (c.rows * c.cols * c.density for c in pair)
    t_s, t_l = (c.seconds[0] if first else c.seconds_at(ws) for c in pair)
    return t_s + (weights - w_s) * (t_l - t_s) / (w_l - w_s)


def _trio_per_call_at(trio: tuple[Any, Any, Any], ws: float, weights: float, rows: float,
                      first: bool = False) -> float:
    """Seconds per call of a matrix of ``rows`` rows reading ``weights`` weights at working
    set ``ws``: the plane ``a + b x weights + c x rows`` through the three measured shapes
    of ``trio`` (``first``: at each curve's smallest, cache-resident working set). The
    per-row term is measured at the working set, so how much of a long-running matrix's
    per-row work hides the memory stream is the host's, not assumed. A matrix with more (or
    fewer) rows per weight than every measured shape is priced at the nearest measured
    ratio: the plane is a fit over the shapes, not a law beyond them. (The 4m sweep family's
    experts, 2048 x 256 with 64-byte rows, extrapolated 2x past the 2048 x 512 shape priced
    a per-row DRAM stall that the engine does not pay: Intel Xeon host compiled for AVX2,
    4m-e640 / 4m-e1309 at 1 thread measured 1.32 / 1.30x their predictions; held at the
    measured range: 49 / 50 within +-20 % there instead of 45, no committed host worse.)"""
    A = np.array([[1.0, c.rows * c.cols * c.density, float(c.cols if c.op == "ternary_skip" else c.rows)]
                  for c in trio])
    t = np.array([c.seconds[0] if first else c.seconds_at(ws) for c in trio])
    a, b, c = np.linalg.solve(A, t)
    if weights > 0:  # rows per weight held within the measured shapes' range: the plane is not extrapolated
        per_weight = A[:, 2] / A[:, 1]
        rows = min(max(rows, weights * float(per_weight.min())), weights * float(per_weight.max()))
    return float(a + b * weights + c * rows)


def _pair_extra_per_call(host: Any, key: WorkKey, threads: int, ws: float, weights: float,
                         rows: float | None = None) -> float | None:
    """Seconds one call of ``key``'s op reading ``weights`` weights over ``rows`` rows takes
    at working set ``ws`` beyond the same call on cache-resident data, from the measured
    matrix shapes: three (:func:`~tern.core.host_profile.op_curve_trio`: per-call,
    per-weight and per-row terms) where the profile has them and ``rows`` is given, else two
    (a per-call stall plus a per-weight one); None with fewer. With ``split == "experts"``
    the curve's time is per group of parallel calls and the reference is the single-thread
    curve, as in :func:`_curve_slowdown`; one-region items read the same "experts" curves
    against their own cache-resident start (a group of items starts no parallel region of
    its own, which the curve's groups each do: that cost is not theirs)."""
    split = _curve_split(key, threads)
    if rows is not None:
        trio = op_curve_trio(host.op_curves, key.op, split, threads)
        ref3 = op_curve_trio(host.op_curves, key.op, "serial", 1) if _serial_reference(key, threads) else trio
        if trio is not None and ref3 is not None:
            try:
                return max(0.0, _trio_per_call_at(trio, ws, weights, rows)
                           - _trio_per_call_at(ref3, ws, weights, rows, first=True))
            except np.linalg.LinAlgError:  # degenerate shapes (no row-heavy one): the pair
                pass
    pair = op_curve_pair(host.op_curves, key.op, split, threads)
    ref = op_curve_pair(host.op_curves, key.op, "serial", 1) if _serial_reference(key, threads) else pair
    if pair is None or ref is None:
        return None
    return max(0.0, _per_call_at(pair, ws, weights) - _per_call_at(ref, ws, weights, first=True))


def curve_stall(work: Work, host: Any, threads: int, ws: float) -> tuple[float, float] | None:
    """(seconds, weight bytes) the curve-covered ops of ``work`` take beyond their
    cache-resident cost at working set ``ws``; None when the profile has no kernel curves.
    Where the profile has two matrix sizes of an op's curve, each call's extra time is read
    off them at the op's own matrix size (:func:`_pair_extra_per_call`); else each op's
    per-weight cost is scaled by its curve's slowdown there (:func:`_curve_slowdown`). The
    row passes' extra time is scaled by their row length's stall over the curve's
    (tern.core.host_queries.row_stall_factor: 1.0 for profiles without row curves)."""
    if not getattr(host, "op_curves", ()):
        return None
    stand_in = {op: COST_FALLBACK[op] for op in (ROUTER_OP, "ternary_blocked", "w16_matvec") if priced_op(host, op) != op}
    if stand_in:  # a profile from before: the router as the int8 head's matvec, the blocked pass as the 4-row,
        merged: Work = {}  # fp16 / bf16 as the fp32 matvec of as many bytes (half the weights)
        for key, w in work.items():
            op = stand_in.get(key.op, key.op)
            b = OP_WEIGHT_BYTES.get(key.op, 1.0) / OP_WEIGHT_BYTES.get(op, 1.0)
            add_work(merged, WorkKey(op, key.split, key.experts), w.calls, w.rows, w.units * b, w.tails, w.inputs)
        work = merged
    extra = covered = 0.0
    for key, w in work.items():
        if key.op not in OP_WEIGHT_BYTES or w.calls <= 0:
            continue
        t, divisor = key.priced_at(threads)
        # a call's weights and rows, and the calls one curve group (threads at once) stands for:
        # an items matrix is one group of its items, expert-parallel calls share their groups
        pieces = divisor if key.split == "items" and threads > 1 else 1.0
        # rows longer (or, streamed, shorter) than the curve's stall more or less a byte (tern.probe.row_curves)
        row = (row_stall_factor(host, key.op, threads, w.units / w.rows / 4,
                                "rows" if key.split in ("items", "rows") else "experts")
               if key.op in ROW_CURVE_OPS and w.rows else 1.0)
        per_call = _pair_extra_per_call(host, key, threads, ws, w.units / w.calls / pieces, w.rows / w.calls / pieces)
        if per_call is not None:
            extra += w.calls * per_call * pieces / divisor * row
        else:
            slow = _curve_slowdown(host, key, threads, ws)
            cost = op_cost_for(host.op_costs, key.op, t)
            if slow is None or cost is None:
                continue
            extra += cost.unit_s * w.units * (slow - 1.0) / divisor * row
        covered += w.units * OP_WEIGHT_BYTES[key.op]
    return extra, covered
