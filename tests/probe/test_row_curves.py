"""The row passes' DRAM stall against row length (tern.probe.row_curves) and its use by the
predictor (tern.core.host_queries.row_stall_factor, tern.predict.stall.curve_stall)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tern.core.host_profile import READABLE_VERSIONS, VERSION, HostProfile, OpCost, OpCurve
from tern.core.host_queries import row_stall_factor, stall_per_byte
from tern.predict.inventory import OpWork, WorkKey
from tern.predict.stall import curve_stall
from tern.probe import row_curves
from tern.probe.row_curves import (
    QUICK_ROW_BYTES,
    ROW_BYTES,
    measure_row_curves,
    reference_row_bytes,
    render_row_curves,
    row_curve_plan,
    row_shape,
)
from tern.probe.timing import TimingConfig

WS = (1 << 18, 1 << 29)
FAST = TimingConfig(min_time_s=0.002, repeats=1, warmup_s=0.0, max_calibration_s=0.01)


def row_curve(op: str, row_bytes: int, stall_ps_per_byte: float, threads: int = 1) -> OpCurve:
    """A two-point row curve whose matrices (~256 KiB) stall ``stall_ps_per_byte`` from DRAM."""
    rows, cols = row_shape(row_bytes)
    cache = 30e-12 * rows * row_bytes
    return OpCurve(op, "serial" if threads == 1 else "experts", threads, rows, cols, 1.0, WS,
                   (cache, cache + stall_ps_per_byte * 1e-12 * rows * row_bytes))


MAIN = OpCurve("ternary_matvec", "serial", 1, 1024, 1024, 1.0, WS, (1e-5, 3e-5))  # 256 B rows
MAIN_STREAM = OpCurve("ternary_stream", "serial", 1, 256, 4096, 1.0, WS, (1e-5, 3e-5))  # 1 KiB rows
ROWS = (row_curve("ternary_matvec", 256, 20.0), row_curve("ternary_matvec", 512, 30.0),
        row_curve("ternary_matvec", 1024, 40.0), row_curve("ternary_stream", 512, 10.0),
        row_curve("ternary_stream", 1024, 20.0))


def host(row_curves=ROWS, op_curves=(MAIN, MAIN_STREAM)) -> HostProfile:
    cost = OpCost("ternary_matvec", 1, call_s=0.0, row_s=0.0, unit_s=1e-11, samples=3, max_rel_err=0.0)
    return HostProfile("t", True, {}, (), "test", (), op_costs=(cost,), op_curves=op_curves, row_curves=row_curves)


def test_the_plan_times_every_row_length_and_each_curves_own():
    plan = row_curve_plan((1, 2))
    for op, lengths in ROW_BYTES.items():
        assert reference_row_bytes(op) in lengths and reference_row_bytes(op) in QUICK_ROW_BYTES[op]
        for t, split in ((1, "serial"), (2, "experts"), (2, "rows")):
            assert [rb for o, s, th, rb in plan if o == op and th == t and s == split] == list(lengths)
    assert {(s, th) for _, s, th, _ in plan} == {("serial", 1), ("experts", 2), ("rows", 2)}
    assert {th for _, _, th, _ in row_curve_plan((1, 2), quick=True)} == {1}
    assert reference_row_bytes("ternary_matvec") == 256 and reference_row_bytes("ternary_stream") == 1024
    assert row_shape(640) == (400, 2560) and row_shape(1 << 20) == (16, 4 << 20)
    with pytest.raises(ValueError, match="row_bytes"):
        row_shape(0)


def test_stall_factor_interpolates_in_row_bytes_and_holds_beyond():
    h = host()
    f = row_stall_factor
    assert f(h, "ternary_matvec", 1, 512) == pytest.approx(1.5)  # 30 / 20 ps a byte
    assert f(h, "ternary_matvec", 1, 768) == pytest.approx(1.75)  # half-way from 512 to 1024 B
    assert f(h, "ternary_matvec", 1, 4096) == pytest.approx(2.0)  # held at the longest measured
    # the 4-row pass at rows no longer than its curve's: 1.0 (the row-heavy curve shape prices them)
    assert f(h, "ternary_matvec", 1, 128) == 1.0 and f(h, "ternary_matvec", 1, 256) == 1.0
    # the streaming pass both ways of its 1 KiB curve rows
    assert f(h, "ternary_stream", 1, 512) == pytest.approx(0.5) and f(h, "ternary_stream", 1, 320) == pytest.approx(0.5)
    assert f(h, "ternary_stream", 1, 768) == pytest.approx(0.75)
    # no row curves, no curve of the op, or no curve at the reference row length: 1.0
    assert f(host(row_curves=()), "ternary_matvec", 1, 1024) == 1.0
    assert f(host(op_curves=()), "ternary_matvec", 1, 1024) == 1.0
    assert f(host(row_curves=ROWS[1:]), "ternary_matvec", 1, 1024) == 1.0
    assert f(h, "ternary_skip", 1, 1024) == 1.0
    # a reference that did not stall (compute hides the memory) cannot scale anything
    flat = (row_curve("ternary_matvec", 256, 0.0),) + ROWS[1:]
    assert f(host(row_curves=flat), "ternary_matvec", 1, 1024) == 1.0
    assert stall_per_byte(ROWS[0]) == pytest.approx(20e-12)


def test_two_threads_read_the_row_curves_of_their_split_and_fall_back_to_the_other():
    two = (row_curve("ternary_matvec", 256, 20.0, 2), row_curve("ternary_matvec", 1024, 30.0, 2))
    split_rows = tuple(dataclasses.replace(c, split="rows") for c in (row_curve("ternary_matvec", 256, 20.0, 2),
                                                                     row_curve("ternary_matvec", 1024, 24.0, 2)))
    h = host(row_curves=ROWS + two + split_rows)
    assert row_stall_factor(h, "ternary_matvec", 2, 1024) == pytest.approx(1.5)  # experts: the default
    assert row_stall_factor(h, "ternary_matvec", 2, 1024, "rows") == pytest.approx(1.2)
    assert row_stall_factor(h, "ternary_matvec", 1, 1024, "rows") == pytest.approx(2.0)  # one thread: serial
    # a profile with one of the two ways only (e.g. session 33's first): the other stands in
    assert row_stall_factor(host(row_curves=ROWS + two), "ternary_matvec", 2, 1024, "rows") == pytest.approx(1.5)
    assert row_stall_factor(host(row_curves=ROWS + split_rows), "ternary_matvec", 2, 1024) == pytest.approx(1.2)
    assert row_stall_factor(host(), "ternary_matvec", 2, 1024) == 1.0  # serial row curves only


def test_the_one_region_steps_items_are_scaled_by_the_split_rows_curves():
    """At 2 threads an "items" matrix (the one-region step splits its rows) takes the "rows" row
    curves' factor, an expert-parallel one the "experts" curves'."""
    two = (row_curve("ternary_matvec", 256, 20.0, 2), row_curve("ternary_matvec", 1024, 40.0, 2))
    split_rows = tuple(dataclasses.replace(c, split="rows") for c in (row_curve("ternary_matvec", 256, 20.0, 2),
                                                                     row_curve("ternary_matvec", 1024, 25.0, 2)))
    main2 = dataclasses.replace(MAIN, split="experts", threads=2)
    h = host(row_curves=ROWS + two + split_rows, op_curves=(MAIN, MAIN_STREAM, main2))
    flat = host(row_curves=(), op_curves=(MAIN, MAIN_STREAM, main2))
    work = OpWork(1.0, 1024.0, 4096.0 * 1024, 0.0)
    for key, factor in ((WorkKey("ternary_matvec", "items", 2), 1.25), (WorkKey("ternary_matvec", "experts", 2), 2.0)):
        plain, _ = curve_stall({key: work}, flat, 2, 1 << 30)
        scaled, _ = curve_stall({key: work}, h, 2, 1 << 30)
        assert plain > 0 and scaled == pytest.approx(factor * plain), key


def test_curve_stall_scales_each_matrix_by_its_row_length():
    """A 4-row pass over 1024 x 4096 (1 KiB rows) stalls 2x a 256 B row's per byte here; its
    curve stall (one size: the per-weight slowdown, 3x: two more per-weight costs) doubles.
    Rows of the curve's own length stay as they were."""
    long_rows = {WorkKey("ternary_matvec"): OpWork(1.0, 1024.0, 4096.0 * 1024, 0.0)}
    plain, covered = curve_stall(long_rows, host(row_curves=()), 1, 1 << 30)
    scaled, covered2 = curve_stall(long_rows, host(), 1, 1 << 30)
    assert plain == pytest.approx(1e-11 * 4096 * 1024 * 2.0) and scaled == pytest.approx(2.0 * plain)
    assert covered == covered2
    own = {WorkKey("ternary_matvec"): OpWork(1.0, 4096.0, 1024.0 * 4096, 0.0)}
    assert curve_stall(own, host(), 1, 1 << 30) == curve_stall(own, host(row_curves=()), 1, 1 << 30)


def test_a_longer_row_model_predicts_slower_with_row_curves():
    """The predictor end to end on the committed Intel Xeon profile: adding row curves in which
    every row longer than 256 B stalls 1.5x per byte slows a d_model-2560 model (640 B mixer
    rows) by more than 3 %, a d_model-1024 one (256 B rows but for its SSM's x_proj and out_proj,
    512 B) by less than 1 %."""
    from pathlib import Path

    from tern.predict.roofline import predict
    from tern.predict.toward_10b import TEN_B_SPACE

    path = Path(__file__).resolve().parents[2] / "benchmarks/hosts/intel-xeon-amx-s31/host_profile.json"
    base = HostProfile.load(path)
    rows = tuple(row_curve(op, rb, 20.0 * (1.0 if rb <= reference_row_bytes(op) else 1.5))
                 for op in ("ternary_matvec", "ternary_stream") for rb in (256, 640, 1024, 4096))
    scaled = dataclasses.replace(base, row_curves=rows)
    wide = TEN_B_SPACE.make(2560, 8, 128, 1, 1280)
    narrow = TEN_B_SPACE.make(1024, 12, 256, 8, 1024)
    assert predict(wide, scaled, 1).tok_per_s < 0.97 * predict(wide, base, 1).tok_per_s
    assert 0.99 * predict(narrow, base, 1).tok_per_s < predict(narrow, scaled, 1).tok_per_s < predict(narrow, base, 1).tok_per_s


def test_row_curves_are_measured_in_rounds_and_round_trip_in_a_profile(tmp_path, monkeypatch):
    monkeypatch.setattr(row_curves, "ROUNDS", 2)
    monkeypatch.setattr(row_curves, "ROW_BYTES", {"ternary_matvec": (256, 640), "ternary_stream": (1024,)})
    got = measure_row_curves((1, 2), progress=False, timing=FAST, dram_bytes=4 << 20)
    assert [(c.op, c.split, c.threads, c.cols // 4) for c in got] == [
        ("ternary_matvec", "serial", 1, 256), ("ternary_matvec", "serial", 1, 640), ("ternary_stream", "serial", 1, 1024),
        ("ternary_matvec", "experts", 2, 256), ("ternary_matvec", "experts", 2, 640),
        ("ternary_stream", "experts", 2, 1024), ("ternary_matvec", "rows", 2, 256), ("ternary_matvec", "rows", 2, 640),
        ("ternary_stream", "rows", 2, 1024)]
    for c in got:
        assert len(c.working_set_bytes) == 2 and c.working_set_bytes[1] <= 4 << 20
        assert all(lo <= m <= hi for lo, m, hi in zip(c.seconds_min, c.seconds, c.seconds_max, strict=True))
    prof = HostProfile("t", True, {}, (), "test", (), row_curves=tuple(got))
    prof.save(tmp_path / "p.json")
    assert HostProfile.load(tmp_path / "p.json") == prof
    assert json.loads((tmp_path / "p.json").read_text())["version"] == VERSION == 5 and 4 in READABLE_VERSIONS
    with pytest.raises(ValueError, match="dram_bytes"):
        measure_row_curves((1,), progress=False, dram_bytes=1 << 19)


def test_render_names_each_row_length_against_the_curves():
    text = render_row_curves(list(ROWS))
    assert "ternary_matvec  t1" in text and "512B:1.50" in text and "1024B:2.00" in text
    assert "ternary_stream  t1" in text and "512B:0.50" in text
    assert render_row_curves(list(ROWS[1:3])) == ""  # no reference row length: nothing to say


def test_the_row_stall_figure_draws_each_pass_and_refuses_a_profile_without(tmp_path):
    from tern.probe.plots import plot_row_stall
    from tern.probe.row_curves import row_stall_points

    pts = row_stall_points(list(ROWS))
    assert pts[("ternary_matvec", "serial", 1)] == [(256, 1.0), (512, pytest.approx(1.5)), (1024, pytest.approx(2.0))]
    assert pts[("ternary_stream", "serial", 1)] == [(512, pytest.approx(0.5)), (1024, 1.0)]
    fig = plot_row_stall(host())
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 3  # two passes and the 1.0 line
    assert "row length" in ax.get_xlabel() and "stall" in ax.get_ylabel()
    fig.savefig(tmp_path / "rows.png")
    assert (tmp_path / "rows.png").stat().st_size > 0
    with pytest.raises(ValueError, match="no row-length curves"):
        plot_row_stall(host(row_curves=()))


def test_a_malformed_row_curve_in_a_profile_file_is_a_clear_error(tmp_path):
    prof = HostProfile("t", True, {}, (), "test", (), row_curves=ROWS)
    prof.save(tmp_path / "p.json")
    d = json.loads((tmp_path / "p.json").read_text())
    d["row_curves"][0].pop("seconds")  # a field missing
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="bad.json.*malformed"):
        HostProfile.load(tmp_path / "bad.json")
    d = json.loads((tmp_path / "p.json").read_text())
    d["row_curves"][0]["seconds"] = [1e-5, float("nan")]  # a time that is not a number
    (tmp_path / "nan.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="nan.json.*finite number"):
        HostProfile.load(tmp_path / "nan.json")
