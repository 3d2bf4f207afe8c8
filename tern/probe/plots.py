"""Figures of the host probe: bandwidth against working-set size; the row passes' DRAM stall
against row length.

Drawn from a HostProfile only (the curve points and the plateaus of
:func:`tern.probe.detect_plateaus`), so it can be regenerated from a saved
host_profile.json. Uses matplotlib's object API (no pyplot state, no backend chosen:
:mod:`tern.core.figure`): works headless and shows inline in Jupyter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullFormatter

from tern.core.figure import TernFigure
from tern.core.host_profile import BandwidthPoint, HostProfile
from tern.probe.bandwidth import format_bytes
from tern.probe.plateaus import detect_plateaus

_STYLES = {"read": "-", "copy": "--", "triad": ":"}


def plot_bandwidth(profile: HostProfile, kernels: Sequence[str] | None = ("read",),
                   threads: Sequence[int] | None = None, stat: str = "median",
                   label_plateaus: bool = True, show_spread: bool = True,
                   figsize: tuple[float, float] = (9.0, 5.0)) -> Figure:
    """GB/s against working set (log2 x axis), one curve per (kernel, thread count),
    cache sizes as vertical lines, plateaus as labelled horizontal segments.
    ``show_spread``: a shaded band per curve from the slowest to the fastest timed run of
    each point (points without recorded runs, e.g. a reference curve, get none).
    ``kernels=None``: every kernel the profile measured."""
    if stat not in ("median", "best"):
        raise ValueError(f"stat must be 'median' or 'best', got {stat!r}")
    fig = TernFigure(figsize=figsize)
    ax = fig.add_subplot(1, 1, 1)
    all_threads = sorted({p.threads for p in profile.bandwidth})
    if kernels is None:
        kernels = sorted({p.kernel for p in profile.bandwidth}, key=lambda k: (k != "read", k))
    threads = list(threads) if threads is not None else all_threads
    xs_all: list[int] = []
    ys_max = 0.0
    drawn = 0
    plateaus: list[tuple[int, str, str, list[tuple[int, float]]]] = []  # labelled once the axes are set
    for kernel in kernels:
        avail = profile.thread_counts(kernel)
        for t in threads:
            if t not in avail:
                continue
            curve = profile.curve(t, kernel)
            xs = [p.working_set_bytes for p in curve]
            ys = [p.gbps_median if stat == "median" else p.gbps_best for p in curve]
            color = f"C{all_threads.index(t) % 10}"
            ax.plot(xs, ys, _STYLES.get(kernel, "-."), marker="o", ms=3, color=color,
                    label=f"{kernel}, {t} thread{'s' if t > 1 else ''}")
            if show_spread:
                _draw_spread(ax, curve, color)
            xs_all += xs
            ys_max = max([ys_max, *ys])
            drawn += 1
            if label_plateaus:
                tops = [max(y, p.gbps_best) if show_spread and p.gbps_min is not None else y  # band drawn
                        for p, y in zip(curve, ys, strict=True)]
                plateaus.append((t, kernel, color, list(zip(xs, tops, strict=True))))
    if not drawn:
        raise ValueError(f"profile {profile.label!r} has no curve for kernels {list(kernels)} "
                         f"and threads {threads}")
    _log2_bytes_axis(ax, min(xs_all), max(xs_all))
    ax.set_ylim(0, ys_max * 1.12)  # headroom for the plateau labels above the top curve
    placed: list[tuple[float, float, float]] = []  # the plateau labels drawn so far
    for t, kernel, color, tops in plateaus:
        _draw_plateaus(ax, profile, t, kernel, color, tops, placed)
    _mark_caches(ax, profile, min(xs_all), max(xs_all))
    ax.set_xlabel("working set (bytes, log2 scale)")
    ax.set_ylabel("bandwidth (GB/s = 1e9 bytes/s)")
    cpu = profile.host.get("cpu_model") or profile.host.get("cpu") or ""
    ax.set_title(f"Bandwidth against working set: {cpu} ({profile.label})", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right", title_fontsize=7,
              title=f"{stat} of repeats{'; band: slowest to fastest run' if show_spread else ''}")
    fig.tight_layout()
    return fig


def _draw_spread(ax, curve: Sequence[BandwidthPoint], color: str) -> None:
    """Band from each point's slowest (gbps_min) to fastest (gbps_best) run; gaps where a
    point has no gbps_min."""
    pts = [p for p in curve if p.gbps_min is not None]
    if not pts:
        return
    known = {p.working_set_bytes for p in pts}
    xs = [p.working_set_bytes for p in curve]
    ax.fill_between(xs, [p.gbps_min if p.gbps_min is not None else p.gbps_median for p in curve],
                    [p.gbps_best for p in curve], where=[x in known for x in xs],
                    color=color, alpha=0.18, lw=0)


def _draw_plateaus(ax, profile: HostProfile, threads: int, kernel: str, color: str,
                   tops: list[tuple[int, float]], placed: list[tuple[float, float, float]]) -> None:
    """Each plateau as a pale segment, labelled just above the highest point the curve
    draws over it (``tops``: working set, GB/s of the line or the top of its band); a label
    that would overlap one already drawn (``placed``: its left and right end in octaves, its
    height in axes fractions) moves up one line until it is clear."""
    x_lo, x_hi = tops[0][0], tops[-1][0]
    x0, x1 = (math.log2(v) for v in ax.get_xlim())
    y_top = ax.get_ylim()[1]
    width_in = ax.get_position().width * ax.figure.get_figwidth()
    octave_per_char = 0.058 * (x1 - x0) / width_in  # 7 pt text: about 0.058 inch a character
    line = 0.045  # one label line, in axes fractions
    for p in detect_plateaus(profile, threads, kernel):
        if p.gbps is None:
            continue
        lo = max(p.lo_bytes, x_lo)
        hi = min(p.hi_bytes, x_hi) if p.hi_bytes is not None else x_hi
        if hi <= lo:
            lo = hi = min(max(lo, x_lo), x_hi)
        ax.plot([lo, hi], [p.gbps, p.gbps], color=color, lw=3, alpha=0.35, solid_capstyle="butt")
        text = f"{p.name} {p.gbps:.0f}"
        if p.runs and p.gbps_min is not None and p.gbps_max is not None:
            text += f" ({p.gbps_min:.0f}\u2013{p.gbps_max:.0f})"  # slowest to fastest run
        mid = (math.log2(lo) + math.log2(hi)) / 2
        left, right = mid - len(text) * octave_per_char / 2, mid + len(text) * octave_per_char / 2
        y = max([p.gbps, *(g for x, g in tops if lo <= x <= hi)]) / y_top + 0.015
        while any(left < r and l < right and abs(y - yy) < line for l, r, yy in placed):
            y += line
        placed.append((left, right, y))
        ax.text(2.0 ** mid, y, text, ha="center", va="bottom", fontsize=7, color=color,
                transform=ax.get_xaxis_transform())


def _mark_caches(ax, profile: HostProfile, x_lo: float, x_hi: float) -> None:
    """Dotted verticals at the cache sizes, labelled on a second x axis above the plot (clear
    of the curves, the plateau labels and the legend)."""
    marks: dict[int, str] = {}
    for c in profile.caches:
        if c.type not in ("Data", "Unified"):
            continue
        marks.setdefault(c.size_bytes, f"L{c.level} {format_bytes(c.size_bytes)}")
        if c.instances > 1:
            marks.setdefault(c.total_bytes, f"L{c.level} total {format_bytes(c.total_bytes)}")
    shown = {x: text for x, text in sorted(marks.items()) if x_lo <= x <= x_hi}
    for x in shown:
        ax.axvline(x, color="0.4", ls=":", lw=1)
    top = ax.secondary_xaxis("top")
    top.xaxis.set_major_locator(FixedLocator(list(shown)))
    top.xaxis.set_minor_locator(FixedLocator([]))
    top.set_xticklabels(list(shown.values()), rotation=35, ha="left", rotation_mode="anchor",
                        fontsize=7, color="0.3")
    top.tick_params(axis="x", length=3, color="0.4")


def _log2_bytes_axis(ax, x_lo: float, x_hi: float) -> None:
    ax.set_xscale("log", base=2)
    lo, hi = math.floor(math.log2(x_lo)), math.ceil(math.log2(x_hi))
    step = 2 if hi - lo <= 24 else 4
    ticks = [2.0 ** k for k in range(lo - lo % 2, hi + 1, step)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.set_xticklabels([format_bytes(t) for t in ticks], fontsize=8)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(x_lo / 1.15, x_hi * 1.15)


_PASS_NAMES = {"ternary_matvec": "4-row pass", "ternary_stream": "streaming pass"}


def plot_row_stall(profile: HostProfile, figsize: tuple[float, float] = (8.0, 4.5)) -> Figure:
    """The row passes' DRAM stall per weight byte against row length (packed bytes, log2 axis),
    over the stall at the row length of each pass's kernel curve (the predictor's factor,
    tern.core.host_queries.row_stall_factor), one line per pass, thread count and way of running
    it over the threads. ValueError
    when the profile has no row curves (probed before profile version 5)."""
    from tern.probe.row_curves import reference_row_bytes, row_stall_points

    pts = row_stall_points(list(profile.row_curves))
    if not pts:
        raise ValueError(f"host profile {profile.label!r} has no row-length curves: run `tern probe` "
                         "(profile version 5) to measure them")
    fig = TernFigure(figsize=figsize)
    ax = fig.add_subplot(1, 1, 1)
    xs = [rb for p in pts.values() for rb, _ in p]
    for (op, split, t), p in pts.items():
        how = "" if t == 1 else (", one matrix split" if split == "rows" else ", different matrices")
        ax.plot([rb for rb, _ in p], [f for _, f in p], marker="o", linestyle="-" if op == "ternary_matvec" else "--",
                label=f"{_PASS_NAMES.get(op, op)}, {t} thread{'s' if t > 1 else ''}{how} "
                      f"(x its {format_bytes(reference_row_bytes(op))} rows)")
    ax.axhline(1.0, color="0.5", linewidth=0.8)
    _log2_bytes_axis(ax, min(xs), max(xs))
    ax.set_xlabel("packed row length (bytes; ternary2: 4 weights a byte)")
    ax.set_ylabel("DRAM stall per byte (x the curve row length's)")
    ax.set_title(f"The row passes' DRAM stall against row length — {profile.label}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return fig
