"""Where the shipped folders are found (tern.core.paths.shipped_dir): the checkout's, else a
site install's package data, else a clear error naming every place looked at."""

import pytest

from tern.core import paths
from tern.data.corpus import data_dir
from tern.decide.registry import shipped_gates, shipped_registry


@pytest.fixture
def site_install(tmp_path, monkeypatch):
    """As if tern were imported from a site install whose package data is ``tmp_path/_shipped``."""
    monkeypatch.setattr(paths, "repo_root", lambda: None)
    monkeypatch.setattr(paths, "SHIPPED_DIR", tmp_path / "_shipped")
    monkeypatch.delenv("TERN_DATA_DIR", raising=False)
    return tmp_path / "_shipped"


def test_the_checkout_comes_first():
    root = paths.repo_root()
    assert root is not None and paths.shipped_dir("data") == root / "data"
    assert paths.shipped_candidates("gates") == [root / "gates", paths.SHIPPED_DIR / "gates"]


def test_a_site_install_reads_its_package_data(site_install):
    for name in ("data", "gates", "notebooks"):
        (site_install / name).mkdir(parents=True)
    (site_install / "gates" / "1_a.toml").write_text("")
    assert data_dir() == site_install / "data"
    assert shipped_gates() == [site_install / "gates" / "1_a.toml"]
    assert shipped_registry() == site_install / "gates" / "registry.jsonl"
    from tern.report.build import notebooks_dir

    assert notebooks_dir() == site_install / "notebooks"


def test_nothing_found_names_where_it_looked(site_install, monkeypatch):
    with pytest.raises(FileNotFoundError) as e:
        data_dir()
    assert str(site_install / "data") in str(e.value) and "TERN_DATA_DIR is not set" in str(e.value)
    assert shipped_registry() == site_install / "gates" / "registry.jsonl"  # a path that may not exist
    monkeypatch.setenv("TERN_DATA_DIR", "/somewhere/else")
    assert str(data_dir()) == "/somewhere/else"
    assert str(data_dir("/given")) == "/given"
    with pytest.raises(ValueError, match="unknown shipped folder"):
        paths.shipped_dir("results")


def test_repo_root_is_only_a_tern_checkout(tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    (proj / "tern").mkdir(parents=True)
    monkeypatch.setattr(paths, "PACKAGE_DIR", proj / "tern")
    paths.repo_root.cache_clear()
    try:
        assert paths.repo_root() is None  # no pyproject.toml: a site install
        (proj / "pyproject.toml").write_text('[project]\nname = "someone-else"\n')
        paths.repo_root.cache_clear()
        assert paths.repo_root() is None  # --target inside another project
        (proj / "pyproject.toml").write_text('[project]\nname = "tern"\n')
        paths.repo_root.cache_clear()
        assert paths.repo_root() == proj
    finally:
        monkeypatch.undo()
        paths.repo_root.cache_clear()
