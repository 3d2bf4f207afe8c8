"""The probe curves' weight buffer: a mapped file like a model file, anonymous memory where
the disk has no room (a full disk once failed a probe with ENOSPC from deep inside it)."""
from __future__ import annotations

import errno
import shutil
import tempfile
from collections import namedtuple

import pytest

from tern.probe import curve_buffer
from tern.probe.curve_buffer import DISK_HEADROOM_BYTES, CurveBuffer

Usage = namedtuple("Usage", "total used free")


@pytest.fixture
def tmp_tempdir(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_curve_buffer_maps_a_file_like_the_engine_and_leaves_none_behind(tmp_tempdir):
    buf = CurveBuffer(3 << 20)
    assert buf.backing == "file" and buf.data.size == 3 << 20 and not buf.data.flags.writeable
    assert 0x30 <= int(buf.data.min()) and int(buf.data.max()) <= 0x3F
    assert list(tmp_tempdir.iterdir()) == []  # unlinked once mapped
    anon = CurveBuffer(1 << 20, backing="anonymous")
    assert anon.backing == "anonymous" and anon.data.flags.writeable
    with pytest.raises(ValueError, match="backing"):
        CurveBuffer(1 << 20, backing="tmpfs")
    with pytest.raises(ValueError, match="at least 1 byte"):
        CurveBuffer(0)


def test_a_disk_without_room_gives_anonymous_memory_and_a_warning(tmp_tempdir, monkeypatch):
    size = 2 << 20
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: Usage(10 << 30, 0, size + DISK_HEADROOM_BYTES - 1))
    with pytest.warns(RuntimeWarning, match="no room for the probe's"):
        buf = CurveBuffer(size)
    assert buf.backing == "anonymous" and buf.data.size == size
    assert 0x30 <= int(buf.data.min()) and int(buf.data.max()) <= 0x3F
    same = CurveBuffer(size, backing="anonymous")  # the same bytes as the file would have had
    assert (buf.data == same.data).all()
    assert list(tmp_tempdir.iterdir()) == []


def test_a_disk_that_fills_while_writing_falls_back_and_leaves_no_file(tmp_tempdir, monkeypatch):
    real = curve_buffer._mapped_random_file

    def fill_then_fail(max_bytes, rng, directory):
        def enospc(*_a, **_k):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(curve_buffer.mmap, "mmap", enospc)  # written, then the "disk" gives out
        return real(max_bytes, rng, directory)

    monkeypatch.setattr(curve_buffer, "_mapped_random_file", fill_then_fail)
    with pytest.warns(RuntimeWarning, match="filled while writing"):
        buf = CurveBuffer(1 << 20)
    assert buf.backing == "anonymous" and buf.data.size == 1 << 20
    assert list(tmp_tempdir.iterdir()) == []


def test_other_write_errors_are_not_hidden(tmp_tempdir, monkeypatch):
    def denied(*_a, **_k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(curve_buffer, "_mapped_random_file", denied)
    with pytest.raises(PermissionError):
        CurveBuffer(1 << 20)
