"""The registry under concurrent writers: locked one-line appends (no lost or torn rows),
a torn tail from a killed writer dropped, and a SIGKILLed gate run redone on resume."""

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tern.decide.harness import SMOKE_GATE, run_gate
from tern.decide.registry import append_row, lock_path, read_registry

N_PROCS, N_ROWS = 6, 40
PAD = "x" * 70_000  # rows larger than a page and a pipe buffer: a torn write would show


def _writer(path: str, w: int) -> None:
    for i in range(N_ROWS):
        append_row(path, {"record": "gate_run", "writer": w, "i": i, "pad": PAD})


def test_concurrent_appends_lose_nothing_and_tear_nothing(tmp_path):
    reg = tmp_path / "registry.jsonl"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(reg), w)) for w in range(N_PROCS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    lines = reg.read_bytes().split(b"\n")
    assert lines[-1] == b""  # ends with a newline
    rows = [json.loads(x) for x in lines[:-1]]  # every line parses
    assert len(rows) == N_PROCS * N_ROWS
    assert {(r["writer"], r["i"]) for r in rows} == {(w, i) for w in range(N_PROCS) for i in range(N_ROWS)}
    assert all(r["pad"] == PAD for r in rows)
    for w in range(N_PROCS):  # each writer's rows in its own order
        assert [r["i"] for r in rows if r["writer"] == w] == list(range(N_ROWS))
    assert lock_path(reg).exists()


def test_torn_tail_of_a_killed_writer_is_dropped(tmp_path):
    reg = tmp_path / "registry.jsonl"
    append_row(reg, {"record": "gate_run", "i": 0})
    with open(reg, "ab") as f:
        f.write(b'{"record": "gate_run", "i": 1, "pa')  # killed mid-line
    append_row(reg, {"record": "gate_run", "i": 2})
    assert [json.loads(x)["i"] for x in reg.read_text().splitlines()] == [0, 2]
    reg.write_bytes(b'{"torn only')  # no complete line at all
    append_row(reg, {"record": "gate_run", "i": 3})
    assert [json.loads(x)["i"] for x in reg.read_text().splitlines()] == [3]


KILLED_RUN = """
import sys, time
from pathlib import Path
from tern.decide.harness import run_gate
gate, reg, marker = sys.argv[1:4]

def runner(model_cfg, train_cfg, out_dir=None, progress=True):
    if (model_cfg.mlp_format, train_cfg["seed"]) == ("ternary2", 1):
        Path(marker).write_text("started")
        time.sleep(600)  # SIGKILLed here, mid-run
    return {"val_bpb": 2.0 + train_cfg["seed"] / 10, "train_tokens": 128}

run_gate(gate, reg, runner=runner, make_train=dict, progress=False)
"""


def test_sigkilled_run_is_redone_on_resume(tmp_path):
    gate = tmp_path / "smoke.toml"
    gate.write_text(SMOKE_GATE)
    reg, marker = tmp_path / "registry.jsonl", tmp_path / "started"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(gate), str(reg), str(marker)], env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, "the worker exited before its run started"
            assert time.monotonic() < deadline, "the worker never reached the run"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    done = {(r["arm"], r["seed"]) for r in read_registry(reg)}
    assert done == {("A", 0), ("B", 0), ("A", 1)}  # seed-major order: killed during B seed 1

    calls = []

    def runner(model_cfg, train_cfg, out_dir=None, progress=True):
        calls.append((model_cfg.mlp_format, train_cfg["seed"]))
        return {"val_bpb": 2.0 + train_cfg["seed"] / 10, "train_tokens": 128}

    v = run_gate(gate, reg, runner=runner, make_train=dict, progress=False)
    assert calls == [("ternary2", 1), ("fp32", 2), ("ternary2", 2)]  # the killed run first, redone
    assert v["runs_reused"] == 3 and v["runs_trained"] == 3 and v["complete"]
    rows = read_registry(reg)
    assert sum(r["record"] == "gate_run" for r in rows) == 6


@pytest.mark.parametrize("n", [1, 3])
def test_append_row_creates_the_file_and_its_folder(tmp_path, n):
    reg = tmp_path / "deep" / "registry.jsonl"
    for i in range(n):
        append_row(reg, {"record": "gate_verdict", "i": i})
    assert [json.loads(x)["i"] for x in reg.read_text().splitlines()] == list(range(n))
