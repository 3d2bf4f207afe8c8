"""Decoding with an engine, token after token: sampled generation and the summed log-likelihood of
token sequences (what tern.data.val_bpb scores). Both drive any object with the engine's
``reset()``, ``feed(token)``, ``check_token(token)`` and ``logits`` (tern.run.engine.Engine)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tern.core.sampling import sample_next


def generate(engine: Any, prompt_ids: Sequence[int], n: int, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, repetition_penalty: float = 1.0, seed: int = 0,
             reset: bool = True, penalty_window: int = 64) -> Iterator[int]:
    """Stream ``n`` sampled token ids after ``prompt_ids`` (tern.core.sampling.sample_next; temperature 0 is
    greedy; the repetition penalty looks at the last ``penalty_window`` ids). Deterministic for a given seed.
    Bad arguments raise ValueError at the first id asked for."""
    try:
        if isinstance(prompt_ids, (str, bytes)):
            raise TypeError
        prompt = [engine.check_token(t) for t in prompt_ids]
    except TypeError:
        raise ValueError(f"prompt_ids must be a sequence of token ids, got {type(prompt_ids).__name__}") from None
    if not prompt:
        raise ValueError("generate needs a non-empty prompt")
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    if reset:
        engine.reset()
    rng = np.random.default_rng(seed)
    recent = list(prompt[-penalty_window:])
    for t in prompt:
        engine.feed(t)
    for _ in range(n):
        tok = int(sample_next(engine.logits, rng, temperature=temperature, top_k=top_k, top_p=top_p,
                              repetition_penalty=repetition_penalty, recent_tokens=recent))
        yield tok
        recent = (recent + [tok])[-penalty_window:]
        engine.feed(tok)


def nll_sum(engine: Any, x: np.ndarray, y: np.ndarray) -> float:
    """Summed negative log-likelihood (nats) of every ``y[b, t]`` given ``x[b, :t + 1]``, each row from an
    empty state: the ``nll_fn`` of :func:`tern.data.val_bpb`. x, y: int arrays (B, T). Leaves the engine reset."""
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim != 2 or x.shape != y.shape:
        raise ValueError(f"nll_sum expects x and y of one shape (B, T), got {x.shape} and {y.shape}")
    total = 0.0
    for b in range(x.shape[0]):
        engine.reset()
        for t in range(x.shape[1]):
            engine.feed(x[b, t])
            z = engine.logits.astype(np.float64)  # (V,)
            m = z.max()
            total += m + np.log(np.exp(z - m).sum()) - z[engine.check_token(y[b, t])]
    engine.reset()
    return float(total)
