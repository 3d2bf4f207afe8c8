"""The probe's streaming-kernel prefetch A/B (tern.probe.stream_prefetch) and its hand-off
to the engine through `tern probe` (tern.core.engine_tuning)."""

from __future__ import annotations

import pytest

from tern.core.host_profile import OpCurve
from tern.probe import stream_prefetch as sp


def _fake_curve(seconds_on: float, seconds_off: float, seconds_rows: float = 10.0):
    """measure_curve stand-in: the streaming kernel takes these seconds per call with / without
    prefetch, the 4-row pass (op ternary_matvec) ``seconds_rows``."""
    calls = []

    def fake(op, split, threads, working_sets, buf, timing=None, seed=0, shape=None, stream_prefetch=True):
        arm = "rows" if op == "ternary_matvec" else ("on" if stream_prefetch else "off")
        calls.append((arm, split, threads, shape))
        s = {"on": seconds_on, "off": seconds_off, "rows": seconds_rows}[arm]
        return OpCurve(op=op, split=split, threads=threads, rows=shape[0], cols=shape[1], density=1.0,
                       working_set_bytes=tuple(working_sets), seconds=(s,), seconds_min=(s,), seconds_max=(s,))
    return fake, calls


@pytest.mark.parametrize("on,off,want", [(1.0, 0.90, False), (1.0, 0.99, True), (0.9, 1.0, True)])
def test_prefetch_goes_only_when_off_is_clearly_faster(monkeypatch, on, off, want):
    fake, calls = _fake_curve(on, off)
    monkeypatch.setattr(sp, "measure_curve", fake)
    r = sp.measure_stream_prefetch((1, 2), rounds=3, working_set_bytes=2 << 20, progress=False)
    assert r["stream_prefetch"] == {"1": want, "2": want}
    assert r["stream"] == {"1": True, "2": True}  # the 4-row pass is 10x slower here
    assert r["off_over_on"]["1"] == pytest.approx(on / off)
    assert len(r["gbps"]["2"]["on"]) == len(r["gbps"]["2"]["off"]) == len(r["gbps"]["2"]["rows"]) == 3
    # every round times the three arms on the same matrices, rotating which goes first; 2 threads split the rows
    assert [c[0] for c in calls[:9]] == ["on", "off", "rows", "off", "rows", "on", "rows", "on", "off"]
    assert len({c[3] for c in calls}) == 1
    assert {c[1] for c in calls if c[2] == 2} == {"rows"} and {c[1] for c in calls if c[2] == 1} == {"serial"}
    assert r["gbps"]["1"]["on"][0] == pytest.approx(r["rows"] * r["cols"] / 4 / on / 1e9)


@pytest.mark.parametrize("rows,pf,want", [(0.90, True, False), (0.99, True, True), (0.85, False, True),
                                          (0.80, False, False)])
def test_the_4_row_pass_replaces_the_stream_only_when_clearly_faster(monkeypatch, rows, pf, want):
    """Against the streaming form the engine would run: with prefetch (on = 1.0 s) or without (off = 0.85 s)."""
    fake, _ = _fake_curve(1.0, 1.2 if pf else 0.85, rows)
    monkeypatch.setattr(sp, "measure_curve", fake)
    r = sp.measure_stream_prefetch((1,), rounds=3, working_set_bytes=2 << 20, progress=False)
    assert r["stream_prefetch"] == {"1": pf} and r["stream"] == {"1": want}
    assert r["rows_over_stream"]["1"] == pytest.approx((1.0 if pf else 0.85) / rows)


def test_the_ab_runs_the_real_kernels(monkeypatch):
    r = sp.measure_stream_prefetch((1,), quick=True, rounds=1, working_set_bytes=1 << 20, progress=False)
    assert isinstance(r["stream_prefetch"]["1"], bool) and isinstance(r["stream"]["1"], bool)
    assert r["working_set_bytes"] == 1 << 20
    assert all(v > 0 for arm in sp.ARMS for v in r["gbps"]["1"][arm])
    with pytest.raises(ValueError, match="rounds"):
        sp.measure_stream_prefetch((1,), rounds=0)
    with pytest.raises(ValueError, match="working_set_bytes"):
        sp.measure_stream_prefetch((1,), working_set_bytes=100)


def test_each_thread_count_gets_its_own_choice(monkeypatch):
    """As on the Zen 4 VM in session 23: without prefetch faster at 1 thread, slower at 2; in
    session 24 (row passes' prefetch into L2) the 4-row pass faster at 1 thread only."""
    def fake(op, split, threads, working_sets, buf, timing=None, seed=0, shape=None, stream_prefetch=True):
        arm = "rows" if op == "ternary_matvec" else stream_prefetch
        s = {(1, True): 1.0, (1, False): 0.88, (1, "rows"): 0.8, (2, True): 0.5, (2, False): 0.53,
             (2, "rows"): 0.51}[(threads, arm)]
        return OpCurve(op=op, split=split, threads=threads, rows=shape[0], cols=shape[1], density=1.0,
                       working_set_bytes=tuple(working_sets), seconds=(s,), seconds_min=(s,), seconds_max=(s,))
    monkeypatch.setattr(sp, "measure_curve", fake)
    r = sp.measure_stream_prefetch((1, 2), rounds=2, working_set_bytes=2 << 20, progress=False)
    assert r["stream_prefetch"] == {"1": False, "2": True}
    assert r["stream"] == {"1": False, "2": True}
