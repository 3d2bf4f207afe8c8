"""tern.report.notebook: environment detection and the results folder."""

from pathlib import Path

from tern.core.paths import repo_root, results_dir
from tern.report.notebook import INSTALL_CELL, detect_env


def test_detect_env():
    env = detect_env()
    assert env.threads >= 1 and env.gpus >= 0
    assert "CPU thread" in str(env)


def test_results_dir(tmp_path):
    p = results_dir(tmp_path / "r")
    assert p.is_dir()
    rel = results_dir("results/_test_tmp")
    assert rel.is_absolute() and rel.is_dir()
    root = repo_root()
    assert root is None or rel.is_relative_to(root)
    rel.rmdir()


def test_install_cell_compiles_and_names_no_placeholder_url():
    compile(INSTALL_CELL, "<cell>", "exec")
    assert "pip" in INSTALL_CELL and "TERN_SRC" in INSTALL_CELL
    assert "github.com" not in INSTALL_CELL and "http" not in INSTALL_CELL


def test_no_placeholder_url_anywhere():
    root = Path(__file__).resolve().parents[2]
    files = [root / "README.md", *root.glob("notebooks/*.ipynb"), *root.glob("tern/**/*.py")]
    assert [str(f.relative_to(root)) for f in files if "tern-kit" in f.read_text(encoding="utf-8")] == []


def test_headlines_round_trip(tmp_path):
    from tern.report.notebook import load_headlines, save_headline

    save_headline(tmp_path, "01_probe_host", {"dram_read_1t_gbps": 38.5})
    save_headline(tmp_path, "02_roofline", {"sandbox_tok_per_s": 1234})
    assert load_headlines(tmp_path) == {"01_probe_host": {"dram_read_1t_gbps": 38.5},
                                        "02_roofline": {"sandbox_tok_per_s": 1234}}
