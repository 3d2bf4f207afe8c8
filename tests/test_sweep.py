"""Sweeps: families, resumable records, the worker measuring a real tiny model."""

import json

import pytest

from tern.config import ModelConfig, param_counts
from tern.records import read_jsonl
from tern.roofline import synthetic_profile
from tern.sweep import (
    BUDGETS,
    SweepPoint,
    accuracy,
    experts_for_total_bytes,
    fixed_active_family,
    fixed_total_family,
    run_sweep,
)

TINY = ModelConfig(name="tiny-sweep", vocab_size=64, d_model=32, n_layers=2, attn_layers=(1,),
                   n_heads=2, d_state=4, mlp_hidden=0, moe_layers=(0, 1), n_experts=2, top_k=1,
                   expert_hidden=32, router_format="int8")


def host():
    return synthetic_profile(llc_bytes=1 << 20, cache_gbps=100.0, dram_gbps=20.0)


def test_fixed_active_family_grows_total_not_active():
    fam = fixed_active_family("30m", max_total_bytes=1e9)
    totals = [param_counts(c).total.bytes for c in fam]
    actives = [param_counts(c).active.params for c in fam]
    assert totals == sorted(totals) and totals[-1] > 0.8e9
    assert max(actives) / min(actives) < 1.05  # routers add a little
    base = BUDGETS["4m"]
    e = experts_for_total_bytes(base, 1e8)
    assert abs(param_counts(base.replace(n_experts=e)).total.bytes - 1e8) < 0.02e8


def test_fixed_total_family_grows_active():
    fam = fixed_total_family("4m", n_experts=16, top_ks=(1, 2, 4, 32))
    assert [c.top_k for c in fam] == [1, 2, 4]
    assert len({param_counts(c).total.params for c in fam}) == 1


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown sweep budget"):
        fixed_active_family("7b")
    with pytest.raises(ValueError, match="threads"):
        SweepPoint("fixed_active", "x", TINY, threads=0)


def test_resume_skips_finished_points(tmp_path):
    calls = []

    def fake_measure(path, point):
        calls.append(point.key)
        if len(calls) == 2:
            raise RuntimeError("interrupted")
        return {"tok_per_s": 100.0, "tok_per_s_min": 90.0, "tok_per_s_max": 110.0, "repeats": 3,
                "peak_rss_bytes": 1}

    pts = [SweepPoint("fixed_active", "t", TINY.replace(n_experts=e, name=f"t{e}"), 1, tokens=4)
           for e in (2, 4)]
    rec = tmp_path / "rec.jsonl"
    with pytest.raises(RuntimeError):
        run_sweep(pts, rec, tmp_path / "m", host(), measure=fake_measure, progress=False)
    assert len(read_jsonl(rec)) == 1
    calls.clear()
    rows = run_sweep(pts, rec, tmp_path / "m", host(),
                     measure=lambda p, q: {"tok_per_s": 50.0, "repeats": 3}, progress=False)
    assert [r["reused"] for r in rows] == [True, False]
    assert len(read_jsonl(rec)) == 2
    assert rows[1]["ratio"] == pytest.approx(50.0 / rows[1]["predicted_tok_per_s"])
    acc = accuracy(rows)
    assert acc["n"] == 2


@pytest.mark.slow
def test_real_worker_on_tiny_model(tmp_path):
    pts = [SweepPoint("fixed_active", "t", TINY, 1, tokens=8, repeats=3, warmup=2)]
    rows = run_sweep(pts, tmp_path / "rec.jsonl", tmp_path / "m", host(), progress=False)
    r = rows[0]
    assert r["tok_per_s"] > 0 and r["repeats"] == 3 and r["peak_rss_bytes"] > 1e6
    assert r["tok_per_s_min"] <= r["tok_per_s"] <= r["tok_per_s_max"]
    assert json.loads(json.dumps(r))["name"] == "tiny-sweep"
