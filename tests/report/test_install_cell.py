"""The notebooks' set-up cell (tern.report.notebook.INSTALL_CELL): where it installs tern
from, run as a notebook runs it before tern is importable: ``python -S`` (no site-packages,
so no tern) with a stand-in ``pip`` first on the path that logs its arguments and "installs"
a fake tern."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tern.report.notebook import INSTALL_CELL

FAKE_PIP = textwrap.dedent('''\
    import json, os, pathlib, sys
    with open(os.environ["FAKE_PIP_LOG"], "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\\n")
    pkg = pathlib.Path(os.environ["FAKE_SITE"], "tern", "report")
    pkg.mkdir(parents=True, exist_ok=True)
    for d in (pkg.parent, pkg):
        (d / "__init__.py").write_text("")
    (pkg / "notebook.py").write_text("def setup():\\n    print('fake setup')\\n    return 'ENV'\\n")
''')


def _run_cell(tmp_path, env_extra=None, installed=False):
    """Run INSTALL_CELL in a fresh ``python -S`` from an upload folder; returns the
    completed process and the argument lists pip was called with."""
    tools, site, uploads = tmp_path / "tools", tmp_path / "site", tmp_path / "uploads"
    for d in (tools / "pip", site, uploads):
        d.mkdir(parents=True, exist_ok=True)
    (tools / "pip" / "__init__.py").write_text("")
    (tools / "pip" / "__main__.py").write_text(FAKE_PIP)
    log = tmp_path / "pip.log"
    env = {k: v for k, v in os.environ.items() if k not in ("TERN_SRC", "PYTHONPATH")}
    env.update(PYTHONPATH=os.pathsep.join([str(tools), str(site)]), FAKE_PIP_LOG=str(log),
               FAKE_SITE=str(site), **(env_extra or {}))
    if installed:  # tern already importable: the stand-in "installs" it before the cell runs
        subprocess.run([sys.executable, "-m", "pip", "noop"], env=env, check=True)
        log.unlink()
    proc = subprocess.run([sys.executable, "-S", "-c", INSTALL_CELL + "\nprint('ENV =', ENV)"],
                          cwd=uploads, env=env, capture_output=True, text=True, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


def test_installs_from_tern_src(tmp_path):
    proc, calls = _run_cell(tmp_path, {"TERN_SRC": "git+https://example.invalid/tern.git"})
    assert proc.returncode == 0, proc.stderr
    assert calls == [["install", "-q", "git+https://example.invalid/tern.git"]]
    assert "fake setup" in proc.stdout and "ENV = ENV" in proc.stdout


def test_installs_an_uploaded_wheel_from_the_working_folder(tmp_path):
    wheel = tmp_path / "uploads" / "my-dataset" / "tern-0.1.0-py3-none-any.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"")
    proc, calls = _run_cell(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(calls) == 1 and calls[0][:2] == ["install", "-q"]
    assert os.path.samefile(tmp_path / "uploads" / calls[0][2], wheel)


def test_stops_with_an_instruction_when_nothing_is_found(tmp_path):
    proc, calls = _run_cell(tmp_path)
    assert proc.returncode != 0 and calls == []
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: tern is not installed")
    assert "tern-*.whl" in last and "TERN_SRC" in last and "/content" in last and "Kaggle" in last


def test_importable_tern_is_not_reinstalled(tmp_path):
    proc, calls = _run_cell(tmp_path, {"TERN_SRC": "/nowhere"}, installed=True)
    assert proc.returncode == 0, proc.stderr
    assert calls == [] and "fake setup" in proc.stdout


def test_tern_source_search_order(tmp_path):
    ns: dict = {}
    exec(INSTALL_CELL, ns)  # tern is importable here: only defines tern_source and runs setup()
    tern_source = ns["tern_source"]
    assert tern_source.__defaults__[1] == ("/kaggle/input", ".", "/content")
    kaggle, work = tmp_path / "kaggle" / "input", tmp_path / "work"
    old = kaggle / "ds-a" / "tern-0.1.0-py3-none-any.whl"
    new = kaggle / "ds-b" / "wheels" / "tern-0.2.0-py3-none-any.whl"
    too_deep = kaggle / "ds-c" / "a" / "b" / "tern-9.9.9-py3-none-any.whl"
    local = work / "tern-0.1.0-py3-none-any.whl"
    for i, p in enumerate((old, new, too_deep, local)):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"")
        os.utime(p, (1e9 + i, 1e9 + i))
    places = (str(kaggle), str(work))
    assert tern_source({"TERN_SRC": "/src/tern"}, places) == "/src/tern"  # TERN_SRC first
    assert tern_source({}, places) == str(new)  # the newest wheel of the first place holding one
    assert tern_source({}, (str(tmp_path / "empty"), str(work))) == str(local)
    with pytest.raises(RuntimeError, match="tern is not installed"):
        tern_source({}, (str(tmp_path / "empty"),))
