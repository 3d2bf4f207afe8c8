"""Distillation losses: logit KD, first-byte marginal, byte alignment of windows, byte KD."""

import math

import pytest
import torch

from tern.train.distill import (
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


# ---- training with a teacher (real tern.train pieces, synthetic token streams) ----------------

train_mod = pytest.importorskip("tern.train", reason="tern.train is not importable yet")

TINY = dict(d_model=32, n_layers=1, attn_layers=(), moe_layers=(), mlp_hidden=64, n_experts=0,
            top_k=0, expert_hidden=0, n_shared=0, shared_hidden=0, max_seq_len=64)


def tiny(vocab, **kw):
    from tern.core.config import get_preset

    return get_preset("sandbox").replace(**{**TINY, "vocab_size": vocab, **kw})


def student_vocab():
    """64 tokens: 32 single bytes 'A'.. and 32 two-byte tokens."""
    singles = [bytes([65 + i]) for i in range(32)]
    pairs = [bytes([65 + i % 32, 65 + (7 * i) % 32]) for i in range(32)]
    return singles + pairs


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import numpy as np

    from tern.train.batches import ArraySource
    from tern.train.config import TrainConfig
    from tern.train.loop import run_training

    d = tmp_path_factory.mktemp("distill")
    rng = np.random.default_rng(0)
    stu = ArraySource(rng.integers(0, 64, 3000), rng.integers(0, 64, 300), vocab_size=64)
    vocab = student_vocab()
    text = b"".join(vocab[i] for i in rng.integers(0, 64, 3000))
    byt = ArraySource(np.frombuffer(text, dtype=np.uint8).astype(np.int64), np.arange(65, 165) % 256, vocab_size=256)
    t_same = tiny(64, d_model=48)
    run_training(t_same, TrainConfig(steps=2, batch_size=2, seq_len=16, seed=5), d / "same",
                 progress=False, data=stu)
    t_byte = tiny(256, d_model=48)
    run_training(t_byte, TrainConfig(steps=2, batch_size=2, seq_len=32, seed=5, tokenizer="byte"),
                 d / "byte", progress=False, data=byt)
    return {"stu": stu, "vocab": vocab, "same": d / "same" / "checkpoint.pt", "t_same": t_same,
            "byte": d / "byte" / "checkpoint.pt", "t_byte": t_byte}


def test_alpha_zero_reproduces_run_training(setup):
    from tern.train.config import TrainConfig
    from tern.train.distill import run_distill
    from tern.train.loop import run_training

    cfg, tc = tiny(64), TrainConfig(steps=3, batch_size=2, seq_len=16, seed=1)
    plain = run_training(cfg, tc, progress=False, data=setup["stu"])
    kd0 = run_distill(cfg, tc, teacher_checkpoint=setup["same"], teacher_cfg=setup["t_same"],
                      distill={"method": "logit", "alpha": 0.0}, progress=False, data=setup["stu"])
    assert kd0["val_nats_per_token"] == plain["val_nats_per_token"]
    assert kd0["final_loss"] == plain["final_loss"] and kd0["train_tokens"] == plain["train_tokens"]


@pytest.mark.parametrize("method", ["logit", "byte"])
def test_distill_trains_with_a_kd_term(setup, method):
    from tern.train.config import TrainConfig
    from tern.train.distill import run_distill
    from tern.train.loop import run_training

    cfg, tc = tiny(64), TrainConfig(steps=3, batch_size=2, seq_len=16, seed=1)
    ck, tcfg = (setup["same"], setup["t_same"]) if method == "logit" else (setup["byte"], setup["t_byte"])
    r = run_distill(cfg, tc, teacher_checkpoint=ck, teacher_cfg=tcfg,
                    distill={"method": method, "alpha": 0.5, "temperature": 2.0}, progress=False,
                    data=setup["stu"], token_bytes=setup["vocab"])
    plain = run_training(cfg, tc, progress=False, data=setup["stu"])
    assert math.isfinite(r["val_nats_per_token"]) and r["kd_loss"] > 0 and r["kd_alpha"] == 0.5
    assert r["val_nats_per_token"] != plain["val_nats_per_token"]  # the KD term changed training


def test_distill_refuses_mismatched_teachers(setup):
    from tern.train.config import TrainConfig
    from tern.train.distill import run_distill

    cfg, tc = tiny(64), TrainConfig(steps=1, batch_size=2, seq_len=16)
    with pytest.raises(ValueError, match="same tokenizer"):
        run_distill(cfg, tc, teacher_checkpoint=setup["byte"], distill={"method": "logit"},
                    progress=False, data=setup["stu"])
    with pytest.raises(ValueError, match="byte-tokenizer teacher"):
        run_distill(cfg, tc, teacher_checkpoint=setup["same"], distill={"method": "byte"},
                    progress=False, data=setup["stu"], token_bytes=setup["vocab"])
    with pytest.raises(ValueError, match="another model config"):
        run_distill(cfg, tc, teacher_checkpoint=setup["same"], teacher_cfg=setup["t_byte"],
                    distill={"method": "logit"}, progress=False, data=setup["stu"])


def test_token_byte_strings_of_the_byte_tokenizer():
    from tern.data.tokenizer import get_tokenizer
    from tern.train.distill import token_byte_strings

    tb = token_byte_strings(get_tokenizer("byte"))
    assert tb[65] == b"A" and len(tb) == 256


def test_token_byte_strings_of_the_shipped_bpe():
    from tern.data.tokenizer import get_tokenizer
    from tern.train.distill import token_byte_strings

    try:
        tok = get_tokenizer("bpe1024")
    except (FileNotFoundError, ValueError) as e:
        pytest.skip(f"shipped BPE tokenizer not available: {e}")
    tb = token_byte_strings(tok)
    text = "The quick brown fox, \u00e9t\u00e9 \u2014 ok\x1e"
    ids = tok.encode(text)
    assert b"".join(tb[i] for i in ids) == text.encode("utf-8")
