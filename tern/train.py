"""Training: AdamW with warm-up and cosine / two-stage schedules, CPU or CUDA (autocast),
optional torch.compile, torchrun + DistributedDataParallel, time or step budgets,
periodic and final validation BPB, JSONL logs, atomic resumable checkpoints.

Public entry points::

    run_training(model_cfg, train_cfg, out_dir=None, progress=True, *, data=None,
                 resume=None, stop_at_step=None) -> dict
    load_checkpoint(path) -> (model, model_cfg, train_cfg, state)
    launch_torchrun(model_cfg, train_cfg, out_dir, nproc) -> dict     # several GPUs / CPUs
    tern train --preset sandbox --minutes 20                            # CLI

Several processes: start with ``torchrun --nproc_per_node N -m tern.train --model M.json
--train T.json --out DIR`` (or :func:`launch_torchrun`); RANK / WORLD_SIZE / LOCAL_RANK
select DDP (nccl on GPU, gloo on CPU); each rank reads its contiguous shard of the
global batch, and rank 0 validates, logs and writes checkpoints.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

os.environ.setdefault("GOMP_SPINCOUNT", "2000")  # before torch loads libgomp: see tern/model/__init__.py

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from .config import ModelConfig, load_config, param_counts  # noqa: E402
from .records import append_jsonl, atomic_write_json, run_metadata  # noqa: E402
from .train_checkpoint import load_checkpoint, read_checkpoint, save_checkpoint  # noqa: E402
from .train_config import TrainConfig, schedule  # noqa: E402
from .train_data import ArraySource, CorpusSource  # noqa: E402

__all__ = ["TrainConfig", "run_training", "load_checkpoint", "launch_torchrun", "train_auto",
           "preset_configs", "ArraySource", "CorpusSource", "make_nll_fn"]

LOG_NAME = "train_log.jsonl"
CKPT_NAME = "checkpoint.pt"
RESULT_NAME = "result.json"


# ---- environment -----------------------------------------------------------------------
def _dist_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun's environment; (0, 1, 0) without it."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError as e:
        raise ValueError(f"bad torchrun environment (RANK/WORLD_SIZE/LOCAL_RANK): {e}") from None
    return rank, world, local


def _device(tc: TrainConfig, local_rank: int) -> torch.device:
    if tc.device == "cpu" or (tc.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("device='cuda' requested but CUDA is not available")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _amp(tc: TrainConfig, dev: torch.device):
    """(autocast dtype or None, GradScaler or None) on CUDA: bf16 where supported, else fp16
    + scaler. None on CPU: bf16 matmuls measured no faster there once the casts are paid."""
    if dev.type != "cuda" or not tc.amp:
        return None, None
    if torch.cuda.is_bf16_supported():
        return torch.bfloat16, None
    return torch.float16, torch.amp.GradScaler("cuda")


def _param_groups(model: torch.nn.Module, wd: float) -> list[dict]:
    """Weight decay on matrices (BitLinear latents, experts, embedding, router); none on
    norms, biases, A_log, D and the convolution."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.ndim >= 2 and not name.endswith(("A_log", "conv.weight")):
            decay.append(p)
        else:
            no_decay.append(p)
    return [{"params": decay, "weight_decay": wd, "decays": True},
            {"params": no_decay, "weight_decay": 0.0, "decays": False}]


# ---- evaluation ------------------------------------------------------------------------
def make_nll_fn(model: torch.nn.Module, device: torch.device | str = "cpu",
                autocast_dtype: torch.dtype | None = None):
    """nll_fn(x (B, T) int, y (B, T) int) -> summed nats (float) of the model predicting
    every y[b, t] from x[b, :t + 1] (eval mode, no grad): the ``tern.data.val_bpb``
    convention."""
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
            with torch.no_grad():
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
    rank, world, local = _dist_env()
    if tc.batch_size % world:
        raise ValueError(f"batch_size {tc.batch_size} is not divisible by the {world} processes")
    out = Path(out_dir) if out_dir is not None else None
    dev = _device(tc, local)
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


@contextlib.contextmanager
def cpu_training_mode(tc: TrainConfig, dev: torch.device):
    """On CPU: deterministic algorithms, without the NaN fill of every fresh tensor that
    torch adds in that mode (~2 % of a sandbox step; every kernel here writes all of its
    outputs), and BitLinear forwards in ``tc.cpu_matmul``. All restored on exit."""
    from torch.utils import deterministic

    from .model.ternary import matmul_mode

    det_before = torch.are_deterministic_algorithms_enabled()
    fill_before = deterministic.fill_uninitialized_memory
    if dev.type == "cpu":
        torch.use_deterministic_algorithms(True)
        deterministic.fill_uninitialized_memory = False
    try:
        with matmul_mode(tc.cpu_matmul):
            yield
    finally:
        torch.use_deterministic_algorithms(det_before)
        deterministic.fill_uninitialized_memory = fill_before


def _train(mcfg, tc, out, progress, data, resume, stop_at_step, rank, world, dev):
    from .model import build_model

    main = rank == 0
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
    opt = torch.optim.AdamW(_param_groups(model, tc.weight_decay), lr=tc.lr,
                            betas=(tc.beta1, tc.beta2), fused=dev.type == "cuda" or None)
    amp_dtype, scaler = _amp(tc, dev)
    st = {"step": 0, "train_tokens": 0, "train_s": 0.0, "wall_s": 0.0, "loss_window": [],
          "evals": []}
    if resume is not None:
        blob = read_checkpoint(resume)
        if blob["model_config"] != mcfg or blob["train_config"] != tc:
            raise ValueError(f"checkpoint {resume} was written for other model or train configs; "
                             f"resume needs identical configs")
        model.load_state_dict(blob["model"])
        if blob["optimizer"] is not None:
            opt.load_state_dict(blob["optimizer"])
        if scaler is not None and blob["scaler"] is not None:
            scaler.load_state_dict(blob["scaler"])
        st.update(blob["state"])
        torch.set_rng_state(st["rng_cpu"])
        if dev.type == "cuda" and st.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(st["rng_cuda"])
    net: torch.nn.Module = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[dev.index] if dev.type == "cuda" else None)
    if tc.compile:
        net = torch.compile(net)
    model.train()

    log_path = out / LOG_NAME if (out is not None and main) else None
    counts = param_counts(mcfg).summary()
    if log_path is not None:
        append_jsonl(log_path, {"record": "train_start", "model_config": mcfg.to_dict(),
                                "train_config": tc.to_dict(), "counts": counts, "world_size": world,
                                "device": str(dev), "resumed_from": str(resume) if resume else None,
                                "start_step": st["step"], **run_metadata(torch.get_num_threads())})
    local_b = tc.batch_size // world
    rows = slice(rank * local_b, (rank + 1) * local_b)
    budget_s = tc.minutes * 60.0
    losses = deque(st["loss_window"], maxlen=max(1, min(50, (tc.steps or 10**9) // 10)))
    interval: list[float] = []
    bar = None
    if progress and main:
        from tqdm.auto import tqdm

        bar = tqdm(total=tc.steps or None, initial=st["step"], desc="train", unit="step",
                   file=sys.stderr, dynamic_ncols=True)
    t_start = time.perf_counter() - st["wall_s"]
    train_s0, tok0 = st["train_s"], st["train_tokens"]
    last_ckpt = None
    val_bpb = None
    step = st["step"]
    try:
        while True:
            if tc.steps and step >= tc.steps:
                break
            if stop_at_step is not None and step >= stop_at_step:
                break
            elapsed = time.perf_counter() - t_start
            prog = step / tc.steps if tc.steps else elapsed / budget_s
            stop = 0.0 if tc.steps else float(elapsed >= budget_s)
            if world > 1 and not tc.steps:  # everyone follows rank 0's clock
                pv = torch.tensor([prog, stop], dtype=torch.float64, device=dev)
                torch.distributed.broadcast(pv, 0)
                prog, stop = float(pv[0]), float(pv[1])
            if stop:
                break
            lr, wd = schedule(tc, step, prog)
            for g in opt.param_groups:
                g["lr"] = lr
                g["weight_decay"] = wd if g["decays"] else 0.0
            t0 = time.perf_counter()
            xb = torch.as_tensor(data.batch(tc.seed, step, tc.batch_size, tc.seq_len)[rows]).to(dev)
            ctx = torch.autocast(dev.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
            with ctx:
                logits = net(xb[:, :-1])  # (b, T, V)
                ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1))
                aux = model.aux_losses()
                loss = ce + tc.balance_weight * aux["balance"] + tc.z_weight * aux["z"]
            opt.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
            else:
                loss.backward()
            if tc.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            ce_v = float(ce.detach())
            if world > 1:
                cv = torch.tensor([ce_v], dtype=torch.float64, device=dev)
                torch.distributed.all_reduce(cv)
                ce_v = float(cv[0]) / world
            if not math.isfinite(ce_v):
                raise ValueError(f"training diverged: loss is {ce_v} at step {step}")
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
                ev = _evaluate(model, data, tc, dev, amp_dtype, tc.eval_tokens, rank) if main else None
                if main:
                    ev = {"record": "eval", "step": step, "train_tokens": st["train_tokens"], **ev}
                    st["evals"].append(ev)
                    val_bpb = ev.get("bpb")
                if world > 1:
                    torch.distributed.barrier()
            if main:
                if row is not None and log_path is not None:
                    append_jsonl(log_path, row)
                if st["evals"] and st["evals"][-1]["step"] == step and log_path is not None:
                    append_jsonl(log_path, st["evals"][-1])
                if bar is not None:
                    post = {"loss": f"{ce_v:.3f}", "tok/s": f"{tps:.0f}"}
                    if val_bpb is not None:
                        post["val_bpb"] = f"{val_bpb:.4f}"
                    bar.set_postfix(post, refresh=False)
                    bar.update(1)
            if tc.ckpt_every and step % tc.ckpt_every == 0 and out is not None and main:
                last_ckpt = _save(out, model, mcfg, tc, st, step, t_start, losses, opt, scaler, dev)
    finally:
        if bar is not None:
            bar.close()
    finished = stop_at_step is None or step < stop_at_step or (tc.steps and step >= tc.steps)
    if out is not None and main:
        last_ckpt = _save(out, model, mcfg, tc, st, step, t_start, losses, opt, scaler, dev)
    if not main:
        if world > 1:
            torch.distributed.barrier()
        return {"rank": rank}
    result: dict[str, Any] = {
        "steps": step, "train_tokens": st["train_tokens"],
        "tokens_per_s": (st["train_tokens"] - tok0) / max(st["train_s"] - train_s0, 1e-9),
        "train_s": st["train_s"], "final_loss": float(np.mean(losses)) if losses else None,
        "evals": st["evals"], "checkpoint": str(last_ckpt) if last_ckpt else None,
        "device": str(dev), "world_size": world, "counts": counts,
    }
    if finished:
        model.reset_stats()
        ev = _evaluate(model, data, tc, dev, amp_dtype, tc.final_eval_tokens, rank)
        result.update({"val_bpb": ev.get("bpb"), "val_nats_per_token": ev.get("nats_per_token"),
                       "val_tokens": ev.get("tokens"), "val_bytes": ev.get("bytes"),
                       "sparsity": model.sparsity(), "expert_load": model.expert_load()})
    result["wall_s"] = time.perf_counter() - t_start
    if world > 1:
        torch.distributed.barrier()
    if out is not None:
        append_jsonl(out / LOG_NAME, {"record": "train_end", **_jsonable(result)})
        atomic_write_json(out / RESULT_NAME, _jsonable(result))
    return result


def _evaluate(model, data, tc, dev, amp_dtype, max_tokens, rank):
    nll = make_nll_fn(model, dev, autocast_dtype=amp_dtype)
    ev = data.evaluate(nll, tc.seq_len, max_tokens or None)
    return {k: ev.get(k) for k in ("bpb", "nats", "tokens", "bytes", "nats_per_token")}


def _save(out, model, mcfg, tc, st, step, t_start, losses, opt, scaler, dev):
    st = dict(st, step=step, wall_s=time.perf_counter() - t_start, loss_window=list(losses),
              rng_cpu=torch.get_rng_state(),
              rng_cuda=torch.cuda.get_rng_state() if dev.type == "cuda" else None)
    return save_checkpoint(out / CKPT_NAME, model, mcfg, tc, st, opt, scaler)


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


# ---- several processes -----------------------------------------------------------------
def launch_torchrun(model_cfg: ModelConfig, train_cfg: TrainConfig, out_dir: str | Path,
                    nproc: int | None = None, timeout_s: float | None = None) -> dict[str, Any]:
    """Run :func:`run_training` under torchrun with ``nproc`` processes (default: one per
    CUDA device, or 2 on CPU with gloo) and return rank 0's result (out_dir/result.json)."""
    import subprocess

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if nproc is None:
        nproc = torch.cuda.device_count() or 2
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    atomic_write_json(out / "model_config.json", model_cfg.to_dict())
    atomic_write_json(out / "train_config.json", train_cfg.to_dict())
    (out / RESULT_NAME).unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "tern.train", "--model", str(out / "model_config.json"),
           "--train", str(out / "train_config.json"), "--out", str(out)]
    r = subprocess.run(cmd, timeout=timeout_s)
    if r.returncode != 0:
        raise RuntimeError(f"torchrun exited with code {r.returncode}: {' '.join(cmd)}")
    return json.loads((out / RESULT_NAME).read_text(encoding="utf-8"))


def preset_configs(preset: str = "sandbox", smoke: bool = False, minutes: float = 20.0,
                   **train_overrides: Any) -> tuple[ModelConfig, TrainConfig]:
    """The (ModelConfig, TrainConfig) the notebooks train: a ``minutes`` budget with
    periodic validation, or with ``smoke`` a few steps on short sequences with a small
    validation subset (seconds on a CPU)."""
    mcfg = load_config(preset)
    if smoke:
        kw: dict[str, Any] = dict(steps=3, batch_size=2, seq_len=64, warmup_steps=1, eval_every=3,
                                  eval_tokens=512, final_eval_tokens=2048, log_every=1)
    else:
        kw = dict(minutes=minutes, seq_len=min(256, mcfg.max_seq_len), eval_every=200, log_every=10)
    kw.update(train_overrides)
    return mcfg, TrainConfig.from_dict(kw)


def train_auto(model_cfg: ModelConfig, train_cfg: TrainConfig, out_dir: str | Path,
               progress: bool = True, data: Any = None) -> dict[str, Any]:
    """Several CUDA devices: :func:`launch_torchrun` with one process each (DDP, nccl, the
    default corpus source); otherwise :func:`run_training` in this process (``data``:
    an optional data source)."""
    n = torch.cuda.device_count() if train_cfg.device != "cpu" else 0
    if n > 1:
        if data is not None:
            raise ValueError("train_auto: a custom data source cannot be passed to torchrun processes")
        return launch_torchrun(model_cfg, train_cfg, out_dir, nproc=n)
    return run_training(model_cfg, train_cfg, out_dir, progress=progress, data=data)


# ---- command line ----------------------------------------------------------------------
JSON_FIELDS = """\
  val_bpb: validation bits per byte (full split), val_nats_per_token
  train_tokens, steps, tokens_per_s (training only), train_s, wall_s, final_loss (nats/token)
  sparsity: [{layer, kind, zero_frac, shared_zero_frac}]  (fraction of exact zeros)
  expert_load: [{layer, max_over_mean, min_over_mean, dead_experts, counts}]
  evals: periodic validation rows; checkpoint: path; device; world_size; counts"""


def _parse_overrides(items: list[str]) -> dict[str, Any]:
    out = {}
    for it in items or []:
        if "=" not in it:
            raise ValueError(f"--set expects key=value, got {it!r}")
        k, v = it.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def cli_configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="sandbox", help="model preset or config JSON (default sandbox)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a ModelConfig field (JSON value), repeatable")
    p.add_argument("--train-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a TrainConfig field (JSON value), repeatable")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--minutes", type=float, help="time budget in minutes")
    g.add_argument("--steps", type=int, help="optimizer steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: default)")
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--out", default="results/train", help="output folder (log, checkpoint, plots)")
    p.add_argument("--resume", help="checkpoint to continue from")
    p.add_argument("--no-progress", action="store_true")


def configs_from_args(args: argparse.Namespace) -> tuple[ModelConfig, TrainConfig]:
    mcfg = load_config(args.preset, _parse_overrides(args.set))
    kw: dict[str, Any] = {"seed": args.seed, "device": args.device, "threads": args.threads,
                          "eval_every": args.eval_every}
    if args.steps:
        kw["steps"] = args.steps
    else:
        kw["minutes"] = args.minutes if args.minutes else 20.0
    for k in ("batch_size", "seq_len", "lr"):
        if getattr(args, k) is not None:
            kw[k] = getattr(args, k)
    kw.update(_parse_overrides(args.train_set))
    kw.setdefault("seq_len", min(TrainConfig.seq_len, mcfg.max_seq_len))
    return mcfg, TrainConfig.from_dict(kw)


def cli_run(args: argparse.Namespace) -> dict[str, Any]:
    mcfg, tc = configs_from_args(args)
    res = run_training(mcfg, tc, args.out, progress=not args.no_progress, resume=args.resume)
    with contextlib.suppress(ValueError, ImportError):
        from .plots.training import plot_run

        res["plots"] = [str(p) for p in plot_run(Path(args.out) / LOG_NAME, args.out)]
    return res


def cli_render(r: dict[str, Any]) -> str:
    bpb = r.get("val_bpb")
    lines = [f"steps {r['steps']}, {r['train_tokens']:,} tokens, {r['tokens_per_s']:.0f} tok/s, "
             f"final loss {r['final_loss']:.4f} nats/token",
             f"val BPB {bpb:.4f}" if bpb is not None else "val BPB: n/a"]
    for s in r.get("sparsity", []):
        if s.get("zero_frac") is not None:
            lines.append(f"layer {s['layer']} {s['kind']}: {100 * s['zero_frac']:.1f} % zeros")
    for e in r.get("expert_load", []):
        lines.append(f"layer {e['layer']} experts: max/mean {e['max_over_mean']:.2f}, "
                     f"dead {e['dead_experts']}")
    lines.append(f"checkpoint: {r.get('checkpoint')}")
    return "\n".join(lines)


def _main(argv: list[str] | None = None) -> int:
    """torchrun entry: python -m tern.train --model M.json --train T.json --out DIR."""
    p = argparse.ArgumentParser(prog="python -m tern.train")
    p.add_argument("--model", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--resume")
    a = p.parse_args(argv)
    mcfg = load_config(a.model)
    tc = TrainConfig.from_dict(json.loads(Path(a.train).read_text(encoding="utf-8")))
    try:
        run_training(mcfg, tc, a.out, progress=True, resume=a.resume)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return 0


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


if __name__ == "__main__":
    sys.exit(_main())

