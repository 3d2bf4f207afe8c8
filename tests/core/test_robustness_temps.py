"""Stale temp files of interrupted atomic writes are removed; a live writer's are kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tern.core.records import STALE_TEMP_S, _host_tag, atomic_write_bytes, clean_stale_temps, temp_prefix

posix_only = pytest.mark.skipif(os.name != "posix", reason="SIGKILL and pid probes are POSIX")

# a writer that stops between writing its temp file and the rename (until killed)
_STUCK_WRITER = """
import os, sys, time
from tern.core import records
def hang(*a):
    print("written", flush=True)
    time.sleep(600)
os.replace = hang
records.atomic_write_bytes(sys.argv[1], b"x" * 4096)
"""


def _start_stuck_writer(target):
    p = subprocess.Popen([sys.executable, "-c", _STUCK_WRITER, str(target)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "written"
    return p


def _temps(folder):
    return sorted(f.name for f in folder.iterdir() if f.name.endswith(".tmp"))


@posix_only
def test_a_sigkilled_write_leaves_a_temp_that_the_next_write_removes(tmp_path):
    target = tmp_path / "checkpoint.pt"
    p = _start_stuck_writer(target)
    try:
        (live,) = _temps(tmp_path)
        assert live.startswith(".checkpoint.pt.tern-") and f"-{p.pid}." in live
        # the writer is alive: another write into the folder keeps its temp
        atomic_write_bytes(tmp_path / "other.json", b"{}")
        assert _temps(tmp_path) == [live]
        assert clean_stale_temps(tmp_path) == []
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert _temps(tmp_path) == [live] and not target.exists()  # what SIGKILL leaves behind
    atomic_write_bytes(target, b"new")
    assert _temps(tmp_path) == [] and target.read_bytes() == b"new"


def test_old_style_and_foreign_host_temps_go_by_age_only(tmp_path):
    old_style = tmp_path / ".checkpoint.pt.ab12cd_9.tmp"  # tempfile.mkstemp's name, no pid
    other_host = tmp_path / ".model.tern.tern-00000000-1.abcdefgh.tmp"  # host tag 0: not this host
    mine = tmp_path / f"{temp_prefix(tmp_path / 'x.json')}abcdefgh.tmp"  # this process: live
    unrelated = tmp_path / "notes.tmp"
    for f in (old_style, other_host, mine, unrelated):
        f.write_bytes(b"partial")
    assert clean_stale_temps(tmp_path) == []
    old = time.time() - STALE_TEMP_S - 60
    for f in (old_style, other_host, mine, unrelated):
        os.utime(f, (old, old))
    assert sorted(clean_stale_temps(tmp_path)) == sorted([old_style, other_host, mine])
    assert unrelated.exists()
    assert clean_stale_temps(tmp_path / "missing") == []


@posix_only
def test_a_dead_writers_temp_is_stale_at_once(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # reaped: its pid names no process now
    dead = tmp_path / f".result.json.tern-{_host_tag()}-{p.pid}.abcdefgh.tmp"
    dead.write_bytes(b"{")
    assert clean_stale_temps(tmp_path) == [dead]
