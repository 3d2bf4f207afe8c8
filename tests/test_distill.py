"""Distillation losses: logit KD, first-byte marginal, byte alignment of windows, byte KD."""

import math

import pytest
import torch

from tern.distill import (
    TokenBytes,
    byte_kd_loss,
    first_byte_marginal,
    logit_kd_loss,
    windows_as_bytes,
)

VOCAB = [b"a", b"ab", b"b", b"", b"ba"]  # token 3 has no bytes (a special)


def test_logit_kd_matches_hand_kl():
    s = torch.tensor([[0.0, math.log(3.0)]])  # p_S = [1/4, 3/4]
    t = torch.tensor([[0.0, 0.0]])  # p_T = [1/2, 1/2]
    kl = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert logit_kd_loss(s, t).item() == pytest.approx(kl, rel=1e-6)
    assert logit_kd_loss(t, t).item() == pytest.approx(0.0, abs=1e-7)
    # temperature: KL of the softened distributions times tau^2
    s2, t2 = s / 2, t / 2
    assert logit_kd_loss(s, t, temperature=2.0).item() == pytest.approx(4 * logit_kd_loss(s2, t2).item())
    with pytest.raises(ValueError, match="same tokenizer"):
        logit_kd_loss(torch.zeros(1, 3), torch.zeros(1, 4))


def test_first_byte_matrix_and_marginal():
    tb = TokenBytes.from_bytes(VOCAB)
    M = tb.first_byte_matrix()
    assert M.shape == (5, 256) and M.sum().item() == 4
    assert M[0, ord("a")] == M[1, ord("a")] == M[2, ord("b")] == M[4, ord("b")] == 1 and M[3].sum() == 0
    p = torch.tensor([0.4, 0.2, 0.1, 0.2, 0.1])  # 0.2 on the byte-less token is dropped
    logq = first_byte_marginal(torch.log(p), M)
    q = logq.exp()
    assert q[ord("a")].item() == pytest.approx(0.6 / 0.8)
    assert q[ord("b")].item() == pytest.approx(0.2 / 0.8)
    assert q.sum().item() == pytest.approx(1.0)


def test_windows_as_bytes_and_boundaries():
    tb = TokenBytes.from_bytes(VOCAB)
    tokens = torch.tensor([[1, 0, 3, 4], [2, 2, 0, 1]])  # "ab" "a" "" "ba" | "b" "b" "a" "ab"
    ids, n, boundary = windows_as_bytes(tokens, tb)
    assert n.tolist() == [5, 5]
    assert bytes(ids[0, :5].tolist()) == b"ababa" and bytes(ids[1, :5].tolist()) == b"bbaab"
    assert boundary.tolist() == [[1, 2, 2, 4], [0, 1, 2, 4]]


def test_byte_kd_zero_when_teacher_equals_student_marginal_and_grad_reaches_student():
    torch.manual_seed(0)
    tb = TokenBytes.from_bytes(VOCAB)
    M = tb.first_byte_matrix()
    tokens = torch.tensor([[1, 0, 4]])
    _, _, boundary = windows_as_bytes(tokens, tb)
    s = torch.randn(1, 3, 5, requires_grad=True)
    # a byte teacher whose next-byte distribution at every byte equals the student marginal
    logq = first_byte_marginal(s.detach(), M)  # (1, 3, 256)
    t = torch.full((1, 5, 256), -1e4)
    for j, b in enumerate(boundary[0].tolist()):
        t[0, b] = logq[0, j]
    assert byte_kd_loss(s, t, boundary, M).item() == pytest.approx(0.0, abs=1e-5)
    t2 = torch.randn(1, 5, 256)
    loss = byte_kd_loss(s, t2, boundary, M)
    assert loss.item() > 0
    loss.backward()
    assert s.grad is not None and s.grad.abs().sum() > 0


def test_byte_kd_picks_teacher_byte_ids():
    tb = TokenBytes.from_bytes(VOCAB)
    M = tb.first_byte_matrix()
    tokens = torch.tensor([[0, 2]])
    _, _, boundary = windows_as_bytes(tokens, tb)
    s = torch.zeros(1, 2, 5)
    t = torch.zeros(1, 2, 257)  # a teacher with one extra special token
    with pytest.raises(ValueError, match="teacher_byte_ids"):
        byte_kd_loss(s, t, boundary, M)
    v = byte_kd_loss(s, t, boundary, M, teacher_byte_ids=torch.arange(256))
    assert math.isfinite(v.item())
