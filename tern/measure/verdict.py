"""Measured decode speed against a target and against its prediction, in words.

Notebook 08 decodes its ~10B pick and must *say* whether it reached the target tok/s and
whether the prediction held, not only print the numbers: :func:`speed_checks` turns sweep
rows (``tern.measure.sweep.run_sweep``) into one :class:`SpeedCheck` per thread count and
:func:`render_speed_checks` into sentences with a verdict line.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# measured / predicted within 1 ± this is "the prediction holds" (the band notebook 06 draws)
PREDICTION_TOLERANCE = 0.25


@dataclass(frozen=True)
class SpeedCheck:
    threads: int
    measured_tok_per_s: float  # median over the repeats
    predicted_tok_per_s: float
    target_tok_per_s: float
    tolerance: float = PREDICTION_TOLERANCE  # allowed |measured / predicted - 1|

    @property
    def reaches_target(self) -> bool:
        return self.measured_tok_per_s >= self.target_tok_per_s

    @property
    def of_target(self) -> float:
        """measured / target (1.0 = exactly on target)."""
        return self.measured_tok_per_s / self.target_tok_per_s

    @property
    def ratio(self) -> float:
        """measured / predicted."""
        return self.measured_tok_per_s / self.predicted_tok_per_s

    @property
    def prediction_holds(self) -> bool:
        return abs(self.ratio - 1.0) <= self.tolerance

    def sentence(self) -> str:
        """One line: the target, then the prediction, each reached / held or missed."""
        m, p, g = self.measured_tok_per_s, self.predicted_tok_per_s, self.target_tok_per_s
        head = f"{self.threads} thread{'s' if self.threads > 1 else ''}: measured {m:,.1f} tok/s "
        if self.reaches_target:
            head += f"reaches the {g:,.0f} tok/s target ({self.of_target:.2f}x)."
        else:
            head += f"MISSES the {g:,.0f} tok/s target: {1 - self.of_target:.0%} short."
        if self.prediction_holds:
            tail = (f" The prediction, {p:,.1f} tok/s, holds: measured / predicted {self.ratio:.2f}, "
                    f"within ±{self.tolerance:.0%}.")
        else:
            side = "too optimistic" if self.ratio < 1 else "too pessimistic"
            tail = (f" The prediction, {p:,.1f} tok/s, MISSES its ±{self.tolerance:.0%} check: "
                    f"measured / predicted {self.ratio:.2f}, {side} by {abs(self.ratio - 1):.0%}.")
        return head + tail


def _positive(row: dict[str, Any], key: str) -> float:
    v = row.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"sweep row {row.get('name', '?')!r} ({row.get('threads', '?')} threads): "
                         f"{key} must be a positive number, got {v!r}")
    return float(v)


def speed_checks(rows: Iterable[dict[str, Any]], target_tok_per_s: float,
                 tolerance: float = PREDICTION_TOLERANCE) -> list[SpeedCheck]:
    """One check per sweep row (``threads``, ``tok_per_s``, ``predicted_tok_per_s``), in
    thread order. Raises ValueError for no rows, a bad target or tolerance, or a row without
    positive speeds."""
    if not (isinstance(target_tok_per_s, (int, float)) and math.isfinite(target_tok_per_s)
            and target_tok_per_s > 0):
        raise ValueError(f"target_tok_per_s must be a positive number, got {target_tok_per_s!r}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance!r}")
    checks = [SpeedCheck(int(r["threads"]), _positive(r, "tok_per_s"), _positive(r, "predicted_tok_per_s"),
                         float(target_tok_per_s), tolerance) for r in rows]
    if not checks:
        raise ValueError("no sweep rows to check")
    return sorted(checks, key=lambda c: c.threads)


def render_speed_checks(checks: list[SpeedCheck], stand_in: bool = False) -> str:
    """A sentence per thread count, then a verdict: where the target is reached or missed,
    and where the prediction misses its tolerance. ``stand_in``: the rows measure a
    scaled-down stand-in, which the verdict says."""
    if not checks:
        raise ValueError("no checks to render")
    lines = [c.sentence() for c in checks]
    hit = [c.threads for c in checks if c.reaches_target]
    missed = [c.threads for c in checks if not c.reaches_target]
    target = checks[0].target_tok_per_s
    if not missed:
        verdict = f"Verdict: the {target:,.0f} tok/s target is reached at every thread count measured."
    elif not hit:
        best = max(checks, key=lambda c: c.measured_tok_per_s)
        verdict = (f"Verdict: the {target:,.0f} tok/s target is NOT reached: the best is "
                   f"{best.measured_tok_per_s:,.1f} tok/s with {best.threads} thread(s), "
                   f"{1 - best.of_target:.0%} short.")
    else:
        verdict = (f"Verdict: the {target:,.0f} tok/s target is reached with {_threads(hit)}, "
                   f"NOT with {_threads(missed)}.")
    off = [c.threads for c in checks if not c.prediction_holds]
    if off:
        verdict += (f" The prediction is off by more than ±{checks[0].tolerance:.0%} with {_threads(off)}: "
                    "the pick it made is less certain than its margin assumed.")
    if stand_in:
        verdict += " (A scaled-down stand-in was measured, not the full model.)"
    return "\n".join([*lines, verdict])


def _threads(ts: list[int]) -> str:
    return f"{', '.join(str(t) for t in ts)} thread{'s' if ts != [1] else ''}"
