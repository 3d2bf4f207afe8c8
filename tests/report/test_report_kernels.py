"""The report's notebooks run on kernels over local Unix sockets (tern.report.build.local_socket_kernels):
no 'running over TCP without encryption' warning from ipykernel, nothing left behind."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import nbformat
import pytest

from tern.report.build import local_socket_kernels, run_notebook


def _tiny_notebook(folder):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nb.metadata["language_info"] = {"name": "python"}
    params = nbformat.v4.new_code_cell("SMOKE = False\nRESULTS = 'results'")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("import os\nprint('pid', os.getpid(), 'smoke', SMOKE)")]
    for i, c in enumerate(nb.cells):
        c.id = f"cell-{i}"
    path = folder / "tiny.ipynb"
    nbformat.write(nb, str(path))
    return path


@pytest.mark.skipif(sys.platform.startswith("win"), reason="no Unix sockets")
def test_report_kernels_use_local_sockets_and_leave_nothing(tmp_path, capfd, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    path = _tiny_notebook(src)
    private = tempfile.mkdtemp(prefix="tk")  # a short folder of this test's own (socket paths are short)
    real = tempfile.TemporaryDirectory
    monkeypatch.setattr(tempfile, "TemporaryDirectory", lambda *a, **kw: real(*a, **{**kw, "dir": private}))
    try:
        run = run_notebook(path, tmp_path / "out", smoke=True, timeout_s=120)
        left = os.listdir(private)
    finally:
        monkeypatch.undo()
        shutil.rmtree(private, ignore_errors=True)
    assert left == []  # the socket folder is removed
    assert run.status == "ok", run.error
    out = nbformat.read(str(tmp_path / "out" / "notebooks" / "tiny.ipynb"), as_version=4)
    assert "smoke True" in out.cells[-1].outputs[0]["text"]
    assert "without encryption" not in capfd.readouterr().err
    assert sorted(p.name for p in src.iterdir()) == ["tiny.ipynb"]  # no socket files beside the notebook


def test_the_manager_puts_its_sockets_in_the_folder():
    cls = local_socket_kernels("/tmp/tk-test")
    if sys.platform.startswith("win"):
        assert cls is None
        return
    km = cls()
    assert km.transport == "ipc" and km.ip == os.path.join("/tmp/tk-test", "kernel")
    assert local_socket_kernels("/" + "x" * 100) is None  # too long for a socket path: TCP, as before
