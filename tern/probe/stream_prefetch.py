"""Do DRAM-resident long rows run faster through the streaming ternary kernel with software
prefetch, without it, or through the 4-row pass, on this host? Measured, then followed by the
engine (tern.core.engine_tuning).

The streaming kernel (one row per pass: tern.kernels.kernels_ternary.ternary_matvec_stream)
reads the matrices of DRAM-resident pools whose packed rows hold 320 B - 4 KB. Same sums
either way; what differs is the time, and it differs by CPU (AMD Zen 5 read 16.2 GB/s
without and 18.8 with at 1 thread; AMD Zen 4 read 4-19 % less with it). So the probe times
the kernel both ways over the same DRAM-sized cycle of matrices as its working-set curve of
that kernel (tern.probe.curves: CURVE_SHAPES' 256 x 4096, PAR_CURVE_SHAPES at ``rows``
split), in ``rounds`` rotating rounds at each thread count, and keeps prefetch at a thread
count unless going without is at least :data:`MIN_GAIN` faster there (medians; on the Zen 4
VM going without won at 1 thread and lost at 2). The 4-row pass (its prefetch into L2 since
session 24) is timed on the same matrices: where it beats the chosen streaming form by
MIN_GAIN the engine reads those rows with it (``stream`` False). The op costs, curves and
engine runs the probe measures after it run with the choices of their thread count.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

from tern.core.host_caches import MIB
from tern.probe.curve_buffer import CurveBuffer
from tern.probe.curves import CURVE_SHAPES, _weight_bytes, measure_curve
from tern.probe.timing import TimingConfig

OP = "ternary_stream"
WORKING_SET_BYTES = 256 * MIB  # past every L3 seen (32 MiB; a VM slice of a 480 MiB L3 read like DRAM past ~60)
QUICK_WORKING_SET_BYTES = 128 * MIB
MIN_GAIN = 0.03  # prefetch goes only when off is >= 3 % faster: smaller gaps are this kind of host's noise
ROUNDS = 4


ARMS = ("on", "off", "rows")  # the streaming kernel with / without prefetch, the 4-row pass


def measure_stream_prefetch(threads: tuple[int, ...] = (1,), quick: bool = False, rounds: int | None = None,
                            working_set_bytes: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Time the streaming kernel with and without software prefetch, and the 4-row pass, from
    DRAM at each thread count; returns ``{"stream_prefetch": {threads: the choice}, "stream":
    {threads: stream or the 4-row pass}, "op", "rows", "cols", "working_set_bytes", "rounds",
    "min_gain", "gbps": {threads: {"on": [...], "off": [...], "rows": [...]}} (GB/s of weights
    per round), "off_over_on": {threads: median ratio}, "rows_over_stream": {threads: the
    4-row pass's median over the chosen streaming form's}}`` (threads as str)."""
    rounds = (2 if quick else ROUNDS) if rounds is None else rounds
    ws = (QUICK_WORKING_SET_BYTES if quick else WORKING_SET_BYTES) if working_set_bytes is None else working_set_bytes
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    if not (isinstance(ws, int) and ws >= 1 * MIB):
        raise ValueError(f"working_set_bytes must be an integer >= 1 MiB, got {ws!r}")
    rows, cols = CURVE_SHAPES[OP]
    mat = _weight_bytes(OP, rows, cols)
    ws = max(mat, ws // mat * mat)  # whole matrices
    buf = CurveBuffer(ws)
    timing = (TimingConfig(min_time_s=0.02, repeats=1, warmup_s=0.005) if quick
              else TimingConfig(min_time_s=0.05, repeats=1, warmup_s=0.01))
    gbps: dict[str, dict[str, list[float]]] = {}
    for t in threads:
        split = "serial" if t == 1 else "rows"
        runs: dict[str, list[float]] = {a: [] for a in ARMS}
        for r in range(rounds):
            for arm in ARMS[r % 3:] + ARMS[:r % 3]:  # rotate who goes first
                op = "ternary_matvec" if arm == "rows" else OP  # same matrices: the 4-row pass or the stream
                c = measure_curve(op, split, t, (ws,), buf, timing, shape=(rows, cols), stream_prefetch=arm == "on")
                runs[arm].append(mat / c.seconds[0] / 1e9)
        gbps[str(t)] = runs
        if progress:
            med = {a: statistics.median(v) for a, v in runs.items()}
            print(f"  DRAM rows, {t} thread(s): stream {med['on']:.1f} GB/s with prefetch, {med['off']:.1f} without; "
                  f"4-row pass {med['rows']:.1f}", file=sys.stderr)
    return decide(gbps) | {"op": OP, "rows": rows, "cols": cols, "working_set_bytes": ws, "rounds": rounds,
                           "min_gain": MIN_GAIN, "gbps": gbps}


def decide(gbps: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """The choices from the A/B's GB/s per thread count: prefetch goes only where the stream
    without it is >= MIN_GAIN faster; the 4-row pass replaces the stream only where it is
    >= MIN_GAIN faster than the stream as chosen (medians)."""
    med = {t: {a: statistics.median(v) for a, v in runs.items()} for t, runs in gbps.items()}
    off_over_on = {t: m["off"] / m["on"] for t, m in med.items()}
    pf = {t: not r >= 1.0 + MIN_GAIN for t, r in off_over_on.items()}
    rows_over = {t: m["rows"] / m["on" if pf[t] else "off"] for t, m in med.items() if "rows" in m}
    return {"stream_prefetch": pf, "stream": {t: not r >= 1.0 + MIN_GAIN for t, r in rows_over.items()},
            "off_over_on": off_over_on, "rows_over_stream": rows_over}
