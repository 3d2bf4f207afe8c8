"""The random models a measurement writes: exact sizes, the up-front disk check, and the
sweep that deletes its models after their last point (tern.measure.sweep_models)."""

from __future__ import annotations

import errno

import pytest

from tern.core.config import ModelConfig
from tern.measure import sweep_models
from tern.measure.sweep import SweepPoint, run_sweep
from tern.measure.sweep_models import check_free_space, ensure_model, model_path, plan_models
from tern.packed.writer import random_model_bytes
from tern.predict.roofline import synthetic_profile

TINY = ModelConfig(name="tiny-disk", vocab_size=64, d_model=32, n_layers=2, attn_layers=(1,),
                   n_heads=2, d_state=4, mlp_hidden=0, moe_layers=(0, 1), n_experts=2, top_k=1,
                   expert_hidden=32, router_format="int8")
HOST = synthetic_profile(llc_bytes=1 << 20, cache_gbps=100.0, dram_gbps=20.0)
FAKE = {"tok_per_s": 100.0, "repeats": 3}


@pytest.mark.parametrize("cfg", [TINY, TINY.replace(name="tiny-disk-e5", n_experts=5, expert_hidden=48),
                                 TINY.replace(name="tiny-disk-dense", moe_layers=(), mlp_hidden=96)])
def test_planned_bytes_are_the_written_file_size(tmp_path, cfg):
    path = ensure_model(cfg, tmp_path)
    assert path == model_path(cfg, tmp_path)
    assert random_model_bytes(cfg) == path.stat().st_size


def test_plan_lists_each_missing_model_once(tmp_path):
    a, b = TINY, TINY.replace(name="tiny-disk-e4", n_experts=4)
    ensure_model(a, tmp_path)
    plan = plan_models([a, b, b, a], tmp_path)
    assert [p for p, _ in plan.to_write] == [model_path(b, tmp_path)]
    assert plan.total_bytes == plan.largest_bytes == random_model_bytes(b)
    two = plan_models([a, b], tmp_path / "empty")
    assert two.total_bytes == random_model_bytes(a) + random_model_bytes(b)
    assert two.need_bytes(keep_models=False) == max(random_model_bytes(a), random_model_bytes(b))


def test_check_refuses_with_the_figures_when_the_disk_is_short(tmp_path, monkeypatch):
    plan = plan_models([TINY, TINY.replace(name="tiny-disk-e4", n_experts=4)], tmp_path)
    need = plan.total_bytes
    monkeypatch.setattr(sweep_models, "free_bytes", lambda folder: need + 1000)
    with pytest.raises(OSError) as e:
        check_free_space(plan, headroom_bytes=2000)
    assert e.value.errno == errno.ENOSPC
    msg = str(e.value)
    assert "2 random models" in msg and "--no-keep-models" in msg and str(tmp_path) in msg
    check_free_space(plan, headroom_bytes=1000)  # fits exactly: no error
    check_free_space(plan, keep_models=False, headroom_bytes=2000)  # the largest alone fits
    with pytest.raises(OSError, match="its largest random model"):
        check_free_space(plan, keep_models=False, headroom_bytes=need)
    check_free_space(plan_models([], tmp_path), headroom_bytes=10**15)  # nothing to write: nothing to check


def test_free_bytes_of_a_folder_not_made_yet(tmp_path):
    assert sweep_models.free_bytes(tmp_path / "a" / "b") == sweep_models.free_bytes(tmp_path) > 0


def test_sweep_refuses_before_building_anything(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep_models, "free_bytes", lambda folder: 0)
    measured = []
    pts = [SweepPoint("fixed_active", "t", TINY, 1, tokens=4)]
    with pytest.raises(OSError, match="writes 1 random model"):
        run_sweep(pts, tmp_path / "rec.jsonl", tmp_path / "m", HOST, measure=lambda p, q: measured.append(p) or FAKE,
                  progress=False, read_now=None, kernel_now=None)
    assert not measured and not (tmp_path / "m").exists()


def test_sweep_without_keeping_models_deletes_each_after_its_last_point(tmp_path):
    """Two models, each measured at two thread counts; a third was on disk before the sweep
    and stays. Each built model exists while its points run and is gone after its last."""
    a, b, old = TINY, TINY.replace(name="tiny-disk-e4", n_experts=4), TINY.replace(name="tiny-disk-old", n_experts=3)
    models = tmp_path / "m"
    ensure_model(old, models)
    pts = [SweepPoint("fixed_active", "t", c, t, tokens=4) for c, t in ((a, 1), (b, 1), (old, 1), (a, 2), (b, 2))]
    name = {c.name: model_path(c, models).name for c in (a, b, old)}
    seen = []

    def measure(path, point):
        assert path.exists()
        seen.append((point.config.name, point.threads, {p.name for p in models.iterdir()}))
        return FAKE

    run_sweep(pts, tmp_path / "rec.jsonl", models, HOST, measure=measure, keep_models=False, progress=False,
              read_now=None, kernel_now=None)
    assert [s[:2] for s in seen] == [(p.config.name, p.threads) for p in pts]
    assert seen[3][2] == set(name.values())  # a's last point: a, b and the old model on disk
    assert seen[4][2] == {name[b.name], name[old.name]}  # b's last point: a deleted after its own
    assert {p.name for p in models.iterdir()} == {name[old.name]}  # b deleted too; the old model stays
    kept = tmp_path / "k"
    run_sweep(pts, tmp_path / "rec2.jsonl", kept, HOST, measure=lambda p, q: FAKE, progress=False,
              read_now=None, kernel_now=None)
    assert len(list(kept.iterdir())) == 3  # keep_models=True (the default): every model stays
