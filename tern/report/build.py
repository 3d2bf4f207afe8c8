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

import html
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tern.core.paths import repo_root
from tern.core.records import atomic_write_json, atomic_write_text, run_metadata
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
    root = repo_root()
    d = root / "notebooks" if root else Path.cwd() / "notebooks"
    if not d.is_dir():
        raise ValueError(f"no notebooks folder at {d}: run `tern report` from a tern checkout")
    return d


def list_notebooks(only: list[str] | None = None, nb_dir: Path | None = None) -> list[Path]:
    nbs = sorted((nb_dir or notebooks_dir()).glob("[0-9][0-9]_*.ipynb"))
    if only:
        wanted = {o.strip() for o in only}
        nbs = [p for p in nbs if p.stem[:2] in wanted or p.stem in wanted]
        if not nbs:
            raise ValueError(f"--only {sorted(wanted)} matches no notebook")
    return nbs


def _to_html(ipynb: Path, html_path: Path) -> None:
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(ipynb), as_version=4)
    body, _ = HTMLExporter(template_name="classic").from_notebook_node(nb)
    atomic_write_text(html_path, body)


def run_notebook(path: Path, out_dir: Path, smoke: bool, timeout_s: int,
                 params: dict[str, Any] | None = None) -> NotebookRun:
    import papermill
    from papermill.exceptions import PapermillExecutionError

    nb_out = out_dir / "notebooks" / path.name
    nb_out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    error = None
    try:
        papermill.execute_notebook(
            str(path), str(nb_out), cwd=str(path.parent),
            parameters={**_declared(path, params or {}), "SMOKE": smoke,
                        "RESULTS": str(out_dir / "results")},
            kernel_name="python3", progress_bar=False, execution_timeout=timeout_s,
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
               nb_dir: str | Path | None = None, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the notebooks in order into ``out_dir`` and write its index.html. ``params``
    (e.g. {"MINUTES": 5}) go to every notebook whose parameters cell declares them."""
    from tqdm.auto import tqdm

    out = Path(out_dir).resolve()
    (out / "results").mkdir(parents=True, exist_ok=True)
    nbs = list_notebooks(only, Path(nb_dir) if nb_dir else None)
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


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, (dict, list)):
        return html.escape(json.dumps(v))
    return html.escape(str(v))


def render_index(summary: dict[str, Any], out: Path) -> str:
    """The report's index page: headline figures, notebook table, figure gallery."""
    esc = html.escape
    meta = summary.get("meta", {})
    rows = []
    for r in summary["notebooks"]:
        link = f'<a href="{esc(r["html"])}">{esc(r["name"])}</a>' if r["html"] else esc(r["name"])
        err = f'<pre class="err">{esc(r["error"])}</pre>' if r["error"] else ""
        rows.append(f'<tr class="{r["status"]}"><td>{link}</td><td>{r["status"]}</td>'
                    f'<td>{r["wall_s"]:.1f}</td><td>{err}</td></tr>')
    heads = []
    for nb, figs in summary["headlines"].items():
        items = "".join(f"<tr><td>{esc(k)}</td><td>{_fmt(v)}</td></tr>" for k, v in figs.items())
        heads.append(f"<h3>{esc(nb)}</h3><table class='kv'>{items}</table>")
    pngs = sorted((out / "results").rglob("*.png"))
    gallery = "".join(
        f'<figure><img src="{esc(str(p.relative_to(out)))}" alt="{esc(p.stem)}">'
        f'<figcaption>{esc(str(p.relative_to(out / "results")))}</figcaption></figure>'
        for p in pngs)
    jsonl = sorted((out / "results").rglob("*.jsonl")) + sorted((out / "results").rglob("*.json"))
    files = "".join(f'<li><a href="{esc(str(p.relative_to(out)))}">{esc(str(p.relative_to(out)))}</a></li>'
                    for p in jsonl if "headlines" not in p.parts)
    mode = "SMOKE (fast, figures are not meaningful)" if summary["smoke"] else "full"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>tern report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 1200px; }}
table {{ border-collapse: collapse; margin: .5em 0 1em; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }}
tr.failed td {{ background: #fde2e2; }} tr.ok td:nth-child(2) {{ color: #137333; }}
pre.err {{ white-space: pre-wrap; margin: 0; color: #a50e0e; }}
figure {{ display: inline-block; width: 46%; margin: 1%; vertical-align: top; }}
figure img {{ width: 100%; border: 1px solid #ddd; }}
.kv td:first-child {{ font-family: monospace; }}
</style></head><body>
<h1>tern report</h1>
<p>Mode: <b>{mode}</b>. Host {esc(str(meta.get("host")))} ({esc(str(meta.get("cpu")))}),
commit {esc(str(meta.get("git_commit")))}, {esc(str(meta.get("timestamp")))}.
Total wall time {summary["wall_s"]:.0f} s.</p>
<h2>Headline figures</h2>{"".join(heads) or "<p>No headline figures were recorded.</p>"}
<h2>Notebooks</h2>
<table><tr><th>notebook</th><th>status</th><th>wall s</th><th>error</th></tr>{"".join(rows)}</table>
<h2>Figures</h2>{gallery or "<p>No figures.</p>"}
<h2>Records</h2><ul>{files}</ul>
</body></html>
"""


# ---- CLI ----------------------------------------------------------------------------------


# The main job's shipped defaults: a laptop-sized training budget (notebook 03 alone
# defaults to 20 minutes; pass -p MINUTES=20 for that here).
REPORT_DEFAULT_PARAMS = {"MINUTES": 5.0, "CPU_MINUTES": 2.0}


