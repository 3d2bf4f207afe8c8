"""The engine's non-matrix-pass kernels timed alone, per checkout: the SSM scan step, the
activation-skip matvec and attention (issue 16: what a DRAM-bound token spends beyond the row passes).

* ``scan``: tern.kernels.ssm_step.selective_scan_step at one layer's shape (``--scan`` DIxRxN,
  default the d2560 10B picks' 5120 x 160 x 16, fp16 dt projection), its tensors cycled over
  ``--ws-mib`` MiB of layers (DRAM) and over one layer (cache). The dt projection is passed in the
  layout the checkout's engine reads it (column blocks since session 44, else (Di, R) as stored).
* ``skip``: tern.kernels.kernels_ternary.ternary_matvec_skip on ``--skip`` INPUTSxOUTPUTS transposed
  matrices (default the pick's expert down projection, 640 x 2560) at a fraction of nonzero inputs
  (0, 0.25, 0.5, 1: the fixed cost and the cost a row), in cache, and over ``--ws-mib`` MiB (DRAM, 0.25).
* ``attention``: one token's attention (tern.kernels.attention since session 46, else
  tern.kernels.ops.attend on per-head caches) over ``--attention`` HEADSxHEAD_DIMxWINDOW key / value
  ring buffers (default the 9.7B MoE peer's 16 x 64, window 512) at ``--positions`` cached positions,
  in the layout the checkout's engine keeps them, one layer (cache) and cycled over ``--ws-mib`` MiB.

``--cases`` picks which (default all three).

Each ``--code-root`` checkout runs in its own process with its own numba cache, checkouts alternating
in every round, so a drifting VM slows all alike (as benchmarks/code_ab.py does for whole decodes).

    flock /tmp/tern-cpu.lock .venv/bin/python benchmarks/scan_skip_kernels.py --code-root OLD . --rounds 3

One JSONL row per checkout and case (--out): run metadata, the checkout's commit, microseconds a call
(median, min, max, spread over rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from curve_stability import parse_shape  # ROWSxCOLS (here inputs x outputs)

ROOT = Path(__file__).resolve().parents[1]
DENSITIES = (0.0, 0.25, 0.5, 1.0)
CASES = ("scan", "skip", "attention")


def _per_call(fn, n_items: int, min_time_s: float = 0.3) -> float:
    """Seconds a call of fn(i), i cycling over n_items: the fastest of 3 timed runs of min_time_s
    (tern.probe.timing.timed_runs, calibrated after a warm-up)."""
    from tern.probe.timing import TimingConfig, timed_runs

    def run(n):
        for i in range(n):
            fn(i % n_items)

    t = timed_runs(run, TimingConfig(min_time_s=min_time_s, repeats=3))
    return min(s / c for c, s in zip(t.counts, t.seconds, strict=True))


def attention_cases(attn: tuple[int, int, int], positions: list[int], ws_bytes: int) -> dict[str, float]:
    """Microseconds of one token's attention over every head at each number of cached positions,
    one layer's caches (cache) and layers cycled over ws_bytes (DRAM), with this checkout's layout."""
    import numpy as np

    from tern.kernels import ops
    nh, hd, win = attn
    rng = np.random.default_rng(0)
    slot_major = hasattr(ops, "attend_block")  # tern.kernels.attention (session 46): flat slot-major caches
    shape = (win * nh * hd,) if slot_major else (nh, win, hd)
    nl = max(1, ws_bytes // (2 * win * nh * hd * 4))
    kcs = [rng.standard_normal(shape).astype(np.float32) for _ in range(nl)]
    vcs = [rng.standard_normal(shape).astype(np.float32) for _ in range(nl)]
    uz, y = rng.standard_normal(3 * nh * hd).astype(np.float32), np.zeros(nh * hd, np.float32)
    q = uz[:nh * hd]
    sc = np.zeros(nh * (win + getattr(ops, "SCORE_PAD", 0)), np.float32)
    out = {}
    for n in positions:
        t = np.int64(n - 1)
        if slot_major:
            def call(i, t=t):
                ops.attend(q, kcs[i], vcs[i], uz, np.int64(nh * hd), np.int64(win), np.int64(nh), np.int64(1), t, sc, y)
        else:
            def call(i, t=t):
                ops.attend(q, kcs[i], vcs[i], t, sc, y)
        out[f"attn_cache_n{n}_us"] = _per_call(call, 1) * 1e6
        out[f"attn_dram_n{n}_us"] = _per_call(call, nl) * 1e6
    return out


def worker(scan: tuple[int, int, int], skip: tuple[int, int], ws_bytes: int, cases=CASES) -> dict[str, float]:
    """Microseconds a call of the scan and skip cases among ``cases``, with the kernels of the tern this
    process imports (the scan's tensors are drawn either way, so the skip's random data stay the same)."""
    import numpy as np

    from tern.kernels import kernels_ternary as kt
    from tern.kernels.ssm_step import selective_scan_step
    try:
        from tern.kernels.kernels_dense import column_blocks
    except ImportError:  # a checkout before session 44: the projection as stored
        def column_blocks(w):
            return w
    rng = np.random.default_rng(0)
    f32 = np.float32
    di, rk, ns = scan
    layer_bytes = di * rk * 2 + 3 * di * ns * 4
    nl = max(1, ws_bytes // layer_bytes)
    dtw = [column_blocks((0.01 * rng.standard_normal((di, rk))).astype(np.float16).view(np.uint16)) for _ in range(nl)]
    AT = [-np.abs(rng.standard_normal((ns, di))).astype(f32) for _ in range(nl)]
    hT = [np.zeros((ns, di), f32) for _ in range(nl)]
    dtb, Dp = np.zeros(di, f32), np.ones(di, f32)
    dbc, uc, z = rng.standard_normal(rk + 2 * ns).astype(f32), rng.standard_normal(di).astype(f32), rng.standard_normal(di).astype(f32)
    dt, y = np.zeros(di, f32), np.zeros(di, f32)

    def scan_call(i):
        selective_scan_step(dtw[i], dtb, AT[i], Dp, hT[i], dbc, uc, z, dt, y, 0, di)

    out = {"scan_dram_us": _per_call(scan_call, nl) * 1e6, "scan_cache_us": _per_call(scan_call, 1) * 1e6} if "scan" in cases else {}
    if "skip" not in cases:
        return out
    ins, outs = skip
    nm = max(1, ws_bytes // (ins * outs // 4))
    codes = rng.integers(0, 3, (ins, outs // 4, 4), dtype=np.uint8)  # ternary2 codes 0..2, 4 a byte
    one = (codes[..., 0] | codes[..., 1] << 2 | codes[..., 2] << 4 | codes[..., 3] << 6).astype(np.uint8)
    mats = [one.copy() for _ in range(nm)]
    rs, res = np.ones(outs, f32), np.zeros(outs, f32)
    for density in DENSITIES:
        xq = np.zeros(ins, np.int8)
        nz = rng.choice(ins, int(round(ins * density)), replace=False)
        xq[nz] = rng.integers(1, 127, nz.size)
        out[f"skip_cache_{density}_us"] = _per_call(lambda i, xq=xq: kt.ternary_matvec_skip(mats[0], rs, xq, f32(0.01), res), 1) * 1e6
        if density == 0.25:
            out["skip_dram_0.25_us"] = _per_call(lambda i, xq=xq: kt.ternary_matvec_skip(mats[i], rs, xq, f32(0.01), res), nm) * 1e6
    return out


def _three_dims(what: str, example: str):
    """An argparse type: ``AxBxC`` of positive integers -> a 3-tuple, else a clear error."""
    def parse(text: str) -> tuple[int, int, int]:
        parts = text.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"{what} is {example.replace('=', ' of positive integers, e.g. ')}; got {text!r}")
        return tuple(int(p) for p in parts)
    return parse


_scan_dims = _three_dims("a scan shape", "DIxRxN=5120x160x16")
_attn_dims = _three_dims("an attention shape", "HEADSxHEAD_DIMxWINDOW=16x64x512")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code-root", nargs="+", default=["."], help="checkouts to compare (. is this one)")
    ap.add_argument("--scan", type=_scan_dims, default=(5120, 160, 16), help="DIxRxN of the scan step")
    ap.add_argument("--skip", type=parse_shape, default=(640, 2560),
                    help="INPUTSxOUTPUTS of the skip matvec (outputs a multiple of 256)")
    ap.add_argument("--attention", type=_attn_dims, default=(16, 64, 512), help="HEADSxHEAD_DIMxWINDOW of the attention")
    ap.add_argument("--positions", type=int, nargs="+", default=[32, 128], help="cached positions a token attends over")
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), help="which kernels to time")
    ap.add_argument("--ws-mib", type=int, default=256, help="MiB cycled for the DRAM cases")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="results/bench/scan_skip_kernels.jsonl", help="JSONL rows are appended here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        res = worker(args.scan, args.skip, args.ws_mib << 20, args.cases) if {"scan", "skip"} & set(args.cases) else {}
        if "attention" in args.cases:
            res.update(attention_cases(args.attention, args.positions, args.ws_mib << 20))
        print(json.dumps(res))
        return 0
    from tern.core.records import append_jsonl, checkout_commit, run_metadata, summarize

    roots = [Path(r).resolve() for r in args.code_root]
    bad = [str(r) for r in roots if not (r / "tern" / "__init__.py").is_file()]
    if bad or args.rounds < 1 or args.ws_mib < 1 or min(args.positions) < 1 or max(args.positions) > args.attention[2]:
        print(f"scan_skip_kernels: not tern checkouts: {bad}" if bad else
              "scan_skip_kernels: --rounds and --ws-mib must be >= 1, --positions within 1 .. the window", file=sys.stderr)
        return 2
    runs: dict[Path, list[dict]] = {r: [] for r in roots}
    for rnd in range(args.rounds):
        for root in roots[rnd % len(roots):] + roots[:rnd % len(roots)]:
            cache = ROOT / "results" / f"numba-cache-scan-skip-{roots.index(root)}"
            env = {**os.environ, "PYTHONPATH": str(root), "NUMBA_CACHE_DIR": str(cache)}
            cmd = [sys.executable, __file__, "--worker", "--scan", "x".join(map(str, args.scan)),
                   "--skip", "x".join(map(str, args.skip)), "--ws-mib", str(args.ws_mib),
                   "--attention", "x".join(map(str, args.attention)), "--positions", *map(str, args.positions),
                   "--cases", *args.cases]
            res = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
            if res.returncode != 0:
                print(f"scan_skip_kernels: the run in {root} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
                return 1
            runs[root].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"round {rnd + 1}/{args.rounds} {root}: " + ", ".join(f"{k} {v:.1f}" for k, v in runs[root][-1].items()),
                  file=sys.stderr)
    for root in roots:
        commit = checkout_commit(root)
        for case in runs[root][0]:
            us = summarize([r[case] for r in runs[root]])
            append_jsonl(args.out, {**run_metadata(threads=1), "benchmark": "scan_skip_kernels", "code_root": str(root),
                                    "code_commit": commit, "case": case, "scan": list(args.scan), "skip": list(args.skip),
                                    "attention": list(args.attention),
                                    "ws_bytes": args.ws_mib << 20, "rounds": args.rounds, "us_per_call": us})
            print(f"{commit[:12]} {case}: {us['median']:.1f} us a call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
