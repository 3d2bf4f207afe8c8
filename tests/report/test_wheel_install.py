"""A non-editable install carries everything the notebooks need: build an sdist from a copy
of the source tree, a wheel from that sdist, install the wheel (no dependencies) into a
folder of its own and run notebooks from a copy outside the checkout with only that install
on the path (the venv supplies torch & co.; a fresh venv could not see them).

All eight notebooks in order, sharing one RESULTS folder as in ``tern report`` (about 2.5
minutes on 2 cores, most of it numba compiling into the fresh install);
``TERN_WHEEL_NOTEBOOKS=03,07`` runs only those (the two that read the shipped tokenizer,
corpus and gates)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("tern", "data", "gates", "notebooks", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md")
SHIPPED = ("data/corpus", "data/tokenizers", "gates", "notebooks")  # what a wheel must carry
DEFAULT_NOTEBOOKS = "all"

DRIVER = textwrap.dedent('''\
    import json, os, sys, time
    from pathlib import Path
    import nbformat, papermill
    import tern
    from tern.core.paths import repo_root, shipped_dir

    site, work = Path(sys.argv[1]), Path(sys.argv[2])
    assert Path(tern.__file__).is_relative_to(site), tern.__file__
    assert repo_root() is None and shipped_dir("data").is_relative_to(site)
    where = nbformat.v4.new_notebook()  # the kernel must import the same install
    where.cells = [nbformat.v4.new_code_cell(
        "import tern; from pathlib import Path\\n"
        f"assert Path(tern.__file__).is_relative_to({str(site)!r}), tern.__file__")]
    where.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(where, str(work / "where.ipynb"))
    papermill.execute_notebook(str(work / "where.ipynb"), str(work / "where.out.ipynb"),
                               kernel_name="python3", progress_bar=False)
    times = {}
    for name in sys.argv[3:]:
        t0 = time.perf_counter()
        papermill.execute_notebook(
            str(work / "notebooks" / name), str(work / "out" / name), cwd=str(work / "notebooks"),
            parameters={"SMOKE": True, "RESULTS": str(work / "results")},
            kernel_name="python3", progress_bar=False, request_save_on_cell_execute=False)
        times[name] = round(time.perf_counter() - t0, 1)
    print("TIMES " + json.dumps(times))
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
            if p.is_file() and (d != "notebooks" or p.name[:2].isdigit())}
    assert want - names == set(), "files the wheel lacks (setup.py SHIPPED / MANIFEST.in)"
    assert not [n for n in names if "/cache/" in n or n.endswith(".npy")]
    assert "tern/predict/reference/ryzen_3600x.json" in names
    assert wheel.stat().st_size < 10e6

    site, work = tmp_path / "site", tmp_path / "work"
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)])
    shutil.copytree(site / "tern" / "_shipped" / "notebooks", work / "notebooks")  # as uploaded
    (work / "out").mkdir()
    wanted = os.environ.get("TERN_WHEEL_NOTEBOOKS", DEFAULT_NOTEBOOKS)
    nbs = sorted(p.name for p in (work / "notebooks").glob("[0-9][0-9]_*.ipynb")
                 if wanted == "all" or p.name[:2] in wanted.split(","))
    assert nbs, f"TERN_WHEEL_NOTEBOOKS={wanted!r} matches no notebook"
    env = {k: v for k, v in os.environ.items() if k not in ("TERN_DATA_DIR", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    p = _run([sys.executable, "-c", DRIVER, str(site), str(work), *nbs], cwd=work, env=env, timeout=1800)
    times = json.loads(p.stdout.split("TIMES ", 1)[1])
    assert sorted(times) == nbs
    print(f"wheel-only SMOKE run, seconds per notebook: {times}")
    heads = {h.stem for h in (work / "results" / "headlines").glob("*.json")}
    assert heads == {n.removesuffix(".ipynb") for n in nbs}, heads
