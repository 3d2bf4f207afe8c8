"""Executed notebooks made static for the report: \\r-rewritten progress lines collapse to
what stayed on screen, a tqdm widget becomes one text line of its final state, an Output
widget its outputs, any other widget its text fallback; no widget metadata remains."""

import nbformat
import pytest

from tern.report.static_outputs import (
    WIDGET_STATE,
    WIDGET_VIEW,
    collapse_cr,
    make_static,
    make_static_file,
    merge_streams,
)


def _stream(text, name="stderr"):
    return {"output_type": "stream", "name": name, "text": text}


@pytest.mark.parametrize(("text", "shown"), [
    ("no carriage return\n", "no carriage return\n"),
    ("\rbar 0%\rbar 50%\rbar 100%\n", "bar 100%\n"),
    ("abc\rX", "Xbc"),  # a shorter rewrite leaves the tail of the line
    ("before\n\rk 0%\rk 100%\r        \rafter\n", "before\nafter\n"),  # a cleared (leave=False) bar
    # a nested bar (tqdm position 1) under an outer one: down a line, redraw, back up
    ("\rsweep 0%\n\rmodel 0%\x1b[A\n\rmodel 50%\x1b[A\n\rmodel 100%\x1b[A\rsweep 100%\n",
     "sweep 100%\nmodel 100%\n"),
])
def test_collapse_cr(text, shown):
    assert collapse_cr(text) == shown


def test_merge_streams_keeps_order_and_drops_blank():
    outs = [_stream("\rtrain 0%"), _stream("\rtrain 100%"), _stream("x\n", "stdout"),
            {"output_type": "display_data", "data": {"text/plain": "fig"}, "metadata": {}},
            _stream("\r   \r"), _stream("done\n", "stdout")]
    got = merge_streams(outs)
    assert [(o["output_type"], o.get("text")) for o in got] == [
        ("stream", "train 100%"), ("stream", "x\n"), ("display_data", None), ("stream", "done\n")]


def _widget_nb():
    def model(name, **state):
        return {"model_name": name, "model_module": "@jupyter-widgets/controls", "model_module_version": "2.0.0",
                "state": state}

    state = {
        "desc": model("HTMLModel", value="train:\u2007100%"),
        "bar": model("FloatProgressModel", value=40.0, max=40.0, bar_style="success"),
        "post": model("HTMLModel", value="\u200740/40\u2007[00:02&lt;00:00,\u200718.1step/s]"),
        "box": model("HBoxModel", children=["IPY_MODEL_desc", "IPY_MODEL_bar", "IPY_MODEL_post"]),
        "out": {"model_name": "OutputModel", "model_module": "@jupyter-widgets/output",
                "state": {"outputs": [_stream("inside\n", "stdout")]}},
        "vbox": model("VBoxModel", children=["IPY_MODEL_out"]),
    }

    def view(mid, text):
        return nbformat.from_dict({"output_type": "display_data", "metadata": {},
                                   "data": {"text/plain": text, WIDGET_VIEW: {"model_id": mid, "version_major": 2,
                                                                              "version_minor": 0}}})

    cell = nbformat.v4.new_code_cell("run()")
    cell.outputs = [view("box", "train:   0%|  | 0/40"), view("out", "Output()"), view("vbox", "explorer"),
                    view("gone", "a widget without state")]
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["widgets"] = {WIDGET_STATE: {"state": state, "version_major": 2, "version_minor": 0}}
    return nb


def test_make_static_widgets(tmp_path):
    nb = make_static(_widget_nb())
    assert "widgets" not in nb.metadata
    outs = nb.cells[0].outputs
    assert outs[0] == {"output_type": "stream", "name": "stderr",
                       "text": "train: 100%|\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588| "
                               "40/40 [00:02<00:00, 18.1step/s]\n"}
    assert outs[1] == {"output_type": "stream", "name": "stdout", "text": "inside\n"}
    assert [o["data"] for o in outs[2:]] == [{"text/plain": "explorer"}, {"text/plain": "a widget without state"}]
    nbformat.validate(nb)
    path = tmp_path / "nb.ipynb"
    nbformat.write(_widget_nb(), str(path))
    make_static_file(path)
    again = nbformat.read(str(path), as_version=4)
    assert "widgets" not in again.metadata and again.cells[0].outputs == outs
