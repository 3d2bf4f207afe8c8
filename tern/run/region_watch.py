"""The engine's one-region step with a watch on its own speed (Engine(region=True)).

The region step (tern.kernels.ops_region) makes its threads wait for each other's work
items inside the token; when another process takes one of the cores, the thread sharing
it is descheduled for milliseconds while it holds an item, and the token waits with it
(measured on the 2-core AMD EPYC Zen 5 VM beside one busy process: 0.50-0.71x one thread,
where the per-matrix step keeps 1.0x). :class:`RegionRunner` times every region token;
when STALLS_TO_SWITCH of the last WINDOW ran over STALL_FACTOR x the quick quartile of the
recent ones, it runs the plain step (tern.kernels.ops.token_step, the same logits) on one
thread for the next FALLBACK_TOKENS tokens, then tries the region again against the same
baseline. Every token's logits are identical whichever step ran it.

Why one thread and three stalls (Intel Xeon VM, 2 vCPU, session 13): a quiet 2-vCPU VM
still loses a core for 1-50 ms a few times a second (a C loop timing itself on each core:
~20 gaps over 1 ms per 10 s), so two stalls in 32 tokens switched a quiet 30m-e455 engine
3-6 times per 3,000 tokens; and there the per-matrix step at 2 threads ran at 0.66x one
thread (740 against 1,118 tok/s), so each false switch cost speed. One thread waits for
nobody. Same process, rounds of 1,500 (30m-e455) or 6,000 tokens (4m-e8) at 2 threads,
median tok/s (per-matrix fallback after 2 stalls -> one thread after 2 / 3 / 4 stalls ->
no fallback): 30m-e455 quiet 1,020 -> 1,155 / - / 1,156 -> 1,149, beside a busy process
539 -> 876 / - / 893 -> 803; 4m-e8 quiet 5,374 -> 5,186 / 6,238 / 6,676 -> 6,582, beside
a busy process 4,052 -> 4,253 / 3,736 / 3,506 -> 3,403.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numba

from tern.kernels import ops, ops_region

STALL_FACTOR = 3.0  # a region token this many times the recent quick quartile: stalled
WINDOW = 32  # region tokens remembered (baseline and stalls)
MIN_SAMPLES = 8  # baseline tokens needed before a token can count as stalled
STALLS_TO_SWITCH = 3  # stalled tokens within the window that switch to the one-thread step
FALLBACK_TOKENS = 256  # tokens of the one-thread step before the region is tried again
N_PLAIN_AFTER = 10  # ops.token_step's arguments after the token (the region step takes 4 more)


class RegionRunner:
    """Run one token with the region step, or with the one-thread step while it falls back:
    ``runner(token)`` on the engine's ``before`` / ``after`` argument tuples."""

    def __init__(self, before: tuple, after: tuple, clock: Callable[[], float] = time.perf_counter) -> None:
        self.before, self.after, self.clock = before, after, clock
        self.times: deque[float] = deque(maxlen=WINDOW)  # seconds of region tokens that did not stall
        self.stalled: deque[bool] = deque(maxlen=WINDOW)
        self.n_stalled = 0  # sum(self.stalled), kept as tokens come and go
        self.fallback_left = 0
        self.switches = 0  # times it fell back to the one-thread step
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
            threads = numba.get_num_threads()
            numba.set_num_threads(1)  # one thread waits for nobody
            try:
                ops.token_step(*self.before, token, *self.after[:N_PLAIN_AFTER])
            finally:
                numba.set_num_threads(threads)
            return
        t0 = self.clock()
        ops_region.token_step_region(*self.before, token, *self.after)
        self.record(self.clock() - t0)
