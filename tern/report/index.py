"""The report's index page: a one-screen summary, the notebooks, their figures, raw data.

    1. the kit's question and its answer here (the ~10B model, notebook 08), then the six
       steps' questions with what this run measured (tern.report.summary), each linking to
       its notebook page and figure;
    2. the notebooks: status, wall time, error;
    3. the figures, grouped by notebook in order, each with one line on what it shows
       (tern.report.captions), dense ones at full width;
    4. raw data, collapsed: every headline figure (rounded) and the records written.

Every link is relative to the report folder, so the folder can be moved or zipped; the page
loads nothing from the network.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from tern.report.captions import CAPTIONS, Caption, caption_for, png_size
from tern.report.summary import Answer, answers, num

WIDE_ASPECT = 2.2  # a figure wider than this (width / height) gets the full page width

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1250px; padding: 0 1em;
       color: #202124; line-height: 1.4; }
h1 { margin-bottom: .2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.meta { color: #5f6368; margin-top: 0; }
.smoke { background: #fef7e0; border: 1px solid #f9ab00; padding: .4em .8em; }
.lead { font-size: 1.1em; background: #e8f0fe; padding: .6em .9em; border-radius: 4px; }
table { border-collapse: collapse; margin: .5em 0 1em; }
td, th { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
table.summary td:first-child { font-weight: 600; white-space: nowrap; }
table.summary td.q { width: 22%; } td.see { white-space: nowrap; }
.notrun { color: #80868b; font-style: italic; }
tr.failed td { background: #fde2e2; } td.ok { color: #137333; } td.failed { color: #a50e0e; }
pre.err { white-space: pre-wrap; margin: 0; color: #a50e0e; max-height: 8em; overflow: auto; }
.figs { display: flex; flex-wrap: wrap; gap: 1em; }
figure { margin: 0; flex: 0 1 calc(50% - .5em); min-width: 380px; }
figure.wide { flex-basis: 100%; }
figure img { width: 100%; border: 1px solid #ddd; }
figcaption { font-size: .92em; } figcaption .file { color: #80868b; font-family: monospace; }
details { margin: .5em 0; } summary { cursor: pointer; font-weight: 600; }
.kv td:first-child { font-family: monospace; }
"""


def _title(name: str) -> str:
    """``01_probe_host`` -> ``01 · probe host``."""
    num_, _, rest = name.partition("_")
    return f"{num_} · {rest.replace('_', ' ')}" if rest else name


def _duration(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(round(s), 60)
    return f"{m} min {sec:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


def _value(v: Any, out: Path) -> str:
    """A headline value for the raw table: numbers rounded, paths relative to the report."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return num(v)
    if isinstance(v, list):
        return ", ".join(_value(x, out) for x in v)
    if isinstance(v, dict):
        return html.escape(json.dumps(v, sort_keys=True))
    return html.escape(unpath(str(v), out))


ABS_PATH = re.compile(r"(?<![\w.~:/])/(?:[\w.+-]+/)+([\w.+-]+)")


def unpath(text: str, out: Path) -> str:
    """``text`` without absolute paths: those under the report folder relative to it, any
    other as ``…/<its name>`` (a report must not show where it was built)."""
    return ABS_PATH.sub(r"…/\1", text.replace(f"{out}/", ""))


def _figures(out: Path) -> list[tuple[Path, Caption | None]]:
    """Every PNG under ``out/results`` with its caption, in the order of CAPTIONS (the order
    the notebooks draw them), uncaptioned ones last."""
    figs = [(p, caption_for(p.name)) for p in (out / "results").rglob("*.png")]
    return sorted(figs, key=lambda f: (CAPTIONS.index(f[1]) if f[1] else len(CAPTIONS), f[0].name))


def _figure_html(p: Path, cap: Caption | None, out: Path) -> str:
    esc = html.escape
    rel = p.relative_to(out).as_posix()
    dims = png_size(p)
    wide = (cap.wide if cap else False) or bool(dims and dims[0] > WIDE_ASPECT * dims[1])
    text = esc(cap.text) + " " if cap else ""
    return (f'<figure id="fig-{esc(p.stem)}" class="{"wide" if wide else ""}">'
            f'<a href="{esc(rel)}"><img src="{esc(rel)}" alt="{esc(p.stem)}"></a>'
            f'<figcaption>{text}<span class="file">{esc(p.name)}</span></figcaption></figure>')


def _see(a: Answer, runs: dict[str, dict], figure_ids: set[str]) -> str:
    links = []
    for nb in a.notebooks:
        r = next((r for name, r in runs.items() if name.startswith(nb)), None)
        if r and r.get("html"):
            links.append(f'<a href="{html.escape(r["html"])}">notebook {nb}</a>')
    stem = Path(a.figure).stem if a.figure else None
    if stem in figure_ids:
        links.append(f'<a href="#fig-{html.escape(stem)}">figure</a>')
    return " · ".join(links)


def _answer_html(a: Answer, runs: dict[str, dict], out: Path) -> str:
    if a.text is not None:  # paths under the report folder relative to it
        return html.escape(unpath(a.text, out))
    failed = [r for name, r in runs.items() if name[:2] in a.notebooks and r["status"] == "failed"]
    return f'<span class="notrun">{"failed (see below)" if failed else "not run"}</span>'


def render_index(summary: dict[str, Any], out: Path) -> str:
    """The index page of the report folder ``out`` from :func:`tern.report.build.run_report`'s
    summary (its notebooks, headlines and metadata)."""
    esc = html.escape
    meta = summary.get("meta", {})
    runs = {r["name"]: r for r in summary["notebooks"]}
    figures = _figures(out)
    figure_ids = {p.stem for p, _ in figures}
    lead, rows = answers(summary.get("headlines", {}))

    commit = str(meta.get("git_commit") or "unknown")
    head = (f"<h1>tern report</h1><p class='meta'>{esc(str(meta.get('host')))} · {esc(str(meta.get('cpu')))}"
            f" · {esc(str(meta.get('logical_cpus', '?')))} logical CPUs · commit {esc(commit[:12])}"
            f"{' (modified)' if commit.endswith('+dirty') else ''} · {esc(str(meta.get('timestamp')))}"
            f" · {'SMOKE' if summary['smoke'] else 'full'} run, {_duration(summary['wall_s'])}</p>")
    if summary["smoke"]:
        head += ("<p class='smoke'><b>SMOKE run</b>: every notebook ran with tiny budgets to check the "
                 "pipeline; its numbers say nothing about this machine. <code>tern report</code> "
                 "without <code>--smoke</code> measures.</p>")
    if lead is not None:
        head += (f"<p class='lead'><b>{esc(lead.question)}</b><br>{_answer_html(lead, runs, out)} "
                 f"<span class='see'>[{_see(lead, runs, figure_ids)}]</span></p>")
    else:
        head += "<p class='lead notrun'>The ~10B model (notebook 08): not run.</p>"
    table = "".join(
        f"<tr><td>{esc(a.step)}</td><td class='q'>{esc(a.question)}</td><td>{_answer_html(a, runs, out)}</td>"
        f"<td class='see'>{_see(a, runs, figure_ids)}</td></tr>" for a in rows)
    summary_html = (f"<table class='summary'><tr><th>step</th><th>question</th><th>measured here</th>"
                    f"<th>see</th></tr>{table}</table>")

    nb_rows = "".join(
        f"<tr class='{r['status']}'><td>"
        + (f"<a href='{esc(r['html'])}'>{esc(_title(r['name']))}</a>" if r["html"] else esc(_title(r["name"])))
        + f"</td><td class='{r['status']}'>{esc(r['status'])}</td><td>{_duration(r['wall_s'])}</td><td>"
        + (f"<pre class='err'>{esc(unpath(r['error'], out))}</pre>" if r["error"] else "") + "</td></tr>"
        for r in summary["notebooks"])
    notebooks_html = (f"<h2>Notebooks</h2><table><tr><th>notebook</th><th>status</th><th>wall time</th>"
                      f"<th>error</th></tr>{nb_rows}</table>")

    groups: dict[str, list[str]] = {}
    for p, cap in figures:
        key = cap.notebook if cap else "other"
        groups.setdefault(key, []).append(_figure_html(p, cap, out))
    sections = []
    for key in sorted(groups, key=lambda k: (k == "other", k)):
        name = next((n for n in runs if n.startswith(key)), None) if key != "other" else None
        title = "Other figures" if key == "other" else esc(_title(name) if name else f"notebook {key}")
        link = f" <a href='{esc(runs[name]['html'])}'>(notebook page)</a>" if name and runs[name]["html"] else ""
        sections.append(f"<h3 id='nb-{esc(key)}'>{title}{link}</h3><div class='figs'>{''.join(groups[key])}</div>")
    figures_html = "<h2>Figures</h2>" + ("".join(sections) or "<p class='notrun'>No figures.</p>")

    heads = "".join(
        f"<h4>{esc(_title(nb))}</h4><table class='kv'>"
        + "".join(f"<tr><td>{esc(k)}</td><td>{_value(v, out)}</td></tr>" for k, v in sorted(h.items()))
        + "</table>" for nb, h in summary.get("headlines", {}).items())
    records = sorted(p for ext in ("*.jsonl", "*.json") for p in (out / "results").rglob(ext)
                     if "headlines" not in p.relative_to(out).parts)
    files = "".join(f"<li><a href='{esc(p.relative_to(out).as_posix())}'>{esc(p.relative_to(out).as_posix())}</a></li>"
                    for p in records)
    n_values = sum(len(h) for h in summary.get("headlines", {}).values())
    raw_html = (f"<h2>Raw data</h2><details><summary>Headline figures of each notebook ({n_values} values)"
                f"</summary>{heads or '<p>None recorded.</p>'}</details>"
                f"<details><summary>Records written ({len(records)} files)</summary><ul>{files}</ul></details>")

    return (f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><title>tern report</title>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><style>{STYLE}</style>"
            f"</head><body>\n{head}\n{summary_html}\n{notebooks_html}\n{figures_html}\n{raw_html}\n"
            f"</body></html>\n")
