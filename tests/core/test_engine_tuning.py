"""The engine tuning file (tern.core.engine_tuning): per-CPU entries, validation, defaults."""

from __future__ import annotations

import json

import pytest

from tern.core import engine_tuning as et


def test_default_path_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TERN_TUNING_FILE", str(tmp_path / "t.json"))
    assert et.tuning_path() == tmp_path / "t.json"
    monkeypatch.delenv("TERN_TUNING_FILE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert et.tuning_path() == tmp_path / "cache" / "tern" / "engine_tuning.json"


def test_cpu_key_reads_the_first_processor(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CPU_NAME", raising=False)
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                    "model name\t: AMD EPYC\nstepping\t: 1\n\nprocessor\t: 1\nvendor_id\t: Other\n")
    assert et.cpu_key(info) == "AuthenticAMD|25|17|1|AMD EPYC"
    assert "|" in et.cpu_key(tmp_path / "missing")  # elsewhere: the platform's strings
    # numba compiling for another CPU (e.g. AVX2-only on this one): other kernels, another choice
    monkeypatch.setenv("NUMBA_CPU_NAME", "haswell")
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx2,+fma")
    avx2 = et.cpu_key(info)
    assert avx2.startswith("AuthenticAMD|25|17|1|AMD EPYC|numba=haswell:")
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+sse4.2")
    assert et.cpu_key(info) != avx2


def test_round_trip_keeps_other_cpus(tmp_path):
    p = tmp_path / "sub" / "t.json"
    assert et.load_tuning(p, key="a") == {}
    assert et.stream_prefetch_choice(1, p) is et.DEFAULT_STREAM_PREFETCH  # no file: the default
    et.save_tuning({"stream_prefetch": False, "off_over_on": {"1": 1.1}}, p, key="a")
    et.save_tuning({"stream_prefetch": True}, p, key="b")
    assert et.load_tuning(p, key="a") == {"stream_prefetch": False, "off_over_on": {"1": 1.1}}
    assert et.load_tuning(p, key="b") == {"stream_prefetch": True}
    assert et.load_tuning(p, key="c") == {}
    et.save_tuning({"stream_prefetch": True}, p, key="a")  # a new measurement replaces the old
    assert et.load_tuning(p, key="a") == {"stream_prefetch": True}
    assert sorted(x.name for x in p.parent.iterdir()) == ["t.json"]  # no temp file left


def test_this_cpus_choice_is_what_the_engine_reads(tmp_path):
    p = tmp_path / "t.json"
    et.save_tuning({"stream_prefetch": False}, p)  # one choice for every thread count
    assert et.stream_prefetch_choice(1, p) is False and et.stream_prefetch_choice(8, p) is False
    et.save_tuning({"stream_prefetch": False}, p, key="some other cpu")
    et.save_tuning({"stream_prefetch": {"1": False, "2": True}}, p)
    assert [et.stream_prefetch_choice(t, p) for t in (1, 2, 3, 16)] == [False, True, True, True]
    assert et.stream_choice(1, p) is et.DEFAULT_STREAM is True  # no stream choice saved: the default
    et.save_tuning({"stream_prefetch": True, "stream": {"1": False, "2": True}}, p)
    assert [et.stream_choice(t, p) for t in (1, 2, 4)] == [False, True, True]
    assert et.stream_prefetch_choice(1, p) is True


def test_for_threads_takes_the_largest_measured_count_at_or_below():
    choice = {"2": True, "4": False}
    assert [et.for_threads(choice, t) for t in (1, 2, 3, 4, 9)] == [True, True, True, False, False]
    assert et.for_threads(None, 3) is et.DEFAULT_STREAM_PREFETCH and et.for_threads(None, 3, default=False) is False
    assert et.for_threads(False, 7) is False


@pytest.mark.parametrize("damage", ["not json", "format", "version", "checksum", "type"])
def test_an_invalid_file_is_ignored_with_a_warning(tmp_path, damage):
    p = tmp_path / "t.json"
    et.save_tuning({"stream_prefetch": False}, p)
    d = json.loads(p.read_text())
    if damage == "not json":
        p.write_text("{truncated")
    else:
        if damage == "format":
            d["format"] = "something-else"
        elif damage == "version":
            d["version"] = 99
        elif damage == "checksum":
            d["cpus"][et.cpu_key()]["stream_prefetch"] = True  # edited, checksum not
        elif damage == "type":
            d["cpus"][et.cpu_key()]["stream_prefetch"] = "no"
            d["sha256"] = et._checksum(d["cpus"])
        p.write_text(json.dumps(d))
    with pytest.raises(ValueError):
        et.read_tuning_file(p)
    with pytest.warns(et.TuningFileWarning, match="defaults apply"):
        assert et.stream_prefetch_choice(1, p) is et.DEFAULT_STREAM_PREFETCH
    et.save_tuning({"stream_prefetch": False}, p)  # an invalid file is replaced on the next save
    assert et.stream_prefetch_choice(1, p) is False


@pytest.mark.parametrize("name", et.CHOICES)
@pytest.mark.parametrize("bad", [1, "no", {}, {"0": True}, {"one": True}, {"1": 1}])
def test_save_rejects_a_bad_choice(tmp_path, bad, name):
    with pytest.raises(ValueError, match=f"{name} must be true / false or"):
        et.save_tuning({name: bad}, tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


def test_the_llc_the_probe_measured_reaches_the_engine_rules(tmp_path, monkeypatch):
    """llc_bytes: a positive size, validated like the choices; llc_bytes_here falls back to the
    OS's size without one."""
    from tern.core import host_caches

    p = tmp_path / "t.json"
    monkeypatch.setattr(host_caches, "host_llc_bytes", lambda: 480 << 20)
    assert et.tuning_choices(1, p)["llc_bytes"] is None
    assert et.llc_bytes_here(et.tuning_choices(1, p)) == 480 << 20
    et.save_tuning({"stream": True, "llc_bytes": 97 << 20}, p)
    assert et.tuning_choices(2, p)["llc_bytes"] == 97 << 20
    assert et.llc_bytes_here(et.tuning_choices(1, p)) == 97 << 20
    for bad in (0, -5, "97", 1.5, True):
        with pytest.raises(ValueError, match="llc_bytes must be a positive number of bytes"):
            et.save_tuning({"llc_bytes": bad}, p)
    d = json.loads(p.read_text())
    d["cpus"][et.cpu_key()]["llc_bytes"] = "lots"
    d["sha256"] = et._checksum(d["cpus"])
    p.write_text(json.dumps(d))
    with pytest.warns(et.TuningFileWarning, match="llc_bytes"):
        assert et.llc_bytes_here(et.tuning_choices(1, p)) == 480 << 20  # an invalid file: the OS's size
