"""The engine's one-region step with a watch on its own speed (Engine(region=True)).

The region step (tern.kernels.ops_region) makes its threads wait for each other's work
items inside the token; when another process takes one of the cores, the thread sharing
it is descheduled for milliseconds while it holds an item, and the token waits with it
(measured on the 2-core AMD EPYC Zen 5 VM beside one busy process: 0.50-0.71x one thread,
where the per-matrix step keeps 1.0x). :class:`RegionRunner` times every region token;
when STALLS_TO_SWITCH of the last WINDOW ran over STALL_FACTOR x the quick quartile of the
recent ones, it runs the per-matrix step (tern.kernels.ops.token_step, the same logits)
for the next FALLBACK_TOKENS tokens, then tries the region again against the same
baseline. Every token's logits are identical whichever step ran it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from tern.kernels import ops, ops_region

STALL_FACTOR = 3.0  # a region token this many times the recent quick quartile: stalled
WINDOW = 32  # region tokens remembered (baseline and stalls)
MIN_SAMPLES = 8  # baseline tokens needed before a token can count as stalled
STALLS_TO_SWITCH = 2  # stalled tokens within the window that switch to the per-matrix step
FALLBACK_TOKENS = 256  # tokens of the per-matrix step before the region is tried again
N_PLAIN_AFTER = 10  # ops.token_step's arguments after the token (the region step takes 4 more)


class RegionRunner:
    """Run one token with the region step, or with the per-matrix step while it falls back:
    ``runner(token)`` on the engine's ``before`` / ``after`` argument tuples."""

    def __init__(self, before: tuple, after: tuple, clock: Callable[[], float] = time.perf_counter) -> None:
        self.before, self.after, self.clock = before, after, clock
        self.times: deque[float] = deque(maxlen=WINDOW)  # seconds of region tokens that did not stall
        self.stalled: deque[bool] = deque(maxlen=WINDOW)
        self.n_stalled = 0  # sum(self.stalled), kept as tokens come and go
        self.fallback_left = 0
        self.switches = 0  # times it fell back to the per-matrix step
        self._base: float | None = None  # baseline(), refreshed every MIN_SAMPLES tokens (a sort per token costs ~2 us)
        self._since = 0

    def baseline(self) -> float | None:
        """The quick quartile of the recent unstalled region tokens (None: too few yet)."""
        if len(self.times) < MIN_SAMPLES:
            return None
        if self._base is None or self._since >= MIN_SAMPLES:
            self._base, self._since = sorted(self.times)[len(self.times) // 4], 0
        return self._base

    def record(self, seconds: float) -> None:
        """A region token took ``seconds``: count a stall, fall back after STALLS_TO_SWITCH."""
        base = self.baseline()
        stalled = base is not None and seconds > STALL_FACTOR * base
        if not stalled:
            self.times.append(seconds)
            self._since += 1
        if len(self.stalled) == WINDOW:
            self.n_stalled -= self.stalled[0]
        self.stalled.append(stalled)
        self.n_stalled += stalled
        if self.n_stalled >= STALLS_TO_SWITCH:
            self.fallback_left = FALLBACK_TOKENS
            self.stalled.clear()
            self.n_stalled = 0
            self.switches += 1

    def __call__(self, token: int) -> None:
        if self.fallback_left:
            self.fallback_left -= 1
            ops.token_step(*self.before, token, *self.after[:N_PLAIN_AFTER])
            return
        t0 = self.clock()
        ops_region.token_step_region(*self.before, token, *self.after)
        self.record(self.clock() - t0)
