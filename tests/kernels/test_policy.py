"""The engine's dispatch policy (tern.kernels.policy) and the predictor pricing the same choice."""

import pytest

from tern.core.config import load_config
from tern.kernels.policy import SKIP_ACTIVATIONS, act_skip_applies
from tern.predict.inventory import work_inventory


def _units(work, op):
    return sum(w.units for k, w in work.items() if k.op == op)


def test_act_skip_applies_only_to_activations_with_exact_zeros():
    assert act_skip_applies("drelu") and act_skip_applies("relu2")
    assert not act_skip_applies("silu")
    assert set(SKIP_ACTIVATIONS) == {"drelu", "relu2"}


@pytest.mark.parametrize("activation", ["drelu", "relu2", "silu"])
def test_inventory_prices_the_down_projection_by_the_rule(activation):
    cfg = load_config("sandbox").replace(activation=activation)
    res, st, skip_r, skip_s = work_inventory(cfg)
    n_moe = sum(map(cfg.is_moe, range(cfg.n_layers)))
    down = cfg.top_k * cfg.expert_hidden * cfg.d_model * n_moe  # routed down-projection weights per token
    gate_up = 2 * down
    skip = _units(st, "ternary_skip")
    rows = _units(st, "ternary_matvec") + _units(st, "ternary_stream") + _units(st, "ternary_blocked")
    if act_skip_applies(activation):
        assert skip > 0 and rows == gate_up and skip_s > 0
    else:  # a SiLU down projection is a plain row matvec: every weight, nothing skipped
        assert skip == 0 and rows == gate_up + down and skip_s == 0 and skip_r == 0
        assert not any(k.op == "ternary_skip" for k in (*res, *st))


def test_copy_weights_needs_the_file_to_fit_in_half_the_available_memory():
    from tern.kernels.policy import COPY_MAX_MEMORY_FRACTION, copy_weights

    assert COPY_MAX_MEMORY_FRACTION == 0.5
    assert copy_weights(10, 20) and not copy_weights(11, 20)
    assert not copy_weights(1, None) and not copy_weights(1, 0)  # unknown memory: map the file


def test_engine_policy_is_read_from_records():
    from tern.kernels.policy import CURRENT_POLICY, LEGACY_POLICY, PAR_MIN_WEIGHTS, EnginePolicy

    assert CURRENT_POLICY.par_min_weights == PAR_MIN_WEIGHTS == LEGACY_POLICY.par_min_weights == 1 << 20
    assert EnginePolicy.of_record(None) == EnginePolicy.of_record({"tok_per_s": 1.0}) == LEGACY_POLICY
    assert EnginePolicy.of_record({"engine_policy": CURRENT_POLICY.to_dict()}) == CURRENT_POLICY
    with pytest.raises(ValueError, match="engine_policy"):
        EnginePolicy.of_record({"engine_policy": {"par_min_weights": 1, "colour": 2}})
    with pytest.raises(ValueError, match="par_min_weights"):
        EnginePolicy(par_min_weights=-1)
    with pytest.raises(ValueError, match="par_min_weights"):
        EnginePolicy.of_record({"engine_policy": {"par_min_weights": 1.5}})
    assert EnginePolicy.of_record({"engine_policy": {"par_min_weights": 65536}}).par_min_weights == 65536
    assert EnginePolicy.of_record({"engine_policy": {}}) == LEGACY_POLICY  # missing fields: legacy values


def test_stream_prefetch_is_recorded_and_old_records_prefetched():
    """Engines before the per-host choice always prefetched in the streaming kernel: a record
    without the field reads True; a False is written by both the region and per-matrix forms."""
    from dataclasses import replace

    from tern.kernels.policy import CURRENT_POLICY, LEGACY_POLICY, PER_MATRIX_POLICY, EnginePolicy

    assert LEGACY_POLICY.stream_prefetch and CURRENT_POLICY.stream_prefetch
    assert EnginePolicy.of_record({"engine_policy": {"par_min_weights": 1 << 20, "region": True}}).stream_prefetch
    for pol in (CURRENT_POLICY, PER_MATRIX_POLICY):
        off = replace(pol, stream_prefetch=False)
        assert off.to_dict()["stream_prefetch"] is False
        assert EnginePolicy.of_record({"engine_policy": off.to_dict()}) == off
    assert "stream_prefetch" not in PER_MATRIX_POLICY.to_dict()  # its legacy value is not written
    with pytest.raises(ValueError, match="stream_prefetch must be True or False"):
        EnginePolicy(stream_prefetch=1)


def test_stream_choice_is_recorded_and_old_records_streamed():
    """EnginePolicy.stream: engines before the probe's stream / 4-row choice always streamed
    DRAM pools' long rows; a False is written and read back by both forms."""
    from dataclasses import replace

    from tern.kernels.policy import CURRENT_POLICY, LEGACY_POLICY, PER_MATRIX_POLICY, EnginePolicy

    assert LEGACY_POLICY.stream and CURRENT_POLICY.stream
    assert EnginePolicy.of_record({"engine_policy": {"par_min_weights": 1 << 20, "stream_prefetch": False}}).stream
    for pol in (CURRENT_POLICY, PER_MATRIX_POLICY):
        off = replace(pol, stream=False)
        assert off.to_dict()["stream"] is False and EnginePolicy.of_record({"engine_policy": off.to_dict()}) == off
    assert "stream" not in PER_MATRIX_POLICY.to_dict()
    with pytest.raises(ValueError, match="stream must be True or False"):
        EnginePolicy(stream="off")


def test_blocked_layout_is_recorded_and_old_records_read_rows():
    """EnginePolicy.blocked: engines before layout="auto" read rows as stored; today's policies record it."""
    from dataclasses import replace

    from tern.kernels.policy import CURRENT_POLICY, LEGACY_POLICY, PER_MATRIX_POLICY, EnginePolicy

    assert not LEGACY_POLICY.blocked and CURRENT_POLICY.blocked and PER_MATRIX_POLICY.blocked
    assert not EnginePolicy.of_record({"engine_policy": {"par_min_weights": 1 << 20, "region": True}}).blocked
    for pol in (CURRENT_POLICY, PER_MATRIX_POLICY):
        assert EnginePolicy.of_record({"engine_policy": pol.to_dict()}) == pol
        rows = replace(pol, blocked=False)
        assert EnginePolicy.of_record({"engine_policy": rows.to_dict()}) == rows
    assert "blocked" not in replace(PER_MATRIX_POLICY, blocked=False).to_dict()
    with pytest.raises(ValueError, match="blocked must be True or False"):
        EnginePolicy(blocked=1)


def test_layout_auto_is_blocked_where_the_blocked_pass_is_the_default():
    from tern.kernels.policy import layout_and_b3

    cfg = load_config("sandbox")
    b3_file = {"x": {"format": "ternary_b3"}}
    assert layout_and_b3("auto", "auto", "ternary", cfg, None, {}, True) == ("blocked16", "expand", False)
    assert layout_and_b3("auto", "auto", "ternary", cfg, None, {}, False)[0] == "rows"  # not the default here (AVX2)
    assert layout_and_b3("auto", "auto", "fp32", cfg, None, {}, True)[0] == "rows"
    assert layout_and_b3("auto", "direct", "ternary", cfg, None, b3_file, True) == ("rows", "direct", True)
    assert layout_and_b3("blocked16", "auto", "ternary", cfg, 1, b3_file, False) == ("blocked16", "expand", False)
    assert layout_and_b3("rows", "auto", "ternary", cfg, None, {}, True)[0] == "rows"
    for layout, b3, kernel, match in (("cols", "auto", "ternary", "layout must be one of"),
                                      ("blocked16", "auto", "fp32", "needs the ternary kernel"),
                                      ("blocked16", "direct", "ternary", "b3='expand'"),
                                      ("auto", "maybe", "ternary", "b3 must be one of")):
        with pytest.raises(ValueError, match=match):
            layout_and_b3(layout, b3, kernel, cfg, None, {}, True)


def test_inventory_prices_the_blocked_pass_where_the_policy_is_blocked():
    """Every row-oriented ternary matvec becomes op ternary_blocked (never the streaming pass); the skip
    kernel's down projections, heads and routers keep theirs; the weights per token are the same."""
    from dataclasses import replace

    from tern.kernels.policy import CURRENT_POLICY

    cfg = load_config("sandbox")
    blk = work_inventory(cfg, llc_bytes=1, policy=CURRENT_POLICY)
    rows = work_inventory(cfg, llc_bytes=1, policy=replace(CURRENT_POLICY, blocked=False))
    for b, r in ((blk.resident, rows.resident), (blk.streamed, rows.streamed)):
        assert _units(b, "ternary_matvec") == _units(b, "ternary_stream") == 0
        assert _units(b, "ternary_blocked") == _units(r, "ternary_matvec") + _units(r, "ternary_stream") > 0
        assert _units(b, "ternary_skip") == _units(r, "ternary_skip")
