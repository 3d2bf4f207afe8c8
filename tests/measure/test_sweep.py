"""Sweeps: families, resumable records, the worker measuring a real tiny model."""

import dataclasses
import json

import pytest

from tern.core.config import ModelConfig, param_counts
from tern.core.records import read_jsonl
from tern.measure.sweep import (
    BUDGETS,
    SweepPoint,
    accuracy,
    experts_for_total_bytes,
    fixed_active_family,
    fixed_total_family,
    run_sweep,
)
from tern.predict.roofline import synthetic_profile

TINY = ModelConfig(name="tiny-sweep", vocab_size=64, d_model=32, n_layers=2, attn_layers=(1,),
                   n_heads=2, d_state=4, mlp_hidden=0, moe_layers=(0, 1), n_experts=2, top_k=1,
                   expert_hidden=32, router_format="int8")


def host():
    return synthetic_profile(llc_bytes=1 << 20, cache_gbps=100.0, dram_gbps=20.0)


def test_fixed_active_family_grows_total_not_active():
    fam = fixed_active_family("30m", max_total_bytes=1e9)
    totals = [param_counts(c).total.bytes for c in fam]
    actives = [param_counts(c).active.params for c in fam]
    assert totals == sorted(totals) and totals[-1] > 0.8e9
    assert max(actives) / min(actives) < 1.05  # routers add a little
    base = BUDGETS["4m"]
    e = experts_for_total_bytes(base, 1e8)
    assert abs(param_counts(base.replace(n_experts=e)).total.bytes - 1e8) < 0.02e8


def test_fixed_total_family_grows_active():
    fam = fixed_total_family("4m", n_experts=16, top_ks=(1, 2, 4, 32))
    assert [c.top_k for c in fam] == [1, 2, 4]
    assert len({param_counts(c).total.params for c in fam}) == 1


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown sweep budget"):
        fixed_active_family("7b")
    with pytest.raises(ValueError, match="threads"):
        SweepPoint("fixed_active", "x", TINY, threads=0)


def test_resume_skips_finished_points(tmp_path):
    calls = []

    def fake_measure(path, point):
        calls.append(point.key)
        if len(calls) == 2:
            raise RuntimeError("interrupted")
        return {"tok_per_s": 100.0, "tok_per_s_min": 90.0, "tok_per_s_max": 110.0, "repeats": 3,
                "peak_rss_bytes": 1}

    pts = [SweepPoint("fixed_active", "t", TINY.replace(n_experts=e, name=f"t{e}"), 1, tokens=4)
           for e in (2, 4)]
    rec = tmp_path / "rec.jsonl"
    with pytest.raises(RuntimeError):
        run_sweep(pts, rec, tmp_path / "m", host(), measure=fake_measure, progress=False)
    assert len(read_jsonl(rec)) == 1
    calls.clear()
    rows = run_sweep(pts, rec, tmp_path / "m", host(),
                     measure=lambda p, q: {"tok_per_s": 50.0, "repeats": 3}, progress=False)
    assert [r["reused"] for r in rows] == [True, False]
    assert len(read_jsonl(rec)) == 2
    assert rows[1]["ratio"] == pytest.approx(50.0 / rows[1]["predicted_tok_per_s"])
    acc = accuracy(rows)
    assert acc["n"] == 2


def test_sweep_rows_record_and_price_the_policy_their_engine_ran(tmp_path):
    """A point measured with the one-region step is predicted with its splits, and so is the
    row when it is reused; a worker that reports no policy ran the engine's default."""
    import tern.measure.sweep as sw
    from tern.kernels.ops_region import ENGINE_POLICY
    from tern.kernels.policy import EnginePolicy

    region = EnginePolicy(region=True, region_skip_split=True)
    h = host()
    pt = SweepPoint("fixed_active", "t", TINY, 2, tokens=4, region=True)
    got = run_sweep([pt], tmp_path / "rec.jsonl", tmp_path / "m", h, progress=False, read_now=None, kernel_now=None,
                    measure=lambda p, q: {"tok_per_s": 100.0, "repeats": 3, "engine_policy": region.to_dict()})
    assert EnginePolicy.of_record(got[0]) == region
    assert got[0]["predicted_tok_per_s"] == pytest.approx(sw.predicted(TINY, h, 2, region, 4)["predicted_tok_per_s"])
    again = run_sweep([pt], tmp_path / "rec.jsonl", tmp_path / "m", h, progress=False, read_now=None, kernel_now=None)
    assert again[0]["reused"] and again[0]["predicted_tok_per_s"] == pytest.approx(got[0]["predicted_tok_per_s"])
    plain = run_sweep([SweepPoint("fixed_active", "t", TINY, 2, tokens=4)], tmp_path / "rec2.jsonl", tmp_path / "m",
                      h, progress=False, read_now=None, kernel_now=None,
                      measure=lambda p, q: {"tok_per_s": 100.0, "repeats": 3})
    assert EnginePolicy.of_record(plain[0]) == ENGINE_POLICY


@pytest.mark.slow
def test_real_worker_on_tiny_model(tmp_path):
    pts = [SweepPoint("fixed_active", "t", TINY, 1, tokens=8, repeats=3, warmup=2)]
    rows = run_sweep(pts, tmp_path / "rec.jsonl", tmp_path / "m", host(), progress=False)
    r = rows[0]
    assert r["tok_per_s"] > 0 and r["repeats"] == 3 and r["peak_rss_bytes"] > 1e6
    assert r["tok_per_s_min"] <= r["tok_per_s"] <= r["tok_per_s_max"]
    assert json.loads(json.dumps(r))["name"] == "tiny-sweep"


def _fake_rows():
    out = []
    for fam, budget, cfgs in (("fixed_active", "4m", fixed_active_family("4m", 5e7)),
                              ("fixed_total", "4m", fixed_total_family("4m", 8, (1, 2)))):
        for t in (1, 2):
            for c in cfgs:
                pc = param_counts(c)
                out.append({"family": fam, "budget": budget, "threads": t, "config": c.to_dict(),
                            "total_bytes": pc.total.bytes, "active_bytes": pc.active.bytes,
                            "active_params": pc.active.params, "tok_per_s": 1000.0,
                            "tok_per_s_min": 900.0, "tok_per_s_max": 1100.0,
                            "predicted_tok_per_s": 1200.0, "ratio": 1000 / 1200})
    return out


def test_sweep_plots():
    from tern.measure.plots import plot_fixed_active, plot_fixed_total, plot_ratios

    rows = _fake_rows()
    fig = plot_fixed_active(rows, host())
    assert len(fig.axes) == 2 and fig.axes[0].get_xscale() == "log"
    assert "tok/s" in fig.axes[0].get_ylabel()
    assert plot_fixed_total(rows).axes[0].get_xlabel().startswith("active bytes")
    assert len(plot_ratios(rows).axes[0].lines) >= 4
    with pytest.raises(ValueError):
        plot_fixed_active([], host())


def test_pick_10b_and_roof_table():
    from tern.predict.hosts import load_reference_profile
    from tern.predict.toward_10b import TEN_B_SPACE, pick_10b, roof_table, scaled_down

    ref = load_reference_profile()
    c, t, ok = pick_10b(ref, 100.0, threads=(1, 6))
    assert ok and 9e9 <= c.total_params <= 11e9 and c.tok_per_s >= 110.0 and t in (1, 6)
    c1, _, _ = pick_10b(ref, 100.0, threads=1)
    assert c.active_params >= c1.active_params  # more threads never shrink the budget
    rows = roof_table(c.config, {"ref": ref}, {"ref": [1, 6]})
    assert [r["threads"] for r in rows] == [1, 6] and rows[0]["streamed_bound"] in ("L3", "DRAM")
    small = scaled_down(c.config, 64)
    assert small.n_experts == max(c.config.top_k, c.config.n_experts // 64)
    slow = synthetic_profile(llc_bytes=1 << 20, cache_gbps=10.0, dram_gbps=1.0)
    c_slow, _, ok = pick_10b(slow, 100.0, space=TEN_B_SPACE)
    assert not ok and c_slow.tok_per_s < 110.0


def test_calibrate_with_fake_measurements(tmp_path, monkeypatch):
    import tern.measure.sweep as sw
    from tern.predict.roofline import predict

    h = host()
    monkeypatch.setattr(sw, "ensure_model", lambda cfg, d: tmp_path / "m.tern")
    tiny, dram = sw.calibration_points(1)
    p_dram = predict(dram.config, h, threads=1)
    mem_s = p_dram.resident.memory_s + p_dram.streamed.memory_s
    true_over, true_eff = 20e-6, 0.8

    def fake(path, point):
        if point.budget == "tiny":
            return {"tok_per_s": 1.0 / (predict(point.config, h).s_per_token + true_over)}
        return {"tok_per_s": 1.0 / (mem_s / true_eff + true_over)}

    cal_host, cal = sw.calibrate(h, tmp_path, threads=(1, 2), measure=fake)
    assert cal["per_token_overhead_s"] == pytest.approx(true_over, rel=1e-6)
    assert cal["bandwidth_efficiency"] == pytest.approx(true_eff, rel=1e-6)
    assert "per_token_overhead_s_t2" in cal_host.calibration
    # the calibrated prediction of the DRAM point now matches the fake measurement
    assert predict(dram.config, cal_host).tok_per_s == pytest.approx(fake(None, dram)["tok_per_s"], rel=0.02)


def test_pair_summary_and_table():
    from tern.measure.sweep import pair_summary, render_rows

    rows = [{"family": "preset", "budget": b, "threads": 1, "tok_per_s": v, "predicted_tok_per_s": 100.0,
             "total_params": n, "name": b, "total_bytes": 1e6, "active_bytes": 1e5, "ratio": v / 100,
             "predicted_bound": "DRAM", "peak_rss_bytes": 2**20}
            for b, v, n in (("105m", 100.0, 105e6), ("206m", 98.0, 206e6))]
    s = pair_summary(rows)
    assert s[0]["measured_ratio"] == pytest.approx(0.98)
    assert "206m" in render_rows(rows) and render_rows(rows).splitlines()[1].endswith(" -/-")
    rows[0].update(host_read_ratio=0.97, host_kernel_ratio=0.7)
    assert render_rows(rows).splitlines()[1].endswith(" 0.97/0.70")


def test_cli_bad_threads_fails_before_work(tmp_path, capsys):
    from tern.cli import main

    assert main(["bench", "sweep", "--quick", "--threads", "0", "--results", str(tmp_path)]) == 2
    assert "--threads must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "host_profile.json").exists()


def test_cli_per_matrix_marks_the_points(tmp_path, monkeypatch):
    import tern.measure.cli as mcli
    from tern.cli import main

    class Stop(Exception):
        pass

    seen = []

    def fake_run_sweep(points, *a, **k):
        seen.extend(points)
        raise Stop

    monkeypatch.setattr(mcli, "run_sweep", fake_run_sweep)
    host().save(tmp_path / "h.json")
    with pytest.raises(Stop):
        main(["bench", "sweep", "--quick", "--threads", "1", "2", "--no-calibrate", "--no-host-check",
              "--host", str(tmp_path / "h.json"), "--results", str(tmp_path)])
    assert seen and {(p.threads, p.region) for p in seen} == {(1, True), (2, True)}  # the engine's default
    seen.clear()
    with pytest.raises(Stop):
        main(["bench", "sweep", "--quick", "--threads", "1", "2", "--per-matrix", "--no-calibrate",
              "--no-host-check", "--host", str(tmp_path / "h.json"), "--results", str(tmp_path)])
    assert {(p.threads, p.region) for p in seen} == {(1, False), (2, False)}


class _SleepyEngine:
    """Stands in for tern.run.engine.Engine: every step busy-waits ``step_s`` seconds."""

    def __init__(self, step_s, clock=None):
        import types

        self.cfg = types.SimpleNamespace(vocab_size=16)
        self.step_s, self.resets, self.steps, self.clock = step_s, 0, 0, clock

    def reset(self):
        self.resets += 1

    def step(self, token):
        import time

        assert 0 <= token < 16
        self.steps += 1
        if self.clock is not None:  # a fake clock: advance it instead of waiting
            self.clock[0] += self.step_s
            return
        end = time.perf_counter() + self.step_s
        while time.perf_counter() < end:
            pass


def test_time_decode_repeats_runs_until_a_sample_lasts_min_time(monkeypatch):
    import types

    import tern.run.timing
    from tern.measure.sweep_worker import time_decode

    # a clock only the engine's steps advance (1 ms each): the count of runs does not depend
    # on how busy the machine is (busy-waiting 1 ms a step, a loaded CI host ran fewer runs)
    now = [0.0]
    monkeypatch.setattr(tern.run.timing, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    eng = _SleepyEngine(1e-3, clock=now)
    r = time_decode(eng, tokens=4, repeats=3, warmup=2, min_time_s=0.02)
    # 4 tokens x 1 ms = 4 ms per run: 5 runs (each from a reset state) make a 20 ms sample
    assert r["repeats"] == 3 and r["runs_per_sample"] == [5, 5, 5]
    assert eng.resets == 1 + sum(r["runs_per_sample"]) and eng.steps == 2 + 4 * sum(r["runs_per_sample"])
    assert r["tok_per_s"] == pytest.approx(1000.0) and r["min_time_s"] == 0.02
    monkeypatch.undo()
    once = time_decode(_SleepyEngine(1e-4), tokens=4, repeats=2, warmup=0)
    assert once["runs_per_sample"] == [1, 1]
    for bad in (-1.0, float("nan"), "0.2", 61):
        with pytest.raises(ValueError, match="min_time_s"):
            time_decode(eng, tokens=4, repeats=1, warmup=0, min_time_s=bad)


def test_sweep_point_min_time_is_validated_and_old_keys_stay():
    import hashlib

    from tern.measure.sweep import MEASURE_VERSION

    p = SweepPoint("fixed_active", "t", TINY, 1, tokens=8, layout="rows")  # the engine before layout "auto"
    assert SweepPoint("fixed_active", "t", TINY, 1, tokens=8).key != p.key
    blob = json.dumps({"config": TINY.to_dict(), "threads": 1, "tokens": 8, "repeats": 3, "warmup": 16,
                       "v": MEASURE_VERSION}, sort_keys=True)
    assert p.key == hashlib.sha256(blob.encode()).hexdigest()[:16]  # rows measured before min_time_s resume
    assert SweepPoint("fixed_active", "t", TINY, 1, tokens=8, min_time_s=0.25).key != p.key
    for bad in (-0.1, float("nan"), None):
        with pytest.raises(ValueError, match="min_time_s"):
            SweepPoint("fixed_active", "t", TINY, 1, min_time_s=bad)
    assert SweepPoint("fixed_active", "t", TINY, 2, tokens=8).key != SweepPoint(
        "fixed_active", "t", TINY, 2, tokens=8, region=False).key  # the one-region engine is another measurement
    blob2 = json.dumps({"config": TINY.to_dict(), "threads": 2, "tokens": 8, "repeats": 3, "warmup": 16,
                        "v": MEASURE_VERSION}, sort_keys=True)  # per-matrix rows measured before it was the default
    assert SweepPoint("fixed_active", "t", TINY, 2, tokens=8, region=False, layout="rows").key == hashlib.sha256(
        blob2.encode()).hexdigest()[:16]
    assert SweepPoint("fixed_active", "t", TINY, 1, tokens=8, region=False, layout="rows").key == p.key  # 1 thread: one step
    with pytest.raises(ValueError, match="region"):
        SweepPoint("fixed_active", "t", TINY, 2, region="yes")


def test_worker_runs_the_region_engine(tmp_path):
    """measure_in_subprocess passes --region to the worker, which decodes with Engine(region=True)."""
    import numba

    from tern.kernels.policy import EnginePolicy
    from tern.measure.sweep import measure_in_subprocess
    from tern.packed.writer import random_model

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs 2 numba threads")
    path = random_model(TINY, tmp_path / "t.tern", seed=0, progress=False)
    for region in (False, True):
        m = measure_in_subprocess(path, SweepPoint("fixed_active", "t", TINY, 2, tokens=4, repeats=1, warmup=1,
                                                   region=region))
        assert m["engine"]["region"] is region and m["tok_per_s"] > 0
        assert EnginePolicy.of_record(m).region is region  # what the sweep row records and prices
    m = measure_in_subprocess(path, SweepPoint("fixed_active", "t", TINY, 1, tokens=4, repeats=1, warmup=1,
                                               layout="blocked16"))
    assert m["engine"]["layout"] == "blocked16" and m["tok_per_s"] > 0  # --layout reaches the worker's Engine


def test_full_sweep_points_time_every_sample_long_enough():
    from tern.measure.sweep import FULL_TIMING, default_points, preset_points

    pts = default_points(threads=(1,))
    assert pts and all(p.repeats == FULL_TIMING["repeats"] and p.min_time_s == FULL_TIMING["min_time_s"]
                       for p in pts)
    assert all(p.min_time_s == 0 for p in default_points(quick=True))  # CI's smoke sweep stays fast
    assert preset_points(min_time_s=0.25)[0].min_time_s == 0.25


def test_sweep_rows_carry_the_host_timed_before_each_point(tmp_path):
    from tern.core.host_profile import OpCurve
    from tern.measure.sweep import render_rows

    calls, kcalls = [], []

    def fake_read(ws, threads):
        calls.append((ws, threads))
        return {"gbps_median": 10.0, "gbps_min": 9.0, "gbps_best": 11.0, "working_set_bytes": ws,
                "threads": threads, "repeats": 5}

    def fake_kernel(threads, rows, cols):
        kcalls.append((threads, rows, cols))
        return {"op": "ternary_matvec", "threads": threads, "rows": rows, "cols": cols,
                "working_set_bytes": 1 << 20, "seconds_per_call": 2e-5}  # the curve says 1e-5: half speed now

    curves = tuple(OpCurve(op="ternary_matvec", split=split, threads=t, rows=1024, cols=1024, density=1.0,
                           working_set_bytes=(1 << 18, 1 << 22), seconds=(1e-5, 1e-5))
                   for split, t in (("serial", 1), ("experts", 2)))
    h = dataclasses.replace(host(), op_curves=curves)
    pts = [SweepPoint("fixed_active", "t", TINY, t, tokens=4) for t in (1, 2)]
    measure = lambda p, q: {"tok_per_s": 50.0, "repeats": 3}  # noqa: E731
    trips = []
    rows = run_sweep(pts, tmp_path / "rec.jsonl", tmp_path / "m", h, measure=measure, progress=False,
                     read_now=fake_read, kernel_now=fake_kernel, round_trip_now=lambda: trips.append(1) or 356.0)
    assert len(trips) == 1 and "core_round_trip_ns" not in rows[0] and rows[1]["core_round_trip_ns"] == 356.0
    assert render_rows(rows).splitlines()[2].split()[-2] == "356" and render_rows(rows).splitlines()[1].split()[-2] == "-"
    total = param_counts(TINY).total.bytes
    assert calls == [(total, 1), (total, 2)] and kcalls == [(1, 1024, 1024), (2, 1024, 1024)]
    for r in rows:
        assert r["read_same_run"]["gbps_median"] == 10.0
        assert r["host_read_ratio"] == pytest.approx(10.0 / h.bandwidth_at(total, r["threads"]))
        assert r["host_kernel_ratio"] == pytest.approx(0.5) and r["kernel_same_run"]["seconds_per_call"] == 2e-5
    bare = run_sweep(pts, tmp_path / "rec2.jsonl", tmp_path / "m", h, measure=measure, progress=False,
                     read_now=None, kernel_now=None, round_trip_now=None)
    assert all(not ({"host_read_ratio", "read_same_run", "host_kernel_ratio", "core_round_trip_ns"} & set(r))
               for r in bare)
    # a profile without kernel curves (version < 3): no kernel ratio, the read ratio stays
    old = run_sweep(pts[:1], tmp_path / "rec3.jsonl", tmp_path / "m", host(), measure=measure, progress=False,
                    read_now=fake_read, kernel_now=fake_kernel)
    assert "host_kernel_ratio" not in old[0] and old[0]["host_read_ratio"] is not None


def test_kernel_reference_times_the_engine_kernel_now():
    from tern.probe.curves import kernel_reference

    r = kernel_reference(1, rows=256, cols=1024, working_set_bytes=1 << 18)
    assert r["split"] == "serial" and r["working_set_bytes"] == 1 << 18 and 0 < r["seconds_per_call"] < 0.01
    assert kernel_reference(2, rows=256, cols=1024, working_set_bytes=1 << 18)["split"] == "experts"
    with pytest.raises(ValueError, match="threads"):
        kernel_reference(0)
    with pytest.raises(ValueError, match="working_set_bytes"):
        kernel_reference(1, working_set_bytes=0)
    with pytest.raises(ValueError, match="rows"):
        kernel_reference(1, rows=-4)


def test_cli_sweep_text_says_when_the_host_drifted():
    from tern.measure.cli import cli_render_sweep

    row = {"family": "fixed_active", "name": "p", "threads": 1, "total_bytes": 1e6, "active_bytes": 1e5,
           "predicted_tok_per_s": 100.0, "tok_per_s": 70.0, "ratio": 0.7, "predicted_bound": "DRAM",
           "host_read_ratio": 1.0, "host_kernel_ratio": 0.7}
    result = {"points": [row], "calibration": {}, "pair": [], "records": "r.jsonl",
              "accuracy": accuracy([row]),
              "host_drift": {"n": 1, "median_read_ratio": 1.0, "median_kernel_ratio": 0.7, "drifted": 1,
                             "within_20pct_steady": None}}
    text = cli_render_sweep(result)
    assert "The host drifted: at 1 of 1 points" in text and "kernel speed 0.70x" in text
    assert "drifted" not in cli_render_sweep({**result, "host_drift": None})


def test_sweep_warns_when_the_engine_streamed_unlike_the_profile(tmp_path, capsys):
    """The profile's curves time the streaming kernel as its probe chose (engine_policy's
    stream_prefetch); a measured row whose engine ran the other form is priced with the wrong
    curve, so the sweep says so once, naming what to run."""
    from dataclasses import replace

    from tern.kernels.policy import CURRENT_POLICY
    from tern.predict.roofline import curves_stream_prefetch

    h = host()
    off = replace(CURRENT_POLICY, stream_prefetch=False)
    pts = [SweepPoint("fixed_active", "t", TINY, t, tokens=4) for t in (1, 2)]
    run_sweep(pts, tmp_path / "rec.jsonl", tmp_path / "m", h, progress=False, read_now=None, kernel_now=None,
              measure=lambda p, q: {"tok_per_s": 100.0, "repeats": 3, "engine_policy": off.to_dict()})
    err = capsys.readouterr().err
    assert err.count("streaming kernel with prefetch off") == 1 and "tern probe" in err
    same = h.__class__.from_dict({**h.to_dict(), "host": {**h.host, "engine_policy": off.to_dict()}})
    run_sweep(pts, tmp_path / "rec2.jsonl", tmp_path / "m", same, progress=False, read_now=None, kernel_now=None,
              measure=lambda p, q: {"tok_per_s": 100.0, "repeats": 3, "engine_policy": off.to_dict()})
    assert "streaming kernel" not in capsys.readouterr().err
    # a probe's choice per thread count: off at 1 thread, on at 2, as the engine ran them
    ab = {"stream_prefetch": {"1": False, "2": True}}
    per_t = h.__class__.from_dict({**h.to_dict(), "host": {**h.host, "stream_prefetch": ab}})
    assert [curves_stream_prefetch(per_t, t) for t in (1, 2, 4)] == [False, True, True]
    run_sweep(pts, tmp_path / "rec3.jsonl", tmp_path / "m", per_t, progress=False, read_now=None, kernel_now=None,
              measure=lambda p, q: {"tok_per_s": 100.0, "repeats": 3,
                                    "engine_policy": replace(CURRENT_POLICY, stream_prefetch=q.threads == 2).to_dict()})
    assert "streaming kernel" not in capsys.readouterr().err
