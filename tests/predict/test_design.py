"""Design search: configs it returns meet the target and fit RAM, the active budget is
right by hand on a synthetic host, `tern design` runs."""

import dataclasses
import json

import pytest

from tern.core.config import param_counts
from tern.predict.design import (
    SearchSpace,
    active_budget_for,
    budgets_by_threads,
    host_ram_bytes,
    render_budgets,
    search,
)
from tern.predict.hosts import load_reference_profile
from tern.predict.roofline import predict, synthetic_profile

MIB = 1 << 20
SMALL = SearchSpace(d_model=(256, 512), n_layers=(4, 8), n_experts=(8, 32), top_k=(1, 4),
                    expert_hidden_ratio=(0.5, 1.0), vocab_size=1024, attn_every=4, attn_window=128,
                    head_dim=64, embed_format="fp32")


def test_space_builds_real_configs():
    cfgs = list(SMALL.configs("tq1_0"))
    assert len(cfgs) == SMALL.size == 2 * 2 * 2 * 2 * 2
    c = SMALL.make(512, 8, 32, 4, 256, "tq1_0")
    assert c.attn_layers == (3, 7) and c.n_heads == 8 and c.expert_format == "tq1_0"
    assert c.moe_layers == tuple(range(8)) and c.shared_hidden == 256
    with pytest.raises(ValueError, match="head_dim"):
        SearchSpace(d_model=(100,))
    with pytest.raises(ValueError, match="top_k"):
        SearchSpace(top_k=())


def test_space_dt_format():
    """The grid's SSM dt projections in fp16: every config carries it, fewer active bytes; an unknown
    format is refused when the space is built, not in the middle of a search."""
    from tern.core.config import param_counts

    fp16 = SearchSpace(d_model=(256,), dt_format="fp16", head_dim=64)
    c16, c32 = fp16.make(256, 4, 8, 2, 128), SMALL.make(256, 4, 8, 2, 128)
    assert c16.dt_format == "fp16" and SMALL.dt_format == "fp32" == c32.dt_format
    assert param_counts(c16).active.bytes < param_counts(c16.replace(dt_format="fp32")).active.bytes
    with pytest.raises(ValueError, match="dt_format"):
        SearchSpace(dt_format="int8")


def test_search_returns_configs_meeting_target_and_ram():
    host = synthetic_profile(4 * MIB, 100.0, 20.0)
    target, ram = 3000.0, 40 * MIB
    found = search(host, target, ram, "ternary2", space=SMALL)
    assert found, "the small space has configs that reach 3000 tok/s"
    assert len(found) < SMALL.size  # the target and the RAM limit both cut
    for c in found:
        p = predict(c.config, host)
        assert p.tok_per_s >= target and p.tok_per_s == pytest.approx(c.tok_per_s)
        pc = param_counts(c.config)
        assert c.total_params == pc.total.params and c.active_params == pc.active.params
        assert c.ram_needed_bytes == pc.total.bytes + pc.state_bytes + p.kv_bytes <= ram
    totals = [c.total_params for c in found]
    assert totals == sorted(totals, reverse=True)
    # every config left out misses the target or the RAM
    kept = {c.config.name for c in found}
    for cfg in SMALL.configs("ternary2"):
        if cfg.name not in kept:
            p = predict(cfg, host)
            assert p.tok_per_s < target or p.total_bytes + p.state_bytes + p.kv_bytes > ram
    lo, hi = 2e7, 6e7
    assert all(lo <= c.total_params <= hi for c in search(host, target, ram, space=SMALL, total_params_range=(lo, hi)))
    with pytest.raises(ValueError, match="target"):
        search(host, 0, ram, space=SMALL)


def test_active_budget_by_hand_when_dram_bound():
    # LLC 1 MiB, DRAM 10 GB/s: at 100 tok/s a token may read 10 GB/s x 10 ms = 1e8 bytes,
    # i.e. 4e8 ternary2 weights at 2 bits each
    host = synthetic_profile(MIB, 100.0, 10.0)
    b = active_budget_for(host, 100.0, 10e9, "ternary2", space=False)
    assert b.active_bytes_max == pytest.approx(1e8, rel=1e-4)
    assert b.active_params_max == pytest.approx(4e8, rel=1e-4)
    assert b.bandwidth_gbps == pytest.approx(10.0) and b.config is None
    # with a fixed overhead of 2 ms only 8 ms are left for the bytes
    host2 = synthetic_profile(MIB, 100.0, 10.0)
    host2 = dataclasses.replace(host2, calibration={"per_token_overhead_s": 2e-3})
    assert active_budget_for(host2, 100.0, 10e9, space=False).active_bytes_max == pytest.approx(8e7, rel=1e-4)
    # out of reach (overhead alone is slower than the target) and a dense model that fits
    assert active_budget_for(host2, 1000.0, 10e9, space=False).active_bytes_max == 0
    dense = active_budget_for(host, 1.0, 1e6, space=False)
    assert dense.active_params_max == pytest.approx(1e6) and dense.notes


def test_budget_picks_a_config_near_the_total():
    host = synthetic_profile(4 * MIB, 100.0, 20.0)
    b = active_budget_for(host, 3000.0, 4e7, "ternary2", space=SMALL, tolerance=0.5, ram_bytes=1 << 40)
    assert b.config is not None and b.n_candidates >= 1
    assert 4e7 / 1.5 <= b.prediction.total_params <= 4e7 * 1.5 and b.prediction.tok_per_s >= 3000.0
    assert b.prediction.active_bytes <= b.active_bytes_max * 1.05  # real configs spend no more than the budget
    assert "best config" in render_budgets([b])


@pytest.mark.slow
def test_reference_pc_10b_at_100_tok_per_s():
    ref = load_reference_profile()
    assert host_ram_bytes(ref) == 32 << 30
    b1, b6 = budgets_by_threads(ref, 100.0, 10e9, "ternary2", threads=(1, 6))
    # DRAM bound: 28 GB/s (1 thread, published) and 40 GB/s (6 threads, estimate) x 10 ms
    assert b1.active_bytes_max == pytest.approx(2.8e8, rel=1e-3)
    assert b6.active_bytes_max == pytest.approx(4.0e8, rel=1e-3)
    for b in (b1, b6):
        assert b.config is not None and b.prediction.tok_per_s >= 100.0
        assert 10e9 / 1.2 <= b.prediction.total_params <= 10e9 * 1.2


def test_cli_design_json(capsys):
    from tern.cli import main

    assert main(["design", "--reference", "--threads", "1", "6", "--no-search", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [b["threads"] for b in out["budgets"]] == [1, 6]
    assert out["budgets"][0]["active_bytes_max"] == pytest.approx(2.8e8, rel=1e-3)
    assert out["budgets"][1]["active_bytes_max"] > out["budgets"][0]["active_bytes_max"]
