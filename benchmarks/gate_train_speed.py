"""Training speed of gate-scale models on this CPU: per-step times (median of steps after a
warm-up), validation seconds on the full split, MoE dispatch modes and thread layouts.

    flock /tmp/tern-cpu.lock python benchmarks/gate_train_speed.py \
        --gate gates/4_capacity_scaling.toml --arms e8 e64 --dispatch loop padded \
        --threads 2 1 --steps 12 --out results/bench/gate_train_speed.jsonl

Every row (JSONL, tern.core.records) is ``record: "train_speed"`` with the model config,
batch, seq_len, dispatch, threads, concurrent (runs side by side), per-step seconds
(median, spread), tokens_per_s = batch * seq_len / median step, eval_s (validation of the
full split, when asked) and run_metadata: `tern gate plan --speed FILE` reads them.
``--backward fp32 bf16`` trains with each ``TrainConfig.cpu_backward`` (default: the
config's own); ``--paths reference`` runs the step without the fused CPU paths of issue 18
(foreach AdamW instead of the fused one, the explicit masked softmax instead of fused
causal attention, eval's fp32 integer products instead of ``torch._int_mm``): with
``--paths reference fast --backward fp32 bf16`` one run compares the old and new step
(``--code`` / ``--code-note`` tag the rows); ``--profile N`` adds where a step's time goes
(torch.profiler over N more steps: self CPU ms per step by category, ``profile_ms``; on
CUDA also the GPU's kernel ms per step, kernels per step, the GPU-busy share of the profiled
wall time and the synchronising runtime calls per step). Profiled steps run slower and the
categories are shares of that: on CPU (AMD Zen 4, gate-4 e8, 1 thread) log-softmax showed
31 ms a call under the profiler and ~1 ms timed directly in the same step, so check a
category's share with py-spy before acting on it.
``--parts`` adds where a step goes timed directly instead (``parts_ms``: median ms of
forward + backward of each layer's mixer and feed-forward block with its norm, of the head
with the loss, and of the optimizer update and the gradient clip, on the step's shapes):
the parts' sum is checked against the whole forward + backward in the same row.
``--concurrent 2`` runs two copies of each measurement side by side in two processes (each
with ``--threads``) and reports each one's figures: the layout question "two single-thread
runs or one two-thread run" is answered by comparing 2 x tokens_per_s at concurrent 2 /
threads 1 against tokens_per_s at concurrent 1 / threads 2.
``--device cuda`` times the same step on the GPU (synchronised before and after each step);
``--concurrent N`` then answers how many gate runs one GPU should take side by side
(N x tokens_per_s against concurrent 1).

``--whole-run`` times what a gate run costs instead: each measurement is one whole
``run_training`` of the arm (its gate's budget, or ``--run-steps``; seed 0; validation of
the full split included in ``wall_s``), and its rate is the run's own ``tokens_per_s``
(training tokens / training seconds). With ``--code-root DIR`` (repeatable, ``.`` is this
checkout) every measurement runs once per checkout, in processes that import ``tern`` from
that checkout: a same-host, same-run comparison with older code, e.g. the commit that wrote
the v1 gate records (issue 18's "today", 31266cd, whose package had the flat layout before
tern.decide / tern.train.loop)::

    git worktree add /tmp/v1 31266cd
    flock /tmp/tern-cpu.lock python benchmarks/gate_train_speed.py --whole-run \
        --gate gates/4_capacity_scaling.toml --arms e8 e64 --code-root /tmp/v1 . \
        --threads 2 1 --concurrent 1 2 --out gates/v2/train_speed_before_after.jsonl

(the gate file is read from each checkout at the same relative path).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# before torch loads libgomp (tern.train.model sets it too, but torch is imported first here)
os.environ.setdefault("GOMP_SPINCOUNT", "20000")  # as tern/__init__.py


# profile categories: (label, op-name prefixes); everything else is "other torch ops"
PROFILE_CATEGORIES = (
    ("matmul", ("aten::mm", "aten::bmm", "aten::_int_mm", "aten::addmm", "aten::_grouped_mm")),
    ("ssm scan (numba)", ("NumbaScan",)),
    ("conv + silu (numba)", ("_ConvSilu",)),
    ("quantizers, activation, combine (numba)", ("_InputQ", "_WeightQ", "_GatedActQuant",
                                                 "Int8MatmulSTE", "_Combine")),
    ("softmax / CE over the vocabulary", ("aten::_log_softmax", "aten::nll_loss")),
)


def profile_steps(run, rows, first_step: int, n: int) -> dict:
    """Self CPU ms per step by category over ``n`` steps (torch.profiler), the optimizer's
    total (its ops are also counted in their categories) and the wall ms per profiled step
    (the profiler's own overhead included)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from tern.train import loop

    cuda = run.dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for step in range(first_step, first_step + n):
            loop._optimizer_step(run, step, rows)
        sync()
    wall = (time.perf_counter() - t0) / n * 1e3
    cats: dict[str, float] = {}
    opt = kernel_us = 0.0
    kernels = 0
    runtime: dict[str, int] = {}  # CUDA runtime calls that wait for the GPU or copy: syncs
    for e in prof.key_averages():
        if str(getattr(e, "device_type", "")).endswith("CUDA"):  # a kernel (or copy) on the GPU
            kernel_us += e.self_device_time_total
            kernels += e.count
            continue
        if e.key.startswith(("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy",
                             "cudaEventSynchronize")):
            runtime[e.key] = runtime.get(e.key, 0) + e.count
        if e.key.startswith("Optimizer."):
            opt += e.cpu_time_total
            continue
        c = next((c for c, pre in PROFILE_CATEGORIES if e.key.startswith(pre)), "other torch ops")
        cats[c] = cats.get(c, 0.0) + e.self_cpu_time_total
    out = {c: v / n / 1e3 for c, v in sorted(cats.items(), key=lambda kv: -kv[1])}
    gpu = ({"device_ms_per_step": kernel_us / n / 1e3, "kernels_per_step": kernels / n,
            "device_busy_share": kernel_us / n / 1e3 / wall,  # GPU time / wall: low = the host's ops set the pace
            "sync_calls_per_step": {k: v / n for k, v in sorted(runtime.items())}} if cuda else {})
    return {"self_ms_per_step": out, "optimizer_total_ms": opt / n / 1e3,
            "profiled_wall_ms": wall, "steps": n, **gpu}


def time_parts(run, rows, repeats: int = 15) -> dict:
    """Median ms of forward + backward of every part of a training step, each timed on its
    own (module docstring, ``--parts``), and of the whole forward + backward for comparison."""
    import torch
    import torch.nn.functional as F

    try:
        from tern.train.model.ternary import dense_product
    except ImportError:  # a checkout before the head's product had its own function (PYTHONPATH)
        def dense_product(x, w):
            return x @ w.t()

    m, tc, dev = run.model, run.tc, run.dev
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def median_ms(fn) -> float:
        for _ in range(3):
            fn()
        ts = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            ts.append(time.perf_counter() - t0)
        return sorted(ts)[len(ts) // 2] * 1e3

    xb = torch.as_tensor(run.data.batch(tc.seed, 0, tc.batch_size, tc.seq_len)[rows]).to(dev)  # (b, T+1)
    x0 = torch.randn(xb.shape[0], tc.seq_len, m.cfg.d_model, device=dev)  # (b, T, D)

    def backward_of(fn):
        def run_once():
            x = x0.clone().requires_grad_()
            fn(x).sum().backward()
        return run_once

    parts = {}
    for i, layer in enumerate(m.layers):
        kind = type(layer.mixer).__name__
        parts[f"layer {i} mixer ({kind})"] = median_ms(backward_of(
            lambda x, layer=layer: layer.mixer(layer.norm1(x), None, False)[0]))
        if layer.ffn is not None:
            parts[f"layer {i} ffn ({type(layer.ffn).__name__})"] = median_ms(backward_of(
                lambda x, layer=layer: layer.ffn(layer.norm2(x))))
    target = xb[:, 1:].reshape(-1)

    def head_loss(x):
        logits = dense_product(m.norm_f(x), m.head_weight())  # (b, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target)

    parts["head + loss"] = median_ms(backward_of(head_loss))
    parts["optimizer update"] = median_ms(lambda: run.opt.step())
    if tc.grad_clip:
        parts["gradient clip"] = median_ms(lambda: torch.nn.utils.clip_grad_norm_(m.parameters(), tc.grad_clip))

    def whole():
        run.opt.zero_grad(set_to_none=True)
        logits = m(xb[:, :-1])
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target).backward()

    return {"parts": parts, "whole_forward_backward": median_ms(whole), "repeats": repeats}


def use_reference_paths(run) -> None:
    """The step as before the fused CPU paths: foreach AdamW, masked-softmax attention and
    eval's fp32 integer products (module docstring)."""
    import torch

    from tern.train.environment import param_groups
    from tern.train.model import ternary
    from tern.train.model.attention import SlidingWindowAttention

    tc = run.tc
    run.opt = torch.optim.AdamW(param_groups(run.model, tc.weight_decay), lr=tc.lr,
                                betas=(tc.beta1, tc.beta2))
    for m in run.model.modules():
        if isinstance(m, SlidingWindowAttention):
            m.fused = False
    ternary._eval_int_product = lambda q, wt: None  # this process measures one variant


def measure(gate: str, arm: str, dispatch: str, threads: int, steps: int, warmup: int,
            eval_full: bool, eval_batch: int | None, backward: str | None = None,
            profile: int = 0, paths: str = "fast", device: str = "cpu", parts: bool = False) -> dict:
    import torch

    from tern.core.records import run_metadata, summarize
    from tern.decide.harness import default_make_train
    from tern.decide.spec import load_gate
    from tern.train import loop
    from tern.train.environment import cpu_training_mode, resolve_cpu_backward

    torch.set_num_threads(threads)
    import numba

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    spec = load_gate(gate)
    if arm.startswith("teacher:"):
        t = arm.split(":", 1)[1]
        mc, tc = spec.teacher_model_config(t), default_make_train()(spec.teacher_train_overrides(t))
    else:
        mc, tc = spec.model_config(arm), default_make_train()(spec.train_overrides(arm, 0))
    if backward is not None:
        tc = tc.replace(cpu_backward=backward)
    if not arm.startswith("teacher:") and spec.arms[arm].distill:
        return measure_distill(spec, arm, mc, tc, threads, steps, warmup)
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)  # time finished work
    with cpu_training_mode(tc, dev):
        run = loop._build_run(mc, tc, None, None, 0, 1, dev)
        if paths == "reference":
            use_reference_paths(run)
        for layer in run.model.layers:
            if layer.ffn is not None and hasattr(layer.ffn, "dispatch"):
                layer.ffn.dispatch = dispatch
        run.model.train()
        rows = slice(0, tc.batch_size)
        times = []
        for step in range(warmup + steps):
            sync()
            t0 = time.perf_counter()
            loop._optimizer_step(run, step, rows)
            sync()
            times.append(time.perf_counter() - t0)
        times = times[warmup:]
        prof = profile_steps(run, rows, warmup + steps, profile) if profile else None
        parts_ms = time_parts(run, rows) if parts else None
        eval_s = None
        if eval_full:
            run.model.reset_stats()
            sync()
            t0 = time.perf_counter()
            ev = loop._evaluate(run.model, run.data, tc, dev, None, 0, 0,
                                **({"batch_size": eval_batch} if eval_batch else {}))
            sync()
            eval_s = time.perf_counter() - t0
    s = summarize(times)
    tokens = tc.batch_size * tc.seq_len
    return {"record": "train_speed", "gate": spec.name, "arm": arm, "model_config": mc.to_dict(),
            "batch_size": tc.batch_size, "seq_len": tc.seq_len, "dispatch": dispatch,
            "device": device, "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
            "cpu_backward": resolve_cpu_backward(tc), "paths": paths, "threads": threads, "steps_timed": steps,
            "warmup_steps": warmup, "step_s": s, "tokens_per_s": tokens / s["median"],
            "eval_s": eval_s, "eval_bpb": ev.get("bpb") if eval_full else None,
            "eval_batch": eval_batch, "profile_ms": prof, "parts_ms": parts_ms, **run_metadata(threads)}


def measure_whole_run(gate: str, arm: str, threads: int, run_steps: int | None) -> dict:
    """One whole training run of ``arm`` (seed 0) with whichever ``tern`` is first on
    sys.path (``--code-root``): run_training's own tokens_per_s, wall seconds, val_bpb."""
    import tempfile

    import torch

    torch.set_num_threads(threads)
    import numba

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:  # this checkout's layout
        from tern.decide.harness import default_make_train
        from tern.decide.spec import load_gate
        from tern.train.loop import run_training
    except ImportError:  # the flat layout of the v1 gates' code (31266cd)
        from tern.gates import default_make_train
        from tern.gates_spec import load_gate

        from tern.train import run_training
    import tern

    spec = load_gate(gate)
    mc, over = spec.model_config(arm), spec.train_overrides(arm, 0)
    if run_steps:
        over = {**over, "steps": run_steps}
    tc = default_make_train()(over)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        r = run_training(mc, tc, out_dir=tmp, progress=False)
        wall = time.perf_counter() - t0
    return {"record": "train_speed", "mode": "whole_run", "gate": spec.name, "arm": arm,
            "model_config": mc.to_dict(), "batch_size": tc.batch_size, "seq_len": tc.seq_len,
            "threads": threads, "steps_timed": r["steps"], "tokens_per_s": r["tokens_per_s"],
            "wall_s": wall, "eval_s": wall - r["train_tokens"] / r["tokens_per_s"],
            "eval_bpb": r.get("val_bpb"), "dispatch": "auto", "paths": "as trained",
            "tern_package": str(Path(tern.__file__).parent)}


def whole_runs(a) -> list[dict]:
    """--whole-run: every (arm, threads, concurrent, checkout) measurement, checkouts
    interleaved per measurement, each copy in its own process (module docstring)."""
    from tern.core.records import checkout_commit, run_metadata

    rows = []
    for arm, t, conc in itertools.product(a.arms, a.threads, a.concurrent):
        if t * conc > (os.cpu_count() or 1):
            print(f"skipped: {conc} runs x {t} threads oversubscribe {os.cpu_count()} CPUs", flush=True)
            continue
        for root in a.code_root:
            root = str(Path(root).resolve())
            gate = str(Path(root) / a.gate)
            if not Path(gate).is_file():
                raise SystemExit(f"gate_train_speed: {a.gate} is not in checkout {root}")
            cmd = [sys.executable, str(Path(__file__).resolve()), "--whole-run", "--one", "--gate", gate,
                   "--arms", arm, "--threads", str(t)] + (["--run-steps", str(a.run_steps)] if a.run_steps else [])
            env = {**os.environ, "PYTHONPATH": root}
            procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=root, env=env) for _ in range(conc)]
            outs = [pr.communicate()[0] for pr in procs]
            if any(pr.returncode for pr in procs):
                raise SystemExit(f"gate_train_speed: a run with {root} failed (exit codes {[pr.returncode for pr in procs]})")
            for out in outs:
                r = json.loads(out.strip().splitlines()[-1])
                if not Path(r["tern_package"]).is_relative_to(root):
                    raise SystemExit(f"gate_train_speed: the run imported tern from {r['tern_package']}, not from {root}")
                r = {**run_metadata(t), **r, "concurrent": conc, "code_root": root, "code_commit": checkout_commit(root),
                     "code": a.code, "code_note": a.code_note}
                rows.append(r)
                print(f"{r['gate']} {arm:>6} threads {t} concurrent {conc} code {r['code_commit'][:12]}: "
                      f"{r['tokens_per_s']:,.0f} tok/s training, {r['wall_s']:.1f} s wall "
                      f"({r['steps_timed']} steps), val_bpb {r['eval_bpb']:.4f}", flush=True)
    return rows


def measure_distill(spec, arm: str, mc, tc, threads: int, steps: int, warmup: int) -> dict:
    """A KD arm: its teacher trained for 2 steps (a checkpoint of the right shape), then
    run_distill for warmup + steps steps and the full validation; the rate is the run's own
    (training seconds of all its steps, warm-up included: a slight underestimate)."""
    import tempfile

    from tern.core.records import run_metadata
    from tern.decide.harness import default_make_train
    from tern.train.distill import run_distill
    from tern.train.environment import resolve_cpu_backward
    from tern.train.loop import run_training

    d = spec.arms[arm].distill
    t = d["teacher"]
    with tempfile.TemporaryDirectory() as tmp:
        tt = default_make_train()({**spec.teacher_train_overrides(t), "steps": 2})
        ck = run_training(spec.teacher_model_config(t), tt, out_dir=tmp, progress=False)["checkpoint"]
        t0 = time.perf_counter()
        r = run_distill(mc, tc.replace(steps=warmup + steps), teacher_checkpoint=ck,
                        teacher_cfg=spec.teacher_model_config(t), distill=dict(d), progress=False)
        wall = time.perf_counter() - t0
    return {"record": "train_speed", "gate": spec.name, "arm": arm, "model_config": mc.to_dict(),
            "batch_size": tc.batch_size, "seq_len": tc.seq_len, "distill": d, "dispatch": "auto",
            "cpu_backward": resolve_cpu_backward(tc), "paths": "fast",
            "threads": threads, "steps_timed": warmup + steps, "warmup_steps": 0,
            "step_s": {"median": r["train_s"] / (warmup + steps), "min": None, "max": None,
                       "repeats": 1, "note": "mean over the run's steps"},
            "tokens_per_s": r["tokens_per_s"], "eval_s": wall - r["train_s"],
            "eval_bpb": r.get("val_bpb"), "eval_batch": None, **run_metadata(threads)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gate", required=True)
    p.add_argument("--arms", nargs="+", required=True)
    p.add_argument("--dispatch", nargs="+", default=["auto"])
    p.add_argument("--threads", nargs="+", type=int, default=[2])
    p.add_argument("--concurrent", type=int, nargs="+", default=[1],
                   help="copies side by side (processes); several values: one measurement each")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where the steps run (cuda: each copy of --concurrent shares the one GPU)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--eval", action="store_true", help="also time validation on the full split")
    p.add_argument("--eval-batch", type=int, default=None)
    p.add_argument("--backward", nargs="+", default=[None],
                   help="TrainConfig.cpu_backward values (default: the config's)")
    p.add_argument("--paths", nargs="+", default=["fast"], choices=["fast", "reference"],
                   help="fast: the step as trained; reference: without the fused CPU paths")
    p.add_argument("--profile", type=int, default=0, help="profile this many more steps")
    p.add_argument("--parts", action="store_true",
                   help="also time each part of the step directly (forward + backward per block)")
    p.add_argument("--code", default=None, help="a tag stored in every row (e.g. before / after)")
    p.add_argument("--code-note", default=None, help="what the tag means, stored in every row")
    p.add_argument("--out", default=None, help="append rows to this JSONL")
    p.add_argument("--whole-run", action="store_true",
                   help="time whole training runs (the gate's budget) instead of steps")
    p.add_argument("--run-steps", type=int, default=None, help="--whole-run: steps per run (default: the gate's)")
    p.add_argument("--code-root", nargs="+", default=["."],
                   help="--whole-run: checkouts to run each measurement with (default: this one)")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child measurement
    a = p.parse_args(argv)
    if a.device == "cuda" and not a.one:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("gate_train_speed: --device cuda, but torch sees no CUDA device here")
    if a.whole_run:
        if a.one:
            print(json.dumps(measure_whole_run(a.gate, a.arms[0], a.threads[0], a.run_steps)))
            return 0
        rows = whole_runs(a)
        if a.out:
            from tern.core.records import append_jsonl

            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            append_jsonl(a.out, rows)
        return 0
    rows = []
    for arm, d, t, pa, bw, conc in itertools.product(a.arms, a.dispatch, a.threads, a.paths, a.backward,
                                                     a.concurrent):
        if a.one:
            got = [measure(a.gate, arm, d, t, a.steps, a.warmup, a.eval, a.eval_batch, bw, a.profile, pa,
                           a.device, a.parts)]
        else:
            cmd = [sys.executable, __file__, "--gate", a.gate, "--arms", arm, "--dispatch", d,
                   "--threads", str(t), "--steps", str(a.steps), "--warmup", str(a.warmup),
                   "--paths", pa, "--profile", str(a.profile), "--device", a.device, "--one"]
            cmd += ["--backward", bw] if bw else []
            cmd += ["--eval"] if a.eval else []
            cmd += ["--parts"] if a.parts else []
            cmd += ["--eval-batch", str(a.eval_batch)] if a.eval_batch else []
            # every measurement in fresh processes ("reference" patches module state)
            procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(conc)]
            outs = [pr.communicate()[0] for pr in procs]
            if any(pr.returncode for pr in procs):  # the child's traceback is on stderr above
                raise SystemExit(f"gate_train_speed: a measurement of {arm} failed "
                                 f"(exit codes {[pr.returncode for pr in procs]})")
            got = [json.loads(out.strip().splitlines()[-1]) for out in outs]
        for r in got:
            r["concurrent"] = conc
            r["code"], r["code_note"] = a.code, a.code_note
            rows.append(r)
            if a.one:
                print(json.dumps(r))
                continue
            ev = f", validation {r['eval_s']:.1f} s" if r["eval_s"] else ""
            print(f"{r['gate']} {arm:>6} {a.device} dispatch {d:<7} paths {pa:<9} backward {r['cpu_backward']} threads {t} concurrent "
                  f"{conc}: step median {r['step_s']['median'] * 1e3:7.1f} ms "
                  f"(min {(r['step_s']['min'] or 0) * 1e3:.1f}, max {(r['step_s']['max'] or 0) * 1e3:.1f}) "
                  f"-> {r['tokens_per_s']:,.0f} tok/s{ev}", flush=True)
            for c, v in ((r.get("profile_ms") or {}).get("self_ms_per_step") or {}).items():
                print(f"    {c:<42} {v:7.1f} ms/step (self CPU)")
            if r.get("parts_ms"):
                pm = r["parts_ms"]
                for c, v in pm["parts"].items():
                    print(f"    {c:<42} {v:7.2f} ms (forward + backward, timed alone)")
                print(f"    {'sum of the parts':<42} {sum(pm['parts'].values()):7.2f} ms; the whole forward + "
                      f"backward {pm['whole_forward_backward']:.2f} ms")
            prof = r.get("profile_ms") or {}
            if "device_ms_per_step" in prof:
                print(f"    GPU kernels: {prof['device_ms_per_step']:.1f} ms/step over "
                      f"{prof['kernels_per_step']:,.0f} kernels ({prof['device_busy_share']:.0%} of the profiled "
                      f"wall); waits/copies per step: {prof['sync_calls_per_step']}")
    if a.out and not a.one:
        from tern.core.records import append_jsonl

        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        append_jsonl(a.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
