"""The torch model against docs/MODEL.md: BitLinear, scans, step form, MoE, shapes."""

import numpy as np
import pytest
import torch

from tern.core.config import PRESETS, ModelConfig, param_counts, tensor_specs
from tern.train.model.generate import generate_ids
from tern.train.model.lm import build_model
from tern.train.model.moe import route
from tern.train.model.scan import torch_scan
from tern.train.model.scan_numba import numba_scan
from tern.train.model.ternary import bitlinear, weight_ternary

TINY = ModelConfig(name="tiny", vocab_size=64, d_model=32, n_layers=3, attn_layers=(1,), n_heads=2,
                   attn_window=5, d_state=4, mlp_hidden=0, moe_layers=(0, 1, 2), n_experts=6,
                   top_k=2, expert_hidden=16, n_shared=1, shared_hidden=24, max_seq_len=32)


def explicit_bitlinear(x, w, eps):
    """docs/MODEL.md BitLinear in float64 numpy with an explicit integer dot product."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    s = np.maximum(np.abs(w).mean(1), 1e-8)  # (out,)
    wt = np.clip(np.rint(w / s[:, None]), -1, 1).astype(np.int64)
    u = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
    a = np.maximum(np.abs(u).max(-1, keepdims=True), 1e-5)
    q = np.clip(np.rint(u * 127 / a), -127, 127).astype(np.int64)
    return s * (a / 127) * (q @ wt.T)


def test_bitlinear_equals_explicit_ternary_int8_matmul():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(7, 48, generator=g), torch.randn(20, 48, generator=g) * 0.05
    ref = explicit_bitlinear(x.numpy(), w.numpy(), 1e-5)
    y_eval = bitlinear(x, w, 1e-5, training=False).numpy()
    y_train = bitlinear(x, w, 1e-5, training=True).detach().numpy()
    np.testing.assert_allclose(y_eval, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y_train, ref, rtol=1e-4, atol=1e-5)


def test_weight_ternary_rounds_half_to_even_per_row():
    w = torch.tensor([[0.5, 1.5, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])  # row means 1.0 and 1.0
    wt, s = weight_ternary(w)
    assert s.squeeze(1).tolist() == [1.0, 1.0]
    assert wt.tolist() == [[0.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]]  # 0.5 -> 0, 1.5 -> 2 -> 1


def test_ste_gradients_reach_latent_weights():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 16, generator=g, requires_grad=True)
    w = (torch.randn(8, 16, generator=g) * 0.1).requires_grad_()
    gy = torch.randn(5, 8, generator=g)
    (bitlinear(x, w, 1e-5, training=True) * gy).sum().backward()
    # STE: dL/dW = gy^T @ (dequantized input), computed by hand
    u = x.detach() / torch.sqrt(x.detach().pow(2).mean(-1, keepdim=True) + 1e-5)
    a = u.abs().amax(-1, keepdim=True)
    uq = torch.round(u * 127 / a).clamp(-127, 127) * (a / 127)
    torch.testing.assert_close(w.grad, gy.t() @ uq)
    assert x.grad is not None and x.grad.abs().sum() > 0


def _scan_inputs(B=2, T=37, Di=12, N=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(B, T, Di, generator=g)
    dt = torch.rand(B, T, Di, generator=g) * 1.5
    A = -torch.rand(Di, N, generator=g) * 6
    Bm, Cm = torch.randn(B, T, N, generator=g), torch.randn(B, T, N, generator=g)
    return [t.requires_grad_() for t in (u, dt, A, Bm, Cm)], torch.randn(B, Di, N, generator=g)


def _loop_scan(u, dt, A, Bm, Cm, h):
    ys = []
    for t in range(u.shape[1]):
        h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * u[:, t])[..., None] * Bm[:, t, None, :]
        ys.append((h * Cm[:, t, None, :]).sum(-1))
    return torch.stack(ys, 1), h


@pytest.mark.parametrize("impl", ["numba", "torch"])
def test_parallel_scan_equals_recurrence_values_and_grads(impl):
    ins, h0 = _scan_inputs()
    y0, h_ref = _loop_scan(*ins, h0)
    y1, h1 = (numba_scan(*ins, h0) if impl == "numba" else torch_scan(*ins, h0=h0, chunk=8))
    torch.testing.assert_close(y1, y0, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(h1, h_ref, rtol=1e-5, atol=2e-5)
    gy = torch.randn_like(y0)
    g0 = torch.autograd.grad((y0 * gy).sum(), ins)
    g1 = torch.autograd.grad((y1 * gy).sum(), ins)
    for a, b in zip(g0, g1, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * float(a.abs().max()))


def test_model_forward_equals_step_and_prefill_with_ring_buffer():
    torch.manual_seed(0)
    m = build_model(TINY, seed=3).eval()
    tok = torch.randint(0, TINY.vocab_size, (2, 13))  # longer than attn_window 5: ring wraps
    with torch.no_grad():
        par = m(tok)  # (2, 13, V)
        st = m.init_state(2)
        steps = []
        for t in range(tok.shape[1]):
            lg, st = m.step(tok[:, t], st)
            steps.append(lg)
        torch.testing.assert_close(torch.stack(steps, 1), par, rtol=1e-4, atol=1e-4)
        _, st = m(tok[:, :7], return_state=True)
        rest = []
        for t in range(7, 13):
            lg, st = m.step(tok[:, t], st)
            rest.append(lg)
        torch.testing.assert_close(torch.stack(rest, 1), par[:, 7:], rtol=1e-4, atol=1e-4)
        for layer in m.layers:
            if hasattr(layer.mixer, "scan_impl"):
                layer.mixer.scan_impl = "torch"
        torch.testing.assert_close(m(tok), par, rtol=1e-4, atol=1e-4)


def test_training_step_bit_identical_across_runs():
    def run():
        m = build_model(TINY, seed=7).train()
        tok = torch.randint(0, TINY.vocab_size, (3, 16), generator=torch.Generator().manual_seed(1))
        logits = m(tok)
        (logits.square().mean() + m.aux_losses()["balance"]).backward()
        return logits.detach(), [p.grad.clone() for p in m.parameters()]

    (l1, g1), (l2, g2) = run(), run()
    assert torch.equal(l1, l2)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2, strict=True))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_state_dict_matches_tensor_specs_and_param_counts(name):
    cfg = PRESETS[name]
    big = param_counts(cfg).total.params > 50_000_000
    m = build_model(cfg, device="meta" if big else None)
    assert [(k, tuple(v.shape)) for k, v in m.state_dict().items()] == \
        [(s.name, s.shape) for s in tensor_specs(cfg)]
    assert sum(p.numel() for p in m.parameters()) == param_counts(cfg).total.params


def test_route_top_k_ties_lower_index_and_normalised_weights():
    logits = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.5], [2.0, 2.0, 2.0, 2.0, 2.0]])
    p, top, w = route(logits, 2)
    assert top.tolist() == [[1, 2], [0, 1]]
    torch.testing.assert_close(w.sum(-1), torch.ones(2))


def test_moe_equals_shared_plus_weighted_top_k_experts():
    torch.manual_seed(0)
    m = build_model(TINY, seed=5).eval()
    moe = m.layers[0].ffn
    x = torch.randn(1, 9, TINY.d_model)
    with torch.no_grad():
        out = moe(x)[0]  # (9, D)
        logits = x[0] @ moe.router.weight.t()
        _, top, w = route(logits, TINY.top_k)

        def expert(stack, e, v):
            gt = bitlinear(v, stack.gate[e], TINY.norm_eps, False)
            up = bitlinear(v, stack.up[e], TINY.norm_eps, False)
            return bitlinear(torch.relu(gt) * torch.relu(up), stack.down[e], TINY.norm_eps, False)

        for t in range(9):
            v = x[0, t:t + 1]
            ref = expert(moe.shared, 0, v)
            for j in range(TINY.top_k):
                ref = ref + w[t, j] * expert(moe.experts, int(top[t, j]), v)
            torch.testing.assert_close(out[t:t + 1], ref, rtol=1e-5, atol=1e-6)
    assert moe.load.counts.sum() == 9 * TINY.top_k


def test_moe_aux_losses_finite_and_load_and_sparsity_stats():
    m = build_model(TINY, seed=0).train()
    m(torch.randint(0, 64, (2, 20)))
    aux = m.aux_losses()
    assert torch.isfinite(aux["balance"]) and aux["balance"] >= 1.0 - 1e-5  # >= 1, = 1 if balanced
    assert torch.isfinite(aux["z"]) and aux["z"] > 0
    load = m.expert_load()
    assert [e["layer"] for e in load] == [0, 1, 2]
    assert all(e["assignments"] == 40 * TINY.top_k and e["max_over_mean"] >= 1 for e in load)
    assert all(s["zero_frac"] is None for s in m.sparsity())  # counted in eval passes only
    m.eval()
    with torch.no_grad():
        m(torch.randint(0, 64, (2, 20)))
    sp = m.sparsity()
    assert all(0.3 < s["zero_frac"] < 1 for s in sp)  # dReLU: about 3/4 zeros at init
    m2 = build_model(TINY.replace(activation="silu"), seed=0).eval()
    with torch.no_grad():
        m2(torch.randint(0, 64, (2, 20)))
    assert all(s["zero_frac"] < 0.01 for s in m2.sparsity())


def test_full_precision_group_format_is_a_plain_matmul():
    cfg = TINY.replace(moe_layers=(), mlp_hidden=16, mlp_format="fp32", n_experts=0, top_k=0,
                       expert_hidden=0, n_shared=0, shared_hidden=0)
    m = build_model(cfg, seed=0).eval()
    mlp = m.layers[0].ffn
    x = torch.randn(4, cfg.d_model)
    ref = (torch.relu(x @ mlp.gate.weight.t()) * torch.relu(x @ mlp.up.weight.t())) @ mlp.down.weight.t()
    torch.testing.assert_close(mlp(x.unsqueeze(0))[0], ref)


def test_bad_tokens_and_state_are_value_errors():
    m = build_model(TINY, seed=0)
    with pytest.raises(ValueError, match="token ids"):
        m(torch.tensor([[0, 64]]))
    with pytest.raises(ValueError, match="shape"):
        m(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="layers"):
        m.step(torch.tensor([1]), m.init_state(1)[:1])


def test_generate_ids_is_seeded_and_greedy_follows_argmax():
    m = build_model(TINY, seed=0)
    a = list(generate_ids(m, [1, 2, 3], 6, seed=4, temperature=1.0, top_k=10))
    b = list(generate_ids(m, [1, 2, 3], 6, seed=4, temperature=1.0, top_k=10))
    assert a == b and len(a) == 6
    g = list(generate_ids(m, [1, 2, 3], 4, temperature=0))
    with torch.no_grad():
        m.eval()
        seq = [1, 2, 3]
        for _ in range(4):
            seq.append(int(m(torch.tensor([seq]))[0, -1].argmax()))
    assert g == seq[3:]


def test_fused_cpu_quantizers_match_the_torch_forms():
    from tern.train.model.quant_numba import quant_input_cpu, ste_weight_cpu
    from tern.train.model.ternary import _STEAct, _STEWeight, rms_normalize

    g = torch.Generator().manual_seed(2)
    w = torch.randn(3, 40, 24, generator=g)
    torch.testing.assert_close(ste_weight_cpu(w), _STEWeight.apply(w), rtol=1e-6, atol=1e-6)
    half = torch.tensor([[0.5, 1.5, 1.0, 1.0], [2.5, -0.5, 0.5, 0.5]])  # row means 1: ties
    assert ste_weight_cpu(half).abs().tolist() == [[0, 1, 1, 1], [1, 0, 0, 0]]
    x = (torch.randn(5, 7, 48, generator=g) * 3).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    y1, y2 = _STEAct.apply(rms_normalize(x, 1e-5)), quant_input_cpu(x2, 1e-5)
    torch.testing.assert_close(y2, y1, rtol=1e-5, atol=1e-5)
    gy = torch.randn(y1.shape, generator=g)
    (y1 * gy).sum().backward()
    (y2 * gy).sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cols", [1, 7, 16, 48, 131])
def test_input_quantizer_row_reduction_is_the_exact_absmax(cols):
    """The fused quantizer takes max |x| from the bit patterns (an integer max): exactly
    numpy's max |x| for negative and positive maxima, all-zero rows and any row width, and
    the int8 codes are those of the torch form."""
    from tern.train.model.quant_numba import _sumsq_absmax_bits, quant_input_codes_cpu

    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((6, cols)) * 3).astype(np.float32)
    x[1, cols // 2] = -40.0  # the largest magnitude is negative
    x[2] = 0.0
    x[3, -1] = 39.5
    for r in range(x.shape[0]):
        ss, bits = _sumsq_absmax_bits(x, r)
        assert np.array([bits], np.int32).view(np.float32)[0] == np.abs(x[r]).max()
        assert ss == pytest.approx(float((x[r].astype(np.float64) ** 2).sum()), rel=1e-5)
    from tern.train.model.ternary import act_int8, rms_normalize

    _, codes, scale = quant_input_codes_cpu(torch.from_numpy(x), 1e-5)
    q, a = act_int8(rms_normalize(torch.from_numpy(x), 1e-5))
    assert torch.equal(codes.float(), q)
    torch.testing.assert_close(scale, a / 127, rtol=1e-6, atol=0)


@pytest.mark.parametrize("train", [True, False])
def test_moe_dispatch_modes_are_identical(train):
    m = build_model(TINY, seed=1).train(train)
    moe = m.layers[0].ffn
    x = torch.randn(2, 11, TINY.d_model, requires_grad=True)
    outs, grads = [], []
    for mode in ("loop", "padded", "auto"):
        moe.dispatch = mode
        y = moe(x)
        outs.append(y.detach())
        if train:
            grads.append(torch.autograd.grad(y.square().sum(), [x, moe.experts.gate])[1])
    if train:  # fp32 matmuls of other shapes: equal up to rounding
        torch.testing.assert_close(outs[1], outs[0])
        torch.testing.assert_close(grads[1], grads[0])
    else:  # eval: integer dot products, exact in both
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
