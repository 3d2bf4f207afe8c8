"""The roofline figures' polish (integer thread ticks) and the explorer redrawing its one
figure in place on a slider change."""

import pytest

from tern.core.host_caches import MIB
from tern.predict.hosts import load_reference_profile
from tern.predict.plots import plot_feasibility
from tern.predict.roofline import synthetic_profile


def test_feasibility_map_ticks_whole_thread_counts():
    fig = plot_feasibility({"ref": load_reference_profile()}, actives=[1e8, 1e9, 3e9], threads=[1, 2, 6])
    ax = fig.axes[0]
    assert list(ax.get_yticks()) == [1, 2, 6]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2", "6"]
    many = plot_feasibility({"ref": load_reference_profile()}, actives=[1e8, 1e9], threads=list(range(1, 17)))
    ticks = many.axes[0].get_yticks()
    assert len(ticks) <= 12 and all(float(t).is_integer() for t in ticks)


def _png(explorer):
    (out,) = explorer.output.outputs
    assert out["output_type"] == "display_data"
    return out["data"]["image/png"]


def test_explorer_redraws_its_figure_in_place_on_a_slider_change():
    from tern.predict.widgets import explorer

    ex = explorer(synthetic_profile(32 * MIB, 100.0, 20.0))
    first = _png(ex)
    assert first.startswith("iVBORw0KGgo")  # base64 of a PNG
    ex.sliders["bits_per_weight"].value = 4.0  # what a drag of the slider sets
    second = _png(ex)
    assert second != first  # one new image, in place of the old one
    ex.sliders["bits_per_weight"].value = 2.0
    assert _png(ex) == first  # the same setting draws the same figure
    ex.sliders["n_experts"].value = 1  # top-k 2 > 1 expert: impossible
    (msg,) = ex.output.outputs
    assert msg["output_type"] == "stream" and msg["text"].startswith("not a valid setting")
    assert len(repr(ex)) <= 110  # ipywidgets cuts a widget's text fallback at 110 characters


def test_explorer_sliders_drive_explore():
    from tern.predict.widgets import explorer

    ex = explorer(synthetic_profile(32 * MIB, 100.0, 20.0))
    assert set(ex.setting()) == {"bandwidth_gbps", "bits_per_weight", "total_params", "active_params",
                                 "n_experts", "top_k", "threads"}
    assert ex.children[-1] is ex.output and list(ex.children[:-1]) == list(ex.sliders.values())
    assert ex.sliders["bandwidth_gbps"].value == pytest.approx(20.0)  # the host's DRAM figure
