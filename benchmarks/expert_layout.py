"""Routed experts read apart or together, the matrix passes alone: the engine's ``experts`` option.

A MoE token reads top_k experts a layer, each a gate, an up and a down matrix. ``apart`` keeps them as
the file stores them, three tensors of all experts (a token reads three runs in three places per
expert); ``together`` keeps each expert's gate, up and down back to back (tern.run.weights.experts_together:
one run per expert). Both arms run the engine's blocked16 pass (kernels_blocked.blocked16_matvec_next,
each pass handing the next matrix to its chained prefetch, as tern.kernels.ops.gated_mlp does) over the
same top_k experts of every layer, chosen at random per token in ascending order, in one buffer of
``layers x experts x 3`` matrices on transparent huge pages; ``read`` is the plain read kernel over as
many bytes in one run (the rate a single stream gets). Rounds alternate the arms. GB/s of packed bytes.
That both layouts give the same logits is tested (tests/run/test_engine_experts.py); here only time counts.

    flock /tmp/tern-cpu.lock .venv/bin/python benchmarks/expert_layout.py [--d-model 1024 --hidden 512 ...]

Defaults: the 9.7B MoE peer of ``tern bench peers`` (d_model 1024, 512 experts of 512, top-8, 12 layers:
2.4 GB of expert matrices).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numba
import numpy as np

from tern.core.records import append_jsonl, run_metadata, summarize
from tern.kernels.kernels_blocked import blocked16_matvec_next, blocked16_shape
from tern.probe.bandwidth import read_kernel
from tern.run.weights import huge_page_buffer

ARMS = ("apart", "together")


@numba.njit(cache=True)
def _passes(buf, offs, blocks, block_bytes, hidden_in, xq, hq, scale, out):
    """Matrix i (blocks[i], block_bytes[i]) at buf[offs[i]:], over xq (gate / up) or hq (down, hidden_in[i]);
    each pass prefetches the start of the next."""
    n = offs.shape[0]
    for i in range(n):
        m = buf[offs[i]:offs[i] + blocks[i] * block_bytes[i]].reshape((blocks[i], block_bytes[i]))
        j = i + 1 if i + 1 < n else 0
        nx = buf[offs[j]:offs[j] + blocks[j] * block_bytes[j]].reshape((blocks[j], block_bytes[j]))
        rows = blocks[i] * 16
        x = hq if hidden_in[i] else xq
        blocked16_matvec_next(m, scale[:rows], x, np.float32(1.0), out[:rows], True, nx)


def plan(arm: str, choices: np.ndarray, d_model: int, hidden: int, experts: int) -> tuple[np.ndarray, ...]:
    """(offsets, blocks, block bytes, hidden input) of every pass of ``choices`` (tokens, layers, top_k) in ``arm``."""
    g_blocks, g_bb = blocked16_shape(hidden, d_model)  # gate / up: (hidden, d_model)
    d_blocks, d_bb = blocked16_shape(d_model, hidden)  # down: (d_model, hidden)
    gb, db = g_blocks * g_bb, d_blocks * d_bb
    per_layer = experts * (2 * gb + db)
    offs, kinds = [], []
    for per_token in choices:
        for layer, chosen in enumerate(per_token):
            base = layer * per_layer
            for e in chosen:
                if arm == "apart":  # gate tensor, up tensor, down tensor of the layer
                    offs += [base + e * gb, base + experts * gb + e * gb, base + 2 * experts * gb + e * db]
                else:  # each expert's gate, up, down back to back
                    b = base + e * (2 * gb + db)
                    offs += [b, b + gb, b + 2 * gb]
                kinds += [0, 0, 1]
    kinds_a = np.array(kinds, np.int64)
    return (np.array(offs, np.int64), np.where(kinds_a == 1, d_blocks, g_blocks), np.where(kinds_a == 1, d_bb, g_bb),
            kinds_a)


def run(args: argparse.Namespace) -> list[dict]:
    D, H, E, K, L = args.d_model, args.hidden, args.experts, args.top_k, args.layers
    gb = int(np.prod(blocked16_shape(H, D)))
    db = int(np.prod(blocked16_shape(D, H)))
    total = L * E * (2 * gb + db)
    buf = huge_page_buffer(total)
    chunk = np.random.default_rng(1).integers(0, 256, size=min(total, 64 << 20), dtype=np.uint8)
    for i in range(0, total, chunk.size):  # random codes; every page written (resident)
        buf[i:i + chunk.size] = chunk[:min(chunk.size, total - i)]
    rng = np.random.default_rng(0)
    xq = rng.integers(-127, 128, size=D, dtype=np.int8)
    hq = rng.integers(-127, 128, size=H, dtype=np.int8)
    scale = np.ones(max(2 * H, D) + 16, np.float32)
    out = np.empty_like(scale)
    per_token = K * L * (2 * gb + db)
    flat = buf[:per_token * args.tokens // 8 * 8].view(np.float64)  # read: as many bytes, one run
    warm = np.sort(np.stack([[rng.permutation(E)[:K] for _ in range(L)]]), axis=-1)  # (1 token, L, K)
    for arm in ARMS:  # compile
        _passes(buf, *plan(arm, warm, D, H, E), xq, hq, scale, out)
    gbps: dict[str, list[float]] = {a: [] for a in ARMS + ("read",)}
    for _ in range(args.repeats):
        choices = np.sort(np.stack([[rng.permutation(E)[:K] for _ in range(L)] for _ in range(args.tokens)]), axis=-1)
        for arm in ARMS:
            p = plan(arm, choices, D, H, E)
            t0 = time.perf_counter()
            _passes(buf, *p, xq, hq, scale, out)
            gbps[arm].append(per_token * args.tokens / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        read_kernel(flat, 1)
        gbps["read"].append(flat.nbytes / (time.perf_counter() - t0) / 1e9)
    out_path = Path(args.results) / "bench" / "expert_layout.jsonl"
    rows = []
    for arm, v in gbps.items():
        row = {**run_metadata(1), "bench": "expert_layout", "arm": arm, "d_model": D, "hidden": H, "experts": E,
               "top_k": K, "layers": L, "tokens": args.tokens, "bytes_per_token": per_token,
               "working_set_bytes": total, "gbps": summarize(v)}
        append_jsonl(out_path, row)
        rows.append(row)
    med = {a: summarize(v)["median"] for a, v in gbps.items()}
    print(f"{E} experts of {H} x {D}, top-{K}, {L} layers ({total / 2**30:.2f} GiB), {args.repeats} rounds, "
          f"GB/s: apart {med['apart']:.1f}, together {med['together']:.1f} ({med['together'] / med['apart']:.2f}x), "
          f"one run {med['read']:.1f}", flush=True)
    print(f"rows appended to {out_path}")
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default="results", help="results folder (rows: <results>/bench/expert_layout.jsonl)")
    p.add_argument("--d-model", type=int, default=1024, help="model width (gate / up inputs, down outputs)")
    p.add_argument("--hidden", type=int, default=512, help="each expert's hidden units")
    p.add_argument("--experts", type=int, default=512, help="routed experts per layer")
    p.add_argument("--top-k", type=int, default=8, help="experts each token reads per layer")
    p.add_argument("--layers", type=int, default=12, help="MoE layers")
    p.add_argument("--tokens", type=int, default=64, help="tokens per timed run")
    p.add_argument("--repeats", type=int, default=5, help="rounds, the arms alternating (median reported)")
    a = p.parse_args(argv)
    if min(a.d_model, a.hidden, a.experts, a.top_k, a.layers, a.tokens, a.repeats) < 1:
        p.error("every size, --tokens and --repeats must be >= 1")
    if a.top_k > a.experts:
        p.error(f"--top-k {a.top_k} exceeds --experts {a.experts}")
    run(a)


if __name__ == "__main__":
    main()
