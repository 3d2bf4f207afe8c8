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
engine-context factor of this host. The models are not in any sweep.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from tern.core.config import ModelConfig
from tern.core.engine_tuning import for_threads
from tern.core.host_profile import EngineRun
from tern.packed.writer import random_model
from tern.run.engine import Engine
from tern.run.timing import time_in_numba, time_steps

# cache-resident (~1-2 MB), different shapes, every kind of layer the engine has
CONTEXT_MODELS = (
    ModelConfig(name="probe-ctx-a", vocab_size=512, d_model=256, n_layers=4, attn_layers=(1,), n_heads=4,
                mlp_hidden=0, moe_layers=(0, 2, 3), n_experts=4, top_k=2, expert_hidden=512, n_shared=1,
                shared_hidden=256, embed_format="int8", head_format="int8", router_format="int8"),
    ModelConfig(name="probe-ctx-b", vocab_size=1024, d_model=384, n_layers=3, attn_layers=(2,), n_heads=6,
                mlp_hidden=1152, moe_layers=(1,), n_experts=2, top_k=1, expert_hidden=768,
                embed_format="int8", head_format="int8", router_format="int8"),
)


def measure_engine_runs(threads: tuple[int, ...] = (1,), tokens: int = 128, repeats: int = 5,
                        warmup: int = 32, progress: bool = True, seed: int = 0,
                        stream_prefetch: bool | dict[str, bool] = True,
                        stream: bool | dict[str, bool] = True) -> list[EngineRun]:
    """Each context model at each thread count: medians of ``repeats`` runs of ``tokens``
    (engines with the DRAM rows' form and the streaming-kernel prefetch the probe chose,
    whatever a tuning file says)."""
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    out = []
    jobs = [(cfg, t) for cfg in CONTEXT_MODELS for t in threads]
    with tempfile.TemporaryDirectory(prefix="tern-probe-") as d:
        paths = {cfg.name: random_model(cfg, Path(d) / f"{cfg.name}.tern", seed=seed, progress=False)
                 for cfg in CONTEXT_MODELS}
        for cfg, t in tqdm(jobs, desc="engine runs", unit="run", disable=not progress, leave=False,
                           file=sys.stderr):
            eng = Engine(paths[cfg.name], threads=t, stream_prefetch=for_threads(stream_prefetch, t),
                         stream="dram" if for_threads(stream, t) else "off")
            toks = rng.integers(0, cfg.vocab_size, size=tokens)
            time_steps(eng, toks[:warmup])
            time_in_numba(eng, toks[:warmup])
            step = [time_steps(eng, toks) for _ in range(repeats)]
            loop = [time_in_numba(eng, toks) for _ in range(repeats)]
            out.append(EngineRun(config=cfg.to_dict(), threads=t, step_s=statistics.median(step),
                                 loop_s=statistics.median(loop), tokens=tokens, repeats=repeats))
            del eng
    return out
