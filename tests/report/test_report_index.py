"""The report's index page (tern.report.index / summary / captions) and its offline notebook
pages (tern.report.build.notebook_html)."""

import json
import re
import struct
from pathlib import Path

import nbformat

from tern.report.build import REMOTE_SCRIPT, REPORT_DEFAULT_PARAMS, notebook_html
from tern.report.captions import CAPTIONS, caption_for, png_size
from tern.report.index import render_index, unpath
from tern.report.summary import answers, count, num, size

ROOT = Path(__file__).resolve().parents[2]

# headlines as the notebooks save them (values from a SMOKE report on a 2-core VM)
HEADLINES = {
    "01_probe_host": {"cpu_model": "AMD EPYC", "probe_mode": "quick", "cache_source": "/sys",
                      "llc_bytes": 33554432, "read_L1_1t_gbps": 209.9, "read_L1_2t_gbps": 402.7,
                      "read_L2_1t_gbps": 115.7, "read_L2_2t_gbps": 225.3, "read_L3_1t_gbps": 96.8,
                      "read_L3_2t_gbps": 188.3, "read_DRAM_1t_gbps": 31.6, "read_DRAM_2t_gbps": 34.6,
                      "read_DRAM_1t_gbps_min": 30.6, "read_DRAM_1t_runs": 3, "probe_wall_s": 19.78},
    "02_roofline": {"sandbox_your_machine_1t_tok_per_s": 6566.0, "sandbox_your_machine_2t_tok_per_s": 6518.2,
                    "10b_your_machine_1t_tok_per_s": 38.61, "10b_your_machine_2t_tok_per_s": 63.7,
                    "sandbox_reference_pc_1t_tok_per_s": 31220.7,
                    "10b_100tps_your_machine_1t_active_budget_mb": 295.0,
                    "10b_100tps_your_machine_2t_active_budget_mb": 337.4},
    "03_train_sandbox": {"val_bpb": 3.598446854239226, "steps": 3, "train_tokens": 384,
                         "train_tokens_per_s": 302.4294524135317, "wall_s": 2.4599, "device": "cpu"},
    "06_measured_vs_predicted": {"median_measured_over_predicted": 1.4177821167007267, "points": 2,
                                 "worst_measured_over_predicted": 1.4508928072168494,
                                 "fraction_within_25pct": 0.5, "105m_tok_per_s_1t": 2587.1179635588987,
                                 "206m_tok_per_s_1t": 2474.1696686375826},
    "07_gates": {"smoke_verdict": "pass", "smoke_B_vs_A_delta_val_bpb": -0.003708162468491446,
                 "smoke_B_vs_A_se_val_bpb": 0.002096281995739192},
    "08_toward_10b": {"config": "d1024-L24-E256k8-h512", "total_params": 9864535040,
                      "active_params": 502848512, "packed_bytes": 2539274112,
                      "measured_tok_per_s_1t": 99.69761153621536, "measured_tok_per_s_2t": 116.19,
                      "predicted_tok_per_s_1t": 119.50022404536308, "predicted_tok_per_s_2t": 184.86,
                      "predicted_reaches_target": True, "smoke_stand_in": False},
}


def _png(path: Path, w: int, h: int) -> None:
    """A file with a PNG header of ``w`` x ``h`` pixels (all the index reads of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", w, h) + b"\x08\x06")


def test_num_rounds_to_three_significant_figures():
    cases = {222204.1: "222,000", 6566.0: "6,570", 209.9: "210", 31.6: "31.6", 3.598: "3.6",
             0.003708: "0.00371", 7.0: "7", -0.0037: "-0.0037", 0.0: "0", 1500: "1,500", None: "–",
             True: "yes", float("nan"): "nan"}
    assert {x if x == x else "nan": num(x) for x in cases} == {x if x == x else "nan": v for x, v in cases.items()}
    assert num(31.6, "GB/s") == "31.6 GB/s"
    assert size(33554432, binary=True) == "32 MiB" and size(2539274112) == "2.54 GB" and size(512) == "512 B"
    assert count(9864535040) == "9.86 B" and count(502848512) == "503 M" and count(None) == "–"


def test_answers_are_drawn_from_the_headlines():
    lead, rows = answers(HEADLINES)
    by = {a.step: a.text for a in rows}
    assert [a.step for a in rows] == ["probe", "predict", "train", "run", "measure", "decide"]
    assert by["probe"] == ("read L1 210 / 403 · L2 116 / 225 · L3 96.8 / 188 · DRAM 31.6 / 34.6 GB/s "
                           "(1 / 2 threads); last-level cache 32 MiB; AMD EPYC, quick probe; the probe took 19.8 s")
    fresh = answers({**HEADLINES, "01_probe_host": {**HEADLINES["01_probe_host"], "probe_wall_s": 166.8,
                                                   "probe_compile_s": 139.9}})[1][0].text
    assert fresh.endswith("AMD EPYC, quick probe; the probe took 167 s, 140 s of it numba compiling (once; "
                          "cached for the next runs)")
    warm = answers({**HEADLINES, "01_probe_host": {**HEADLINES["01_probe_host"], "probe_wall_s": 26.5,
                                                  "probe_compile_s": 0.6}})[1][0].text
    assert warm.endswith("quick probe; the probe took 26.5 s")  # a warm cache: nothing said of compiling
    for bad in ("140", float("nan"), True, None):  # a hand-edited or older profile: nothing said, no error
        text = answers({**HEADLINES, "01_probe_host": {**HEADLINES["01_probe_host"], "probe_wall_s": 26.5,
                                                      "probe_compile_s": bad}})[1][0].text
        assert text.endswith("quick probe; the probe took 26.5 s")
    assert by["predict"].startswith("sandbox 6,570 / 6,520 · 10b 38.6 / 63.7 tok/s (1 / 2 threads)")
    assert "31,200" not in by["predict"]  # the reference PC only when this host has no profile
    assert by["predict"].endswith("a 10B-total model reaches 100 tok/s if a token reads at most "
                                  "295 / 337 MB (1 / 2 threads)")
    assert by["train"] == ("sandbox: 3.6 bits/byte on validation after 3 steps (384 tokens at 302 tok/s, "
                           "2.46 s on cpu)")
    assert by["run"] is None  # notebook 05 saved nothing
    assert by["measure"] == ("measured / predicted tok/s: median 1.42, worst 1.45; 50 % of 2 points within "
                             "±25 %; at equal active params 105M 2,590 vs 206M 2,470 tok/s (1 thread)")
    assert by["decide"] == "1 gate (1 pass): smoke pass (Δ -0.00371 ± 0.0021 bits/byte)"
    assert lead.text == ("d1024-L24-E256k8-h512 (9.86 B params, 503 M active, 2.54 GB packed): measured "
                         "99.7 / 116 tok/s, predicted 120 / 185 (1 / 2 threads); predicted to reach the "
                         "target: yes")
    assert answers({})[0] is None and all(a.text is None for a in answers({})[1])


def test_answers_read_newer_headline_keys():
    """Keys a notebook may add (median error, targets met, measured at the target, peak RSS)."""
    _, rows = answers({"06_x": {"median_measured_over_predicted": 0.986, "median_abs_error": 0.0346,
                                "fraction_within_20pct": 0.98, "points": 50, "meets_targets": True},
                       "07_gates": {f"g{i}_verdict": v for i, v in enumerate(["fail", "pass", "inconclusive",
                                                                              "inconclusive"])}})
    by = {a.step: a.text for a in rows}
    assert by["measure"] == ("measured / predicted tok/s: median 0.986; median error 3.46 %; 98 % of 50 "
                             "points within ±20 %; meets its targets: yes")
    assert by["decide"] == ("4 gates (1 fail, 2 inconclusive, 1 pass): g0 fail · g1 pass · g2 inconclusive"
                            " · g3 inconclusive")
    lead, _ = answers({"08_t": {"config": "c", "measured_tok_per_s_1t": 121.8, "measured_tok_per_s_2t": 144.7,
                                "measured_reaches_target_1t": True, "measured_reaches_target_2t": False,
                                "peak_rss_bytes_1t": 2931929088, "smoke_stand_in": True}})
    assert lead.text == ("c (– params, – active, – packed): measured 122 / 145 tok/s, predicted – (1 / 2 "
                         "threads); measured at the target on 1 / 2 threads: yes / no; peak RSS 2.93 GB "
                         "(SMOKE: measured on a stand-in with fewer experts, not the 10B model)")


def test_measure_answer_says_when_the_host_drifted():
    base = {"median_measured_over_predicted": 1.06, "fraction_within_20pct": 0.78, "points": 50,
            "meets_targets": False}
    _, rows = answers({"06_x": {**base, "host_drifted_points": 21, "host_read_over_probe_median": 1.31,
                                "host_kernel_over_probe_median": 0.774}})
    text = next(a.text for a in rows if a.step == "measure")
    assert text.endswith("meets its targets: no; the host drifted: at 21 of 50 points its read rate or kernel "
                         "speed was more than ±15 % from its probe's (medians: read 1.31x, kernel 0.774x): "
                         "re-run on a quiet machine")
    for few in (0, 9):  # under a fifth of the points: not a drifted host (as the notebook's verdict)
        _, rows = answers({"06_x": {**base, "host_drifted_points": few, "host_read_over_probe_median": 1.0}})
        assert "drifted" not in next(a.text for a in rows if a.step == "measure")


def test_predictions_fall_back_to_the_reference_host():
    _, rows = answers({"02_roofline": {"sandbox_reference_pc_1t_tok_per_s": 31220.7,
                                       "sandbox_reference_pc_6t_tok_per_s": 222204.1}})
    assert rows[1].text == "sandbox 31,200 / 222,000 tok/s (1 / 6 threads; reference pc: this host has no profile)"


def _summary(tmp_path: Path) -> tuple[dict, Path]:
    out = tmp_path / "rep"
    _png(out / "results" / "probe_read_bandwidth.png", 1200, 700)
    _png(out / "results" / "roofline_knee.png", 700, 500)
    _png(out / "results" / "figures" / "gates_forest.png", 960, 246)
    _png(out / "results" / "mystery.png", 1500, 400)  # no caption, wide by its shape
    (out / "results" / "bench").mkdir(parents=True)
    (out / "results" / "bench" / "ladder.jsonl").write_text("{}\n")
    heads = dict(HEADLINES)
    heads["05_decode_engine"] = {"model_source": f"trained checkpoint {out}/results/train_sandbox/checkpoint.pt",
                                 "baseline_tok_per_s": 888.4, "ladder_tok_per_s": 6134.4,
                                 "ladder_speedup_x": 6.9049, "threads": 1, "bpb_per_rung": [4.611, 4.611]}
    del heads["03_train_sandbox"]
    runs = [{"name": "01_probe_host", "status": "ok", "wall_s": 22.61, "html": "notebooks/01_probe_host.html",
             "error": None},
            {"name": "03_train_sandbox", "status": "failed", "wall_s": 3.0,
             "html": "notebooks/03_train_sandbox.html", "error": f"ValueError: bad {tmp_path}/x/y.json"},
            {"name": "07_gates", "status": "ok", "wall_s": 75.0, "html": "notebooks/07_gates.html", "error": None}]
    meta = {"host": "vm", "cpu": "AMD EPYC", "logical_cpus": 2, "git_commit": "0123456789abcdef+dirty",
            "timestamp": "2026-12-01T10:00:00+00:00"}
    return {"out_dir": str(out), "smoke": False, "wall_s": 1234.5, "notebooks": runs, "headlines": heads,
            "meta": meta}, out


def test_index_opens_with_the_summary_then_figures_then_raw_tables(tmp_path):
    summary, out = _summary(tmp_path)
    page = render_index(summary, out)
    first_figure, raw = page.index("<h2>Figures</h2>"), page.index("<h2>Raw data</h2>")
    assert page.index("class='summary'") < page.index("<h2>Notebooks</h2>") < first_figure < raw
    top = page[:first_figure]
    assert "L1 210 / 403" in top and "32 MiB" in top and "99.7 / 116 tok/s" in top
    assert "results/train_sandbox/checkpoint.pt" in top  # relative to the report folder
    assert re.search(r"<td>train</td>.*?failed \(see below\)", top)  # 03 failed, saved nothing
    assert "not run" not in top.split("<td>train</td>")[0]  # probe / predict answered
    assert "<a href=\"notebooks/01_probe_host.html\">notebook 01</a>" in top
    assert "<a href=\"#fig-probe_read_bandwidth\">figure</a>" in top
    assert "#fig-engine_ladder" not in top  # no such figure: no link
    assert "20 min 34 s" in top and "1 min 15 s" in top and "22.6 s" in top
    assert "commit 0123456789ab (modified)" in top
    # raw tables last and collapsed, numbers rounded
    assert page[raw:].count("<details>") == 2 and "read_DRAM_1t_gbps_min" in page[raw:]
    assert "<td>19.8</td>" in page[raw:] and "19.78" not in page and "ladder.jsonl" in page[raw:]
    # no absolute path anywhere; nothing loaded from the network
    assert str(tmp_path) not in page and "<script" not in page and "http" not in page


def test_figures_grouped_by_notebook_with_captions(tmp_path):
    summary, out = _summary(tmp_path)
    page = render_index(summary, out)
    groups = re.findall(r"<h3 id='nb-(\w+)'>", page)
    assert groups == ["01", "02", "07", "other"]
    assert caption_for("probe_read_bandwidth.png").text in page
    figs = dict(re.findall(r'<figure id="fig-(\w+)" class="(\w*)">', page))
    assert figs == {"probe_read_bandwidth": "wide", "roofline_knee": "", "gates_forest": "wide", "mystery": "wide"}
    assert 'src="results/figures/gates_forest.png"' in page
    assert "<h3 id='nb-02'>notebook 02</h3>" in page  # a figure from a notebook not run this time


def test_captions_cover_each_notebook_and_read_png_sizes(tmp_path):
    assert {c.notebook for c in CAPTIONS} == {f"{i:02d}" for i in range(1, 9)}
    assert caption_for("train_30m_curves.png").notebook == "04"
    assert caption_for("gates_capacity_scaling_capacity.png").notebook == "07"
    assert caption_for("nothing.png") is None
    _png(tmp_path / "a.png", 640, 480)
    (tmp_path / "b.png").write_bytes(b"not a png at all, long enough....")
    assert png_size(tmp_path / "a.png") == (640, 480) and png_size(tmp_path / "b.png") is None


def test_unpath():
    out = Path("/r/rep")
    assert unpath("model /r/rep/results/m.tern and /home/u/x/y.pt", out) == "model results/m.tern and …/y.pt"
    assert unpath("/sys and https://example.org/a/b and 1/2", out) == "/sys and https://example.org/a/b and 1/2"


def test_notebook_pages_load_nothing_from_the_network():
    nb = nbformat.v4.new_notebook()
    md = nbformat.v4.new_markdown_cell("# Title\nSome *text*.")
    code = nbformat.v4.new_code_cell("plot()")
    code.outputs = [nbformat.v4.new_output("display_data", {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})]
    nb.cells = [md, code]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2,
                                                                             "version_minor": 0}}
    page = notebook_html(nb)
    assert "data:image/png;base64,iVBORw0KGgo=" in page and "<h1" in page
    scripts = re.findall(r"<script\b[^>]*>", page)
    assert [s for s in scripts if "src=" in s] == [], scripts
    assert not re.search(r"cdnjs|unpkg|jsdelivr|require\.js|mathjax", page, re.I)
    assert REMOTE_SCRIPT.sub("", '<script src="https://cdn.example/x.js"></script>') == ""


def test_notebook_defaults_are_what_the_report_runs():
    """A notebook opened by hand runs the same CPU budgets as `tern report`
    (REPORT_DEFAULT_PARAMS). Notebook 04's MINUTES is its GPU budget: on a GPU the report caps
    it at the sandbox's MINUTES (README says so)."""
    seen = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        cell = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
        ns: dict = {}
        exec("".join(cell["source"]), ns)
        seen.update({(path.stem, k): ns[k] for k in REPORT_DEFAULT_PARAMS if k in ns
                     and (path.stem, k) != ("04_train_30m", "MINUTES")})
    assert {k for _, k in seen} == set(REPORT_DEFAULT_PARAMS)
    assert {key: v for key, v in seen.items() if v != REPORT_DEFAULT_PARAMS[key[1]]} == {}


def test_papermill_reads_every_parameter():
    """Papermill infers each parameters cell (a comment holding '=' defeats its parser, and
    `tern report` then warns "Unable to parse line")."""
    from papermill.translators import PythonTranslator

    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        cell = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
        src = "".join(cell["source"])
        ns: dict = {}
        exec(src, ns)
        inferred = {p.name for p in PythonTranslator.inspect({"source": src})}
        assert inferred == set(ns) - {"__builtins__"}, path.name


def test_report_exits_nonzero_when_a_notebook_failed(monkeypatch, capsys):
    import tern.cli
    import tern.report.cli as rc

    def fake(status):
        return lambda *a, **k: {"out_dir": "r", "index": "r/index.html", "smoke": True, "wall_s": 1.0, "headlines": {},
                                "notebooks": [{"name": "01_x", "status": "ok", "wall_s": 1.0, "html": None, "error": None},
                                              {"name": "02_y", "status": status, "wall_s": 1.0, "html": None,
                                               "error": "OSError: no space" if status == "failed" else None}]}
    monkeypatch.setattr(rc, "run_report", fake("failed"))
    assert tern.cli.main(["report", "--smoke"]) == 1
    assert "OSError: no space" in capsys.readouterr().out
    monkeypatch.setattr(rc, "run_report", fake("ok"))
    assert tern.cli.main(["report", "--smoke"]) == 0
