"""Every numbered notebook: committed without outputs, with unique cell ids, has a papermill parameters cell,
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
    ids = [c.get("id") for c in nb["cells"]]  # nbformat 4.5: every cell an id, no two alike
    assert None not in ids and len(set(ids)) == len(ids), f"{path.name}: cell ids missing or repeated"
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


def image_counts(nb) -> dict[int, int]:
    """Cell index -> number of image/png outputs of an executed notebook."""
    return {i: n for i, c in enumerate(nb.cells) if c.cell_type == "code"
            and (n := sum("image/png" in o.get("data", {}) for o in c.outputs))}


def check_probe_figures(nb) -> None:
    """Notebook 01 shows both bandwidth figures inline, and no figure object is displayed as
    its repr (a library module switching Jupyter's inline display off)."""
    shown = image_counts(nb)
    figure_cells = [i for i, c in enumerate(nb.cells) if "plot_bandwidth(PROFILE" in c.source]
    assert len(figure_cells) == 2 and all(shown.get(i) == 1 for i in figure_cells), shown
    assert not any("<TernFigure" in o.get("data", {}).get("text/plain", "") and "image/png" not in o["data"]
                   for c in nb.cells if c.cell_type == "code" for o in c.outputs)


# checks of a notebook's executed outputs, made on its one smoke run (no second run of the
# slow probe notebook); test_notebook_figures runs notebook 02 with a cell of its own appended
AFTER_SMOKE = {"01_probe_host": check_probe_figures}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_in_smoke_mode(path, tmp_path):
    nb = execute_smoke(path, tmp_path)
    if path.stem in AFTER_SMOKE:
        AFTER_SMOKE[path.stem](nb)


def test_after_smoke_checks_name_real_notebooks():
    """A renamed notebook must not silently lose the checks made on its smoke run."""
    assert set(AFTER_SMOKE) <= {p.stem for p in NOTEBOOKS}, set(AFTER_SMOKE) - {p.stem for p in NOTEBOOKS}
