"""Figures of a training run, drawn from its JSONL log (``train_log.jsonl``) or result:
loss and validation BPB curves, activation sparsity per layer, expert load per layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tern.core.figure import subplots
from tern.core.records import read_jsonl


def _rows(log: str | Path | list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = read_jsonl(log) if isinstance(log, (str, Path)) else list(log)
    if not any(r.get("record") == "train_step" for r in rows):
        raise ValueError("training log has no train_step rows")
    return rows


def curves_plot(log: str | Path | list[dict[str, Any]], path: str | Path | None = None):
    """Training loss (nats/token) and validation BPB (bits/byte) against training tokens."""
    rows = _rows(log)
    st = [r for r in rows if r.get("record") == "train_step"]
    ev = [r for r in rows if r.get("record") == "eval"]
    fig, ax = subplots(figsize=(7, 4))
    ax.plot([r["train_tokens"] for r in st], [r["loss"] for r in st], color="tab:blue", lw=1,
            label="train loss")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("train loss (nats/token)")
    ax.grid(alpha=0.3)
    bpb = [r for r in ev if r.get("bpb") is not None]
    if bpb:
        ax2 = ax.twinx()
        ax2.plot([r["train_tokens"] for r in bpb], [r["bpb"] for r in bpb], "o-", color="tab:red",
                 label="val BPB (subset)")
        ax2.set_ylabel("validation (bits/byte)")
        ax2.legend(loc="upper center")
    ax.legend(loc="upper right")
    ax.set_title("training curves")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def sparsity_plot(result: dict[str, Any], path: str | Path | None = None):
    """Fraction of exactly-zero FFN hidden units per layer (routed and shared experts)."""
    sp = [s for s in result.get("sparsity") or [] if s.get("zero_frac") is not None]
    if not sp:
        raise ValueError("result has no per-layer sparsity")
    fig, ax = subplots(figsize=(6, 3.5))
    x = [s["layer"] for s in sp]
    ax.bar([i - 0.2 for i in x], [100 * s["zero_frac"] for s in sp], width=0.4, label="routed / dense")
    sh = [(s["layer"], s["shared_zero_frac"]) for s in sp if s.get("shared_zero_frac") is not None]
    if sh:
        ax.bar([i + 0.2 for i, _ in sh], [100 * v for _, v in sh], width=0.4, label="shared")
    ax.set_xlabel("layer")
    ax.set_ylabel("zero hidden units (%)")
    ax.set_ylim(0, 100)
    ax.legend()
    ax.set_title("activation sparsity (validation pass)")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def expert_load_plot(result: dict[str, Any], path: str | Path | None = None):
    """Assignments per routed expert relative to the mean, one row per MoE layer."""
    load = result.get("expert_load") or []
    if not load:
        raise ValueError("result has no expert_load (no MoE layers)")
    import numpy as np

    m = np.array([np.asarray(r["counts"], float) / max(np.mean(r["counts"]), 1e-12) for r in load])
    fig, ax = subplots(figsize=(7, 0.5 * len(load) + 1.8))
    im = ax.imshow(m, aspect="auto", cmap="viridis", vmin=0)
    ax.set_yticks(range(len(load)), [f"layer {r['layer']}" for r in load])
    ax.set_xlabel("routed expert")
    fig.colorbar(im, ax=ax, label="assignments / mean")
    ax.set_title("expert load (validation pass)")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_run(log: str | Path, out_dir: str | Path, result: dict[str, Any] | None = None,
             prefix: str = "train") -> list[Path]:
    """All figures of one run as PNGs ``<prefix>_{curves,sparsity,expert_load}.png`` in
    ``out_dir``; ``result`` defaults to the log's train_end row. Returns the written paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = _rows(log)
    if result is None:
        ends = [r for r in rows if r.get("record") == "train_end"]
        result = ends[-1] if ends else {}
    paths = []
    for name, fn, arg in ((f"{prefix}_curves", curves_plot, rows), (f"{prefix}_sparsity", sparsity_plot, result),
                          (f"{prefix}_expert_load", expert_load_plot, result)):
        try:
            fn(arg, out / f"{name}.png")
        except ValueError:
            continue
        paths.append(out / f"{name}.png")
    return paths
