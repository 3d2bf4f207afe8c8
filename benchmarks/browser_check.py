"""Check in a real browser that the notebooks' figures show and the roofline explorer redraws
(issue 15): JupyterLab driven by headless Chromium through Playwright.

    .venv/bin/python benchmarks/browser_check.py [--out results/screenshots]
    .venv/bin/python benchmarks/browser_check.py --page report/index.html

Notebook mode (the default): copies ``notebooks/`` into a temporary folder with ``SMOKE = True``
in each parameters cell (so "run all" takes seconds, not minutes), starts ``jupyter lab`` from
this Python's environment on it, opens notebook 02, runs all cells, screenshots the explorer's
figure (``nb02_explorer_before.png``), drags the bits/weight slider, waits for the figure
to change and screenshots it again (``nb02_explorer_after.png``). Exit 1 when the figure is
missing, not loaded or unchanged after the move; every other figure of the notebook must be
an image too.

Page mode (``--page FILE.html``): opens the file from disk, takes a full-page screenshot
(``<stem>.png``) and lists its images that did not load and any request that left the
machine (a self-contained page makes none). Exit 1 on a broken image.

Needs the system Chromium (Debian's ``chromium`` package: /usr/bin/chromium; Playwright's own
browser download is not used) and the ``playwright`` Python package (``pip install
playwright``; no ``playwright install``). Exit 2 when either is missing. A summary goes to
``<out>/browser_check.json`` (with tern.core.records.run_metadata).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
NOTEBOOK = "02_roofline.ipynb"
SLIDER = "bits/weight"  # the explorer slider the check drags


def missing_tools() -> str | None:
    """Why the check cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} not found (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing (pip install playwright)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smoke_copy(src: Path, dst: Path) -> Path:
    """``src``'s numbered notebooks copied into ``dst`` with SMOKE = True and RESULTS in ``dst``."""
    import nbformat

    dst.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(str(p), as_version=4)
        for c in nb.cells:
            if "parameters" in c.metadata.get("tags", []):
                c.source = c.source.replace("SMOKE = False", "SMOKE = True").replace(
                    'RESULTS = "results"', f'RESULTS = {str(dst / "results")!r}')
        nbformat.write(nb, str(dst / p.name))
    return dst


@contextlib.contextmanager
def jupyter_lab(root: Path, log: Path):
    """A JupyterLab server on ``root``; yields its base URL with the token query."""
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTERLAB_WORKSPACES_DIR": str(root / ".workspaces"), "PYTHONUNBUFFERED": "1"}
    cmd = [str(Path(sys.executable).with_name("jupyter")), "lab", "--no-browser", f"--port={port}",
           "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.news_url=None",
           *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"jupyter lab did not start (see {log})") from None
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _launch(pw):
    return pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def check_notebook(out: Path, timeout_s: float) -> dict:
    """Run notebook 02 in JupyterLab, screenshot the explorer before and after a slider drag."""
    from playwright.sync_api import sync_playwright

    result: dict = {"mode": "notebook", "notebook": NOTEBOOK, "problems": []}
    with tempfile.TemporaryDirectory(prefix="tern-browser-") as tmp:
        root = smoke_copy(ROOT / "notebooks", Path(tmp) / "notebooks")
        with jupyter_lab(root, out / "jupyter_lab.log") as (base, token), sync_playwright() as pw:
            browser = _launch(pw)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(timeout_s * 1000)
            try:
                _drive_notebook(page, f"{base}/lab/tree/{NOTEBOOK}?token={token}", out, result)
            except Exception as e:  # a wait that timed out: keep what the page showed
                page.screenshot(path=str(out / "nb02_failure.png"), full_page=True)
                result["problems"].append(f"{type(e).__name__}: {str(e).splitlines()[0]} "
                                          f"(page at {out / 'nb02_failure.png'})")
            browser.close()
    return result


def _drive_notebook(page, url: str, out: Path, result: dict) -> None:
    """Open the notebook, run all, screenshot the explorer, drag a slider, screenshot again."""
    page.goto(url)
    page.locator(".jp-Notebook .jp-Cell").first.wait_for()
    # the kernel is up when the status bar says so; a "Run All" sent before may be dropped
    page.wait_for_function("() => (document.querySelector('#jp-main-statusbar') || {innerText: ''})"
                           ".innerText.includes('Idle')", timeout=120_000)
    t0 = time.monotonic()
    for attempt in range(1, 4):
        result["run_all_attempts"] = attempt
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        try:  # some prompt shows [*] or a number once cells run
            page.wait_for_function("() => [...document.querySelectorAll('.jp-InputPrompt')]"
                                   ".some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))", timeout=30_000)
            break
        except Exception:
            page.keyboard.press("Escape")
    img = page.locator(".widget-vbox .widget-output img").first
    img.wait_for(state="visible")
    # every cell done: no "[*]" prompt left
    page.wait_for_function("() => ![...document.querySelectorAll('.jp-InputPrompt')]"
                           ".some(p => p.textContent.includes('*'))")
    result["run_all_s"] = round(time.monotonic() - t0, 1)
    img.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    before_src = img.get_attribute("src")
    result["figures_in_notebook"] = page.locator(".jp-OutputArea-output img").count()
    result["text_only_figures"] = page.get_by_text("<TernFigure size").count() + \
        page.get_by_text("<Figure size").count()
    if result["text_only_figures"]:
        result["problems"].append(f"{result['text_only_figures']} figure(s) shown as text")
    natural = img.evaluate("e => [e.naturalWidth, e.naturalHeight]")
    result["explorer_image_px"] = natural
    if not natural[0]:
        result["problems"].append("the explorer's image did not load")
    box = page.locator(".widget-vbox").filter(has=page.locator(".widget-output img")).first
    before = out / "nb02_explorer_before.png"
    box.screenshot(path=str(before))
    slider = box.locator(".widget-slider").filter(has_text=SLIDER).first
    handle = slider.locator(".noUi-handle").first
    handle.scroll_into_view_if_needed()
    hb = handle.bounding_box()
    track = slider.locator(".noUi-target").first.bounding_box()
    x, y = hb["x"] + hb["width"] / 2, hb["y"] + hb["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + 0.25 * track["width"], y, steps=12)  # drag a quarter of the track right
    page.mouse.up()
    result["slider_readout_after"] = slider.locator(".widget-readout").first.inner_text()
    try:
        page.wait_for_function("([sel, old]) => { const i = document.querySelector(sel);"
                               " return i && i.src !== old && i.naturalWidth > 0; }",
                               arg=[".widget-vbox .widget-output img", before_src], timeout=60_000)
    except Exception:
        result["problems"].append("the explorer's figure did not change after the slider move")
    page.wait_for_timeout(500)
    after = out / "nb02_explorer_after.png"
    box.screenshot(path=str(after))
    result["screenshots"] = [str(before), str(after)]
    if before.read_bytes() == after.read_bytes():
        result["problems"].append("the before and after screenshots are identical")


def check_page(page_path: Path, out: Path, timeout_s: float) -> dict:
    """Full-page screenshot of a static HTML file; its broken images and outside requests."""
    from playwright.sync_api import sync_playwright

    if not page_path.is_file():
        raise FileNotFoundError(f"no such page: {page_path}")
    result: dict = {"mode": "page", "page": str(page_path), "problems": [], "outside_requests": []}
    with sync_playwright() as pw:
        browser = _launch(pw)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(timeout_s * 1000)
        page.on("request", lambda r: result["outside_requests"].append(r.url)
                if not r.url.startswith(("file:", "data:", "about:", "blob:")) else None)
        page.goto(page_path.resolve().as_uri(), wait_until="load")
        page.wait_for_timeout(1000)
        imgs = page.evaluate("() => [...document.images].map(i => [i.currentSrc.slice(0, 80), i.naturalWidth])")
        result["images"] = len(imgs)
        broken = [src for src, w in imgs if not w]
        if broken:
            result["problems"].append(f"{len(broken)} image(s) did not load: {broken[:5]}")
        shot = out / f"{page_path.stem}.png"
        page.screenshot(path=str(shot), full_page=True)
        result["screenshots"] = [str(shot)]
        browser.close()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "screenshots", help="folder for the PNGs")
    ap.add_argument("--page", type=Path, help="screenshot this HTML file instead of running notebook 02")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds any one browser wait may take")
    args = ap.parse_args(argv)
    why = missing_tools()
    if why:
        print(f"browser check skipped: {why}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        result = check_page(args.page, args.out, args.timeout) if args.page else check_notebook(args.out, args.timeout)
    except (FileNotFoundError, RuntimeError) as e:
        print(f"browser check: {e}", file=sys.stderr)
        return 1
    from tern.core.records import atomic_write_json, run_metadata

    atomic_write_json(args.out / "browser_check.json", {**run_metadata(), **result})
    print(json.dumps(result, indent=1))
    for p in result["problems"]:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
