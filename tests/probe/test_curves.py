"""Kernel working-set curves (tern.probe.curves) and their use by the predictor."""

from __future__ import annotations

import dataclasses

import pytest

from tern.core.host_profile import HostProfile, OpCurve, op_curve_for, op_curve_pair, op_curve_trio
from tern.predict.inventory import WorkKey
from tern.predict.stall import curve_stall
from tern.probe import curves
from tern.probe.curve_buffer import CurveBuffer
from tern.probe.curves import (
    ROWY_CURVE_SHAPES,
    SMALL_CURVE_SHAPES,
    curve_plan,
    implausible_calls,
    implausible_points,
    measure_curve,
)
from tern.probe.timing import Timing, TimingConfig

FAST = TimingConfig(min_time_s=0.002, repeats=2, warmup_s=0.0, max_calibration_s=0.01)


@pytest.mark.parametrize("op,split,threads", [("ternary_matvec", "serial", 1), ("ternary_skip", "serial", 1),
                                              ("int8_matvec", "serial", 1), ("fp32_matvec", "serial", 1),
                                              ("w16_matvec", "serial", 1), ("w16_matvec", "rows", 2),
                                              ("ternary_stream", "experts", 2), ("ternary_matvec", "rows", 2)])
def test_a_curve_is_measured_over_growing_working_sets(op, split, threads):
    buf = CurveBuffer(4 << 20)
    c = measure_curve(op, split, threads, (256 << 10, 1 << 20, 4 << 20), buf, FAST)
    assert c.op == op and c.split == split and len(c.seconds) >= 1
    assert list(c.working_set_bytes) == sorted(set(c.working_set_bytes))
    assert all(s > 0 for s in c.seconds)
    assert c.seconds_at(1) == c.seconds[0] and c.seconds_at(1 << 40) == c.seconds[-1]


def test_implausible_points_are_slower_per_byte_than_data_further_out():
    mib = 1 << 20
    ws = [1 * mib, 2 * mib, 4 * mib, 8 * mib]
    assert implausible_points(ws, [1.0, 2.0, 4.0, 8.0]) == []  # flat per byte
    assert implausible_points(ws, [1.0, 2.0, 12.0, 16.0]) == []  # a cliff: slower further out
    assert implausible_points(ws, [1.0, 29.0, 4.0, 8.0]) == [1]  # a spike: 14x its neighbours
    assert implausible_points(ws, [1.0, 7.0, 14.0, 8.0]) == [1, 2]  # two points of one pause
    assert implausible_points(ws, [1.0, 2.0, 4.0, 17.0]) == [3]  # the last: > 2x the one before
    assert implausible_points(ws[:1], [5.0]) == []


def test_implausible_calls_take_a_curves_per_call_seconds():
    """A curve's points are seconds per call on cycles of 1, 4, 16 ... matrices: a per-call time
    that rises with the working set is plausible, a spike is not."""
    cycles = [1, 4, 16, 64]
    assert implausible_calls(cycles, [1.0, 1.0, 1.3, 2.5]) == []  # flat, then a cliff further out
    assert implausible_calls(cycles, [1.0, 3.0, 1.3, 2.5]) == [1]  # a spike: 2.3x the next point
    assert implausible_calls(cycles, [1.0, 1.0, 1.3, 6.0]) == [3]  # the last: > 2x the one before
    with pytest.raises(ValueError, match="one time per cycle"):
        implausible_calls(cycles, [1.0, 1.0])
    with pytest.raises(ValueError, match="one time per cycle"):
        implausible_calls([0, 4], [1.0, 1.0])


class _FakeCalibrated:
    """A calibrated point of a fake cycle: every sample takes 1 ms a matrix (flat per call and
    per byte) unless ``slow`` says otherwise; ``log`` records (run, sample) in order taken."""

    def __init__(self, run, log, slow=lambda run, k: 1.0):
        self.run, self.log, self.slow, self.seconds = run, log, slow, []

    def time_once(self):
        self.seconds.append(1e-3 * self.run.n_mats * self.slow(self.run, len(self.seconds)))
        self.log.append((self.run, len(self.seconds)))
        return self.seconds[-1]

    def timing(self):
        n = len(self.seconds)
        return Timing(counts=(1,) * n, seconds=tuple(self.seconds), starts_s=(0.0,) * n)


def _fake_cycles(monkeypatch, log, slow=lambda run, k: 1.0):
    def fake_setup(op, split, threads, shape, n_mats, buf, rng, stream_prefetch=True):
        def run(n):
            return None
        run.n_mats, run.curve = n_mats, (op, split, threads, shape)
        return run

    monkeypatch.setattr(curves, "setup_cycle", fake_setup)
    monkeypatch.setattr(curves, "calibrate", lambda run, cfg, **kw: _FakeCalibrated(run, log, slow))


def test_a_plausible_curve_is_timed_once_per_point_and_round(monkeypatch):
    """Each point is sampled once a round and not again when no point is slower than a larger
    working set allows (the session-31 bug named every point but the last and timed each twice more)."""
    log, alone = [], []
    _fake_cycles(monkeypatch, log)
    monkeypatch.setattr(curves, "timed_runs", lambda run, cfg, **kw: alone.append(run))
    c = measure_curve("ternary_matvec", "serial", 1, (256 << 10, 1 << 20, 4 << 20), CurveBuffer(4 << 20), FAST)
    assert [run.n_mats for run, _ in log] == [1, 4, 16] * FAST.repeats and alone == []
    assert c.seconds == pytest.approx((1e-3, 1e-3, 1e-3))


def test_an_implausible_point_is_timed_again_and_keeps_its_fastest_median(monkeypatch):
    """A pause during one point (a neighbour taking the core) is re-measured, not smoothed: the
    point keeps the faster of its timings, the others are timed once a round."""
    log, alone = [], []
    _fake_cycles(monkeypatch, log, slow=lambda run, k: 20.0 if run.n_mats == 4 else 1.0)  # point 2 paused

    def timed_alone(run, cfg, **kw):
        alone.append(run.n_mats)
        return Timing(counts=(1,), seconds=(1e-3 * run.n_mats,), starts_s=(0.0,))

    monkeypatch.setattr(curves, "timed_runs", timed_alone)
    c = measure_curve("ternary_matvec", "serial", 1, (256 << 10, 1 << 20, 4 << 20), CurveBuffer(4 << 20), FAST)
    assert alone == [4]  # only the paused point, once: its re-timing is plausible
    assert c.seconds == pytest.approx((1e-3, 1e-3, 1e-3))


def test_the_probe_samples_every_curve_in_rounds(monkeypatch):
    """measure_op_curves calibrates every point of every curve, then takes one sample of each
    per round: round 2 starts only when every point of every curve has its first sample (so a
    slow minute of a shared host lands on all curves alike, not on one of an op's shapes)."""
    log = []
    _fake_cycles(monkeypatch, log)
    out = curves.measure_op_curves((1,), quick=True, progress=False, timing=FAST, max_bytes=4 << 20)
    plan = curve_plan((1,), quick=True)
    assert [(c.op, c.rows, c.cols) for c in out] == [(op, *shape) for op, _, _, shape in plan]
    points = sum(len(c.seconds) for c in out)
    assert len(log) == FAST.repeats * points
    assert [k for _, k in log] == [1] * points + [2] * points  # one sample of every point, then round 2
    assert len({run.curve for run, _ in log[:points]}) == len(plan)


def test_an_unknown_op_is_a_clear_error():
    buf = CurveBuffer(1 << 20)
    with pytest.raises(ValueError, match="no serial working-set curve for op 'ternary_nope'"):
        measure_curve("ternary_nope", "serial", 1, (256 << 10,), buf, FAST)
    with pytest.raises(ValueError, match="no rows working-set curve for op 'router_int8'"):
        measure_curve("router_int8", "rows", 2, (256 << 10,), buf, FAST)  # the router runs on one thread only
    with pytest.raises(ValueError, match="no working-set curve for op 'ternary_nope'"):
        measure_curve("ternary_nope", "serial", 1, (256 << 10,), buf, FAST, shape=(256, 1024))


def test_curve_validation_and_lookup():
    c = OpCurve("ternary_matvec", "serial", 1, 1024, 1024, 1.0, (1 << 18, 1 << 20), (1e-5, 2e-5))
    assert c.seconds_at(1 << 19) == pytest.approx(1.5e-5)  # half-way in log2(bytes)
    with pytest.raises(ValueError):
        OpCurve("x", "serial", 1, 1, 1, 1.0, (2, 1), (1.0, 1.0))  # decreasing working sets
    with pytest.raises(ValueError):
        OpCurve("x", "diagonal", 1, 1, 1, 1.0, (1,), (1.0,))
    with pytest.raises(ValueError):
        OpCurve("x", "serial", 1, 1, 1, 1.0, (1,), (float("nan"),))
    assert op_curve_for([c], "ternary_matvec", "serial", 4) is c
    assert op_curve_for([c], "ternary_matvec", "rows", 2) is None
    plan = curve_plan((1, 2))
    assert len(plan) == 29 and all(s == "serial" for _, s, _, _ in curve_plan((1, 2), quick=True))
    # the engine's router kernel: one serial curve (the one-region step's router items are single-thread calls)
    assert [(s, t) for op, s, t, _ in plan if op == "router_int8"] == [("serial", 1)]
    # the smaller and row-heavy shapes come after every main shape (an older reader takes the first curve)
    small = [i for i, (op, _, _, shape) in enumerate(plan) if shape == SMALL_CURVE_SHAPES.get(op)]
    rowy = [i for i, (op, _, _, shape) in enumerate(plan) if shape == ROWY_CURVE_SHAPES.get(op)]
    assert len(small) == 8 and min(small) == len(plan) - 10
    assert [plan[i][1] for i in rowy] == ["serial", "experts"] and min(rowy) == len(plan) - 2
    assert not any(shape == ROWY_CURVE_SHAPES.get(op) for op, _, _, shape in curve_plan((1, 2), quick=True))


def test_the_lookup_takes_the_main_shape_and_pairs_the_two():
    big = OpCurve("ternary_matvec", "serial", 1, 1024, 1024, 1.0, (1 << 18, 1 << 30), (1e-5, 3e-5))
    small = OpCurve("ternary_matvec", "serial", 1, 256, 1024, 1.0, (1 << 18, 1 << 30), (2.5e-6, 9e-6))
    assert op_curve_for([small, big], "ternary_matvec", "serial", 1) is big
    assert op_curve_pair([small, big], "ternary_matvec", "serial", 1) == (small, big)
    assert op_curve_pair([big], "ternary_matvec", "serial", 1) is None
    # a row-heavy shape of the same weights is not the main one, and makes the trio
    rowy = OpCurve("ternary_matvec", "serial", 1, 2048, 512, 1.0, (1 << 18, 1 << 30), (1.2e-5, 3.1e-5))
    assert op_curve_for([rowy, small, big], "ternary_matvec", "serial", 1) is big
    assert op_curve_pair([rowy, small, big], "ternary_matvec", "serial", 1) == (small, big)
    assert op_curve_trio([rowy, small, big], "ternary_matvec", "serial", 1) == (small, big, rowy)
    assert op_curve_trio([small, big], "ternary_matvec", "serial", 1) is None


def test_three_shapes_measure_a_per_row_term_at_the_working_set():
    """Per call t = a + b w + c r through (256 x 1024, 1024 x 1024, 2048 x 512), solved by
    hand: c = (t_rowy - t_big) / 1024 rows, b = (t_big - t_small - 768 c) / 768Ki weights,
    a = t_small - 256Ki b - 256 c. At 1 GiB the row-heavy shape is *faster* than the main
    one (c < 0: its extra per-row work hides part of the stall), on cache-resident data
    slower (c0 > 0). A 4096 x 512 call (w = 2Mi) then stalls t(w, r) - t0(w, r), less than
    the pair's per-weight extrapolation, which ignores rows."""
    from tern.core.host_profile import OpCost
    from tern.predict.inventory import OpWork

    ws = (1 << 18, 1 << 30)
    small = OpCurve("ternary_matvec", "serial", 1, 256, 1024, 1.0, ws, (2.5e-6, 9e-6))
    big = OpCurve("ternary_matvec", "serial", 1, 1024, 1024, 1.0, ws, (1e-5, 3e-5))
    rowy = OpCurve("ternary_matvec", "serial", 1, 2048, 512, 1.0, ws, (1.4e-5, 2.6e-5))
    cost = OpCost("ternary_matvec", 1, call_s=0.0, row_s=0.0, unit_s=1e-11, samples=3, max_rel_err=0.0)
    host = HostProfile("t", True, {}, (), "test", (), op_costs=(cost,), op_curves=(big, small, rowy))
    Ki, Mi = 1024, 1 << 20

    def plane(t_small, t_big, t_rowy):  # hand elimination of the 3 x 3 system
        c = (t_rowy - t_big) / 1024
        b = (t_big - t_small - 768 * c) / (768 * Ki)
        a = t_small - 256 * Ki * b - 256 * c
        return lambda w, r: a + b * w + c * r

    hot, cold = plane(9e-6, 3e-5, 2.6e-5), plane(2.5e-6, 1e-5, 1.4e-5)
    work = {WorkKey("ternary_matvec"): OpWork(3.0, 3 * 4096.0, 3 * 2.0 * Mi, 0.0)}
    extra, covered = curve_stall(work, host, 1, 1 << 30)
    assert extra == pytest.approx(3 * (hot(2 * Mi, 4096) - cold(2 * Mi, 4096)))
    assert covered == pytest.approx(3 * 2 * Mi * 0.25)
    pair_only, _ = curve_stall(work, dataclasses.replace(host, op_curves=(big, small)), 1, 1 << 30)
    assert pair_only == pytest.approx(3 * (9e-6 + (2 * Mi - 256 * Ki) * 21e-6 / (768 * Ki)
                                           - 2.5e-6 - (2 * Mi - 256 * Ki) * 7.5e-6 / (768 * Ki)))
    assert extra < pair_only


def test_two_sizes_price_a_per_call_stall_at_the_op_s_own_matrix_size():
    """From the two sizes: per call at 1 GiB, t = 9e-6 + (w - 256Ki) * (3e-5 - 9e-6) / 768Ki;
    on cache-resident data t0 = 2.5e-6 + (w - 256Ki) * 7.5e-6 / 768Ki. A 512 x 1024 matrix
    (w = 512Ki weights): t = 1.6e-5, t0 = 5e-6, so 1.1e-5 s more per call."""
    from tern.core.host_profile import OpCost
    from tern.predict.inventory import OpWork

    big = OpCurve("ternary_matvec", "serial", 1, 1024, 1024, 1.0, (1 << 18, 1 << 30), (1e-5, 3e-5))
    small = OpCurve("ternary_matvec", "serial", 1, 256, 1024, 1.0, (1 << 18, 1 << 30), (2.5e-6, 9e-6))
    cost = OpCost("ternary_matvec", 1, call_s=0.0, row_s=0.0, unit_s=1e-11, samples=3, max_rel_err=0.0)
    host = HostProfile("t", True, {}, (), "test", (), op_costs=(cost,), op_curves=(big, small))
    work = {WorkKey("ternary_matvec"): OpWork(10.0, 5120.0, 10 * 512 * 1024.0, 0.0)}
    extra, covered = curve_stall(work, host, 1, 1 << 30)
    assert extra == pytest.approx(10 * 1.1e-5)
    assert covered == pytest.approx(10 * 512 * 1024 * 0.25)
    # one size only: the per-weight slowdown of that curve (3x: two more per-weight costs)
    one, _ = curve_stall(work, dataclasses.replace(host, op_curves=(big,)), 1, 1 << 30)
    assert one == pytest.approx(1e-11 * 10 * 512 * 1024 * 2.0)
    # never below the cache-resident time
    fast = dataclasses.replace(small, seconds=(2.5e-6, 2.0e-6))
    low, _ = curve_stall({WorkKey("ternary_matvec"): OpWork(1.0, 64.0, 64 * 1024.0, 0.0)},
                         dataclasses.replace(host, op_curves=(big, fast)), 1, 1 << 30)
    assert low >= 0.0


def test_curves_round_trip_in_a_profile(tmp_path):
    c = OpCurve("ternary_matvec", "serial", 1, 1024, 1024, 1.0, (1 << 18, 1 << 20), (1e-5, 2e-5), (9e-6, 1.9e-5),
                (1.1e-5, 2.1e-5))
    prof = HostProfile("t", True, {}, (), "test", (), op_curves=(c,))
    prof.save(tmp_path / "p.json")
    assert HostProfile.load(tmp_path / "p.json") == prof


def test_curve_stall_scales_the_per_weight_cost():
    from tern.core.host_profile import OpCost

    cost = OpCost("ternary_matvec", 1, call_s=0.0, row_s=0.0, unit_s=1e-11, samples=3, max_rel_err=0.0)
    curve = OpCurve("ternary_matvec", "serial", 1, 1024, 1024, 1.0, (1 << 18, 1 << 30), (1e-5, 3e-5))
    host = HostProfile("t", True, {}, (), "test", (), op_costs=(cost,), op_curves=(curve,))
    work = {WorkKey("ternary_matvec"): (1.0, 10.0, 1e6, 0.0)}
    from tern.predict.inventory import OpWork

    work = {k: OpWork(*v) for k, v in work.items()}
    extra, covered = curve_stall(work, host, 1, 1 << 30)
    assert extra == pytest.approx(1e-11 * 1e6 * 2.0)  # 3x slower there: two more per-weight costs
    assert covered == pytest.approx(0.25e6)
    assert curve_stall(work, dataclasses.replace(host, op_curves=()), 1, 1 << 30) is None
