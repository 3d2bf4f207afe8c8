"""tern report: runs notebooks in order, records failures, writes a linked index."""

import nbformat
import pytest

from tern.report.build import list_notebooks, run_report


def _nb(path, code):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('SMOKE = False\nRESULTS = "results"')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(code)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


@pytest.mark.slow
def test_report_runs_all_and_records_failure(tmp_path):
    nbd = tmp_path / "notebooks"
    nbd.mkdir()
    _nb(nbd / "01_ok.ipynb",
        "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt\n"
        "from tern.core.paths import results_dir\nfrom tern.report.notebook import save_headline\n"
        "out = results_dir(RESULTS); fig = plt.figure(); plt.plot([1, 2]);"
        " fig.savefig(out / 'fig_ok.png')\n"
        "save_headline(out, '01_ok', {'smoke': SMOKE, 'answer_tok_per_s': 42.0})")
    _nb(nbd / "02_fails.ipynb", "raise RuntimeError('deliberate failure')")
    _nb(nbd / "03_after.ipynb", "x = 1")
    out = tmp_path / "rep"
    res = run_report(out, smoke=True, nb_dir=nbd, progress=False, timeout_s=120)
    status = {r["name"]: r["status"] for r in res["notebooks"]}
    assert status == {"01_ok": "ok", "02_fails": "failed", "03_after": "ok"}
    err = [r["error"] for r in res["notebooks"] if r["name"] == "02_fails"][0]
    assert "deliberate failure" in err
    assert res["headlines"] == {"01_ok": {"smoke": True, "answer_tok_per_s": 42.0}}
    index = (out / "index.html").read_text()
    assert "deliberate failure" in index and "answer_tok_per_s" in index
    assert 'src="results/fig_ok.png"' in index and "notebooks/01_ok.html" in index
    assert (out / "notebooks" / "01_ok.html").exists()


def test_only_filter(tmp_path):
    nbd = tmp_path / "notebooks"
    nbd.mkdir()
    for n in ("01_a", "02_b"):
        _nb(nbd / f"{n}.ipynb", "pass")
    assert [p.stem for p in list_notebooks(["02"], nbd)] == ["02_b"]
    with pytest.raises(ValueError, match="matches no notebook"):
        list_notebooks(["09"], nbd)


def test_params_parse_and_declared(tmp_path):
    from tern.report.build import _declared, parse_params

    assert parse_params(["MINUTES=5", "NAME=abc", "FLAG=true"]) == {"MINUTES": 5, "NAME": "abc", "FLAG": True}
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_params(["oops"])
    nb = tmp_path / "01_a.ipynb"
    _nb(nb, "pass")
    assert _declared(nb, {"SMOKE": True, "MINUTES": 5}) == {"SMOKE": True}
