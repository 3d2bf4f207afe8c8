"""The peers figure: tok/s and effective GB/s of tern's engine and llama.cpp against model
size, from ``tern bench peers`` rows (tern.measure.peers), with the probe's read bandwidth
at each working set when a host profile is given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from tern.core.host_profile import HostProfile
from tern.core.host_queries import bandwidth_gbps
from tern.core.records import read_jsonl
from tern.measure.peers_table import latest_rows

ENGINE_STYLE = {"tern": {"color": "C0", "marker": "o"}, "tern-region": {"color": "C2", "marker": "^"},
                "tern-per-matrix": {"color": "C1", "marker": "v"}, "tern-blocked16": {"color": "C4", "marker": "D"},
                "tern-rows": {"color": "C5", "marker": "P"},
                "llama.cpp": {"color": "C3", "marker": "s"}}
THREAD_LINES = ("-", "--", ":", "-.")


def peers_rows(results: str | Path) -> list[dict[str, Any]]:
    """The latest row of each (engine, shape, threads) in ``<results>/bench/peers.jsonl``."""
    return latest_rows(read_jsonl(Path(results) / "bench" / "peers.jsonl"))


def plot_peers(rows: list[dict[str, Any]], host: HostProfile | None = None) -> Figure:
    """Two panels against model size (working set, MB, log): tok/s (log) and GB/s end to
    end (bytes read per token x tok/s); one colour per engine, one line style per thread
    count; with ``host``, the probe's read bandwidth at each working set (grey); tern rows that
    carry a prediction, the predicted tok/s as hollow markers."""
    rows = latest_rows(rows)
    if not rows:
        raise ValueError("no peers rows to plot (run `tern bench peers`)")
    threads = sorted({r["threads"] for r in rows})
    fig, (ax_t, ax_g) = plt.subplots(1, 2, figsize=(11, 4.2))
    for engine, style in ENGINE_STYLE.items():
        for i, t in enumerate(threads):
            pts = sorted((r for r in rows if r["engine"] == engine and r["threads"] == t),
                         key=lambda r: r["working_set_bytes"])
            if not pts:
                continue
            xs = [r["working_set_bytes"] / 1e6 for r in pts]
            kw = dict(color=style["color"], marker=style["marker"], ls=THREAD_LINES[i % len(THREAD_LINES)],
                      label=f"{engine}, {t} thread{'s' if t > 1 else ''}")
            ax_t.plot(xs, [r["tok_per_s"] for r in pts], **kw)
            ax_g.plot(xs, [r["gbps_end_to_end"] for r in pts], **kw)
            for r, x in zip(pts, xs, strict=True):
                if engine == "tern" and i == 0:
                    ax_t.annotate(r["shape"], (x, r["tok_per_s"]), fontsize=7, xytext=(3, 3),
                                  textcoords="offset points")
            pred = [(x, r["predicted_tok_per_s"]) for r, x in zip(pts, xs, strict=True) if r.get("predicted_tok_per_s")]
            if pred:  # the predictor's figure for the same rows (tern.measure.peers: tern rows with a profile)
                ax_t.plot(*zip(*pred, strict=True), ls="none", marker=style["marker"], mfc="none", ms=9,
                          color=style["color"], label=f"{engine} predicted, {t} thread{'s' if t > 1 else ''}")
    if host is not None and host.thread_counts():
        ws = sorted({r["working_set_bytes"] for r in rows})
        for i, t in enumerate(threads):
            ax_g.plot([w / 1e6 for w in ws], [bandwidth_gbps(host, w, t) for w in ws], color="grey",
                      ls=THREAD_LINES[i % len(THREAD_LINES)], lw=1, label=f"probe read, {t} thread(s)")
    ax_t.set(xscale="log", yscale="log", xlabel="model size (working set, MB)", ylabel="tok/s (median)",
             title="decode speed")
    ax_g.set(xscale="log", yscale="log", xlabel="model size (working set, MB)",
             ylabel="GB/s end to end (bytes/token x tok/s)", title="effective bandwidth")
    for ax in (ax_t, ax_g):
        ax.grid(True, which="both", alpha=0.3)
    ax_g.legend(fontsize=7)
    if any("predicted" in h.get_label() for h in ax_t.get_lines()):
        ax_t.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _series(row: dict[str, Any]) -> tuple[str, int]:
    """(benchmark, threads) of a decode row: peers rows by engine, sweep rows by family and
    budget, others by benchmark / kind."""
    if row.get("kind") == "peers":
        name = f"peers {row['engine']}"
    elif "family" in row:
        name = f"sweep {row['family']} {row.get('budget', '')}".rstrip()
    else:
        name = row.get("benchmark") or row.get("kind") or "decode"
    return name, int(row.get("threads") or 1)


def plot_utilisation(rows: list[dict[str, Any]], host: HostProfile) -> Figure:
    """Fraction of the probe's read bandwidth each decode row attains (bytes per token x
    tok/s / read GB/s at its working set; tern.measure.utilisation.row_utilisation) against
    the working set (MB, log), for rows of any decode benchmark (peers, sweep, dram_model):
    one colour per benchmark / engine, one line style per thread count. Rows that timed the
    read kernel beside their run (``bandwidth_fraction_same_run``) add that fraction as
    crosses on a dotted line ("read timed beside the run"): on a host whose memory speed
    drifts, the one to read."""
    from tern.measure.utilisation import row_utilisation

    pts: dict[tuple[str, int, bool], list[tuple[float, float]]] = {}
    for r in rows:
        u = row_utilisation(r, host)
        ws = r.get("working_set_bytes", r.get("total_bytes"))
        if u["bandwidth_fraction"] is not None:
            pts.setdefault((*_series(r), False), []).append((ws / 1e6, u["bandwidth_fraction"]))
        if r.get("bandwidth_fraction_same_run") is not None:
            pts.setdefault((*_series(r), True), []).append((ws / 1e6, r["bandwidth_fraction_same_run"]))
    if not pts:
        raise ValueError("no decode rows with a bandwidth fraction to plot (needs a host profile "
                         "with a read-bandwidth curve)")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    names = sorted({n for n, _, _ in pts})
    threads = sorted({t for _, t, _ in pts})
    for (name, t, now), xy in sorted(pts.items()):
        xy.sort()
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker="x" if now else "o",
                color=f"C{names.index(name) % 10}", lw=0.8 if now else 1.5,
                ls=":" if now else THREAD_LINES[threads.index(t) % len(THREAD_LINES)],
                label=f"{name}, {t} thread(s)" + (", read timed beside the run" if now else ""))
    ax.axhline(1.0, color="grey", lw=1)
    ax.axhline(0.8, color="grey", lw=1, ls="--")
    ax.text(ax.get_xlim()[0], 0.8, " 80 %", va="bottom", fontsize=7, color="grey")
    ax.set(xscale="log", xlabel="working set (MB)", ylabel="fraction of the read bandwidth",
           title="bandwidth utilisation, end to end")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
