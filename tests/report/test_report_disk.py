"""tern report plans the random models notebooks 06 and 08 write and refuses to start when
the disk cannot hold them (tern.report.disk)."""

from __future__ import annotations

import pytest

from tern.core.config import get_preset
from tern.measure import sweep_models
from tern.measure.sweep import default_points
from tern.measure.sweep_models import model_path
from tern.predict.hosts import load_reference_profile
from tern.predict.toward_10b import pick_10b, scaled_down
from tern.report.build import run_report
from tern.report.disk import report_models_plan

NOTEBOOKS = ["01_probe_host", "06_measured_vs_predicted", "08_toward_10b"]


def test_plan_has_the_sweep_the_pair_and_the_10b_pick(tmp_path):
    models = tmp_path / "models"
    smoke = report_models_plan(tmp_path, NOTEBOOKS, smoke=True)
    pick = scaled_down(pick_10b(load_reference_profile(), threads=1)[0].config, 256)
    want = {model_path(p.config, models) for p in default_points(quick=True, threads=[1])}
    want |= {model_path(get_preset(n), models) for n in ("105m", "206m")} | {model_path(pick, models)}
    assert {p for p, _ in smoke.to_write} == want
    full = report_models_plan(tmp_path, NOTEBOOKS, smoke=False)
    assert full.total_bytes > 5e9 > smoke.total_bytes  # the full sweep's models and a ~10B-total pick
    assert report_models_plan(tmp_path, ["06_measured_vs_predicted"], smoke=True).total_bytes < smoke.total_bytes
    assert not report_models_plan(tmp_path, ["01_probe_host", "05_decode_engine"], smoke=False).to_write


def test_report_refuses_before_the_first_notebook(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep_models, "free_bytes", lambda folder: 10**6)
    out = tmp_path / "rep"
    with pytest.raises(OSError, match=r"the report \(notebooks 06 and 08\) writes .* --smoke"):
        run_report(out, smoke=True, only=["06"], progress=False)
    assert not (out / "notebooks").exists() and not (out / "index.html").exists()


def test_report_cli_has_the_override(tmp_path, monkeypatch, capsys):
    from tern.cli import main

    monkeypatch.setattr(sweep_models, "free_bytes", lambda folder: 10**6)
    assert main(["report", "--smoke", "--only", "06", "--out", str(tmp_path / "r")]) == 2
    assert "free some space" in capsys.readouterr().err
    import tern.report.cli as rcli

    seen = {}
    monkeypatch.setattr(rcli, "run_report", lambda *a, **k: seen.update(k) or {"notebooks": [], "index": "", "wall_s": 0})
    main(["report", "--smoke", "--only", "06", "--out", str(tmp_path / "r"), "--no-disk-check"])
    assert seen["check_disk"] is False
