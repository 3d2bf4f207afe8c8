"""HostProfile JSON round trip, validation and bandwidth interpolation."""

import json

import pytest

from tern.core.host_profile import BandwidthPoint, CacheLevel, HostProfile, KernelThroughput


def make_profile():
    pts = [BandwidthPoint("read", 1, ws, bw, bw, 3) for ws, bw in
           [(4096, 200.0), (1 << 20, 100.0), (1 << 30, 25.0)]]
    pts += [BandwidthPoint("read", 2, 4096, 400.0, 400.0, 3),
            BandwidthPoint("read", 2, 1 << 30, 35.0, 35.0, 3)]
    caches = (CacheLevel(1, "Data", 32768, 2, 1), CacheLevel(2, "Unified", 1 << 20, 2, 1),
              CacheLevel(3, "Unified", 32 << 20, 1, 2))
    return HostProfile("test", True, {"cpu": "x"}, caches, "/sys", tuple(pts),
                       (KernelThroughput("fp32_matvec", 1, 1024, 1024, 50.0, 45.0, 90.0, 5),))


def test_interpolation_log_linear():
    p = make_profile()
    assert p.bandwidth_at(4096) == 200.0
    assert p.bandwidth_at(1) == 200.0  # clamped
    assert p.bandwidth_at(1 << 40) == 25.0  # clamped
    # halfway in log2 between 2^20 (100) and 2^30 (25): 2^25 -> 62.5
    assert p.bandwidth_at(1 << 25) == pytest.approx(62.5)
    assert p.bandwidth_at(1 << 30, threads=2) == 35.0
    assert p.bandwidth_at(1 << 30, threads=8) == 35.0  # nearest measured thread count
    assert p.llc_bytes == 32 << 20
    assert p.kernel_gops("fp32_matvec") == 45.0 and p.kernel_gops("nope") is None


def test_round_trip(tmp_path):
    p = make_profile()
    f = tmp_path / "h.json"
    p.save(f)
    assert HostProfile.load(f) == p


@pytest.mark.parametrize("mutate,msg", [
    (lambda d: d.update(format="other"), "not a tern host profile"),
    (lambda d: d.update(version=99), "version"),
    (lambda d: d.pop("caches"), "malformed"),
    (lambda d: d["bandwidth"][0].update(gbps_median=-1.0), "invalid bandwidth"),
])
def test_bad_profiles(tmp_path, mutate, msg):
    d = make_profile().to_dict()
    mutate(d)
    f = tmp_path / "h.json"
    f.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=msg):
        HostProfile.load(f)


def test_missing_and_garbage(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        HostProfile.load(tmp_path / "nope.json")
    f = tmp_path / "g.json"
    f.write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        HostProfile.load(f)


def test_effective_tiers_follow_the_measured_curve_not_sys():
    """A VM slice of a 480 MiB shared L3 that reads like a ~3 MiB cache: the tiers come
    from the curve (L1, L2, a small L3, DRAM), whatever /sys says."""
    from tern.core.host_profile import BandwidthPoint, CacheLevel, HostProfile
    from tern.core.host_queries import cache_marks, effective_llc_bytes, effective_tiers

    def rate(ws):
        return 170.0 if ws <= 48 << 10 else 120.0 if ws <= 1536 << 10 else 29.0 if ws <= 48 << 20 else 18.0

    pts = tuple(BandwidthPoint("read", 1, int(2 ** (e / 4)), rate(2 ** (e / 4)), rate(2 ** (e / 4)), 3)
                for e in range(48, 118))  # 4 KiB .. 768 MiB, 4 points per octave
    sys_l3 = CacheLevel(3, "Unified", 480 << 20, 1, 2)
    host = HostProfile("vm", True, {}, (sys_l3,), "/sys", pts)
    tiers = effective_tiers(host, 1)
    assert [t.name for t in tiers] == ["L1", "L2", "L3", "DRAM"]
    assert [round(t.gbps) for t in tiers] == [170, 120, 29, 18]
    assert 32 << 20 < effective_llc_bytes(host) < 64 << 20  # the measured cliff, not 480 MiB
    assert cache_marks(host)[-1][1] == effective_llc_bytes(host)
    ref = HostProfile("ref", False, {}, (sys_l3,), "published", pts)
    assert cache_marks(ref) == [("L3", 480 << 20)]  # not measured: the declared sizes


def test_the_engine_llc_is_the_measured_slice_of_a_much_larger_declared_l3():
    """measured_llc_bytes: the curve's last cache tier where it is a VM's slice (< half) of the
    declared L3, else 0; engine_llc_bytes: what a profile recorded, else the declared size (the
    engine of an older profile read the OS's)."""
    from tern.core.host_profile import BandwidthPoint, CacheLevel, HostProfile
    from tern.core.host_queries import engine_llc_bytes, measured_llc_bytes

    def curve(cliff):
        def rate(ws):
            return 170.0 if ws <= 48 << 10 else 120.0 if ws <= 1536 << 10 else 29.0 if ws <= cliff else 18.0
        return tuple(BandwidthPoint("read", 1, int(2 ** (e / 4)), rate(2 ** (e / 4)), rate(2 ** (e / 4)), 3)
                     for e in range(48, 122))  # 4 KiB .. 1.5 GiB

    caches = (CacheLevel(1, "Data", 48 << 10, 2, 1), CacheLevel(2, "Unified", 2 << 20, 2, 1),
              CacheLevel(3, "Unified", 480 << 20, 1, 2))
    vm = HostProfile("vm", True, {}, caches, "/sys", curve(100 << 20))
    assert 90 << 20 < measured_llc_bytes(vm) < 120 << 20  # the ~100 MiB slice, not 480 MiB
    assert engine_llc_bytes(vm) == 480 << 20  # nothing recorded: the engine read /sys
    as_sys = HostProfile("bare metal", True, {}, caches, "/sys", curve(480 << 20))
    assert measured_llc_bytes(as_sys) == 0  # the curve agrees with /sys: the declared size applies
    assert measured_llc_bytes(HostProfile("ref", False, {}, caches, "published", curve(100 << 20))) == 0
    no_l3 = HostProfile("l2 only", True, {}, caches[:2], "/sys", curve(100 << 20))
    assert measured_llc_bytes(no_l3) == 0  # a tier past the last declared level is not renamed a cache
    for rec, want in ((97 << 20, 97 << 20), ("97", 480 << 20), (True, 480 << 20), (-1, 480 << 20), (None, 480 << 20)):
        host = HostProfile("vm", True, {"engine_llc_bytes": rec}, caches, "/sys", curve(100 << 20))
        assert engine_llc_bytes(host) == want, rec


def test_tiers_that_read_alike_are_named_after_the_larger_cache():
    """The Intel Xeon VM: L1 (48 KiB) and L2 (2 MiB) read within 15 % of each other, so the
    curve shows one 2 MiB tier, then a ~100 MiB slice of the 480 MiB /sys L3: they are named
    L2 and L3 (after /sys), not L1 and L2 (by order)."""
    from tern.core.host_profile import BandwidthPoint, CacheLevel, HostProfile
    from tern.core.host_queries import effective_tiers

    def rate(ws):
        return 160.0 if ws <= 48 << 10 else 147.0 if ws <= 2 << 20 else 29.0 if ws <= 100 << 20 else 16.0

    pts = tuple(BandwidthPoint("read", 1, int(2 ** (e / 4)), rate(2 ** (e / 4)), rate(2 ** (e / 4)), 3)
                for e in range(48, 122))  # 4 KiB .. 1.5 GiB
    caches = (CacheLevel(1, "Data", 48 << 10, 2, 1), CacheLevel(2, "Unified", 2 << 20, 2, 1),
              CacheLevel(3, "Unified", 480 << 20, 1, 2))
    tiers = effective_tiers(HostProfile("xeon", True, {}, caches, "/sys", pts), 1)
    assert [t.name for t in tiers] == ["L2", "L3", "DRAM"]
    assert 1 << 20 < tiers[0].size_bytes < 4 << 20 and 64 << 20 < tiers[1].size_bytes < 160 << 20
    # without /sys sizes the names follow the order
    assert [t.name for t in effective_tiers(HostProfile("bare", True, {}, (), "none", pts), 1)] == ["L1", "L2", "DRAM"]
