"""Figures: no library module chooses a matplotlib backend, and the figures the plots
return stay out of pyplot's registry and show as PNG in any IPython front end."""

import ast
from pathlib import Path

from tern.core.figure import TernFigure, figure_png, subplots

TERN = Path(__file__).resolve().parents[2] / "tern"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _backend_calls(tree: ast.AST) -> list[int]:
    """Line numbers of ``<anything>.use(...)`` on matplotlib and ``switch_backend(...)``."""
    mpl_names = {"matplotlib", "mpl"}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if f.attr == "switch_backend" or (f.attr == "use" and isinstance(f.value, ast.Name)
                                              and f.value.id in mpl_names):
                lines.append(node.lineno)
    return lines


def test_no_library_module_chooses_a_backend():
    found = {str(p.relative_to(TERN)): lines for p in sorted(TERN.rglob("*.py"))
             if (lines := _backend_calls(ast.parse(p.read_text(encoding="utf-8"))))}
    assert found == {}, f"matplotlib backend chosen at {found}: figures would not show in Jupyter"
    assert _backend_calls(ast.parse("import matplotlib\nmatplotlib.use('Agg')\n")) == [2]  # the check bites


def test_figures_stay_out_of_pyplot_and_show_as_png(tmp_path):
    import matplotlib.pyplot as plt
    from IPython.core.formatters import DisplayFormatter

    before = plt.get_fignums()
    fig, (a, b) = subplots(1, 2, figsize=(4, 2))
    a.plot([1, 2], [3, 4])
    assert isinstance(fig, TernFigure) and plt.get_fignums() == before  # nothing to leak or draw twice
    data, _ = DisplayFormatter().format(fig)  # what a Jupyter kernel sends for the figure
    assert data["image/png"][:8] == PNG_MAGIC and data["text/plain"].startswith("<TernFigure")
    assert figure_png(fig, dpi=50)[:8] == PNG_MAGIC
    fig.savefig(tmp_path / "f.png")  # headless save, no backend set
    assert (tmp_path / "f.png").read_bytes()[:8] == PNG_MAGIC
