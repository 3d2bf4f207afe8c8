"""A non-editable install carries everything the notebooks need: build an sdist from a copy
of the source tree, a wheel from that sdist, install the wheel (no dependencies) into a
folder of its own and run notebooks from a copy outside the checkout with only that install
on the path (the venv supplies torch & co.; a fresh venv could not see them).

By default the notebooks whose package code reads files by where tern is installed
(DEFAULT_NOTEBOOKS: the shipped corpus and tokenizer, 03 / 04; the shipped gates and the
committed frontier rows, 07), after a first notebook that checks the kernel imports this
install, sharing one RESULTS folder as in ``tern report``. The others call only code that
finds nothing by location beyond RESULTS (the same tern.core.paths rule as these) and run in
SMOKE mode from the checkout (test_notebooks). Notebook 06's one location-dependent cell (no
committed hosts in a site install) is checked by test_committed_hosts'
test_a_site_install_has_no_committed_hosts_and_plots_this_machine_alone instead. Measured on
2 cores (AMD EPYC Zen 4 VM): all eight took 357 s, 03 / 04 / 06 / 07 342 s, 256 s of it in 06:
whichever numba notebook runs first here probes the host and compiles every kernel again
into the fresh install. ``TERN_WHEEL_NOTEBOOKS=all`` runs all eight; ``=03,07``
only those."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tern.report.captions import caption_for
from tern.report.summary import answers

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("tern", "data", "gates", "notebooks", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md")
SHIPPED = ("data/corpus", "data/tokenizers", "gates", "notebooks")  # what a wheel must carry
DEFAULT_NOTEBOOKS = "03,04,07"  # notebooks whose package code finds files by the install location

DRIVER = textwrap.dedent('''\
    import json, sys
    from pathlib import Path
    import nbformat
    import tern
    from tern.core.paths import repo_root, shipped_dir
    from tern.report.build import REPORT_DEFAULT_PARAMS, notebooks_dir, run_report

    site, work, only = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    assert Path(tern.__file__).is_relative_to(site), tern.__file__
    assert repo_root() is None and shipped_dir("data").is_relative_to(site)
    assert notebooks_dir().is_relative_to(site)  # `tern report` finds the installed notebooks
    where = nbformat.v4.new_notebook()  # first, in its own kernel: the kernel imports this install
    where.cells = [nbformat.v4.new_code_cell("SMOKE = True\\nRESULTS = 'results'"), nbformat.v4.new_code_cell(
        "import tern; from pathlib import Path\\n"
        f"assert Path(tern.__file__).is_relative_to({str(site)!r}), tern.__file__")]
    where.cells[0].metadata["tags"] = ["parameters"]
    where.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(where, str(work / "notebooks" / "00_where.ipynb"))
    run_report(work / "rep", smoke=True, only=["00", *only], nb_dir=work / "notebooks", progress=False,
               params=REPORT_DEFAULT_PARAMS)
''')


def _run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert p.returncode == 0, f"{cmd[:4]} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def _build_wheel(tmp: Path) -> Path:
    src = tmp / "src"
    for name in SOURCES:
        s = ROOT / name
        if s.is_dir():
            shutil.copytree(s, src / name, ignore=shutil.ignore_patterns(
                "__pycache__", "cache", "build", "*.egg-info", ".ipynb_checkpoints", "_shipped"))
        else:
            shutil.copy2(s, src / name)
    dist = tmp / "dist"
    _run([sys.executable, "-c", f"from setuptools import build_meta as b; b.build_sdist({str(dist)!r})"],
         cwd=src)
    sdist = next(dist.glob("tern-*.tar.gz"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(dist), str(sdist)], cwd=tmp)
    return next(dist.glob("tern-*.whl"))


@pytest.mark.slow
def test_notebooks_run_from_a_wheel_install(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {f"tern/_shipped/{p.relative_to(ROOT).as_posix()}"
            for d in SHIPPED for p in (ROOT / d).iterdir()
            if p.is_file() and (d != "notebooks" or p.name[:2].isdigit())
            and not p.name.endswith(".lock")}  # the registry's append lock: a run-time file (gitignored)
    assert want - names == set(), "files the wheel lacks (setup.py SHIPPED / MANIFEST.in)"
    assert not [n for n in names if "/cache/" in n or n.endswith(".npy")]
    assert "tern/predict/reference/ryzen_3600x.json" in names
    assert wheel.stat().st_size < 10e6

    site, work = tmp_path / "site", tmp_path / "work"
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)])
    shutil.copytree(site / "tern" / "_shipped" / "notebooks", work / "notebooks")  # as uploaded
    wanted = os.environ.get("TERN_WHEEL_NOTEBOOKS", DEFAULT_NOTEBOOKS)
    nbs = sorted(p.stem[:2] for p in (work / "notebooks").glob("[0-9][0-9]_*.ipynb")
                 if wanted == "all" or p.name[:2] in wanted.split(","))
    assert nbs, f"TERN_WHEEL_NOTEBOOKS={wanted!r} matches no notebook"
    env = {k: v for k, v in os.environ.items() if k not in ("TERN_DATA_DIR", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    _run([sys.executable, "-c", DRIVER, str(site), str(work), *nbs], cwd=work, env=env, timeout=1800)

    rep = work / "rep"
    report = json.loads((rep / "report.json").read_text())
    runs = {r["name"]: r for r in report["notebooks"]}
    print("wheel-only SMOKE report, seconds per notebook: "
          + ", ".join(f"{n} {r['wall_s']:.1f}" for n, r in runs.items()))
    assert {n: r["error"] for n, r in runs.items() if r["status"] != "ok"} == {}
    assert sorted(n[:2] for n in runs) == ["00", *nbs]
    assert set(report["headlines"]) == {n for n in runs if n != "00_where"}
    # the index: every figure captioned, every figure the summary links to drawn, offline pages
    uncaptioned = sorted(p.name for p in (rep / "results").rglob("*.png") if caption_for(p.name) is None)
    assert uncaptioned == [], "add these to tern/report/captions.py"
    lead, rows = answers(report["headlines"])
    linked = [a.figure for a in [lead, *rows] if a is not None and a.text is not None and a.figure]
    assert [f for f in linked if not list((rep / "results").rglob(f))] == []
    index = (rep / "index.html").read_text(encoding="utf-8")
    assert str(tmp_path) not in index
    if wanted == "all":
        assert "not run" not in index.split("<h2>Notebooks</h2>")[0]
    for page in (rep / "notebooks").glob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert re.findall(r"<script\b[^>]*\bsrc=", text) == [], page.name
