"""The engine work inventory (tern.predict.inventory) and the roofline's op-cost model."""

import dataclasses

import pytest

from tern.core.config import load_config, param_counts
from tern.core.host_profile import OpCost
from tern.kernels.policy import CURRENT_POLICY, LEGACY_POLICY, PER_MATRIX_POLICY, EnginePolicy
from tern.measure.sweep import solve_efficiency
from tern.predict.inventory import HIDDEN_DENSITY, PAR_SUFFIX, WorkKey, work_inventory, work_seconds
from tern.predict.pools import two_pool
from tern.predict.roofline import predict, synthetic_profile


def _units(work, op):
    return sum(w.units for k, w in work.items() if k.op == op)


@pytest.mark.parametrize("preset", ["sandbox", "30m", "105m"])
def test_inventory_counts_every_weight_once(preset):
    # with a dense activation nothing is skipped: the matvec weights of the inventory are
    # exactly the linear-layer parameters param_counts counts
    cfg = load_config(preset).replace(activation="silu")
    g = {k: v.params for k, v in param_counts(cfg).by_group.items()}
    res, st, skip_r, skip_s = work_inventory(cfg)
    assert skip_r == 0 and skip_s == 0
    linear = g.get("mixer", 0) + g.get("mlp", 0) + g.get("shared", 0)
    rows = lambda w: _units(w, "ternary_matvec") + _units(w, "ternary_blocked") + _units(w, "ternary_skip")  # noqa: E731
    assert rows(res) == linear and rows(st) == param_counts(cfg).streamed.params
    head = g["embed"] if cfg.tie_embeddings else g["head"]
    assert _units(res, "int8_matvec") + _units(res, "fp32_matvec") + _units(res, "router_int8") \
        == head + g.get("router", 0)
    n_ssm = sum(cfg.mixer(i) == "ssm" for i in range(cfg.n_layers))
    assert _units(res, "ssm_step") == n_ssm * cfg.d_inner * cfg.d_state
    assert res[WorkKey("ssm_step")].rows == n_ssm * cfg.d_inner * cfg.dt_rank_eff  # rows: the dt projection


def test_activation_skip_reduces_down_projection():
    cfg = load_config("sandbox")
    assert cfg.activation == "drelu"
    res, st, skip_r, skip_s = work_inventory(cfg)
    rho = HIDDEN_DENSITY["drelu"]
    down = cfg.top_k * cfg.expert_hidden * cfg.d_model * sum(map(cfg.is_moe, range(cfg.n_layers)))
    assert _units(st, "ternary_skip") == pytest.approx(rho * down)
    # but every hidden unit is listed, zero or not (the skip kernel's skip_groups pass)
    listed = sum(w.inputs for k, w in st.items() if k.op == "ternary_skip")
    assert listed == cfg.top_k * cfg.expert_hidden * sum(map(cfg.is_moe, range(cfg.n_layers)))
    assert all(w.inputs == 0 for k, w in (*res.items(), *st.items()) if k.op != "ternary_skip")
    assert skip_s == pytest.approx((1 - rho) * down * 2 / 8)  # 2-bit weights left unread
    pools = two_pool(cfg)
    assert pools.streamed_skipped_bytes == pytest.approx(skip_s)


def test_large_matrices_are_costed_parallel():
    cfg = load_config("sandbox").replace(d_model=1024, n_heads=8)
    res, _, _, _ = work_inventory(cfg)
    assert any(k.split == "rows" and str(k).endswith(PAR_SUFFIX) for k in res)
    # the sandbox's matrices (64K-256K weights) stay serial under the 1M rule; a policy
    # that splits from 64K weights splits them
    small, _, _, _ = work_inventory(load_config("sandbox"))
    assert not any(k == WorkKey("ternary_matvec", "rows") for k in small)
    low, _, _, _ = work_inventory(load_config("sandbox"), policy=EnginePolicy(par_min_weights=1 << 16))
    assert WorkKey("ternary_matvec", "rows") in low
    tiny, _, _, _ = work_inventory(load_config("sandbox").replace(d_model=64, n_heads=2, vocab_size=256),
                                   policy=EnginePolicy(par_min_weights=1 << 16))
    assert not any(k.split == "rows" for k in tiny)


def test_router_is_priced_serial_as_the_engine_runs_it():
    wide = load_config("30m").replace(n_experts=512, top_k=1)  # router 512 x d_model
    res, _, _, _ = work_inventory(wide, policy=EnginePolicy(par_min_weights=0))
    n_moe = sum(map(wide.is_moe, range(wide.n_layers)))  # the engine's router_logits is one loop:
    assert res[WorkKey("fp32_matvec")].units == n_moe * 512 * wide.d_model  # serial even when all else splits


def test_attention_work_follows_context():
    cfg = load_config("sandbox")
    assert cfg.attn_layers
    a = _units(work_inventory(cfg, context=10)[0], "attention")
    b = _units(work_inventory(cfg, context=100)[0], "attention")
    assert b == pytest.approx(10 * a)


def _costs(scale=1.0):
    ops = ("ternary_matvec", "ternary_skip", "int8_matvec", "fp32_matvec", "ssm_step", "attention", "vector")
    return tuple(OpCost(op, 1, 1e-7 * scale, 2e-9 * scale, 1e-11 * scale, 3, 0.0) for op in ops)


def test_op_cost_model_is_used_and_adds_stall():
    host = synthetic_profile(32 << 20, 100.0, 20.0)
    cfg = load_config("sandbox")
    plain = predict(cfg, host)
    assert plain.model == "roofline"
    op_host = dataclasses.replace(host, op_costs=_costs())
    p = predict(cfg, op_host)
    assert p.model == "op-cost"
    for q in (p.resident, p.streamed):
        assert q.time_s == pytest.approx(q.compute_s + q.stall_s)
    res, st, _, _ = work_inventory(cfg, cfg.attn_window)
    assert p.resident.compute_s == pytest.approx(work_seconds(res, op_host))
    # cache-resident on this host: the stall is zero (bandwidth equals the op timings')
    assert p.resident.stall_s == 0
    slower = predict(cfg, dataclasses.replace(host, op_costs=_costs(2.0)))
    assert slower.tok_per_s < p.tok_per_s


def test_op_cost_model_stalls_past_the_cache():
    host = dataclasses.replace(synthetic_profile(8 << 20, 100.0, 10.0), op_costs=_costs())
    base = load_config("sandbox")
    small = predict(base, host)
    big = predict(base.replace(n_experts=512), host)  # same active bytes, far more experts
    assert big.streamed.stall_s > small.streamed.stall_s
    assert big.tok_per_s < small.tok_per_s
    assert big.streamed.stall_s > 0 and small.streamed.stall_s == 0


def test_work_seconds_none_without_a_cost():
    host = synthetic_profile(4 << 20, 100.0, 10.0)
    res, _, _, _ = work_inventory(load_config("sandbox"))
    assert work_seconds(res, host) is None


def test_solve_efficiency_recovers_the_efficiency():
    host = dataclasses.replace(synthetic_profile(4 << 20, 100.0, 10.0), op_costs=_costs())
    cfg = load_config("sandbox").replace(n_experts=512)
    cal = {"per_token_overhead_s_t1": 5e-6, "bandwidth_efficiency_t1": 0.6}
    target = predict(cfg, dataclasses.replace(host, calibration=cal)).s_per_token
    assert solve_efficiency(cfg, host, 1, 5e-6, target) == pytest.approx(0.6, rel=1e-6)
    assert solve_efficiency(cfg, host, 1, 5e-6, target * 1e3) == pytest.approx(0.05)
    assert solve_efficiency(cfg, host, 1, 5e-6, target / 1e3) == pytest.approx(1.0)


def test_time_breakdown_sums_to_the_prediction():
    from tern.predict.roofline import time_breakdown

    host = dataclasses.replace(synthetic_profile(8 << 20, 100.0, 10.0), op_costs=_costs(),
                               calibration={"per_token_overhead_s": 3e-6})
    cfg = load_config("sandbox").replace(n_experts=512)
    b = time_breakdown(cfg, host)
    assert sum(b.values()) == pytest.approx(predict(cfg, host).s_per_token)
    assert b["overhead"] == pytest.approx(3e-6) and b["stall (streamed)"] > 0 and b["ssm_step"] > 0
    with pytest.raises(ValueError, match="op costs"):
        time_breakdown(cfg, synthetic_profile(8 << 20, 100.0, 10.0))


def test_plot_time_breakdown_renders():
    import matplotlib.pyplot as plt

    from tern.predict.plots import plot_time_breakdown

    fig = plot_time_breakdown({"a": {"ssm_scan": 1e-5, "overhead": 2e-6}, "b": {"ssm_scan": 2e-5}})
    assert len(fig.axes[0].patches) == 4
    plt.close(fig)


# ---- streaming kernel rule and expert-parallel work ------------------------------------------


def test_stream_rule_follows_pools_and_llc():
    from tern.kernels.policy import STREAM_MIN_ROW_BYTES, stream_row_bytes

    small = load_config("sandbox")
    assert stream_row_bytes(small, 32 << 20) == (0, 0)  # everything fits the LLC
    assert stream_row_bytes(small, None) == (0, 0)  # unknown LLC: never
    assert stream_row_bytes(small, 1 << 10) == (STREAM_MIN_ROW_BYTES, STREAM_MIN_ROW_BYTES)
    pc = param_counts(small)
    # resident fits, resident + all experts do not: only the routed pool streams
    mid = pc.resident.bytes + pc.expert_bytes_total // 2
    assert stream_row_bytes(small, mid) == (0, STREAM_MIN_ROW_BYTES)
    assert stream_row_bytes(small, 1 << 10, stream=False) == (0, 0)  # this host's 4-row pass won: none


def test_inventory_prices_the_4_row_pass_where_the_engine_does_not_stream():
    """EnginePolicy.stream False (the probe found the 4-row pass faster from DRAM): the long
    rows of DRAM pools are priced as the 4-row pass, the same weights."""
    from dataclasses import replace

    cfg = load_config("sandbox").replace(d_model=1024, n_heads=8)
    rows = replace(CURRENT_POLICY, blocked=False)  # the blocked16 layout never streams
    res, st, _, _ = work_inventory(cfg, None, 1 << 10, rows)
    res_off, st_off, _, _ = work_inventory(cfg, None, 1 << 10, replace(rows, stream=False))
    assert any(k.op == "ternary_stream" for k in set(res) | set(st))
    assert not any(k.op == "ternary_stream" for k in set(res_off) | set(st_off))
    units = lambda *ws: sum(v.units for w in ws for k, v in w.items() if k.op.startswith("ternary"))  # noqa: E731
    assert units(res, st) == units(res_off, st_off)


def test_inventory_streams_only_long_rows_of_streamed_pools():
    from dataclasses import replace

    from tern.kernels.policy import STREAM_MAX_ROW_BYTES

    rows = replace(CURRENT_POLICY, blocked=False)  # the blocked16 layout never streams
    cfg = load_config("sandbox").replace(d_model=1024, n_heads=8)  # 256 B rows of D, 512 B of Di
    plain, _, _, _ = work_inventory(cfg, policy=rows)
    assert not any(k.op == "ternary_stream" for k in plain)
    res, st, _, _ = work_inventory(cfg, None, 1 << 10, rows)
    keys = set(res) | set(st)
    assert any(k.op == "ternary_stream" for k in keys) and any(k.op == "ternary_matvec" for k in keys)
    weights = lambda w, p: sum(v.units for k, v in w.items() if k.op.startswith(p))  # noqa: E731
    assert weights(res, "ternary_stream") + weights(res, "ternary_matvec") == weights(plain, "ternary_matvec")
    wide = load_config("sandbox").replace(d_model=8 * STREAM_MAX_ROW_BYTES, n_heads=8)  # rows past the max
    res_w, _, _, _ = work_inventory(wide, None, 1 << 10, rows)
    assert not any(k.op == "ternary_stream" for k in res_w)  # every ternary row is longer than the max


def test_expert_parallel_work_is_split_over_threads():
    from tern.predict.inventory import EP_SUFFIX, experts_parallel

    cfg = load_config("30m").replace(top_k=4, expert_hidden=1024, n_experts=16)
    assert experts_parallel(cfg, PER_MATRIX_POLICY) == 4
    assert experts_parallel(cfg.replace(top_k=1), PER_MATRIX_POLICY) == 0
    _, st, _, _ = work_inventory(cfg, policy=PER_MATRIX_POLICY)
    assert st and all(EP_SUFFIX + "4" in str(k) and k.experts == 4 for k in st)
    assert WorkKey.parse("ternary_matvec@ep4") == WorkKey("ternary_matvec", "experts", 4)
    assert WorkKey.parse("ternary_matvec@ep4").priced_at(2) == (1, 2.0)
    assert WorkKey.parse("ternary_matvec@ep3").priced_at(2) == (1, 1.5)  # 2 rounds for 3 experts
    assert WorkKey.parse("ternary_matvec@par").priced_at(2) == (2, 1.0)
    assert WorkKey.parse("vector").priced_at(2) == (1, 1.0)
    assert [str(WorkKey.parse(t)) for t in ("vector", "a@par", "a@ep3")] == ["vector", "a@par", "a@ep3"]
    with pytest.raises(ValueError):
        WorkKey("vector", "experts")  # expert-parallel work needs its expert count
    with pytest.raises(ValueError):
        WorkKey("vector", "threads")
    host = dataclasses.replace(synthetic_profile(32 << 20, 100.0, 20.0), op_costs=_costs())
    one, two = work_seconds(st, host, 1), work_seconds(st, host, 2)
    assert two == pytest.approx(one / 2)


def test_stream_cost_falls_back_to_the_matvec_cost():
    cfg = load_config("sandbox").replace(d_model=2048, n_heads=8)
    res, _, _, _ = work_inventory(cfg, None, 1 << 10)
    host = dataclasses.replace(synthetic_profile(32 << 20, 100.0, 20.0), op_costs=_costs())  # no ternary_stream
    assert work_seconds(res, host) is not None


def test_inventory_counts_rows_with_a_partial_segment():
    # d_model 384: 256 + a 128-column tail (the serial keys of the 1M rule hold every matrix)
    res, _, _, _ = work_inventory(load_config("105m"), policy=LEGACY_POLICY)
    t = res[WorkKey("ternary_matvec")]
    assert 0 < t.tails < t.rows  # in_proj rows (cols 384) have tails; out_proj rows (cols 768) do not
    res, _, _, _ = work_inventory(load_config("sandbox"))  # d_model 256, d_inner 512: none
    assert all(v.tails == 0 for k, v in res.items() if k.op.startswith("ternary"))
    attn = [v for k, v in res.items() if k.op == "attention"]  # one key, serial or items of heads (d_model 256 splits)
    assert res[WorkKey("ssm_step")].tails > 0 and len(attn) == 1 and attn[0].tails > 0  # channels, (position, head) pairs


def test_serial_bytes_stream_at_one_threads_bandwidth():
    from tern.predict.inventory import parallel_byte_share

    small = load_config("sandbox")  # under the legacy 1M rule no matrix is split: all serial
    res, _, _, _ = work_inventory(small, policy=LEGACY_POLICY)
    assert parallel_byte_share(res, 2) == 0.0 and parallel_byte_share(res, 1) == 1.0
    big = load_config("30m").replace(d_model=2048, n_heads=8)
    res_b, _, _, _ = work_inventory(big)
    assert 0.5 < parallel_byte_share(res_b, 2) <= 1.0
    # a host whose 2-thread curve is twice the 1-thread one: all-serial work gains nothing
    # from the second thread's bandwidth, so its 2-thread stall equals the 1-thread stall
    one = synthetic_profile(1 << 20, 100.0, 20.0, threads=1)
    two = synthetic_profile(1 << 20, 200.0, 40.0, threads=2)
    host = dataclasses.replace(one, bandwidth=one.bandwidth + two.bandwidth, op_costs=_costs())
    p1 = predict(small, host, threads=1, engine_policy=LEGACY_POLICY)
    p2 = predict(small, host, threads=2, engine_policy=LEGACY_POLICY)
    assert p2.resident.stall_s == pytest.approx(p1.resident.stall_s)
    low = EnginePolicy(par_min_weights=1 << 16)  # a policy that splits the sandbox's matrices
    assert predict(small, host, threads=2, engine_policy=low).resident.stall_s < p1.resident.stall_s


def test_the_pools_count_the_bytes_the_engine_reads_not_the_file_s():
    """Today's engine reads an int8 router as stored (EnginePolicy.router_int8): the pools hold
    the file's bytes. Engines before it dequantized it to fp32 at load and read 4 bytes per
    weight: rows measured with them (their record's policy) price 3 more bytes per router
    weight (less the file's per-row scales). An fp32 router reads as stored either way."""
    from conftest import SMALL

    from tern.core.config import param_counts
    from tern.kernels.policy import CURRENT_POLICY, LEGACY_POLICY
    from tern.measure.utilisation import engine_bytes_per_token
    from tern.predict.pools import engine_extra_bytes, two_pool

    moe = SMALL.replace(moe_layers=(0, 1, 2), n_experts=8, top_k=2, expert_hidden=32, mlp_hidden=0,
                        router_format="int8")
    pc = param_counts(moe)
    router = pc.by_group["router"]
    assert engine_extra_bytes(moe) == (0, 0)
    assert two_pool(moe).resident_bytes == two_pool(moe, engine_policy=CURRENT_POLICY).resident_bytes \
        == pc.resident.bytes
    assert engine_bytes_per_token(moe) == pc.active.bytes
    legacy = router.params * 4 - router.bytes
    assert engine_extra_bytes(moe, router_int8=False) == (legacy, 0)
    assert two_pool(moe, engine_policy=LEGACY_POLICY).resident_bytes == pc.resident.bytes + legacy
    assert engine_bytes_per_token(moe, router_int8=False) == pc.active.bytes + legacy
    fp32 = moe.replace(router_format="fp32")
    assert engine_extra_bytes(fp32) == engine_extra_bytes(fp32, router_int8=False) == (0, 0)
    assert two_pool(fp32).resident_bytes == param_counts(fp32).resident.bytes


def test_trio_plane_is_not_extrapolated_past_the_measured_row_ratios():
    """Three measured shapes fix per-call + per-weight + per-row terms; a matrix with more
    rows per weight than any of them (2048 x 256 against 2048 x 512) is priced at the most
    row-heavy measured ratio, one with fewer at the least: the fit is not a law beyond the
    shapes it was fitted on."""
    from tern.core.host_profile import OpCurve
    from tern.predict.stall import _trio_per_call_at

    a, b, c = 1e-7, 2e-11, 5e-9  # seconds: per call, per weight, per row (at both working sets)

    def curve(rows, cols):
        t = a + b * rows * cols + c * rows
        return OpCurve("ternary_matvec", "serial", 1, rows, cols, 1.0, (1 << 18, 1 << 29), (t, t))

    trio = (curve(256, 1024), curve(1024, 1024), curve(2048, 512))
    at = lambda w, r: _trio_per_call_at(trio, 1 << 29, w, r)  # noqa: E731
    inside = 1536 * 768
    assert at(inside, 1536) == pytest.approx(a + b * inside + c * 1536)  # within the range: the plane
    w = 2048 * 256  # 1/256 rows per weight, the most row-heavy measured is 1/512
    assert at(w, 2048) == pytest.approx(a + b * w + c * w / 512)
    assert at(w, 2048) < a + b * w + c * 2048
    w = 64 * 4096  # 1/4096 rows per weight, the least row-heavy measured is 1/1024
    assert at(w, 64) == pytest.approx(a + b * w + c * w / 1024)
