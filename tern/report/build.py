"""`tern report`: run the numbered notebooks in order into one self-contained folder.

    <out>/index.html            headline figures, per-notebook status and wall time, gallery
    <out>/notebooks/NN_*.html   each executed notebook (images embedded)
    <out>/notebooks/NN_*.ipynb  each executed notebook
    <out>/results/              everything the notebooks wrote: host profile, JSONL records,
                                figures (PNG), headlines/*.json

All notebooks share ``<out>/results`` as their RESULTS folder, so later notebooks read what
earlier ones measured. A failing notebook is recorded with its error and the rest still run.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tern.core.paths import shipped_dir
from tern.core.records import atomic_write_json, atomic_write_text, run_metadata
from tern.report.index import render_index
from tern.report.notebook import load_headlines
from tern.report.static_outputs import make_static_file


@dataclass(frozen=True)
class NotebookRun:
    name: str
    status: str  # "ok", "failed", "skipped"
    wall_s: float
    html: str | None  # path relative to the report folder
    error: str | None


def notebooks_dir() -> Path:
    """The shipped notebooks: the checkout's ``notebooks/``, else the installed copy."""
    try:
        return shipped_dir("notebooks")
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None


def list_notebooks(only: list[str] | None = None, nb_dir: Path | None = None) -> list[Path]:
    nbs = sorted((nb_dir or notebooks_dir()).glob("[0-9][0-9]_*.ipynb"))
    if only:
        wanted = {o.strip() for o in only}
        nbs = [p for p in nbs if p.stem[:2] in wanted or p.stem in wanted]
        if not nbs:
            raise ValueError(f"--only {sorted(wanted)} matches no notebook")
    return nbs


# nbconvert's lab template without the scripts it fetches from a CDN (require.js, MathJax,
# mermaid, the widget manager): a report page must open offline. The notebooks use no
# LaTeX, mermaid or live widgets (static_outputs makes widgets plain outputs first).
OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""
REMOTE_SCRIPT = re.compile(r"<script\b[^>]*\bsrc=[\"']?(?:https?:)?//[^>]*>\s*</script>", re.I)


def notebook_html(nb) -> str:
    """An executed notebook (nbformat node) as one self-contained HTML page: styles inline,
    images embedded, no script loaded from the network."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", template_file="tern_offline.html.j2",
                            extra_loaders=[DictLoader({"tern_offline.html.j2": OFFLINE_TEMPLATE})])
    body, _ = exporter.from_notebook_node(nb)
    return REMOTE_SCRIPT.sub("", body)  # belt and braces: whatever a newer template adds


def _to_html(ipynb: Path, html_path: Path) -> None:
    import nbformat

    atomic_write_text(html_path, notebook_html(nbformat.read(str(ipynb), as_version=4)))


def local_socket_kernels(folder: str | os.PathLike) -> type | None:
    """A jupyter_client KernelManager class whose kernels talk over Unix sockets in ``folder``
    (which only this user can open) instead of TCP on localhost, where the platform has them
    (None elsewhere: the default manager). ipykernel 7 warns on every kernel started over
    unencrypted TCP, eight times in a report. None too where the socket paths would pass the
    ~100 bytes a Unix socket path may hold (a long TMPDIR)."""
    if sys.platform.startswith("win") or len(os.path.join(os.fspath(folder), "kernel-65535").encode()) > 100:
        return None
    from jupyter_client.manager import KernelManager
    from traitlets import default

    class LocalSocketKernelManager(KernelManager):
        @default("transport")
        def _transport_default(self) -> str:
            return "ipc"

        @default("ip")
        def _ip_default(self) -> str:  # the sockets' path prefix: kernel-<port> in the folder
            return os.path.join(os.fspath(folder), "kernel")

    return LocalSocketKernelManager


def run_notebook(path: Path, out_dir: Path, smoke: bool, timeout_s: int,
                 params: dict[str, Any] | None = None) -> NotebookRun:
    import papermill
    from papermill.exceptions import PapermillExecutionError

    nb_out = out_dir / "notebooks" / path.name
    nb_out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    error = None
    try:
        with tempfile.TemporaryDirectory(prefix="tern-kernel-") as sockets:
            manager = local_socket_kernels(sockets)
            papermill.execute_notebook(
                str(path), str(nb_out), cwd=str(path.parent),
                parameters={**_declared(path, params or {}), "SMOKE": smoke,
                            "RESULTS": str(out_dir / "results")},
                kernel_name="python3", progress_bar=False, execution_timeout=timeout_s,
                **({"kernel_manager_class": manager} if manager else {}),
            )
    except PapermillExecutionError as e:
        error = f"{e.ename}: {e.evalue}"
    except Exception as e:  # kernel died, timeout, bad notebook: report and go on
        error = f"{type(e).__name__}: {e}"
    wall = time.perf_counter() - t0
    html_rel = None
    if nb_out.exists():
        html_rel = f"notebooks/{path.stem}.html"
        try:
            make_static_file(nb_out)  # progress bars and widgets as their final text / outputs
            _to_html(nb_out, out_dir / html_rel)
        except Exception as e:  # pragma: no cover - nbconvert problems are reported
            error = (error + "; " if error else "") + f"HTML export failed: {e}"
            html_rel = None
    return NotebookRun(path.stem, "failed" if error else "ok", wall, html_rel, error)


def _declared(path: Path, params: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``params`` that the notebook's parameters cell declares."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    src = "".join(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    return {k: v for k, v in params.items() if f"{k} =" in src or f"{k}=" in src}


def parse_params(items: list[str] | None) -> dict[str, Any]:
    """``NAME=VALUE`` pairs (VALUE as JSON when it parses, else a string)."""
    out: dict[str, Any] = {}
    for it in items or []:
        name, sep, value = it.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"--param expects NAME=VALUE, got {it!r}")
        try:
            out[name] = json.loads(value)
        except json.JSONDecodeError:
            out[name] = value
    return out


def run_report(out_dir: str | Path = "report", smoke: bool = False, only: list[str] | None = None,
               timeout_s: int = 3600, progress: bool = True,
               nb_dir: str | Path | None = None, params: dict[str, Any] | None = None,
               check_disk: bool = True) -> dict[str, Any]:
    """Run the notebooks in order into ``out_dir`` and write its index.html. ``params``
    (e.g. {"MINUTES": 5}) go to every notebook whose parameters cell declares them.
    ``check_disk``: first plan the random models the measuring notebooks will write and refuse
    (OSError ENOSPC) when the disk cannot hold them (tern.report.disk)."""
    from tqdm.auto import tqdm

    out = Path(out_dir).resolve()
    (out / "results").mkdir(parents=True, exist_ok=True)
    nbs = list_notebooks(only, Path(nb_dir) if nb_dir else None)
    if check_disk:
        from tern.measure.sweep_models import free_bytes
        from tern.packed.writer import size_text
        from tern.report.disk import check_report_disk

        plan = check_report_disk(out / "results", [p.stem for p in nbs], smoke)
        if progress and plan.to_write:
            print(f"report: the notebooks will write {len(plan.to_write)} random models "
                  f"({size_text(plan.total_bytes)}) into {plan.models_dir}; "
                  f"{size_text(free_bytes(plan.models_dir))} free", file=sys.stderr)
    t0 = time.perf_counter()
    runs: list[NotebookRun] = []
    bar = tqdm(nbs, desc="report", unit="notebook", file=sys.stderr, disable=not progress)
    for path in bar:
        bar.set_postfix_str(path.stem)
        runs.append(run_notebook(path, out, smoke, timeout_s, params))
    wall = time.perf_counter() - t0
    headlines = load_headlines(out / "results")
    summary = {
        "out_dir": str(out), "index": str(out / "index.html"), "smoke": smoke, "wall_s": wall,
        "params": params or {}, "notebooks": [asdict(r) for r in runs], "headlines": headlines,
        "meta": run_metadata(),
    }
    atomic_write_json(out / "report.json", summary)
    atomic_write_text(out / "index.html", render_index(summary, out))
    return summary


# ---- CLI ----------------------------------------------------------------------------------


# The main job's shipped defaults: a laptop-sized training budget in minutes (notebook 03's
# sandbox run, notebook 04's CPU run). The notebooks' parameters cells default to the same
# (tests/report/test_report_index.py checks), so a notebook opened by hand runs what the
# report runs; -p MINUTES=20 for the longer sandbox run.
REPORT_DEFAULT_PARAMS = {"MINUTES": 5.0, "CPU_MINUTES": 2.0}


