"""Power arithmetic of a gate: the minimum detectable effect, the seeds and tokens it needs.

A gate decides on the paired mean Δ = B − A over n seeds with standard error
se = sd / sqrt(n) (sd: the seed-to-seed standard deviation of the per-seed Δ; for arms
that share no seeds, sd = sqrt(sd_A² + sd_B²)) and a k-sigma interval (tern.decide.stats).
The verdict is decisive (pass or fail) when the interval clears the rule's threshold
(the margin x of ``B - A <= x``, or 0 for ``B < A``). If the true Δ lies a distance δ
from the threshold, the interval's near edge, ``Δ̂ ∓ k·se``, clears it with probability
Φ(δ / se − k) (normal approximation, the same one the verdict uses). So with power p
(default 0.8, z_p = Φ⁻¹(p) = 0.8416):

    MDE          = (k + z_p) · se                                  (metric units)
    seeds needed = ceil(((k + z_p) · sd / δ)²)                     (se ∝ 1 / sqrt(seeds))
    tokens       = T · ((k + z_p) · se_T / δ)^(1 / γ)              (se ∝ T^(−γ), γ given)

The MDE is the smallest distance from the threshold at which the gate reaches a decisive
verdict with probability p; an inconclusive gate says nothing about effects smaller than
its MDE. With p = 0.5 it is k·se, the interval's half-width. The target distance δ of a
margin rule is |x| (pass when B and A are truly equal); a superiority rule (threshold 0)
needs a stated effect (the gate's ``[plan] effect``, a command-line value, or the effect
observed so far, labelled as such).

How se shrinks with training tokens is not known in general: seed-to-seed spread of a
small model usually falls as it trains longer, but the kit has measured each gate at one
budget only. So the token exponent γ is None ("unknown") unless the caller states one;
then spreads measured at one budget are carried to another unchanged (labelled), and
no token count is derived.

Cost: a run of ``tokens`` at a measured training rate r (tok/s) plus its measured
validation time v takes tokens / r + v seconds; a gate's runs are independent, so W
workers (each at the rate measured under that concurrency) run them as a pool does: in
order, each on the first worker to come free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

DEFAULT_POWER = 0.8
PLAN_KEYS = {"power", "effect", "spread_from", "mde", "seeds_needed", "note"}


def z_power(power: float) -> float:
    """Φ⁻¹(power): 0.8416 for 0.8, 0 for 0.5."""
    if not (isinstance(power, (int, float)) and 0 < power < 1):
        raise ValueError(f"power must be in (0, 1), got {power!r}")
    return NormalDist().inv_cdf(power)


def mde(k_sigma: float, se: float, power: float = DEFAULT_POWER) -> float:
    """Minimum detectable distance from the rule's threshold: (k + z_p) · se (nan if se is)."""
    if se is None or not math.isfinite(se):
        return math.nan
    return (k_sigma + z_power(power)) * se


def sd_delta(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[float, int, str]:
    """(sd of Δ per seed, n, basis): paired over the common seeds when there are >= 2,
    else sqrt(sd_A² + sd_B²) of the arms' own seeds (independent arms); nan if neither."""
    common = sorted(set(a) & set(b))
    if len(common) >= 2:
        return _sd([b[s] - a[s] for s in common]), len(common), "paired"
    if len(a) >= 2 and len(b) >= 2:
        return math.hypot(_sd(list(a.values())), _sd(list(b.values()))), min(len(a), len(b)), "unpaired"
    return math.nan, len(common), "none"


def _sd(xs: Sequence[float]) -> float:
    n = len(xs)
    m = sum(xs) / n
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


def seeds_needed(k_sigma: float, sd: float, effect: float, power: float = DEFAULT_POWER,
                 minimum: int = 3) -> int | None:
    """Smallest n (>= ``minimum``) with (k + z_p) · sd / sqrt(n) <= effect; None if the
    spread or the effect is unknown or the effect is 0."""
    if not (math.isfinite(sd) and effect is not None and math.isfinite(effect) and effect != 0):
        return None
    n = ((k_sigma + z_power(power)) * sd / abs(effect)) ** 2
    # a hair of slack: an exact square (e.g. 8.0000000001 from rounding) is not one seed more
    return max(minimum, math.ceil(n - 1e-9))


def scale_se(se: float, tokens_from: int, tokens_to: int, token_exponent: float | None) -> float:
    """se carried from ``tokens_from`` to ``tokens_to`` training tokens: se · (from/to)^γ;
    unchanged when γ is None (unknown) or the budgets are equal."""
    if token_exponent is None or tokens_from == tokens_to:
        return se
    return se * (tokens_from / tokens_to) ** token_exponent


def tokens_needed(k_sigma: float, se: float, tokens: int, effect: float,
                  token_exponent: float | None, power: float = DEFAULT_POWER) -> int | None:
    """Training tokens per run at which (k + z_p) · se_T <= effect at the same seeds, with
    se ∝ T^(−γ); None when γ is unknown (None or <= 0) or the inputs are not finite."""
    if token_exponent is None or token_exponent <= 0 or not math.isfinite(se) or not effect:
        return None
    ratio = (k_sigma + z_power(power)) * se / abs(effect)
    return max(1, math.ceil(tokens * ratio ** (1.0 / token_exponent)))


def target_effect(kind: str, margin: float, plan_effect: float | None, given: float | None,
                  observed: float | None) -> tuple[float | None, str]:
    """(δ, basis): the distance from the threshold the plan must detect (module docstring).
    A value given on the command line wins, then the gate's pre-registered ``[plan] effect``,
    then (margin rules) |margin|, then (superiority) the observed |mean Δ|."""
    if given is not None:
        return abs(given), "given"
    if plan_effect is not None:
        return abs(plan_effect), "pre-registered [plan] effect"
    if kind == "margin" and margin != 0:
        return abs(margin), "the rule's margin (pass when B = A)"
    if observed is not None and math.isfinite(observed) and observed != 0:
        return abs(observed), "observed |mean Δ| (not pre-registered)"
    return None, "unknown: give an effect"


def run_seconds(tokens: int, tok_per_s: float | None, eval_s: float = 0.0) -> float | None:
    """Seconds of one run: tokens / rate + validation seconds (None without a rate)."""
    if not tok_per_s or not math.isfinite(tok_per_s) or tok_per_s <= 0:
        return None
    return tokens / tok_per_s + eval_s


def total_seconds(runs: Sequence[float | None], workers: int = 1) -> float | None:
    """Wall seconds of independent runs over ``workers`` as a pool runs them: in order, each
    on the first worker to come free (so an odd last run waits alone); None if any run's
    time is unknown."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if not runs or any(r is None for r in runs):
        return None if runs else 0.0
    free = [0.0] * workers  # when each worker comes free
    for r in runs:
        free[free.index(min(free))] += r  # type: ignore[operator]
    return max(free)


def validate_plan(d: Any) -> dict[str, Any]:
    """A gate file's optional ``[plan]`` table (written before its runs): power, effect (the
    δ a superiority rule must detect, metric units), spread_from (the gate name whose
    registry runs supply the seed spread), mde / seeds_needed (the planner's figures per
    comparison, ``{"B-A" = x}``), note. Returns it; bad fields are a ValueError."""
    if not isinstance(d, dict):
        raise ValueError(f"gate field 'plan' must be a table, got {type(d).__name__}")
    unknown = sorted(set(d) - PLAN_KEYS)
    if unknown:
        raise ValueError(f"gate field 'plan' has unknown keys {unknown}; allowed: {sorted(PLAN_KEYS)}")
    if "power" in d:
        z_power(d["power"])
    for key in ("effect",):
        if key in d and not (_num(d[key]) and d[key] > 0):
            raise ValueError(f"gate field 'plan.{key}' must be a number > 0, got {d[key]!r}")
    for key in ("spread_from", "note"):
        if key in d and not isinstance(d[key], str):
            raise ValueError(f"gate field 'plan.{key}' must be a string, got {d[key]!r}")
    for key in ("mde", "seeds_needed"):
        t = d.get(key, {})
        if not isinstance(t, dict) or not all(_num(v) and v > 0 for v in t.values()):
            raise ValueError(f"gate field 'plan.{key}' must be a table of positive numbers per "
                             f"comparison (e.g. {{\"B-A\" = 0.02}}), got {t!r}")
    return dict(d)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def comparison_key(b: str, a: str) -> str:
    """The key of comparison B vs A in ``[plan]`` tables: "B-A"."""
    return f"{b}-{a}"
