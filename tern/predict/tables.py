"""Prediction tables: configs x hosts x threads, rendered as text."""

from __future__ import annotations

from typing import Any

from tern.core.config import ModelConfig
from tern.core.host_caches import MIB
from tern.core.host_profile import HostProfile
from tern.predict.hosts import thread_choices
from tern.predict.roofline import Prediction, predict


def predict_table(configs: list[ModelConfig], hosts: dict[str, HostProfile],
                  threads: tuple[int, ...] | None = None, context: int | None = None,
                  policy: str = "reuse") -> list[dict[str, Any]]:
    """One row per (config, host, threads): tok/s, bytes and bound per pool. ``threads``
    None: :func:`thread_choices` of each host."""
    rows = []
    for cfg in configs:
        for label, host in hosts.items():
            for t in threads or thread_choices(host):
                p = predict(cfg, host, t, context, policy=policy)
                rows.append({"config": cfg.name, "host": label, "threads": t, "tok_per_s": p.tok_per_s,
                             "active_bytes": p.active_bytes, "hot_bytes": p.hot_bytes,
                             "resident_bound": p.resident.bound, "streamed_bound": p.streamed.bound,
                             "bound": p.bound})
    return rows


def render_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'config':<10} {'host':<12} {'thr':>3} {'tok/s':>10} {'active MB':>10} {'hot MB':>9} "
             f"{'resident':>9} {'streamed':>9}"]
    for r in rows:
        lines.append(f"{r['config']:<10} {r['host'][:12]:<12} {r['threads']:>3} {r['tok_per_s']:>10.1f} "
                     f"{r['active_bytes'] / 1e6:>10.2f} {r['hot_bytes'] / 1e6:>9.1f} "
                     f"{r['resident_bound']:>9} {r['streamed_bound']:>9}")
    return "\n".join(lines)


def render_prediction(p: Prediction) -> str:
    """The breakdown table of one prediction."""
    lines = [f"{p.config} on {p.host_label}", f"  threads {p.threads} (bandwidth curve: {p.curve_threads}), "
             f"context {p.context}, policy {p.policy}, usable LLC {p.llc_bytes / MIB:.1f} MiB",
             f"  {'pool':<9} {'MB/token':>9} {'ws MB':>9} {'GB/s':>8} {'mem us':>9} {'Gops':>8} "
             f"{'comp us':>9} {'stall us':>9} {'time us':>9} {'bound':>8}"]
    for q in (p.resident, p.streamed):
        lines.append(f"  {q.name:<9} {q.bytes_per_token / 1e6:>9.3f} {q.working_set_bytes / 1e6:>9.2f} "
                     f"{q.bandwidth_gbps:>8.1f} {q.memory_s * 1e6:>9.1f} {q.ops_per_token / 1e9:>8.3f} "
                     f"{q.compute_s * 1e6:>9.1f} {q.stall_s * 1e6:>9.1f} {q.time_s * 1e6:>9.1f} {q.bound:>8}")
    lines.append(f"  overhead {p.overhead_s * 1e6:.1f} us; state {p.state_bytes / 1e6:.3f} MB, "
                 f"kv {p.kv_bytes / 1e6:.3f} MB, total weights {p.total_bytes / 1e6:.1f} MB")
    how = ("op-cost model: time = measured op costs + memory stall" if p.model == "op-cost"
           else "roofline: time = max(memory, compute)")
    lines.append(f"  => {p.tok_per_s:.1f} tok/s ({p.s_per_token * 1e6:.1f} us/token), bound: {p.bound} ({how})")
    return "\n".join(lines)
