"""Host probe: cache parsing from fixture /sys trees, bandwidth kernels, dense matvec
kernels, kernel registry, plateau detection, profile round trip, plot and CLI.
No timing assertions: speed is reported by `tern probe`, not tested."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import numba
import numpy as np
import pytest

from tern.core import host_caches
from tern.core.host_caches import Topology, detect_caches, parse_cpu_list, parse_size_bytes, read_topology
from tern.core.host_profile import BandwidthPoint, CacheLevel, HostProfile
from tern.kernels import kernels_dense as kd
from tern.probe import bandwidth as probe_bandwidth
from tern.probe import kernel_table as kernel_bench
from tern.probe import plateaus
from tern.probe import profile as probe
from tern.probe import timing as probe_timing
from tern.probe.bandwidth import (
    KIB,
    MIB,
    SweepBuffers,
    SweepConfig,
    copy_kernel,
    copy_kernel_parallel,
    default_max_ws_bytes,
    elements_for,
    format_bytes,
    measure_point,
    read_kernel,
    read_kernel_parallel,
    read_kernel_simd,
    triad_kernel,
    triad_kernel_parallel,
    working_set_sizes,
)
from tern.probe.timing import TimingConfig, timed_runs

FIX = Path(__file__).resolve().parents[1] / "fixtures"
TINY_TIMING = TimingConfig(min_time_s=0.002, repeats=2, warmup_s=0.0005)


def _by_level(caches):
    return {(c.level, c.type): c for c in caches}


# ---- caches ---------------------------------------------------------------------------------


def test_host_llc_bytes_is_one_last_level_instance():
    from tern.core.host_caches import host_llc_bytes

    assert host_llc_bytes(FIX / "sys_ryzen5_3600x", fallbacks=()) == 16 * MIB  # one CCX's L3
    assert host_llc_bytes(FIX / "sys_intel_i7_8700", fallbacks=()) > 0


def test_ryzen_3600x_fixture():
    caches, source = detect_caches(FIX / "sys_ryzen5_3600x", fallbacks=("default",))
    assert source == "/sys"
    c = _by_level(caches)
    assert (c[1, "Data"].size_bytes, c[1, "Data"].instances, c[1, "Data"].shared_by) == (32 * KIB, 6, 2)
    assert (c[2, "Unified"].size_bytes, c[2, "Unified"].instances, c[2, "Unified"].shared_by) == (512 * KIB, 6, 2)
    l3 = c[3, "Unified"]
    assert (l3.size_bytes, l3.instances, l3.shared_by) == (16 * MIB, 2, 6)  # two CCXs of 3 cores
    assert l3.total_bytes == 32 * MIB
    assert read_topology(FIX / "sys_ryzen5_3600x") == Topology(logical_cpus=12, physical_cores=6)
    prof = HostProfile("fixture", False, {}, caches, source, ())
    assert prof.llc_bytes == 32 * MIB


def test_intel_fixture_one_shared_l3():
    caches, source = detect_caches(FIX / "sys_intel_i7_8700", fallbacks=("default",))
    assert source == "/sys"
    c = _by_level(caches)
    assert c[2, "Unified"].size_bytes == 256 * KIB
    l3 = c[3, "Unified"]
    assert (l3.size_bytes, l3.instances, l3.shared_by) == (12 * MIB, 1, 12)


def test_vm_fixture_falls_back_and_says_so():
    root = FIX / "sys_vm_partial"
    caches, source = detect_caches(root, fallbacks=("default",))
    assert source == "/sys+default"
    c = _by_level(caches)
    assert c[1, "Data"].size_bytes == 32 * KIB and c[1, "Data"].instances == 4  # from /sys
    assert c[2, "Unified"].size_bytes == 512 * KIB  # default
    assert c[3, "Unified"].instances == 1 and c[3, "Unified"].shared_by == 4  # assumed shared

    # a fallback that knows the sizes wins over the default, and is named
    fake = {"LEVEL2_CACHE_SIZE": "2097152\n", "LEVEL3_CACHE_SIZE": "33554432\n"}
    caches, source = detect_caches(root, fallbacks=("getconf", "default"),
                                   run=lambda cmd: fake.get(cmd[-1]))
    assert source == "/sys+getconf"
    assert _by_level(caches)[3, "Unified"].size_bytes == 32 * MIB


def test_no_sys_tree_uses_default(tmp_path):
    caches, source = detect_caches(tmp_path / "nothing", fallbacks=("default",),
                                   topology=Topology(logical_cpus=4, physical_cores=2))
    assert source == "default"
    l1 = _by_level(caches)[1, "Data"]
    assert l1.instances == 2 and l1.shared_by == 2
    with pytest.raises(ValueError, match="unknown cache fallback"):
        detect_caches(tmp_path, fallbacks=("cpuinfo",))


def test_size_and_cpu_list_parsing():
    assert parse_size_bytes("32K") == 32768
    assert parse_size_bytes("16384K") == 16 * MIB
    assert parse_size_bytes("1M") == MIB
    assert parse_size_bytes("4096") == 4096
    assert parse_cpu_list("0-2,6-8") == {0, 1, 2, 6, 7, 8}
    assert parse_cpu_list("5") == {5}
    with pytest.raises(ValueError):
        parse_size_bytes("lots")
    with pytest.raises(ValueError):
        parse_cpu_list("3-1")


# ---- bandwidth kernels ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [8, 1000, 4099])
def test_read_kernel_returns_true_sum(n):
    a = (np.arange(n) % 97).astype(np.float64)  # integer values: every order sums exactly
    expect = float(a.sum())
    assert read_kernel(a, 1) == expect
    assert read_kernel(a, 3) == 3 * expect
    for chunks in (1, 2, 3):
        assert read_kernel_parallel(a, 2, chunks) == 2 * expect


def test_copy_and_triad_produce_correct_arrays():
    rng = np.random.default_rng(0)
    n = 1003
    a, b, c = rng.random(n), rng.random(n), rng.random(n)
    out = np.zeros(n)
    copy_kernel(a, out, 2)
    np.testing.assert_array_equal(out, a)
    out2 = np.zeros(n)
    copy_kernel_parallel(a, out2, 1, 2)
    np.testing.assert_array_equal(out2, a)
    dst = np.zeros(n)
    triad_kernel(dst, b, c, 3.0, 2)
    np.testing.assert_allclose(dst, b + 3.0 * c, rtol=1e-15)
    dst2 = np.zeros(n)
    triad_kernel_parallel(dst2, b, c, 3.0, 1, 3)
    np.testing.assert_allclose(dst2, b + 3.0 * c, rtol=1e-15)


def test_read_kernel_is_vectorized_on_x86():
    simd = read_kernel_simd()
    assert simd in ("zmm", "ymm", "xmm", "scalar", "unknown")
    import platform

    if platform.machine() in ("x86_64", "AMD64"):
        assert simd in ("zmm", "ymm", "xmm")


def test_working_set_sizes():
    sizes = working_set_sizes(4 * KIB, 512 * MIB, 4)
    assert sizes[0] == 4 * KIB and sizes[-1] == 512 * MIB
    assert len(sizes) == 17 * 4 + 1  # 17 octaves, 4 points each
    assert all(b > a for a, b in zip(sizes, sizes[1:], strict=False))
    assert all(s % 64 == 0 for s in sizes)
    with pytest.raises(ValueError):
        working_set_sizes(64 * KIB, 4 * KIB, 4)
    assert default_max_ws_bytes(32 * MIB) == 512 * MIB
    assert default_max_ws_bytes(256 * MIB) == 1024 * MIB
    # a /sys L3 of a whole socket (the Intel Xeon VM's 480 MiB) sizes the sweep as 256 MiB would
    assert default_max_ws_bytes(480 * MIB) == 1024 * MIB
    assert default_max_ws_bytes(480 * MIB, quick=True) == 1024 * MIB
    assert 32 * MIB < default_max_ws_bytes(32 * MIB, quick=True) <= 512 * MIB
    assert format_bytes(4096) == "4 KiB" and format_bytes(1.5 * MIB) == "1.5 MiB"


def test_measure_point_counts_stream_bytes():
    buf = SweepBuffers(1 * MIB)
    for kernel, arrays in (("read", 1), ("copy", 2), ("triad", 3)):
        p, t = measure_point(kernel, 96 * KIB, 1, buf, TINY_TIMING)
        assert p.working_set_bytes == elements_for(kernel, 96 * KIB) * 8 * arrays
        assert p.repeats == 2 and 0 < p.gbps_min <= p.gbps_median <= p.gbps_best
        assert all(s >= TINY_TIMING.min_time_s for s in t.seconds)
        assert len(p.runs_gbps) == 2 and (min(p.runs_gbps), max(p.runs_gbps)) == (p.gbps_min, p.gbps_best)
        assert p.runs_at_s[0] == 0.0 and p.runs_at_s[1] >= TINY_TIMING.min_time_s  # back to back
    with pytest.raises(ValueError, match="at most"):
        measure_point("read", 8 * KIB, 10_000, buf, TINY_TIMING)
    with pytest.raises(ValueError, match="unknown bandwidth kernel"):
        measure_point("scale", 8 * KIB, 1, buf, TINY_TIMING)


def test_timed_runs_honours_min_time_and_amortises_fixed_cost():
    cfg = TimingConfig(min_time_s=0.01, repeats=3, warmup_s=0.002)

    def run(count):  # a fixed 2 ms cost per call plus 10 us of work per repetition
        time.sleep(0.002 + 1e-5 * count)

    t = timed_runs(run, cfg)
    assert len(t.seconds) == 3 and all(s >= cfg.min_time_s for s in t.seconds)
    assert all(1e-5 * c >= 0.002 for c in t.counts)  # the work, not the fixed cost, dominates
    with pytest.raises(ValueError):
        TimingConfig(min_time_s=0)
    with pytest.raises(ValueError):
        TimingConfig(repeats=0)


class FakeClock:
    """probe_timing.clock stand-in: time moves only when the fake kernel runs."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _fake_kernel(clock: FakeClock, log: list, gbps: float = 10.0):
    """run_passes stand-in: a pass over the arrays takes their bytes at ``gbps`` GB/s
    plus 1 us; logs (kernel, threads, elements, passes, start)."""
    def run(kernel, arrays, threads, passes):
        log.append((kernel, threads, arrays[0].shape[0], passes, clock.t))
        clock.t += 1e-6 + passes * sum(a.nbytes for a in arrays) / (gbps * 1e9)
        return 0.0
    return run


def test_timed_rounds_interleaves_and_keeps_min_time(monkeypatch):
    clock, calls = FakeClock(), []
    monkeypatch.setattr(probe_timing, "clock", clock)

    def make(name, s_per_count):
        def run(count):
            calls.append(name)
            clock.t += s_per_count * count
        return run

    cfg = TimingConfig(min_time_s=0.01, repeats=3, warmup_s=0.001)
    cal = [probe_timing.calibrate(make(n, dt), cfg, fixed_cost_check=False)
           for n, dt in (("a", 1e-5), ("b", 3e-5), ("c", 1e-4))]
    calls.clear()
    timings = probe_timing.timed_rounds(cal, 3)
    assert calls == ["a", "b", "c"] * 3  # round r runs every one once before round r+1
    for t in timings:
        assert len(t.seconds) == 3 and all(s >= cfg.min_time_s for s in t.seconds)
    starts = [(s, i) for i, t in enumerate(timings) for s in t.starts_s]
    assert [i for _, i in sorted(starts)] == [0, 1, 2] * 3
    with pytest.raises(ValueError, match="rounds"):
        probe_timing.timed_rounds(cal, 0)


def test_sweep_takes_each_curves_repeats_in_rounds(monkeypatch):
    clock, log = FakeClock(), []
    monkeypatch.setattr(probe_timing, "clock", clock)
    monkeypatch.setattr(probe_bandwidth, "run_passes", _fake_kernel(clock, log))
    cfg = SweepConfig(min_ws_bytes=4 * KIB, max_ws_bytes=64 * KIB, points_per_octave=1,
                      kernels=("read", "copy"), thread_counts=(1,),
                      timing=TimingConfig(min_time_s=0.01, repeats=3, warmup_s=0.001))
    points = probe_bandwidth.sweep(cfg, progress=False)
    assert len(points) == cfg.n_points() == 10
    for kernel in ("read", "copy"):
        curve = [p for p in points if p.kernel == kernel]
        assert [p.working_set_bytes for p in curve] == sorted(p.working_set_bytes for p in curve)
        assert all(p.repeats == 3 and len(p.runs_gbps) == len(p.runs_at_s) == 3 for p in curve)
        # the timed runs, ordered by start: round 0 small to large, then round 1, round 2
        order = sorted((at, i, r) for i, p in enumerate(curve) for r, at in enumerate(p.runs_at_s))
        assert [(i, r) for _, i, r in order] == [(i, r) for r in range(3) for i in range(len(curve))]
        for p in curve:  # the fake kernel runs at 10 GB/s (+1 us per call)
            assert p.gbps_min <= p.gbps_median <= p.gbps_best
            assert p.gbps_best == pytest.approx(10.0, rel=0.01)
            # each point's runs span at least one run of every other point of its curve
            assert p.span_s >= 2 * (len(curve) - 1) * cfg.timing.min_time_s
    read_last = max(at for p in points if p.kernel == "read" for at in p.runs_at_s)
    copy_first = min(at for p in points if p.kernel == "copy" for at in p.runs_at_s)
    assert read_last < copy_first  # one curve at a time
    assert min(at for p in points for at in p.runs_at_s) > 0  # seconds since the sweep began
    assert {k for k, *_ in log} == {"read", "copy"}


# ---- dense matvec kernels --------------------------------------------------------------------


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 33), (64, 1024)])
def test_matvec_fp32_matches_numpy(rows, cols):
    rng = np.random.default_rng(1)
    W = rng.standard_normal((rows, cols), dtype=np.float32)
    x = rng.standard_normal(cols, dtype=np.float32)
    ref = W.astype(np.float64) @ x.astype(np.float64)
    for f in (kd.matvec_fp32, kd.matvec_fp32_parallel):
        out = f(W, x, np.empty(rows, np.float32))
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * math.sqrt(cols))


@pytest.mark.parametrize("rows,cols", [(1, 1), (9, 31), (64, 1024)])
def test_matvec_int8_matches_numpy(rows, cols):
    rng = np.random.default_rng(2)
    Wq = rng.integers(-127, 128, (rows, cols), dtype=np.int8)
    xq = rng.integers(-127, 128, cols, dtype=np.int8)
    rs = rng.random(rows, dtype=np.float32) + np.float32(0.1)
    xs = np.float32(0.03)
    dots = Wq.astype(np.int64) @ xq.astype(np.int64)  # exact integer sums
    ref = dots.astype(np.float32) * rs * xs
    for f in (kd.matvec_int8, kd.matvec_int8_parallel):
        out = f(Wq, rs, xq, xs, np.empty(rows, np.float32))
        np.testing.assert_array_equal(out, ref)


def test_matvec_rejects_bad_input():
    W = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="columns"):
        kd.matvec_fp32(W, np.zeros(7, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="float32"):
        kd.matvec_fp32(W.astype(np.float64), np.zeros(8, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        kd.matvec_fp32(np.zeros((8, 4), np.float32).T, np.zeros(8, np.float32), np.zeros(4, np.float32))
    Wq = np.zeros((4, 8), np.int8)
    with pytest.raises(ValueError, match="row_scale has 3 elements"):
        kd.matvec_int8(Wq, np.ones(3, np.float32), np.zeros(8, np.int8), 1.0, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="finite"):
        kd.matvec_int8(Wq, np.ones(4, np.float32), np.zeros(8, np.int8), float("nan"), np.zeros(4, np.float32))


# ---- kernel registry ---------------------------------------------------------------------------


def test_kernel_registry_measures_dense_kernels():
    names = kernel_bench.registered_kernels()
    assert {"fp32_matvec", "int8_matvec"} <= set(names)
    assert any(n.startswith("ternary_") for n in names)  # the engine's kernels, via KERNEL_MODULES
    k = kernel_bench.measure_kernel("int8_matvec", 32, 64, 1, TINY_TIMING)
    assert (k.kernel, k.rows, k.cols, k.threads, k.repeats) == ("int8_matvec", 32, 64, 1, 2)
    assert 0 < k.gops_median <= k.gops_best and k.gbps_median > 0
    with pytest.raises(ValueError, match="unknown kernel"):
        kernel_bench.measure_kernel("nope")
    with pytest.raises(ValueError, match="already registered"):
        kernel_bench.register_kernel("fp32_matvec", lambda r, c, t, rng: None)


# ---- plateaus, profile, plot, CLI -----------------------------------------------------------


def _synthetic_profile() -> HostProfile:
    """L1 32K / L2 512K private per core, one 16M L3 for both cores; flat plateaus
    of 200 / 100 / 50 / 20 GB/s per thread, and nonsense (999) in every transition zone."""
    caches = (CacheLevel(1, "Data", 32 * KIB, 2, 1), CacheLevel(2, "Unified", 512 * KIB, 2, 1),
              CacheLevel(3, "Unified", 16 * MIB, 1, 2))
    pts = []
    for t in (1, 2):
        caps = [32 * KIB * t, 512 * KIB * t, 16 * MIB]
        for ws in working_set_sizes(4 * KIB, 256 * MIB, 4):
            if ws <= caps[0] // 2:
                v = 200.0
            elif 2 * caps[0] < ws <= caps[1] // 2:
                v = 100.0
            elif 2 * caps[1] < ws <= caps[2] // 2:
                v = 50.0
            elif ws >= 4 * caps[2]:
                v = 20.0
            else:
                v = 999.0
            pts.append(BandwidthPoint("read", t, ws, v * t * 1.1, v * t, 3))
    return HostProfile("synthetic", False, {"cpu_model": "synthetic", "physical_cores": 2,
                                            "logical_cpus": 2}, caches, "/sys", tuple(pts))


def test_plateau_detection_on_synthetic_curve():
    prof = _synthetic_profile()
    table = plateaus.plateau_table(prof)
    assert table[1] == {"L1": 200.0, "L2": 100.0, "L3": 50.0, "DRAM": 20.0}
    assert table[2] == {"L1": 400.0, "L2": 200.0, "L3": 100.0, "DRAM": 40.0}
    p1 = plateaus.detect_plateaus(prof, 1)
    assert [p.name for p in p1] == ["L1", "L2", "L3", "DRAM"]
    assert p1[1].lo_bytes == 64 * KIB and p1[1].hi_bytes == 256 * KIB
    text = plateaus.format_plateau_table(prof)
    assert "DRAM" in text and "200.0" in text and "40.0" in text


def _with_runs(prof: HostProfile) -> HostProfile:
    """``prof`` with three runs per point (0.6x, 1x and 1.1x its median), taken in rounds
    over the points of each curve, 0.1 s apart."""
    from dataclasses import replace

    pts, clock = [], 0.0
    by_curve: dict = {}
    for p in prof.bandwidth:
        by_curve.setdefault((p.kernel, p.threads), []).append(p)
    for curve in by_curve.values():
        n = len(curve)
        for i, p in enumerate(curve):
            v = p.gbps_median
            pts.append(replace(p, gbps_best=1.1 * v, gbps_min=0.6 * v, runs_gbps=(0.6 * v, v, 1.1 * v),
                               runs_at_s=tuple(clock + 0.1 * (r * n + i) for r in range(3))))
        clock += 0.1 * 3 * n
    return replace(prof, bandwidth=tuple(pts))


def test_plateaus_carry_the_spread_of_their_runs():
    plain = plateaus.detect_plateaus(_synthetic_profile(), 1)[-1]
    assert plain.runs == 0 and plain.gbps_min is None and plain.span_s is None
    assert plain.spread_text() == "20.0 GB/s"
    prof = _with_runs(_synthetic_profile())
    assert plateaus.plateau_table(prof) == plateaus.plateau_table(_synthetic_profile())  # medians unchanged
    dram = plateaus.detect_plateaus(prof, 1)[-1]
    n = dram.points
    assert n >= 2 and dram.runs == 3 * n
    assert (dram.gbps, dram.gbps_min, dram.gbps_max) == (20.0, pytest.approx(12.0), pytest.approx(22.0))
    # the DRAM points are the last n of the curve's N: from round 0 at point N - n to
    # round 2 at point N - 1, runs 0.1 s apart
    N = len(prof.curve(1))
    assert dram.span_s == pytest.approx(0.1 * ((2 * N + N - 1) - (N - n)))
    text = plateaus.format_plateau_table(prof)
    assert f"DRAM, 2 threads: 40.0 GB/s (24.0\u201344.0 over {3 * n} runs of {n} points, spread over" in text
    spread = plateaus.plateau_spread(prof)
    assert spread[1]["DRAM"]["gbps_min"] == pytest.approx(12.0) and spread[1]["DRAM"]["runs"] == 3 * n
    assert spread[1]["L1"]["gbps_max"] == pytest.approx(220.0)
    assert "DRAM, 1 thread" not in plateaus.format_plateau_table(_synthetic_profile())


def test_profile_json_keeps_runs_and_reads_version_1(tmp_path):
    from tern.core import host_profile

    prof = _with_runs(_synthetic_profile())
    f = tmp_path / "hp.json"
    prof.save(f)
    d = json.loads(f.read_text())
    assert d["version"] == host_profile.VERSION == 5
    assert len(d["bandwidth"][0]["runs_gbps"]) == 3 and "gbps_min" in d["bandwidth"][0]
    loaded = HostProfile.load(f)
    assert loaded == prof and isinstance(loaded.bandwidth[0].runs_at_s, tuple)
    # a version-1 file (no spread fields) still loads; the spread is unknown
    d["version"] = 1
    for p in d["bandwidth"]:
        for k in ("gbps_min", "runs_gbps", "runs_at_s"):
            del p[k]
    f.write_text(json.dumps(d))
    old = HostProfile.load(f)
    assert old.bandwidth[0].gbps_min is None and old.bandwidth[0].runs_gbps == ()
    assert old.bandwidth[0].span_s is None
    assert plateaus.plateau_table(old) == plateaus.plateau_table(prof)
    d["version"] = 6  # a newer tern's file
    f.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="version 6 is not supported"):
        HostProfile.load(f)


def test_bandwidth_point_validates_spread_fields():
    with pytest.raises(ValueError, match="run start times"):
        BandwidthPoint("read", 1, 4096, 10.0, 9.0, 2, 8.0, (8.0, 10.0), (0.0,))
    with pytest.raises(ValueError, match="gbps_min"):
        BandwidthPoint("read", 1, 4096, 10.0, 9.0, 2, 11.0)
    p = BandwidthPoint("read", 1, 4096, 10.0, 9.0, 2, 8.0, [8.0, 10.0], [1.0, 3.5])
    assert p.runs_gbps == (8.0, 10.0) and p.span_s == 2.5


def test_probe_config_caps_working_set_by_ram(monkeypatch):
    monkeypatch.setattr(probe, "_available_ram_bytes", lambda: 1024 * MIB)
    cfg = probe.probe_config(quick=False, thread_counts=(1,), sys_root=str(FIX / "sys_ryzen5_3600x"))
    assert cfg.sweep.max_ws_bytes == 256 * MIB


def test_probe_configs_quick_and_full(monkeypatch):
    monkeypatch.setattr(probe, "_available_ram_bytes", lambda: 64 * 1024 * MIB)
    fix = str(FIX / "sys_ryzen5_3600x")  # LLC 2 x 16 MiB
    q = probe.probe_config(quick=True, thread_counts=(1,), sys_root=fix)
    assert q.quick and q.sweep.kernels == ("read",) and q.sweep.points_per_octave == 2
    from tern.kernels.kernels_ternary import DEFAULT_VARIANT
    from tern.probe.kernel_table import registered_kernels

    # the quick kernel table: the engine's own kernels, all registered (the full one: None, every kernel)
    assert q.kernel_names == (f"ternary_{DEFAULT_VARIANT}", "int8_matvec", "fp32_matvec")
    assert set(q.kernel_names) <= set(registered_kernels())
    assert q.sweep.max_ws_bytes >= 4 * 32 * MIB  # past the last-level cache
    f = probe.probe_config(quick=False, thread_counts=(1,), sys_root=fix)
    assert set(f.sweep.kernels) == {"read", "copy", "triad"} and f.sweep.points_per_octave == 4
    assert len(f.sweep.sizes("read")) == 4 * 17 + 1 and len(f.sweep.sizes("copy")) == 17 + 1  # copy, triad: one per octave
    assert f.sweep.timing.min_time_s >= 0.1 and f.sweep.timing.repeats >= 3
    assert f.sweep.min_ws_bytes == 4 * KIB and f.sweep.max_ws_bytes >= 512 * MIB
    assert (1024, 1024) in f.kernel_sizes and f.kernel_names is None
    assert probe.default_thread_counts()[0] == 1


def test_all_cores_means_the_cpus_this_process_may_use(monkeypatch):
    """A 16-CPU machine with this process pinned to 2 (taskset, a container's cpuset): every
    "all cores" default is 2, so nothing oversubscribes the slice."""
    import os

    from tern.decide import workers
    from tern.measure import sweep

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 7}, raising=False)
    assert host_caches.usable_cpus() == 2
    assert probe.default_thread_counts() == (1, 2)
    assert sorted({p.threads for p in sweep.default_points()}) == [1, 2]
    assert workers.threads_per_worker(2) == 1 and workers.threads_per_worker(1) == 2
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS: no affinity call
    assert host_caches.usable_cpus() == 16


def test_probe_headlines_have_units():
    h = plateaus.probe_headlines(_synthetic_profile())
    assert h["read_L1_1t_gbps"] == 200.0 and h["read_DRAM_2t_gbps"] == 40.0
    assert h["llc_bytes"] == 16 * MIB and h["cache_source"] == "/sys"
    assert "read_DRAM_1t_gbps_min" not in h  # no recorded runs
    h = plateaus.probe_headlines(_with_runs(_synthetic_profile()))
    assert (h["read_DRAM_1t_gbps_min"], h["read_DRAM_1t_gbps"], h["read_DRAM_1t_gbps_max"]) == (12.0, 20.0, 22.0)
    assert h["read_DRAM_2t_runs"] > 3 and h["read_DRAM_2t_span_s"] > 0


def test_plot_bandwidth_headless(tmp_path):
    from tern.probe.plots import plot_bandwidth

    fig = plot_bandwidth(_synthetic_profile())
    ax = fig.axes[0]
    assert "GB/s" in ax.get_ylabel() and "working set" in ax.get_xlabel()
    assert len([ln for ln in ax.get_lines() if ln.get_marker() == "o"]) == 2  # one per thread count
    assert any("KiB" in t.get_text() for t in ax.get_xticklabels())
    fig.savefig(tmp_path / "bw.png")
    assert (tmp_path / "bw.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="no curve"):
        plot_bandwidth(_synthetic_profile(), kernels=("copy",))
    fig = plot_bandwidth(_synthetic_profile(), kernels=None, label_plateaus=False)  # every kernel
    assert len(fig.axes[0].get_legend().get_texts()) == 2
    assert not fig.axes[0].collections  # no recorded runs: no spread band


def test_plot_bandwidth_shows_the_spread(tmp_path):
    from tern.probe.plots import plot_bandwidth

    prof = _with_runs(_synthetic_profile())
    fig = plot_bandwidth(prof)
    ax = fig.axes[0]
    assert len(ax.collections) == 2  # one min-to-best band per curve
    band = ax.collections[0].get_paths()[0].vertices  # (k, 2): x, GB/s around the band
    curve = prof.curve(1)
    assert band[:, 1].min() == pytest.approx(min(p.gbps_min for p in curve))
    assert band[:, 1].max() == pytest.approx(max(p.gbps_best for p in curve))
    assert any("DRAM 20 (12\u201322)" in t.get_text() for t in ax.texts)
    fig.savefig(tmp_path / "bw.png")
    assert not plot_bandwidth(_with_runs(_synthetic_profile()), show_spread=False).axes[0].collections


def _tiny_config(**_: object) -> probe.ProbeConfig:
    sweep = SweepConfig(min_ws_bytes=4 * KIB, max_ws_bytes=64 * KIB, points_per_octave=1,
                        kernels=("read", "triad"), thread_counts=(1,), timing=TINY_TIMING)
    return probe.ProbeConfig(sweep=sweep, kernel_names=("fp32_matvec", "int8_matvec"),
                             kernel_sizes=((16, 64),), kernel_timing=TINY_TIMING,
                             quick=True, sys_root=str(FIX / "sys_ryzen5_3600x"))


def test_tiny_probe_round_trips(tmp_path, monkeypatch):
    monkeypatch.setenv("TERN_TUNING_FILE", str(tmp_path / "tuning.json"))
    out = tmp_path / "host_profile.json"
    prof = probe.run_probe(_tiny_config(), out=out, progress=False, tuning=False)
    assert prof.host["stream_prefetch"]["tuning_path"] is None and not (tmp_path / "tuning.json").exists()
    assert prof.measured and prof.cache_source == "/sys"
    assert len(prof.bandwidth) == 5 * 2  # 4K..64K at 1 point/octave, two kernels
    assert {k.kernel for k in prof.kernels} == {"fp32_matvec", "int8_matvec"}
    assert len(prof.engine_runs) == 3 and all(r.rounds == 2 and r.loop_max_s >= r.loop_s for r in prof.engine_runs)
    for key in ("cpu_model", "isa", "physical_cores", "logical_cpus", "ram_bytes", "os",
                "versions", "timestamp", "read_kernel_simd"):
        assert key in prof.host
    assert all(p.repeats == 2 and len(p.runs_gbps) == 2 and p.gbps_min is not None for p in prof.bandwidth)
    assert prof.host["sweep"]["repeat_order"] == "rounds"
    assert 0.0 <= prof.host["probe_compile_s"] <= prof.host["probe_wall_s"]  # a part of the wall time
    loaded = HostProfile.load(out)
    assert loaded == prof
    assert "L3" in plateaus.format_cache_table(loaded) and "int8_matvec" in plateaus.format_kernel_table(loaded)
    assert set(plateaus.plateau_table(loaded)[1]) == {"L1", "L2", "L3", "DRAM"}


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 numba threads")
def test_a_two_thread_probe_records_where_the_threads_sit(tmp_path):
    sweep = SweepConfig(min_ws_bytes=4 * KIB, max_ws_bytes=8 * KIB, points_per_octave=1, kernels=("read",),
                        thread_counts=(1, 2), timing=TINY_TIMING)
    cfg = probe.ProbeConfig(sweep=sweep, kernel_names=(), quick=True, sys_root=str(FIX / "sys_ryzen5_3600x"),
                            op_costs=False, op_curves=False, engine_runs=False)
    out = tmp_path / "hp.json"
    prof = probe.run_probe(cfg, out=out, progress=False, tuning=False)
    trip = prof.host["core_round_trip"]
    assert trip["round_trip_ns"] > 0 and trip["far"] == (trip["round_trip_ns"] > 150)
    assert HostProfile.load(out).host["core_round_trip"] == trip
    from tern.probe.cli import cli_render

    text = cli_render({"profile_path": str(out), "cpu_model": "x", "mode": "quick", "wall_s": 1.0,
                       "read_kernel_simd": "avx2"})
    assert f"threads' round trip: {trip['round_trip_ns']:.0f} ns" in text
    assert "compiling" not in text  # no compile time given: nothing said
    compiled = cli_render({"profile_path": str(out), "cpu_model": "x", "mode": "quick", "wall_s": 163.0,
                           "compile_s": 137.6, "read_kernel_simd": "avx2"})
    assert "(quick probe, 163.0 s, 138 s of it numba compiling the kernels once" in compiled
    for bad in ("137.6", float("nan"), None, 0.4):  # malformed, absent or a warm cache: no note, no error
        text = cli_render({"profile_path": str(out), "cpu_model": "x", "mode": "quick", "wall_s": 26.5,
                           "compile_s": bad, "read_kernel_simd": "avx2"})
        assert "(quick probe, 26.5 s; read kernel uses avx2)" in text
    one = probe.run_probe(dataclasses.replace(cfg, sweep=dataclasses.replace(sweep, thread_counts=(1,))),
                          progress=False, tuning=False)
    assert "core_round_trip" not in one.host  # one thread: no pair to time


def test_cli_json_prints_one_object(tmp_path, monkeypatch, capsys):
    from tern.cli import main
    from tern.probe import cli as probe_cli

    monkeypatch.setattr(probe, "probe_config", _tiny_config)
    monkeypatch.setattr(probe_cli, "probe_config", _tiny_config)  # the CLI's own reference, bound at its import
    out = tmp_path / "hp.json"
    assert main(["probe", "--json", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert stdout.count("\n") == 1
    res = json.loads(stdout)
    assert res["profile_path"] == str(out) and out.exists()
    assert set(res["plateaus_gbps"]["1"]) == {"L1", "L2", "L3", "DRAM"}
    l1, dram = res["plateau_spread"]["1"]["L1"], res["plateau_spread"]["1"]["DRAM"]
    assert l1["points"] >= 1 and l1["runs"] == 2 * l1["points"]  # 2 repeats per point
    assert l1["gbps_min"] <= l1["gbps"] <= l1["gbps_max"] and l1["span_s"] > 0
    assert dram["points"] == 0 and dram["gbps"] is None and dram["gbps_min"] is None  # 64 KiB sweep
    assert res["cache_source"] == "/sys" and res["kernels"]
    # the streaming kernel's prefetch A/B went to the engine tuning file (tests: a private one)
    from tern.core.engine_tuning import load_tuning, tuning_path

    sp = res["stream_prefetch"]
    assert sp["tuning_path"] == str(tuning_path()) and set(sp["off_over_on"]) == {"1"}
    assert load_tuning()["stream_prefetch"] == sp["choice"] == HostProfile.load(out).host["stream_prefetch"]["stream_prefetch"]
    assert HostProfile.load(out).host["engine_policy"].get("stream_prefetch", True) is sp["choice"]["1"]
    assert load_tuning()["stream"] == sp["stream"] and set(sp["rows_over_stream"]) == {"1"}
    assert HostProfile.load(out).host["engine_policy"].get("stream", True) is sp["stream"]["1"]
    from tern.core.host_caches import host_llc_bytes

    assert "llc_bytes" not in load_tuning()  # the fixture's curve shows no VM slice: the OS's size applies
    assert res["engine_llc_bytes"] == HostProfile.load(out).host["engine_llc_bytes"] == host_llc_bytes()
    # a curve whose last cache tier is a small slice of the declared L3: the engine is told, the profile says so
    monkeypatch.setattr(probe, "measured_llc_bytes", lambda host: 5 << 20)
    assert main(["probe", "--json", "--out", str(out)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert load_tuning()["llc_bytes"] == res["engine_llc_bytes"] == 5 << 20
    assert HostProfile.load(out).host["engine_llc_bytes"] == 5 << 20
    assert "the engine streams pools past 5 MiB" in plateaus.format_cache_table(HostProfile.load(out))
    tuning_path().unlink()
    assert main(["probe", "--json", "--no-tuning", "--out", str(out)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["stream_prefetch"]["tuning_path"] is None
    assert not tuning_path().exists()
    assert res["engine_llc_bytes"] == host_llc_bytes()  # not handed to the engine: it keeps the OS's size
    assert main(["probe", "--kernels", "scale", "--out", str(out)]) == 2


def test_cli_refuses_an_unwritable_out_before_measuring(tmp_path, monkeypatch, capsys):
    """--out is checked before minutes of probing: a folder, or a path under a file, is
    refused at once (exit 2, the path named, no traceback) and nothing is measured."""
    from tern.cli import main
    from tern.probe import cli as probe_cli

    def must_not_run(*_a, **_k):
        raise AssertionError("the probe ran before --out was checked")

    monkeypatch.setattr(probe_cli, "run_probe", must_not_run)
    (tmp_path / "a_file").write_text("x")
    for out, says in ((tmp_path, "it is a folder"), (tmp_path / "a_file" / "hp.json", "cannot write")):
        assert main(["probe", "--quick", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert says in err and str(out) in err and "Traceback" not in err


def test_cpu_facts_tell_apart_hosts_of_one_brand_string(monkeypatch):
    # a VM may name a Zen 4 and a Zen 5 both "AMD EPYC": the family / model numbers differ
    import cpuinfo

    fake = {"brand_raw": "AMD EPYC", "vendor_id_raw": "AuthenticAMD", "arch": "X86_64",
            "flags": ["avx2", "avx512f"], "family": 26, "model": 2, "stepping": 1}
    monkeypatch.setattr(cpuinfo, "get_cpu_info", lambda: fake)
    facts = probe.cpu_facts()
    assert (facts["cpu_family"], facts["cpu_model_number"], facts["cpu_stepping"]) == (26, 2, 1)
    assert facts["cpu_model"] == "AMD EPYC" and facts["isa"]["avx2"] and not facts["isa"]["fma"]
    monkeypatch.setattr(cpuinfo, "get_cpu_info", lambda: {"flags": []})  # a CPU py-cpuinfo cannot read
    assert probe.cpu_facts()["cpu_family"] is None
