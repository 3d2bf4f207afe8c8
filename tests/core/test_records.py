"""Records: summaries, JSONL append/read, atomic writes, metadata."""

import json
import os

import pytest

from tern.core.records import (
    append_jsonl,
    atomic_write_bytes,
    atomic_write_json,
    read_jsonl,
    run_metadata,
    summarize,
)


def test_summarize_hand_computed():
    s = summarize([3.0, 1.0, 2.0, 10.0])
    assert s["repeats"] == 4 and s["median"] == 2.5 and s["min"] == 1.0 and s["max"] == 10.0
    assert s["spread_rel"] == pytest.approx(9 / 2.5)
    assert summarize([5.0])["iqr"] == 0.0
    with pytest.raises(ValueError):
        summarize([])


def test_jsonl_append_and_torn_line(tmp_path):
    p = tmp_path / "r.jsonl"
    append_jsonl(p, {"a": 1})
    append_jsonl(p, [{"a": 2}, {"a": 3}])
    assert [r["a"] for r in read_jsonl(p)] == [1, 2, 3]
    with open(p, "a") as f:
        f.write('{"a": 4')  # interrupted write
    assert [r["a"] for r in read_jsonl(p)] == [1, 2, 3]
    p.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(ValueError, match=":2:"):
        read_jsonl(p)
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_atomic_write_leaves_no_temp(tmp_path):
    p = tmp_path / "sub" / "x.json"
    atomic_write_json(p, {"k": [1, 2]})
    assert json.loads(p.read_text()) == {"k": [1, 2]}
    atomic_write_bytes(p, b"new")
    assert p.read_bytes() == b"new"
    assert os.listdir(p.parent) == ["x.json"]


def test_atomic_write_gives_the_permissions_a_plain_write_would(tmp_path):
    """The temp file is created 0600; the written file is not left so (a host profile or a
    committed host.json others must read): new files follow the umask, existing keep theirs."""
    old = os.umask(0o022)
    try:
        p = atomic_write_json(tmp_path / "new.json", {"a": 1})
        assert p.stat().st_mode & 0o777 == 0o644
        os.chmod(p, 0o600)  # a file made private on purpose stays private
        atomic_write_json(p, {"a": 2})
        assert p.stat().st_mode & 0o777 == 0o600
        os.umask(0o077)
        assert atomic_write_bytes(tmp_path / "private.bin", b"x").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def test_atomic_write_failure_keeps_old(tmp_path, monkeypatch):
    p = tmp_path / "x.bin"
    p.write_bytes(b"old")

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_bytes(p, b"new")
    assert p.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["x.bin"]


def test_run_metadata_fields():
    m = run_metadata(threads=2)
    for k in ("host", "cpu", "threads", "versions", "git_commit", "timestamp"):
        assert k in m
    assert m["threads"] == 2 and "numpy" in m["versions"]


def test_check_writable(tmp_path):
    """A writable path passes (its missing folders made, nothing left behind); a folder, a
    path below a file and a read-only folder are refused naming the path."""
    import os

    from tern.core.records import check_writable

    target = tmp_path / "new" / "deeper" / "out.json"
    assert check_writable(target) == target and target.parent.is_dir()
    assert list(target.parent.iterdir()) == []  # the throw-away file is gone
    with pytest.raises(ValueError, match="it is a folder"):
        check_writable(tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="cannot write .*f/out.json"):
        check_writable(tmp_path / "f" / "out.json")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if getattr(os, "geteuid", lambda: 1)() != 0:  # root writes anywhere
            with pytest.raises(ValueError, match="Permission denied"):
                check_writable(ro / "out.json")
    finally:
        ro.chmod(0o700)
