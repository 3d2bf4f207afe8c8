"""benchmarks/op_breakdown.py: the instrumented token step computes exactly the engine's
logits (every mixer, dense MLP, shared and routed experts, sequential and expert-parallel),
and its per-category cycles account for the token."""


import numba
import numpy as np
import pytest
from conftest import SMALL, load_benchmark

from tern.packed.writer import random_model
from tern.run.engine import Engine


@pytest.fixture(scope="module")
def ob():
    return load_benchmark("op_breakdown")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return random_model(SMALL.replace(activation="silu"), tmp_path_factory.mktemp("ob") / "small.tern", seed=3)


@pytest.mark.parametrize("threads", [1, 2])
def test_instrumented_step_matches_the_engine(ob, model, threads):
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip("needs 2 numba threads")
    # par_min_weights 0: every matrix and the routed experts take the parallel paths at 2 threads
    ref, eng = (Engine(model, threads=threads, region=False, par_min_weights=0) for _ in range(2))
    acc = np.zeros(len(ob.CATEGORIES), np.int64)
    toks = np.random.default_rng(0).integers(0, SMALL.vocab_size, 12)  # past the window of 8
    ref.reset()
    want = [ref.step(int(t)) for t in toks]
    eng.reset()
    before, after = eng._before, eng._after
    for t, w in zip(toks, want, strict=True):
        ob.timed_token_step(*before, int(t), *after, acc)
        assert np.array_equal(eng.logits, w)
    assert np.array_equal(eng.expert_counts, ref.expert_counts) and eng.position == len(toks)
    assert (acc >= 0).all()
    used = {c for c, v in zip(ob.CATEGORIES, acc, strict=True) if v > 0}
    expected = {"embed", "norm", "quantize", "mixer matvec", "attention", "ssm conv", "ssm scan", "router",
                "residual", "head matvec", "ffn gate+up matvec", "activation", "ffn down matvec"}
    if threads > 1:
        expected.add("experts (parallel region)")
    assert expected <= used


def test_breakdown_accounts_for_the_token(ob, model):
    eng = Engine(model)
    b = ob.breakdown(eng, tokens=4, repeats=1, warmup=1)
    assert set(b["s_per_token"]) == set(ob.CATEGORIES)
    total = sum(b["s_per_token"].values())
    assert 0 < total <= b["instrumented_s"]["median"] * 1.5  # cycles inside the timed calls
    assert b["matrix_s"] + b["beyond_matrix_s"] == pytest.approx(total)
    assert b["cycles_per_second"] > 1e8
    with pytest.raises(ValueError, match="moe_skip"):
        ob.breakdown(Engine(model, moe_skip=False), tokens=1, repeats=1)
    if numba.config.NUMBA_NUM_THREADS >= 2:
        with pytest.raises(ValueError, match="region=False"):
            ob.breakdown(Engine(model, threads=2, region=True), tokens=1, repeats=1)


def test_main_writes_breakdown_and_ab_rows(ob, model, tmp_path, capsys):
    """The command line: one breakdown row and two A/B rows, each with the read rate timed
    beside the run (no host profile in this results folder: no profile fraction)."""
    import json

    from tern.core.records import read_jsonl

    common = ["--results", str(tmp_path), "--model", str(model), "--threads", "1", "--tokens", "4",
              "--repeats", "1", "--warmup", "1"]
    assert ob.main(common) == 0
    (row,) = read_jsonl(tmp_path / "bench" / "op_breakdown.jsonl")
    assert row["benchmark"] == "op_breakdown" and row["tok_per_s"] > 0 and row["bandwidth_fraction"] is None
    assert row["read_same_run"]["gbps_median"] > 0
    assert row["bandwidth_fraction_same_run"] == pytest.approx(row["gbps_end_to_end"] / row["read_same_run"]["gbps_median"])
    assert ob.main([*common, "--compare", "act_skip=False", "fused=False"]) == 0
    ab = read_jsonl(tmp_path / "bench" / "engine_ab.jsonl")
    assert [r["variant"] for r in ab] == ["act_skip=False", "fused=False"] and all(r["identical_logits"] for r in ab)
    printed = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [p["variant"] for p in printed if "variant" in p] == ["act_skip=False", "fused=False"]


def test_cache_guard_hashes_the_imported_engine_files(ob):
    """The timed step's numba cache is dropped when the engine code it compiled in changes: the
    guard hashes the files of the tern that is imported (not files beside the script), every
    file the engine's own token step guards, and they exist."""
    from pathlib import Path

    from tern.kernels import kernels_ternary, ops

    here = Path(ops.__file__).resolve().parent
    deps = [Path(d) for d in ob._DEPS if d.endswith(".py")]
    assert all(d.is_absolute() and d.parent == here and d.is_file() for d in deps), deps
    assert {d.name for d in deps} >= {"ops.py", *(f for f in ops._DEPS if f.endswith(".py"))}
    # the import-time settings compiled in (prefetch levels and distances) are stamped too
    assert kernels_ternary.COMPILED_SETTINGS in ob._DEPS
