"""Training: configs, schedules, a tiny run, resume == uninterrupted, checkpoints, DDP."""

import json
import os
import socket

import numpy as np
import pytest
import torch
from conftest import TRAIN_TINY

from tern.core.config import ModelConfig
from tern.core.records import read_jsonl
from tern.train.batches import ArraySource, sample_windows, val_windows
from tern.train.checkpoint import load_checkpoint
from tern.train.cli import cli_render
from tern.train.config import TrainConfig, schedule
from tern.train.launch import preset_configs, train_auto
from tern.train.loop import make_nll_fn, run_training
from tern.train.plots import plot_run


def source():
    rng = np.random.default_rng(0)
    tr = (np.cumsum(rng.integers(1, 4, 20000)) % 64).astype(np.uint16)  # learnable steps
    va = (np.cumsum(rng.integers(1, 4, 1200)) % 64).astype(np.uint16)
    return ArraySource(tr, va, vocab_size=64)


def tc(**kw):
    base = dict(steps=12, batch_size=4, seq_len=32, lr=1e-2, warmup_steps=3, log_every=1,
                threads=0)
    return TrainConfig(**{**base, **kw})


def losses(out):
    return [r["loss"] for r in read_jsonl(out / "train_log.jsonl") if r["record"] == "train_step"]


@pytest.mark.parametrize("kw, match", [
    ({"steps": 0}, "budget"), ({"steps": 5, "minutes": 1.0}, "budget"), ({"lr": 0}, "lr"),
    ({"schedule": "linear"}, "schedule"), ({"batch_size": 0}, "batch_size"),
    ({"device": "tpu"}, "device"), ({"amp": 1}, "amp"), ({"cpu_matmul": "bf16"}, "cpu_matmul"),
])
def test_train_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**{"steps": 5, **kw})
    with pytest.raises(ValueError, match="unknown"):
        TrainConfig.from_dict({"steps": 5, "learning_rate": 1})


def test_schedules():
    c = TrainConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_frac=0.1, weight_decay=0.1)
    assert schedule(c, 0, 0.0)[0] == pytest.approx(0.1)  # warm-up
    assert schedule(c, 10, 0.1)[0] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + np.cos(0.1 * np.pi)))
    assert schedule(c, 99, 1.0) == (pytest.approx(0.1), 0.1)
    t = c.replace(schedule="two_stage", stage2_at=0.5, stage2_lr_frac=0.4)
    assert schedule(t, 40, 0.4) == (1.0, 0.1)
    lr, wd = schedule(t, 50, 0.5)
    assert lr == pytest.approx(0.4) and wd == 0.0  # LR drop, weight decay off
    assert schedule(t, 99, 1.0)[0] == pytest.approx(0.1)


def test_data_windows_are_deterministic_and_cover_validation_once():
    toks = np.arange(100)
    a = sample_windows(toks, 1, 5, 3, 8)
    assert a.shape == (3, 9) and np.array_equal(a, sample_windows(toks, 1, 5, 3, 8))
    assert np.all(np.diff(a, axis=1) == 1)
    w = val_windows(toks, 10)
    assert w.shape == (9, 11) and np.array_equal(w[:, 1:].ravel(), np.arange(1, 91))
    with pytest.raises(ValueError, match="tokens"):
        ArraySource(np.arange(10), np.arange(5), vocab_size=8)


def test_tiny_run_lowers_loss_and_reports(tmp_path):
    r = run_training(TRAIN_TINY, tc(steps=30, eval_every=15, eval_tokens=256), tmp_path, progress=False,
                     data=source())
    ls = losses(tmp_path)
    assert len(ls) == 30 and np.mean(ls[-5:]) < np.mean(ls[:5]) - 1.0
    assert r["steps"] == 30 and r["train_tokens"] == 30 * 4 * 32 and r["tokens_per_s"] > 0
    assert r["val_nats_per_token"] < np.log(64) - 1.0
    assert [e["step"] for e in r["evals"]] == [15, 30]
    assert len(r["sparsity"]) == 2 and all(0 < s["zero_frac"] < 1 for s in r["sparsity"])
    assert [e["layer"] for e in r["expert_load"]] == [0, 1]
    assert json.loads((tmp_path / "result.json").read_text())["steps"] == 30
    # the checkpoint reloads into the same function
    model, mcfg, tcfg, state = load_checkpoint(r["checkpoint"])
    assert mcfg == TRAIN_TINY and tcfg.steps == 30 and state["step"] == 30
    x = np.arange(32, dtype=np.int64)[None] % 64
    nll = make_nll_fn(model)(x[:, :-1], x[:, 1:])
    assert np.isfinite(nll) and nll > 0
    paths = plot_run(tmp_path / "train_log.jsonl", tmp_path / "plots")
    assert [p.name for p in paths] == ["train_curves.png", "train_sparsity.png", "train_expert_load.png"]
    named = plot_run(tmp_path / "train_log.jsonl", tmp_path / "plots", prefix="train_sandbox")
    assert named[0].name == "train_sandbox_curves.png"
    assert all(p.stat().st_size > 1000 for p in paths)
    text = cli_render(r)
    assert "30 steps" not in text and "steps 30" in text and "layer 1 experts" in text


def test_cpu_matmul_modes_train_alike_and_global_settings_are_restored(tmp_path):
    from torch.utils import deterministic

    from tern.train.model import ternary

    before = (deterministic.fill_uninitialized_memory, torch.are_deterministic_algorithms_enabled(),
              ternary._mode["matmul"])
    for m in ("int8", "fp32"):
        run_training(TRAIN_TINY, tc(steps=8, cpu_matmul=m), tmp_path / m, progress=False, data=source())
    # int8: the exact forward of the fp32 mode's operands, the same STE backward: the first
    # step agrees to fp32 rounding; later ones drift apart a little as rounding differences
    # flip quantization codes and routing (measured 0.35 % after 6 steps at lr 1e-2)
    a, b = losses(tmp_path / "int8"), losses(tmp_path / "fp32")
    assert a[0] == pytest.approx(b[0], rel=1e-5)
    np.testing.assert_allclose(a, b, rtol=2e-2)
    assert (deterministic.fill_uninitialized_memory, torch.are_deterministic_algorithms_enabled(),
            ternary._mode["matmul"]) == before


def test_compile_on_cpu_is_a_clear_error_before_any_step(tmp_path):
    """torch.compile cannot trace the CPU step's numba kernels (measured: an AssertionError
    from inside torch._dynamo on the first step); the run refuses up front."""
    with pytest.raises(ValueError, match="compile=True needs a CUDA device"):
        run_training(TRAIN_TINY, tc(steps=2, compile=True, device="cpu"), tmp_path, progress=False,
                     data=source())
    assert not (tmp_path / "checkpoint.pt").exists()


def test_train_auto_trains_in_process_without_several_gpus(tmp_path):
    r = train_auto(TRAIN_TINY, tc(steps=2, device="cpu"), tmp_path, progress=False, data=source())
    assert r["world_size"] == 1 and r["steps"] == 2 and r["device"] == "cpu"


def test_preset_configs_and_cli_arguments():
    m, t = preset_configs("sandbox", smoke=True)
    assert m.name == "sandbox" and t.steps == 3 and t.final_eval_tokens > 0
    m, t = preset_configs("30m", minutes=5)
    assert t.minutes == 5 and t.steps == 0 and t.seq_len == 256
    import argparse

    from tern.train.cli import cli_configure, configs_from_args

    p = argparse.ArgumentParser()
    cli_configure(p)
    m, t = configs_from_args(p.parse_args(["--preset", "sandbox", "--steps", "7", "--set", "d_state=8",
                                           "--train-set", "schedule=two_stage", "--lr", "0.01"]))
    assert m.d_state == 8 and t.steps == 7 and t.schedule == "two_stage" and t.lr == 0.01
    m, t = configs_from_args(p.parse_args([]))
    assert t.minutes == 20.0
    with pytest.raises(ValueError, match="unknown"):
        configs_from_args(p.parse_args(["--set", "bogus=1"]))


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    c = tc(steps=10, schedule="two_stage")
    run_training(TRAIN_TINY, c, tmp_path / "a", progress=False, data=source())
    part = run_training(TRAIN_TINY, c, tmp_path / "b", progress=False, data=source(), stop_at_step=4)
    assert part["steps"] == 4 and "val_bpb" not in part
    run_training(TRAIN_TINY, c, tmp_path / "b", progress=False, data=source(),
                 resume=tmp_path / "b" / "checkpoint.pt")
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    a = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bad_checkpoints_are_value_errors(tmp_path):
    r = run_training(TRAIN_TINY, tc(steps=2), tmp_path, progress=False, data=source())
    good = r["checkpoint"]
    with pytest.raises(ValueError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")
    bad = tmp_path / "corrupt.pt"
    bad.write_bytes(open(good, "rb").read()[:1000])
    with pytest.raises(ValueError, match="corrupt"):
        load_checkpoint(bad)
    blob = torch.load(good, weights_only=True)
    for change, match in (({"format": "other"}, "not a tern checkpoint"), ({"version": 99}, "version"),
                          ({"model_config": "{"}, "configuration")):
        p = tmp_path / "x.pt"
        torch.save({**blob, **change}, p)
        with pytest.raises(ValueError, match=match):
            load_checkpoint(p)
    sd = dict(blob["model"])
    sd["embed.weight"] = sd["embed.weight"][:10]
    torch.save({**blob, "model": sd}, tmp_path / "y.pt")
    with pytest.raises(ValueError, match="do not match"):
        load_checkpoint(tmp_path / "y.pt")
    with pytest.raises(ValueError, match="other model or train configs"):
        run_training(TRAIN_TINY, tc(steps=3), tmp_path / "z", progress=False, data=source(), resume=good)


def _ddp_worker(rank, world, port, out, cfg_json, tc_json):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        run_training(ModelConfig.from_json(cfg_json), TrainConfig.from_dict(json.loads(tc_json)),
                     out, progress=False, data=source())
    finally:
        torch.distributed.destroy_process_group()


def test_two_gloo_processes_equal_one_process_on_the_global_batch(tmp_path):
    # Full-precision formats: with ternary / int8 rounding a last-bit difference between
    # two matmul shapes can flip a code, which Adam's first steps amplify. Balance loss
    # off: a product of batch statistics, per-rank values do not average to the
    # global-batch value; everything else is a mean over tokens. The backward in fp32: bf16
    # products (the head's, on CPUs with AVX512-BF16) sum the batch rows in another order
    # on each rank, and Adam's first steps amplify that as they would a flipped code.
    cfg = TRAIN_TINY.replace(mixer_format="fp32", mlp_format="fp32", expert_format="fp32")
    c = tc(steps=2, batch_size=4, balance_weight=0.0, grad_clip=0.5, lr=1e-3, cpu_backward="fp32")
    run_training(cfg, c, tmp_path / "one", progress=False, data=source())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_ddp_worker, args=(2, port, str(tmp_path / "two"), cfg.to_json(),
                                                   c.to_json()), nprocs=2, join=True)
    a = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "two" / "checkpoint.pt", weights_only=True)["model"]
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5)  # updates are ~1e-3
    assert json.loads((tmp_path / "two" / "result.json").read_text())["world_size"] == 2
    np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-5)


def test_train_headline():
    from tern.train.loop import train_headline

    r = {"val_bpb": 2.0, "train_tokens": 100, "steps": 2, "tokens_per_s": 50.0, "wall_s": 3.0,
         "sparsity": [{"zero_frac": 0.5}, {"zero_frac": 0.7}],
         "expert_load": [{"max_over_mean": 1.2, "dead_experts": 0}, {"max_over_mean": 1.5, "dead_experts": 1}]}
    h = train_headline(r)
    assert h["mean_zero_frac"] == 0.6 and h["max_expert_load_over_mean"] == 1.5 and h["dead_experts"] == 1


def test_launch_torchrun_two_cpu_processes(tmp_path):
    # the command-line route notebook 04 takes on several GPUs (torchrun -> python -m
    # tern.train -> DDP), here with 2 CPU processes on gloo and the shipped corpus
    from tern.train.launch import launch_torchrun

    r = launch_torchrun(TRAIN_TINY.replace(vocab_size=1024), tc(steps=2, batch_size=4, final_eval_tokens=512, threads=1),
                        tmp_path, nproc=2, timeout_s=600)
    assert r["world_size"] == 2 and r["steps"] == 2 and r["train_tokens"] == 2 * 4 * 32
    assert np.isfinite(r["val_bpb"]) and r["val_bpb"] > 0
