"""Training on CUDA (skipped where no GPU is present, as in CI): the same model and step as on
CPU, with bf16 autocast, the batched MoE dispatch and the torch chunked scan.

Run on a GPU machine with ``python -m pytest tests/train/test_cuda.py``; the results of the
GPU sessions are quoted in ``gates/v2/README.md``."""

import numpy as np
import pytest
import torch
from conftest import TRAIN_TINY
from test_train import source as _source  # the learnable toy corpus of the CPU tests

from tern.core.config import ModelConfig
from tern.train.checkpoint import load_checkpoint
from tern.train.config import TrainConfig
from tern.train.loop import make_nll_fn, run_training
from tern.train.model.lm import build_model
from tern.train.model.moe import grouped_available
from tern.train.model.scan import torch_scan

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# d_model a multiple of 16 and enough tokens that every expert gets rows: the batched dispatch
MOE = ModelConfig(name="cuda-moe", vocab_size=64, d_model=64, n_layers=3, attn_layers=(1,), n_heads=4,
                  attn_window=64, d_state=8, mlp_hidden=0, moe_layers=(0, 1, 2), n_experts=8, top_k=2,
                  expert_hidden=32, n_shared=1, shared_hidden=32, max_seq_len=64)


def _tc(**kw):
    base = dict(steps=40, batch_size=8, seq_len=64, lr=1e-2, warmup_steps=4, log_every=1, threads=0,
                device="cuda", eval_every=0, eval_tokens=512)
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("amp", [True, False])
def test_cuda_run_lowers_loss_and_its_checkpoint_loads_on_cpu(tmp_path, amp):
    r = run_training(MOE, _tc(amp=amp), tmp_path, progress=False, data=_source())
    assert str(r["device"]).startswith("cuda")
    assert r["steps"] == 40 and np.isfinite(r["final_loss"]) and r["tokens_per_s"] > 0
    assert r["val_nats_per_token"] < np.log(64) - 1.0  # learnt the steps, as on CPU
    model, mcfg, _, state = load_checkpoint(r["checkpoint"])  # a CUDA checkpoint, read on CPU
    assert mcfg == MOE and state["step"] == 40
    assert next(model.parameters()).device.type == "cpu"
    x = np.arange(64, dtype=np.int64)[None] % 64
    assert np.isfinite(make_nll_fn(model)(x[:, :-1], x[:, 1:]))


@pytest.mark.parametrize("cfg", [TRAIN_TINY, MOE], ids=["tiny", "moe"])
def test_cuda_forward_matches_cpu_forward(cfg):
    cpu = build_model(cfg, seed=3).eval()
    gpu = build_model(cfg, seed=3, device="cuda").eval()
    tokens = torch.randint(0, cfg.vocab_size, (4, cfg.max_seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = cpu(tokens)  # (B, T, V): numba kernels on CPU
        b = gpu(tokens.cuda()).float().cpu()  # torch paths on CUDA, fp32
    scale = a.abs().max().item()
    # int8 activation rounding may flip a code between devices (and cuDNN may run the
    # convolution in TF32): close, not bit-identical
    assert (a - b).abs().max().item() < 0.05 * scale, ((a - b).abs().max().item(), scale)
    assert (a - b).abs().mean().item() < 5e-3 * scale, ((a - b).abs().mean().item(), scale)
    other = build_model(cfg, seed=4).eval()
    with torch.no_grad():  # a different model is far further away
        assert (other(tokens) - a).abs().mean().item() > 20 * (a - b).abs().mean().item()


@pytest.mark.parametrize("mode", ["padded", "loop", "grouped"])
def test_cuda_moe_dispatch_modes_agree_with_cpu_loop(mode):
    if mode == "grouped" and not grouped_available("cuda"):  # bf16 torch._grouped_mm (Hopper builds)
        pytest.skip(f"torch {torch.__version__} has no CUDA torch._grouped_mm with a backward here")
    cpu = build_model(MOE, seed=5)
    gpu = build_model(MOE, seed=5, device="cuda")
    for m in cpu.modules():
        if hasattr(m, "dispatch"):
            m.dispatch = "loop"
    for m in gpu.modules():
        if hasattr(m, "dispatch"):
            m.dispatch = mode
    tokens = torch.randint(0, 64, (8, 64), generator=torch.Generator().manual_seed(2))
    a = cpu(tokens)  # training mode: the straight-through forward
    b = gpu(tokens.cuda())
    (a.float().square().mean()).backward()
    (b.float().square().mean()).backward()
    assert torch.allclose(a.detach(), b.detach().float().cpu(), rtol=0, atol=0.02 * a.abs().max().item())
    ga = cpu.embed.weight.grad
    gb = gpu.embed.weight.grad.float().cpu()
    assert torch.isfinite(gb).all() and (ga - gb).norm() < 0.05 * ga.norm()


def test_cuda_chunked_scan_matches_the_cpu_scan():
    g = torch.Generator().manual_seed(0)
    b, t, di, n = 2, 70, 24, 8
    u, dt = torch.randn(b, t, di, generator=g), torch.rand(b, t, di, generator=g) * 0.1
    A = -torch.rand(di, n, generator=g)
    Bm, Cm = torch.randn(b, t, n, generator=g), torch.randn(b, t, n, generator=g)
    y0, h0 = torch_scan(u, dt, A, Bm, Cm)
    y1, h1 = torch_scan(*(x.cuda() for x in (u, dt, A, Bm, Cm)))
    assert torch.allclose(y0, y1.cpu(), atol=1e-4, rtol=1e-4)
    assert torch.allclose(h0, h1.cpu(), atol=1e-4, rtol=1e-4)


def test_compile_on_cuda_trains(tmp_path):
    r = run_training(TRAIN_TINY, _tc(steps=6, batch_size=4, seq_len=32, compile=True), tmp_path,
                     progress=False, data=_source())
    assert r["steps"] == 6 and np.isfinite(r["final_loss"])
