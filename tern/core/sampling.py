"""Next-token sampling from a logits vector (numpy), shared by the torch model and the
numba engine so both sample identically.

Order of operations: repetition penalty on the recent tokens (CTRL-style: positive
logits divided, negative multiplied), temperature, top-k, top-p (nucleus: the smallest
set of most probable tokens whose probability reaches top_p), then one draw from
``rng``. ``temperature == 0`` is greedy (argmax, lowest index on ties).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def _check(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
           repetition_penalty: float) -> np.ndarray:
    x = np.asarray(logits)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D array (V,), got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"logits must be floating point, got {x.dtype}")
    if not np.all(np.isfinite(x)):
        raise ValueError("logits contain NaN or infinity")
    if not (isinstance(temperature, (int, float)) and 0 <= temperature < float("inf")):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if not (isinstance(top_k, (int, np.integer)) and not isinstance(top_k, bool) and top_k >= 0):
        raise ValueError(f"top_k must be an integer >= 0 (0: off), got {top_k!r}")
    if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not (isinstance(repetition_penalty, (int, float)) and 0 < repetition_penalty < float("inf")):
        raise ValueError(f"repetition_penalty must be a finite number > 0, got {repetition_penalty!r}")
    return x.astype(np.float64)


def sample_next(logits: np.ndarray, rng: np.random.Generator, temperature: float = 1.0,
                top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0,
                recent_tokens: Iterable[int] = ()) -> int:
    """One token id drawn from ``logits`` (V,) with the given rng (see module doc)."""
    x = _check(logits, temperature, top_k, top_p, repetition_penalty)
    V = x.size
    if repetition_penalty != 1.0:
        recent = np.unique(np.asarray(list(recent_tokens), dtype=np.int64))
        if recent.size and (recent.min() < 0 or recent.max() >= V):
            raise ValueError(f"recent_tokens must be ids in 0..{V - 1}")
        r = x[recent]
        with np.errstate(over="ignore", under="ignore"):
            x[recent] = np.where(r > 0, r / repetition_penalty, r * repetition_penalty)
    if temperature == 0:
        return int(np.argmax(x))
    with np.errstate(over="ignore"):
        x = x / temperature
    if not np.all(np.isfinite(x)):  # a tiny temperature or penalty overflowed them: refuse, never NaN weights
        raise ValueError(f"temperature={temperature!r} / repetition_penalty={repetition_penalty!r} push the logits "
                         "past float64's range")
    order = np.argsort(-x, kind="stable")  # descending, lower index first on ties
    if top_k and top_k < V:
        order = order[:top_k]
    z = x[order] - x[order[0]]
    p = np.exp(z)
    p /= p.sum()
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)  # smallest prefix reaching top_p
        order, p = order[:keep], p[:keep] / p[:keep].sum()
    return int(order[rng.choice(len(order), p=p)])
