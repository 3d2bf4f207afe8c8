"""`tern bench peers` offline: shapes, llama-bench's JSONL parsed, the row schema of both
engines with a fake ``llama-bench`` on PATH, the table, the figure and the CLI."""

import dataclasses
import json
import os
import stat
import sys

import pytest

pytest.importorskip("gguf")  # the `peers` / `test` extra

from tern.cli import main as tern_main  # noqa: E402
from tern.core.records import read_jsonl  # noqa: E402
from tern.measure.peers import (  # noqa: E402
    HOW_TO_GET_LLAMA,
    SHAPES,
    PeerShape,
    dense_shape,
    find_llama_bench,
    host_activity,
    parse_llama_bench,
    run_peers,
    select_shapes,
    tern_counts,
)
from tern.measure.peers_table import latest_rows, peers_table, render_peers  # noqa: E402
from tern.measure.plots_peers import peers_rows, plot_peers, plot_utilisation  # noqa: E402
from tern.measure.utilisation import decode_utilisation  # noqa: E402
from tern.predict.roofline import synthetic_profile  # noqa: E402
from tern.probe import bandwidth  # noqa: E402
from tern.probe.bandwidth import read_reference  # noqa: E402

TINY = PeerShape("tiny", dense_shape("tiny", 256, 2, 256, 256, 4))
ROW_KEYS = {"kind", "run_id", "engine", "shape", "dims", "config", "model_file", "file_bytes", "threads",
            "tokens", "repeats", "warmup", "total_params", "active_params", "bytes_per_token",
            "working_set_bytes", "tok_per_s", "tok_per_s_min", "tok_per_s_max", "spread_rel",
            "samples_tok_per_s", "gbps_end_to_end", "read_gbps_at_ws", "bandwidth_fraction",
            "bandwidth_note", "host", "cpu", "versions", "git_commit", "timestamp"}

FAKE = '''#!{python}
import json, sys
a = sys.argv[1:]
if a == ["--help"]:
    print("usage: llama-bench [options]")
    sys.exit(0)
with open({log!r}, "a") as f:
    f.write(json.dumps(a) + "\\n")
t, n, r = (int(a[a.index(k) + 1]) for k in ("-t", "-n", "-r"))
print("llama_model_loader: loaded meta data", file=sys.stderr)
print("some banner line")
print(json.dumps({{"build_commit": "fake123", "build_number": 42, "cpu_info": "fake cpu", "n_threads": t,
                  "n_prompt": 0, "n_gen": n, "n_depth": 0, "model_size": 1000, "model_n_params": 2000,
                  "avg_ts": 101.0, "samples_ns": [1] * r, "samples_ts": [100.0 + 10 * i for i in range(r)]}}))
'''


@pytest.fixture
def fake_llama(tmp_path, monkeypatch):
    """A llama-bench stand-in on PATH that logs its arguments and prints one JSONL test."""
    d = tmp_path / "bin"
    d.mkdir()
    log = tmp_path / "llama_args.jsonl"
    exe = d / "llama-bench"
    exe.write_text(FAKE.format(python=sys.executable, log=str(log)))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    return exe, log


def fake_tern(path, point):
    assert path.exists() and path.suffix == ".tern"
    return {"tok_per_s": 200.0, "tok_per_s_min": 190.0, "tok_per_s_max": 210.0, "spread_rel": 0.1,
            "repeats": point.repeats, "samples_tok_per_s": [190.0, 200.0, 210.0], "engine": {"threads": point.threads}}


def test_shapes():
    names = [s.name for s in select_shapes()]
    assert names == ["5.6m", "28m", "86m", "1.1b", "9.7b-moe", "sandbox"]
    assert [s.name for s in select_shapes(quick=True)] == ["5.6m", "28m", "sandbox"]
    assert tern_counts(SHAPES["1.1b"].cfg)["total_params"] == pytest.approx(1.26e9, rel=0.01)
    assert tern_counts(SHAPES["9.7b-moe"].cfg)["total_params"] == pytest.approx(9.73e9, rel=0.01)
    assert tern_counts(SHAPES["5.6m"].cfg)["total_params"] == pytest.approx(5.64e6, rel=0.01)
    s = select_shapes(["105m"])[0]  # a preset: tern alone
    assert not s.llama and s.cfg.name == "105m"
    with pytest.raises(ValueError, match="unknown peers shape"):
        select_shapes(["7b"])


def test_parse_llama_bench():
    out = ('noise\n{"n_prompt": 512, "n_gen": 0, "samples_ts": [9.0]}\n'
           '{"build_commit": "abc", "build_number": 7, "n_prompt": 0, "n_gen": 64, "samples_ts": [30, 10, 20]}\n')
    r = parse_llama_bench(out)
    assert r["tok_per_s"] == 20 and r["tok_per_s_min"] == 10 and r["tok_per_s_max"] == 30
    assert r["repeats"] == 3 and r["build_commit"] == "abc" and r["spread_rel"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no generation test"):
        parse_llama_bench('{"n_prompt": 512, "n_gen": 0, "samples_ts": [1]}\n')


def test_rows_of_both_engines(tmp_path, fake_llama):
    exe, log = fake_llama
    assert find_llama_bench() == exe
    host = synthetic_profile(llc_bytes=1 << 20, cache_gbps=100.0, dram_gbps=20.0, threads=1)
    reads = []

    def read_now(ws, threads):  # the read reference, timed before each engine's run
        reads.append((ws, threads))
        return {"gbps_median": 50.0 * threads, "gbps_min": 40.0, "gbps_best": 60.0, "working_set_bytes": ws,
                "threads": threads, "repeats": 3}

    trips = iter([356.0, 53.0])
    res = run_peers([TINY], [1, 2], tmp_path / "res", tokens=64, repeats=3, warmup=4, llama_bench=exe,
                    llama_label="test build", host=host, measure_tern=fake_tern, progress=False, read_now=read_now,
                    round_trip_now=lambda: next(trips))
    rows = res["rows"]
    # the threads' round trip is timed before each 2-thread run of either engine, and only there
    assert [r.get("core_round_trip_ns") for r in rows] == [None, None, 356.0, 53.0]
    assert "core_round_trip_ns" not in rows[0]
    assert [t for _, t in reads] == [1, 1, 2, 2] and reads[0][0] == rows[0]["working_set_bytes"]
    assert reads[1][0] == rows[1]["working_set_bytes"]  # llama.cpp's own file size
    for r in rows:
        assert r["read_same_run"]["threads"] == r["threads"]
        assert r["bandwidth_fraction_same_run"] == pytest.approx(r["gbps_end_to_end"] / (50.0 * r["threads"]))
    assert [(r["engine"], r["threads"]) for r in rows] == [("tern", 1), ("llama.cpp", 1), ("tern", 2), ("llama.cpp", 2)]
    assert read_jsonl(tmp_path / "res" / "bench" / "peers.jsonl") == rows
    assert len({r["run_id"] for r in rows}) == 1 and res["note"] == "" and res["errors"] == []
    for r in rows:
        assert ROW_KEYS <= set(r), ROW_KEYS - set(r)
        assert set(r["host_activity"]) == ({"foreign_cpu_frac", "steal_frac"} if sys.platform == "linux" else set())
        assert r["gbps_end_to_end"] == pytest.approx(r["bytes_per_token"] * r["tok_per_s"] / 1e9)
        assert r["read_gbps_at_ws"] == pytest.approx(100.0)  # ~0.6 MB: inside the 1 MiB cache
        assert r["bandwidth_fraction"] == pytest.approx(r["gbps_end_to_end"] / r["read_gbps_at_ws"])
    tern, llama = rows[0], rows[1]
    assert tern["engine_bytes_per_token"] == tern["bytes_per_token"]  # fp16 head read as stored
    # tern rows carry the predictor's figure for the same engine and context (tern.measure.sweep.predicted)
    from tern.measure.sweep import predicted
    for r in rows:
        if r["engine"] == "tern":
            want = predicted(TINY.cfg, host, r["threads"], None, 64)["predicted_tok_per_s"]
            assert r["predicted_tok_per_s"] == pytest.approx(want) and r["ratio"] == pytest.approx(200.0 / want)
        else:
            assert "predicted_tok_per_s" not in r and "ratio" not in r
    assert llama["tok_per_s"] == 110.0 and llama["samples_tok_per_s"] == [100.0, 110.0, 120.0]
    assert llama["llama_cpp"]["build_commit"] == "fake123" and llama["llama_cpp"]["label"] == "test build"
    assert llama["gguf"] == {"body": "TQ2_0", "n_kv_heads": 4}
    assert llama["model_file"].endswith(".gguf") and tern["model_file"].endswith(".tern")
    assert llama["total_params"] == tern["total_params"]  # same dimensions, both files
    assert abs(llama["bytes_per_token"] / tern["bytes_per_token"] - 1) < 0.05
    args = [json.loads(x) for x in log.read_text().splitlines()]
    assert args[0][args[0].index("-p") + 1] == "0" and args[0][args[0].index("-o") + 1] == "jsonl"
    assert [a[a.index("-t") + 1] for a in args] == ["1", "2"]
    table = peers_table(rows)
    assert table[0]["by_threads"][1]["tern_over_llama"] == pytest.approx(200.0 / 110.0)
    text = render_peers(res)
    assert "tiny" in text and "1.82" in text and "now llama" in text
    assert "/pred" in text and f"{200.0 / rows[0]['predicted_tok_per_s']:.2f}" in text
    assert "threads far apart" in text and "tiny tern 2t (356 ns)" in text and "llama.cpp 2t (53 ns)" not in text  # (a busy-host line may say "(53%)")
    assert table[0]["by_threads"][2]["tern"]["fraction_now"] == rows[2]["bandwidth_fraction_same_run"]
    assert len(peers_rows(tmp_path / "res")) == 4
    fig = plot_peers(rows, host)
    assert len(fig.axes) == 2 and fig.axes[0].get_ylabel().startswith("tok/s")
    hollow = {ln.get_label(): list(ln.get_ydata()) for ln in fig.axes[0].get_lines() if "predicted" in ln.get_label()}
    assert hollow == {"tern predicted, 1 thread": [pytest.approx(rows[0]["predicted_tok_per_s"])],
                      "tern predicted, 2 threads": [pytest.approx(rows[2]["predicted_tok_per_s"])]}
    sweep = {"kind": "sweep_point", "family": "fixed_active", "budget": "30m", "threads": 1, "tok_per_s": 10.0,
             "active_bytes": 1e9, "total_bytes": 2e9}
    ax = plot_utilisation(rows + [sweep], host).axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    now = ", read timed beside the run"
    assert set(lines) == {"peers tern, 1 thread(s)", "peers tern, 2 thread(s)", "peers llama.cpp, 1 thread(s)",
                          "peers llama.cpp, 2 thread(s)", "sweep fixed_active 30m, 1 thread(s)",
                          "peers tern, 1 thread(s)" + now, "peers tern, 2 thread(s)" + now,
                          "peers llama.cpp, 1 thread(s)" + now, "peers llama.cpp, 2 thread(s)" + now}
    assert list(lines["peers tern, 2 thread(s)" + now].get_ydata()) == [
        pytest.approx(rows[2]["bandwidth_fraction_same_run"])]
    assert list(lines["sweep fixed_active 30m, 1 thread(s)"].get_ydata()) == [pytest.approx(0.5)]  # 10 of 20 GB/s
    bare = dataclasses.replace(host, bandwidth=())
    with pytest.raises(ValueError, match="host profile"):
        plot_utilisation([{k: v for k, v in r.items() if k != "bandwidth_fraction_same_run"} for r in rows], bare)
    only_now = plot_utilisation(rows, bare).axes[0]  # the fractions timed beside the runs need no profile
    labels = [ln.get_label() for ln in only_now.get_lines() if not ln.get_label().startswith("_")]
    assert len(labels) == 4 and all(lb.endswith(now) for lb in labels)


def test_per_matrix_rows_beside_tern_and_llama(tmp_path, fake_llama):
    """tern rows run the default one-region step; --per-matrix: at threads > 1 a second tern
    row, engine tern-per-matrix, measured with Engine(region=False) (the point says so); the
    table and the text add its columns. Rows of the earlier tern-region engine still render."""
    exe, _ = fake_llama
    seen = []

    def fake(path, point):
        seen.append((point.threads, point.region))
        return {**fake_tern(path, point), "tok_per_s": 300.0 if point.region else 200.0}

    res = run_peers([TINY], [1, 2], tmp_path / "res", tokens=8, repeats=3, warmup=0, llama_bench=exe,
                    measure_tern=fake, progress=False, read_now=None, per_matrix=True)
    assert seen == [(1, True), (2, True), (2, False)]
    assert [(r["engine"], r["threads"]) for r in res["rows"]] == [
        ("tern", 1), ("llama.cpp", 1), ("tern", 2), ("tern-per-matrix", 2), ("llama.cpp", 2)]
    cell = peers_table(res["rows"])[0]["by_threads"][2]
    assert cell["pm_over_tern"] == pytest.approx(200 / 300)
    assert cell["tern_over_llama"] == pytest.approx(300 / 110)  # the tern column is the default engine's
    text = render_peers(res)
    assert " per-matrix " in text.splitlines()[1] and "0.67" in text and "2.73" in text
    host = synthetic_profile(llc_bytes=1 << 20, cache_gbps=100.0, dram_gbps=20.0, threads=1)
    labels = {ln.get_label() for ln in plot_peers(res["rows"], host).axes[0].get_lines()}
    assert "tern-per-matrix, 2 threads" in labels
    plain = render_peers({**res, "rows": [r for r in res["rows"] if r["engine"] != "tern-per-matrix"]})
    assert " per-matrix " not in plain.splitlines()[1]  # no such columns without its rows
    # rows of a run from before the region step was the default: per-matrix "tern" + "tern-region"
    old = [dict(r, engine="tern-region") if r["engine"] == "tern-per-matrix" else r for r in res["rows"]]
    cell = peers_table(old)[0]["by_threads"][2]
    assert cell["region_over_tern"] == pytest.approx(200 / 300) and " region " in render_peers(
        {**res, "rows": old}).splitlines()[1]


def test_tern_alone_without_llama_or_profile(tmp_path):
    res = run_peers([TINY, SHAPES["sandbox"]], [1], tmp_path, tokens=8, repeats=1, warmup=0,
                    measure_tern=fake_tern, progress=False, read_now=None)
    assert {r["engine"] for r in res["rows"]} == {"tern"} and len(res["rows"]) == 2
    assert all("bandwidth_fraction_same_run" not in r for r in res["rows"])
    assert res["note"] == HOW_TO_GET_LLAMA and "benchmarks/README.md" in res["note"]
    assert all(r["bandwidth_fraction"] is None and "tern probe" in r["bandwidth_note"] for r in res["rows"])
    assert all("predicted_tok_per_s" not in r for r in res["rows"])  # no profile, no prediction
    assert not list((tmp_path / "models" / "peers").glob("*.gguf"))  # no GGUF without llama.cpp
    with pytest.raises(ValueError, match="tokens"):
        run_peers([TINY], [1], tmp_path, tokens=0)
    with pytest.raises(ValueError, match="threads"):
        run_peers([TINY], [0], tmp_path)


def test_read_reference_times_the_read_kernel_now(monkeypatch):
    r = read_reference(64 * 1024, 1, repeats=2, min_time_s=0.005)
    assert r["threads"] == 1 and r["repeats"] == 2 and 0 < r["working_set_bytes"] <= 64 * 1024
    assert 0 < r["gbps_min"] <= r["gbps_median"] <= r["gbps_best"]
    monkeypatch.setattr(bandwidth, "READ_REFERENCE_MAX_BYTES", 32 * 1024)  # the cap, without a 1 GiB buffer
    assert read_reference(1 << 40, 1, repeats=1, min_time_s=0.001)["working_set_bytes"] <= 32 * 1024
    with pytest.raises(ValueError, match="working_set_bytes"):
        read_reference(100, 1)
    with pytest.raises(ValueError, match="gbps_median"):
        decode_utilisation(10.0, 1e6, 1e6, 1, None, {"gbps_median": 0.0})


def test_host_activity_counts_what_others_used():
    hz, n = os.sysconf("SC_CLK_TCK"), os.cpu_count()
    before = (10.0, [1000, 0, 500, 9000, 0, 0, 0, 0], 3.0)
    after = (12.0, [1000 + 3 * hz, 0, 500 + hz, 9000, 0, 0, 0, hz // 2], 5.5)  # 4 s busy, 2.5 s the child's
    a = host_activity(before, after)
    assert a["foreign_cpu_frac"] == pytest.approx(1.5 / (2.0 * n))
    assert a["steal_frac"] == pytest.approx(0.5 / (2.0 * n))
    assert host_activity(None, after) == {}
    rows = [{"kind": "peers", "engine": "llama.cpp", "shape": "x", "dims": "d", "threads": 2, "total_params": 1,
             "bytes_per_token": 1, "tok_per_s": 1.0, "gbps_end_to_end": 1e-9, "host_activity": a}]
    text = render_peers({"rows": rows, "records": "r.jsonl"})
    assert ("disturbed" in text) == (a["foreign_cpu_frac"] > 0.05)


def test_latest_rows_keep_the_last_run():
    a = {"kind": "peers", "engine": "tern", "shape": "x", "threads": 1, "tok_per_s": 1.0}
    b = {**a, "tok_per_s": 2.0}
    assert latest_rows([a, {**a, "threads": 2}, b]) == [b, {**a, "threads": 2}]


def test_llama_failure_keeps_the_other_rows(tmp_path, fake_llama):
    exe, _ = fake_llama

    def broken(*_args):
        raise RuntimeError("llama-bench failed: bad magic")

    res = run_peers([TINY], [1], tmp_path, tokens=8, repeats=1, llama_bench=exe, measure_tern=fake_tern,
                    measure_llama=broken, progress=False)
    assert [r["engine"] for r in res["rows"]] == ["tern"] and "bad magic" in res["errors"][0]


@pytest.mark.parametrize("body, says", [
    ("just text, not a program\n", "cannot run it"),  # executable bit, no interpreter: ENOEXEC
    ("#!/bin/sh\nexit 3\n", "exited 3"),
    ("#!/bin/sh\necho hello\n", "is it llama.cpp's llama-bench"),
])
def test_a_llama_bench_that_is_not_one_is_refused_before_measuring(tmp_path, capsys, body, says):
    exe = tmp_path / "llama-bench"
    exe.write_text(body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(ValueError, match=says):
        find_llama_bench(exe)
    rc = tern_main(["bench", "peers", "--shapes", "tiny", "--threads", "1", "--llama-bench", str(exe),
                    "--results", str(tmp_path / "res")])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and "Traceback" not in err
    assert not (tmp_path / "res" / "bench" / "peers.jsonl").exists()  # nothing was measured


def test_a_llama_bench_that_vanishes_mid_run_is_a_row_error(tmp_path, fake_llama):
    """run_llama_bench turns the OSError of a binary that cannot be started into the
    RuntimeError run_peers records per row (the other rows still count)."""
    from tern.measure.peers import run_llama_bench

    exe, _ = fake_llama
    exe.unlink()
    with pytest.raises(RuntimeError, match="could not run llama-bench"):
        run_llama_bench(exe, tmp_path / "m.gguf", 1, 4, 1)


@pytest.mark.slow
def test_real_engine_and_fake_llama_through_the_cli(tmp_path, fake_llama, capsys):
    """The whole command: tern's real worker on the tiny shape, the fake llama-bench."""
    rc = tern_main(["bench", "peers", "--shapes", "tiny", "--threads", "1", "--tokens", "8", "--repeats", "2",
                    "--warmup", "2", "--results", str(tmp_path), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    tern = next(r for r in out["rows"] if r["engine"] == "tern")
    assert tern["tok_per_s"] > 0 and len(tern["samples_tok_per_s"]) == 2
    assert tern["engine_settings"]["threads"] == 1
    assert [r["engine"] for r in out["rows"]] == ["tern", "llama.cpp"]
    assert tern_main(["bench", "peers", "--shapes", "nope", "--results", str(tmp_path)]) == 2


def test_llama_bench_runs_without_the_openmp_spin_tern_set(tmp_path, monkeypatch):
    """Importing tern sets GOMP_SPINCOUNT for its own pools; llama.cpp's OpenMP build would
    inherit it, so llama-bench runs without it (libgomp's default), unless the user set it."""
    import tern
    from tern.measure.peers import run_llama_bench

    exe = tmp_path / "llama-bench"
    exe.write_text(FAKE.format(python=sys.executable, log=str(tmp_path / "log.jsonl")).replace(
        '"cpu_info": "fake cpu"', '"cpu_info": __import__("os").environ.get("GOMP_SPINCOUNT", "unset")'))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setenv("GOMP_SPINCOUNT", "20000")
    monkeypatch.setattr(tern, "USER_GOMP_SPINCOUNT", None)
    out = run_llama_bench(exe, model, 1, 4, 2)
    assert out["cpu_info"] == "unset" and out["gomp_spincount"] is None
    monkeypatch.setenv("GOMP_SPINCOUNT", "777")
    monkeypatch.setattr(tern, "USER_GOMP_SPINCOUNT", "777")
    out = run_llama_bench(exe, model, 1, 4, 2)
    assert out["cpu_info"] == "777" and out["gomp_spincount"] == "777"


def test_blocked_rows_beside_tern_and_llama(tmp_path, fake_llama):
    """blocked=True (--blocked): at every thread count a tern-blocked16 row measured with
    Engine(layout="blocked16") (the point says so, and its key differs); the table and text add
    blocked / llama.cpp and blocked / tern."""
    from tern.measure.sweep import SweepPoint

    exe, _ = fake_llama
    seen = []

    def fake(path, point):
        seen.append((point.threads, point.layout))
        return {**fake_tern(path, point), "tok_per_s": 330.0 if point.layout == "blocked16" else 300.0}

    res = run_peers([TINY], [1, 2], tmp_path / "res", tokens=8, repeats=3, warmup=0, llama_bench=exe,
                    measure_tern=fake, progress=False, read_now=None, blocked=True)
    assert seen == [(1, "auto"), (1, "blocked16"), (2, "auto"), (2, "blocked16")]
    assert [r["engine"] for r in res["rows"]] == ["tern", "tern-blocked16", "llama.cpp"] * 2
    cell = peers_table(res["rows"])[0]["by_threads"][1]
    assert cell["blk_over_tern"] == pytest.approx(1.1) and cell["blk_over_llama"] == pytest.approx(330 / 110)
    assert " blocked16 " in render_peers(res).splitlines()[1]
    from tern.measure.plots_peers import plot_peers

    labels = {ln.get_label() for ln in plot_peers(res["rows"]).axes[0].get_lines()}
    assert "tern-blocked16, 1 thread" in labels  # the figure draws them too
    a = SweepPoint("peers", "x", TINY.cfg, 1)
    assert a.key != SweepPoint("peers", "x", TINY.cfg, 1, layout="blocked16").key
    with pytest.raises(ValueError, match="layout one of"):
        SweepPoint("peers", "x", TINY.cfg, 1, layout="cols")


def test_rows_layout_rows_beside_the_default(tmp_path, fake_llama):
    """rows_layout=True (--rows-layout): a tern-rows row per thread count measured with Engine(layout="rows"),
    the default's rows with layout "auto"; the table and text add rows / llama.cpp and rows / tern."""
    exe, _ = fake_llama
    seen = []

    def fake(path, point):
        seen.append(point.layout)
        return {**fake_tern(path, point), "tok_per_s": 200.0 if point.layout == "rows" else 300.0}

    res = run_peers([TINY], [1], tmp_path / "res", tokens=8, repeats=3, warmup=0, llama_bench=exe,
                    measure_tern=fake, progress=False, read_now=None, rows_layout=True)
    assert seen == ["auto", "rows"] and [r["engine"] for r in res["rows"]] == ["tern", "tern-rows", "llama.cpp"]
    cell = peers_table(res["rows"])[0]["by_threads"][1]
    assert cell["rows_over_tern"] == pytest.approx(2 / 3) and cell["rows_over_llama"] == pytest.approx(200 / 110)
    assert " rows " in render_peers(res).splitlines()[1]


def test_a_host_profile_named_on_the_command_line_must_exist_and_load(tmp_path, capsys):
    """--host names the profile the rows' bandwidth fractions and predictions come from: a path that is not
    there, or not a profile, is a clear error before anything is measured (no traceback, nothing written)."""
    missing = tmp_path / "nope.json"
    rc = tern_main(["bench", "peers", "--shapes", "tiny", "--no-llama", "--results", str(tmp_path / "r"),
                    "--host", str(missing)])
    err = capsys.readouterr().err
    assert rc == 2 and "no such host profile" in err and "Traceback" not in err
    assert not (tmp_path / "r" / "bench").exists()
    bad = tmp_path / "bad.json"
    bad.write_text('{"label": "not a profile"', encoding="utf-8")
    rc = tern_main(["bench", "peers", "--shapes", "tiny", "--no-llama", "--results", str(tmp_path / "r"),
                    "--host", str(bad)])
    err = capsys.readouterr().err
    assert rc == 2 and "tern bench: error" in err and "Traceback" not in err
    assert not (tmp_path / "r" / "bench").exists()
