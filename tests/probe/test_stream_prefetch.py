"""The probe's streaming-kernel prefetch A/B (tern.probe.stream_prefetch) and its hand-off
to the engine through `tern probe` (tern.core.engine_tuning)."""

from __future__ import annotations

import pytest

from tern.core.host_profile import OpCurve
from tern.probe import stream_prefetch as sp


def _fake_curve(seconds_on: float, seconds_off: float):
    """measure_curve stand-in: the streaming kernel takes these seconds per call."""
    calls = []

    def fake(op, split, threads, working_sets, buf, timing=None, seed=0, shape=None, stream_prefetch=True):
        calls.append((op, split, threads, stream_prefetch))
        s = seconds_on if stream_prefetch else seconds_off
        return OpCurve(op=op, split=split, threads=threads, rows=shape[0], cols=shape[1], density=1.0,
                       working_set_bytes=tuple(working_sets), seconds=(s,), seconds_min=(s,), seconds_max=(s,))
    return fake, calls


@pytest.mark.parametrize("on,off,want", [(1.0, 0.90, False), (1.0, 0.99, True), (0.9, 1.0, True)])
def test_prefetch_goes_only_when_off_is_clearly_faster(monkeypatch, on, off, want):
    fake, calls = _fake_curve(on, off)
    monkeypatch.setattr(sp, "measure_curve", fake)
    r = sp.measure_stream_prefetch((1, 2), rounds=3, working_set_bytes=2 << 20, progress=False)
    assert r["stream_prefetch"] == {"1": want, "2": want}
    assert r["off_over_on"]["1"] == pytest.approx(on / off)
    assert len(r["gbps"]["2"]["on"]) == len(r["gbps"]["2"]["off"]) == 3
    # every round times both, alternating which goes first; 2 threads split the rows
    assert [c[3] for c in calls[:6]] == [True, False, False, True, True, False]
    assert {c[1] for c in calls if c[2] == 2} == {"rows"} and {c[1] for c in calls if c[2] == 1} == {"serial"}
    assert r["gbps"]["1"]["on"][0] == pytest.approx(r["rows"] * r["cols"] / 4 / on / 1e9)


def test_the_ab_runs_the_real_kernel(monkeypatch):
    r = sp.measure_stream_prefetch((1,), quick=True, rounds=1, working_set_bytes=1 << 20, progress=False)
    assert isinstance(r["stream_prefetch"]["1"], bool) and r["working_set_bytes"] == 1 << 20
    assert all(v > 0 for v in r["gbps"]["1"]["on"] + r["gbps"]["1"]["off"])
    with pytest.raises(ValueError, match="rounds"):
        sp.measure_stream_prefetch((1,), rounds=0)
    with pytest.raises(ValueError, match="working_set_bytes"):
        sp.measure_stream_prefetch((1,), working_set_bytes=100)


def test_each_thread_count_gets_its_own_choice(monkeypatch):
    """As on the Zen 4 VM: without prefetch faster at 1 thread, slower at 2."""
    def fake(op, split, threads, working_sets, buf, timing=None, seed=0, shape=None, stream_prefetch=True):
        s = {(1, True): 1.0, (1, False): 0.88, (2, True): 0.5, (2, False): 0.53}[(threads, stream_prefetch)]
        return OpCurve(op=op, split=split, threads=threads, rows=shape[0], cols=shape[1], density=1.0,
                       working_set_bytes=tuple(working_sets), seconds=(s,), seconds_min=(s,), seconds_max=(s,))
    monkeypatch.setattr(sp, "measure_curve", fake)
    r = sp.measure_stream_prefetch((1, 2), rounds=2, working_set_bytes=2 << 20, progress=False)
    assert r["stream_prefetch"] == {"1": False, "2": True}
