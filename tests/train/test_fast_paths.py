"""The faster CPU paths of issue 18 against their reference forms: eval's integer products
by torch._int_mm (bit-identical), the bf16 backward of BitLinear (within bf16 rounding),
the fused AdamW update (fp32 rounding) and a short training run in each mode."""

import numpy as np
import pytest
import torch
from conftest import SMALL, TRAIN_TINY

from tern.train.batches import ArraySource
from tern.train.config import TrainConfig
from tern.train.environment import make_optimizer, param_groups
from tern.train.loop import run_training
from tern.train.model import ternary
from tern.train.model.lm import build_model
from tern.train.model.ternary import matmul_mode, prepare_input, prepare_weight, qmatmul


def _counting_int_product(monkeypatch):
    calls = {"int": 0, "fallback": 0}
    real = ternary._eval_int_product

    def counted(q, wt):
        r = real(q, wt)
        calls["int" if r is not None else "fallback"] += 1
        return r

    monkeypatch.setattr(ternary, "_eval_int_product", counted)
    return calls


def test_eval_integer_products_by_int_mm_are_bit_identical(monkeypatch):
    m = build_model(SMALL, seed=3).eval()
    x = torch.randint(0, SMALL.vocab_size, (3, 12))  # 36 rows per product
    calls = _counting_int_product(monkeypatch)
    with torch.inference_mode():
        fast = m(x)
    # x_proj's width (dt_rank + 2 * d_state = 19) is no multiple of 8: fp32 there
    assert calls["int"] > 0 and calls["fallback"] > 0
    monkeypatch.setattr(ternary, "_eval_int_product", lambda q, wt: None)
    with torch.inference_mode():
        ref = m(x)
    assert torch.equal(fast, ref)


def test_eval_int_product_applies_only_where_it_is_exact():
    q = torch.randint(-127, 128, (20, 32)).float()
    wt = torch.randint(-1, 2, (16, 32)).float()
    with torch.inference_mode():
        acc = ternary._eval_int_product(q, wt)
        assert acc is not None and torch.equal(acc, q @ wt.t())
        assert ternary._eval_int_product(q[:16], wt) is None  # too few rows for _int_mm
        assert ternary._eval_int_product(q[:, :30], wt[:, :30]) is None  # width not a multiple of 8
    assert ternary._eval_int_product(q, wt) is None  # autograd on: the differentiable fp32 form


def _bitlinear_grads(backward: str, n=48, d_in=96, d_out=40):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(n, d_in, generator=g) * 2).requires_grad_()
    w = (torch.randn(d_out, d_in, generator=g) * 0.05).requires_grad_()
    gy = torch.randn(n, d_out, generator=g)
    with matmul_mode("int8", backward):
        y = qmatmul(prepare_input(x, 1e-5, training=True), prepare_weight(w, training=True))
    (y * gy).sum().backward()
    return y, x.grad, w.grad


def test_bf16_backward_is_the_fp32_ste_backward_to_bf16_rounding():
    y32, gx32, gw32 = _bitlinear_grads("fp32")
    y16, gx16, gw16 = _bitlinear_grads("bf16")
    assert torch.equal(y32, y16)  # the forward is the exact int8 product in both
    for a, b in ((gx16, gx32), (gw16, gw32)):
        assert not torch.equal(a, b)  # bf16 products did run
        # bf16 keeps 8 significant bits (relative rounding <= 2**-9 per operand element);
        # with fp32 accumulation the error of a sum stays near that: 1 % of the gradient's
        # norm bounds it with margin
        assert float((a - b).norm() / b.norm()) < 1e-2


def test_backward_mode_is_validated_and_restored():
    with pytest.raises(ValueError, match="backward mode"):
        with matmul_mode("int8", "fp16"):
            pass
    with matmul_mode("int8", "bf16"):
        assert ternary._mode == {"matmul": "int8", "backward": "bf16"}
    assert ternary._mode == {"matmul": "int8", "backward": "fp32"}
    with pytest.raises(ValueError, match="cpu_backward"):
        TrainConfig(steps=5, cpu_backward="fp16")


def test_auto_backward_is_bf16_only_where_the_cpu_has_avx512_bf16(monkeypatch):
    from tern.train.environment import resolve_cpu_backward

    assert TrainConfig(steps=5).cpu_backward == "auto"
    for has in (True, False):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda has=has: has)
        assert resolve_cpu_backward(TrainConfig(steps=5)) == ("bf16" if has else "fp32")
        for explicit in ("fp32", "bf16"):  # an explicit choice is kept on any CPU
            assert resolve_cpu_backward(TrainConfig(steps=5, cpu_backward=explicit)) == explicit
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")  # a torch without the probe
    assert resolve_cpu_backward(TrainConfig(steps=5)) == "fp32"


def test_fused_adamw_makes_the_foreach_update_to_fp32_rounding():
    tc = TrainConfig(steps=5)
    models = [build_model(TRAIN_TINY, seed=1) for _ in range(2)]
    fused = make_optimizer(models[0], tc, torch.device("cpu"))
    ref = torch.optim.AdamW(param_groups(models[1], tc.weight_decay), lr=tc.lr, betas=(tc.beta1, tc.beta2))
    assert fused.defaults["fused"] is True
    g = torch.Generator().manual_seed(2)
    for _ in range(3):  # the same gradients into both
        for pa, pb in zip(models[0].parameters(), models[1].parameters(), strict=True):
            pa.grad = torch.randn(pa.shape, generator=g) * 0.1
            pb.grad = pa.grad.clone()
        fused.step()
        ref.step()
    moved = 0.0
    for pa, pb, p0 in zip(models[0].parameters(), models[1].parameters(),
                          build_model(TRAIN_TINY, seed=1).parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)
        moved = max(moved, float((pa - p0).detach().abs().max()))
    assert moved > 1e-3  # the updates were not empty


def _source():
    rng = np.random.default_rng(0)
    tr = (np.cumsum(rng.integers(1, 4, 20000)) % 64).astype(np.uint16)
    va = (np.cumsum(rng.integers(1, 4, 1200)) % 64).astype(np.uint16)
    return ArraySource(tr, va, vocab_size=64)


def test_a_bf16_backward_run_trains_like_the_fp32_run(tmp_path):
    base = dict(steps=10, batch_size=4, seq_len=32, lr=1e-2, warmup_steps=3, log_every=1)
    r = {b: run_training(TRAIN_TINY, TrainConfig(**base, cpu_backward=b), tmp_path / b,
                         progress=False, data=_source()) for b in ("fp32", "bf16")}
    # rounding the gradients to bf16 changes the trajectory a little (codes flip); the
    # loss and the validation figure stay within 2 % (measured 0.1-0.3 % here)
    assert r["bf16"]["final_loss"] != r["fp32"]["final_loss"]  # the bf16 products did run
    assert r["bf16"]["cpu_backward"] == "bf16" and r["fp32"]["cpu_backward"] == "fp32"  # recorded
    assert r["bf16"]["final_loss"] == pytest.approx(r["fp32"]["final_loss"], rel=2e-2)
    assert r["bf16"]["val_nats_per_token"] == pytest.approx(r["fp32"]["val_nats_per_token"], rel=2e-2)


def test_fused_causal_attention_matches_the_masked_form(monkeypatch):
    from tern.train.model import attention

    calls = []
    real = attention.F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    att = attention.SlidingWindowAttention(TRAIN_TINY.replace(attn_window=32)).train()
    x = torch.randn(3, 20, TRAIN_TINY.d_model, generator=torch.Generator().manual_seed(6), requires_grad=True)
    outs, grads = {}, {}
    for fused in (True, False):
        att.fused = fused
        y, _ = att(x, need_state=False)
        outs[fused] = y
        grads[fused] = torch.autograd.grad(y.square().sum(), [x, att.qkv.weight])
    assert len(calls) == 1  # the fused kernel ran once, for fused=True only
    torch.testing.assert_close(outs[True], outs[False], rtol=1e-5, atol=1e-6)  # fp32 rounding
    for a, b in zip(grads[True], grads[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    short = attention.SlidingWindowAttention(TRAIN_TINY).train()  # window 8 < 20 positions
    short.load_state_dict(att.state_dict())
    y_short, _ = short(x, need_state=False)
    assert len(calls) == 1 and not torch.allclose(y_short, outs[False])  # the masked form, a real window
