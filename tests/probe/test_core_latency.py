"""The threads' cache-line round trip (tern.probe.core_latency): a real measurement where two
threads run, None (never a hang) where they cannot run at once, clear errors on bad input."""

import time

import numba
import pytest

from tern.probe import core_latency as cl
from tern.probe import placement

TWO = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 numba threads")


@TWO
def test_two_threads_hand_the_line_back_and_forth():
    before = numba.get_num_threads()
    cl.measure_round_trip(runs=1, turns=10)  # compiled (or loaded) before the wall clock starts
    t0 = time.perf_counter()
    m = cl.measure_round_trip(runs=3, turns=2_000)
    wall = time.perf_counter() - t0
    assert m is not None
    assert 1 < m["min_ns"] <= m["round_trip_ns"] <= m["max_ns"]
    # the three runs' turns fit in the call's wall time (a slip of units would not). No fixed ceiling: with the
    # other core busy (the suite's second worker) a run's round trips wait for the scheduler, 2.3 ms each once
    assert m["turns"] * (m["min_ns"] + m["round_trip_ns"] + m["max_ns"]) * 1e-9 <= wall
    assert (m["runs"], m["turns"]) == (3, 2_000) and m["far"] == (m["round_trip_ns"] > placement.FAR_NS)
    assert numba.get_num_threads() == before  # the caller's setting is restored
    quick = cl.round_trip_ns(runs=1, turns=500)
    assert isinstance(quick, float) and quick > 0


@TWO
def test_threads_that_do_not_run_at_once_give_up_instead_of_hanging():
    # one numba thread runs both iterations of the loop one after the other: thread 0's second
    # turn waits for a thread that never comes, gives up after the spin limit, and thread 1 stops too
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        assert cl._run(10, spin_limit=1_000) is None
    finally:
        numba.set_num_threads(before)
    numba.set_num_threads(2)
    try:
        assert cl._run(10, spin_limit=cl.SPIN_LIMIT) is not None  # the same call with both threads
    finally:
        numba.set_num_threads(before)


def test_one_numba_thread_has_no_round_trip(monkeypatch):
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 1)
    assert cl.measure_round_trip() is None and cl.round_trip_ns() is None
    assert "not measured" in placement.describe_round_trip(None)


@pytest.mark.parametrize("kw", [{"runs": 0}, {"turns": 0}, {"spin_limit": -1}, {"runs": 2.5}, {"turns": True}])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        cl.measure_round_trip(**kw)


def test_the_description_says_where_the_cores_sit():
    near = {"round_trip_ns": 53.0, "min_ns": 52.0, "max_ns": 56.0, "far": False}
    far = {"round_trip_ns": 356.0, "min_ns": 350.0, "max_ns": 362.0, "far": True}
    assert "53 ns" in placement.describe_round_trip(near) and "shared L3" in placement.describe_round_trip(near)
    assert "356 ns" in placement.describe_round_trip(far) and "share no cache" in placement.describe_round_trip(far)
