"""The predictor's pricing of the engine's one-region step (EnginePolicy.region): which work
it splits, how items and region experts are costed, the region's own frame (region_phase),
and that a prediction at one thread does not change with it."""

import dataclasses

import pytest

from tern.core.config import load_config
from tern.core.host_profile import OpCost
from tern.kernels.policy import (
    CURRENT_POLICY,
    LEGACY_POLICY,
    PER_MATRIX_POLICY,
    REGION_MIN_WEIGHTS,
    EnginePolicy,
)
from tern.predict.inventory import (
    REGION_PHASE,
    OpWork,
    WorkKey,
    region_phases,
    work_breakdown,
    work_inventory,
    work_seconds,
)
from tern.predict.roofline import predict, synthetic_profile

REGION = EnginePolicy(region=True, region_skip_split=True)
OPS = ("ternary_matvec", "ternary_skip", "int8_matvec", "fp32_matvec", "ssm_step", "attention", "vector")


def _host(phase_cost=True, threads=(1, 2)):
    costs = [OpCost(op, t, 1e-7, 2e-9, 1e-11, 3, 0.0) for op in OPS for t in threads]
    if phase_cost:
        costs += [OpCost(REGION_PHASE, 2, 5e-7, 0.0, 6e-8, 4, 0.0)]  # region entry, per phase
    return dataclasses.replace(synthetic_profile(32 << 20, 100.0, 20.0, threads=2), op_costs=tuple(costs))


def test_policy_region_fields_validate_and_old_records_read_as_per_matrix():
    assert CURRENT_POLICY.region and not LEGACY_POLICY.region and not PER_MATRIX_POLICY.region
    # as written before the region fields, plus router_int8 (today's engine reads int8 routers as int8)
    assert PER_MATRIX_POLICY.to_dict() == {"par_min_weights": 1 << 20, "router_int8": True, "blocked": True}
    assert EnginePolicy(router_int8=False).to_dict() == {"par_min_weights": 1 << 20}
    assert EnginePolicy.of_record({"engine_policy": PER_MATRIX_POLICY.to_dict()}) == PER_MATRIX_POLICY
    d = REGION.to_dict()
    assert d["region"] is True and d["region_min_weights"] == REGION_MIN_WEIGHTS
    assert EnginePolicy.of_record({"engine_policy": d}) == REGION
    # a sweep row written before the region fields existed: the per-matrix step
    assert EnginePolicy.of_record({"engine_policy": {"par_min_weights": 1 << 20}}).region is False
    assert EnginePolicy.of_record({"engine_policy": {"par_min_weights": 1 << 20}}).router_int8 is False
    for bad in (dict(region=1), dict(region="yes"), dict(region_skip_split=0), dict(region_items=0),
                dict(region_min_weights=-1), dict(region_min_weights=True), dict(router_int8=1)):
        with pytest.raises(ValueError, match="EnginePolicy"):
            EnginePolicy(**bad)


def test_region_splits_matrices_from_its_threshold_and_experts_at_any_size():
    cfg = load_config("sandbox")  # 64K-256K-weight matrices, top-4 of 16 small experts
    res, st, _, _ = work_inventory(cfg, policy=REGION)
    splits = {k.split for k in res if k.op == "ternary_matvec"}
    assert splits == {"items"}  # every mixer matrix is >= 16K weights
    assert all(k.split == "region_experts" and k.experts == cfg.top_k for k in st)
    # the per-matrix step prices the same model serial (all < 1M weights, experts < 1M)
    pm, pm_st, _, _ = work_inventory(cfg, policy=PER_MATRIX_POLICY)
    assert {k.split for k in pm} == {"serial"} and {k.split for k in pm_st} == {"serial"}
    # below the threshold: serial; the router is serial in both
    tiny = cfg.replace(d_model=64, n_heads=2, vocab_size=128, shared_hidden=32, expert_hidden=32)
    t_res, _, _, _ = work_inventory(tiny, policy=REGION)
    assert all(k.split == "serial" for k in t_res if k.op == "ternary_matvec" and t_res[k].units / t_res[k].calls
               < REGION_MIN_WEIGHTS)
    assert WorkKey("fp32_matvec") in res
    # top-1: the chosen expert's matrices are items, not expert-parallel
    _, st1, _, _ = work_inventory(cfg.replace(top_k=1), policy=REGION)
    assert any(k.split == "items" for k in st1) and not any(k.split == "region_experts" for k in st1)


def test_skip_kernel_splits_only_over_two_or_more_output_segments_in_its_simd_form():
    wide = load_config("sandbox").replace(d_model=512, n_heads=8)  # 2 segments of 256 outputs
    for policy, split in ((REGION, "items"), (dataclasses.replace(REGION, region_skip_split=False), "serial")):
        res, _, _, _ = work_inventory(wide, policy=policy)
        assert {k.split for k in res if k.op == "ternary_skip"} == {split}
    res, _, _, _ = work_inventory(load_config("sandbox").replace(d_model=256, n_heads=4), policy=REGION)
    assert {k.split for k in res if k.op == "ternary_skip"} == {"serial"}  # one segment: one item


def test_items_keys_price_and_print():
    k = WorkKey("ternary_matvec", "items", 64)
    assert str(k) == "ternary_matvec@it64" and WorkKey.parse(str(k)) == k
    assert WorkKey.parse("a@it") == WorkKey("a", "items") and str(WorkKey("a", "items")) == "a@it"
    assert WorkKey.parse("a@rep3") == WorkKey("a", "region_experts", 3)
    assert k.priced_at(1) == (1, 1.0) and k.priced_at(2) == (1, 2.0)
    assert WorkKey("a", "items", 3).priced_at(2) == (1, 1.5)  # 3 row blocks: 2 on one thread
    assert WorkKey("a", "items", 1).priced_at(4) == (1, 1.0)  # one block cannot split
    assert WorkKey("a", "region_experts", 3).priced_at(2) == (1, 1.5)
    with pytest.raises(ValueError):
        WorkKey("a", "region_experts")
    with pytest.raises(ValueError):
        WorkKey("a", "items", -1)
    # an item's call is paid by each thread at once: once per matrix; the rest halves
    host = _host()
    serial = work_inventory(load_config("sandbox"), policy=PER_MATRIX_POLICY)[0][WorkKey("ternary_blocked")]
    w = {WorkKey("ternary_blocked", "items", 64): serial}
    one, two = work_seconds(w, host, 1), work_seconds(w, host, 2)
    calls = next(iter(w.values())).calls
    assert two == pytest.approx((one - calls * 1e-7) / 2 + calls * 1e-7)


def test_split_skip_items_each_list_every_input():
    """The one-region step splits a skip down projection over output segments, and each item
    lists all its inputs (tern.kernels.region_items.skip_phase): the listing does not halve."""
    listing = 5e-10
    costs = tuple(dataclasses.replace(c, input_s=listing) if c.op == "ternary_skip" else c for c in _host().op_costs)
    host = dataclasses.replace(_host(), op_costs=costs)
    w = {WorkKey("ternary_skip", "items", 4): OpWork(1.0, 1024.0, 256.0 * 1024, 0.0, 1024.0)}
    plain = {WorkKey("ternary_skip", "items", 4): OpWork(1.0, 1024.0, 256.0 * 1024, 0.0, 0.0)}
    assert work_seconds(w, host, 1) - work_seconds(plain, host, 1) == pytest.approx(1024 * listing)
    assert work_seconds(w, host, 2) - work_seconds(plain, host, 2) == pytest.approx(1024 * listing)


def test_region_phases_are_priced_at_two_threads_only():
    cfg = load_config("sandbox")
    res, _, _, _ = work_inventory(cfg, policy=REGION)
    n = res[WorkKey(REGION_PHASE, "rows")].units
    assert n == region_phases(cfg, True) > 4 * cfg.n_layers
    host = _host()
    assert REGION_PHASE not in work_breakdown(res, host, 1)
    assert work_breakdown(res, host, 2)[REGION_PHASE] == pytest.approx(5e-7 + n * 6e-8)
    # a profile that never timed the region's frame cannot price it: the op-cost model steps back
    assert work_seconds(res, _host(phase_cost=False), 2) is None
    assert predict(cfg, _host(phase_cost=False), 2, engine_policy=REGION).model == "roofline"


def test_one_thread_prediction_is_the_same_with_the_region_policy():
    host = _host()
    for preset in ("sandbox", "30m"):
        cfg = load_config(preset)
        assert predict(cfg, host, 1, engine_policy=REGION).tok_per_s == pytest.approx(predict(cfg, host, 1).tok_per_s)
        assert predict(cfg, host, 2, engine_policy=REGION).model == "op-cost"


def test_region_phase_count_follows_the_model():
    base = load_config("sandbox")
    assert region_phases(base, False) < region_phases(base, True)  # the skip in its activation item
    silu = base.replace(activation="silu")
    assert region_phases(silu, False) == region_phases(silu, True)  # row matvec down: a phase of its own
    more = base.replace(n_layers=base.n_layers + 1)
    assert region_phases(more, True) > region_phases(base, True)


def test_breakdown_and_calibration_price_the_engine_the_profile_recorded():
    """time_breakdown and the sweep's efficiency solver price the same step as predict(): the
    profile's recorded engine (per-matrix here: a profile without a record), at 2 threads too."""
    from tern.measure.sweep import solve_efficiency
    from tern.predict.roofline import host_engine_policy, time_breakdown

    host = dataclasses.replace(_host(), calibration={"per_token_overhead_s": 3e-6})
    assert host_engine_policy(host) == LEGACY_POLICY
    cfg = load_config("sandbox").replace(d_model=512, n_heads=8)  # matrices >= 1M weights: split per matrix
    for t in (1, 2):
        assert sum(time_breakdown(cfg, host, t).values()) == pytest.approx(predict(cfg, host, t).s_per_token)
    target = predict(cfg, dataclasses.replace(host, calibration={"per_token_overhead_s_t2": 3e-6,
                                                                 "bandwidth_efficiency_t2": 0.5}), 2).s_per_token
    assert solve_efficiency(cfg, host, 2, 3e-6, target) == pytest.approx(0.5, rel=1e-5)


def test_int8_router_is_priced_as_the_recording_engine_read_it():
    """Rows of engines with router_int8 price an int8 router by the engine's router kernel
    (op router_int8); rows of older engines (and fp32 / fp16 routers) as the fp32 table those
    engines read."""
    cfg = load_config("sandbox").replace(router_format="int8")

    def router_ops(policy, c=cfg):
        res, _, _, _ = work_inventory(c, policy=policy)
        return {k.op for k in res if k.split == "serial" and k.op.endswith(("_matvec", "router_int8"))}

    assert "router_int8" in router_ops(CURRENT_POLICY)
    old = EnginePolicy(region=True, region_skip_split=True)  # a record without router_int8
    assert "router_int8" not in router_ops(old) and "fp32_matvec" in router_ops(old)
    fp32_router = cfg.replace(router_format="fp32")
    assert "router_int8" not in router_ops(CURRENT_POLICY, fp32_router)


def test_router_rows_are_items_only_for_engines_that_split_them():
    """The one-region step reads a router of >= 16K weights and > 16 rows in row ranges (a
    phase of its own); rows of engines before it price the router on one thread."""
    cfg = load_config("sandbox").replace(router_format="int8", n_experts=128)  # 128 x 256 weights
    assert cfg.n_experts * cfg.d_model >= REGION_MIN_WEIGHTS

    def int8_splits(policy, c=cfg):
        res, _, _, _ = work_inventory(c, policy=policy)
        return {k.split for k in res if k.op == "router_int8"}

    before = dataclasses.replace(CURRENT_POLICY, region_router_split=False)
    assert int8_splits(CURRENT_POLICY) == {"items"} and int8_splits(before) == {"serial"}
    moe = sum(cfg.is_moe(i) for i in range(cfg.n_layers))
    assert region_phases(cfg, True, True) == region_phases(cfg, True, False) + moe > 0
    small = cfg.replace(n_experts=16)  # 16 rows: one item, in the routing item as before
    assert region_phases(small, True, True) == region_phases(small, True, False)
    assert EnginePolicy.of_record({"engine_policy": {"region": True}}).region_router_split is False


def test_ssm_scans_are_items_only_for_engines_that_split_them():
    """The one-region step splits an SSM layer's selective scan over its channels from
    REGION_SCAN_MIN_WEIGHTS of d_inner x (dt_rank + d_state) (one more phase per SSM layer);
    rows of engines before it price the scan on one thread, and small scans stay whole."""
    from tern.kernels.policy import REGION_SCAN_MIN_WEIGHTS
    from tern.predict.inventory import scan_split

    big = load_config("sandbox").replace(d_model=1024, n_heads=8)  # d_inner 2048 x (64 + 16)
    small = load_config("sandbox")
    assert big.d_inner * (big.dt_rank_eff + big.d_state) >= REGION_SCAN_MIN_WEIGHTS
    assert small.d_inner * (small.dt_rank_eff + small.d_state) < REGION_SCAN_MIN_WEIGHTS

    def scan_splits(c, policy):
        res, _, _, _ = work_inventory(c, policy=policy)
        return {k.split for k in res if k.op == "ssm_step"}

    before = dataclasses.replace(CURRENT_POLICY, region_scan_split=False)
    assert scan_splits(big, CURRENT_POLICY) == {"items"} and scan_splits(big, before) == {"serial"}
    assert scan_splits(small, CURRENT_POLICY) == {"serial"}
    assert scan_split(big, CURRENT_POLICY) and not scan_split(big, before) and not scan_split(small, CURRENT_POLICY)
    n_ssm = sum(big.mixer(i) == "ssm" for i in range(big.n_layers))
    assert region_phases(big, True, True, scan=True) == region_phases(big, True, True) + n_ssm > 0
    assert region_phases(small, True, True, scan=True) == region_phases(small, True, True)
    assert EnginePolicy.of_record({"engine_policy": {"region": True}}).region_scan_split is False
    # priced at 2 threads: the split scan's op time is half the whole one's plus a call
    host = _host()
    whole = work_breakdown(work_inventory(big, policy=before)[0], host, 2)["ssm_step"]
    split = work_breakdown(work_inventory(big, policy=CURRENT_POLICY)[0], host, 2)["ssm_step"]
    assert split < 0.6 * whole


def test_split_flags_refuse_what_is_not_a_bool():
    for bad in (dict(region_scan_split=1), dict(region_scan_split="yes"), dict(region_router_split=None)):
        with pytest.raises(ValueError, match="EnginePolicy.region_"):
            EnginePolicy(**bad)
    with pytest.raises(ValueError, match="engine_policy must be a dict"):
        EnginePolicy.of_record({"engine_policy": {"region": True, "region_scan_splits": True}})  # a misspelt field


def test_attention_heads_are_items_only_for_engines_that_split_them():
    """The one-region step splits an attention layer's heads over the threads from
    REGION_ATTN_MIN_D (one more phase per attention layer); engines before it, smaller models
    and single-head attention keep it in one item."""
    from tern.kernels.policy import REGION_ATTN_MIN_D
    from tern.predict.phases import attn_split

    big = load_config("sandbox").replace(d_model=REGION_ATTN_MIN_D, n_heads=8)
    small = load_config("sandbox").replace(d_model=REGION_ATTN_MIN_D - 128)
    one_head = big.replace(n_heads=1)
    assert big.attn_layers and small.attn_layers

    def attn_keys(c, policy):
        res, _, _, _ = work_inventory(c, policy=policy)
        return {(k.split, k.experts) for k in res if k.op == "attention"}

    before = dataclasses.replace(CURRENT_POLICY, region_attn_split=False)
    assert attn_keys(big, CURRENT_POLICY) == {("items", 8)} and attn_keys(big, before) == {("serial", 0)}
    assert attn_keys(small, CURRENT_POLICY) == {("serial", 0)} == attn_keys(one_head, CURRENT_POLICY)
    assert attn_split(big, CURRENT_POLICY) and not attn_split(big, before) and not attn_split(small, CURRENT_POLICY)
    assert not attn_split(big, dataclasses.replace(CURRENT_POLICY, region=False))
    n_attn = len(big.attn_layers)
    assert region_phases(big, True, True, attn=True) == region_phases(big, True, True) + n_attn
    assert region_phases(small, True, True, attn=True) == region_phases(small, True, True)
    assert EnginePolicy.of_record({"engine_policy": {"region": True}}).region_attn_split is False
    # a record from before session 36 split from d_model 512: its d_model 256 attention stays one item
    legacy = EnginePolicy.of_record({"engine_policy": {"region": True, "region_attn_split": True}})
    assert legacy.region_attn_min_d == 512 > REGION_ATTN_MIN_D == CURRENT_POLICY.region_attn_min_d == 256
    assert not attn_split(big, legacy) and attn_split(big.replace(d_model=512), legacy)
    assert attn_keys(big, legacy) == {("serial", 0)}
    assert region_phases(big, True, True, attn=True, attn_min_d=512) == region_phases(big, True, True)
    from tern.kernels.ops_region import ENGINE_POLICY

    assert ENGINE_POLICY.region_attn_min_d == REGION_ATTN_MIN_D  # what the probe and the sweeps record
    assert EnginePolicy.of_record({"engine_policy": ENGINE_POLICY.to_dict()}) == ENGINE_POLICY
    host = _host()  # at 2 threads the split attention is priced at half the whole one's plus a call
    for c, bound in ((big.replace(d_model=512), 0.6), (big, 0.65)):  # the call weighs more on smaller heads
        whole = work_breakdown(work_inventory(c, policy=before)[0], host, 2)["attention"]
        split = work_breakdown(work_inventory(c, policy=CURRENT_POLICY)[0], host, 2)["attention"]
        assert 0.5 * whole < split < bound * whole
    assert work_breakdown(work_inventory(big, policy=CURRENT_POLICY)[0], host, 1)["attention"] == pytest.approx(
        work_breakdown(work_inventory(big, policy=before)[0], host, 1)["attention"])


def test_chosen_experts_items_take_one_threads_engine_context_factor(monkeypatch):
    """At 2 threads the one-region step's chosen experts (split "region_experts") are priced at
    the 1-thread engine-context factor, the rest of the compute at the 2-thread one; at 1 thread
    nothing changes. Factors 1.2 (1 thread) and 1.5 (2 threads), no overhead."""
    from tern.predict import roofline
    from tern.predict.pools import two_pool
    from tern.predict.roofline import expert_items_seconds, predict_pools

    host = _host()
    cfg = load_config("sandbox")  # top-4 of 16 experts: items at 2 threads
    pools = two_pool(cfg, 64, 32 << 20, REGION)
    items = sum(expert_items_seconds(w, host, 2) for w in (pools.resident_work, pools.streamed_work))
    total = sum(work_seconds(w, host, 2) for w in (pools.resident_work, pools.streamed_work))
    assert 0 < items < total
    assert expert_items_seconds(pools.streamed_work, host, 1) == 0.0
    assert items == pytest.approx(sum(s for k, w in pools.streamed_work.items() if k.split == "region_experts"
                                      for s in work_breakdown({k: w}, host, 2).values()))
    monkeypatch.setattr(roofline, "engine_context", lambda h, t=1: (0.0, 1.2 if t == 1 else 1.5))
    p2 = predict_pools(pools, host, 2)
    assert p2.resident.compute_s + p2.streamed.compute_s == pytest.approx((total - items) * 1.5 + items * 1.2)
    p1 = predict_pools(pools, host, 1)
    total1 = sum(work_seconds(w, host, 1) for w in (pools.resident_work, pools.streamed_work))
    assert p1.resident.compute_s + p1.streamed.compute_s == pytest.approx(total1 * 1.2)
    # the per-op breakdown applies the same factors, so it still sums to the prediction
    from tern.predict.roofline import time_breakdown

    rhost = dataclasses.replace(host, host={"engine_policy": REGION.to_dict()})
    for t in (1, 2):
        assert sum(time_breakdown(cfg, rhost, t).values()) == pytest.approx(predict(cfg, rhost, t).s_per_token)


def test_a_profile_that_timed_the_router_kernel_prices_routers_by_it():
    """A profile with the router_int8 op cost prices an int8 router by that kernel and its
    stored bytes; a profile from before (every committed host up to session 33) keeps pricing
    it as the int8 head's matvec plus the fp32 table's 3 more bytes a weight."""
    from pathlib import Path

    from tern.core.config import param_counts
    from tern.core.host_profile import HostProfile, op_cost_for
    from tern.predict.roofline import predict, router_table_bytes

    root = Path(__file__).resolve().parents[2] / "benchmarks" / "hosts" / "intel-xeon-amx-s33"
    old = HostProfile.load(root / "host_profile.json")
    assert op_cost_for(old.op_costs, "router_int8", 1) is None
    cfg = load_config("sandbox").replace(router_format="int8", n_experts=256, top_k=2, expert_hidden=64)
    head = op_cost_for(old.op_costs, "int8_matvec", 1)

    def with_router(unit_scale):
        cost = OpCost("router_int8", 1, head.call_s, head.row_s, head.unit_s * unit_scale, 5, 0.01)
        return dataclasses.replace(old, op_costs=tuple(old.op_costs) + (cost,))

    same, slow = with_router(1.0), with_router(2.0)
    assert router_table_bytes(old, CURRENT_POLICY) and not router_table_bytes(same, CURRENT_POLICY)
    p_old, p_same, p_slow = (predict(cfg, h, 1) for h in (old, same, slow))
    router = param_counts(cfg).by_group["router"]
    table = router.params * 4 - router.bytes
    assert p_old.resident.bytes_per_token - p_same.resident.bytes_per_token == table  # read as stored
    assert p_slow.s_per_token > p_same.s_per_token  # its own kernel's cost is what prices it
    extra = router.params * head.unit_s  # the doubled per-weight cost, before the engine-context factor
    assert p_slow.s_per_token - p_same.s_per_token == pytest.approx(extra, rel=0.5)
