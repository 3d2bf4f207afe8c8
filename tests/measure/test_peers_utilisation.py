"""Bandwidth utilisation of decode rows (tern.measure.utilisation)."""

import numpy as np
import pytest

from tern.core.config import ModelConfig, load_config, param_counts, tensor_specs
from tern.measure.utilisation import (
    NO_PROFILE,
    decode_utilisation,
    engine_bytes_per_token,
    row_utilisation,
    with_utilisation,
)
from tern.packed.writer import random_model
from tern.predict.roofline import synthetic_profile

HOST = synthetic_profile(llc_bytes=1 << 20, cache_gbps=100.0, dram_gbps=20.0)
CFG = ModelConfig(name="u", vocab_size=64, d_model=32, n_layers=2, attn_layers=(0, 1), n_heads=2,
                  mlp_hidden=0, moe_layers=(0, 1), n_experts=4, top_k=2, expert_hidden=32,
                  router_format="int8", embed_format="fp16", head_format="fp16", tie_embeddings=False,
                  activation="silu")


def test_decode_utilisation_divides_by_the_read_rate_at_the_working_set():
    dram = decode_utilisation(50.0, 2e8, 1e9, 1, HOST)  # 10 GB/s from a DRAM-sized model
    assert dram["gbps_end_to_end"] == pytest.approx(10.0)
    assert dram["read_gbps_at_ws"] == pytest.approx(20.0) and dram["bandwidth_fraction"] == pytest.approx(0.5)
    cache = decode_utilisation(50.0, 2e8, 1e5, 1, HOST)  # the same bytes from a cache-sized working set
    assert cache["read_gbps_at_ws"] == pytest.approx(100.0) and cache["bandwidth_fraction"] == pytest.approx(0.1)
    none = decode_utilisation(50.0, 2e8, 1e9, 1, None)
    assert none["gbps_end_to_end"] == pytest.approx(10.0) and none["bandwidth_fraction"] is None
    assert none["bandwidth_note"] == NO_PROFILE
    for bad in (0.0, float("nan"), -1.0):
        with pytest.raises(ValueError, match="tok_per_s"):
            decode_utilisation(bad, 1.0, 1.0, 1, HOST)
    with pytest.raises(ValueError, match="threads"):
        decode_utilisation(1.0, 1.0, 1.0, 0, HOST)


def test_row_utilisation_reads_every_decode_row_kind():
    sweep = {"kind": "sweep_point", "tok_per_s": 50.0, "threads": 1, "active_bytes": 2e8, "total_bytes": 1e9}
    peers = {"tok_per_s": 50.0, "threads": 1, "bytes_per_token": 2e8, "working_set_bytes": 1e9,
             "active_bytes": 1.0, "total_bytes": 1.0}  # the explicit fields win
    for row in (sweep, peers):
        assert row_utilisation(row, HOST)["bandwidth_fraction"] == pytest.approx(0.5)
    ladder = {"tok_per_s": {"median": 1000.0, "min": 900.0}, "threads": 1, "config": CFG.name}
    with pytest.raises(ValueError, match="pass the model's config"):
        row_utilisation(ladder, HOST)
    pc = param_counts(CFG)
    u = row_utilisation(ladder, HOST, cfg=CFG)
    assert u["gbps_end_to_end"] == pytest.approx(1000.0 * pc.active.bytes / 1e9)
    with_cfg = row_utilisation({**sweep, "active_bytes": None, "total_bytes": None, "config": CFG.to_dict()}, HOST)
    assert with_cfg["gbps_end_to_end"] == pytest.approx(50.0 * pc.active.bytes / 1e9)
    with pytest.raises(ValueError, match="tok_per_s"):
        row_utilisation({"threads": 1}, HOST)
    out = with_utilisation([sweep], HOST)
    assert out[0]["bandwidth_fraction"] == pytest.approx(0.5) and "bandwidth_fraction" not in sweep


def test_engine_bytes_count_the_engines_load_time_conversions(tmp_path):
    from tern.run.engine import Engine

    pc = param_counts(CFG)
    D, V, E = CFG.d_model, CFG.vocab_size, CFG.n_experts
    routers_fp32 = CFG.n_layers * E * D * 4
    routers_file = sum(s.nbytes for s in tensor_specs(CFG) if s.group == "router")
    assert engine_bytes_per_token(CFG) == pc.active.bytes  # int8 routers and fp16 tables read as stored
    # engines before EnginePolicy.router_int8 read int8 routers as an fp32 table
    assert engine_bytes_per_token(CFG, router_int8=False) == pc.active.bytes + routers_fp32 - routers_file
    assert engine_bytes_per_token(CFG, dense16="expand") == pc.active.bytes + V * D * 2 + D * 2
    fp32 = CFG.replace(embed_format="fp32", head_format="fp32", router_format="fp32")
    assert engine_bytes_per_token(fp32) == param_counts(fp32).active.bytes  # nothing converted
    fp16 = CFG.replace(router_format="fp16")
    assert engine_bytes_per_token(fp16) == param_counts(fp16).active.bytes
    # the engine builds no fp32 router table (its aux buffer is the same whatever the router's
    # format); dense16="expand" holds the fp16 embedding and head as fp32 tables
    aux = {}
    for name, cfg in (("int8", CFG), ("fp32", CFG.replace(router_format="fp32"))):
        path = random_model(cfg, tmp_path / f"{name}.tern", seed=0)
        for dense16 in ("direct", "expand"):
            eng = Engine(path, dense16=dense16)
            aux[name, dense16] = eng.aux.size
            assert np.isfinite(eng.step(1)).all()
            eng.close()
    assert aux["int8", "direct"] == aux["fp32", "direct"]
    assert aux["int8", "expand"] - aux["int8", "direct"] >= 2 * V * D * 4


def test_engine_bytes_follow_the_engines_b3_choice():
    """Base-3 matrices read as stored (b3 direct) add nothing; expanded at load they are
    read as ternary2; "auto" decides as the engine does (weights beyond the LLC and rows of
    >= 2048 inputs: direct)."""
    from tern.core.formats import tensor_bytes
    from tern.kernels.policy import B3_DIRECT_MIN_COLS

    b3 = ModelConfig(name="b3", vocab_size=64, d_model=B3_DIRECT_MIN_COLS, n_layers=1, attn_layers=(0,),
                     n_heads=16, mlp_hidden=B3_DIRECT_MIN_COLS, activation="silu", mixer_format="ternary_b3",
                     mlp_format="ternary_b3", embed_format="fp32", head_format="fp32", tie_embeddings=False)
    base = param_counts(b3).active.bytes
    grow = sum(tensor_bytes("ternary2", s.shape) - tensor_bytes("ternary_b3", s.shape)
               for s in tensor_specs(b3) if s.format == "ternary_b3")
    assert grow > 0
    assert engine_bytes_per_token(b3, b3="direct") == base
    assert engine_bytes_per_token(b3, b3="expand") == base + grow
    assert engine_bytes_per_token(b3, llc_bytes=1 << 20) == base  # auto: 2048-wide rows beyond 1 MiB
    assert engine_bytes_per_token(b3, llc_bytes=1 << 40) == base + grow  # auto: cache-resident, expanded
    assert engine_bytes_per_token(b3) == base + grow  # auto, LLC unknown: expanded (the engine's choice too)
    with pytest.raises(ValueError, match="b3"):
        engine_bytes_per_token(b3, b3="packed")


def test_two_pool_prices_the_rows_where_the_engine_reads_base3_as_stored():
    """Layout "auto" runs the blocked16 pass unless the engine reads base-3 rows as stored: the
    pools price op ternary_blocked for a cache-resident b3 model (expanded, re-packed), the 4-row
    pass for the same model beyond the LLC (b3 direct)."""
    from tern.kernels.policy import B3_DIRECT_MIN_COLS, CURRENT_POLICY
    from tern.predict.pools import b3_read_as_stored, two_pool

    b3 = ModelConfig(name="b3", vocab_size=64, d_model=B3_DIRECT_MIN_COLS, n_layers=1, attn_layers=(0,),
                     n_heads=16, mlp_hidden=B3_DIRECT_MIN_COLS, activation="silu", mixer_format="ternary_b3",
                     mlp_format="ternary_b3", embed_format="fp32", head_format="fp32", tie_embeddings=False)
    ops = lambda llc: {k.op for k in two_pool(b3, llc_bytes=llc, engine_policy=CURRENT_POLICY).resident_work}  # noqa: E731
    assert not b3_read_as_stored(b3, "auto", 1 << 40) and b3_read_as_stored(b3, "auto", 1 << 20)
    assert "ternary_blocked" in ops(1 << 40) and "ternary_matvec" not in ops(1 << 40)
    assert "ternary_blocked" not in ops(1 << 20) and ops(1 << 20) & {"ternary_matvec", "ternary_stream"}
    assert not b3_read_as_stored(load_config("sandbox"), "direct")  # no base-3 matrices
