"""Where training batches and validation figures come from.

A data source gives the global training batch of any step (a pure function of seed and
step, so the data position of a run is its step count and a resumed run reads the same
tokens as an uninterrupted one) and evaluates a model's negative log-likelihood on the
validation split. :class:`CorpusSource` reads the kit's corpus through ``tern.data``
(which owns tokenisation and bits per byte); :class:`ArraySource` serves token arrays
(tests, synthetic data).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# nll_fn(x (B, T) int64, y (B, T) int64) -> summed nats of every y[b, t] given x[b, :t + 1]
# (the tern.data.val_bpb convention)
NllFn = Callable[[np.ndarray, np.ndarray], float]


def sample_windows(tokens: np.ndarray, seed: int, step: int, batch: int, seq_len: int) -> np.ndarray:
    """The global batch of ``step``: ``batch`` windows of seq_len + 1 tokens at offsets drawn
    from a generator seeded with (seed, step). Returns (batch, seq_len + 1) int64."""
    n = len(tokens) - seq_len - 1
    if n < 1:
        raise ValueError(f"training split has {len(tokens)} tokens; needs more than seq_len + 1 = {seq_len + 1}")
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, n + 1, size=batch)  # (batch,)
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]  # (batch, seq_len + 1)
    return tokens[idx].astype(np.int64)


def val_windows(tokens: np.ndarray, seq_len: int, max_tokens: int | None = None) -> np.ndarray:
    """Consecutive windows of seq_len + 1 tokens overlapping by one, so every validation
    token after the first is predicted exactly once (a short tail is dropped)."""
    if max_tokens:
        tokens = tokens[: max_tokens + 1]
    n = (len(tokens) - 1) // seq_len
    if n < 1:
        raise ValueError(f"validation split has {len(tokens)} tokens; needs at least seq_len + 1 = {seq_len + 1}")
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]  # (n, seq_len + 1)
    return tokens[idx].astype(np.int64)


class ArraySource:
    """In-memory token arrays. ``val_text_bytes`` (bytes of the text the validation tokens
    decode to) turns nats into bits per byte through ``tern.data.bits_per_byte``; without it
    ``bpb`` is None and ``nats_per_token`` is the figure."""

    name = "arrays"

    def __init__(self, train: np.ndarray, val: np.ndarray, vocab_size: int | None = None,
                 val_text_bytes: int | None = None):
        self.train, self.val = np.asarray(train), np.asarray(val)
        for nm, a in (("train", self.train), ("val", self.val)):
            if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
                raise ValueError(f"{nm} tokens must be a 1-D integer array, got {a.dtype} {a.shape}")
            if vocab_size is not None and a.size and (a.min() < 0 or a.max() >= vocab_size):
                raise ValueError(f"{nm} tokens must be ids in 0..{vocab_size - 1}")
        self.val_text_bytes = val_text_bytes

    def batch(self, seed: int, step: int, batch: int, seq_len: int) -> np.ndarray:
        return sample_windows(self.train, seed, step, batch, seq_len)

    def evaluate(self, nll_fn: NllFn, seq_len: int, max_tokens: int | None = None,
                 batch_size: int = 16) -> dict[str, Any]:
        w = val_windows(self.val, seq_len, max_tokens)
        b = batch_size
        nats = sum(float(nll_fn(w[i:i + b, :-1], w[i:i + b, 1:])) for i in range(0, len(w), b))
        tokens = int(w.shape[0] * seq_len)
        bpb = None
        if self.val_text_bytes and not max_tokens:
            try:
                from tern.data.tokens import bits_per_byte
            except ImportError:  # tern.data not installed: nats per token only
                bits_per_byte = None
            if bits_per_byte is not None:
                bpb = bits_per_byte(nats, self.val_text_bytes)
        return {"bpb": bpb, "nats": nats, "tokens": tokens, "bytes": self.val_text_bytes,
                "nats_per_token": nats / tokens}


class CorpusSource:
    """The kit's corpus through tern.data: training tokens of ``tokenizer``, validation
    bits per byte from ``tern.data.val_bpb`` (the fixed validation split)."""

    def __init__(self, tokenizer: str):
        try:
            from tern.data import tokens as data
        except ImportError as e:
            raise ValueError(f"tern.data is not available ({e}); pass a data source explicitly") from None
        self._data = data
        self.name = f"corpus:{tokenizer}"
        self.tokenizer = data.get_tokenizer(tokenizer)
        self.train = np.asarray(data.load_tokens("train", self.tokenizer))

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.vocab_size)

    def batch(self, seed: int, step: int, batch: int, seq_len: int) -> np.ndarray:
        return sample_windows(self.train, seed, step, batch, seq_len)

    def evaluate(self, nll_fn: NllFn, seq_len: int, max_tokens: int | None = None,
                 batch_size: int = 16) -> dict[str, Any]:
        r = dict(self._data.val_bpb(nll_fn, tokenizer=self.tokenizer, seq_len=seq_len,
                                    max_tokens=max_tokens or None, batch_size=batch_size,
                                    progress=False))
        if r.get("tokens"):
            r["nats_per_token"] = r["nats"] / r["tokens"]
        return r
