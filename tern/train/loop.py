"""Training: AdamW with warm-up and cosine / two-stage schedules, CPU or CUDA (autocast),
optional torch.compile, torchrun + DistributedDataParallel, time or step budgets,
periodic and final validation BPB, JSONL logs, atomic resumable checkpoints.

Public entry points::

    run_training(model_cfg, train_cfg, out_dir=None, progress=True, *, data=None,
                 resume=None, stop_at_step=None) -> dict
    load_checkpoint(path) -> (model, model_cfg, train_cfg, state)
    launch_torchrun(model_cfg, train_cfg, out_dir, nproc) -> dict     # several GPUs / CPUs
    tern train --preset sandbox --minutes 20                            # CLI

Several processes: start with ``torchrun --nproc_per_node N -m tern.train.cli --model M.json
--train T.json --out DIR`` (or :func:`launch_torchrun`); RANK / WORLD_SIZE / LOCAL_RANK
select DDP (nccl on GPU, gloo on CPU); each rank reads its contiguous shard of the
global batch, and rank 0 validates, logs and writes checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tern.core.config import ModelConfig, param_counts
from tern.core.records import append_jsonl, atomic_write_json, run_metadata
from tern.train.batches import CorpusSource
from tern.train.checkpoint import read_checkpoint, save_checkpoint
from tern.train.config import TrainConfig, schedule
from tern.train.environment import (
    amp_and_scaler,
    cpu_training_mode,
    dist_env,
    make_optimizer,
    resolve_cpu_backward,
    training_device,
)

LOG_NAME = "train_log.jsonl"
CKPT_NAME = "checkpoint.pt"
RESULT_NAME = "result.json"


# ---- evaluation ------------------------------------------------------------------------
# Validation windows per forward pass: every window is scored from an empty state, so the
# batch changes only the fp32 summation order, not what is scored. On the 2-core reference
# host 16 windows of 128 tokens measured fastest (8: 19.4 s, 16: 17.5 s, 32: 21.8 s, 64:
# 23.9 s for the e8 / e64 capacity-gate models: larger logits fall out of cache;
# benchmarks/gate_train_speed.py --eval --eval-batch).
EVAL_BATCH = 16


def make_nll_fn(model: torch.nn.Module, device: torch.device | str = "cpu",
                autocast_dtype: torch.dtype | None = None):
    """nll_fn(x (B, T) int, y (B, T) int) -> summed nats (float) of the model predicting
    every y[b, t] from x[b, :t + 1] (eval mode, inference mode: no autograd bookkeeping):
    the ``tern.data.val_bpb`` convention."""
    device = torch.device(device)

    def nll_fn(x: np.ndarray, y: np.ndarray) -> float:
        xt = torch.as_tensor(np.asarray(x, dtype=np.int64)).to(device)
        yt = torch.as_tensor(np.asarray(y, dtype=np.int64)).to(device)
        if xt.dim() != 2 or xt.shape != yt.shape:
            raise ValueError(f"nll_fn expects x and y of one shape (B, T), got {tuple(xt.shape)} "
                             f"and {tuple(yt.shape)}")
        was = model.training
        model.eval()
        try:
            with torch.inference_mode():
                ctx = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype
                       else contextlib.nullcontext())
                with ctx:
                    logits = model(xt)  # (B, T, V)
                return float(F.cross_entropy(logits.float().flatten(0, 1), yt.flatten(), reduction="sum"))
        finally:
            model.train(was)

    return nll_fn


# ---- the loop --------------------------------------------------------------------------
def run_training(model_cfg: ModelConfig, train_cfg: TrainConfig, out_dir: str | Path | None = None,
                 progress: bool = True, *, data: Any = None, resume: str | Path | None = None,
                 stop_at_step: int | None = None) -> dict[str, Any]:
    """Train ``model_cfg`` with ``train_cfg``; returns the figures of the run.

    Result (rank 0): val_bpb (final validation on the full fixed split unless
    final_eval_tokens > 0; None when the data source has no byte count), val_nats_per_token,
    train_tokens, steps, tokens_per_s (training tokens / training seconds, validation
    excluded), wall_s, final_loss (mean cross-entropy in nats/token over the last steps),
    sparsity (per layer fraction of exact zeros in FFN hidden units, measured during the
    final validation), expert_load (per MoE layer max/mean, dead experts, counts), evals
    (periodic validation rows), checkpoint (path or None), device, world_size, counts.

    data: a source with ``batch`` / ``evaluate`` (default: ``CorpusSource(tokenizer)``);
    resume: a checkpoint to continue from (same configs); stop_at_step: stop (and write a
    checkpoint) after that many steps without finishing - for pre-emption and tests.
    Other ranks return {"rank": r}.
    """
    if not isinstance(model_cfg, ModelConfig) or not isinstance(train_cfg, TrainConfig):
        raise ValueError("run_training needs a ModelConfig and a TrainConfig")
    tc = train_cfg
    if tc.seq_len > model_cfg.max_seq_len:
        raise ValueError(f"seq_len {tc.seq_len} exceeds the model's max_seq_len {model_cfg.max_seq_len}")
    rank, world, local = dist_env()
    if tc.batch_size % world:
        raise ValueError(f"batch_size {tc.batch_size} is not divisible by the {world} processes")
    out = Path(out_dir) if out_dir is not None else None
    dev = training_device(tc, local)
    ddp = world > 1
    if ddp and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    if tc.threads:
        torch.set_num_threads(tc.threads)
        with contextlib.suppress(ImportError, ValueError):
            import numba

            numba.set_num_threads(min(tc.threads, numba.config.NUMBA_NUM_THREADS))
    with cpu_training_mode(tc, dev):
        return _train(model_cfg, tc, out, progress, data, resume, stop_at_step, rank, world, dev)


@dataclass
class _Run:
    """Everything one training run carries from step to step (rank-local)."""
    mcfg: ModelConfig
    tc: TrainConfig
    out: Path | None
    data: Any
    dev: torch.device
    rank: int
    world: int
    model: torch.nn.Module
    net: torch.nn.Module  # the model, wrapped by DDP / torch.compile when asked
    opt: torch.optim.Optimizer
    amp_dtype: torch.dtype | None
    scaler: Any
    st: dict[str, Any]  # step, train_tokens, train_s, wall_s, loss_window, evals (+ rng on save)
    counts: dict[str, Any] = field(default_factory=dict)
    log_path: Path | None = None

    @property
    def main(self) -> bool:
        return self.rank == 0


def _train(mcfg, tc, out, progress, data, resume, stop_at_step, rank, world, dev):
    run = _build_run(mcfg, tc, out, data, rank, world, dev)
    if resume is not None:
        _resume(run, resume)
    run.net = _wrap(run)
    run.model.train()
    _log_start(run, resume)
    t_start = time.perf_counter() - run.st["wall_s"]
    step, losses, last_ckpt = _loop(run, t_start, stop_at_step, progress)
    return _finish(run, step, losses, last_ckpt, t_start, stop_at_step)


def _build_run(mcfg, tc, out, data, rank, world, dev) -> _Run:
    """The data source, the model (seeded), the optimizer and the AMP scaler."""
    from tern.train.model.lm import build_model

    if tc.compile and dev.type != "cuda":
        raise ValueError(
            f"compile=True needs a CUDA device (this run is on {dev.type}): the CPU training step "
            "calls numba kernels (SSM scan, conv, quantizers, expert combine) that torch.compile "
            "cannot trace, and it stops deep inside torch._dynamo; train on CPU with compile=False")

    if data is None:
        data = CorpusSource(tc.tokenizer)
    vs = getattr(data, "vocab_size", None)
    if vs is not None and vs > mcfg.vocab_size:
        raise ValueError(f"tokenizer vocabulary {vs} exceeds the model's vocab_size {mcfg.vocab_size}")
    torch.manual_seed(tc.seed)
    model = build_model(mcfg, seed=tc.seed).to(dev)
    for layer in model.layers:
        if hasattr(layer.mixer, "scan_impl"):
            layer.mixer.scan_impl = tc.scan_impl
    opt = make_optimizer(model, tc, dev)
    amp_dtype, scaler = amp_and_scaler(tc, dev)
    st = {"step": 0, "train_tokens": 0, "train_s": 0.0, "wall_s": 0.0, "loss_window": [],
          "evals": []}
    return _Run(mcfg, tc, out, data, dev, rank, world, model, model, opt, amp_dtype, scaler, st,
                counts=param_counts(mcfg).summary())


def _resume(run: _Run, resume: str | Path) -> None:
    """Model, optimizer, scaler, counters and RNG state from a checkpoint of the same configs."""
    blob = read_checkpoint(resume)
    if blob["model_config"] != run.mcfg or blob["train_config"] != run.tc:
        raise ValueError(f"checkpoint {resume} was written for other model or train configs; "
                         f"resume needs identical configs")
    run.model.load_state_dict(blob["model"])
    if blob["optimizer"] is not None:
        run.opt.load_state_dict(blob["optimizer"])
    if run.scaler is not None and blob["scaler"] is not None:
        run.scaler.load_state_dict(blob["scaler"])
    run.st.update(blob["state"])
    torch.set_rng_state(run.st["rng_cpu"])
    if run.dev.type == "cuda" and run.st.get("rng_cuda") is not None:
        torch.cuda.set_rng_state(run.st["rng_cuda"])


def _wrap(run: _Run) -> torch.nn.Module:
    net: torch.nn.Module = run.model
    if run.world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            run.model, device_ids=[run.dev.index] if run.dev.type == "cuda" else None)
    if run.tc.compile:
        net = torch.compile(net)
    return net


def _log_start(run: _Run, resume: str | Path | None) -> None:
    run.log_path = run.out / LOG_NAME if (run.out is not None and run.main) else None
    if run.log_path is not None:
        append_jsonl(run.log_path, {
            "record": "train_start", "model_config": run.mcfg.to_dict(), "train_config": run.tc.to_dict(),
            "counts": run.counts, "world_size": run.world, "device": str(run.dev),
            "resumed_from": str(resume) if resume else None, "start_step": run.st["step"],
            **run_metadata(torch.get_num_threads())})


def _progress_and_stop(run: _Run, step: int, t_start: float) -> tuple[float, bool]:
    """Training progress in [0, 1] (steps or wall clock) and whether the budget is spent;
    under DDP every rank follows rank 0's clock."""
    tc = run.tc
    elapsed = time.perf_counter() - t_start
    prog = step / tc.steps if tc.steps else elapsed / (tc.minutes * 60.0)
    stop = 0.0 if tc.steps else float(elapsed >= tc.minutes * 60.0)
    if run.world > 1 and not tc.steps:
        pv = torch.tensor([prog, stop], dtype=torch.float64, device=run.dev)
        torch.distributed.broadcast(pv, 0)
        prog, stop = float(pv[0]), float(pv[1])
    return prog, bool(stop)


def _optimizer_step(run: _Run, step: int, rows: slice) -> tuple[float, dict[str, torch.Tensor]]:
    """One forward / backward / update on this rank's shard of the step's batch; returns the
    cross-entropy (nats/token, averaged over ranks) and the auxiliary losses."""
    tc, dev = run.tc, run.dev
    xb = torch.as_tensor(run.data.batch(tc.seed, step, tc.batch_size, tc.seq_len)[rows]).to(dev)  # (b, T+1)
    ctx = torch.autocast(dev.type, dtype=run.amp_dtype) if run.amp_dtype else contextlib.nullcontext()
    with ctx:
        logits = run.net(xb[:, :-1])  # (b, T, V)
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1))
        aux = run.model.aux_losses()
        loss = ce + tc.balance_weight * aux["balance"] + tc.z_weight * aux["z"]
    run.opt.zero_grad(set_to_none=True)
    if run.scaler is not None:
        run.scaler.scale(loss).backward()
        run.scaler.unscale_(run.opt)
    else:
        loss.backward()
    if tc.grad_clip:
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), tc.grad_clip)
    if run.scaler is not None:
        run.scaler.step(run.opt)
        run.scaler.update()
    else:
        run.opt.step()
    ce_v = float(ce.detach())
    if run.world > 1:
        cv = torch.tensor([ce_v], dtype=torch.float64, device=dev)
        torch.distributed.all_reduce(cv)
        ce_v = float(cv[0]) / run.world
    if not math.isfinite(ce_v):
        raise ValueError(f"training diverged: loss is {ce_v} at step {step}")
    return ce_v, aux


def _loop(run: _Run, t_start: float, stop_at_step: int | None, progress: bool):
    """Steps until the step / time budget (or ``stop_at_step``): schedule, update, log,
    validate, checkpoint. Returns (steps done, recent losses, last checkpoint path)."""
    tc, st = run.tc, run.st
    local_b = tc.batch_size // run.world
    rows = slice(run.rank * local_b, (run.rank + 1) * local_b)
    losses = deque(st["loss_window"], maxlen=max(1, min(50, (tc.steps or 10**9) // 10)))
    interval: list[float] = []
    bar = None
    if progress and run.main:
        from tqdm.auto import tqdm

        bar = tqdm(total=tc.steps or None, initial=st["step"], desc="train", unit="step",
                   file=sys.stderr, dynamic_ncols=True)
    train_s0, tok0 = st["train_s"], st["train_tokens"]
    last_ckpt = None
    val_bpb = None
    step = st["step"]
    try:
        while not (tc.steps and step >= tc.steps) and not (stop_at_step is not None and step >= stop_at_step):
            prog, stop = _progress_and_stop(run, step, t_start)
            if stop:
                break
            lr, wd = schedule(tc, step, prog)
            for g in run.opt.param_groups:
                g["lr"] = lr
                g["weight_decay"] = wd if g["decays"] else 0.0
            t0 = time.perf_counter()
            ce_v, aux = _optimizer_step(run, step, rows)
            step += 1
            st["train_s"] += time.perf_counter() - t0
            st["train_tokens"] += tc.batch_size * tc.seq_len
            losses.append(ce_v)
            interval.append(ce_v)
            tps = (st["train_tokens"] - tok0) / max(st["train_s"] - train_s0, 1e-9)
            row = None
            if step % tc.log_every == 0 or (tc.steps and step == tc.steps):
                row = {"record": "train_step", "step": step, "loss": float(np.mean(interval)),
                       "lr": lr, "weight_decay": wd, "train_tokens": st["train_tokens"],
                       "tok_per_s": tps, "elapsed_s": time.perf_counter() - t_start,
                       "balance_loss": float(aux["balance"].detach()), "z_loss": float(aux["z"].detach())}
                interval = []
            if tc.eval_every and step % tc.eval_every == 0:
                val_bpb = _periodic_eval(run, step, val_bpb)
            if run.main:
                _log_step(run, step, row, bar, ce_v, tps, val_bpb)
            if tc.ckpt_every and step % tc.ckpt_every == 0 and run.out is not None and run.main:
                last_ckpt = _save(run.out, run.model, run.mcfg, tc, st, step, t_start, losses, run.opt,
                                  run.scaler, run.dev)
    finally:
        if bar is not None:
            bar.close()
    run.st["_tok0"], run.st["_train_s0"] = tok0, train_s0
    return step, losses, last_ckpt


def _periodic_eval(run: _Run, step: int, val_bpb: float | None) -> float | None:
    ev = _evaluate(run.model, run.data, run.tc, run.dev, run.amp_dtype, run.tc.eval_tokens, run.rank) \
        if run.main else None
    if run.main:
        ev = {"record": "eval", "step": step, "train_tokens": run.st["train_tokens"], **ev}
        run.st["evals"].append(ev)
        val_bpb = ev.get("bpb")
    if run.world > 1:
        torch.distributed.barrier()
    return val_bpb


def _log_step(run: _Run, step: int, row: dict | None, bar: Any, ce_v: float, tps: float,
              val_bpb: float | None) -> None:
    if row is not None and run.log_path is not None:
        append_jsonl(run.log_path, row)
    if run.st["evals"] and run.st["evals"][-1]["step"] == step and run.log_path is not None:
        append_jsonl(run.log_path, run.st["evals"][-1])
    if bar is not None:
        post = {"loss": f"{ce_v:.3f}", "tok/s": f"{tps:.0f}"}
        if val_bpb is not None:
            post["val_bpb"] = f"{val_bpb:.4f}"
        bar.set_postfix(post, refresh=False)
        bar.update(1)


def _finish(run: _Run, step: int, losses: deque, last_ckpt: Path | None, t_start: float,
            stop_at_step: int | None) -> dict[str, Any]:
    """Final checkpoint, final validation (when the run finished), the result record."""
    tc, st, out = run.tc, run.st, run.out
    tok0, train_s0 = st.pop("_tok0"), st.pop("_train_s0")
    finished = stop_at_step is None or step < stop_at_step or (tc.steps and step >= tc.steps)
    if out is not None and run.main:
        last_ckpt = _save(out, run.model, run.mcfg, tc, st, step, t_start, losses, run.opt, run.scaler, run.dev)
    if not run.main:
        if run.world > 1:
            torch.distributed.barrier()
        return {"rank": run.rank}
    result: dict[str, Any] = {
        "steps": step, "train_tokens": st["train_tokens"],
        "tokens_per_s": (st["train_tokens"] - tok0) / max(st["train_s"] - train_s0, 1e-9),
        "train_s": st["train_s"], "final_loss": float(np.mean(losses)) if losses else None,
        "evals": st["evals"], "checkpoint": str(last_ckpt) if last_ckpt else None,
        "device": str(run.dev), "world_size": run.world, "counts": run.counts,
        "cpu_backward": resolve_cpu_backward(tc) if run.dev.type == "cpu" else None,
    }
    if finished:
        run.model.reset_stats()
        ev = _evaluate(run.model, run.data, tc, run.dev, run.amp_dtype, tc.final_eval_tokens, run.rank)
        result.update({"val_bpb": ev.get("bpb"), "val_nats_per_token": ev.get("nats_per_token"),
                       "val_tokens": ev.get("tokens"), "val_bytes": ev.get("bytes"),
                       "sparsity": run.model.sparsity(), "expert_load": run.model.expert_load()})
    result["wall_s"] = time.perf_counter() - t_start
    if run.world > 1:
        torch.distributed.barrier()
    if out is not None:
        append_jsonl(out / LOG_NAME, {"record": "train_end", **_jsonable(result)})
        atomic_write_json(out / RESULT_NAME, _jsonable(result))
    return result


def _evaluate(model, data, tc, dev, amp_dtype, max_tokens, rank, batch_size: int = EVAL_BATCH):
    """Validation figures on the data source's split (all of it unless ``max_tokens``), in
    batches of ``batch_size`` windows where the source takes a batch size."""
    import inspect

    nll = make_nll_fn(model, dev, autocast_dtype=amp_dtype)
    kw = {"batch_size": batch_size} if "batch_size" in inspect.signature(data.evaluate).parameters else {}
    ev = data.evaluate(nll, tc.seq_len, max_tokens or None, **kw)
    return {k: ev.get(k) for k in ("bpb", "nats", "tokens", "bytes", "nats_per_token")}


def _save(out, model, mcfg, tc, st, step, t_start, losses, opt, scaler, dev):
    st = dict(st, step=step, wall_s=time.perf_counter() - t_start, loss_window=list(losses),
              rng_cpu=torch.get_rng_state(),
              rng_cuda=torch.cuda.get_rng_state() if dev.type == "cuda" else None)
    return save_checkpoint(out / CKPT_NAME, model, mcfg, tc, st, opt, scaler)


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def train_headline(result: dict[str, Any]) -> dict[str, Any]:
    """The figures notebooks 03 / 04 report (units in the keys) from a run_training result."""
    sp = [s["zero_frac"] for s in result.get("sparsity", []) if s.get("zero_frac") is not None]
    load = [e["max_over_mean"] for e in result.get("expert_load", [])]
    return {"val_bpb": result["val_bpb"], "train_tokens": result["train_tokens"],
            "steps": result["steps"], "train_tokens_per_s": result["tokens_per_s"],
            "wall_s": result["wall_s"], "device": result.get("device"),
            "mean_zero_frac": sum(sp) / len(sp) if sp else None,
            "max_expert_load_over_mean": max(load) if load else None,
            "dead_experts": sum(e.get("dead_experts", 0) for e in result.get("expert_load", []))}


