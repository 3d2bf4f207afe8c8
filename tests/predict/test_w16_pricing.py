"""fp16 / bf16 matrices (heads, tied tables, routers) are read by the engine at 2 bytes a weight
(tern.kernels.kernels_stored.matvec_w16): the predictor prices them as the probe's w16 matvec, and
with a profile from before that op as the fp32 matvec of as many bytes. Until session 48 they were
priced as fp32 matvecs of as many weights: twice their bytes from DRAM (the 1.1B peer with its
131 MB fp16 head predicted at 43.5 tok/s against 63.3 measured at 1 thread, Zen 4 VM)."""
from __future__ import annotations

import dataclasses

import pytest

from tern.core.config import ModelConfig
from tern.core.host_profile import HostProfile, OpCost, OpCurve
from tern.core.host_queries import ROUTER_OP
from tern.kernels.policy import CURRENT_POLICY, LEGACY_POLICY
from tern.predict.inventory import OpWork, WorkKey, work_inventory, work_seconds
from tern.predict.stall import curve_stall

D, V, E = 256, 1024, 16


def _cfg(head: str = "fp16", router: str = "fp16") -> ModelConfig:
    return ModelConfig(name="w16", vocab_size=V, d_model=D, n_layers=2, attn_layers=(0, 1), n_heads=4,
                       attn_window=64, moe_layers=(0, 1), n_experts=E, top_k=2, expert_hidden=128,
                       embed_format="fp16" if head == "fp16" else "fp32", head_format=head,
                       router_format=router, tie_embeddings=False, max_seq_len=64)


def _units(work: dict, op: str) -> float:
    return sum(w.units for k, w in work.items() if k.op == op)


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_16_bit_heads_and_routers_are_the_w16_matvec(fmt):
    res, st, _, _ = work_inventory(_cfg(fmt, fmt), policy=CURRENT_POLICY)
    assert _units(res, "w16_matvec") == V * D + 2 * E * D  # the head and both layers' routers
    assert _units(res, "fp32_matvec") == 0 and _units(st, "w16_matvec") == 0


def test_fp32_and_int8_matrices_keep_their_ops():
    res, _, _, _ = work_inventory(_cfg("fp32", "fp32"), policy=CURRENT_POLICY)
    assert _units(res, "fp32_matvec") == V * D + 2 * E * D and _units(res, "w16_matvec") == 0
    res, _, _, _ = work_inventory(_cfg("fp32", "int8"), policy=CURRENT_POLICY)
    assert _units(res, ROUTER_OP) == 2 * E * D
    # engines before EnginePolicy.router_int8 read int8 routers as an fp32 table
    res, _, _, _ = work_inventory(_cfg("fp32", "int8"), policy=LEGACY_POLICY)
    assert _units(res, "fp32_matvec") == V * D + 2 * E * D and _units(res, ROUTER_OP) == 0


def _curves(op: str, per_weight_s: float) -> tuple[OpCurve, OpCurve]:
    """Two shapes of ``op``: cache-resident at 1e-10 s a weight, ``per_weight_s`` from DRAM (1 GiB)."""
    def curve(rows, cols):
        return OpCurve(op, "serial", 1, rows, cols, 1.0, (1 << 18, 1 << 30),
                       (1e-7 + 1e-10 * rows * cols, 1e-6 + per_weight_s * rows * cols))
    return curve(1024, 1024), curve(256, 1024)


def _host(*ops: str) -> HostProfile:
    costs = tuple(OpCost(op, 1, 1e-7, 1e-9, 1e-10, 3, 0.0) for op in ops)
    curves = tuple(c for op in ops for c in _curves(op, 8e-10 if op == "fp32_matvec" else 5e-10))
    return HostProfile("t", True, {}, (), "test", (), op_costs=costs, op_curves=curves)


def test_without_a_w16_op_the_fp32_matvec_prices_the_same_bytes():
    host = _host("fp32_matvec")
    w16 = {WorkKey("w16_matvec"): OpWork(2.0, 2 * V, 2.0 * V * D, 0.0)}
    fp32_same_bytes = {WorkKey("fp32_matvec"): OpWork(2.0, 2 * V, 1.0 * V * D, 0.0)}
    fp32_same_weights = {WorkKey("fp32_matvec"): OpWork(2.0, 2 * V, 2.0 * V * D, 0.0)}
    extra, covered = curve_stall(w16, host, 1, 1 << 30)
    assert (extra, covered) == pytest.approx(curve_stall(fp32_same_bytes, host, 1, 1 << 30))
    assert covered == pytest.approx(2 * 2.0 * V * D)  # 2 bytes a weight
    assert extra < 0.75 * curve_stall(fp32_same_weights, host, 1, 1 << 30)[0]
    # the compute: the fp32 matvec's cost a weight, for every weight
    assert work_seconds(w16, host) == pytest.approx(work_seconds(fp32_same_weights, host))


def test_a_profile_with_the_w16_op_prices_it_with_its_own_curves():
    host = _host("fp32_matvec", "w16_matvec")
    w16 = {WorkKey("w16_matvec"): OpWork(2.0, 2 * V, 2.0 * V * D, 0.0)}
    own, covered = curve_stall(w16, host, 1, 1 << 30)
    only_w16 = dataclasses.replace(host, op_curves=tuple(c for c in host.op_curves if c.op == "w16_matvec"))
    assert (own, covered) == pytest.approx(curve_stall(w16, only_w16, 1, 1 << 30))
    assert covered == pytest.approx(2 * 2.0 * V * D)
    fallback, _ = curve_stall(w16, _host("fp32_matvec"), 1, 1 << 30)
    assert own != pytest.approx(fallback)  # its own curves (5e-10 s a weight), not the fp32 ones
