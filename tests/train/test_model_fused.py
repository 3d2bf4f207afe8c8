"""Fused CPU training paths against their reference forms: the int8 BitLinear forward
(exact), the gated activation + quantizer kernel and the MoE combine kernel."""

import pytest
import torch

from tern.train.model import ffn_numba, moe_numba
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
