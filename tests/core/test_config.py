"""ModelConfig validation, serialisation, tensor specs and parameter counting."""

import json
import math

import pytest

from tern.core.config import PRESETS, ModelConfig, get_preset, load_config, param_counts, tensor_specs
from tern.core.formats import FORMATS, get_format, tensor_bytes

TINY = ModelConfig(
    name="tiny", vocab_size=10, d_model=8, n_layers=2, attn_layers=(1,), n_heads=2,
    d_state=2, expand=2, d_conv=3, dt_rank=1, mlp_hidden=0, moe_layers=(0, 1), n_experts=4,
    top_k=2, expert_hidden=3, n_shared=1, shared_hidden=5,
)


def test_tiny_counts_by_hand():
    D, V, Di, N, R, K = 8, 10, 16, 2, 1, 3
    ssm = 2 * Di * D + Di * K + Di + (R + 2 * N) * Di + Di * R + Di + Di * N + Di + D * Di
    attn = 3 * D * D + D * D
    router = 4 * D
    shared = 3 * 5 * D
    experts = 4 * 3 * 3 * D
    norms = 2 * D * 2 + D  # norm1+norm2 per layer, final norm
    embed = V * D
    pc = param_counts(TINY)
    assert pc.total.params == embed + ssm + attn + 2 * (router + shared + experts) + norms
    assert pc.streamed.params == 2 * 2 * 3 * 3 * D  # 2 layers x top-2 x (gate, up, down)
    # tied: the head reads the whole table every token
    assert pc.resident.params == embed + ssm + attn + 2 * (router + shared) + norms
    assert pc.active.params == pc.resident.params + pc.streamed.params
    assert pc.expert_bytes_total == 2 * (2 * tensor_bytes("ternary2", (4, 3, D)) + tensor_bytes("ternary2", (4, D, 3)))
    assert pc.state_bytes == Di * (N + K - 1) * 4
    assert pc.kv_bytes_per_position == 2 * D * 4
    assert pc.kv_bytes(10_000, TINY) == pc.kv_bytes_per_position * TINY.attn_window
    assert sum(pl["total"].params for pl in pc.per_layer) + embed + D == pc.total.params


def test_untied_counts_one_embedding_row():
    cfg = TINY.replace(tie_embeddings=False)
    pc = param_counts(cfg)
    tied = param_counts(TINY)
    assert pc.total.params == tied.total.params + 10 * 8
    # one embedding row + the head instead of the whole table
    assert pc.resident.params == tied.resident.params - 10 * 8 + 8 + 10 * 8


def test_bytes_use_formats():
    pc = param_counts(TINY)
    assert pc.total.bytes == sum(s.nbytes for s in tensor_specs(TINY))
    # ternary2: 2 bits/weight + fp32 scale per row
    assert tensor_bytes("ternary2", (3, 8)) == 3 * 8 * 2 // 8 + 3 * 4
    assert tensor_bytes("fp32", (3, 8)) == 96
    assert tensor_bytes("tq2_0", (1, 256)) == 66
    assert tensor_bytes("tq1_0", (1, 256)) == 54


@pytest.mark.parametrize("name,bpw", [("fp32", 32), ("fp16", 16), ("bf16", 16), ("int8", 8),
                                      ("q4", 4.5), ("ternary2", 2), ("ternary_b3", 1.6),
                                      ("tq2_0", 2.0625), ("tq1_0", 1.6875), ("lut4", 4)])
def test_format_bits(name, bpw):
    assert get_format(name).bits_per_weight == bpw


def test_unknown_format():
    with pytest.raises(ValueError, match="unknown weight format"):
        get_format("fp8")
    assert "ternary2" in FORMATS


def test_specs_unique_names_and_groups():
    for cfg in PRESETS.values():
        names = [s.name for s in tensor_specs(cfg)]
        assert len(names) == len(set(names))


@pytest.mark.parametrize("bad,msg", [
    (dict(d_model=0), "d_model"),
    (dict(attn_layers=(7,)), "outside"),
    (dict(moe_layers=(0, 0), n_experts=2, top_k=1, expert_hidden=4), "repeated"),
    (dict(moe_layers=(0,), n_experts=4, top_k=5, expert_hidden=4), "top_k"),
    (dict(activation="gelu"), "activation"),
    (dict(mlp_format="fp7"), "mlp_format"),
    (dict(attn_layers=(0,), n_heads=3), "divisible"),
    (dict(tie_embeddings=True, head_format="int8"), "tie_embeddings"),
])
def test_validation_errors(bad, msg):
    with pytest.raises(ValueError, match=msg):
        ModelConfig(**bad)


def test_json_round_trip_and_unknown_keys():
    for cfg in PRESETS.values():
        assert ModelConfig.from_json(cfg.to_json()) == cfg
    d = json.loads(TINY.to_json())
    d["bogus"] = 1
    with pytest.raises(ValueError, match="unknown ModelConfig keys"):
        ModelConfig.from_dict(d)
    with pytest.raises(ValueError, match="unknown ModelConfig keys"):
        TINY.replace(bogus=2)


def test_load_config(tmp_path):
    assert load_config("sandbox") is get_preset("sandbox")
    p = tmp_path / "c.json"
    p.write_text(TINY.to_json())
    assert load_config(str(p), {"d_model": 16}).d_model == 16
    with pytest.raises(ValueError, match="neither a preset"):
        load_config("nope")
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("nope")


def test_presets_sizes():
    """The presets are the sizes the kit talks about."""
    def m(name):
        return param_counts(get_preset(name))
    assert math.isclose(m("sandbox").total.params, 8.3e6, rel_tol=0.03)
    assert math.isclose(m("30m").total.params, 30e6, rel_tol=0.03)
    assert math.isclose(m("30m").active.params, 11e6, rel_tol=0.05)
    assert math.isclose(m("105m").total.params, 105e6, rel_tol=0.03)
    assert math.isclose(m("206m").total.params, 206e6, rel_tol=0.03)
    assert math.isclose(m("10b").total.params, 10e9, rel_tol=0.03)
    # equal active params (to 2 %) at 2x total
    assert math.isclose(m("105m").active.params, m("206m").active.params, rel_tol=0.02)


def test_router_format():
    cfg = TINY.replace(router_format="int8")
    specs = {s.name: s for s in tensor_specs(cfg)}
    assert specs["layers.0.ffn.router.weight"].format == "int8"
    assert param_counts(cfg).resident.bytes < param_counts(TINY).resident.bytes
    with pytest.raises(ValueError, match="router_format"):
        TINY.replace(router_format="ternary2")


def test_dt_format():
    """The SSM dt projection's weights in fp16: 2 bytes each, the other aux tensors stay fp32; a
    config at the default fp32 serialises as configs did before the field (same hash), fp16
    round-trips, anything else is refused."""
    cfg = TINY.replace(dt_format="fp16")
    specs = {s.name: s for s in tensor_specs(cfg)}
    dt = specs["layers.0.mixer.dt_proj.weight"]
    assert dt.format == "fp16" and dt.group == "mixer_aux" and dt.pool == "resident"
    assert specs["layers.0.mixer.dt_proj.bias"].format == "fp32" and specs["layers.0.mixer.A_log"].format == "fp32"
    saved = param_counts(TINY).active.bytes - param_counts(cfg).active.bytes
    assert saved == 2 * dt.numel  # one SSM layer (layer 1 is attention)
    assert "dt_format" not in TINY.to_dict() and ModelConfig.from_json(TINY.to_json()) == TINY
    assert json.loads(cfg.to_json())["dt_format"] == "fp16" and ModelConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="dt_format"):
        TINY.replace(dt_format="int8")


def test_105m_206m_equal_active_bytes():
    a, b = param_counts(get_preset("105m")), param_counts(get_preset("206m"))
    assert b.total.params > 1.9 * a.total.params
    assert math.isclose(a.active.bytes, b.active.bytes, rel_tol=0.025)
