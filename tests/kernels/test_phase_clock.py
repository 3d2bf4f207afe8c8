"""The one-region step's phase clock (tern.kernels.region, TERN_PHASE_CLOCK; benchmarks/region_phases.py):
off by default and then absent from the counters; when compiled in, every finished item keeps the
latest cycle of its phase; phase_clock turns the counters into per-phase cycles; the setting is in
the numba cache stamps of every module that compiles the region step in."""

import numba
import numpy as np
import pytest

from tern.kernels import region
from tern.kernels.region import (
    CLOCK_END,
    CLOCK_START,
    REGION_STAMP,
    STRIDE,
    clock_start,
    finish,
    phase_clock,
    phase_clock_setting,
    phase_counters,
)


def test_setting_parses_zero_and_one_only():
    assert phase_clock_setting(" 1 ") is True and phase_clock_setting("0") is False
    for bad in ("", "yes", "2", "true"):
        with pytest.raises(ValueError, match="TERN_PHASE_CLOCK"):
            phase_clock_setting(bad)


def test_off_by_default_and_reading_it_says_how_to_turn_it_on():
    assert region.PHASE_CLOCK is False  # the suite runs the shipped build
    with pytest.raises(RuntimeError, match="TERN_PHASE_CLOCK=1"):
        phase_clock(phase_counters(2), 2)


def test_unclocked_region_token_leaves_the_clock_slots_zero(tmp_path):
    from conftest import SMALL

    from tern.kernels import ops_region
    from tern.packed.writer import random_model
    from tern.run.engine import Engine

    eng = Engine(random_model(SMALL, tmp_path / "m.tern", seed=1, progress=False), threads=2, region=True)
    fn, before, after = eng.fused_call()
    assert fn is ops_region.token_step_region
    fn(*before, 3, *after)
    ctr, n = after[-2], int(after[-1][-1])
    assert n > 1 and ctr[1:n * STRIDE:STRIDE].min() >= 1  # every phase counted its items done
    assert not ctr[CLOCK_END::STRIDE].any() and ctr[CLOCK_START] == 0


def test_clocked_finish_keeps_each_phases_latest_cycle(monkeypatch):
    """Compiled with the clock (the module setting as numba inlines finish / clock_start into a
    fresh function): the start and each phase's end are cycles in order, items counted as before."""
    monkeypatch.setattr(region, "PHASE_CLOCK", True)

    @numba.njit
    def three_phases(ctr, spin):
        clock_start(ctr)
        s = 0.0
        for p, items in ((0, 2), (1, 1), (2, 3)):
            for _ in range(items):
                for i in range(spin):  # some work between the items
                    s += np.sqrt(i + 1.0)
                finish(ctr, p)
        return s

    ctr = phase_counters(3)
    three_phases(ctr, 10_000)
    assert ctr[CLOCK_START] > 0
    ends = ctr[CLOCK_END::STRIDE]
    assert ends[0] > ctr[CLOCK_START] and ends[0] < ends[1] < ends[2]
    cyc, done = phase_clock(ctr, 3)
    assert done.tolist() == [2, 1, 3]
    assert cyc.tolist() == [ends[0] - ctr[CLOCK_START], ends[1] - ends[0], ends[2] - ends[1]]


def test_phase_clock_arithmetic_and_bad_counters(monkeypatch):
    monkeypatch.setattr(region, "PHASE_CLOCK", True)
    ctr = phase_counters(4)
    ctr[CLOCK_START] = 1_000
    for p, (end, done) in enumerate(((1_050, 1), (1_200, 2), (1_550, 1))):
        ctr[p * STRIDE + CLOCK_END], ctr[p * STRIDE + 1] = end, done
    cyc, done = phase_clock(ctr, 3)
    assert cyc.tolist() == [50, 150, 350] and done.tolist() == [1, 2, 1]
    for n in (0, 5, 2.0):
        with pytest.raises(ValueError, match="n_phases"):
            phase_clock(ctr, n)
    with pytest.raises(ValueError, match="before the region started"):
        phase_clock(ctr, 4)  # phase 3 never ended: its slot is 0


def test_setting_is_in_the_cache_stamps():
    from tern.kernels.region_items import REGION_DEPS
    from tern.probe.op_drivers import engine_kernel_deps

    assert REGION_STAMP == "phase_clock=False"
    assert REGION_STAMP in REGION_DEPS and REGION_STAMP in engine_kernel_deps()
