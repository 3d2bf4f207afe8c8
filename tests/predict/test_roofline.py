"""Two-pool roofline: hand-counted bytes of a tiny config, hand-computed predictions on a
synthetic host, monotonicity, the knee, 105m vs 206m, the reference profile, plots, the
explorer and `tern predict`."""

import json
import math
import random

import pytest

from tern.core.config import PRESETS, ModelConfig, param_counts, tensor_specs
from tern.core.host_profile import BandwidthPoint, CacheLevel, HostProfile, KernelThroughput
from tern.core.host_queries import (
    bandwidth_gbps,
    cache_capacity_bytes,
    kernel_gops_for,
    llc_capacity_bytes,
    memory_roof,
)
from tern.predict.hosts import (
    REFERENCE_LABEL,
    build_reference_profile,
    load_reference_profile,
    resolve_host,
)
from tern.predict.pools import TwoPool, two_pool, two_pool_from_params
from tern.predict.roofline import predict, predict_pools, sweep_active, sweep_total, synthetic_profile
from tern.predict.tables import predict_table, render_prediction

MIB, GIB = 1 << 20, 1 << 30

# d_model 8, layer 0 SSM, layer 1 attention, a tiny MoE (4 experts x hidden 4, top-2, one
# shared expert of hidden 4) in both layers, vocab 16, tied fp32 embedding, ternary2 linears.
TINY = ModelConfig(name="tiny", vocab_size=16, d_model=8, n_layers=2, attn_layers=(1,), n_heads=2,
                   attn_window=4, d_state=2, expand=2, d_conv=2, mlp_hidden=0, moe_layers=(0, 1),
                   n_experts=4, top_k=2, expert_hidden=4, n_shared=1, shared_hidden=4)


def test_tiny_tensor_bytes_by_hand():
    nb = {s.name: (s.numel, s.nbytes, s.pool) for s in tensor_specs(TINY)}
    # ternary2: ceil(n * 2 / 8) payload bytes + 4 bytes of fp32 scale per output row
    assert nb["layers.0.mixer.in_proj.weight"] == (256, 64 + 32 * 4, "resident")  # (32, 8)
    assert nb["layers.0.mixer.x_proj.weight"] == (80, 20 + 5 * 4, "resident")  # (dt_rank 1 + 2*2, 16)
    assert nb["layers.0.mixer.out_proj.weight"] == (128, 32 + 8 * 4, "resident")  # (8, 16)
    assert nb["layers.0.mixer.A_log"] == (32, 128, "resident")  # fp32 (16, 2)
    assert nb["layers.1.mixer.qkv.weight"] == (192, 48 + 24 * 4, "resident")  # (24, 8)
    assert nb["layers.0.ffn.router.weight"] == (32, 128, "resident")  # fp32 (4, 8)
    assert nb["layers.0.ffn.shared.down"] == (32, 8 + 8 * 4, "resident")  # (1, 8, 4)
    assert nb["layers.0.ffn.experts.gate"] == (128, 32 + 16 * 4, "streamed")  # (4, 4, 8)
    assert nb["layers.0.ffn.experts.down"] == (128, 32 + 32 * 4, "streamed")  # (4, 8, 4)
    assert nb["embed.weight"] == (128, 512, "table")


def test_tiny_param_counts_by_hand():
    pc = param_counts(TINY)
    # layer 0 resident: norms 16, in_proj 256, conv 32+16, x_proj 80, dt_proj 16+16, A_log 32,
    # D 16, out_proj 128, router 32, shared 3 x 32 = 736 params;
    # bytes 64 (norms) + 192 + 192 + 40 + 128 + 128 + 64 + 64 + 128 + (24 + 24 + 40) = 1088
    # layer 1 resident: norms 16, qkv 192, out 64, router 32, shared 96 = 400 params;
    # bytes 64 + 144 + 48 + 128 + 88 = 472. Experts per layer: 384 params, 96 + 96 + 160 = 352 B;
    # top-2 of 4: 192 params, 48 + 48 + 80 = 176 B. Tied table: 128 params, 512 B; norm_f 8, 32 B.
    assert pc.per_layer[0]["resident"].params == 736 and pc.per_layer[0]["resident"].bytes == 1088
    assert pc.per_layer[1]["resident"].params == 400 and pc.per_layer[1]["resident"].bytes == 472
    assert pc.per_layer[0]["streamed"].params == 192 and pc.per_layer[0]["streamed"].bytes == 176
    assert (pc.total.params, pc.total.bytes) == (128 + 736 + 384 + 400 + 384 + 8, 2808)
    assert (pc.resident.params, pc.resident.bytes) == (1272, 2104)
    assert (pc.streamed.params, pc.streamed.bytes) == (384, 352)
    assert (pc.active.params, pc.active.bytes) == (1656, 2456)
    assert pc.expert_bytes_total == 704
    assert pc.state_bytes == 1 * 16 * (2 + 2 - 1) * 4  # one SSM layer: (Di, N) state + (Di, K-1) conv tail
    assert pc.kv_bytes(3, TINY) == 3 * 2 * 8 * 4 and pc.kv_bytes(1000, TINY) == 4 * 64  # window 4
    # untied: one embedding row per token plus the fp32 head
    un = param_counts(TINY.replace(tie_embeddings=False))
    assert un.resident.params == 1272 - 128 + 8 + 128 and un.total.params == 2040 + 128


def test_two_pool_of_tiny_matches_counts():
    tp = two_pool(TINY, context=3)
    assert (tp.resident_bytes, tp.streamed_bytes, tp.expert_bytes_total) == (2104, 352, 704)
    assert (tp.state_bytes, tp.kv_bytes, tp.total_bytes) == (192, 3 * 64, 2808)
    assert (tp.total_params, tp.active_params) == (2040, 1656)
    assert tp.footprint_bytes == 2104 + 352 + 192 + 192 and tp.hot_bytes == 2104 + 704 + 192 + 192
    # ops: 2 per active weight (streamed: the top-2 experts), plus the scan and attention
    assert tp.streamed_ops == {"ternary2": 2.0 * 384}
    assert tp.resident_ops["ternary2"] == 2.0 * (256 + 80 + 128 + 192 + 64 + 2 * 96)
    # fp32: tied head 128, routers 2 x 32, SSM aux 32+16+16+16+32+16, five norms of 8
    scan, attn = 6.0 * 16 * 2, 4.0 * 8 * 3
    assert tp.resident_ops["fp32"] == pytest.approx(2.0 * (128 + 64 + 128 + 40) + scan + attn)


def two_point_host(kernels=(), calibration=None):
    """Read curve: 100 GB/s at 1 MiB, 10 GB/s at 1 GiB (log-linear between); L3 of 2 MiB."""
    pts = (BandwidthPoint("read", 1, MIB, 100.0, 100.0, 3), BandwidthPoint("read", 1, GIB, 10.0, 10.0, 3))
    return HostProfile("two-point", True, {}, (CacheLevel(3, "Unified", 2 * MIB, 1, 1),), "test", pts,
                       tuple(kernels), calibration or {})


def pools_at_the_points():
    # footprint exactly 1 MiB (resident 0.75 MiB + streamed 0.25 MiB), whole model exactly 1 GiB
    return TwoPool("p", 3 * MIB // 4, MIB // 4, GIB - 3 * MIB // 4)


def test_prediction_by_hand_on_two_point_host():
    p = predict_pools(pools_at_the_points(), two_point_host())
    # resident at its reuse distance (1 MiB: 100 GB/s), streamed at the whole model (1 GiB: 10 GB/s)
    s = (3 * MIB / 4) / 100e9 + (MIB / 4) / 10e9
    assert p.s_per_token == pytest.approx(s) and p.tok_per_s == pytest.approx(1 / s)
    assert (p.resident.bound, p.streamed.bound) == ("L3", "DRAM")
    assert p.resident.bandwidth_gbps == 100.0 and p.streamed.bandwidth_gbps == 10.0
    assert p.streamed.working_set_bytes == GIB and p.resident.working_set_bytes == MIB
    whole = predict_pools(pools_at_the_points(), two_point_host(), policy="whole")
    assert whole.s_per_token == pytest.approx(MIB / 10e9) and whole.resident.bound == "DRAM"
    # between the points: log-linear, halfway (2^25 bytes) -> 55 GB/s
    assert bandwidth_gbps(two_point_host(), 1 << 25) == pytest.approx(55.0)


def test_calibration_and_compute_roof_by_hand():
    host = two_point_host(calibration={"per_token_overhead_s": 1e-5, "bandwidth_efficiency": 0.5})
    p = predict_pools(pools_at_the_points(), host)
    s = 2 * ((3 * MIB / 4) / 100e9 + (MIB / 4) / 10e9) + 1e-5
    assert p.s_per_token == pytest.approx(s) and p.resident.bandwidth_gbps == 50.0
    k = KernelThroughput("ternary_lut", 1, 1024, 1024, 1.0, 1.0, 1.0, 3)  # 1 Gops/s
    pools = TwoPool("c", 3 * MIB // 4, MIB // 4, GIB - 3 * MIB // 4, resident_ops={"ternary2": 1e5},
                    streamed_ops={"int8": 1e9})  # no int8 kernel: that part has no compute roof
    p = predict_pools(pools, two_point_host(kernels=[k]))
    assert p.resident.compute_s == pytest.approx(1e-4) and p.resident.bound == "compute"
    assert p.streamed.compute_s == 0.0 and p.streamed.bound == "DRAM"
    assert p.s_per_token == pytest.approx(1e-4 + (MIB / 4) / 10e9)
    over = predict_pools(pools_at_the_points(), two_point_host(calibration={"per_token_overhead_s": 1.0}))
    assert over.bound == "overhead"
    with pytest.raises(ValueError, match="bandwidth_efficiency"):
        predict_pools(pools_at_the_points(), two_point_host(calibration={"bandwidth_efficiency": 0.0}))


def test_kernel_lookup_by_format():
    ks = [KernelThroughput("fp32_matvec", 1, 8, 8, 10.0, 10.0, 1.0, 3),
          KernelThroughput("ternary_lut", 1, 8, 8, 40.0, 40.0, 1.0, 3),
          KernelThroughput("ternary_naive", 1, 8, 8, 20.0, 20.0, 1.0, 3)]
    h = two_point_host(kernels=ks)
    assert kernel_gops_for(h, "tq1_0") == 40.0 and kernel_gops_for(h, "ternary2") == 40.0
    assert kernel_gops_for(h, "bf16") == 10.0 and kernel_gops_for(h, "int8") is None
    # more threads never slower (an engine may use fewer); fewer than measured: nearest
    ks2 = [KernelThroughput("int8_matvec", 2, 8, 8, 0.1, 0.1, 0.1, 3),
           KernelThroughput("int8_matvec", 4, 8, 8, 60.0, 60.0, 1.0, 3),
           KernelThroughput("int8_matvec", 1, 8, 8, 20.0, 20.0, 1.0, 3)]
    h2 = two_point_host(kernels=ks2)
    assert [kernel_gops_for(h2, "int8", t) for t in (1, 2, 3, 4, 8)] == [20.0, 20.0, 20.0, 60.0, 60.0]
    h3 = two_point_host(kernels=ks2[:2])
    assert kernel_gops_for(h3, "int8", 1) == 0.1  # only multi-thread figures: the nearest


def test_envelope_lifts_dips_and_is_non_increasing():
    pts = tuple(BandwidthPoint("read", 1, ws, g, g, 1) for ws, g in
                [(4096, 50.0), (1 << 16, 120.0), (1 << 20, 90.0), (1 << 22, 95.0), (1 << 30, 20.0)])
    h = HostProfile("noisy", True, {}, (), "test", pts)
    assert bandwidth_gbps(h, 4096) == 120.0 and bandwidth_gbps(h, 1 << 20) == 95.0
    xs = [2.0 ** (e / 4) for e in range(40, 124)]
    ys = [bandwidth_gbps(h, x) for x in xs]
    assert all(a >= b for a, b in zip(ys, ys[1:], strict=False))


def test_more_active_bytes_never_predicts_more_tok_per_s():
    rng = random.Random(1234)
    for _ in range(400):  # random curves (any shape, noisy), random pools, random growth
        n = rng.randint(2, 6)
        pts = tuple(BandwidthPoint("read", 1, 1 << (12 + 4 * i), g, g, 1)
                    for i, g in enumerate(rng.uniform(1.0, 500.0) for _ in range(n)))
        h = HostProfile("h", True, {}, (CacheLevel(3, "Unified", 1 << rng.randint(15, 28), 1, 1),), "t", pts,
                        calibration={"per_token_overhead_s": rng.choice([0.0, 1e-6])})
        res, stream, extra = rng.randint(1, 1 << 28), rng.randint(0, 1 << 26), rng.randint(0, 1 << 30)
        d_res, d_stream = rng.randint(0, 1 << 26), rng.randint(0, 1 << 24)
        policy = rng.choice(["reuse", "whole"])
        a = TwoPool("a", res, stream, stream + extra, state_bytes=rng.randint(0, 1 << 20))
        b = TwoPool("b", res + d_res, stream + d_stream, stream + d_stream + extra, state_bytes=a.state_bytes)
        ta, tb = (predict_pools(x, h, policy=policy).tok_per_s for x in (a, b))
        assert tb <= ta * (1 + 1e-12), (a, b, pts, policy)


def test_more_active_params_in_presets_is_slower():
    host = load_reference_profile()
    base = PRESETS["105m"]
    speeds = [predict(base.replace(top_k=k), host).tok_per_s for k in (1, 2, 4, 8)]
    assert speeds == sorted(speeds, reverse=True)
    assert predict(base, host, fmt="fp32").tok_per_s < predict(base, host).tok_per_s


def test_105m_and_206m_same_speed_when_dram_bound():
    host = synthetic_profile(1 * MIB, 100.0, 20.0)  # LLC far below either model
    a, b = (predict(PRESETS[n], host) for n in ("105m", "206m"))
    assert {a.resident.bound, a.streamed.bound, b.resident.bound, b.streamed.bound} == {"DRAM"}
    assert b.total_params > 1.8 * a.total_params
    # DRAM bound, the speeds go as the bytes the engine reads per token: the same active
    # params, 206m's twice-as-large int8 routers a little more (engines before
    # EnginePolicy.router_int8 read them as fp32: then ~8 %, measured 0.87x at 1 thread on Zen 5)
    bytes_a, bytes_b = (p.active_bytes + p.state_bytes + p.kv_bytes for p in (a, b))
    assert b.tok_per_s / a.tok_per_s == pytest.approx(bytes_a / bytes_b, rel=1e-9)
    assert 1.0 < bytes_b / bytes_a < 1.1 and b.tok_per_s < a.tok_per_s
    # DRAM bound: time is bytes per token over DRAM bandwidth, whatever the total
    assert a.s_per_token == pytest.approx((a.active_bytes + a.state_bytes + a.kv_bytes) / 20e9)


def test_knee_falls_past_llc_then_flat():
    llc = 8 * MIB
    host = synthetic_profile(llc, 100.0, 25.0)
    active, bits = 4e6, 2.0
    totals = [active * 2 ** (i / 4) for i in range(0, 60)]
    preds = sweep_total(host, active, totals, bits, resident_fraction=0.7)
    inside = [p.tok_per_s for p in preds if p.hot_bytes <= llc]
    past = [p.tok_per_s for p in preds if p.hot_bytes >= 2 * llc]
    knee = [p.tok_per_s for p in preds if llc < p.hot_bytes < 2 * llc]
    assert inside and past and knee
    assert max(inside) == pytest.approx(min(inside))  # flat while everything is cached
    assert max(past) == pytest.approx(min(past))  # flat once the experts stream from DRAM
    assert min(inside) > max(knee) >= min(knee) > max(past)
    assert all(x >= y for x, y in zip(knee, knee[1:], strict=False))
    # past the knee only the streamed pool left the cache: resident stays at cache speed
    assert preds[-1].resident.bound == "L3" and preds[-1].streamed.bound == "DRAM"


def test_two_pool_from_params_solves_the_split():
    tp = two_pool_from_params(1e9, 1e8, 8.0, n_experts=64, top_k=4)
    x = (1e9 - 1e8) / (1 - 4 / 64)
    assert tp.expert_bytes_total == pytest.approx(x, abs=1) and tp.resident_bytes == pytest.approx(1e9 - x, abs=1)
    assert tp.streamed_bytes == pytest.approx(x * 4 / 64, abs=1)
    with pytest.raises(ValueError, match="cannot reach"):
        two_pool_from_params(1e9, 1e8, 2.0, n_experts=8, top_k=4)
    with pytest.raises(ValueError, match="exceeds"):
        two_pool_from_params(1e6, 1e7, 2.0, resident_params=0)


def test_sweep_active_orders_formats_by_bits():
    host = load_reference_profile()
    speed = {f: sweep_active(host, [5e8], f)[0].tok_per_s for f in ("fp32", "int8", "ternary2", "tq1_0")}
    assert speed["fp32"] < speed["int8"] < speed["ternary2"] < speed["tq1_0"]


def test_bad_inputs_are_value_errors():
    host = load_reference_profile()
    with pytest.raises(ValueError, match="threads"):
        predict(TINY, host, threads=0)
    with pytest.raises(ValueError, match="policy"):
        predict(TINY, host, policy="lru")
    with pytest.raises(ValueError, match="context"):
        predict(TINY, host, context=-1)
    with pytest.raises(ValueError, match="unknown weight format"):
        predict(TINY, host, fmt="ternary3")
    with pytest.raises(ValueError, match="no bytes"):
        TwoPool("z", 0, 0, 0)
    with pytest.raises(ValueError, match="no read-bandwidth curve"):
        predict(TINY, HostProfile("empty", True, {}, (), "t", ()))


# ---- the reference PC ---------------------------------------------------------------------------
def test_reference_profile_loads_and_matches_its_builder():
    ref = load_reference_profile()
    assert ref == build_reference_profile()  # the bundled JSON is regenerated, not hand-typed
    assert ref.label == REFERENCE_LABEL and not ref.measured
    assert ref.thread_counts() == [1, 2, 3, 4, 5, 6]
    assert llc_capacity_bytes(ref, 1) == 16 * MIB and llc_capacity_bytes(ref, 6) == 32 * MIB
    assert cache_capacity_bytes(ref, 2, 6) == 6 * 512 * 1024
    assert bandwidth_gbps(ref, 8 * MIB, 1) == 100.0 and bandwidth_gbps(ref, GIB, 1) == 28.0
    assert bandwidth_gbps(ref, GIB, 6) == 40.0
    assert 28.0 < bandwidth_gbps(ref, 24 * MIB, 1) < 100.0  # the knee right past the 16 MiB L3
    assert [memory_roof(ref, ws) for ws in (16 * 1024, 256 * 1024, 8 * MIB, 64 * MIB)] == ["L1", "L2", "L3", "DRAM"]
    assert memory_roof(ref, 24 * MIB, threads=6) == "L3"


def test_every_preset_predicts_on_the_reference_pc():
    ref = load_reference_profile()
    rows = predict_table(list(PRESETS.values()), {"ref": ref}, threads=(1, 6))
    assert len(rows) == 2 * len(PRESETS)
    for r in rows:
        assert math.isfinite(r["tok_per_s"]) and r["tok_per_s"] > 0
    by = {(r["config"], r["threads"]): r["tok_per_s"] for r in rows}
    assert by[("10b", 1)] < by[("sandbox", 1)] and by[("10b", 6)] > by[("10b", 1)]
    text = render_prediction(predict(PRESETS["sandbox"], ref))
    assert "resident" in text and "tok/s" in text


def test_resolve_host_prefers_results_profile(tmp_path, capsys):
    assert resolve_host(results=tmp_path).label == REFERENCE_LABEL
    assert "no host profile" in capsys.readouterr().err
    mine = two_point_host()
    mine.save(tmp_path / "host_profile.json")
    assert resolve_host(results=tmp_path) == mine
    assert resolve_host(results=tmp_path, reference=True).label == REFERENCE_LABEL


# ---- plots, explorer, CLI ---------------------------------------------------------------------
def test_plots_return_figures_with_units():
    import matplotlib.pyplot as plt

    from tern.predict.plots import plot_feasibility, plot_formats, plot_knee, plot_presets

    hosts = {"synthetic": synthetic_profile(8 * MIB, 100.0, 20.0), "reference PC": load_reference_profile()}
    figs = [plot_knee(hosts, points=12), plot_formats(hosts, formats=("fp32", "ternary2"), actives=[1e6, 1e8]),
            plot_feasibility(hosts, actives=[1e8, 1e9, 3e9], threads=[1, 6]),
            plot_presets(predict_table([PRESETS["sandbox"], PRESETS["30m"]], hosts))]
    for f in figs:
        labels = " ".join(a.get_ylabel() + a.get_xlabel() for a in f.axes)
        assert "tok/s" in labels or "threads" in labels
        plt.close(f)


def test_explore_without_widgets_and_explorer_box():
    import matplotlib.pyplot as plt

    from tern.predict.widgets import explore, explore_host, explorer

    fig = explore(bandwidth_gbps=20.0, total_params=1e9, active_params=5e7, n_experts=256, top_k=4)
    assert fig.axes[0].get_ylabel() == "predicted decode speed (tok/s)"
    plt.close(fig)
    h = explore_host(load_reference_profile(), 1, 33.0)
    assert bandwidth_gbps(h, GIB) == 33.0 and bandwidth_gbps(h, MIB) == 100.0
    with pytest.raises(ValueError, match="cannot reach"):
        explore(total_params=1e9, active_params=5e7, n_experts=8, top_k=4)
    pytest.importorskip("ipywidgets")
    box = explorer()
    assert len(box.children) == 8  # seven sliders and the output


def test_cli_predict_json_and_table(capsys):
    from tern.cli import main

    assert main(["predict", "--config", "sandbox", "30m", "--reference", "--threads", "1", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    preds = out["predictions"]
    assert [(p["config"], p["threads"]) for p in preds] == [("sandbox", 1), ("sandbox", 6), ("30m", 1), ("30m", 6)]
    assert preds[0]["tok_per_s"] == pytest.approx(predict(PRESETS["sandbox"], load_reference_profile()).tok_per_s)
    assert main(["predict", "--config", "sandbox", "--reference"]) == 0
    assert "tok/s" in capsys.readouterr().out
    assert main(["predict", "--config", "nope", "--reference"]) == 2


def test_with_dram_bandwidth_rescales_only_the_dram_part():
    from tern.core.host_queries import bandwidth_gbps, llc_capacity_bytes, with_dram_bandwidth

    host = synthetic_profile(32 << 20, 100.0, 20.0)
    far = max(p.working_set_bytes for p in host.curve(1))
    now = with_dram_bandwidth(host, 1, 40.0)
    assert bandwidth_gbps(now, far, 1) == pytest.approx(40.0)
    small = llc_capacity_bytes(host) // 4
    assert bandwidth_gbps(now, small, 1) == pytest.approx(bandwidth_gbps(host, small, 1))
    big = PRESETS["10b"]  # gigabytes: DRAM-bound
    assert predict(big, now).tok_per_s > 1.5 * predict(big, host).tok_per_s
    with pytest.raises(ValueError, match="gbps"):
        with_dram_bandwidth(host, 1, 0.0)


def test_decoded_context_is_the_mean_attended_positions_of_a_run_from_reset():
    from tern.predict.pools import decoded_context

    # token i attends over min(i + 1, window) positions; the mean, rounded half up
    assert decoded_context(1, 128) == 1
    assert decoded_context(4, 128) == 3  # (1 + 2 + 3 + 4) / 4 = 2.5
    assert decoded_context(64, 128) == 33  # 65 / 2 = 32.5
    assert decoded_context(6, 4) == 3  # (1 + 2 + 3 + 4 + 4 + 4) / 6 = 3.0
    assert decoded_context(7, 4) == 3  # 22 / 7 = 3.14
    assert decoded_context(10_000, 4) == 4  # a long run: the full window
    for bad in ((0, 4), (4, 0), (2.5, 4), (True, 4)):
        with pytest.raises(ValueError):
            decoded_context(*bad)

