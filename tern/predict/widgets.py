"""ipywidgets explorer of the two-pool roofline.

:func:`explore` draws one figure for one setting and needs no widget front end;
:func:`explorer` wraps it in sliders (DRAM bandwidth, bits per weight, total and active
params, experts, top-k, threads) that redraw it in place in Jupyter.

The explored model is the abstract two-pool model of :func:`tern.predict.pools.two_pool_from_params`
(every weight at the chosen bits per weight; all experts X and resident core R solve
R + X = total, R + X * top_k / experts = active). The host keeps the base profile's
last-level cache size and cache bandwidth at the chosen thread count; the bandwidth
slider sets its DRAM read bandwidth (:func:`tern.predict.roofline.synthetic_profile`).

The explorer's figure lives in an ``ipywidgets.Output`` whose ``outputs`` the kernel sets
to one PNG per redraw: no matplotlib backend is involved, so it redraws the same in
JupyterLab, in the classic notebook, under nbclient (headless) and in plain Python.
"""

from __future__ import annotations

import base64
from typing import Any

import ipywidgets as w
import matplotlib.ticker
import numpy as np

from tern.core.figure import figure_png, subplots
from tern.core.host_profile import HostProfile
from tern.core.host_queries import bandwidth_gbps, effective_tiers, llc_capacity_bytes
from tern.predict.hosts import load_reference_profile
from tern.predict.pools import two_pool_from_params
from tern.predict.roofline import predict_pools, sweep_total, synthetic_profile


def explore_host(host: HostProfile, threads: int = 1, dram_gbps: float | None = None) -> HostProfile:
    """A two-plateau host with the last cache tier of ``host``'s measured read curve at
    ``threads`` (size and GB/s: tern.core.host_queries.effective_tiers; /sys sizes only when
    the curve shows no cliff) and the given DRAM bandwidth (default: the curve's DRAM tier)."""
    tiers = effective_tiers(host, threads) if host.measured else []  # measured tiers, not /sys sizes
    caches = [t for t in tiers if t.size_bytes > 0]
    llc = caches[-1].size_bytes if caches else (llc_capacity_bytes(host, threads) or 32 << 20)
    cache_gbps = caches[-1].gbps if caches else bandwidth_gbps(host, llc / 2, threads)
    dram = (tiers[-1].gbps if caches else bandwidth_gbps(host, 64 * llc, threads)) if dram_gbps is None \
        else float(dram_gbps)
    return synthetic_profile(llc, cache_gbps, dram, threads,
                             label=f"{host.label} at {threads} thread(s), DRAM set to {dram:.3g} GB/s")


def explore(bandwidth_gbps: float | None = None, bits_per_weight: float = 2.0, total_params: float = 206e6,
            active_params: float = 15e6, n_experts: int = 80, top_k: int = 2, threads: int = 1,
            host: HostProfile | None = None):
    """Figure for one setting: left, predicted tok/s against total params at these
    active params and resident core (the knee, current setting marked); right, bytes of
    each pool against the usable LLC. ``bandwidth_gbps``: DRAM read bandwidth (None:
    the host's). Raises ValueError for an impossible setting."""
    base = host or load_reference_profile()
    h = explore_host(base, threads, bandwidth_gbps)
    pools = two_pool_from_params(total_params, active_params, bits_per_weight, n_experts, top_k)
    p = predict_pools(pools, h, threads)
    resident_params = pools.resident_bytes / (bits_per_weight / 8)
    fig, (ax, bx) = subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    totals = [float(t) for t in np.geomspace(active_params, max(total_params, active_params) * 100, 60)]
    curve = sweep_total(h, active_params, totals, bits_per_weight, resident_params / active_params, threads)
    ax.plot([q.total_params for q in curve], [q.tok_per_s for q in curve], color="C0")
    ax.plot([total_params], [p.tok_per_s], "o", color="C3", label=f"{p.tok_per_s:,.0f} tok/s")
    llc = p.llc_bytes
    ax.axvline(llc / (bits_per_weight / 8), color="gray", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"total params (at {bits_per_weight:g} bits/weight)")
    ax.set_ylabel("predicted decode speed (tok/s)")
    ax.set_title(f"{active_params / 1e6:.3g}M active, {n_experts} experts top-{top_k}, {threads} thr", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    names = ["resident / token", "streamed / token", "all experts", "usable LLC"]
    vals = [p.resident.bytes_per_token, p.streamed.bytes_per_token, pools.expert_bytes_total, llc]
    bx.barh(names, [v / 1e6 for v in vals], color=["C0", "C1", "C2", "gray"])
    bx.set_xscale("log")
    bx.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    bx.set_xlabel("MB (1e6 bytes)")
    bx.set_title(f"resident: {p.resident.bound}, streamed: {p.streamed.bound}", fontsize=9)
    fig.suptitle(h.label, fontsize=9)
    fig.tight_layout()
    return fig


def png_output(fig) -> dict[str, Any]:
    """``fig`` as one Jupyter ``display_data`` output (PNG, base64), the form an
    ``ipywidgets.Output`` keeps in its ``outputs``."""
    return {"output_type": "display_data", "metadata": {},
            "data": {"image/png": base64.b64encode(figure_png(fig)).decode("ascii"), "text/plain": repr(fig)}}


class Explorer(w.VBox):
    """The slider box: seven sliders (``sliders``, by :func:`explore` argument name) over
    an ``ipywidgets.Output`` (``output``) that holds the figure of the current setting.
    Every slider change calls :meth:`redraw`, which replaces the output's one PNG (or one
    line saying why the setting is impossible)."""

    def __init__(self, host: HostProfile | None = None):
        base = host or load_reference_profile()
        tmax = max(base.thread_counts() or [1])
        style = {"description_width": "150px"}
        layout = w.Layout(width="520px")
        self.host = base
        self.sliders = {
            "bandwidth_gbps": w.FloatLogSlider(value=bandwidth_gbps(explore_host(base), 1 << 40), base=10, min=0,
                                               max=2.5, description="DRAM GB/s"),
            "bits_per_weight": w.FloatSlider(value=2.0, min=1.0, max=32.0, step=0.1, description="bits/weight"),
            "total_params": w.FloatLogSlider(value=206e6, base=10, min=6, max=11, description="total params"),
            "active_params": w.FloatLogSlider(value=15e6, base=10, min=5, max=10, description="active params"),
            "n_experts": w.IntSlider(value=80, min=1, max=1024, description="experts"),
            "top_k": w.IntSlider(value=2, min=1, max=64, description="top-k"),
            "threads": w.IntSlider(value=1, min=1, max=tmax, description="threads"),
        }
        for v in self.sliders.values():
            v.style, v.layout, v.continuous_update = style, layout, False
        self.output = w.Output()
        super().__init__([*self.sliders.values(), self.output])
        for v in self.sliders.values():
            v.observe(self.redraw, names="value")
        self.redraw()

    def setting(self) -> dict[str, Any]:
        """The sliders' values, as :func:`explore` keyword arguments."""
        return {k: v.value for k, v in self.sliders.items()}

    def redraw(self, _change: Any = None) -> None:
        """Draw the current setting and put it in ``output`` in place of the last figure."""
        try:
            fig = explore(host=self.host, **self.setting())
        except ValueError as e:
            self.output.outputs = ({"output_type": "stream", "name": "stdout",
                                    "text": f"not a valid setting: {e}\n"},)
            return
        self.output.outputs = (png_output(fig),)

    def __repr__(self) -> str:  # the text a static page shows in place of the live widget
        return "roofline explorer: sliders over the figure, live in a Jupyter kernel (static: the figure above)"


def explorer(host: HostProfile | None = None) -> Explorer:
    """The slider box (an ``ipywidgets.VBox``) redrawing :func:`explore` in place on every
    change."""
    return Explorer(host)
