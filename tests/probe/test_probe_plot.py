"""The probe figure's layout: the y label inside the figure, the cache sizes labelled above
the plot (not over the curves or the legend), plateau labels clear of each other even
where two thread counts share a plateau's figure."""

from itertools import combinations

from tern.core.host_caches import KIB, MIB
from tern.core.host_profile import BandwidthPoint, CacheLevel, HostProfile
from tern.probe.bandwidth import working_set_sizes
from tern.probe.plots import plot_bandwidth


def _profile() -> HostProfile:
    """Two cores, L1 48K / L2 2M per core, one 32M L3; DRAM reads 30 GB/s at 1 and 2 threads
    (so both DRAM plateau labels want the same place)."""
    caches = (CacheLevel(1, "Data", 48 * KIB, 2, 1), CacheLevel(2, "Unified", 2 * MIB, 2, 1),
              CacheLevel(3, "Unified", 32 * MIB, 1, 2))
    levels = ((48 * KIB, 200.0), (2 * MIB, 100.0), (32 * MIB, 60.0))
    pts = []
    for t in (1, 2):
        for ws in working_set_sizes(4 * KIB, 512 * MIB, 2):
            gbps = next((g * t for cap, g in levels if ws <= cap // 2), 30.0)
            pts.append(BandwidthPoint("read", t, ws, gbps * 1.05, gbps, 3))
    return HostProfile("two-core", False, {"cpu_model": "test CPU"}, caches, "/sys", tuple(pts))


def test_probe_figure_layout():
    fig = plot_bandwidth(_profile())
    fig.canvas.draw()
    ax = fig.axes[0]
    page = fig.bbox
    ylab = ax.yaxis.label.get_window_extent()
    assert ylab.x0 >= page.x0 and ylab.y0 >= page.y0 and ylab.y1 <= page.y1, "y label clipped"
    (cache_axis,) = ax.child_axes  # the secondary x axis carrying the cache labels
    names = [t.get_text() for t in cache_axis.get_xticklabels()]
    assert names == ["L1 48 KiB", "L1 total 96 KiB", "L2 2 MiB", "L2 total 4 MiB", "L3 32 MiB"]
    assert all(t.get_window_extent().y0 >= ax.bbox.y1 for t in cache_axis.get_xticklabels())  # above the plot
    assert all(t.get_window_extent().y1 <= page.y1 for t in cache_axis.get_xticklabels())  # on the page
    labels = [t for t in ax.texts if t.get_text().split()[0] in ("L1", "L2", "L3", "DRAM")]
    assert sorted(t.get_text() for t in labels if t.get_text().startswith("DRAM")) == ["DRAM 30", "DRAM 30"]
    boxes = [t.get_window_extent() for t in labels]
    clashes = [(a.get_text(), b.get_text()) for (a, ba), (b, bb) in combinations(zip(labels, boxes, strict=True), 2)
               if ba.overlaps(bb)]
    assert clashes == []
    legend = ax.get_legend().get_window_extent()
    assert not any(legend.overlaps(b) for b in boxes)
    assert "GB/s" in ax.get_ylabel() and "median" in ax.get_legend().get_title().get_text()
