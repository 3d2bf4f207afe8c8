"""Engine op costs (tern.probe.ops): the fit, the timing of each op, the profile field."""

import dataclasses

import numpy as np
import pytest

from tern.core.host_profile import HostProfile, OpCost, op_cost_for
from tern.probe import ops as po
from tern.probe.timing import TimingConfig

FAST = TimingConfig(min_time_s=0.002, repeats=1, warmup_s=0.0)


def _samples(op, call, row, unit, shapes, threads=1):
    return [po.OpSample(op, threads, r, u, call + row * r + unit * u) for r, u in shapes]


def test_fit_recovers_known_costs():
    shapes = [(32, 8192), (256, 65536), (1024, 262144), (64, 65536), (512, 524288)]
    c = po.fit_cost(_samples("ternary_matvec", 1e-7, 3e-9, 7e-12, shapes))
    assert c.op == "ternary_matvec" and c.threads == 1 and c.samples == 5
    assert c.call_s == pytest.approx(1e-7, rel=1e-6)
    assert c.row_s == pytest.approx(3e-9, rel=1e-6)
    assert c.unit_s == pytest.approx(7e-12, rel=1e-6)
    assert c.max_rel_err < 1e-9


def test_fit_recovers_the_partial_segment_cost():
    shapes = [(32, 8192, 0), (256, 65536, 0), (1024, 262144, 0), (512, 196608, 512), (1536, 589824, 1536),
              (256, 163840, 256)]
    samples = [po.OpSample("ternary_matvec", 1, r, u, 1e-7 + 2e-9 * r + 6e-12 * u + 3e-9 * t, t)
               for r, u, t in shapes]
    c = po.fit_cost(samples)
    assert c.tail_s == pytest.approx(3e-9, rel=1e-6) and c.row_s == pytest.approx(2e-9, rel=1e-6)
    assert c.seconds(1, 100, 1000, 100) == pytest.approx(1e-7 + 2e-7 + 6e-9 + 3e-7)
    # time_op counts the tail rows of a shape with a partial last segment, and only those
    assert po.time_op("ternary_matvec", (8, 384), timing=FAST).tails == 8
    assert po.time_op("ternary_matvec", (8, 512), timing=FAST).tails == 0


def test_fit_tells_the_skip_kernels_listing_from_its_rows():
    """The skip kernel timed with all and a quarter of its inputs nonzero: the fit separates the
    listing of every input (input_s) from the rows of the nonzero ones (unit_s)."""
    call, row, unit, tail, inp = 2e-7, 1e-10, 1.2e-11, 2e-9, 6.5e-10
    samples = []
    for h, d in ((32, 256), (256, 256), (1024, 256), (64, 1024), (512, 1024), (1024, 2048), (512, 384)):
        for pct in (100, 25):
            nz = po.skip_nonzero(h, pct)
            tails = po.tail_units("ternary_skip", (h, d, pct))
            assert tails == (nz if d % 256 else 0)
            samples.append(po.OpSample("ternary_skip", 1, d, nz * d, call + row * d + unit * nz * d + tail * tails
                                       + inp * h, tails, h))
    c = po.fit_cost(samples)
    assert c.input_s == pytest.approx(inp, rel=1e-6) and c.unit_s == pytest.approx(unit, rel=1e-6)
    assert c.call_s == pytest.approx(call, rel=1e-6) and c.max_rel_err < 1e-9
    # every shape is timed at both densities; time_op lists every input and counts the nonzeros' weights
    shapes = po.op_shapes("ternary_skip", 1)
    assert {sh[2] for sh in shapes} == {100, 25} and len(shapes) == 2 * len(po.op_shapes("ternary_matvec", 1))
    s = po.time_op("ternary_skip", (512, 384, 25), timing=FAST)
    assert (s.inputs, s.rows, s.units, s.tails) == (512, 384, 128 * 384, 128)
    # a profile written before the listing was fitted reads with input_s 0 and prices as before
    old = {k: v for k, v in dataclasses.asdict(c).items() if k != "input_s"}
    assert OpCost(**old).input_s == 0.0 and OpCost(**old).seconds(1, 256, 1e5, 0, 2048) == OpCost(**old).seconds(1, 256, 1e5)


def test_fit_without_rows_and_non_negative():
    c = po.fit_cost(_samples("vector", 5e-8, 0.0, 2e-9, [(0, 128), (0, 512), (0, 2048)]))
    assert c.row_s == 0.0 and c.unit_s == pytest.approx(2e-9) and c.call_s == pytest.approx(5e-8)
    # data that a negative call cost would fit best: the fit clamps it at zero
    c = po.fit_cost([po.OpSample("vector", 1, 0, 100.0, 1e-7), po.OpSample("vector", 1, 0, 200.0, 3e-7)])
    assert c.call_s >= 0 and c.unit_s > 0


def test_fit_rejects_mixed_or_empty_samples():
    with pytest.raises(ValueError):
        po.fit_cost([])
    a = _samples("vector", 1e-8, 0, 1e-9, [(0, 10)])
    b = _samples("ssm_scan", 1e-8, 0, 1e-9, [(0, 10)])
    with pytest.raises(ValueError):
        po.fit_cost(a + b)


def test_nnls_matches_lstsq_when_positive():
    A = np.array([[1.0, 2.0], [1.0, 3.0], [1.0, 5.0]])
    b = A @ np.array([0.5, 2.0])
    assert po.nnls(A, b) == pytest.approx([0.5, 2.0])


@pytest.mark.parametrize("op", po.OPS)
def test_time_op_runs_every_op(op):
    shape = po.op_shapes(op, quick=True)[0]
    s = po.time_op(op, shape, timing=FAST)
    assert s.op == op and s.seconds > 0 and s.units > 0


def test_the_router_op_times_the_engines_router_kernel_on_one_thread():
    """router_int8 runs kernels_stored._router_int8 (the engine's: each int8 row dequantized
    with its scale, then the fp32 row dot), timed at 1 thread only: the one-region step splits
    a router into single-thread items, which the predictor prices from that cost."""
    assert po.op_shapes(po.ROUTER_OP, 1) and po.op_shapes(po.ROUTER_OP, 2) == ()
    rng = np.random.default_rng(0)
    W = rng.integers(-127, 128, (40, 256)).astype(np.int8)
    S = (0.01 * (1 + rng.random(40))).astype(np.float32)
    x, out = rng.standard_normal(256).astype(np.float32), np.zeros(40, np.float32)
    po.drivers()["router"](W, S, x, out, 2)
    want = (W.astype(np.float64) * S[:, None].astype(np.float64)) @ x.astype(np.float64)
    assert out == pytest.approx(want, rel=1e-4, abs=1e-4)


def test_time_op_parallel_matvec():
    s = po.time_op("ternary_matvec", po.op_shapes("ternary_matvec", threads=2, quick=True)[0], threads=2,
                   timing=FAST)
    assert s.threads == 2 and s.seconds > 0


@pytest.mark.parametrize("threads", [1, 2])
def test_region_phase_op_times_a_region_of_phases(threads):
    """The one-region step's frame: a region entered and its empty phases walked; it
    completes at any thread count (numba may run the prange's iterations one after another)
    and, on one thread (no other core's timing in it), more phases take longer."""
    short, long = (po.time_op(po.REGION_OP, (n,), threads=threads, timing=FAST) for n in (4, 512))
    assert short.units == 4 and long.units == 512 and short.seconds > 0 and long.seconds > 0
    assert threads > 1 or short.seconds < long.seconds
    assert po.op_shapes(po.REGION_OP, 2, quick=True) and po.REGION_OP not in po.OPS


def test_unknown_op():
    with pytest.raises(ValueError, match="unknown op"):
        po.op_shapes("nope")
    with pytest.raises(ValueError, match="unknown op"):
        po.time_op("nope", (1, 1))


def test_op_cost_for_prefers_threads_at_or_below():
    costs = [OpCost("ternary_matvec", t, 0, 0, 1e-12 / t, 3, 0.0) for t in (1, 2, 4)]
    assert op_cost_for(costs, "ternary_matvec", 3).threads == 2
    assert op_cost_for(costs, "ternary_matvec", 1).threads == 1
    assert op_cost_for(costs, "ssm_scan", 1) is None


def test_measure_op_costs_fits_every_op(monkeypatch):
    calls = []

    def fake_time(op, shape, threads=1, timing=None, seed=0, stream_prefetch=True):
        calls.append((op, threads, stream_prefetch))
        return po.OpSample(op, threads, shape[0] if op != "vector" else 0, float(np.prod(shape)), 1e-6)

    monkeypatch.setattr(po, "time_op", fake_time)
    costs = po.measure_op_costs((1, 2), quick=True, progress=False, stream_prefetch=False)
    assert {c[2] for c in calls} == {False}  # the engine's streaming-kernel prefetch, as the probe chose it
    assert {(c.op, c.threads) for c in costs} == ({(op, 1) for op in po.OPS} | {(op, 2) for op in po.MATVEC_OPS}
                                                  | {(po.REGION_OP, 2)})  # the region's frame: threads > 1 only
    assert all(c.call_s >= 0 and c.row_s >= 0 and c.unit_s >= 0 for c in costs)
    assert "ternary_matvec" in po.render_costs(costs)


def test_a_sample_far_slower_than_its_fit_is_timed_again(monkeypatch):
    """A pause during one size (another process taking the core) makes that sample 6x slow:
    it is timed again and the fit is made from its faster timing; clean samples are not."""
    shapes = [(32, 8192), (256, 65536), (1024, 262144), (64, 65536), (512, 524288)]
    clean = _samples("ternary_matvec", 1e-7, 3e-9, 7e-12, shapes)
    paused = [dataclasses.replace(clean[2], seconds=6 * clean[2].seconds)] + clean[3:]
    assert po.slow_samples(clean) == [] and po.slow_samples(clean[:2] + paused) == [2]
    timings = {shape: [s] for shape, s in zip(shapes, clean, strict=True)}
    timings[shapes[2]] = [paused[0], clean[2]]  # slow first, then as it should be
    calls = []

    def fake_time(op, shape, threads=1, timing=None, seed=0, stream_prefetch=True):
        calls.append(shape)
        left = timings.get(tuple(shape), [])
        return left.pop(0) if len(left) > 1 else left[0] if left else po.OpSample(op, threads, shape[0], float(np.prod(shape)), 1e-6)

    monkeypatch.setattr(po, "op_shapes", lambda op, t, quick: shapes if op == "ternary_matvec" else [(8, 8)])
    monkeypatch.setattr(po, "time_op", fake_time)
    costs = po.measure_op_costs((1,), quick=True, progress=False)
    c = op_cost_for(costs, "ternary_matvec", 1)
    assert calls.count(shapes[2]) == 2 and calls.count(shapes[0]) == 1
    assert c.max_rel_err < 1e-6 and c.unit_s == pytest.approx(7e-12, rel=1e-6)


def test_profile_round_trip_with_op_costs(tmp_path):
    ref = HostProfile("t", True, {}, (), "default", ())
    prof = dataclasses.replace(ref, op_costs=(OpCost("ssm_scan", 1, 1e-7, 2e-9, 3e-10, 5, 0.1),))
    prof.save(tmp_path / "p.json")
    back = HostProfile.load(tmp_path / "p.json")
    assert back.op_costs == prof.op_costs
    assert back.op_costs[0].seconds(1, 10, 100) == pytest.approx(1e-7 + 2e-8 + 3e-8)


def test_profile_round_trip_keeps_the_skip_listing_cost(tmp_path):
    prof = dataclasses.replace(HostProfile("t", True, {}, (), "default", ()),
                               op_costs=(OpCost("ternary_skip", 1, 2e-7, 0.0, 1e-11, 22, 0.1, 1e-9, 5e-10),))
    prof.save(tmp_path / "p.json")
    back = HostProfile.load(tmp_path / "p.json").op_costs[0]
    assert back.input_s == 5e-10 and back.seconds(1, 256, 1e4, 0, 2048) == pytest.approx(2e-7 + 1e-7 + 2048 * 5e-10)


@pytest.mark.parametrize("field, value", [("unit_s", float("nan")), ("call_s", -1e-9), ("threads", 0),
                                          ("tail_s", -1e-9), ("tail_s", float("inf")), ("input_s", -1e-9),
                                          ("input_s", "5e-10")])
def test_bad_op_cost_in_a_profile_is_a_clear_error(tmp_path, field, value):
    prof = dataclasses.replace(HostProfile("t", True, {}, (), "default", ()),
                               op_costs=(OpCost("ssm_scan", 1, 1e-7, 2e-9, 3e-10, 5, 0.1),))
    d = prof.to_dict()
    d["op_costs"][0][field] = value
    path = tmp_path / "bad.json"
    path.write_text(__import__("json").dumps(d))
    with pytest.raises(ValueError, match="op cost 'ssm_scan'"):
        HostProfile.load(path)
