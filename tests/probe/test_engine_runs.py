"""The probe's engine runs: rounds spread over the probe, each model's fastest round kept."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from tern.core.config import ModelConfig
from tern.core.host_profile import EngineRun, HostProfile
from tern.probe import engine_runs as er
from tern.probe.engine_runs import CONTEXT_MODELS, EngineRunRounds, measure_engine_runs, render_engine_runs

TINY = ModelConfig(name="tiny-ctx", vocab_size=64, d_model=64, n_layers=2, attn_layers=(1,), n_heads=2,
                   mlp_hidden=128, moe_layers=(1,), n_experts=2, top_k=1, expert_hidden=64)


def test_context_models_are_distinct_and_cache_resident():
    from tern.core.config import param_counts

    assert len({c.name for c in CONTEXT_MODELS}) == len(CONTEXT_MODELS) == 3
    assert {c.d_model % 256 == 0 for c in CONTEXT_MODELS} == {True, False}  # partial segments and none
    assert all(param_counts(c).total.bytes < 3 << 20 for c in CONTEXT_MODELS)


def test_each_model_keeps_its_fastest_round(monkeypatch):
    # scripted timings: rounds x jobs, the second round slow (a shared host's slow spell)
    per_round = {0: 1.0, 1: 3.0, 2: 1.5}
    calls = itertools.count()
    n_jobs, repeats = 2, 3  # TINY at 1 and 2 threads

    def fake(_eng, _toks):
        i = next(calls)
        if i < 2 * n_jobs:  # the warm-up calls in the constructor (step + loop per job)
            return 99.0
        rnd = (i - 2 * n_jobs) // (2 * repeats * n_jobs)
        return per_round[rnd] * 1e-4

    monkeypatch.setattr(er, "time_steps", fake)
    monkeypatch.setattr(er, "time_in_numba", fake)
    trips = iter([340.0, 55.0, 60.0])  # the threads' round trip of each round (ns)
    monkeypatch.setattr(er, "round_trip_ns", lambda: next(trips))
    with EngineRunRounds((1, 2), tokens=8, repeats=repeats, warmup=1, models=(TINY,)) as rounds:
        for _ in range(3):
            rounds.round()
        runs = rounds.runs()
    assert [(r.config["name"], r.threads) for r in runs] == [("tiny-ctx", 1), ("tiny-ctx", 2)]
    for r in runs:
        assert r.rounds == 3 and r.repeats == repeats and r.tokens == 8
        assert r.loop_s == pytest.approx(1e-4) and r.step_s == pytest.approx(1e-4)
        assert r.loop_max_s == pytest.approx(3e-4)
    one, two = runs
    assert (one.round_trips_ns, one.round_trip_ns) == ((), None)  # one thread: no pair to time
    assert two.round_trips_ns == (340.0, 55.0, 60.0) and two.round_trip_ns == 340.0  # the fastest round's (the first)


def test_rounds_time_the_real_engine_and_clean_up():
    with EngineRunRounds((1,), tokens=4, repeats=1, warmup=1, models=(TINY,)) as rounds:
        folder = rounds._dir.name
        with pytest.raises(RuntimeError, match="no round"):
            rounds.runs()
        rounds.round()
        rounds.round()
        (run,) = rounds.runs()
    assert run.rounds == 2 and 0 < run.loop_s <= run.loop_max_s
    import os

    assert not os.path.exists(folder)
    with pytest.raises(RuntimeError, match="closed"):
        rounds.round()


@pytest.mark.parametrize("kw", [{"threads": ()}, {"threads": (0,)}, {"threads": (True,)}, {"repeats": 0},
                                {"tokens": 0}, {"warmup": -1}])
def test_bad_settings_are_refused(kw):
    args = {"threads": (1,), **kw}
    with pytest.raises(ValueError):
        EngineRunRounds(args.pop("threads"), models=(TINY,), **args)


def test_measure_engine_runs_refuses_zero_rounds():
    with pytest.raises(ValueError, match="rounds"):
        measure_engine_runs((1,), rounds=0)


def _run(**kw):
    base = dict(config=TINY.to_dict(), threads=1, step_s=2e-4, loop_s=1e-4, tokens=8, repeats=1)
    return EngineRun(**{**base, **kw})


def test_engine_run_validates_rounds_and_spread():
    assert _run().rounds == 1 and _run().loop_max_s is None
    with pytest.raises(ValueError, match="rounds"):
        _run(rounds=0)
    with pytest.raises(ValueError, match="loop_max_s"):
        _run(loop_max_s=0.5e-4)  # the slowest round cannot be faster than the fastest
    with pytest.raises(ValueError, match="loop_max_s"):
        _run(loop_max_s=float("nan"))


def test_profiles_with_and_without_rounds_load(tmp_path):
    from tern.predict.roofline import synthetic_profile

    prof = dataclasses.replace(synthetic_profile(32 << 20, 100.0, 20.0),
                               engine_runs=(_run(rounds=3, loop_max_s=1.2e-4), _run(threads=2)))
    prof.save(tmp_path / "new.json")
    assert HostProfile.load(tmp_path / "new.json") == prof
    d = prof.to_dict()  # a profile of an earlier session: engine runs without the two fields
    for r in d["engine_runs"]:
        del r["rounds"], r["loop_max_s"]
    old = HostProfile.from_dict(d)
    assert [(r.rounds, r.loop_max_s) for r in old.engine_runs] == [(1, None), (1, None)]


def test_engine_runs_carry_valid_round_trips(tmp_path):
    from tern.predict.roofline import synthetic_profile

    r = _run(threads=2, rounds=2, loop_max_s=2e-4, round_trips_ns=[356.0, None], round_trip_ns=356.0)
    assert r.round_trips_ns == (356.0, None)  # a list from JSON becomes a tuple
    prof = dataclasses.replace(synthetic_profile(32 << 20, 100.0, 20.0), engine_runs=(r,))
    prof.save(tmp_path / "hp.json")
    assert HostProfile.load(tmp_path / "hp.json").engine_runs == (r,)
    for bad in ({"round_trip_ns": 0.0}, {"round_trip_ns": float("inf")}, {"round_trips_ns": (True,)},
                {"round_trips_ns": ("50",)}, {"round_trip_ns": -3.0}):
        with pytest.raises(ValueError, match="round trip"):
            _run(threads=2, **bad)


def test_render_engine_runs_shows_the_spread():
    text = render_engine_runs([_run(rounds=3, loop_max_s=1.5e-4), _run(threads=2)])
    lines = text.splitlines()
    assert "spread" in lines[0] and len(lines) == 3
    assert "50.0%" in lines[1] and " 3" in lines[1] and "0.0%" in lines[2]
    assert "round trips" in lines[0]
    two = render_engine_runs([_run(threads=2, rounds=2, loop_max_s=1e-4, round_trips_ns=(356.0, None))])
    assert two.splitlines()[1].endswith("356 -")


def test_a_profile_file_with_a_bad_engine_run_is_refused_on_load(tmp_path):
    import json

    from tern.predict.roofline import synthetic_profile

    d = dataclasses.replace(synthetic_profile(32 << 20, 100.0, 20.0), engine_runs=(_run(rounds=2, loop_max_s=2e-4),)).to_dict()
    for bad, field in (({"rounds": 0}, "rounds"), ({"loop_max_s": 1e-5}, "loop_max_s"), ({"rounds": "3"}, "rounds")):
        path = tmp_path / "hp.json"
        path.write_text(json.dumps({**d, "engine_runs": [{**d["engine_runs"][0], **bad}]}))
        with pytest.raises(ValueError, match=field):
            HostProfile.load(path)
