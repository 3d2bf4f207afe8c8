"""Every committed host (benchmarks/hosts/<label>/) predicted again from its own profile,
probe only: a change to the prediction model that breaks a host you are not on fails here.

Targets (the prediction issue): >= 95 % of sweep points within +-20 %, median
|measured / predicted - 1| <= 7 %, the 105m / 206m pair and the 10B pick within +-15 %.
"""

from __future__ import annotations

import json

import pytest

from tern.measure.hosts import (
    accuracy_report,
    hosts_root,
    load_hosts,
    region_of,
    repredict,
    save_host,
)

HOSTS = load_hosts()
WITHIN_SHARE = 0.95
MEDIAN_ABS_ERR = 0.07
NAMED_WITHIN = 0.15  # 105m, 206m and the 10B pick


def test_hosts_are_committed():
    assert hosts_root().is_dir() and HOSTS, "benchmarks/hosts/ holds no committed host"
    for h in HOSTS:
        assert h.profile.op_costs and h.profile.op_curves, f"{h.label}: profile without op costs / curves"
        assert len(h.rows) >= 20, f"{h.label}: only {len(h.rows)} measured points"
        assert {int(r['threads']) for r in h.rows} >= {1}, h.label


@pytest.mark.parametrize("host", HOSTS, ids=[h.label for h in HOSTS])
def test_probe_only_prediction_meets_the_targets(host):
    pts = repredict(host.rows, host.profile)
    sweep = [p for p in pts if p["family"] in ("fixed_active", "fixed_total")]
    rep = accuracy_report(sweep)
    worst = ", ".join(f"{w['name']} t{w['threads']} {w['ratio']:.2f}" for w in rep["worst"])
    assert rep["within_20pct"] >= WITHIN_SHARE, (host.label, rep["within_20pct"], worst)
    assert rep["median_abs_err"] <= MEDIAN_ABS_ERR, (host.label, rep["median_abs_err"], worst)
    named = [p for p in pts if p["family"] in ("preset", "10b")]
    for p in named:
        assert abs(p["ratio"] - 1) <= NAMED_WITHIN, (host.label, p["name"], p["threads"], p["ratio"])


def test_regions_follow_the_measured_last_cache_tier():
    llc = 32 << 20
    assert region_of(1 << 20, llc) == "cache-resident"
    assert region_of(40 << 20, llc) == "cache edge"
    assert region_of(65 << 20, llc) == "DRAM-bound"
    assert region_of(1 << 20, 0) == "DRAM-bound"  # no cache tier measured


def test_accuracy_report_on_hand_made_points():
    pts = [{"name": n, "threads": 1, "ratio": r, "region": reg}
           for n, r, reg in (("a", 1.0, "cache-resident"), ("b", 1.1, "cache-resident"),
                             ("c", 0.7, "DRAM-bound"), ("d", 1.25, "cache edge"))]
    rep = accuracy_report(pts, worst=2)
    assert rep["n"] == 4 and rep["within_20pct"] == pytest.approx(0.5)
    assert rep["median_abs_err"] == pytest.approx(0.175)  # |errors| 0, 0.1, 0.25, 0.3
    assert [w["name"] for w in rep["worst"]] == ["c", "d"]
    assert rep["by_region"]["cache-resident"]["within_20pct"] == 1.0
    assert rep["by_region"]["DRAM-bound"]["within_20pct"] == 0.0


def test_save_host_keeps_measurements_not_predictions(tmp_path):
    h = HOSTS[0]
    rows = [dict(r, kind="sweep_point", predicted_tok_per_s=1.0, ratio=9.9) for r in h.rows[:3]]
    rows.append({"kind": "calibration", "x": 1})
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    folder = save_host("some-host", hosts_root() / h.label / "host_profile.json", src, root=tmp_path / "hosts")
    back = load_hosts(tmp_path / "hosts")
    assert [b.label for b in back] == ["some-host"] and folder.name == "some-host"
    assert len(back[0].rows) == 3 and all("ratio" not in r and "predicted_tok_per_s" not in r for r in back[0].rows)
    assert back[0].profile == h.profile
    with pytest.raises(ValueError):
        save_host("../escape", hosts_root() / h.label / "host_profile.json", src, root=tmp_path)
