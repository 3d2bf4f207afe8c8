"""Make an executed notebook's outputs read well without a kernel or a widget front end.

A notebook run by papermill / nbclient stores what a live front end would have redrawn:

* a text progress bar (tqdm on stderr) as hundreds of ``\\r``-separated stream chunks
  (nested bars also move the cursor up), which a static page shows as hundreds of lines;
* a widget progress bar (``tqdm.auto`` in a kernel) as a widget view whose text is its
  state at display time (0 %) and whose final state sits in the notebook's widget
  metadata, which a page renders only with the widget JavaScript from a CDN.

:func:`make_static` rewrites the outputs the way a front end would have left them:
consecutive stream outputs merged and every ``\\r``-overwritten line collapsed to what
remained on screen; a progress-bar widget as one text line of its final state; an
``ipywidgets.Output`` as the outputs it holds; any other widget as its text fallback.
The widget metadata is then dropped, so the page needs no script.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
_PROGRESS_MODELS = ("FloatProgressModel", "IntProgressModel")
_TAG = re.compile(r"<[^>]*>")
_CURSOR_UP = re.compile(r"\x1b\[(\d*)A")
_CONTROLS = re.compile(r"(\r|\n|\x1b\[\d*A)")


def collapse_cr(text: str) -> str:
    """``text`` as a terminal would show it after its rewrites: ``\\r`` returns to the
    first column, ``\\n`` goes down a line, ``ESC[nA`` up n lines (tqdm's nested bars), and
    what is written overwrites what was there. Text without those controls is returned as
    it is; with them, lines left blank (a ``leave=False`` bar clears itself with spaces)
    are dropped."""
    if "\r" not in text and not _CURSOR_UP.search(text):
        return text
    lines, row, col = [""], 0, 0
    for tok in _CONTROLS.split(text):
        if not tok:
            continue
        if tok == "\n":
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        elif tok == "\r":
            col = 0
        elif _CURSOR_UP.fullmatch(tok):
            row = max(0, row - int(tok[2:-1] or 1))
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + tok + line[col + len(tok):]
            col += len(tok)
    kept = [ln.rstrip() for ln in lines if ln.strip()]
    return "\n".join(kept) + ("\n" if kept and text.endswith("\n") else "")


def merge_streams(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive stream outputs of the same stream as one, ``\\r`` rewrites collapsed
    (:func:`collapse_cr`); an output that ends up empty is dropped. Order is kept."""
    merged: list[dict[str, Any]] = []
    for o in outputs:
        if (o.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream"
                and merged[-1].get("name") == o.get("name")):
            merged[-1] = {**merged[-1], "text": merged[-1]["text"] + o["text"]}
        else:
            merged.append(dict(o))
    kept = []
    for o in merged:
        if o.get("output_type") == "stream":
            o["text"] = collapse_cr(o["text"])
            if not o["text"].strip():
                continue
        kept.append(o)
    return kept


def _label(state: dict[str, Any]) -> str:
    text = html.unescape(_TAG.sub("", str(state.get("value") or state.get("description") or "")))
    return text.replace("\u2007", " ").replace("\xa0", " ")


def progress_line(box: dict[str, Any], models: dict[str, dict[str, Any]], width: int = 10) -> str | None:
    """The text of a progress-bar box (an HBox of labels around a Float/IntProgress, as
    tqdm.notebook builds it) in its final state: ``desc: 100%|██████████| 20/20 [...]``;
    None when ``box`` holds no progress bar."""
    parts, found = [], False
    for ref in box.get("state", {}).get("children", []):
        child = models.get(str(ref).removeprefix("IPY_MODEL_"))
        if child is None:
            continue
        st = child.get("state", {})
        if child.get("model_name") in _PROGRESS_MODELS:
            found = True
            hi, v = float(st.get("max") or 0), float(st.get("value") or 0)
            frac = min(max(v / hi, 0.0), 1.0) if hi > 0 else 0.0
            parts.append("|" + "\u2588" * round(frac * width) + " " * (width - round(frac * width)) + "|")
        else:
            parts.append(_label(st))
    return "".join(parts).strip() if found else None


def static_widget(output: dict[str, Any], models: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The outputs that stand in for one widget-view output (see the module docstring)."""
    model = models.get(output.get("data", {}).get(WIDGET_VIEW, {}).get("model_id", ""))
    if model is not None and model.get("model_name") == "OutputModel":
        return merge_streams([dict(o) for o in model.get("state", {}).get("outputs", [])])
    line = progress_line(model, models) if model is not None else None
    if line is not None:
        return [{"output_type": "stream", "name": "stderr", "text": line + "\n"}]
    text = {k: v for k, v in output.get("data", {}).items() if k != WIDGET_VIEW}
    return [{**output, "data": text}] if text else []


def make_static(nb: Any) -> Any:
    """``nb`` (an nbformat notebook, changed in place and returned) with static outputs and
    no widget metadata."""
    widgets = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        if cell.get("cell_type") != "code" or not cell.get("outputs"):
            continue
        outs: list[dict[str, Any]] = []
        for o in cell.outputs:
            if WIDGET_VIEW in o.get("data", {}):
                outs += static_widget(o, widgets)
            else:
                outs.append(o)
        cell.outputs = _nodes(merge_streams(outs))
    nb.metadata.pop("widgets", None)
    return nb


def _nodes(outputs: list[dict[str, Any]]) -> list[Any]:
    from nbformat import from_dict

    return [from_dict(o) for o in outputs]


def make_static_file(path: str | Path) -> Path:
    """Rewrite the executed notebook at ``path`` with :func:`make_static` (atomically)."""
    import nbformat

    from tern.core.records import atomic_write_text

    p = Path(path)
    nb = make_static(nbformat.read(str(p), as_version=4))
    atomic_write_text(p, nbformat.writes(nb))
    return p
