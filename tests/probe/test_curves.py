"""Kernel working-set curves (tern.probe.curves) and their use by the predictor."""

from __future__ import annotations

import dataclasses

import pytest

from tern.core.host_profile import HostProfile, OpCurve, op_curve_for
from tern.predict.inventory import WorkKey, curve_stall
from tern.probe.curves import CurveBuffer, curve_plan, measure_curve
from tern.probe.timing import TimingConfig

FAST = TimingConfig(min_time_s=0.002, repeats=2, warmup_s=0.0, max_calibration_s=0.01)


@pytest.mark.parametrize("op,split,threads", [("ternary_matvec", "serial", 1), ("ternary_skip", "serial", 1),
                                              ("int8_matvec", "serial", 1), ("fp32_matvec", "serial", 1),
                                              ("ternary_stream", "experts", 2), ("ternary_matvec", "rows", 2)])
def test_a_curve_is_measured_over_growing_working_sets(op, split, threads):
    buf = CurveBuffer(4 << 20)
    c = measure_curve(op, split, threads, (256 << 10, 1 << 20, 4 << 20), buf, FAST)
    assert c.op == op and c.split == split and len(c.seconds) >= 1
    assert list(c.working_set_bytes) == sorted(set(c.working_set_bytes))
    assert all(s > 0 for s in c.seconds)
    assert c.seconds_at(1) == c.seconds[0] and c.seconds_at(1 << 40) == c.seconds[-1]


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
    assert len(curve_plan((1, 2))) == 13 and all(s == "serial" for _, s, _ in curve_plan((1, 2), quick=True))


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
