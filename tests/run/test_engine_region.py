"""The engine's one-region token step (Engine(region=True), tern.kernels.ops_region): the same
logits as one thread, bit for bit, for every model variant and split; it completes when its
threads run one after another; the phase counters; bad input."""

import numba
import numpy as np
import pytest
from conftest import SMALL

from tern.kernels import ops_region
from tern.kernels.prefetch import CACHE_LINE_BYTES
from tern.kernels.region import STRIDE, atomic_add, atomic_load, phase_counters
from tern.packed.writer import random_model
from tern.predict.inventory import region_phases
from tern.run.engine import Engine

needs_two = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 numba threads")

VARIANTS = {
    "small": (SMALL, {}),  # SSM + attention, dense MLP, MoE + shared expert, dReLU (activation skip)
    "silu": (SMALL.replace(activation="silu"), {}),  # row-oriented down projections, split
    "fp32": (SMALL, dict(kernel="fp32")),
    "masked": (SMALL, dict(moe_skip=False)),  # every expert: one item, in order
    "top1": (SMALL.replace(top_k=1), {}),
    # routers of more than 16 rows: their row ranges are a phase of their own (fp32 rows when
    # every matrix splits; int8 / fp16 rows of 64 x 256 = the default's 16K weights)
    "router40": (SMALL.replace(n_experts=40), {}),
    "router_int8": (SMALL.replace(d_model=256, n_experts=64, router_format="int8"), {}),
    "router_fp16": (SMALL.replace(d_model=256, n_experts=64, router_format="fp16", top_k=3), {}),
    "heads16": (SMALL.replace(embed_format="fp16", head_format="int8", router_format="bf16", tie_embeddings=False), {}),
    "b3": (SMALL.replace(d_model=256, mlp_hidden=512, expert_hidden=256, shared_hidden=256, activation="silu",
                         mixer_format="ternary_b3", mlp_format="ternary_b3", expert_format="ternary_b3"),
           dict(b3="direct")),
    # dReLU with d_model 640: the activation-skip down projections split over 3 output
    # segments, the last partial
    "skipwide": (SMALL.replace(d_model=640, n_heads=8, mlp_hidden=256, expert_hidden=128, shared_hidden=64,
                               vocab_size=300), {}),
    # an SSM layer whose selective scan splits over channels (d_inner 2048 x (dt_rank 64 +
    # d_state 16) >= tern.kernels.policy.REGION_SCAN_MIN_WEIGHTS): one channel range per thread
    "scan_split": (SMALL.replace(d_model=1024, n_heads=8, mlp_hidden=256, expert_hidden=128, shared_hidden=64,
                                 vocab_size=300), {}),
    # the same with the dt projections stored in fp16 (ModelConfig.dt_format), widened in the scan
    "scan_split_dt16": (SMALL.replace(d_model=1024, n_heads=8, mlp_hidden=256, expert_hidden=128, shared_hidden=64,
                                      vocab_size=300, dt_format="fp16"), {}),
    # attention heads split over the threads (d_model >= tern.kernels.policy.REGION_ATTN_MIN_D): 9 heads,
    # items of 5 and 4
    "attn_split": (SMALL.replace(d_model=576, n_heads=9, mlp_hidden=256, expert_hidden=128, shared_hidden=64,
                                 vocab_size=300), {}),
    "wide": (SMALL.replace(d_model=256, mlp_hidden=768, vocab_size=1000, expert_hidden=128, shared_hidden=128,
                           n_heads=8, head_format="fp16", embed_format="fp16"), dict(stream="on")),
}


def _logits(fn_args, tokens):
    fn, before, after = fn_args
    out = []
    for t in tokens:
        fn(*before, int(t), *after)
        out.append(after[9].copy())  # logits
    return np.stack(out)  # (T, V)


def _run(eng, tokens):
    eng.reset()
    return np.stack([eng.step(int(t)) for t in tokens])  # (T, V)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("region")
    return {k: random_model(cfg, d / f"{k}.tern", seed=3, progress=False) for k, (cfg, _) in VARIANTS.items()}


@needs_two
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_region_logits_identical_to_one_thread(files, variant):
    cfg, kw = VARIANTS[variant]
    tokens = np.arange(24) * 7 % cfg.vocab_size  # past the attention window (8)
    ref = _run(Engine(files[variant], threads=1, **kw), tokens)
    eng = Engine(files[variant], threads=2, region=True, **kw)
    assert eng.describe()["region"] is True
    for params in ([0, 1], [0, 3], [1 << 30, 2], list(eng.region_params)):  # every split, none, the default
        eng.region_params[:] = params
        got = _run(eng, tokens)
        assert np.array_equal(got, ref), (variant, params)
    # the phase count of a token stays within the counters allocated for it. Read it from the
    # region step itself at the default parameters: under load (the suite's two workers on two
    # cores) Engine.step may fall back to one thread (tern.run.region_watch) for the last tokens,
    # and the count left behind would be an earlier run's (seen once: 39, the [0, 1] split's)
    eng.reset()
    fn, before, after = eng.fused_call()
    fn(*before, int(tokens[0]), *after)
    used = int(after[-1][-1])
    assert 0 < used <= ops_region.phases_bound(eng.LI)
    if kw.get("kernel", "ternary") == "ternary" and kw.get("moe_skip", True):  # the predictor counts the same
        pol = ops_region.ENGINE_POLICY
        assert used == region_phases(cfg, ops_region.SKIP_SEGMENTS, pol.region_router_split,
                                     scan=pol.region_scan_split, attn=pol.region_attn_split), variant


@needs_two
def test_region_completes_when_its_threads_run_one_after_another(files):
    """numba does not promise that a prange's iterations run concurrently: with one numba
    thread both walks of the token run in turn, and the first does every item."""
    eng = Engine(files["silu"], threads=2, region=True)
    eng.region_params[:] = [0, 2]
    tokens = np.arange(12) * 5 % SMALL.vocab_size
    ref = _run(Engine(files["silu"]), tokens)
    eng.reset()
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        got = _logits(eng.fused_call(), tokens)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(got, ref)


@needs_two
def test_region_timing_helpers(files):
    """tern.run.timing's bare-call and in-numba loops run the region's step (the engine's
    fused_call), token by token as Engine.step does."""
    from tern.run.timing import time_in_numba, time_njit

    eng = Engine(files["silu"], threads=2, region=True)
    tokens = np.arange(10) * 3 % SMALL.vocab_size
    ref = _run(Engine(files["silu"]), tokens)[-1]
    for timer in (time_njit, time_in_numba):
        assert timer(eng, tokens) > 0
        assert eng.position == len(tokens) and np.array_equal(eng.logits, ref)


def test_region_watch_falls_back_after_stalls_and_retries():
    """tern.run.region_watch: quick tokens build the baseline; one slow token is not enough,
    STALLS_TO_SWITCH within the window switch to the one-thread step for FALLBACK_TOKENS,
    then the region is tried again against the same baseline."""
    from tern.run import region_watch as rw

    assert rw.STALLS_TO_SWITCH >= 2
    r = rw.RegionRunner((), ())
    for _ in range(rw.MIN_SAMPLES - 1):
        r.record(1e-4)
    r.record(1.0)  # under MIN_SAMPLES: no baseline yet, it joins it
    assert r.baseline() is not None and r.fallback_left == 0
    r = rw.RegionRunner((), ())
    for _ in range(rw.MIN_SAMPLES):
        r.record(1e-4)
    r.record(rw.STALL_FACTOR * 1e-4 * 0.9)  # slower, not stalled
    for _ in range(rw.STALLS_TO_SWITCH - 1):
        r.record(1e-3)  # stalled, not yet enough
    assert r.fallback_left == 0 and r.baseline() == pytest.approx(1e-4)
    r.record(1e-3)  # STALLS_TO_SWITCH: fall back
    assert r.fallback_left == rw.FALLBACK_TOKENS and r.switches == 1 and not any(r.stalled) and r.n_stalled == 0
    assert r.baseline() == pytest.approx(1e-4)  # kept for the retry
    r = rw.RegionRunner((), ())  # stalls further apart than the window do not add up
    for i in range(rw.MIN_SAMPLES + 3 * rw.WINDOW):
        r.record(1e-3 if i >= rw.MIN_SAMPLES and i % (rw.WINDOW // 2) == 0 else 1e-4)
        assert r.n_stalled == sum(r.stalled)
    assert r.switches == 0


def test_region_fallback_runs_on_one_thread(monkeypatch):
    """While it falls back, the runner calls the plain step with numba on ONE thread (a
    thread that waits for nobody) and gives the caller its thread count back, also when the
    step raises."""
    from tern.run import region_watch as rw

    seen = []

    class FakeOps:
        @staticmethod
        def token_step(*args):
            seen.append(numba.get_num_threads())
            if args[-1] == "boom":
                raise RuntimeError("boom")

    monkeypatch.setattr(rw, "ops", FakeOps)
    r = rw.RegionRunner(("b",), tuple(range(rw.N_PLAIN_AFTER + 4)))
    r.fallback_left = 2
    before = numba.get_num_threads()
    r(5)
    assert seen == [1] and numba.get_num_threads() == before and r.fallback_left == 1
    r = rw.RegionRunner(("b",), tuple(range(rw.N_PLAIN_AFTER - 1)) + ("boom",) + (0, 0, 0, 0))
    r.fallback_left = 1
    with pytest.raises(RuntimeError, match="boom"):
        r(5)
    assert seen == [1, 1] and numba.get_num_threads() == before


@needs_two
@pytest.mark.parametrize("variant", ["silu", "attn_split"])
def test_region_fallback_gives_the_same_logits(files, monkeypatch, variant):
    """A region engine whose clock says every other token stalled switches to the one-thread
    step and back; the logits never change. attn_split: the one-thread step then reads the
    attention caches in the region's two blocks of heads (5 and 4, tern.kernels.attention)."""
    from tern.kernels import ops
    from tern.run import region_watch as rw

    monkeypatch.setattr(rw, "FALLBACK_TOKENS", 3)
    cfg = VARIANTS[variant][0]
    tokens = np.arange(40) * 7 % cfg.vocab_size
    ref = _run(Engine(files[variant]), tokens)
    eng = Engine(files[variant], threads=2, region=True)
    assert eng.G[ops.G_ATTN_BLOCKS] == (2 if variant == "attn_split" else 1)
    assert Engine(files[variant], threads=1).G[ops.G_ATTN_BLOCKS] == 1
    ticks = iter(np.cumsum([1e-4 if i < 2 * rw.MIN_SAMPLES else (1e-4 if i % 2 == 0 else 1.0)
                            for i in range(1000)]))
    eng.region_runner.clock = lambda: float(next(ticks))
    got = _run(eng, tokens)
    assert np.array_equal(got, ref)
    assert eng.region_runner.switches >= 2  # fell back, retried, fell back again


def test_attention_caches_start_on_a_cache_line_and_are_zero(files):
    """The engine's key / value caches (tern.kernels.attention): one flat (window x d_model) row a
    layer, zeroed, starting on a cache line so two threads' head blocks share no line."""
    cfg = VARIANTS["attn_split"][0]
    eng = Engine(files["attn_split"], threads=1)
    for c in (eng.kc, eng.vc):
        assert c.shape == (eng.n_attn, cfg.attn_window * cfg.d_model) and c.dtype == np.float32 and c.flags.c_contiguous
        assert c.ctypes.data % CACHE_LINE_BYTES == 0 and not c.any()


def test_region_bad_input_and_one_thread(files):
    for bad in ("yes", 1, None, "on"):
        with pytest.raises(ValueError, match="region"):
            Engine(files["small"], threads=2, region=bad)
    with pytest.raises(ValueError, match="fused"):
        Engine(files["small"], threads=2, region=True, fused=False)
    one = Engine(files["small"], threads=1, region=True)  # nothing to share: the plain step
    assert one.describe()["region"] is False
    if numba.config.NUMBA_NUM_THREADS >= 2:  # the default: one region per token, with the fused step
        assert Engine(files["small"], threads=2).region and Engine(files["small"], threads=2, region="auto").region
        assert not Engine(files["small"], threads=2, region=False).region
        assert not Engine(files["small"], threads=2, fused=False).region  # auto: the per-op Python step
    with pytest.raises(ValueError, match="n_phases"):
        phase_counters(0)


@numba.njit(parallel=True)
def _count_in_parallel(ctr, n):
    for t in numba.prange(2):
        for _ in range(n):
            atomic_add(ctr, t * 0, 1)
    return atomic_load(ctr, 0)


@needs_two
def test_atomic_counters():
    ctr = phase_counters(2)
    assert ctr.shape == (2 * STRIDE,) and not ctr.any()
    assert _count_in_parallel(ctr, 100_000) == 200_000  # no increment lost between threads
