"""The row passes' memory stall against row length, measured (host profile version 5).

The kernel curves (tern.probe.curves) time the 4-row ternary pass on 256-byte rows and the
streaming pass on 1 KiB rows. From DRAM a pass stalls by an amount that depends on its row
length as well: the 4-row pass reads its rows as four streams one row apart, which the
hardware prefetchers follow less well once rows are longer. Intel Xeon VM (session 33, one
thread, ~256 KiB matrices cycled in random order over 512 MiB): the 4-row pass stalled
27 ps a byte beyond its cache-resident time on 256 B rows, 35 on 512 B, 44 on 640 B and
1 KiB, 48 on 2 KiB; so a model whose mixers have 640 B rows (d_model 2560) decoded ~18 %
slower at 1 thread than the curves of 256 B rows predicted. (A layout with each 4-row block
interleaved every 64 B, one sequential stream, read 12-13 GB/s there against the row-major
pass's 14-16: the streams are not the only cause, and the layout was not kept.)

So the stall is measured against row length too: each pass runs as the curves run it (a
cycle of ~256 KiB matrices in random order: :func:`tern.probe.curves.measure_curve`) on
matrices of each row length of :data:`ROW_BYTES`, at two working sets, one matrix (cache
resident) and the curves' largest (DRAM), at one thread and, at each larger thread count,
both ways the engine runs a matrix there: ``threads`` single-thread calls on different
matrices at once ("experts", as expert-parallel experts) and one matrix's rows over the
threads ("rows", as the one-region step's items). The predictor scales each matrix's curve
stall by its row length's stall per byte over the curve row length's, read off the curves
of the way it runs (tern.core.host_queries.row_stall_factor). Intel Xeon VM, 2 threads, 640 B
rows: 1.30x the 256 B rows' stall on different matrices, 1.13x within one matrix (23:58 UTC);
the 2-thread predictions of three long-row ~10B models moved from 1.03 / 1.11 / 1.03 of their
measurements (different-matrix factors for every matrix) to 0.98 / 1.08 / 1.02.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from tern.core.engine_tuning import for_threads
from tern.core.host_caches import KIB, MIB
from tern.core.host_profile import OpCurve
from tern.core.host_queries import ROW_CURVE_OPS, row_stall_ratios
from tern.probe.curve_buffer import CurveBuffer
from tern.probe.curves import CURVE_SHAPES, measure_curve
from tern.probe.timing import TimingConfig

# packed bytes per row timed (each op's curve row length among them: its reference)
ROW_BYTES = {"ternary_matvec": (256, 384, 512, 640, 1024, 1536, 2048, 4096),
             "ternary_stream": (320, 512, 640, 1024, 2048, 4096)}
QUICK_ROW_BYTES = {"ternary_matvec": (256, 640, 2048), "ternary_stream": (512, 1024, 4096)}
MATRIX_BYTES = 256 * KIB  # weights of one matrix of the cycle, as the curves' main shapes
DRAM_BYTES = 512 * MIB  # the curves' largest working set (quick: QUICK_DRAM_BYTES)
QUICK_DRAM_BYTES = 256 * MIB
# a ratio of two stalls, each a difference of two times, on a host that drifts by 5-15 %
# within minutes: every row length of a pass is timed once per round, ROUNDS rounds in turn,
# and each point keeps the median over the rounds (one 512 MiB cycle is ~35 ms)
ROUNDS = 3
TIMING = TimingConfig(min_time_s=0.03, repeats=1, warmup_s=0.0)


def reference_row_bytes(op: str) -> int:
    """The row length (packed bytes) of ``op``'s kernel curve."""
    return CURVE_SHAPES[op][1] // 4


def row_shape(row_bytes: int) -> tuple[int, int]:
    """(rows, cols) of a ~MATRIX_BYTES ternary2 matrix of ``row_bytes`` rows (rows a multiple of 16)."""
    if not (isinstance(row_bytes, int) and row_bytes >= 1):
        raise ValueError(f"row_bytes must be an integer >= 1, got {row_bytes!r}")
    return max(16, MATRIX_BYTES // row_bytes // 16 * 16), 4 * row_bytes


def row_curve_plan(threads: tuple[int, ...] = (1,), quick: bool = False) -> list[tuple[str, str, int, int]]:
    """(op, split, threads, row bytes) of every row curve a probe measures: one thread, and at
    each larger thread count both ways the engine runs a matrix there ("experts": single-thread
    calls on different matrices at once; "rows": one matrix's rows over the threads, as the
    one-region step's items); quick: one thread, three row lengths per op."""
    table = QUICK_ROW_BYTES if quick else ROW_BYTES
    runs = [("serial", 1)] + ([] if quick else [(s, t) for t in sorted(set(threads) - {1}) for s in ("experts", "rows")])
    return [(op, split, t, rb) for split, t in runs for op in ROW_CURVE_OPS for rb in table[op]]


def measure_row_curves(threads: tuple[int, ...] = (1,), quick: bool = False, progress: bool = True,
                       timing: TimingConfig | None = None, dram_bytes: int | None = None,
                       stream_prefetch: bool | dict[str, bool] = True) -> list[OpCurve]:
    """One two-point curve (a cache-resident and a DRAM working set) per entry of
    :func:`row_curve_plan`; ``stream_prefetch``: the streaming kernel's software prefetch per
    thread count (tern.core.engine_tuning.for_threads)."""
    from tqdm import tqdm

    dram = int(dram_bytes or (QUICK_DRAM_BYTES if quick else DRAM_BYTES))
    if dram < 4 * MATRIX_BYTES:
        raise ValueError(f"dram_bytes must be at least {4 * MATRIX_BYTES} B, got {dram}")
    buf = CurveBuffer(dram)
    plan = row_curve_plan(threads, quick)
    rounds: list[list[OpCurve]] = []
    bar = tqdm(total=len(plan) * ROUNDS, desc="row-length curves", unit="curve", disable=not progress,
               leave=False, file=sys.stderr, mininterval=0.5)
    for _ in range(ROUNDS):
        one = []
        for op, split, t, rb in plan:
            shape = row_shape(rb)
            group_bytes = shape[0] * rb * (t if split == "experts" else 1)  # one call per thread at once
            sets = (group_bytes, dram // group_bytes * group_bytes)
            one.append(measure_curve(op, split, t, sets, buf, timing or TIMING, shape=shape,
                                     stream_prefetch=for_threads(stream_prefetch, t), retime=False))
            bar.update()
        rounds.append(one)
    bar.close()
    return [_median_curve([r[i] for r in rounds]) for i in range(len(plan))]


def _median_curve(curves: list[OpCurve]) -> OpCurve:
    """One curve from the same curve timed in several rounds: the median at each point, the
    rounds' fastest and slowest beside it."""
    pts = list(zip(*(c.seconds for c in curves), strict=True))
    return dataclasses.replace(curves[0], seconds=tuple(float(np.median(p)) for p in pts),
                               seconds_min=tuple(min(p) for p in pts), seconds_max=tuple(max(p) for p in pts))


def row_stall_points(curves: list[OpCurve]) -> dict[tuple[str, str, int], list[tuple[int, float]]]:
    """{(op, split, threads): [(row bytes, stall per byte over the curve row length's), ...]} of
    the row curves (tern.core.host_queries.row_stall_ratios); a pass without a positive stall at
    its reference row length is left out (nothing to scale)."""
    out = {}
    for op in ROW_CURVE_OPS:
        for split, t in sorted({(c.split, c.threads) for c in curves if c.op == op}, key=lambda st: (st[1], st[0])):
            ratios = row_stall_ratios([c for c in curves if c.op == op and c.split == split and c.threads == t],
                                      reference_row_bytes(op))
            if ratios is not None:
                out[(op, split, t)] = ratios
    return out


def render_row_curves(curves: list[OpCurve]) -> str:
    """Per op, split and thread count: the stall per byte at each row length over the curve row length's."""
    return "\n".join(f"{op:<15} t{t} {split:<7} DRAM stall per byte / {reference_row_bytes(op)} B rows'  "
                     + " ".join(f"{rb}B:{f:.2f}" for rb, f in pts)
                     for (op, split, t), pts in row_stall_points(curves).items())
