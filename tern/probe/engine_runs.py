"""The engine itself, timed on small random models the probe builds.

The op costs (tern.probe.ops) time each operation alone, repeated on its own data; in a
decoded token dozens of different operations follow one another and share the caches,
the branch predictors and the instruction cache, and Python runs between tokens. Both
are measured here, on models whose weights stay in cache (so no memory stall enters):

* ``step_s`` — ``Engine.step`` called from a Python loop, as every benchmark and user loop
  calls it;
* ``loop_s`` — the engine's per-token function called from a numba loop.

The predictor (tern.predict.roofline) reads ``step_s - loop_s`` as the per-token
overhead and ``loop_s`` over its own op-cost sum for the same model as the
engine-context factor of this host (the median over the models). The models are not in
any sweep.

A shared VM does not hold still: in session 26 one probe caught both context models at
2 threads in a slow spell (139 / 188 us a token where the probe half an hour earlier had
85 / 130), which priced every 2-thread prediction of that host 1.75x too slow. So the
probe times the models in rounds spread over its minutes (:class:`EngineRunRounds`: one
round after the streaming-kernel choice, one after the op costs, one after the kernel
curves) and keeps each model's fastest round, with the slowest beside it. Session 29 found
what the slow spells are on that VM: placements of its two vCPUs (tern.probe.core_latency),
so each round records the threads' cache-line round trip beside its times.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tern.core.config import ModelConfig
from tern.core.engine_tuning import for_threads
from tern.core.host_profile import EngineRun
from tern.packed.writer import random_model
from tern.probe.core_latency import round_trip_ns
from tern.run.engine import Engine
from tern.run.timing import time_in_numba, time_steps

# cache-resident (~1-2 MB), different shapes, every kind of layer the engine has; -b's
# d_model 384 ends every matvec in a partial 256-column segment, -c's 512 in none (the
# op costs price partial segments with a term of their own: the median of three models
# does not hang on it)
CONTEXT_MODELS = (
    ModelConfig(name="probe-ctx-a", vocab_size=512, d_model=256, n_layers=4, attn_layers=(1,), n_heads=4,
                mlp_hidden=0, moe_layers=(0, 2, 3), n_experts=4, top_k=2, expert_hidden=512, n_shared=1,
                shared_hidden=256, embed_format="int8", head_format="int8", router_format="int8"),
    ModelConfig(name="probe-ctx-b", vocab_size=1024, d_model=384, n_layers=3, attn_layers=(2,), n_heads=6,
                mlp_hidden=1152, moe_layers=(1,), n_experts=2, top_k=1, expert_hidden=768,
                embed_format="int8", head_format="int8", router_format="int8"),
    ModelConfig(name="probe-ctx-c", vocab_size=512, d_model=512, n_layers=2, attn_layers=(1,), n_heads=8,
                mlp_hidden=768, moe_layers=(1,), n_experts=4, top_k=2, expert_hidden=256,
                embed_format="int8", head_format="int8", router_format="int8"),
)


class EngineRunRounds:
    """The context models written once (a temporary folder, removed by :meth:`close` or the
    ``with`` block) and their engines built once per thread count; each :meth:`round` times
    every (model, threads) ``repeats`` times; :meth:`runs` keeps each one's fastest round.

    ``stream_prefetch`` / ``stream``: the DRAM rows' form and the streaming kernel's prefetch
    the probe chose (whatever a tuning file says), per thread count or for all."""

    def __init__(self, threads: tuple[int, ...] = (1,), tokens: int = 128, repeats: int = 5, warmup: int = 32,
                 seed: int = 0, stream_prefetch: bool | dict[str, bool] = True,
                 stream: bool | dict[str, bool] = True, models: tuple[ModelConfig, ...] = CONTEXT_MODELS) -> None:
        if not threads or any(not isinstance(t, int) or isinstance(t, bool) or t < 1 for t in threads):
            raise ValueError(f"threads must be integers >= 1, got {threads!r}")
        for name, v, lo in (("tokens", tokens, 1), ("repeats", repeats, 1), ("warmup", warmup, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
        self.tokens, self.repeats, self.models = tokens, repeats, tuple(models)
        self._dir = tempfile.TemporaryDirectory(prefix="tern-probe-")
        rng = np.random.default_rng(seed)
        paths = {cfg.name: random_model(cfg, Path(self._dir.name) / f"{cfg.name}.tern", seed=seed, progress=False)
                 for cfg in self.models}
        self._jobs: list[tuple[ModelConfig, int, Any, np.ndarray]] = []
        for cfg in self.models:
            toks = rng.integers(0, cfg.vocab_size, size=tokens)
            for t in threads:
                eng = Engine(paths[cfg.name], threads=t, stream_prefetch=for_threads(stream_prefetch, t),
                             stream="dram" if for_threads(stream, t) else "off")
                time_steps(eng, toks[:max(warmup, 1)])  # compiles and warms the caches
                time_in_numba(eng, toks[:max(warmup, 1)])
                self._jobs.append((cfg, t, eng, toks))
        self._rounds: list[list[tuple[float, float]]] = []  # per round, per job: (step_s, loop_s)
        self._round_trips: list[float | None] = []  # per round: the threads' round trip (ns), when threads > 1
        self._pair = max(threads) > 1

    def round(self, progress: bool = False) -> None:
        """Time every (model, threads) once more: medians of ``repeats`` runs of ``tokens``."""
        from tqdm import tqdm

        if not self._jobs:
            raise RuntimeError("engine runs: closed")
        out = []
        self._round_trips.append(round_trip_ns() if self._pair else None)  # where the threads sit this round
        for _, _, eng, toks in tqdm(self._jobs, desc=f"engine runs, round {len(self._rounds) + 1}", unit="run",
                                    disable=not progress, leave=False, file=sys.stderr):
            step = statistics.median(time_steps(eng, toks) for _ in range(self.repeats))
            loop = statistics.median(time_in_numba(eng, toks) for _ in range(self.repeats))
            out.append((step, loop))
        self._rounds.append(out)

    def runs(self) -> list[EngineRun]:
        """One EngineRun per (model, threads): the fastest round's medians (step and loop
        each), the slowest round's loop beside them; at threads > 1 the threads' round trip
        of every round and of the fastest."""
        if not self._rounds:
            raise RuntimeError("engine runs: no round timed yet")
        out = []
        for j, (cfg, t, _, _) in enumerate(self._jobs):
            steps = [r[j][0] for r in self._rounds]
            loops = [r[j][1] for r in self._rounds]
            trips = tuple(self._round_trips) if t > 1 else ()
            out.append(EngineRun(config=cfg.to_dict(), threads=t, step_s=min(steps), loop_s=min(loops),
                                 tokens=self.tokens, repeats=self.repeats, rounds=len(self._rounds),
                                 loop_max_s=max(loops), round_trips_ns=trips,
                                 round_trip_ns=trips[loops.index(min(loops))] if trips else None))
        return out

    def close(self) -> None:
        self._jobs.clear()  # the engines map files in the folder: drop them first
        self._dir.cleanup()

    def __enter__(self) -> EngineRunRounds:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def measure_engine_runs(threads: tuple[int, ...] = (1,), tokens: int = 128, repeats: int = 5,
                        warmup: int = 32, progress: bool = True, seed: int = 0,
                        stream_prefetch: bool | dict[str, bool] = True,
                        stream: bool | dict[str, bool] = True, rounds: int = 1) -> list[EngineRun]:
    """Each context model at each thread count, ``rounds`` rounds back to back (the probe
    spreads its rounds over its minutes instead: tern.probe.profile.run_probe)."""
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    with EngineRunRounds(threads, tokens, repeats, warmup, seed, stream_prefetch, stream) as er:
        for _ in range(rounds):
            er.round(progress)
        return er.runs()


def render_engine_runs(runs: tuple[EngineRun, ...] | list[EngineRun]) -> str:
    """A table of the engine runs: us per token from Python and inside numba (fastest
    round), the slowest round's numba figure, the spread between them and, at threads > 1,
    the threads' round trip in each round (ns; tern.probe.core_latency)."""
    lines = [f"{'model':<12} {'thr':>3} {'step us':>8} {'loop us':>8} {'slowest':>8} {'spread':>7} {'rounds':>6}"
             "  round trips ns"]
    for r in runs:
        slow = r.loop_s if r.loop_max_s is None else r.loop_max_s
        trips = " ".join("-" if v is None else f"{v:.0f}" for v in r.round_trips_ns)
        lines.append(f"{r.config.get('name', '?'):<12} {r.threads:>3} {r.step_s * 1e6:>8.1f} {r.loop_s * 1e6:>8.1f} "
                     f"{slow * 1e6:>8.1f} {100 * (slow / r.loop_s - 1):>6.1f}% {r.rounds:>6}  {trips}".rstrip())
    return "\n".join(lines)
