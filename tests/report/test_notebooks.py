"""Every numbered notebook: committed without outputs, has a papermill parameters cell,
and runs top to bottom in SMOKE mode ("restart and run all")."""

import json
from pathlib import Path

import pytest

NB_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))


def test_notebooks_exist():
    assert NOTEBOOKS, "no numbered notebooks found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs_and_parameterised(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        assert not cell.get("outputs"), f"{path.name}: cell {i} has outputs (strip them)"
        assert cell.get("execution_count") is None, f"{path.name}: cell {i} has an execution count"
    params = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, f"{path.name}: needs exactly one cell tagged 'parameters'"
    src = "".join(params[0]["source"])
    assert "SMOKE" in src and "RESULTS" in src


def execute_smoke(path: Path, out_dir: Path):
    """Run notebook ``path`` top to bottom in SMOKE mode (RESULTS = ``out_dir/results``) into
    ``out_dir/<name>``; returns the executed notebook (nbformat)."""
    import papermill  # a dependency of tern: a missing one must fail, not skip

    return papermill.execute_notebook(
        str(path), str(out_dir / path.name), cwd=str(NB_DIR),
        parameters={"SMOKE": True, "RESULTS": str(out_dir / "results")},
        kernel_name="python3", progress_bar=False, request_save_on_cell_execute=False,
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_first_code_cell_is_the_shared_set_up_cell(path):
    from tern.report.notebook import INSTALL_CELL

    nb = json.loads(path.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert "".join(code[0]["source"]) == INSTALL_CELL, (
        f"{path.name}: the first code cell must be tern.report.notebook.INSTALL_CELL")
    later = "".join("".join(c["source"]) for c in code[1:])
    assert "setup()" not in later, f"{path.name}: setup() is called again after the set-up cell"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_in_smoke_mode(path, tmp_path):
    execute_smoke(path, tmp_path)
