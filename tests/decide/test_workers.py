"""A gate's runs over workers: a local process pool (rows written by the workers, a failing
run raised after the others finish, a SIGKILLed worker losing only its own run), and the
smoke gate with the real trainer on a 2-worker Dask LocalCluster."""

import json
import os
import signal
import sys
import time

import pytest

from tern.decide.harness import SMOKE_GATE, run_gate
from tern.decide.registry import read_registry


def fake_runner(model_cfg, train_cfg, out_dir=None, progress=True):
    """Picklable (module level): val_bpb = 2 + seed/10 (+ .01 for ternary); pid recorded."""
    seed = train_cfg["seed"]
    return {"val_bpb": 2.0 + seed / 10 + (0.01 if model_cfg.mlp_format == "ternary2" else 0.0),
            "train_tokens": 128, "pid": os.getpid()}


def failing_runner(model_cfg, train_cfg, out_dir=None, progress=True):
    if (model_cfg.mlp_format, train_cfg["seed"]) == ("ternary2", 1):
        raise RuntimeError("run B seed 1 failed")
    return fake_runner(model_cfg, train_cfg)


def killing_runner(model_cfg, train_cfg, out_dir=None, progress=True):
    if (model_cfg.mlp_format, train_cfg["seed"]) == ("ternary2", 1):
        os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-run
    return fake_runner(model_cfg, train_cfg)


@pytest.fixture
def gate(tmp_path):
    p = tmp_path / "smoke.toml"
    p.write_text(SMOKE_GATE)
    return p


def runs(reg):
    return [r for r in read_registry(reg) if r["record"] == "gate_run"]


def test_local_pool_runs_in_workers_and_they_write_the_rows(tmp_path, gate):
    reg = tmp_path / "registry.jsonl"
    v = run_gate(gate, reg, runner=fake_runner, make_train=dict, progress=False, workers=2)
    rows = runs(reg)
    assert len(rows) == 6 and v["complete"] and v["runs_trained"] == 6
    assert {r["metrics"]["pid"] for r in rows} != {os.getpid()}  # trained in the pool
    assert all(r["worker"]["pid"] == r["metrics"]["pid"] and r["worker"]["threads"] >= 1 for r in rows)
    assert v["comparisons"][0]["mean_delta"] == pytest.approx(0.01)
    serial = run_gate(gate, tmp_path / "serial.jsonl", runner=fake_runner, make_train=dict, progress=False)
    assert serial["comparisons"][0]["per_seed"] == v["comparisons"][0]["per_seed"]


def test_local_pool_failure_keeps_the_other_runs(tmp_path, gate):
    reg = tmp_path / "registry.jsonl"
    with pytest.raises(RuntimeError, match="seed 1 failed"):
        run_gate(gate, reg, runner=failing_runner, make_train=dict, progress=False, workers=2)
    have = {(r["arm"], r["seed"]) for r in runs(reg)}
    assert ("B", 1) not in have and ("A", 0) in have
    v = run_gate(gate, reg, runner=fake_runner, make_train=dict, progress=False, workers=2)
    assert v["complete"] and v["runs_trained"] == 6 - len(have)


def test_killed_pool_worker_loses_only_its_run(tmp_path, gate):
    from concurrent.futures.process import BrokenProcessPool

    reg = tmp_path / "registry.jsonl"
    with pytest.raises(BrokenProcessPool):
        run_gate(gate, reg, runner=killing_runner, make_train=dict, progress=False, workers=2)
    lines = reg.read_text().splitlines() if reg.exists() else []
    assert all(json.loads(x) for x in lines)  # no torn row
    have = {(r["arm"], r["seed"]) for r in runs(reg)}
    assert ("B", 1) not in have
    v = run_gate(gate, reg, runner=fake_runner, make_train=dict, progress=False, workers=2)
    assert v["complete"] and v["runs_reused"] == len(have) and v["runs_trained"] == 6 - len(have)
    assert len(runs(reg)) == 6


def test_bad_worker_count(tmp_path, gate):
    with pytest.raises(ValueError, match="workers"):
        run_gate(gate, tmp_path / "r.jsonl", runner=fake_runner, make_train=dict, progress=False, workers=0)


def test_smoke_gate_on_a_two_worker_dask_local_cluster(tmp_path, gate):
    distributed = pytest.importorskip("distributed")
    reg = tmp_path / "registry.jsonl"
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        v = run_gate(gate, reg, progress=False, scheduler=client)  # the real trainer
    rows = runs(reg)
    assert v["complete"] and len(rows) == 6 and v["verdict"] in ("pass", "fail", "inconclusive")
    assert len({r["worker"]["pid"] for r in rows}) == 2  # both workers trained
    assert all(r["worker"]["threads"] >= 1 and r["metrics"]["train_tokens"] == 128 for r in rows)
    assert all(r["metrics"]["val_bpb"] > 0 for r in rows)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_pool_workers_stop_when_the_driver_is_killed(tmp_path):
    """`kill` of a `tern gate run` driver must not leave its pool workers training on as
    orphans (they did before: two workers kept both cores busy after the driver died)."""
    import subprocess

    driver = tmp_path / "driver.py"
    driver.write_text(
        "import os, sys, time\n"
        "import multiprocessing as mp\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "from tern.decide.workers import _init_pool_worker\n"
        "if __name__ == '__main__':\n"
        "    ex = ProcessPoolExecutor(1, mp_context=mp.get_context('spawn'), initializer=_init_pool_worker,\n"
        "                             initargs=(1,))\n"
        "    print(ex.submit(os.getpid).result(), flush=True)\n"
        "    ex.submit(time.sleep, 120)\n"
        "    time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(proc.stdout.readline())
        assert _alive(worker)
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 15
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker), "the pool worker outlived its killed driver"
    finally:
        proc.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def waiting_runner(model_cfg, train_cfg, out_dir=None, progress=True):
    """Seed 0 of arm B waits (up to 30 s) until the driver's on_row has marked every other
    run as reported (one byte each in the marker file); every other run returns at once."""
    marker, others = os.environ["TERN_TEST_MARKER"], int(os.environ["TERN_TEST_OTHERS"])

    def reported():
        return os.path.getsize(marker) if os.path.exists(marker) else 0

    waited = 0.0
    if (model_cfg.mlp_format, train_cfg["seed"]) == ("ternary2", 0):
        t0 = time.monotonic()
        while reported() < others and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        waited = time.monotonic() - t0
    return {**fake_runner(model_cfg, train_cfg), "waited_s": waited, "saw_marker": reported() >= others}


def test_pool_runs_are_reported_as_they_finish(tmp_path, gate, monkeypatch):
    """A long run must not hold back the report of the runs that finished before it (the
    driver waited for all of them, so `tern gate run` printed nothing for 40 minutes)."""
    from tern.decide.harness import plan_runs
    from tern.decide.spec import load_gate
    from tern.decide.workers import RunJob, run_jobs

    marker = tmp_path / "reported"
    spec = load_gate(gate)
    jobs = [RunJob(spec.name, spec.hash, spec.metric, r, str(tmp_path / "reg.jsonl"), waiting_runner)
            for r in plan_runs(spec, dict)]
    monkeypatch.setenv("TERN_TEST_MARKER", str(marker))  # spawned workers inherit them
    monkeypatch.setenv("TERN_TEST_OTHERS", str(len(jobs) - 1))

    def on_row(row):
        with open(marker, "ab") as f:
            f.write(b"x")

    rows = run_jobs(jobs, workers=2, on_row=on_row)
    slow = [r for r in rows if r["arm"] == "B" and r["seed"] == 0]
    assert len(rows) == 6 and len(slow) == 1
    assert slow[0]["metrics"]["saw_marker"] and slow[0]["metrics"]["waited_s"] < 25
    assert rows[-1] is slow[0]  # reported last: after the runs that finished first
