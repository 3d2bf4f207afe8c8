"""HostProfile: what the probe measured about a machine, as versioned JSON.

The probe (``tern.probe``) fills it; the roofline (``tern.predict.roofline``) reads it. Bandwidth
is a curve of GB/s against working-set bytes per (kernel, threads); the roofline reads
it through :meth:`HostProfile.bandwidth_at`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from tern.core.records import atomic_write_json

FORMAT = "tern.host_profile"
VERSION = 5  # 5: row_curves (the row passes' DRAM stall against row length); 4: engine runs carry the threads' round trip of each round; 3: op_curves (kernel working-set curves), engine_runs; 2: bandwidth points carry gbps_min, runs_gbps, runs_at_s
READABLE_VERSIONS = (1, 2, 3, 4, 5)  # version 1 lacks the spread fields: they load as unknown; < 3 has no op_curves


@dataclass(frozen=True)
class CacheLevel:
    level: int  # 1, 2, 3, ...
    type: str  # "Data", "Instruction", "Unified"
    size_bytes: int  # one instance
    instances: int  # distinct instances in the machine (distinct shared_cpu_list)
    shared_by: int  # logical CPUs sharing one instance

    @property
    def total_bytes(self) -> int:
        return self.size_bytes * self.instances


@dataclass(frozen=True)
class BandwidthPoint:
    """One point of a bandwidth curve. GB/s = 1e9 bytes/s, STREAM counting (no
    write-allocate). The spread fields (since profile version 2) are None / empty for
    points without measured runs: reference and synthetic curves, version-1 profiles."""

    kernel: str  # "read", "copy", "triad"
    threads: int
    working_set_bytes: int
    gbps_best: float  # fastest timed run
    gbps_median: float
    repeats: int
    gbps_min: float | None = None  # slowest timed run (None: not recorded)
    runs_gbps: tuple[float, ...] = ()  # GB/s of every timed run, in the order taken
    runs_at_s: tuple[float, ...] = ()  # start of each run, s since the sweep began

    def __post_init__(self) -> None:
        # JSON gives lists; keep tuples so a loaded profile equals the saved one
        object.__setattr__(self, "runs_gbps", tuple(float(g) for g in self.runs_gbps))
        object.__setattr__(self, "runs_at_s", tuple(float(t) for t in self.runs_at_s))
        if self.runs_at_s and len(self.runs_at_s) != len(self.runs_gbps):
            raise ValueError(f"bandwidth point has {len(self.runs_gbps)} runs but "
                             f"{len(self.runs_at_s)} run start times")
        if self.gbps_min is not None and not (0 < self.gbps_min <= self.gbps_best):
            raise ValueError(f"bandwidth point gbps_min {self.gbps_min} is not in "
                             f"(0, gbps_best={self.gbps_best}]")

    @property
    def span_s(self) -> float | None:
        """Seconds from the first run's start to the last run's start (None: not recorded)."""
        return self.runs_at_s[-1] - self.runs_at_s[0] if self.runs_at_s else None


@dataclass(frozen=True)
class KernelThroughput:
    kernel: str  # e.g. "fp32_matvec", "int8_matvec", "ternary_lut"
    threads: int
    rows: int
    cols: int
    gops_best: float  # 1e9 multiply-adds... counted as 2 ops each (mul + add)
    gops_median: float
    gbps_median: float  # weight bytes streamed per second
    repeats: int


@dataclass(frozen=True)
class OpCost:
    """Fitted seconds of one engine operation (tern.probe.ops): call + row x rows + unit x
    units (+ tail x rows with a partial last 256-column segment, for the ternary matvecs;
    + input x inputs listed, for the activation-skip kernel)."""

    op: str  # "ternary_matvec", "ssm_step", ... (tern.probe.ops.OPS)
    threads: int
    call_s: float  # fixed cost per call
    row_s: float  # per row (per channel) of the op
    unit_s: float  # per unit: a weight, a state element, a cached position x d_model, an element
    samples: int  # sizes timed
    max_rel_err: float  # largest |fit / measured - 1| over the sizes
    tail_s: float = 0.0  # per tail unit (tern.probe.ops.tail_units: partial-segment rows, SSM channels, attention (position, head) pairs; 0: not fitted)
    input_s: float = 0.0  # per input the skip kernel lists, zero or not (its skip_groups pass; 0: not fitted, probes before session 50)

    def __post_init__(self) -> None:
        if not (isinstance(self.threads, int) and self.threads >= 1):
            raise ValueError(f"op cost {self.op!r}: threads must be an integer >= 1, got {self.threads!r}")
        for n in ("call_s", "row_s", "unit_s", "tail_s", "input_s"):
            v = getattr(self, n)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"op cost {self.op!r}: {n} must be a finite number >= 0 s, got {v!r}")

    def seconds(self, calls: float, rows: float, units: float, tails: float = 0.0, inputs: float = 0.0) -> float:
        return (self.call_s * calls + self.row_s * rows + self.unit_s * units + self.tail_s * tails
                + self.input_s * inputs)


@dataclass(frozen=True)
class OpCurve:
    """Seconds per call of one engine matvec over a cycle of matrices whose bytes add up
    to each working set (tern.probe.curves): how the kernel slows down as its weights
    come from further out, measured on this host. ``split``: how it runs at ``threads``
    ("serial": one thread; "rows": the parallel kernel; "experts": ``threads`` single-thread
    calls at once). ``density``: fraction of the skip kernel's inputs that were nonzero."""

    op: str
    split: str
    threads: int
    rows: int
    cols: int
    density: float
    working_set_bytes: tuple[int, ...]
    seconds: tuple[float, ...]  # median seconds per call at each working set
    seconds_min: tuple[float, ...] = ()
    seconds_max: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for n in ("working_set_bytes", "seconds", "seconds_min", "seconds_max"):
            object.__setattr__(self, n, tuple(getattr(self, n)))
        ws, sec = self.working_set_bytes, self.seconds
        if self.split not in ("serial", "rows", "experts"):
            raise ValueError(f"op curve {self.op!r}: split must be serial, rows or experts, got {self.split!r}")
        if not ws or len(ws) != len(sec) or any(len(x) not in (0, len(ws)) for x in (self.seconds_min, self.seconds_max)):
            raise ValueError(f"op curve {self.op!r}: {len(ws)} working sets but {len(sec)} times")
        if any(b <= a for a, b in zip(ws, ws[1:], strict=False)) or ws[0] <= 0:
            raise ValueError(f"op curve {self.op!r}: working sets must be positive and increasing")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in sec):
            raise ValueError(f"op curve {self.op!r}: every time must be a finite number > 0 s")
        if not (0 < self.density <= 1) or self.rows < 1 or self.cols < 1 or self.threads < 1:
            raise ValueError(f"op curve {self.op!r}: bad shape, threads or density")

    def seconds_at(self, working_set_bytes: float) -> float:
        """Seconds per call at a working set: linear in log2(bytes) between the measured
        points, clamped at the ends."""
        xs = [math.log2(w) for w in self.working_set_bytes]
        x = math.log2(max(float(working_set_bytes), 1.0))
        if x <= xs[0]:
            return self.seconds[0]
        for i in range(1, len(xs)):
            if x <= xs[i]:
                f = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
                return self.seconds[i - 1] + f * (self.seconds[i] - self.seconds[i - 1])
        return self.seconds[-1]


@dataclass(frozen=True)
class EngineRun:
    """The engine itself timed by the probe on a small random model it built
    (tern.probe.engine_runs): seconds per token of ``Engine.step`` called from a Python
    loop, and of the engine's per-token function called from a numba loop (its own work,
    nothing between tokens). The predictor reads the Python side as the per-token overhead
    and the numba side against its op costs as the engine-context factor.

    Since session 27 a probe times each model in ``rounds`` spread over the probe and keeps
    its fastest round (``loop_max_s``: the slowest round's, the spread a shared host put in);
    older profiles have one round."""

    config: dict[str, Any]  # ModelConfig.to_dict() of the model timed
    threads: int
    step_s: float  # median seconds per token, Engine.step from Python (fastest round)
    loop_s: float  # median seconds per token, inside numba (fastest round)
    tokens: int
    repeats: int  # timed runs per round
    rounds: int = 1
    loop_max_s: float | None = None  # the slowest round's loop_s
    # the threads' cache-line round trip (ns, tern.probe.core_latency) timed with each round, in
    # order (None: not measured; empty before version 4); round_trip_ns: the fastest round's
    round_trips_ns: tuple[float | None, ...] = ()
    round_trip_ns: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "round_trips_ns", tuple(self.round_trips_ns))
        for v in (*self.round_trips_ns, self.round_trip_ns):
            if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool)
                                      and math.isfinite(v) and v > 0):
                raise ValueError(f"engine run: a round trip must be a finite number > 0 ns or null, got {v!r}")
        for n in ("step_s", "loop_s"):
            v = getattr(self, n)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"engine run: {n} must be a finite number > 0 s, got {v!r}")
        if not (isinstance(self.threads, int) and self.threads >= 1) or not isinstance(self.config, dict):
            raise ValueError("engine run: needs a config dict and threads >= 1")
        if not (isinstance(self.rounds, int) and self.rounds >= 1):
            raise ValueError(f"engine run: rounds must be an integer >= 1, got {self.rounds!r}")
        if self.loop_max_s is not None and not (isinstance(self.loop_max_s, (int, float))
                                                and math.isfinite(self.loop_max_s) and self.loop_max_s >= self.loop_s):
            raise ValueError(f"engine run: loop_max_s must be a finite number >= loop_s, got {self.loop_max_s!r}")


def op_curve_for(curves: tuple[OpCurve, ...] | list[OpCurve], op: str, split: str, threads: int) -> OpCurve | None:
    """The curve of ``op`` run as ``split`` at the thread count nearest ``threads`` (serial
    curves: 1 thread), of the largest matrix shape measured; None when the profile has none."""
    rows = [c for c in curves if c.op == op and c.split == split]
    if not rows:
        return None
    t = min({c.threads for c in rows}, key=lambda a: (abs(a - threads), -a))
    # the main shape: the most weights; of equal weights the longer rows (a row-heavy
    # shape of the same weights, op_curve_trio's third, is not the main one)
    return max((c for c in rows if c.threads == t), key=lambda c: (c.rows * c.cols, c.cols))


def op_curve_pair(curves: tuple[OpCurve, ...] | list[OpCurve], op: str, split: str,
                  threads: int) -> tuple[OpCurve, OpCurve] | None:
    """(smaller, larger) matrix shape of ``op``'s curves as ``split`` at the thread count
    nearest ``threads``, from which the predictor separates a per-call memory stall from a
    per-weight one (tern.predict.stall.curve_stall); None unless two shapes were measured."""
    large = op_curve_for(curves, op, split, threads)
    if large is None:
        return None
    small = [c for c in curves if c.op == op and c.split == split and c.threads == large.threads
             and c.rows * c.cols * c.density < large.rows * large.cols * large.density]
    return (max(small, key=lambda c: c.rows * c.cols), large) if small else None


def op_curve_trio(curves: tuple[OpCurve, ...] | list[OpCurve], op: str, split: str,
                  threads: int) -> tuple[OpCurve, OpCurve, OpCurve] | None:
    """(smaller, larger, row-heavy) shapes of ``op``'s curves as ``split`` at the thread
    count nearest ``threads``: :func:`op_curve_pair` plus a third shape with more rows per
    weight than the larger one (e.g. 2048 x 512 beside 1024 x 1024), from which the
    predictor fits each call's time at a working set as per-call + per-weight + per-row
    terms (tern.predict.stall.curve_stall); None unless all three were measured."""
    pair = op_curve_pair(curves, op, split, threads)
    if pair is None:
        return None
    small, large = pair
    rowy = [c for c in curves if c.op == op and c.split == split and c.threads == large.threads
            and c.rows * large.cols > large.rows * c.cols and c.rows != small.rows]
    return (small, large, max(rowy, key=lambda c: c.rows)) if rowy else None


def op_cost_for(costs: tuple[OpCost, ...] | list[OpCost], op: str, threads: int = 1) -> OpCost | None:
    """The fitted cost of ``op`` at the thread count nearest ``threads`` (at most
    ``threads`` when such exists); None when ``costs`` has none."""
    rows = [c for c in costs if c.op == op]
    if not rows:
        return None
    below = [c for c in rows if c.threads <= threads]
    return max(below, key=lambda c: c.threads) if below else min(rows, key=lambda c: c.threads)


@dataclass(frozen=True)
class HostProfile:
    """What the probe measured on one host (or the published figures of a reference host):
    caches as the OS reports them, read bandwidth against working-set size (1 and more
    threads, every repeat kept), matvec kernel throughput, the engine's op costs, and
    optional calibration checks. Versioned JSON (``FORMAT``, ``VERSION``), validated on load
    (:meth:`HostProfile.load`); the predictor reads nothing else of a host."""

    label: str  # "measured on <host>" or "reference: ... (published figures, not measured)"
    measured: bool
    host: dict[str, Any]  # cpu model, flags, cores, threads, ram, os, versions, date
    caches: tuple[CacheLevel, ...]
    cache_source: str  # "/sys", "py-cpuinfo", "sysctl", "default"...
    bandwidth: tuple[BandwidthPoint, ...]
    kernels: tuple[KernelThroughput, ...] = ()
    calibration: dict[str, float] = field(default_factory=dict)  # e.g. per-token overhead s
    op_costs: tuple[OpCost, ...] = ()  # engine operation costs (tern.probe.ops)
    op_curves: tuple[OpCurve, ...] = ()  # kernel working-set curves (tern.probe.curves)
    engine_runs: tuple[EngineRun, ...] = ()  # the engine timed on small models (tern.probe.engine_runs)
    row_curves: tuple[OpCurve, ...] = ()  # the row passes cache-resident and from DRAM per row length (tern.probe.row_curves)

    # ---- queries ----------------------------------------------------------------------
    def cache(self, level: int) -> CacheLevel | None:
        """Data/unified cache of ``level`` (None when unknown)."""
        for c in self.caches:
            if c.level == level and c.type in ("Data", "Unified"):
                return c
        return None

    @property
    def llc_bytes(self) -> int:
        """Total last-level cache bytes (all instances)."""
        levels = [c for c in self.caches if c.type in ("Data", "Unified")]
        if not levels:
            return 0
        top = max(c.level for c in levels)
        return sum(c.total_bytes for c in levels if c.level == top)

    def thread_counts(self, kernel: str = "read") -> list[int]:
        return sorted({p.threads for p in self.bandwidth if p.kernel == kernel})

    def curve(self, threads: int, kernel: str = "read") -> list[BandwidthPoint]:
        pts = sorted((p for p in self.bandwidth if p.kernel == kernel and p.threads == threads),
                     key=lambda p: p.working_set_bytes)
        if not pts:
            raise ValueError(
                f"profile {self.label!r} has no {kernel!r} bandwidth curve for {threads} "
                f"thread(s); available: {self.thread_counts(kernel)}")
        return pts

    def bandwidth_at(self, working_set_bytes: float, threads: int = 1, kernel: str = "read",
                     stat: str = "median") -> float:
        """GB/s at a working set, interpolated linearly in log2(bytes) on the measured
        curve (clamped at its ends). ``threads`` falls back to the nearest measured count."""
        avail = self.thread_counts(kernel)
        if not avail:
            raise ValueError(f"profile {self.label!r} has no {kernel!r} bandwidth curve")
        t = min(avail, key=lambda a: (abs(a - threads), -a))
        pts = self.curve(t, kernel)
        xs = [math.log2(p.working_set_bytes) for p in pts]
        ys = [p.gbps_median if stat == "median" else p.gbps_best for p in pts]
        x = math.log2(max(working_set_bytes, 1.0))
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1]
        for i in range(1, len(xs)):
            if x <= xs[i]:
                f = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
                return ys[i - 1] + f * (ys[i] - ys[i - 1])
        return ys[-1]

    def kernel_gops(self, kernel: str, threads: int = 1) -> float | None:
        rows = [k for k in self.kernels if k.kernel == kernel]
        if not rows:
            return None
        best = min(rows, key=lambda k: (abs(k.threads - threads), -k.threads))
        return best.gops_median

    # ---- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d = {"format": FORMAT, "version": VERSION, **d}
        return d

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostProfile:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"not a tern host profile (format field is "
                             f"{d.get('format') if isinstance(d, dict) else None!r}, expected {FORMAT!r})")
        if d.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"host profile version {d.get('version')!r} is not supported "
                             f"(this tern reads versions {READABLE_VERSIONS}); re-run `tern probe`")
        try:
            prof = cls(
                label=str(d["label"]), measured=bool(d["measured"]), host=dict(d["host"]),
                caches=tuple(CacheLevel(**c) for c in d["caches"]),
                cache_source=str(d["cache_source"]),
                bandwidth=tuple(BandwidthPoint(**p) for p in d["bandwidth"]),
                kernels=tuple(KernelThroughput(**k) for k in d.get("kernels", ())),
                calibration=dict(d.get("calibration", {})),
                op_costs=tuple(OpCost(**c) for c in d.get("op_costs", ())),
                op_curves=tuple(OpCurve(**c) for c in d.get("op_curves", ())),
                engine_runs=tuple(EngineRun(**r) for r in d.get("engine_runs", ())),
                row_curves=tuple(OpCurve(**c) for c in d.get("row_curves", ())),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"host profile is malformed: {e}") from None
        for p in prof.bandwidth:
            if not (p.working_set_bytes > 0 and p.gbps_median > 0 and math.isfinite(p.gbps_median)):
                raise ValueError(f"host profile has an invalid bandwidth point: {p}")
        return prof

    @classmethod
    def load(cls, path: str | os.PathLike) -> HostProfile:
        """A profile from a JSON file; ValueError naming the file when it is missing, not a
        regular file, not UTF-8 JSON or not a valid profile."""
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except FileNotFoundError:
            raise ValueError(f"host profile {path} does not exist; run `tern probe` first") from None
        except IsADirectoryError:
            raise ValueError(f"host profile {path} is a directory, not a file") from None
        except UnicodeDecodeError:
            raise ValueError(f"host profile {path} is not a text file (not UTF-8 JSON): "
                             f"a host profile is the JSON `tern probe` writes") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"host profile {path} is not valid JSON: {e}") from None
        except OSError as e:
            raise ValueError(f"host profile {path} cannot be read ({e.strerror or e})") from None
        try:
            return cls.from_dict(d)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
