"""The real-browser check (benchmarks/browser_check.py): JupyterLab in headless Chromium
shows notebook 02's explorer figure and redraws it after a slider drag; a static page is
screenshot with its broken images named. The browser tests are skipped where the system
Chromium (/usr/bin/chromium) or the playwright package is missing (CI has neither)."""

import base64
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "browser_check.py"
PNG = b"\x89PNG\r\n\x1a\n"


def _script():
    spec = importlib.util.spec_from_file_location("browser_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


check = _script()
needs_browser = pytest.mark.skipif(check.missing_tools() is not None,
                                   reason=f"browser check unavailable: {check.missing_tools()}")


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900)


def test_smoke_copy_sets_smoke_and_results(tmp_path):
    dst = check.smoke_copy(ROOT / "notebooks", tmp_path / "nbs")
    nb = nbformat.read(str(dst / check.NOTEBOOK), as_version=4)
    (params,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert "SMOKE = True" in params.source and str(tmp_path / "nbs" / "results") in params.source
    assert len(list(dst.glob("*.ipynb"))) == len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))


@pytest.mark.slow
@needs_browser
def test_explorer_redraws_in_jupyterlab(tmp_path):
    r = _run("--out", str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    before, after = (tmp_path / "nb02_explorer_before.png").read_bytes(), (tmp_path / "nb02_explorer_after.png").read_bytes()
    assert before[:8] == PNG and after[:8] == PNG and before != after
    summary = json.loads((tmp_path / "browser_check.json").read_text())
    assert summary["problems"] == [] and summary["text_only_figures"] == 0
    assert summary["explorer_image_px"][0] > 500 and summary["figures_in_notebook"] >= 5


@needs_browser
def test_page_mode_names_broken_images(tmp_path):
    from tern.core.figure import figure_png, subplots

    fig, ax = subplots(figsize=(2, 1))
    ax.plot([0, 1])
    img = base64.b64encode(figure_png(fig)).decode()
    good = tmp_path / "good.html"
    good.write_text(f'<html><body><h1>report</h1><img src="data:image/png;base64,{img}"></body></html>')
    r = _run("--page", str(good), "--out", str(tmp_path / "shots"))
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((tmp_path / "shots" / "browser_check.json").read_text())
    assert summary["images"] == 1 and summary["outside_requests"] == []
    assert (tmp_path / "shots" / "good.png").read_bytes()[:8] == PNG
    bad = tmp_path / "bad.html"
    bad.write_text('<html><body><img src="missing.png"></body></html>')
    r = _run("--page", str(bad), "--out", str(tmp_path / "shots"))
    assert r.returncode == 1 and "did not load" in r.stderr
    assert _run("--page", str(tmp_path / "nope.html"), "--out", str(tmp_path)).returncode == 1
