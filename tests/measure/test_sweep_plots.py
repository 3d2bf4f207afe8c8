"""Sweep figures' polish: the byte axis of the ratio plot labels a few ticks that do not
overlap; notebook 08's figure of measured / predicted / target tok/s per thread count."""

import pytest
from matplotlib.ticker import NullFormatter

from tern.measure.plots import plot_against_target, plot_ratios


def _ratio_rows(total_bytes):
    return [{"family": "fixed_active", "budget": "4m", "threads": 1, "total_bytes": b, "ratio": 0.9 + 0.01 * i}
            for i, b in enumerate(total_bytes)]


def _visible_labels(fig):
    fig.canvas.draw()  # lays the tick labels out
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    return [t for t in ax.get_xticklabels() if t.get_text() and lo <= t.get_position()[0] <= hi]


@pytest.mark.parametrize("total_bytes", [
    [1.7e6, 5.8e6, 3.0e7, 5.7e7],  # a smoke sweep: 1.5 decades, where every minor tick got a label
    [1.7e6, 2.2e9],  # a full sweep: 3 decades
])
def test_ratio_plot_byte_ticks_do_not_overlap(total_bytes):
    fig = plot_ratios(_ratio_rows(total_bytes))
    ax = fig.axes[0]
    assert isinstance(ax.xaxis.get_minor_formatter(), NullFormatter)
    labels = _visible_labels(fig)
    assert 2 <= len(labels) <= 8
    assert all(t.get_text().endswith(("kB", "MB", "GB")) for t in labels), [t.get_text() for t in labels]
    boxes = sorted((t.get_window_extent() for t in labels), key=lambda b: b.x0)
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:], strict=False))  # left to right, apart


def _rows_10b():
    return [{"name": "pick", "threads": 2, "tok_per_s": 127.0, "tok_per_s_min": 125.0, "tok_per_s_max": 128.0,
             "predicted_tok_per_s": 184.0},
            {"name": "pick", "threads": 1, "tok_per_s": 92.0, "tok_per_s_min": 91.0, "tok_per_s_max": 93.0,
             "predicted_tok_per_s": 122.0}]


def test_plot_against_target():
    fig = plot_against_target(_rows_10b(), 100.0)
    ax = fig.axes[0]
    measured, predicted = ax.containers[1], ax.containers[2]  # containers[0]: the error bars
    assert [b.get_height() for b in measured] == [92.0, 127.0]  # in thread order
    assert [b.get_height() for b in predicted] == [122.0, 184.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1 thread", "2 threads"]
    (target,) = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert list(target.get_ydata()) == [100.0, 100.0]
    texts = [t.get_text() for t in ax.texts]
    assert "92 tok/s\n0.92x target" in texts and "184 tok/s" in texts
    assert "tok/s" in ax.get_ylabel()
    with pytest.raises(ValueError, match="no sweep rows"):
        plot_against_target([], 100.0)
