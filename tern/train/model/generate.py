"""Text generation from the torch model with the shared numpy sampler."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from tern.core.sampling import sample_next
from tern.train.model.lm import TernLM


def generate_ids(model: TernLM, prompt_ids: list[int], n: int, seed: int = 0,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, recent_window: int = 64) -> Iterator[int]:
    """Stream ``n`` new token ids after ``prompt_ids`` (batch 1, O(1) state per SSM layer)."""
    if not prompt_ids:
        raise ValueError("generation needs a non-empty prompt (at least one token id)")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    was_training = model.training
    model.eval()
    rng = np.random.default_rng(seed)
    dev = model.embed.weight.device
    try:
        with torch.no_grad():
            state = model.init_state(1)
            for t in prompt_ids:
                logits, state = model.step(torch.tensor([t], device=dev), state)
            history = list(prompt_ids)
            for _ in range(n):
                nxt = sample_next(logits[0].float().cpu().numpy(), rng, temperature, top_k, top_p,
                                  repetition_penalty, history[-recent_window:])
                history.append(nxt)
                yield nxt
                logits, state = model.step(torch.tensor([nxt], device=dev), state)
    finally:
        model.train(was_training)


def generate_torch(model: TernLM, tokenizer, prompt: str, n: int, **kw) -> Iterator[str]:
    """Stream the decoded text pieces of ``n`` new tokens after ``prompt``.

    ``tokenizer`` is a ``tern.data.tokenizer.Tokenizer`` (``encode(text) -> ids``,
    ``decode(ids)``; a ``tokenizers.Tokenizer`` whose encode returns ``.ids`` works too);
    keyword arguments go to :func:`generate_ids` (seed, temperature, top_k, top_p,
    repetition_penalty). Each yielded piece is the new text since the previous one."""
    ids = tokenizer.encode(prompt)
    ids = list(getattr(ids, "ids", ids))
    out: list[int] = []
    prev = ""
    for t in generate_ids(model, ids, n, **kw):
        out.append(t)
        text = tokenizer.decode(out)
        yield text[len(prev):]
        prev = text
