"""Paired statistics over seeds and the mechanical verdict of a gate's pass rule.

For a comparison "B vs A" with per-seed metric values, Δ_i = B_i − A_i on the seeds both
arms finished (paired: same seed, same tokens in the same order). Then

    mean  = Σ Δ_i / n
    sd    = sqrt(Σ (Δ_i − mean)² / (n − 1))        (sample standard deviation)
    se    = sd / sqrt(n)                            (standard error of the mean Δ)
    z     = mean / se                               (Δ in standard errors; ±inf if se = 0)
    lo/hi = mean ∓ k·se                             (the rule's k-sigma interval)

Verdicts (k from the rule; x its margin):

- ``B - A <= x at k sigma`` (non-inferiority): **pass** if hi <= x (the upper bound is
  within the margin); **fail** if lo > x (even the lower bound is beyond it);
  **inconclusive** otherwise (the interval straddles x).
- ``B - A >= x at k sigma``: pass if lo >= x; fail if hi < x; inconclusive otherwise.
- ``B < A at k sigma`` (superiority): **pass** if hi < 0 (z < −k: B better at k sigma);
  **fail** if lo > 0 (z > k: B worse at k sigma, the reverse holds); **inconclusive** if
  neither (|z| <= k).
- ``B > A at k sigma``: pass if lo > 0; fail if hi < 0; inconclusive otherwise.

Any comparison with fewer than 2 paired seeds, a non-finite value, or arms that saw
different training tokens for the same seed is **inconclusive** (with a reason).

A gate with several comparisons (a sweep) passes if every comparison passes, fails if
any fails, and is inconclusive otherwise. The k-sigma interval uses the normal
approximation on the paired standard error; with 3 seeds a Student-t interval would be
wider (t₀.₉₇₅,₂ = 4.30 vs 1.96), so a "2 sigma" verdict here is a pre-registered
convention, not a 95 % test — the per-seed numbers are kept so anyone can recompute.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tern.decide.spec import Rule

VERDICTS = ("pass", "fail", "inconclusive")


@dataclass(frozen=True)
class PairedStats:
    n: int
    mean: float  # mean of Δ = B − A (metric units)
    sd: float  # sample standard deviation of Δ (nan if n < 2)
    se: float  # standard error of the mean Δ (nan if n < 2)
    z: float  # mean / se


def paired_stats(a: Sequence[float], b: Sequence[float]) -> PairedStats:
    """Statistics of Δ_i = b_i − a_i (see the module docstring)."""
    if len(a) != len(b):
        raise ValueError(f"paired_stats needs equal lengths, got {len(a)} and {len(b)}")
    n = len(a)
    if n == 0:
        return PairedStats(0, math.nan, math.nan, math.nan, math.nan)
    d = [float(y) - float(x) for x, y in zip(a, b, strict=True)]
    mean = sum(d) / n
    if n < 2:
        return PairedStats(n, mean, math.nan, math.nan, math.nan)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    se = sd / math.sqrt(n)
    if se > 0:
        z = mean / se
    else:
        z = 0.0 if mean == 0 else math.copysign(math.inf, mean)
    return PairedStats(n, mean, sd, se, z)


def decide(rule: Rule, st: PairedStats) -> tuple[str, str]:
    """(verdict, reason) of ``rule`` on the paired statistics ``st``."""
    if st.n < 2:
        return "inconclusive", f"only {st.n} paired seed(s)"
    if not (math.isfinite(st.mean) and math.isfinite(st.se)):
        return "inconclusive", "non-finite metric value"
    lo, hi = st.mean - rule.k_sigma * st.se, st.mean + rule.k_sigma * st.se
    k, x = f"{rule.k_sigma:g}", rule.margin
    if rule.kind == "margin":
        if rule.op == "<=":
            if hi <= x:
                return "pass", f"upper bound mean+{k}se = {hi:+.5f} <= {x:+g}"
            if lo > x:
                return "fail", f"lower bound mean-{k}se = {lo:+.5f} > {x:+g}"
            return "inconclusive", f"interval [{lo:+.5f}, {hi:+.5f}] straddles {x:+g}"
        if lo >= x:
            return "pass", f"lower bound mean-{k}se = {lo:+.5f} >= {x:+g}"
        if hi < x:
            return "fail", f"upper bound mean+{k}se = {hi:+.5f} < {x:+g}"
        return "inconclusive", f"interval [{lo:+.5f}, {hi:+.5f}] straddles {x:+g}"
    better, worse = (hi < 0, lo > 0) if rule.op == "<" else (lo > 0, hi < 0)
    if better:
        return "pass", f"z = {st.z:+.2f}: B {rule.op} A at {k} sigma"
    if worse:
        return "fail", f"z = {st.z:+.2f}: the reverse of B {rule.op} A holds at {k} sigma"
    return "inconclusive", f"|z| = {abs(st.z):.2f} <= {k}: neither direction at {k} sigma"


def compare(rule: Rule, a_by_seed: Mapping[int, float], b_by_seed: Mapping[int, float],
            a_tokens: Mapping[int, Any] | None = None,
            b_tokens: Mapping[int, Any] | None = None) -> dict[str, Any]:
    """Pair two arms' per-seed values on their common seeds and decide the rule.

    Returns {n, mean_delta, sd_delta, se_delta, z, lo, hi, verdict, reason, per_seed:
    [{seed, a, b, delta}]}; ``*_tokens`` (train tokens per seed) must agree when given.
    """
    seeds = sorted(set(a_by_seed) & set(b_by_seed))
    a = [a_by_seed[s] for s in seeds]
    b = [b_by_seed[s] for s in seeds]
    st = paired_stats(a, b)
    verdict, reason = decide(rule, st)
    if a_tokens is not None and b_tokens is not None:
        diff = [s for s in seeds if a_tokens.get(s) != b_tokens.get(s)]
        if diff:
            verdict, reason = "inconclusive", f"arms saw different train_tokens on seeds {diff}"
    k = rule.k_sigma
    out = {f"{key}_delta" if key in ("mean", "sd", "se") else key: v for key, v in asdict(st).items()}
    out.update(lo=st.mean - k * st.se if st.n >= 2 else math.nan,
               hi=st.mean + k * st.se if st.n >= 2 else math.nan,
               verdict=verdict, reason=reason,
               per_seed=[{"seed": s, "a": x, "b": y, "delta": y - x} for s, x, y in zip(seeds, a, b, strict=True)])
    return out


def combine(verdicts: Sequence[str]) -> str:
    """A sweep's verdict: pass if all pass, fail if any fails, else inconclusive."""
    if not verdicts:
        return "inconclusive"
    if any(v == "fail" for v in verdicts):
        return "fail"
    if all(v == "pass" for v in verdicts):
        return "pass"
    return "inconclusive"
