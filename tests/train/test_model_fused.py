"""Fused CPU training paths against their reference forms: the int8 BitLinear forward
(exact), the gated activation + quantizer kernel, the MoE routing and combine kernels, the
SSM's fused dt projection + softplus and skip + output gate."""

import numpy as np
import pytest
import torch

from tern.kernels.fastmath import fsigmoid
from tern.kernels.ssm_step import softplus
from tern.train.model import ffn_numba, moe_numba, ssm_numba
from tern.train.model.mlp import activation
from tern.train.model.moe import _combine
from tern.train.model.ternary import (
    Operand,
    _STEAct,
    matmul_mode,
    prepare_input,
    prepare_weight,
    qmatmul,
    rms_normalize,
)


def _operands(n=33, d_in=96, d_out=40, seed=0, lead=()):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*lead, n, d_in, generator=g) * 2).requires_grad_()
    w = (torch.randn(d_out, d_in, generator=g) * 0.05).requires_grad_()
    return x, w, torch.randn(*lead, n, d_out, generator=g)


def test_training_operands_carry_exact_int8_codes():
    x, w, _ = _operands()
    xi, wi = prepare_input(x, 1e-5, training=True), prepare_weight(w, training=True)
    assert xi.codes.dtype == torch.int8 and wi.codes.dtype == torch.int8
    assert torch.equal(xi.codes.float() * xi.code_scale, xi.values)
    assert torch.equal(wi.codes.float() * wi.code_scale, wi.values)
    assert set(wi.codes.unique().tolist()) <= {-1, 0, 1} and xi.codes.abs().max() == 127
    # eval operands have no codes: the literal integer product
    assert prepare_input(x, 1e-5, training=False).codes is None


def test_int8_forward_equals_the_eval_product_of_the_same_codes():
    x, w, _ = _operands()
    xi, wi = prepare_input(x, 1e-5, training=True), prepare_weight(w, training=True)
    y = qmatmul(xi, wi)  # int8 mode (default): torch._int_mm + (s * a/127) * acc
    acc = xi.codes.float() @ wi.codes.float().t()  # exact: |acc| <= 96 * 127 < 2**24
    ref = wi.code_scale.t() * xi.code_scale * acc  # qmatmul's eval form, same order
    assert torch.equal(y, ref)
    with matmul_mode("fp32"):  # dequantized fp32 product: equal up to fp32 rounding
        torch.testing.assert_close(qmatmul(xi, wi), y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lead", [(), (3,)])
def test_int8_backward_is_the_fp32_ste_backward(lead):
    grads = {}
    for mode in ("int8", "fp32"):
        x, w, gy = _operands(lead=lead)
        with matmul_mode(mode):
            y = qmatmul(prepare_input(x, 1e-5, training=True), prepare_weight(w, training=True))
        (y * gy).sum().backward()
        grads[mode] = (x.grad, w.grad)
    if not lead:  # the same mm calls on the same operands: bit-identical
        assert all(torch.equal(a, b) for a, b in zip(grads["int8"], grads["fp32"], strict=True))
    else:  # fp32 mode differentiates a batched matmul: equal up to summation order
        for a, b in zip(grads["int8"], grads["fp32"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_matmul_mode_is_validated_and_restored():
    with pytest.raises(ValueError, match="matmul mode"):
        with matmul_mode("bf16"):
            pass
    x, w, _ = _operands()
    xi, wi = prepare_input(x, 1e-5, training=True), prepare_weight(w, training=True)
    with matmul_mode("fp32"):
        assert qmatmul(xi, wi).grad_fn.name() == "MmBackward0"
    assert "Int8MatmulSTE" in qmatmul(xi, wi).grad_fn.name()


@pytest.mark.parametrize("act", ["drelu", "relu2", "silu"])
def test_gated_act_quant_matches_the_torch_chain(act):
    g = torch.Generator().manual_seed(3)
    gu = (torch.randn(2, 29, 2 * 24, generator=g) * 2).requires_grad_()
    gu2 = gu.detach().clone().requires_grad_()
    v, q, c = ffn_numba.gated_act_quant(gu, act, 1e-5)
    ref = _STEAct.apply(rms_normalize(activation(act, gu2[..., :24], gu2[..., 24:]), 1e-5))
    assert v.shape == (2, 29, 24) and q.dtype == torch.int8 and c.shape == (2, 29, 1)
    assert torch.equal(q.float() * c, v)
    torch.testing.assert_close(v, ref, rtol=1e-5, atol=1e-5)  # reciprocals: fp32 rounding
    gy = torch.randn(v.shape, generator=g)
    (v * gy).sum().backward()
    (ref * gy).sum().backward()
    torch.testing.assert_close(gu.grad, gu2.grad, rtol=1e-5, atol=1e-5)
    if act != "silu":  # relu gates: exact zeros where the torch form has them
        assert torch.equal(gu.grad == 0, gu2.grad == 0)


def test_gated_act_quant_rejects_bad_input():
    with pytest.raises(ValueError, match="activation"):
        ffn_numba.gated_act_quant(torch.zeros(2, 8), "gelu", 1e-5)
    with pytest.raises(ValueError, match="even"):
        ffn_numba.gated_act_quant(torch.zeros(2, 7), "drelu", 1e-5)


def test_combine_kernel_matches_the_torch_form():
    g = torch.Generator().manual_seed(4)
    n, k, d = 41, 3, 24
    y = torch.randn(n * k, d, generator=g, requires_grad=True)
    w = torch.rand(n, k, generator=g, requires_grad=True)
    order = torch.randperm(n * k, generator=g)
    out = moe_numba.combine(y, w, order)
    ref = (w.unsqueeze(-1) * torch.empty_like(y).index_copy(0, order, y).view(n, k, d)).sum(1)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    gy = torch.randn(n, d, generator=g)
    ga = torch.autograd.grad((out * gy).sum(), [y, w])
    gb = torch.autograd.grad((ref * gy).sum(), [y, w])
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # the MoE layer's dispatcher picks the kernel on CPU float32
    assert "Combine" in _combine(y, w, order).grad_fn.name()


@pytest.mark.parametrize("n_experts, k", [(8, 4), (64, 4), (6, 6), (5, 1)])
def test_top_k_kernel_is_the_stable_descending_sort(n_experts, k):
    g = torch.Generator().manual_seed(n_experts + k)
    # few distinct values: many ties, which must keep the lower expert index first
    p = torch.randint(0, 4, (300, n_experts), generator=g).float() / 4
    p[7, :] = 0.5  # a row of equal values
    p[11, 2] = float("nan")  # NaN ranks above every number, as in torch's sort
    p[13, :] = float("nan")
    ref = torch.sort(p, dim=-1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(moe_numba.top_k_indices(p, k), ref)
    q = torch.softmax(torch.randn(257, n_experts, generator=g), -1)
    ref = torch.sort(q, dim=-1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(moe_numba.top_k_indices(q, k), ref)
    with pytest.raises(ValueError, match="top_k"):
        moe_numba.top_k_indices(q, n_experts + 1)


def test_dispatch_order_is_the_stable_sort_with_its_counts():
    g = torch.Generator().manual_seed(9)
    for n_experts in (1, 8, 64):
        flat = torch.randint(0, n_experts, (4096,), generator=g)
        flat[:50] = n_experts - 1  # an unbalanced head, and experts that get nothing
        order, counts = moe_numba.dispatch_order(flat, n_experts)
        assert torch.equal(order, torch.sort(flat, stable=True).indices)
        assert counts == torch.bincount(flat, minlength=n_experts).tolist()


def test_operand_maps_and_splits_every_tensor():
    x, w, _ = _operands(n=6)
    xi = prepare_input(x, 1e-5, training=True)
    idx = torch.tensor([5, 0, 0, 2])
    gathered = xi.map(lambda t: t.index_select(0, idx))
    assert all(t.shape[0] == 4 for t in gathered if t is not None) and gathered.scale is None
    parts = gathered.parts(lambda t: torch.split(t, [1, 3]))
    assert [p.codes.shape[0] for p in parts] == [1, 3]
    assert torch.equal(parts[1].codes[0], xi.codes[0]) and isinstance(parts[0], Operand)


def test_causal_conv_silu_matches_torch_conv1d():
    import torch.nn.functional as F

    from tern.train.model import conv_numba

    g = torch.Generator().manual_seed(5)
    nb, nt, di, k = 3, 11, 40, 4
    x = torch.randn(nb, nt, 2 * di, generator=g, requires_grad=True)  # u: a strided half, as in the mixer
    tail = torch.randn(nb, di, k - 1, generator=g)
    w = torch.randn(di, k, generator=g, requires_grad=True)
    b = torch.randn(di, generator=g, requires_grad=True)
    out = conv_numba.causal_conv_silu(x[..., :di], tail, w, b)
    upad = torch.cat([tail, x[..., :di].transpose(1, 2)], 2)  # (B, Di, K-1+T)
    ref = F.silu(F.conv1d(upad, w.unsqueeze(1), b, groups=di)).transpose(1, 2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    gy = torch.randn(out.shape, generator=g)
    ga = torch.autograd.grad((out * gy).sum(), [x, w, b])
    gb = torch.autograd.grad((ref * gy).sum(), [x, w, b])
    for a, c in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)
    assert torch.equal(ga[0][..., di:], torch.zeros(nb, nt, di))  # z half: no gradient


def test_vectorisable_softplus_and_sigmoid_match_float64():
    x = np.concatenate([np.linspace(-85, 40, 20001), [-1e-30, 0.0, 1e-30, 25.0]]).astype(np.float32)
    xd = x.astype(np.float64)
    ref_sp = np.logaddexp(0.0, xd)
    ref_sg = 1.0 / (1.0 + np.exp(-xd))
    sp = np.array([softplus(v) for v in x], np.float64)
    sg = np.array([fsigmoid(v) for v in x], np.float64)
    bound = 3e-7 + 1.2e-7 * np.abs(xd)  # the exp's argument rounding grows with |x|
    assert np.all(np.abs(sp / ref_sp - 1) < bound)
    assert np.all(np.abs(sg / ref_sg - 1) < bound)
    assert np.max(np.abs(sp / ref_sp - 1)[np.abs(xd) < 3]) < 4e-7
    far = np.array([softplus(v) for v in np.linspace(-120, -85, 99).astype(np.float32)])
    assert np.all(far >= 0) and np.all(far < 2e-37)  # subnormal range: absolute error only


@pytest.mark.parametrize("lead, rank, di", [((1024,), 8, 256), ((3, 37), 5, 40), ((2, 1), 16, 7)])
def test_dt_projection_kernel_matches_linear_softplus(lead, rank, di):
    g = torch.Generator().manual_seed(rank)
    x = (torch.randn(*lead, rank, generator=g) * 2).requires_grad_()
    w = (torch.randn(di, rank, generator=g) * rank ** -0.5).requires_grad_()
    b = (torch.randn(di, generator=g) * 3 - 4).requires_grad_()
    with torch.no_grad():
        x[..., 0].mul_(15)  # arguments well past softplus' threshold of 20 and far below 0
    out = ssm_numba.dt_proj_softplus(x, w, b)
    ref = torch.nn.functional.softplus(torch.nn.functional.linear(x, w, b))
    torch.testing.assert_close(out, ref, rtol=2e-6, atol=1e-7)
    gy = torch.randn(ref.shape, generator=g)
    ga = torch.autograd.grad((out * gy).sum(), [x, w, b])
    gb = torch.autograd.grad((ref * gy).sum(), [x, w, b])
    for a, r in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5 * float(r.abs().max()))
    # deterministic: the same bits on a second call
    again = torch.autograd.grad((ssm_numba.dt_proj_softplus(x, w, b) * gy).sum(), [x, w, b])
    assert all(torch.equal(a, c) for a, c in zip(ga, again, strict=True))


def test_ssm_mixer_takes_the_fused_dt_projection_only_in_cpu_training():
    from tern.core.config import ModelConfig
    from tern.train.model.ssm import SSMMixer

    cfg = ModelConfig(name="t", vocab_size=64, d_model=32, n_layers=1, attn_layers=(), n_heads=2,
                      d_state=4, mlp_hidden=0, max_seq_len=16)
    mx = SSMMixer(cfg)
    uc = torch.randn(2, 5, cfg.d_inner)
    dt, _, _ = mx._proj(uc)
    assert "DtProjSoftplus" in dt.grad_fn.name()
    y, z = torch.randn(2, 5, cfg.d_inner), torch.randn(2, 5, cfg.d_inner)
    gated = mx._skip_gate(y, uc, z)
    assert "SkipGate" in gated.grad_fn.name()
    with torch.no_grad():
        dt_eval, _, _ = mx._proj(uc)
        gated_eval = mx._skip_gate(y, uc, z)
    assert gated_eval.grad_fn is None
    torch.testing.assert_close(dt_eval, dt.detach(), rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(gated_eval, gated.detach(), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(8, 128, 256), (3, 7, 40), (1, 1, 5)])
def test_skip_gate_kernel_matches_torch(shape):
    g = torch.Generator().manual_seed(shape[-1])
    y, u, z = (torch.randn(*shape, generator=g).requires_grad_() for _ in range(3))
    with torch.no_grad():
        z.view(-1)[:3] = torch.tensor([40.0, -40.0, 0.0])[:z.numel()]  # the sigmoid's far ends
    dsk = (torch.rand(shape[-1], generator=g) + 0.5).requires_grad_()
    out = ssm_numba.skip_gate(y, u, z, dsk)
    ref = (y + dsk * u) * torch.nn.functional.silu(z)
    torch.testing.assert_close(out, ref, rtol=2e-6, atol=1e-6)
    gy = torch.randn(shape, generator=g)
    ga = torch.autograd.grad((out * gy).sum(), [y, u, z, dsk])
    gb = torch.autograd.grad((ref * gy).sum(), [y, u, z, dsk])
    for a, r in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5 * float(r.abs().max()))


def test_head_product_backward_in_bf16_only_in_that_mode():
    from tern.train.model.ternary import dense_product

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9, 32, generator=g, requires_grad=True)
    w = (torch.randn(50, 32, generator=g) * 0.1).requires_grad_()
    gy = torch.randn(2, 9, 50, generator=g)
    ref = x @ w.t()
    g_ref = torch.autograd.grad((ref * gy).sum(), [x, w])
    y32 = dense_product(x, w)  # default mode: the plain fp32 product
    assert torch.equal(y32, ref) and "Bf16" not in y32.grad_fn.name()
    with matmul_mode("fp32", "bf16"):  # the fp32 reference mode keeps an fp32 backward
        assert "Bf16" not in dense_product(x, w).grad_fn.name()
    with matmul_mode("int8", "bf16"):
        y = dense_product(x, w)
        with torch.no_grad():
            assert dense_product(x, w).grad_fn is None
    assert "Bf16BackwardProduct" in y.grad_fn.next_functions[0][0].name()  # under the reshape
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)  # the forward stays fp32
    g_bf = torch.autograd.grad((y * gy).sum(), [x, w])
    for a, r in zip(g_bf, g_ref, strict=True):
        assert a.dtype == torch.float32 and not torch.equal(a, r)  # rounded operands ...
        torch.testing.assert_close(a, r, rtol=0.02, atol=0.02 * float(r.abs().max()))  # ... bf16's 8 bits


def test_fused_kernels_refuse_shapes_they_would_read_past():
    p = torch.softmax(torch.randn(4, 8), -1)
    with pytest.raises(ValueError, match="shape"):
        moe_numba.top_k_indices(p[0], 2)
    with pytest.raises(ValueError, match="expert ids"):
        moe_numba.dispatch_order(torch.tensor([0, 3, 8]), 8)  # 8 is not an expert of 8
    with pytest.raises(ValueError, match="expert ids"):
        moe_numba.dispatch_order(torch.tensor([-1, 2]), 8)
    with pytest.raises(ValueError, match="dt_proj_softplus"):
        ssm_numba.dt_proj_softplus(torch.randn(5, 8), torch.randn(16, 4), torch.randn(16))
    with pytest.raises(ValueError, match="dt_proj_softplus"):
        ssm_numba.dt_proj_softplus(torch.randn(5, 4), torch.randn(16, 4), torch.randn(15))
    with pytest.raises(ValueError, match="skip_gate"):
        ssm_numba.skip_gate(torch.randn(2, 6), torch.randn(2, 6), torch.randn(2, 5), torch.ones(6))
    with pytest.raises(ValueError, match="skip_gate"):
        ssm_numba.skip_gate(torch.randn(2, 6), torch.randn(2, 6), torch.randn(2, 6), torch.ones(5))
    from tern.train.model import conv_numba

    x, tail, w, b = torch.randn(2, 5, 6), torch.randn(2, 6, 3), torch.randn(6, 4), torch.randn(6)
    assert conv_numba.causal_conv_silu(x, tail, w, b).shape == (2, 5, 6)
    for bad in ((x, tail, torch.randn(7, 4), b), (x, tail, w, torch.randn(5)), (x, torch.randn(2, 6, 2), w, b),
                (x[0], tail, w, b)):
        with pytest.raises(ValueError, match="causal_conv_silu"):
            conv_numba.causal_conv_silu(*bad)
